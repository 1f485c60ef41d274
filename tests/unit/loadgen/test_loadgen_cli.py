"""``kneepoint loadgen`` end to end against the stub server on 127.0.0.1 (loadgen_stub_server).

Counts per error kind, exit codes, the termination message and --save-json are asserted;
the only timing assertion is a generous window around an injected 50 ms TTFT.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from loadgen_stub_server import CHAT_TEMPLATE_TOKENS, StubServer, start_stub

from kneepoint.loadgen.command import command

TTFT_MS = 50.0


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    """The stub server in a background thread's event loop, for the whole module."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner, port = asyncio.run_coroutine_threadsafe(start_stub(StubServer(ttft_ms=TTFT_MS, itl_ms=2.0)), loop).result(10)
    yield f"http://127.0.0.1:{port}"
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)


def run_cli(
    tmp_path: pathlib.Path, endpoint: str, *extra: str, model: str | None = "ok", env: dict[str, str] | None = None
) -> tuple[int, dict | None, str, str]:
    """Invoke the command; returns (exit code, termination summary, stdout, stderr)."""
    term = tmp_path / "termination-log"
    if term.exists():
        term.unlink()
    args = ["--endpoint", endpoint, "--concurrency", "4", "--num-requests", "12", "--input-len", "16", "--output-len", "8"]
    if model is not None:
        args += ["--model", model]
    result = CliRunner().invoke(command, [*args, *extra], env={"TERMINATION_MESSAGE_PATH": str(term), **(env or {})})
    if result.exception and not isinstance(result.exception, SystemExit):
        raise result.exception
    summary = None
    if term.exists():
        raw = term.read_bytes()
        assert len(raw) < 4096
        summary = json.loads(raw)
    return result.exit_code, summary, result.stdout, result.stderr


def test_streaming_chat_run(tmp_path: pathlib.Path, endpoint: str) -> None:
    saved = tmp_path / "run.json"
    code, summary, out, err = run_cli(tmp_path, endpoint, "--api", "chat", "--repeats", "2", "--warmup-requests", "4",
                                      "--save-json", str(saved))  # fmt: skip # argv: each flag beside its value
    assert code == 0, err
    assert summary["ok"] is True and summary["completed"] == 12 and summary["failed"] == 0
    assert TTFT_MS <= summary["ttftP50Ms"] <= 150.0
    assert summary["ttftP50Ms"] <= summary["ttftP99Ms"] <= summary["latencyP99Ms"]
    assert summary["inputTokensAsked"] == 16 and summary["inputTokensServed"] == 16 + CHAT_TEMPLATE_TOKENS
    assert summary["outputTokensAsked"] == summary["outputTokensServed"] == 8
    assert summary["repeats"] == 2 and len(summary["repeatOutputTokensPerSecond"]) == 2
    assert summary["outputTokensPerSecond"] > 0 and summary["errors"] == {}
    assert "TTFT" in out and "Output token throughput" in out
    document = json.loads(saved.read_text())
    assert document["summary"] == summary
    assert len(document["requests"]) == 24  # 2 repeats x 12, warm-up not recorded
    assert all(len(r["itlMs"]) == 7 and r["outputTokens"] == 8 for r in document["requests"])
    assert document["config"]["workers"] == 1


def test_non_streaming_completions(tmp_path: pathlib.Path, endpoint: str) -> None:
    code, summary, _, err = run_cli(tmp_path, endpoint, "--api", "completions", "--no-stream")
    assert code == 0, err
    assert summary["ttftP50Ms"] is None and summary["latencyP50Ms"] >= TTFT_MS
    assert summary["inputTokensServed"] == 16 and summary["outputTokensServed"] == 8


