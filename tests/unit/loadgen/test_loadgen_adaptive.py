"""The adaptive stop (loadgen/adaptive.py): its distributions, its intervals on real vLLM records, and its bounds (pure).

The real records are the first H200 capture's c32 repeats (tests/data/vllm: the per-request
TTFT/E2E/tokens of ``8b-tp1-loadgen-c32-requests.json.gz`` and, beside it, each request's
start and end in ``8b-tp1-loadgen-c32-request-times.json.gz``).
"""

from __future__ import annotations

import gzip
import heapq
import json
import math
import pathlib

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kneepoint.loadgen.adaptive import (
    MIN_BATCHES,
    AdaptivePlan,
    AdaptiveStop,
    adaptive_json,
    assess_records,
    min_samples_for_quantile,
    quantile_ranks,
    replay_requests_sent,
    t_quantile_two_sided,
)
from kneepoint.loadgen.records import HTTP_5XX, RequestRecord
from kneepoint.loadgen.summary import ClientLoad, summarize_repeat

DATA = pathlib.Path(__file__).resolve().parents[2] / "data" / "vllm"
NO_CLIENT_LOAD = ClientLoad(1, 0.0, 0.0, 0.0, False)


def real_repeats() -> dict[int, list[RequestRecord]]:
    """The c32 capture's two repeats of 200 requests, as the load generator recorded them."""
    with gzip.open(DATA / "8b-tp1-loadgen-c32-requests.json.gz", "rt") as handle:
        timings = json.load(handle)["requests"]
    with gzip.open(DATA / "8b-tp1-loadgen-c32-request-times.json.gz", "rt") as handle:
        times = json.load(handle)["rows"]
    repeats: dict[int, list[RequestRecord]] = {0: [], 1: []}
    for timing, (repeat, index, start_ms, end_ms) in zip(timings, times, strict=True):
        assert timing["index"] == index
        repeats[repeat].append(
            RequestRecord(
                index=index,
                start=start_ms / 1000.0,
                end=end_ms / 1000.0,
                input_tokens_asked=1024,
                output_tokens_asked=256,
                ttft=timing["ttftMs"] / 1000.0,
                latency=timing["latencyMs"] / 1000.0,
                input_tokens=timing["inputTokens"],
                output_tokens=timing["outputTokens"],
            )
        )
    return repeats


# --------------------------------------------------------------------------------------------
# Distributions


@pytest.mark.parametrize(
    ("confidence", "df", "table"),
    [(0.95, 1, 12.706), (0.95, 4, 2.776), (0.95, 10, 2.228), (0.95, 29, 2.045), (0.90, 5, 2.015), (0.99, 20, 2.845)],
)
def test_student_t_quantiles_match_the_table(confidence: float, df: int, table: float) -> None:
    assert t_quantile_two_sided(confidence, df) == pytest.approx(table, abs=5e-4)


def _binomial_mass(n: int, q: float, low: int, high: int) -> float:
    return math.fsum(math.comb(n, k) * q**k * (1 - q) ** (n - k) for k in range(low, high + 1))


@pytest.mark.parametrize(("n", "q", "confidence"), [(400, 0.99, 0.95), (1000, 0.99, 0.95), (500, 0.99, 0.90), (60, 0.5, 0.95)])
def test_quantile_ranks_cover_and_are_the_tightest(n: int, q: float, confidence: float) -> None:
    ranks = quantile_ranks(n, q, confidence)
    assert ranks is not None
    lower, upper = ranks
    alpha = (1 - confidence) / 2
    # X(l) <= quantile <= X(u) iff l <= B <= u - 1, B ~ Binomial(n, q)
    assert _binomial_mass(n, q, 0, lower - 1) <= alpha < _binomial_mass(n, q, 0, lower)
    assert _binomial_mass(n, q, upper, n) <= alpha < _binomial_mass(n, q, upper - 1, n)
    assert _binomial_mass(n, q, lower, upper - 1) >= confidence


def test_the_p99_interval_needs_368_samples_at_95_percent() -> None:
    assert min_samples_for_quantile(0.99, 0.95) == 368
    assert 0.99**367 > 0.025 >= 0.99**368  # all samples below the P99 is the binding tail
    assert quantile_ranks(367, 0.99, 0.95) is None and quantile_ranks(368, 0.99, 0.95) is not None
    assert min_samples_for_quantile(0.99, 0.90) == 299


# --------------------------------------------------------------------------------------------
# Real vLLM records


