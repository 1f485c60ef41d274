"""Per-replica concurrency, replica count and cost per million tokens."""

from __future__ import annotations

import pytest

from kneepoint.core.replicas_cost import (
    SOURCE_ESTIMATED,
    SOURCE_MEASURED,
    SOURCE_UNCHECKED,
    check_slo,
    cost_per_million_tokens,
    per_replica_concurrency,
    plan_capacity,
    replicas_needed,
)
from kneepoint.core.spec import CapacitySpec, SloSpec
from kneepoint.core.status import TierResult


def tier(gpus: int = 4, tps: float = 1897.09, ttft_p95: float | None = None, p99: float | None = None) -> TierResult:
    return TierResult(
        tensor_parallel=gpus, gpus=gpus, phase="Measured", output_tokens_per_second=tps, ttft_p95_ms=ttft_p95, latency_p99_ms=p99
    )


@pytest.mark.parametrize(
    "peak, per, redundancy, expected",
    [
        (256, 32, 1.3, 11),  # ceil(8 x 1.3) = ceil(10.4)
        (10, 1, 1.3, 13),  # 10 x 1.3 = 13.000000000000002 in floating point: still 13
        (100, 10, 1.5, 15),
        (1, 1, 1.0, 1),
        (1, 32, 1.3, 2),  # one replica, redundancy rounds up to two
        (33, 32, 1.0, 2),
        (64, 32, 1.0, 2),
    ],
)
def test_replicas_round_up_twice(peak, per, redundancy, expected):
    assert replicas_needed(peak, per, redundancy) == expected


def test_replicas_reject_zero_concurrency():
    with pytest.raises(ValueError):
        replicas_needed(10, 0, 1.3)


def test_cost_per_million_output_tokens():
    # 3.50 per GPU-hour x 4 GPUs / (1897.09 tok/s x 3600 s) x 1e6
    assert cost_per_million_tokens(3.5, 4, 1897.09) == pytest.approx(3.5 * 4 / (1897.09 * 3600) * 1e6)
    assert cost_per_million_tokens(3.5, 4, 1897.09) == pytest.approx(2.0499, abs=1e-4)
    assert cost_per_million_tokens(0.0, 4, 1897.09) is None
    assert cost_per_million_tokens(3.5, 4, None) is None
    assert cost_per_million_tokens(3.5, 4, 0.0) is None


def test_met_slo_keeps_the_load_test_concurrency():
    check = check_slo(tier(p99=4395), SloSpec(latency_p99_ms=5000))
    assert check.met is True
    value, source, text = per_replica_concurrency(32, check)
    assert (value, source) == (32, SOURCE_MEASURED)
    assert "met the SLO" in text


def test_no_slo_counts_as_measured():
    value, source, text = per_replica_concurrency(32, check_slo(tier(p99=9999), SloSpec()))
    assert (value, source) == (32, SOURCE_MEASURED)
    assert "no SLO" in text


def test_missed_slo_scales_concurrency_down_by_the_worst_ratio():
    # latency 2x over, TTFT 4x over: the TTFT ratio (1/4) wins: floor(32 / 4) = 8.
    check = check_slo(tier(ttft_p95=400, p99=10000), SloSpec(ttft_p95_ms=100, latency_p99_ms=5000))
    assert check.met is False
    value, source, text = per_replica_concurrency(32, check)
    assert (value, source) == (8, SOURCE_ESTIMATED)
    assert "estimated" in text and "ttftP95Ms 400 > 100 ms" in text


def test_the_explanation_never_shows_the_product_rounded_above_its_floor():
    # 64 x 2000/8024 = 15.95: printed as 15.95 -> 15, not 16.0 -> 15 (a sandbox run of large-model.yaml).
    check = check_slo(tier(ttft_p95=8024), SloSpec(ttft_p95_ms=2000))
    value, _, text = per_replica_concurrency(64, check)
    assert value == 15 and "64 x 2000/8024 = 15.95 -> 15" in text


def test_estimated_concurrency_never_below_one():
    check = check_slo(tier(p99=1_000_000), SloSpec(latency_p99_ms=10))
    assert per_replica_concurrency(32, check)[:2] == (1, SOURCE_ESTIMATED)


def test_objective_without_its_figure_is_unchecked_not_guessed():
    check = check_slo(tier(p99=None), SloSpec(latency_p99_ms=5000))
    assert check.met is None
    value, source, _ = per_replica_concurrency(32, check)
    assert (value, source) == (32, SOURCE_UNCHECKED)


def test_plan_capacity_for_the_recorded_h200_decision():
    spec = CapacitySpec(peak_concurrency=256, redundancy_factor=1.3, slo=SloSpec(latency_p99_ms=5000), gpu_hourly_cost=3.5)
    plan = plan_capacity(tier(p99=4394.8), spec, load_concurrency=32, peak_concurrency=256)
    assert plan.per_replica_concurrency == 32
    assert plan.replicas == 11
    assert plan.total_gpus == 44
    assert plan.slo_met is True and plan.slo_missed is False
    assert plan.cost_per_million_tokens == pytest.approx(2.0499, abs=1e-4)
    assert "ceil(ceil(256 / 32) x 1.3) = ceil(8 x 1.3) = 11" in plan.explanation


def test_plan_capacity_without_slo_reports_slo_met_as_unknown():
    plan = plan_capacity(tier(p99=4394.8), CapacitySpec(), load_concurrency=32, peak_concurrency=32)
    assert plan.slo_met is None
    assert plan.replicas == 2  # ceil(1 x 1.3)
    assert plan.cost_per_million_tokens is None
