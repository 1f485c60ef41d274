"""The ladder state machine, driven pass by pass with hand-made observations (no cluster).

Each test plays the reconciler: it feeds what the adapters would observe and checks the
status, the actions and the events the ladder returns.
"""

from dataclasses import replace

import pytest
from ladder_driver import Driver, h200_fleet, make_spec, summary

from kneepoint.core import reasons
from kneepoint.core.actions import DeleteAllChildren, DeleteTier, EnsureEngine, EnsureLoadTest, PublishRecommendation
from kneepoint.core.ladder import measurement_hash
from kneepoint.core.observations import (
    START_CRASH_LOOP,
    START_OUT_OF_MEMORY,
    START_UNSCHEDULABLE,
    DomainCapacity,
    EngineState,
    FleetView,
    LoadTestState,
    MetricWindow,
)
from kneepoint.core.status import get_condition
from kneepoint.core.tiers import Tier


def test_plan_skips_tiers_that_cannot_fit_without_deploying():
    d = Driver(make_spec("llama-3-70b"))
    r = d.step()
    phases = {t.name: t.phase for t in d.status.tiers}
    assert phases == {"tp1-pp1": "Skipped", "tp2-pp1": "Pending", "tp4-pp1": "Pending", "tp8-pp1": "Pending"}
    tp1 = d.tier("tp1-pp1")
    assert tp1.does_not_fit and "does not fit" in tp1.reason and "GiB" in tp1.reason
    assert not any(isinstance(a, EnsureEngine) for a in r.actions)
    assert any(e.reason == reasons.TIER_SKIPPED_EVENT for e in r.events)
    assert get_condition(d.status.conditions, reasons.PLANNED).status == "True"
    assert d.status.phase == "Profiling" and d.status.measured_spec_hash == measurement_hash(d.spec)


def test_a_kept_winner_keeps_its_own_teardown_and_engine_and_the_rest_is_deleted_in_one_round():
    # cleanup.winner Keep: the last tier measured (TP1, the winner) is torn down and its engine ensured again, as
    # before; the cleanup excludes it by name. Only teardowns of other tiers would be covered, and dropped.
    d = Driver(make_spec("llama-3-8b", cleanup={"winner": "Keep"}))
    d.step()  # plan
    r = d.measure("tp1-pp1", tok_s=4500, p99_ms=9000, kv=0.06)
    assert d.status.decided_tier == "TP1"
    deletes = [a for a in r.actions if isinstance(a, (DeleteTier, DeleteAllChildren))]
    assert deletes == [DeleteTier(Tier(1, 1)), DeleteAllChildren(keep_tier=Tier(1, 1))]
    assert EnsureEngine(Tier(1, 1)) in r.actions


def test_small_model_stops_at_tp1_by_memory_headroom_and_cleans_up():
    d = Driver(make_spec("llama-3-8b"))
    d.step()  # plan
    r = d.measure("tp1-pp1", tok_s=4500, p99_ms=9000, kv=0.06)
    assert d.status.phase == "Decided"
    dec = d.status.decision
    assert (dec.tensor_parallel, dec.rule, dec.classification) == (1, "memory-headroom", "single-gpu-enough")
    assert dec.replicas == 13  # ceil(ceil(320/32) x 1.3)
    assert [t.phase for t in d.status.tiers] == ["Measured", "Skipped", "Skipped", "Skipped"]
    tp1 = d.tier("tp1-pp1")
    # needed = weights + 6 % of the KV pool + overhead: far below what DCGM shows allocated
    assert 15 < tp1.peak_memory_gi_b < 30 and tp1.allocated_memory_gi_b == 125.0
    assert tp1.gpu_minutes == pytest.approx((30 + 70 + 20) / 60, rel=0.01)
    # The last tier's teardown is covered by the cleanup of every child: one round of deletes, not two.
    assert DeleteAllChildren() in r.actions and not any(isinstance(a, DeleteTier) for a in r.actions)
    assert any(isinstance(a, PublishRecommendation) for a in r.actions)
    assert any(e.reason == reasons.DECISION_MADE for e in r.events)
    assert d.status.decided_tier == "TP1"
    # Tiers the decision made unnecessary get an event each, like tiers skipped at plan time.
    skipped = [e.message for e in r.events if e.reason == reasons.TIER_SKIPPED_EVENT]
    assert [m.split()[0] for m in skipped] == ["TP2", "TP4", "TP8"] and all("not needed" in m for m in skipped)


