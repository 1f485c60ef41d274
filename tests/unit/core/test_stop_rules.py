"""Each stop rule alone: when it fires, its boundaries, and "not evaluated" when a figure is missing."""

from __future__ import annotations

import pytest

from kneepoint.core.spec import StopRulesSpec
from kneepoint.core.status import TierResult
from kneepoint.core.stop_rules import (
    COMM_FRACTION,
    P99_DEGRADATION,
    THROUGHPUT_GAIN,
    check_comm_fraction,
    check_memory_headroom,
    check_p99_degradation,
    check_throughput_gain,
    evaluate_step,
    format_fraction,
    relative_change,
)


def tier(tp: int, tps: float | None = None, p99: float | None = None, comm: float | None = None, pp: int = 1, **kw) -> TierResult:
    return TierResult(
        tensor_parallel=tp,
        pipeline_parallel=pp,
        gpus=tp * pp,
        name=f"tp{tp}-pp{pp}",
        phase="Measured",
        output_tokens_per_second=tps,
        latency_p99_ms=p99,
        comm_fraction=comm,
        **kw,
    )


@pytest.mark.parametrize(
    "t_prev, t_cur, threshold, fired",
    [
        (1000, 1100, 0.20, True),  # +0.10
        (1000, 1199, 0.20, True),
        (100, 120, 0.20, False),  # exactly +0.20 (0.19999999999999996 in floating point) continues
        (1000, 1200, 0.20, False),
        (1000, 1500, 0.20, False),
        (1000, 900, 0.20, True),  # more GPUs, less throughput
        (1000, 1000, 0.20, True),  # no gain at all
        (1000, 2000, 1.0, False),  # threshold at its upper bound: a doubling continues
        (1000, 1999, 1.0, True),
    ],
)
def test_throughput_gain_fires_strictly_below_the_threshold(t_prev, t_cur, threshold, fired):
    verdict = check_throughput_gain(tier(1, t_prev), tier(2, t_cur), threshold)
    assert verdict.rule == THROUGHPUT_GAIN
    assert verdict.fired is fired
    assert verdict.numbers["throughputGain"] == pytest.approx((t_cur - t_prev) / t_prev)
    assert verdict.step == "TP1 -> TP2"


def test_throughput_gain_not_evaluated_without_throughput():
    verdict = check_throughput_gain(tier(1, None), tier(2, 1200), 0.2)
    assert verdict.fired is None
    assert "TP1" in verdict.explanation and "outputTokensPerSecond" in verdict.explanation
    assert check_throughput_gain(tier(1, 0.0), tier(2, 1200), 0.2).fired is None


@pytest.mark.parametrize(
    "p_prev, p_cur, t_prev, t_cur, fired",
    [
        (1000, 1300, 1000, 1050, True),  # ΔP +0.30 > 0.10 and > ΔT +0.05
        (1000, 1300, 1000, 1500, False),  # ΔP +0.30 > 0.10 but <= ΔT +0.50
        (1000, 1300, 1000, 1300, False),  # ΔP == ΔT: a tie does not fire
        (1000, 1100, 1000, 1000, False),  # ΔP exactly at the limit does not fire
        (1000, 1050, 1000, 900, False),  # ΔP +0.05 > ΔT -0.10 but under the limit
        (1000, 800, 1000, 1100, False),  # P99 improves
    ],
)
def test_p99_degradation_needs_both_conditions(p_prev, p_cur, t_prev, t_cur, fired):
    verdict = check_p99_degradation(tier(1, t_prev, p_prev), tier(2, t_cur, p_cur), 0.10)
    assert verdict.rule == P99_DEGRADATION
    assert verdict.fired is fired


def test_p99_degradation_not_evaluated_without_latency_or_throughput():
    assert check_p99_degradation(tier(1, 1000, None), tier(2, 1100, 900), 0.1).fired is None
    assert check_p99_degradation(tier(1, None, 1000), tier(2, 1100, 900), 0.1).fired is None