@pytest.mark.parametrize(
    ("model", "kind"),
    [
        ("http500", "http_5xx"),
        ("http400", "http_4xx"),
        ("malformed", "malformed_sse"),
        ("early", "early_close"),
        ("nodone", "early_close"),
        ("short", "short_output"),
        ("streamerr", "stream_error"),
    ],
)
def test_bad_server_kinds(tmp_path: pathlib.Path, endpoint: str, model: str, kind: str) -> None:
    code, summary, _, err = run_cli(tmp_path, endpoint, model=model)
    assert code == 1
    assert summary["ok"] is False and summary["errors"] == {kind: 12} and summary["failed"] == 12
    assert summary["errorFraction"] == 1.0
    failure_lines = [line for line in err.splitlines() if "FAILED" in line]
    assert len(failure_lines) == 1 and kind in failure_lines[0]
    assert "Traceback" not in err


def test_split_chunks_comments_and_crlf_are_fine(tmp_path: pathlib.Path, endpoint: str) -> None:
    code, summary, _, err = run_cli(tmp_path, endpoint, model="split")
    assert code == 0, err
    assert summary["completed"] == 12


def test_timeout(tmp_path: pathlib.Path, endpoint: str) -> None:
    code, summary, _, _ = run_cli(tmp_path, endpoint, "--timeout", "0.3", "--num-requests", "4", model="hang")
    assert code == 1 and summary["errors"] == {"timeout": 4}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_unreachable_port(tmp_path: pathlib.Path) -> None:
    code, summary, _, err = run_cli(tmp_path, f"http://127.0.0.1:{_free_port()}")
    assert code == 1 and summary["errors"] == {"connect": 12}
    assert "connect 12" in err


def test_some_failures_continue_and_max_error_fraction(tmp_path: pathlib.Path, endpoint: str) -> None:
    # mixed-4: every 4th arrival answers 500; one stream keeps arrivals in order
    code, summary, _, _ = run_cli(tmp_path, endpoint, "--concurrency", "1", model="mixed-4")
    assert code == 0 and summary["ok"] is True
    assert summary["errors"] == {"http_5xx": 3} and summary["completed"] == 9
    code, summary, _, err = run_cli(tmp_path, endpoint, "--concurrency", "1", "--max-error-fraction", "0.2", model="mixed-4")
    assert code == 1 and summary["ok"] is False and "--max-error-fraction 0.2" in summary["error"]


def test_resolve_flag_and_env(tmp_path: pathlib.Path, endpoint: str) -> None:
    port = endpoint.rsplit(":", 1)[1]
    named = f"http://engine.kneepoint.test:{port}"
    code, summary, _, err = run_cli(tmp_path, named, "--resolve", f"engine.kneepoint.test:{port}:127.0.0.1")
    assert code == 0, err
    code, summary, _, err = run_cli(tmp_path, named, env={"KNEEPOINT_RESOLVE": f"other:1:127.0.0.2,engine.kneepoint.test:{port}:127.0.0.1"})
    assert code == 0, err
    assert summary["completed"] == 12


def test_model_from_v1_models(tmp_path: pathlib.Path, endpoint: str) -> None:
    code, summary, _, err = run_cli(tmp_path, endpoint, model=None)
    assert code == 0, err  # the stub lists "ok"


def test_poisson_rate_and_goodput(tmp_path: pathlib.Path, endpoint: str) -> None:
    code, summary, out, err = run_cli(tmp_path, endpoint, "--request-rate", "200", "--goodput", "ttft:5000", "--goodput", "e2el:1")
    assert code == 0, err
    assert summary["goodputRequestsPerSecond"] == 0.0  # nobody finishes within 1 ms
    assert "Poisson 200 req/s" in out


def test_two_worker_processes(tmp_path: pathlib.Path, endpoint: str) -> None:
    saved = tmp_path / "run.json"
    code, summary, _, err = run_cli(tmp_path, endpoint, "--workers", "2", "--num-requests", "24", "--repeats", "2",
                                    "--save-json", str(saved))  # fmt: skip # argv: each flag beside its value
    assert code == 0, err
    assert summary["completed"] == 24
    document = json.loads(saved.read_text())
    assert document["config"]["workers"] == 2
    assert document["repeats"][0]["client"]["workers"] == 2
    assert {r["worker"] for r in document["requests"]} == {0, 1}
    assert sorted(r["index"] for r in document["requests"] if r["repeat"] == 0) == list(range(24))


