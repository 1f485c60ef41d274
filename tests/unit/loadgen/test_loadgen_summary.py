"""Repeat statistics, goodput, the repeat rule, CONTRACTS A and its 4 KiB limit (pure)."""

from __future__ import annotations

import ast
import json
import pathlib

import pytest

from kneepoint.loadgen import records as kinds
from kneepoint.loadgen.progress import format_progress, progress_wanted
from kneepoint.loadgen.records import RequestRecord
from kneepoint.loadgen.summary import (
    ClientLoad,
    SavedRun,
    build_summary,
    failure_line,
    fit_termination_message,
    judge_client_load,
    parse_slos,
    select_repeat,
    summarize_repeat,
)
from kneepoint.loadgen.table import render_table

CONTRACT_A_KEYS = {
    "v", "ok", "outputTokensPerSecond", "totalTokensPerSecond", "requestsPerSecond",
    "ttftP50Ms", "ttftP90Ms", "ttftP95Ms", "ttftP99Ms", "ttftMeanMs", "tpotMeanMs", "tpotP99Ms", "itlP99Ms",
    "latencyP50Ms", "latencyP90Ms", "latencyP95Ms", "latencyP99Ms", "latencyMeanMs",
    "completed", "failed", "errorFraction", "errors", "inputTokensAsked", "inputTokensServed",
    "outputTokensAsked", "outputTokensServed", "concurrency", "repeats", "keptRepeat",
    "repeatOutputTokensPerSecond", "clientLimited", "clientCpuPeak", "loopLagP99Ms",
    "startedAt", "finishedAt", "durationSeconds",
}  # fmt: skip # a key list, grouped by kind

CLIENT = ClientLoad(workers=1, cpu_peak=0.2, cpu_median=0.1, loop_lag_p99_ms=1.0, limited=False)


def ok_record(index: int, start: float, ttft: float, latency: float, out: int = 5, prompt: int = 12) -> RequestRecord:
    gaps = [(latency - ttft) / (out - 1)] * (out - 1)
    return RequestRecord(
        index=index,
        start=start,
        input_tokens_asked=10,
        output_tokens_asked=5,
        ttft=ttft,
        latency=latency,
        itl=gaps,
        input_tokens=prompt,
        output_tokens=out,
        end=start + latency,
    )


def failed_record(index: int, start: float, kind: str, message: str = "boom") -> RequestRecord:
    return RequestRecord(
        index=index, start=start, input_tokens_asked=10, output_tokens_asked=5, error=kind, message=message, end=start + 0.01
    )


def test_summarize_repeat_hand_computed() -> None:
    t0 = 1_700_000_000.0
    records = [
        ok_record(0, t0, ttft=0.1, latency=0.5),
        ok_record(1, t0 + 0.5, ttft=0.2, latency=1.0, prompt=14),
        ok_record(2, t0 + 1.0, ttft=0.3, latency=1.0),  # ends last, at t0 + 2.0
        failed_record(3, t0 + 1.2, kinds.HTTP_5XX, "HTTP 500: engine dead"),
    ]
    repeat = summarize_repeat("repeat-1", records, CLIENT, 10, 5)
    assert (repeat.requests, repeat.completed, repeat.failed) == (4, 3, 1)
    assert repeat.duration == pytest.approx(2.0)
    assert repeat.requests_per_second == pytest.approx(1.5)
    assert repeat.output_tokens_per_second == pytest.approx(7.5)  # 15 tokens / 2 s
    assert repeat.total_tokens_per_second == pytest.approx((15 + 12 + 14 + 12) / 2.0)
    assert repeat.ttft_ms.p(50.0) == pytest.approx(200.0)
    assert repeat.ttft_ms.mean == pytest.approx(200.0)
    assert repeat.latency_ms.p(90.0) == pytest.approx(1000.0)
    # TPOT = (latency - ttft) / (out - 1): 100, 200, 175 ms
    assert sorted(round(x, 6) for x in [repeat.tpot_ms.minimum, repeat.tpot_ms.maximum]) == [100.0, 200.0]
    assert repeat.itl_ms.count == 12
    assert repeat.errors == {"http_5xx": 1}
    assert repeat.first_errors == {"http_5xx": "HTTP 500: engine dead"}
    assert repeat.error_fraction == 0.25
    assert repeat.input_tokens.served_median == 12 and repeat.input_tokens.served_max == 14


