"""decide(): the ladder walk, ties, failed tiers, one-tier ladders, partial ladders, classification."""

from __future__ import annotations

from typing import Any

import pytest

from kneepoint.core.decision import STATE_CONTINUE, STATE_DECIDED, STATE_UNDECIDABLE, decide
from kneepoint.core.spec import ExperimentSpec, parse_spec
from kneepoint.core.status import TierResult


def make_spec(tp=(1, 2, 4, 8), pp=(1,), stop: dict | None = None, capacity: dict | None = None, concurrency: int = 32) -> ExperimentSpec:
    data: dict[str, Any] = {
        "model": {"uri": "hf://org/model"},
        "tiers": {"tensorParallel": list(tp), "pipelineParallel": list(pp)},
        "load": {"concurrency": concurrency},
    }
    if stop:
        data["stopRules"] = stop
    if capacity:
        data["capacity"] = capacity
    return parse_spec(data)


def measured(
    tp: int, tps: float, p99: float = 1000.0, mem: float | None = None, comm: float | None = None, pp: int = 1, **kw
) -> TierResult:
    return TierResult(
        tensor_parallel=tp,
        pipeline_parallel=pp,
        gpus=tp * pp,
        name=f"tp{tp}-pp{pp}",
        phase="Measured",
        output_tokens_per_second=tps,
        latency_p99_ms=p99,
        peak_memory_gi_b=mem,
        gpu_memory_gi_b=140.0,
        comm_fraction=comm,
        **kw,
    )


def other(tp: int, phase: str, does_not_fit: bool | None = None, reason: str | None = None, pp: int = 1) -> TierResult:
    return TierResult(
        tensor_parallel=tp, pipeline_parallel=pp, gpus=tp * pp, name=f"tp{tp}-pp{pp}", phase=phase, does_not_fit=does_not_fit, reason=reason
    )


def recorded_h200() -> tuple[ExperimentSpec, list[TierResult]]:
    spec = make_spec(
        tp=(1, 2, 4),
        capacity={"peakConcurrency": 256, "redundancyFactor": 1.3, "slo": {"latencyP99Ms": 5000}, "gpuHourlyCost": 3.5},
    )
    tiers = [
        other(1, "Skipped", True, "does not fit: weights 131.4 GiB"),
        measured(2, 1235.68, 6764.3, 70.915, 0.0767),
        measured(4, 1897.09, 4394.8, 35.555, 0.1728),
    ]
    return spec, tiers


def test_recorded_h200_ladder_decides_tp4_as_the_last_tier():
    spec, tiers = recorded_h200()
    out = decide(spec, tiers)
    d = out.decision
    assert out.state == STATE_DECIDED
    assert (d.tensor_parallel, d.gpus_per_replica, d.rule) == (4, 4, "last-tier")
    assert d.classification == "does-not-fit"
    assert (d.replicas, d.total_gpus, d.per_replica_concurrency, d.per_replica_concurrency_source) == (11, 44, 32, "measured")
    assert d.slo_met is True
    assert d.cost_per_million_tokens == pytest.approx(2.0499, abs=1e-4)
    assert d.reason.splitlines() == [
        "TP2 -> TP4: T2=1236 tok/s T4=1897 tok/s ΔT=+0.54; P2=6764 ms P4=4395 ms ΔP=-0.35; M2=70.9 GiB M4=35.6 GiB; C2=0.08 C4=0.17",
        "conclusion: stay at TP4 (rule: last-tier)",
    ]
    assert out.comparisons == [
        "TP2 -> TP4: T2=1236 tok/s T4=1897 tok/s ΔT=+0.54; P2=6764 ms P4=4395 ms ΔP=-0.35; M2=70.9 GiB M4=35.6 GiB; C2=0.08 C4=0.17\n"
        "conclusion: go on to TP4"
    ]


