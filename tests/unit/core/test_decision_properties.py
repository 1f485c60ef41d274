"""Invariants of decide() over random ladders and thresholds (hypothesis)."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from kneepoint.core.decision import REMAINING_PHASES, STATE_CONTINUE, STATE_DECIDED, decide, tier_does_not_fit
from kneepoint.core.replicas_cost import replicas_needed
from kneepoint.core.spec import CapacitySpec, ExperimentSpec, LoadSpec, ModelSpec, SloSpec, StopRulesSpec, TiersSpec
from kneepoint.core.status import TIER_MEASURED, TierResult
from kneepoint.core.tiers import build_ladder

SETTINGS = settings(max_examples=100, deadline=None)

fractions = st.floats(min_value=0.01, max_value=1.0, allow_nan=False)
# Phases with weights: mostly measured, so that steps and rules get exercised.
phases = st.sampled_from(["Measured"] * 6 + ["Skipped-dnf", "Failed-dnf", "Failed", "Skipped", "Pending", "Waiting", "LoadTesting"])


@st.composite
def tier_results(draw, tp: int, pp: int) -> TierResult:
    phase = draw(phases)
    base = TierResult(tensor_parallel=tp, pipeline_parallel=pp, gpus=tp * pp, name=f"tp{tp}-pp{pp}")
    if phase.endswith("-dnf"):
        return replace(base, phase=phase.split("-")[0], does_not_fit=True, reason="does not fit")
    if phase != "Measured":
        return replace(base, phase=phase)
    optional = lambda s: st.one_of(st.none(), s)  # noqa: E731 - a missing metric must be tolerated
    return replace(
        base,
        phase=TIER_MEASURED,
        output_tokens_per_second=draw(st.floats(min_value=1.0, max_value=1e5)),
        latency_p99_ms=draw(optional(st.floats(min_value=1.0, max_value=1e5))),
        ttft_p95_ms=draw(optional(st.floats(min_value=1.0, max_value=1e4))),
        peak_memory_gi_b=draw(optional(st.floats(min_value=1.0, max_value=140.0))),
        gpu_memory_gi_b=140.0,
        comm_fraction=draw(optional(st.floats(min_value=0.0, max_value=1.0))),
    )


@st.composite
def ladders(draw) -> tuple[TiersSpec, list[TierResult]]:
    tps = sorted(draw(st.sets(st.sampled_from((1, 2, 4, 8)), min_size=1)))
    pps = sorted(draw(st.sets(st.sampled_from((1, 2, 4)), min_size=1, max_size=2)))
    ladder = build_ladder(tps, pps)
    return TiersSpec(tensor_parallel=tuple(tps), pipeline_parallel=tuple(pps)), [
        draw(tier_results(t.tensor_parallel, t.pipeline_parallel)) for t in ladder
    ]


@st.composite
def stop_rules(draw) -> StopRulesSpec:
    return StopRulesSpec(
        memory_headroom=draw(fractions),
        min_throughput_gain=draw(fractions),
        max_p99_degradation=draw(fractions),
        max_comm_fraction=draw(fractions),
    )


@st.composite
def capacities(draw) -> CapacitySpec:
    slo = SloSpec(
        ttft_p95_ms=draw(st.one_of(st.none(), st.integers(1, 5000))),
        latency_p99_ms=draw(st.one_of(st.none(), st.integers(1, 50000))),
    )
    return CapacitySpec(
        peak_concurrency=draw(st.integers(1, 5000)),
        redundancy_factor=draw(st.floats(min_value=1.0, max_value=10.0)),
        slo=slo,
        gpu_hourly_cost=draw(st.sampled_from([0.0, 1.0, 3.5])),
    )


def make_spec(tiers: TiersSpec, rules: StopRulesSpec, capacity: CapacitySpec | None = None, concurrency: int = 32) -> ExperimentSpec:
    return ExperimentSpec(
        model=ModelSpec(uri="hf://org/model"),
        tiers=tiers,
        stop_rules=rules,
        capacity=capacity or CapacitySpec(),
        load=LoadSpec(concurrency=concurrency),
    )


def decided_gpus(spec: ExperimentSpec, tiers: list[TierResult], budget: bool = False) -> int | None:
    d = decide(spec, tiers, budget_stopped=budget).decision
    return None if d is None else d.gpus_per_replica


@SETTINGS
@given(ladders(), stop_rules(), fractions, st.booleans())
def test_raising_min_throughput_gain_never_selects_a_larger_tier(ladder, rules, other_gain, budget):
    tiers_spec, tiers = ladder
    low, high = sorted((rules.min_throughput_gain, other_gain))
    at_low = decided_gpus(make_spec(tiers_spec, replace(rules, min_throughput_gain=low)), tiers, budget)
    at_high = decided_gpus(make_spec(tiers_spec, replace(rules, min_throughput_gain=high)), tiers, budget)
    if at_low is not None:
        assert at_high is not None and at_high <= at_low


@SETTINGS
@given(ladders(), stop_rules(), fractions, fractions)
def test_tighter_p99_and_comm_limits_never_select_a_larger_tier(ladder, rules, p99_limit, comm_limit):
    tiers_spec, tiers = ladder
    loose = replace(
        rules, max_p99_degradation=max(p99_limit, rules.max_p99_degradation), max_comm_fraction=max(comm_limit, rules.max_comm_fraction)
    )
    tight = replace(
        rules, max_p99_degradation=min(p99_limit, rules.max_p99_degradation), max_comm_fraction=min(comm_limit, rules.max_comm_fraction)
    )
    at_loose = decided_gpus(make_spec(tiers_spec, loose), tiers)
    at_tight = decided_gpus(make_spec(tiers_spec, tight), tiers)
    if at_loose is not None:
        assert at_tight is not None and at_tight <= at_loose


@SETTINGS
@given(ladders(), stop_rules(), capacities(), st.booleans())
def test_the_decided_tier_was_measured_and_fits(ladder, rules, capacity, budget):
    tiers_spec, tiers = ladder
    out = decide(make_spec(tiers_spec, rules, capacity), tiers, budget_stopped=budget)
    if out.decision is None:
        return
    d = out.decision
    chosen = [t for t in out.tiers if (t.tensor_parallel, t.pipeline_parallel) == (d.tensor_parallel, d.pipeline_parallel)]
    assert len(chosen) == 1
    assert chosen[0].phase == TIER_MEASURED
    assert not tier_does_not_fit(chosen[0])
    assert d.rule == (d.rules_fired[0] if d.rules_fired else d.rule)


@SETTINGS
@given(ladders(), stop_rules(), capacities(), st.integers(1, 512))
def test_replicas_never_fall_below_peak_over_per_replica(ladder, rules, capacity, concurrency):
    tiers_spec, tiers = ladder
    spec = make_spec(tiers_spec, rules, capacity, concurrency)
    d = decide(spec, tiers).decision
    if d is None:
        return
    assert 1 <= d.per_replica_concurrency <= concurrency
    assert d.replicas >= spec.peak_concurrency / d.per_replica_concurrency
    assert d.replicas >= math.ceil(spec.peak_concurrency / d.per_replica_concurrency)
    assert d.total_gpus == d.replicas * d.gpus_per_replica
    if d.per_replica_concurrency_source == "estimated":
        assert d.slo_met is False and d.classification != "single-gpu-enough"


@SETTINGS
@given(st.integers(1, 10_000), st.integers(1, 1000), st.floats(min_value=1.0, max_value=10.0))
def test_replicas_grow_with_peak_and_cover_it(peak, per_replica, redundancy):
    replicas = replicas_needed(peak, per_replica, redundancy)
    assert replicas * per_replica >= peak
    assert replicas >= math.ceil(peak / per_replica) * redundancy - 1e-6
    assert replicas_needed(peak + 1, per_replica, redundancy) >= replicas


@SETTINGS
@given(ladders(), stop_rules(), st.booleans())
def test_continue_only_while_a_tier_remains_and_decide_is_idempotent(ladder, rules, budget):
    tiers_spec, tiers = ladder
    spec = make_spec(tiers_spec, rules)
    out = decide(spec, tiers, budget_stopped=budget)
    if out.state == STATE_CONTINUE:
        assert not budget
        assert any(t.phase in REMAINING_PHASES for t in tiers)
    if not any(t.phase in REMAINING_PHASES for t in tiers) and any(t.phase == TIER_MEASURED for t in tiers):
        assert out.state == STATE_DECIDED
    again = decide(spec, out.tiers, budget_stopped=budget)
    assert again.decision == out.decision
    assert again.tiers == out.tiers


@SETTINGS
@given(ladders(), stop_rules())
def test_measuring_a_remaining_tier_never_changes_a_decision_already_made(ladder, rules):
    tiers_spec, tiers = ladder
    spec = make_spec(tiers_spec, rules)
    first = decide(spec, tiers).decision
    if first is None:
        return
    # Finish every remaining tier with some measurement: the earlier decision stands.
    finished = [replace(t, phase=TIER_MEASURED, output_tokens_per_second=1e6) if t.phase in REMAINING_PHASES else t for t in tiers]
    later = decide(spec, finished).decision
    # The ranked alternatives list every measured tier, so they grow; the decision itself stands.
    assert later is not None and replace(later, alternatives=None) == replace(first, alternatives=None)