@pytest.mark.parametrize(
    "comm, threshold, fired",
    [(0.41, 0.40, True), (0.40, 0.40, False), (0.17, 0.40, False), (0.99, 1.0, False), (1.0, 1.0, False)],
)
def test_comm_fraction_fires_strictly_above(comm, threshold, fired):
    verdict = check_comm_fraction(tier(1, 1000, comm=0.1), tier(2, 1200, comm=comm), threshold)
    assert verdict.rule == COMM_FRACTION
    assert verdict.fired is fired


def test_comm_fraction_is_never_guessed():
    verdict = check_comm_fraction(tier(1, 1000, comm=0.1), tier(2, 1200, comm=None), 0.4)
    assert verdict.fired is None
    assert "never guessed" in verdict.explanation


@pytest.mark.parametrize(
    "needed, capacity, threshold, fired",
    [
        (50.0, 100.0, 0.85, True),
        (85.0, 100.0, 0.85, True),  # at the threshold: fires (<=)
        (85.1, 100.0, 0.85, False),
        (100.0, 100.0, 1.0, True),  # headroom 1.0: anything that fits is enough
    ],
)
def test_memory_headroom_uses_the_needed_figure(needed, capacity, threshold, fired):
    t = tier(1, 1000, peak_memory_gi_b=needed, allocated_memory_gi_b=capacity * 0.9, gpu_memory_gi_b=capacity)
    verdict = check_memory_headroom(t, threshold)
    assert verdict.fired is fired
    assert verdict.numbers["share"] == pytest.approx(needed / capacity)


def test_memory_headroom_ignores_the_allocated_figure():
    # vLLM pre-allocates: allocated reads 0.90 of the GPU although the load needs 30 %.
    t = tier(1, 1000, peak_memory_gi_b=42.0, allocated_memory_gi_b=126.0, gpu_memory_gi_b=140.0)
    assert check_memory_headroom(t, 0.85).fired is True


def test_memory_headroom_not_evaluated_without_figures_or_on_several_gpus():
    assert check_memory_headroom(tier(1, 1000, gpu_memory_gi_b=140.0), 0.85).fired is None
    assert check_memory_headroom(tier(1, 1000, peak_memory_gi_b=40.0), 0.85).fired is None
    assert check_memory_headroom(tier(2, 1000, peak_memory_gi_b=40.0, gpu_memory_gi_b=140.0), 0.85).fired is None


def test_memory_headroom_falls_back_to_a_given_gpu_memory():
    verdict = check_memory_headroom(tier(1, 1000, peak_memory_gi_b=40.0), 0.85, gpu_memory_gib=140.0)
    assert verdict.fired is True


def test_evaluate_step_keeps_every_verdict_in_rule_order():
    rules = StopRulesSpec(min_throughput_gain=0.2, max_p99_degradation=0.1, max_comm_fraction=0.4)
    step = evaluate_step(tier(1, 1000, 1000, 0.1), tier(2, 1050, 1500, 0.5), rules)
    assert [v.rule for v in step.verdicts] == [THROUGHPUT_GAIN, P99_DEGRADATION, COMM_FRACTION]
    assert step.fired == (THROUGHPUT_GAIN, P99_DEGRADATION, COMM_FRACTION)
    assert step.throughput_gain == pytest.approx(0.05)
    assert step.p99_change == pytest.approx(0.5)
    assert step.label == "TP1 -> TP2"


def test_relative_change_rejects_missing_and_non_positive_bases():
    assert relative_change(120, 100) == pytest.approx(0.2)
    assert relative_change(None, 100) is None
    assert relative_change(100, None) is None
    assert relative_change(100, 0) is None


def test_format_fraction_shows_more_digits_when_two_would_hide_the_side():
    assert format_fraction(0.5353) == "+0.54"
    assert format_fraction(0.199, 0.20) == "+0.199"
    assert format_fraction(0.19999999999999996, 0.20) == "+0.20"  # a tie prints as the threshold
    assert format_fraction(-0.35, 0.10) == "-0.35"
    assert format_fraction(0.4, None, signed=False) == "0.40"