def test_large_model_decided_by_throughput_gain():
    d = Driver(make_spec("llama-3-70b"))
    d.step()
    d.measure("tp2-pp1", tok_s=1236, p99_ms=6800, kv=0.2, comm=0.1)
    assert d.status.phase == "Profiling" and d.status.current_tier == "tp4-pp1"
    d.measure("tp4-pp1", tok_s=1897, p99_ms=4400, kv=0.1, comm=0.17)
    d.measure("tp8-pp1", tok_s=2100, p99_ms=4300, kv=0.05, comm=0.3)
    dec = d.status.decision
    assert (dec.tensor_parallel, dec.rule, dec.classification) == (4, "throughput-gain", "does-not-fit")
    assert "TP4 -> TP8" in dec.reason and "stay at TP4" in dec.reason
    assert d.tier("tp8-pp1").throughput_gain == pytest.approx(2100 / 1897 - 1, abs=1e-3)


def test_out_of_memory_at_start_counts_as_does_not_fit_and_the_ladder_goes_on():
    d = Driver(make_spec("llama-3-8b", tiers={"tensorParallel": [1, 2]}))
    d.step()
    d.step()  # deploy tp1
    d.now += 10
    r = d.step(engine=EngineState(exists=True, ready=False, start_failure=START_OUT_OF_MEMORY, failure_message="CUDA out of memory"))
    tp1 = d.tier("tp1-pp1")
    assert tp1.phase == "Failed" and tp1.does_not_fit and "out of memory" in tp1.reason
    assert DeleteTier(Tier(1, 1)) in r.actions
    assert d.status.current_tier == "tp2-pp1"


def test_unschedulable_engine_fails_only_after_the_tier_timeout():
    d = Driver(make_spec("llama-3-8b", budget={"tierTimeoutSeconds": 100}, tiers={"tensorParallel": [1]}))
    d.step()
    d.step()
    pending = EngineState(exists=True, ready=False, start_failure=START_UNSCHEDULABLE, failure_message="0/3 nodes available")
    d.now += 50
    d.step(engine=pending)
    assert d.tier("tp1-pp1").phase == "Deploying"
    d.now += 60
    d.step(engine=pending)
    tp1 = d.tier("tp1-pp1")
    assert tp1.phase == "Failed" and "Unschedulable" in tp1.reason and not tp1.does_not_fit
    assert d.status.phase == "Failed"
    assert get_condition(d.status.conditions, reasons.FAILED).status == "True"


def test_crash_loop_fails_after_restarts():
    d = Driver(make_spec("llama-3-8b", tiers={"tensorParallel": [1]}))
    d.step()
    d.step()
    d.step(engine=EngineState(exists=True, start_failure=START_CRASH_LOOP, failure_message="bad flag", restarts=1))
    assert d.tier("tp1-pp1").phase == "Deploying"
    d.step(engine=EngineState(exists=True, start_failure=START_CRASH_LOOP, failure_message="bad flag", restarts=3))
    assert d.tier("tp1-pp1").phase == "Failed" and "CrashLoopBackOff" in d.tier("tp1-pp1").reason


def test_load_test_errors_are_retried_then_fail_the_tier():
    d = Driver(make_spec("llama-3-8b", tiers={"tensorParallel": [1]}, load={"maxAttempts": 2, "maxErrorFraction": 0.05}))
    d.step()
    d.step()
    ready = EngineState(exists=True, ready=True)
    d.step(engine=ready)
    r = d.step(engine=ready, load_test=LoadTestState(1, True, True, False, summary(100, 100, error_fraction=0.4)))
    assert EnsureLoadTest(Tier(1, 1), 2) in r.actions
    assert d.tier("tp1-pp1").attempts == 2 and any(e.reason == reasons.LOAD_TEST_RETRIED for e in r.events)
    r = d.step(engine=ready, load_test=LoadTestState(2, True, False, True, None, "BackoffLimitExceeded"))
    tp1 = d.tier("tp1-pp1")
    assert tp1.phase == "Failed" and "after 2 attempt(s)" in tp1.reason