def test_gains_and_cost_are_filled_on_measured_tiers_only():
    spec, tiers = recorded_h200()
    out = decide(spec, tiers)
    tp1, tp2, tp4 = out.tiers
    assert tp1.throughput_gain is None and tp1.cost_per_million_tokens is None
    assert tp2.throughput_gain is None and tp2.p99_change is None  # nothing measured before it
    assert tp2.cost_per_million_tokens == pytest.approx(1.5736, abs=1e-4)
    assert tp4.throughput_gain == pytest.approx(0.5353, abs=1e-4)
    assert tp4.p99_change == pytest.approx(-0.3503, abs=1e-4)


def test_throughput_gain_stops_at_the_smaller_tier_with_the_design_form():
    spec = make_spec(tp=(1, 2, 4, 8))
    tiers = [measured(1, 1000, 1000, mem=130), measured(2, 1600, 900), measured(4, 1800, 850), other(8, "Pending")]
    out = decide(spec, tiers)
    d = out.decision
    assert (d.tensor_parallel, d.rule, d.rules_fired) == (2, "throughput-gain", ("throughput-gain",))
    assert d.reason.splitlines()[1] == "conclusion: stay at TP2 (rule: throughput-gain, column ΔT)"
    assert d.reason.startswith("TP2 -> TP4: T2=1600 tok/s T4=1800 tok/s ΔT=+0.12; P2=900 ms P4=850 ms ΔP=-0.06; M2=n/a GiB M4=n/a GiB")
    assert d.classification == "cannot-keep-up"  # fits on one GPU, the ladder went past it because TP2 paid
    assert out.comparisons[1].splitlines()[1] == "conclusion: go on to TP2"


def test_every_fired_rule_is_recorded_and_the_first_names_the_decision():
    spec = make_spec(tp=(1, 2))
    out = decide(spec, [measured(1, 1000, 1000, mem=130, comm=0.0), measured(2, 1050, 1500, comm=0.6)])
    d = out.decision
    assert d.rule == "throughput-gain"
    assert d.rules_fired == ("throughput-gain", "p99-degradation", "comm-fraction")
    assert "also fired: p99-degradation (column ΔP), comm-fraction (column C)" in d.reason


def test_p99_and_comm_rules_decide_when_throughput_pays():
    spec = make_spec(tp=(1, 2))
    d = decide(spec, [measured(1, 1000, 1000, mem=130), measured(2, 1300, 1500)]).decision
    assert (d.tensor_parallel, d.rule) == (1, "p99-degradation")
    assert "column ΔP" in d.reason
    d = decide(spec, [measured(1, 1000, 1000, mem=130), measured(2, 1900, 900, comm=0.45)]).decision
    assert (d.tensor_parallel, d.rule) == (1, "comm-fraction")


def test_memory_headroom_decides_tp1_and_later_tiers_need_not_run():
    spec = make_spec()
    tiers = [measured(1, 1000, 1000, mem=60.0), other(2, "Pending"), other(4, "Pending"), other(8, "Pending")]
    out = decide(spec, tiers)
    d = out.decision
    assert (d.tensor_parallel, d.rule, d.classification) == (1, "memory-headroom", "single-gpu-enough")
    assert d.reason.splitlines() == [
        "TP1: T1=1000 tok/s; P1=1000 ms; M1=60.0 GiB of 140.0 GiB = 0.43 (memoryHeadroom 0.85)",
        "conclusion: stay at TP1 (rule: memory-headroom, column M)",
    ]


def test_full_tp1_continues_while_tiers_remain():
    spec = make_spec()
    out = decide(spec, [measured(1, 1000, 1000, mem=130.0), other(2, "Deploying"), other(4, "Pending"), other(8, "Pending")])
    assert out.decision is None
    assert out.state == STATE_CONTINUE
    assert "TP2 is Deploying" in out.message
    assert out.comparisons == [
        "TP1: T1=1000 tok/s; P1=1000 ms; M1=130.0 GiB of 140.0 GiB = 0.93 (memoryHeadroom 0.85)\nconclusion: go on to TP2"
    ]