@pytest.mark.parametrize("workers", ["1", "2"])
def test_adaptive_stops_a_repeat_early(tmp_path: pathlib.Path, endpoint: str, workers: str) -> None:
    saved = tmp_path / "run.json"
    # 90 % confidence: the P99 interval exists from 299 completions; a loose 50 % precision
    # makes the stop depend on the count only, not on how crowded this machine is.
    code, summary, out, err = run_cli(tmp_path, endpoint, "--concurrency", "32", "--num-requests", "600", "--workers", workers,
                                      "--adaptive", "--adaptive-confidence", "0.9", "--adaptive-precision", "0.5",
                                      "--save-json", str(saved))  # fmt: skip # argv: each flag beside its value
    assert code == 0, err
    adaptive = summary["adaptive"]
    assert adaptive["stoppedEarly"] is True and adaptive["requestsPlanned"] == 600
    assert adaptive["completedAtStop"] == 320  # the first whole cycle of 32 at or past 299
    # The requests in flight at the stop finish and are measured: at most one more cycle. With
    # worker processes a few more may start while the parent reads the 320th record.
    assert 320 <= adaptive["requestsSent"] == summary["completed"] < 320 + 32 * int(workers)
    low, high = adaptive["latencyP99MsInterval"]  # the interval at the stop, over 320 completions
    assert 0 < low <= high
    assert "Adaptive stop (kept repeat):" in out and "early" in out
    document = json.loads(saved.read_text())
    assert len(document["requests"]) == adaptive["requestsSent"]
    assert document["repeats"][0]["adaptive"] == adaptive
    assert document["config"]["adaptive"] == {"relativePrecision": 0.5, "confidence": 0.9, "minRequests": 100}


def test_adaptive_never_sends_more_than_the_plan(tmp_path: pathlib.Path, endpoint: str) -> None:
    code, summary, _, err = run_cli(tmp_path, endpoint, "--concurrency", "8", "--num-requests", "40", "--repeats", "2",
                                    "--adaptive", "--adaptive-min-requests", "1")  # fmt: skip # argv: each flag beside its value
    assert code == 0, err
    adaptive = summary["adaptive"]
    assert adaptive["stoppedEarly"] is False and adaptive["requestsSent"] == 40 == summary["completed"]
    assert "368 completed requests at 95% confidence" in adaptive["reason"]
    assert adaptive["latencyP99MsInterval"] is None


def test_auto_workers_escalate_after_a_cpu_saturated_warmup(tmp_path: pathlib.Path, endpoint: str) -> None:
    from kneepoint.loadgen.command import available_cores

    if available_cores() < 2:
        pytest.skip("needs two usable cores")
    saved = tmp_path / "run.json"
    # a limit of 0.001 core makes any warm-up count as CPU-saturated
    code, summary, _, err = run_cli(tmp_path, endpoint, "--workers", "auto", "--warmup-requests", "8",
                                    "--client-cpu-limit", "0.001", "--save-json", str(saved))  # fmt: skip # argv: each flag beside its value
    assert code == 0, err
    assert "warming up again with 2" in err
    assert json.loads(saved.read_text())["config"]["workers"] == 2