def test_prometheus_unreachable_is_retried_then_rules_are_not_evaluated():
    d = Driver(make_spec("llama-3-8b", tiers={"tensorParallel": [1]}))
    d.step()
    d.step()
    d.now += 5
    d.step(engine=EngineState(exists=True, ready=True))
    d.now += 60
    d.step(
        engine=EngineState(exists=True, ready=True),
        load_test=LoadTestState(1, True, True, False, summary(4000, 9000, started=d.now - 50, finished=d.now)),
    )
    d.now += 5
    r = d.step(metrics=None)  # still settling
    assert d.tier("tp1-pp1").phase == "Collecting" and r.requeue_after == pytest.approx(5)
    d.now += 10
    d.step(metrics=MetricWindow(error="ConnectionError: refused"))
    cond = get_condition(d.status.conditions, reasons.METRICS_AVAILABLE)
    assert cond.status == "False" and cond.reason == reasons.PROMETHEUS_UNREACHABLE
    assert d.tier("tp1-pp1").phase == "Collecting"
    d.now += 100
    d.step(metrics=MetricWindow(error="ConnectionError: refused"))
    tp1 = d.tier("tp1-pp1")
    assert tp1.phase == "Measured" and "vllm:kv_cache_usage_perc" in tp1.missing_metrics
    # The final condition says Prometheus was unreachable, not that it had no series.
    cond = get_condition(d.status.conditions, reasons.METRICS_AVAILABLE)
    assert cond.reason == reasons.PROMETHEUS_UNREACHABLE and "ConnectionError: refused" in cond.message
    assert "vllm:kv_cache_usage_perc" in cond.message and "not evaluated" in cond.message
    assert d.status.phase == "Decided"
    # Without measured memory the memory rule could not be evaluated, and the decision says so.
    assert d.status.decision.rule == "only-tier"
    assert "memory-headroom" in (d.status.decision.unevaluated_rules or ())


def test_waits_for_free_gpus_with_a_queue_position():
    d = Driver(make_spec("llama-3-70b"), fleet=h200_fleet(free=(1, 0)))
    d.step()
    r = d.step(queue_position=2)
    assert d.tier("tp2-pp1").phase == "Waiting" and not any(isinstance(a, EnsureEngine) for a in r.actions)
    assert "2 free NVLink-connected GPU(s)" in d.status.waiting_for and d.status.queue_position == 2
    assert d.status.waiting_since is not None
    d.fleet = h200_fleet(free=(2, 0))
    d.step(queue_position=2)  # GPUs free but someone is ahead
    assert d.tier("tp2-pp1").phase == "Waiting" and "position 2" in d.status.waiting_for
    r = d.step(queue_position=1)
    assert d.tier("tp2-pp1").phase == "Deploying" and EnsureEngine(Tier(2, 1), "h200-0", "nvlink") in r.actions
    assert d.status.waiting_for is None and d.status.waiting_since is None


def test_tiers_larger_than_any_node_are_skipped_at_plan_time():
    fleet = FleetView((DomainCapacity("l40s-0", "NVIDIA-L40S", 4, 4, None, 1, "pcie"),))
    d = Driver(make_spec("llama-3-8b"), fleet=fleet)
    d.step()
    tp8 = d.tier("tp8-pp1")
    assert tp8.phase == "Skipped" and "largest matching node has 4" in tp8.reason
    assert tp8.reason.startswith("spec.tiers.tensorParallel 8 needs 8 GPUs")  # names the field to change
    assert d.tier("tp2-pp1").phase == "Pending"  # PCIe fleet: TP stays inside the node