def test_the_operators_200_request_repeat_cannot_pin_its_p99_and_runs_the_whole_plan() -> None:
    for records in real_repeats().values():
        sent, stopped_at = replay_requests_sent(records, 32, 200, AdaptivePlan())
        assert (sent, stopped_at) == (200, None)
        assessment = assess_records(records, 32, AdaptivePlan())
        assert not assessment.precise and "368 completed requests" in assessment.reason


def test_the_throughput_interval_is_the_steady_rate_between_the_ramp_and_the_drain() -> None:
    records = real_repeats()[0]
    repeat = summarize_repeat("r", records, NO_CLIENT_LOAD, 1024, 256)
    throughput = assess_records(records, 32, AdaptivePlan()).throughput
    assert throughput is not None and throughput.relative <= 0.05
    by_end = sorted(records, key=lambda r: r.end or 0.0)
    # 200 = the ramp's cycle of 32, five whole batches of 32, and 8 in the drain: batches 33..192
    steady = sum(r.output_tokens or 0 for r in by_end[32:192]) / ((by_end[191].end or 0.0) - (by_end[31].end or 0.0))
    assert throughput.estimate == pytest.approx(steady, rel=1e-12)
    # vLLM bench's figure (first start to last end) also holds the ramp and the drain, where fewer than 32 are in flight
    assert repeat.output_tokens_per_second == pytest.approx(3197.714, abs=1e-3)
    assert throughput.low > repeat.output_tokens_per_second


def test_the_real_p99_interval_holds_the_reported_p99() -> None:
    records = real_repeats()[0]
    repeat = summarize_repeat("r", records, NO_CLIENT_LOAD, 1024, 256)
    assert repeat.latency_ms is not None
    # 200 samples give an interval only below 80 % confidence (0.99**200 = 0.13)
    p99 = assess_records(records, 32, AdaptivePlan(confidence=0.6)).latency_p99_ms
    assert p99 is not None and p99.estimate == pytest.approx(repeat.latency_ms.p(99.0))
    assert p99.low <= p99.estimate <= p99.high and p99.relative < 0.05


def test_two_real_repeats_back_to_back_stop_at_the_first_check_past_368() -> None:
    repeats = real_repeats()
    seam = max(r.end or 0.0 for r in repeats[0])
    second = [
        RequestRecord(
            index=200 + r.index,
            start=r.start + seam,
            end=(r.end or 0.0) + seam,
            input_tokens_asked=1024,
            output_tokens_asked=256,
            ttft=r.ttft,
            latency=r.latency,
            output_tokens=r.output_tokens,
        )
        for r in repeats[1]
    ]
    records = repeats[0] + second
    # The seam (the first repeat's drain, the second's ramp) makes throughput +-11.3 %: within 15 %.
    plan = AdaptivePlan(relative_precision=0.15)
    sent, stopped_at = replay_requests_sent(records, 32, 400, plan)
    assert stopped_at is not None and sent == 400  # every request had started by the 384th completion
    rule = AdaptiveStop(plan, 32, 400)
    stops = [rule.add(r) for r in sorted(records, key=lambda r: r.end or 0.0)]
    assert stops.index(True) == 384 - 1
    assert rule.decision is not None and rule.decision.completed == 384
    document = adaptive_json(plan, 400, sent, rule.decision, assess_records(records, 32, plan))
    assert document["stoppedEarly"] and document["completedAtStop"] == 384
    assert plan.relative_precision >= max(rule.decision.throughput.relative, rule.decision.latency_p99_ms.relative)  # type: ignore[union-attr]
    # at the default 5 % it would not have stopped
    assert replay_requests_sent(records, 32, 400, AdaptivePlan()) == (400, None)


# --------------------------------------------------------------------------------------------
# Properties: never more than the plan, never before the minimum


def closed_loop(
    latencies: list[float], concurrency: int, planned: int, rule: AdaptiveStop, fail_every: int
) -> tuple[list[RequestRecord], int | None]:
    """A closed loop of ``concurrency`` slots over given latencies (a slot sends its next request when its last one
    ends); the records in end order and the position of the one that stopped the rule."""
    records: list[RequestRecord] = []
    stopped_by: int | None = None
    in_flight: list[tuple[float, int, float]] = []
    sent = 0
    stopped = False

    def send(now: float) -> None:
        nonlocal sent
        if not stopped and sent < planned:
            heapq.heappush(in_flight, (now + latencies[sent % len(latencies)], sent, now))
            sent += 1

    for _ in range(concurrency):
        send(0.0)
    while in_flight:
        end, index, start = heapq.heappop(in_flight)
        failed = fail_every > 0 and index % fail_every == 0
        record = RequestRecord(
            index=index,
            start=start,
            end=end,
            input_tokens_asked=8,
            output_tokens_asked=8,
            latency=end - start,
            ttft=(end - start) / 2,
            output_tokens=8,
            error=HTTP_5XX if failed else None,
        )
        records.append(record)
        if rule.add(record) and not stopped:
            stopped, stopped_by = True, len(records) - 1
        send(end)
    return records, stopped_by