def test_goodput_counts_requests_meeting_every_slo() -> None:
    t0 = 1000.0
    records = [ok_record(0, t0, 0.1, 0.5), ok_record(1, t0, 0.3, 1.0), ok_record(2, t0, 0.1, 2.0)]
    slos = parse_slos(["ttft:250", "e2el:1500"])
    repeat = summarize_repeat("repeat-1", records, CLIENT, 10, 5, slos)
    assert repeat.goodput_requests_per_second == pytest.approx(1 / 2.0)
    assert summarize_repeat("r", records, CLIENT, 10, 5).goodput_requests_per_second is None
    with pytest.raises(ValueError, match="--goodput"):
        parse_slos(["latency:3"])
    with pytest.raises(ValueError, match="--goodput"):
        parse_slos(["ttft:-1"])


def _repeat_with_throughput(tokens_per_second: float, failed: int = 0) -> object:
    # 10 requests over 1 s with `tokens_per_second / 10` tokens each (+ failures)
    out = int(tokens_per_second / 10)
    records = [ok_record(i, 0.0, 0.1, 1.0, out=out) for i in range(10 - failed)]
    records += [failed_record(10 + i, 0.0, kinds.CONNECT) for i in range(failed)]
    return summarize_repeat("r", records, CLIENT, 10, out)


def test_repeat_rule_keeps_the_median_repeat() -> None:
    repeats = [_repeat_with_throughput(v) for v in (1000, 1300, 1100)]
    choice = select_repeat(repeats, 0.5)
    assert choice.index == 2
    assert choice.spread == pytest.approx(300 / 1100)


def test_repeat_rule_even_count_takes_the_lower_middle() -> None:
    repeats = [_repeat_with_throughput(v) for v in (1200, 1000)]
    assert select_repeat(repeats, 0.5).index == 1
    repeats = [_repeat_with_throughput(v) for v in (1000, 1000, 1500, 2000)]
    assert select_repeat(repeats, 0.5).index == 0  # equal values: the earlier repeat


def test_repeat_rule_skips_failed_repeats_unless_all_failed() -> None:
    repeats = [_repeat_with_throughput(5000, failed=8), _repeat_with_throughput(1000), _repeat_with_throughput(1200)]
    choice = select_repeat(repeats, 0.5)
    assert choice.candidates == (1, 2) and choice.index == 1
    all_bad = [_repeat_with_throughput(3000, failed=9), _repeat_with_throughput(1000, failed=9)]
    assert select_repeat(all_bad, 0.5).candidates == (0, 1)


def test_contract_a_summary_keys_and_failure() -> None:
    repeats = [_repeat_with_throughput(1000), _repeat_with_throughput(1100, failed=6)]
    choice = select_repeat(repeats, 0.5)
    summary = build_summary(repeats, choice, concurrency=32, max_error_fraction=0.5)
    assert set(summary) >= CONTRACT_A_KEYS
    assert summary["ok"] is True and "error" not in summary
    assert summary["repeats"] == 2 and summary["keptRepeat"] == 0 and summary["concurrency"] == 32
    assert summary["startedAt"].endswith("Z")
    failing = build_summary(repeats, type(choice)(1, (1,), 1100.0, 0.0), 32, 0.5)
    assert failing["ok"] is False and "6 of 10 requests failed" in failing["error"] and "\n" not in failing["error"]
    assert failure_line(repeats[1], 0.6) is None  # 0.6 <= 0.6: not "most"