def test_budget_stops_the_ladder_before_a_tier_that_would_exceed_it():
    d = Driver(make_spec("llama-3-70b", budget={"maxGpuHours": 0.1}))  # 6 GPU-minutes
    d.step()
    d.measure("tp2-pp1", tok_s=1236, p99_ms=6800)  # 2 GPUs x 2 min = 4 GPU-min
    assert d.status.phase == "Profiling"
    r = d.step()  # TP4 would take 4 x 2 min more: over the 6 GPU-minute cap
    assert any(e.reason == reasons.BUDGET_EXHAUSTED for e in r.events)
    dec = d.status.decision
    assert d.status.phase == "Decided" and dec.rule == "budget" and dec.tensor_parallel == 2
    assert d.tier("tp4-pp1").phase == "Skipped" and "budget" in d.tier("tp4-pp1").reason


def test_repeating_a_pass_after_a_crash_repeats_only_idempotent_actions():
    d = Driver(make_spec("llama-3-8b"))
    d.step()
    before = d.status
    first = d.step()
    # Crash before the status write: the same input gives the same action (a create of the same name).
    d.status = before
    again = d.step()
    assert first.actions == again.actions
    # Crash after the status write but before the create: the next pass ensures the engine again.
    r = d.step(engine=EngineState(exists=False))
    assert EnsureEngine(Tier(1, 1), "h200-0") in r.actions or any(isinstance(a, EnsureEngine) for a in r.actions)


def test_measured_tiers_are_never_measured_again():
    d = Driver(make_spec("llama-3-70b"))
    d.step()
    d.measure("tp2-pp1", tok_s=1236, p99_ms=6800)
    tp2 = d.tier("tp2-pp1")
    for _ in range(3):
        r = d.step()
        assert not any(isinstance(a, (EnsureEngine, EnsureLoadTest)) and a.tier == Tier(2, 1) for a in r.actions)
    assert d.tier("tp2-pp1") == replace(
        tp2, throughput_gain=d.tier("tp2-pp1").throughput_gain, cost_per_million_tokens=d.tier("tp2-pp1").cost_per_million_tokens
    )


def test_rule_change_after_decision_re_decides_without_measuring():
    d = Driver(make_spec("llama-3-70b"))
    d.step()
    d.measure("tp2-pp1", tok_s=1236, p99_ms=6800)
    d.measure("tp4-pp1", tok_s=1897, p99_ms=4400)
    d.measure("tp8-pp1", tok_s=2100, p99_ms=4300)
    assert d.status.decision.tensor_parallel == 4
    d.spec = replace(d.spec, stop_rules=replace(d.spec.stop_rules, min_throughput_gain=0.6))
    r = d.step(generation=2)
    assert d.status.decision.tensor_parallel == 2 and d.status.decision.rule == "throughput-gain"
    assert not any(isinstance(a, EnsureEngine) for a in r.actions)
    assert any(e.reason == reasons.DECISION_UPDATED for e in r.events)
    # Every condition now speaks for generation 2, not only Decided (which changed).
    assert {c.type: c.observed_generation for c in d.status.conditions} == {c.type: 2 for c in d.status.conditions}


def test_measurement_change_restarts_the_ladder():
    d = Driver(make_spec("llama-3-70b"))
    d.step()
    d.measure("tp2-pp1", tok_s=1236, p99_ms=6800)
    d.spec = replace(d.spec, load=replace(d.spec.load, concurrency=64))
    r = d.step(generation=2)
    assert DeleteAllChildren() in r.actions and any(e.reason == reasons.SPEC_CHANGED for e in r.events)
    assert d.status.tiers == () and d.status.gpu_minutes_total > 0  # spent minutes are kept
    d.step(generation=2)
    assert d.tier("tp2-pp1").phase == "Pending"
    spent = d.status.gpu_minutes_total
    d.measure("tp2-pp1", tok_s=1000, p99_ms=9000)
    # The budget sees both ladders: the discarded tier's minutes are not dropped by the next one.
    assert d.status.gpu_minutes_total == pytest.approx(spent + d.tier("tp2-pp1").gpu_minutes, abs=0.002)