def test_no_rule_fired_and_tiers_remain_continues():
    spec = make_spec()
    out = decide(spec, [measured(1, 1000, 1000, mem=130.0), measured(2, 1800, 900), other(4, "Pending"), other(8, "Pending")])
    assert (out.decision, out.state) == (None, STATE_CONTINUE)


def test_failed_tier_is_passed_over_and_the_next_compares_with_the_last_measured():
    spec = make_spec(tp=(1, 2, 4))
    tiers = [measured(1, 1000, 1000, mem=130.0), other(2, "Failed", reason="image pull"), measured(4, 1100, 900)]
    out = decide(spec, tiers)
    assert out.decision.rule == "throughput-gain"
    assert out.decision.tensor_parallel == 1
    assert out.decision.reason.startswith("TP1 -> TP4: T1=1000 tok/s T4=1100 tok/s ΔT=+0.10")
    assert out.tiers[2].throughput_gain == pytest.approx(0.1)


def test_one_tier_ladder_is_only_tier():
    spec = make_spec(tp=(1,))
    d = decide(spec, [measured(1, 1000, 1000, mem=130.0)]).decision
    assert (d.tensor_parallel, d.rule, d.classification) == (1, "only-tier", "single-gpu-enough")
    assert d.reason.splitlines()[1] == "conclusion: stay at TP1 (rule: only-tier)"


def test_only_tier_when_its_neighbours_do_not_fit_or_fail():
    spec = make_spec(tp=(1, 2, 4))
    d = decide(spec, [other(1, "Skipped", True), measured(2, 1000, 1000), other(4, "Failed", reason="crash")]).decision
    assert (d.tensor_parallel, d.rule, d.classification) == (2, "only-tier", "does-not-fit")


def test_nothing_measured_is_undecidable():
    spec = make_spec(tp=(1, 2))
    out = decide(spec, [other(1, "Skipped", True, "too big"), other(2, "Failed", True, "CUDA out of memory")])
    assert out.decision is None
    assert out.state == STATE_UNDECIDABLE
    assert "TP1 does not fit (too big)" in out.message


def test_budget_stop_decides_the_last_measured_tier():
    spec = make_spec()
    tiers = [measured(1, 1000, 1000, mem=130.0), measured(2, 1800, 900), other(4, "Pending"), other(8, "Pending")]
    d = decide(spec, tiers, budget_stopped=True).decision
    assert (d.tensor_parallel, d.rule) == (2, "budget")
    assert d.reason.splitlines()[1] == "conclusion: stay at TP2 (rule: budget)"
    # The operator marks the rest Skipped before deciding: same answer.
    tiers[2:] = [other(4, "Skipped", reason="budget"), other(8, "Skipped", reason="budget")]
    assert decide(spec, tiers, budget_stopped=True).decision.rule == "budget"


def test_a_fired_rule_wins_over_the_budget():
    spec = make_spec()
    tiers = [measured(1, 1000, 1000, mem=130.0), measured(2, 1100, 900), other(4, "Pending"), other(8, "Pending")]
    assert decide(spec, tiers, budget_stopped=True).decision.rule == "throughput-gain"


def test_budget_with_nothing_measured_is_undecidable():
    out = decide(make_spec(), [other(1, "Pending"), other(2, "Pending")], budget_stopped=True)
    assert out.state == STATE_UNDECIDABLE


def test_missing_comm_fraction_is_listed_not_guessed():
    spec = make_spec(tp=(1, 2))
    d = decide(spec, [measured(1, 1000, 1000, mem=130.0), measured(2, 1800, 900)]).decision
    assert d.rule == "last-tier"
    assert d.unevaluated_rules == ("comm-fraction",)