def test_tokenizer_run(tmp_path: pathlib.Path, endpoint: str) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    model = tokenizers.Tokenizer(tokenizers.models.WordLevel({"alpha": 0, "beta": 1, "gamma": 2, "[UNK]": 3}, unk_token="[UNK]"))
    model.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    model.decoder = tokenizers.decoders.WordPiece()  # joins words with spaces
    model.add_special_tokens(["[UNK]"])
    model.save(str(tmp_path / "tokenizer.json"))
    saved = tmp_path / "run.json"
    code, summary, _, err = run_cli(tmp_path, endpoint, "--tokenizer", str(tmp_path), "--save-json", str(saved))
    assert code == 0, err
    assert summary["inputTokensServed"] == 16  # the stub counts words; each word is one token here
    assert json.loads(saved.read_text())["repeats"][0]["inputTokensLocalMismatch"] == 0


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--concurrency", "0"], "--concurrency"),
        (["--concurrency", "many"], "--concurrency"),
        (["--api", "embeddings"], "--api"),
        (["--resolve", "nonsense"], "--resolve"),
        (["--workers", "0"], "--workers"),
        (["--request-rate", "-1"], "--request-rate"),
        (["--goodput", "p99:3"], "--goodput"),
        (["--max-error-fraction", "2"], "--max-error-fraction"),
        (["--tokenizer", "/nonexistent/tok"], "--tokenizer"),
        (["--repeats", "0"], "--repeats"),
        (["--endpoint", "ftp://x"], "--endpoint"),
        (["--save-json", "/nonexistent/dir/run.json"], "--save-json"),
        (["--adaptive", "--adaptive-precision", "0"], "--adaptive-precision"),
        (["--adaptive", "--adaptive-confidence", "1"], "--adaptive-confidence"),
        (["--adaptive", "--adaptive-min-requests", "0"], "--adaptive-min-requests"),
    ],
)
def test_bad_flags_exit_2_with_one_line(args: list[str], flag: str) -> None:
    base = ["--endpoint", "http://127.0.0.1:9", "--concurrency", "1", "--model", "m"]
    result = CliRunner().invoke(command, [*base, *args])
    assert result.exit_code == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error:") and flag in lines[0], result.stderr


def test_bad_resolve_env_names_the_env() -> None:
    result = CliRunner().invoke(command, ["--endpoint", "http://h:1", "--concurrency", "1"], env={"KNEEPOINT_RESOLVE": "bad"})
    assert result.exit_code == 2 and "KNEEPOINT_RESOLVE" in result.stderr


def test_console_script_exit_code_and_termination_message(tmp_path: pathlib.Path) -> None:
    term = tmp_path / "term"
    env = dict(os.environ, TERMINATION_MESSAGE_PATH=str(term))
    process = subprocess.run(
        [sys.executable, "-m", "kneepoint", "loadgen", "--endpoint", f"http://127.0.0.1:{_free_port()}", "--model", "m",
         "--concurrency", "2", "--num-requests", "4", "--input-len", "4", "--output-len", "4"],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip # argv: each flag beside its value
    assert process.returncode == 1
    assert "Traceback" not in process.stderr
    summary = json.loads(term.read_text())
    assert summary["ok"] is False and summary["errors"] == {"connect": 4}


def test_expect_stops_repeating_once_a_repeat_confirms_and_runs_them_all_when_none_does(tmp_path: pathlib.Path, endpoint: str) -> None:
    # The stub answers every request in about the same time: a throughput band of 99 % is met by any repeat that
    # completed, one of 0.1 % around a figure 100 times off by none.
    code, summary, _, err = run_cli(tmp_path, endpoint, "--repeats", "3", "--expect", "outputTokensPerSecond=500:0.99")
    assert code == 0, err
    assert summary["repeats"] == 1 and summary["expectation"] == {
        "confirmedAfterRepeat": 1,
        "repeatsPlanned": 3,
        "keys": ["outputTokensPerSecond"],
    }
    assert "repeat 1 confirms every expected figure (outputTokensPerSecond" in err and "no more repeats (of 3)" in err
    code, summary, _, err = run_cli(tmp_path, endpoint, "--repeats", "2", "--expect", "outputTokensPerSecond=1e9:0.001")
    assert code == 0, err
    assert summary["repeats"] == 2 and summary["expectation"]["confirmedAfterRepeat"] is None
    assert "repeat 1 does not confirm the expected figures" in err