def test_a_tier_cut_short_by_a_spec_change_counts_its_gpu_minutes():
    d = Driver(make_spec("llama-3-70b"))
    d.step()
    d.step()  # TP2 deploying
    assert d.tier("tp2-pp1").phase == "Deploying"
    d.now += 120
    d.spec = replace(d.spec, load=replace(d.spec.load, concurrency=64))
    d.step(generation=2)
    assert d.status.gpu_minutes_total == pytest.approx(2 * 120 / 60, abs=0.02)


def test_plan_error_fails_with_the_reason():
    d = Driver(make_spec("llama-3-8b"))
    d.step(architecture=None, plan_error="spec.model.architecture.configMapRef: ConfigMap ns/cfg not found")
    assert d.status.phase == "Failed"
    assert "ConfigMap ns/cfg not found" in get_condition(d.status.conditions, reasons.FAILED).message


def test_simulate_mode_needs_no_fleet_and_marks_results_simulated():
    d = Driver(make_spec("llama-3-8b", mode="Simulate", tiers={"tensorParallel": [1]}), fleet=None)
    d.fleet = None
    d.step(fleet=None)
    r = d.step(fleet=None)
    assert any(isinstance(a, EnsureEngine) for a in r.actions)
    assert d.status.simulated and d.tier("tp1-pp1").simulated


def test_a_failed_experiment_starts_again_when_its_spec_is_edited():
    d = Driver(make_spec("llama-3-8b"))
    d.step(architecture=None, plan_error="spec.model.architecture.configMapRef: ConfigMap ns/cfg not found")
    assert d.status.phase == "Failed"
    d.step()  # same generation: stays Failed, nothing happens
    assert d.status.phase == "Failed"
    r = d.step(generation=2)  # the user fixed the spec
    assert any(e.reason == reasons.SPEC_CHANGED for e in r.events)
    assert get_condition(d.status.conditions, reasons.FAILED) is None
    d.step(generation=2)
    assert d.status.phase == "Profiling" and d.tier("tp1-pp1").phase == "Pending"


def test_a_tp_group_whose_gpus_differ_in_utilisation_gets_the_split_not_effective_finding():
    d = Driver(make_spec("llama-3-70b"))
    d.step()  # plan: TP1 skipped
    r = d.measure(
        "tp2-pp1",
        tok_s=1200,
        p99_ms=9000,
        fb=120.0,
        comm=0.18,
        rank_skew_fraction=0.12,
        gpu_utilization_by_gpu=(0.92, 0.61),
        fb_used_gib_by_gpu=(120.0, 119.0),
        pcie_bytes_per_second=2.5e9,
    )
    tp2 = d.tier("tp2-pp1")
    assert (tp2.rank_skew_fraction, tp2.gpu_utilization_spread, tp2.memory_spread_gi_b, tp2.pcie_bytes_per_second) == (
        0.12,
        0.31,
        1.0,
        2.5e9,
    )
    (finding,) = tp2.findings
    assert finding == (
        "the parallel split is not effective: GPU utilisation 0.61-0.92 across 2 GPUs (spread 0.31 > 0.15); rankSkewFraction 0.12"
    )
    assert any(e.reason == reasons.SPLIT_NOT_EFFECTIVE and e.type == "Warning" for e in r.events)


def test_a_balanced_group_has_no_finding_and_one_gpu_has_no_spread():
    d = Driver(make_spec("llama-3-70b"))
    d.step()
    d.measure("tp2-pp1", tok_s=1200, p99_ms=9000, fb=120.0, gpu_utilization_by_gpu=(0.90, 0.88), fb_used_gib_by_gpu=(120.0, 119.5))
    tp2 = d.tier("tp2-pp1")
    assert tp2.findings is None and tp2.gpu_utilization_spread == 0.02
    from kneepoint.core.rank_balance import rank_balance

    assert rank_balance((0.9,), (120.0,), None).finding is None
    assert "memory 100.0-120.0 GiB" in rank_balance((0.9, 0.9), (120.0, 100.0), None).finding