def test_unevaluated_rules_after_the_deciding_step_are_not_listed():
    spec = make_spec(tp=(1, 2, 4))
    tiers = [measured(1, 1000, 1000, mem=130.0, comm=0.0), measured(2, 1100, 900, comm=0.1), measured(4, 2000, 900)]
    out = decide(spec, tiers)
    assert out.decision.rule == "throughput-gain"
    assert out.decision.unevaluated_rules is None
    assert "note: after the decision at TP1; recorded, not used" in out.comparisons[2]


def test_tie_at_the_throughput_threshold_continues():
    spec = make_spec(tp=(1, 2), stop={"minThroughputGain": 0.2})
    d = decide(spec, [measured(1, 100, 1000, mem=130.0), measured(2, 120, 1000)]).decision
    assert (d.tensor_parallel, d.rule) == (2, "last-tier")


def test_thresholds_at_their_upper_bounds():
    tiers = [measured(1, 1000, 1000, mem=139.0, comm=0.0), measured(2, 2000, 1000, comm=0.99)]
    # minThroughputGain 1.0: a doubling exactly continues; maxCommFraction 1.0 never fires.
    spec = make_spec(tp=(1, 2), stop={"minThroughputGain": 1.0, "maxCommFraction": 1.0, "memoryHeadroom": 0.99})
    d = decide(spec, tiers).decision
    assert (d.tensor_parallel, d.rule) == (2, "last-tier")
    # memoryHeadroom 1.0: TP1 fits, so one GPU is enough.
    spec = make_spec(tp=(1, 2), stop={"memoryHeadroom": 1.0})
    assert decide(spec, tiers).decision.rule == "memory-headroom"


def test_single_gpu_missing_the_slo_cannot_keep_up_and_estimates_concurrency():
    spec = make_spec(tp=(1,), capacity={"slo": {"latencyP99Ms": 500}, "peakConcurrency": 64, "redundancyFactor": 1.0})
    d = decide(spec, [measured(1, 1000, 2000, mem=60.0)]).decision
    assert (d.rule, d.classification, d.slo_met) == ("memory-headroom", "cannot-keep-up", False)
    assert (d.per_replica_concurrency, d.per_replica_concurrency_source) == (8, "estimated")  # floor(32 x 500/2000)
    assert d.replicas == 8
    assert "per-replica concurrency 8 estimated" in d.reason


def test_pipeline_tiers_use_labels_and_gpu_subscripts():
    spec = make_spec(tp=(1, 8), pp=(1, 2))
    tiers = [other(1, "Skipped", True), measured(8, 1000, 1000), measured(8, 1100, 1000, pp=2)]
    out = decide(spec, tiers)
    assert out.decision.reason.startswith("TP8 -> TP8xPP2: T8=1000 tok/s T16=1100 tok/s ΔT=+0.10")
    assert (out.decision.tensor_parallel, out.decision.pipeline_parallel) == (8, 1)


def test_simulated_measurements_mark_the_decision():
    spec = make_spec(tp=(1,))
    assert decide(spec, [measured(1, 1000, 1000, mem=60.0, simulated=True)]).decision.simulated is True


def test_tiers_out_of_ladder_order_are_rejected():
    with pytest.raises(ValueError, match="ladder order"):
        decide(make_spec(tp=(1, 2)), [measured(2, 1000), measured(1, 1000)])


def test_deciding_again_from_the_filled_tiers_gives_the_same_answer():
    spec, tiers = recorded_h200()
    first = decide(spec, tiers)
    again = decide(spec, first.tiers)
    assert again.decision == first.decision
    assert again.tiers == first.tiers


def test_the_comparison_block_prints_rank_skew_next_to_the_comm_share():
    from kneepoint.core.record_table import format_comparison_line

    a, b = measured(1, 1000, mem=20.0, comm=0.0), measured(2, 1500, mem=12.0, comm=0.31, rank_skew_fraction=0.02)
    assert format_comparison_line(a, b, 0.5, -0.1).endswith("; C1=0.00 C2=0.31 skew2=0.02")