@settings(max_examples=60, deadline=None)
@given(
    latencies=st.lists(st.floats(min_value=0.001, max_value=10.0), min_size=1, max_size=50),
    concurrency=st.integers(min_value=1, max_value=64),
    planned=st.integers(min_value=1, max_value=1500),
    min_requests=st.integers(min_value=1, max_value=800),
    precision=st.floats(min_value=0.01, max_value=0.99),
    confidence=st.sampled_from([0.5, 0.8, 0.9, 0.95, 0.99]),
    fail_every=st.integers(min_value=0, max_value=7),
)
@example(latencies=[1.0], concurrency=8, planned=1500, min_requests=100, precision=0.05, confidence=0.95, fail_every=0)  # stops at 368
@example(latencies=[1.0, 1.1, 0.9], concurrency=32, planned=1000, min_requests=500, precision=0.2, confidence=0.9, fail_every=5)
def test_never_more_than_the_plan_and_never_before_the_minimum(
    latencies: list[float], concurrency: int, planned: int, min_requests: int, precision: float, confidence: float, fail_every: int
) -> None:
    plan = AdaptivePlan(relative_precision=precision, confidence=confidence, min_requests=min_requests)
    rule = AdaptiveStop(plan, concurrency, planned)
    records, stopped_by = closed_loop(latencies, concurrency, planned, rule, fail_every)
    assert len(records) <= planned
    assert sorted(r.index for r in records) == list(range(len(records)))
    if rule.decision is None:
        assert len(records) == planned and stopped_by is None
        return
    assert stopped_by is not None
    # after the stop only the requests then in flight finish: at most concurrency - 1 more
    assert len(records) <= stopped_by + concurrency
    completed = rule.decision.completed
    assert completed >= min_requests
    assert completed >= max((MIN_BATCHES + 1) * concurrency, min_samples_for_quantile(0.99, confidence))
    assert completed % concurrency == 0
    assert rule.decision.throughput is not None and rule.decision.throughput.relative <= precision
    assert rule.decision.latency_p99_ms is not None and rule.decision.latency_p99_ms.relative <= precision
    # the replay of the same records finds the same stop and sends no more than the run did
    sent, stopped_at = replay_requests_sent(records, concurrency, planned, plan)
    assert stopped_at is not None and sent <= len(records)


@settings(max_examples=40, deadline=None)
@given(
    ends=st.lists(st.floats(min_value=0.0, max_value=1000.0), min_size=0, max_size=600),
    concurrency=st.integers(min_value=1, max_value=40),
    planned=st.integers(min_value=1, max_value=700),
    min_requests=st.integers(min_value=1, max_value=700),
)
def test_replay_is_bounded_by_the_plan_for_any_records(ends: list[float], concurrency: int, planned: int, min_requests: int) -> None:
    records = [
        RequestRecord(
            index=i, start=max(0.0, e - 1.0), end=e, input_tokens_asked=1, output_tokens_asked=1, latency=min(e, 1.0), output_tokens=1
        )
        for i, e in enumerate(ends)
    ]
    plan = AdaptivePlan(relative_precision=0.5, confidence=0.9, min_requests=min_requests)
    sent, stopped_at = replay_requests_sent(records, concurrency, planned, plan)
    assert sent <= len(records) or (stopped_at is None and sent == planned)
    if stopped_at is None:
        assert sent == min(planned, len(records))
    else:
        assert sum(1 for r in records if r.end is not None and r.end <= stopped_at and r.ok) >= min_requests


def test_bad_settings_name_the_flag() -> None:
    with pytest.raises(ValueError, match="--adaptive-precision"):
        AdaptivePlan(relative_precision=0.0)
    with pytest.raises(ValueError, match="--adaptive-confidence"):
        AdaptivePlan(confidence=1.0)
    with pytest.raises(ValueError, match="--adaptive-min-requests"):
        AdaptivePlan(min_requests=0)
