"""The load generator's stream rules on real vLLM 0.24 streams (tests/data/vllm; README there).

Recorded raw SSE lines with their arrival times are replayed through kneepoint's rule and
through vLLM bench serve's (every chunk with ``choices`` is an event, the first sets TTFT); the
per-request records of the 8B c32 capture are checked against their own summary and against
vLLM bench's run on the same server.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from kneepoint.loadgen.sse import CompletionStream, SSEEvent

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm"


def recorded(name: str) -> list[tuple[float, str]]:
    """(arrival seconds after the POST, data payload) of each SSE data line of a raw capture."""
    with gzip.open(DATA / name, "rt") as f:
        rows = [json.loads(line) for line in f]
    return [(r["t"], r["line"][len("data: ") :]) for r in rows[1:] if r.get("line", "").startswith("data: ")]


def kneepoint_rule(events: list[tuple[float, str]]) -> CompletionStream:
    state = CompletionStream()
    for t, payload in events:
        state.on_event(SSEEvent(payload), t)
    return state


def vllm_bench_rule(events: list[tuple[float, str]]) -> tuple[float, list[float], float]:
    """(ttft, itl, latency) as vllm/benchmarks/lib/endpoint_request_func.py computes them."""
    ttft, itl, last = None, [], None
    for t, payload in events:
        if payload == "[DONE]":
            continue
        if json.loads(payload).get("choices"):
            if ttft is None:
                ttft = t
            else:
                itl.append(t - last)
            last = t
    return ttft, itl, last


@pytest.mark.parametrize("name,tokens", [("8b-tp1-stream-completion-c1.jsonl.gz", 1500), ("8b-tp1-stream-chat-c1.jsonl.gz", 400)])
def test_real_streams_give_the_same_figures_under_both_rules(name, tokens) -> None:
    events = recorded(name)
    state = kneepoint_rule(events)
    assert state.done and state.usage["completion_tokens"] == tokens
    assert len(state.gaps) == tokens - 1 and state.output_chunks == tokens
    ttft, itl, latency = vllm_bench_rule(events)
    assert state.last_output_at == latency
    # Chat's role chunk (empty content) came 0.01 ms before the first token's: TTFTs agree to 0.1 ms.
    assert abs(state.first_output_at - ttft) < 1e-4
    tpot = (state.last_output_at - state.first_output_at) / (tokens - 1)
    assert tpot == pytest.approx((latency - ttft) / (tokens - 1), rel=1e-3)


def test_the_chat_stream_opens_with_an_empty_role_chunk_and_carries_no_other_empty_delta() -> None:
    payloads = [json.loads(p) for _, p in recorded("8b-tp1-stream-chat-c1.jsonl.gz") if p != "[DONE]"]
    deltas = [p["choices"][0]["delta"] for p in payloads if p["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert all(d.get("content") for d in deltas[1:])


def test_an_empty_delta_after_the_first_token_is_a_step() -> None:
    """A real stream with one of its middle chunks' text emptied, and its last chunk made
    finish-reason-only: kneepoint now counts both as vLLM bench does (no merged gap, no early end)."""
    events = recorded("8b-tp1-stream-completion-c1.jsonl.gz")
    edited = []
    for i, (t, payload) in enumerate(events):
        if payload != "[DONE]":
            chunk = json.loads(payload)
            if chunk.get("choices") and (i == 500 or chunk["choices"][0].get("finish_reason")):
                chunk["choices"][0]["text"] = ""
                payload = json.dumps(chunk)
        edited.append((t, payload))
    state = kneepoint_rule(edited)
    ttft, itl, latency = vllm_bench_rule(edited)
    assert state.gaps == itl and state.last_output_at == latency and state.first_output_at == ttft


def test_the_api_samples_stream_counts_three_tokens_and_not_the_usage_chunk() -> None:
    text = (DATA / "8b-tp1-api-samples.txt").read_text().split("## stream\n", 1)[1].split("## bad", 1)[0]
    payloads = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
    state = kneepoint_rule([(0.001 * i, p) for i, p in enumerate(payloads)])
    assert state.done and state.output_chunks == 3 and len(state.gaps) == 2
    assert state.last_output_at == pytest.approx(0.002) and state.usage["completion_tokens"] == 3


def test_c32_records_are_self_consistent_and_agree_with_vllm_bench() -> None:
    with gzip.open(DATA / "8b-tp1-loadgen-c32-requests.json.gz", "rt") as f:
        doc = json.load(f)
    kept = doc["requests"][:200]  # the kept repeat (#1) comes first
    for r in kept:
        assert r["ttftMs"] + sum(r["itlMs"]) == pytest.approx(r["latencyMs"], abs=0.001 * (len(r["itlMs"]) + 1))
        assert r["tpotMs"] == pytest.approx((r["latencyMs"] - r["ttftMs"]) / (r["outputTokens"] - 1), abs=0.002)
    # Under load some chunks carry several tokens: fewer gaps than tokens - 1, for both tools alike.
    assert sum(1 for r in doc["requests"] if len(r["itlMs"]) < r["outputTokens"] - 1) == 216
    summary = doc["summary"]
    assert sum(r["tpotMs"] for r in kept) / len(kept) == pytest.approx(summary["tpotMeanMs"], abs=0.01)
    bench = json.loads((DATA / "8b-tp1-vllm-bench-c32.json").read_text())
    assert summary["outputTokensPerSecond"] / bench["output_throughput"] - 1 == pytest.approx(-0.0076, abs=0.002)
    assert abs(summary["outputTokensPerSecond"] / bench["output_throughput"] - 1) < 0.01
    assert abs(summary["tpotMeanMs"] / bench["mean_tpot_ms"] - 1) < 0.01