def test_termination_message_under_4_kib_with_many_error_kinds() -> None:
    records = [ok_record(0, 0.0, 0.1, 1.0)]
    for i in range(400):  # hundreds of distinct kinds with long messages
        records.append(failed_record(i + 1, 0.0, f"kind_{i:03d}_{'x' * 30}", "y" * 500))
    repeats = [summarize_repeat("r", records, CLIENT, 10, 5) for _ in range(100)]
    choice = select_repeat(repeats, 0.5)
    summary = build_summary(repeats, choice, 8, 0.5)
    assert len(json.dumps(summary)) > 4096
    text = fit_termination_message(summary)
    assert len(text.encode("utf-8")) < 4096
    fitted = json.loads(text)
    assert set(fitted) >= CONTRACT_A_KEYS
    assert sum(fitted["errors"].values()) == 400  # folded, not lost
    assert fitted["ok"] is False and fitted["error"]


def test_small_summary_is_unchanged() -> None:
    repeats = [_repeat_with_throughput(1000)]
    summary = build_summary(repeats, select_repeat(repeats, 0.5), 4, 0.5)
    assert json.loads(fit_termination_message(summary)) == summary


def test_judge_client_load() -> None:
    calm = judge_client_load([[0.2, 0.3, 0.25]], [0.5, 1.0, 2.0])
    assert not calm.limited and calm.cpu_peak == 0.3
    busy = judge_client_load([[0.2, 0.3], [0.95, 0.99, 0.97]], [0.5])
    assert busy.limited and "median CPU" in busy.reason and busy.workers == 2
    laggy = judge_client_load([[0.1]], [1.0] * 90 + [80.0] * 10)
    assert laggy.limited and "lag" in laggy.reason


def test_saved_run_and_table() -> None:
    repeats = [_repeat_with_throughput(1000), _repeat_with_throughput(1200, failed=2)]
    choice = select_repeat(repeats, 0.5)
    summary = build_summary(repeats, choice, 4, 0.5)
    raw = [[ok_record(0, 0.0, 0.1, 1.0)], [failed_record(0, 0.0, kinds.TIMEOUT)]]
    document = SavedRun({"concurrency": 4}, summary, choice, repeats, raw).to_json()
    assert document["summary"] == summary
    assert [r["repeat"] for r in document["requests"]] == [0, 1]
    assert document["requests"][0]["ttftMs"] == 100.0 and document["requests"][1]["error"] == "timeout"
    assert document["repeats"][1]["errors"] == {"connect": 2}
    json.dumps(document)
    table = render_table(repeats, choice, endpoint="http://x", api="chat", stream=True, concurrency=4, request_rate=None, failure=None)
    assert "TTFT" in table and "Output token throughput" in table and "kept" in table


def test_progress_only_on_a_terminal(tmp_path: pathlib.Path) -> None:
    with open(tmp_path / "log", "w") as not_a_tty:
        assert progress_wanted(True, not_a_tty) is False
    assert format_progress("repeat 1/3", 50, 2, 100, 3.25) == ("repeat 1/3 [############............] 50/100 requests, 2 failed, 3.2 s")


PURE_MODULES = ("statistics", "sse", "workload", "records", "resolve_rules", "summary", "table", "worker_plan", "adaptive", "expectation")
IO_LIBRARIES = {"aiohttp", "psutil", "click", "numpy", "asyncio", "multiprocessing", "socket", "tokenizers"}


@pytest.mark.parametrize("name", PURE_MODULES)
def test_pure_modules_import_no_io_library(name: str) -> None:
    import kneepoint.loadgen

    path = pathlib.Path(kneepoint.loadgen.__file__).parent / f"{name}.py"
    tree = ast.parse(path.read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
            if node.module.startswith("kneepoint.loadgen."):
                assert node.module.split(".")[-1] in PURE_MODULES, f"{name} imports the I/O module {node.module}"
    assert not imported & IO_LIBRARIES
