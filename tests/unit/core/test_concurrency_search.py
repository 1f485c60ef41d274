"""The concurrency search on the decided tier: the pure search, the phase driven pass by pass, restart, budget."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from ladder_driver import Driver, make_spec, summary

from kneepoint.core import reasons
from kneepoint.core.actions import EnsureEngine, EnsureLoadTest, SearchLoad
from kneepoint.core.concurrency_search import (
    MAX_POINTS,
    OBJECTIVE_KNEE,
    OBJECTIVE_SLO,
    SEARCH_ATTEMPT_BASE,
    bracket_width,
    next_concurrency,
    search_result,
)
from kneepoint.core.needs import needs
from kneepoint.core.observations import EngineState, LoadTestState
from kneepoint.core.replicas_cost import replicas_needed
from kneepoint.core.status import ConcurrencyPoint, ExperimentStatus
from kneepoint.core.tiers import Tier

TP1 = Tier(1, 1)


def run_pure(met_up_to: int, start: int, upper: int, tolerance: float) -> list[ConcurrencyPoint]:
    """The search against a tier that meets the SLO exactly up to ``met_up_to`` requests in flight."""
    points: list[ConcurrencyPoint] = []
    while True:
        c = next_concurrency(points, start, upper, tolerance, OBJECTIVE_SLO, 0.1)
        if c is None:
            return points
        assert c not in {p.concurrency for p in points}, "a point is never measured twice"
        points.append(ConcurrencyPoint(c, 100.0 * c, 100.0, 1000.0, slo_met=c <= met_up_to))


@settings(max_examples=300, deadline=None)
@given(
    met_up_to=st.integers(0, 1200),
    start=st.integers(1, 512),
    upper=st.integers(1, 1024),
    tolerance=st.sampled_from([0.05, 0.1, 0.25, 0.5]),
    peak=st.integers(1, 5000),
    redundancy=st.sampled_from([1.0, 1.3, 1.5]),
)
def test_the_search_brackets_the_largest_met_concurrency_and_replicas_never_fall_below_peak_over_it(
    met_up_to, start, upper, tolerance, peak, redundancy
):
    points = run_pure(met_up_to, start, upper, tolerance)
    assert 1 <= len(points) <= MAX_POINTS
    found, _ = search_result(points, upper, tolerance, OBJECTIVE_SLO, 0.1)
    largest_met = max((p.concurrency for p in points if p.slo_met), default=None)
    assert found == largest_met
    if found is None:
        assert met_up_to < 1 or (min(start, upper) > met_up_to and 1 in {p.concurrency for p in points})
        return
    truth = min(met_up_to, upper)
    assert found <= truth  # never claims more than the tier serves
    if found < upper:
        missed = min(p.concurrency for p in points if not p.slo_met)
        assert missed - found <= bracket_width(found, tolerance)
    replicas = replicas_needed(peak, found, redundancy)
    assert replicas >= peak / found
    assert replicas == math.ceil(math.ceil(peak / found) * redundancy - 1e-9) or replicas == math.ceil(peak / found)


def test_the_knee_is_where_doubling_stops_paying():
    tokens = {32: 3000, 64: 5600, 128: 7000, 256: 7300}
    points: list[ConcurrencyPoint] = []
    while (c := next_concurrency(points, 32, 700, 0.1, OBJECTIVE_KNEE, 0.3)) is not None:
        points.append(ConcurrencyPoint(c, float(tokens[c])))
    assert [p.concurrency for p in points] == [32, 64, 128]
    assert search_result(points, 700, 0.1, OBJECTIVE_KNEE, 0.3)[0] == 64


def search_spec(**capacity):
    return make_spec(capacity={"peakConcurrency": 500, "slo": {"latencyP99Ms": 5000}, "concurrencySearch": {"enabled": True}, **capacity})


def latency(c: int) -> float:
    return 2600.0 * (c / 32) ** 0.8  # meets 5000 ms up to concurrency 72


def drive_search(d: Driver, lat=latency, until_points: int | None = None):
    """Answer the search's passes: the ladder's engine gone, the new one Ready, every point's Job succeeded."""
    for _ in range(60):
        s = d.status.concurrency_search
        if d.status.phase == "Decided" or s is None:
            return
        if until_points is not None and len(s.points) >= until_points and s.phase == "LoadTesting":
            return
        if s.phase == "Pending":
            d.step(engine=EngineState(exists=False))
        elif s.phase == "Deploying":
            d.now += 30
            d.step(engine=EngineState(exists=True, ready=True))
        else:
            d.now += 20
            c = s.concurrency
            d.step(
                engine=EngineState(exists=True, ready=True),
                load_test=LoadTestState(
                    s.attempt, True, True, False, summary(3000.0 * c / 32, lat(c), started=d.now - 18, finished=d.now - 1)
                ),
            )
    raise AssertionError("the search did not end")


def measured_tp1(spec, p99=2600.0) -> Driver:
    d = Driver(spec)
    d.step()
    d.measure("tp1-pp1", 3000, p99, fb=30.0, kv_cache_pool_tokens=900_000)
    return d


def test_after_the_decision_the_search_starts_the_engine_above_the_load_concurrency_and_sizes_from_it():
    d = measured_tp1(search_spec())
    s = d.status.concurrency_search
    assert d.status.phase == "Profiling" and d.status.decision is None
    assert s.phase == "Pending" and s.kv_cache_bound == 900_000 // (1024 + 256) == s.max_num_seqs
    assert [p.source for p in s.points] == ["ladder"]
    # The ladder's engine still exists: wait for it to go before starting one with a larger --max-num-seqs.
    r = d.step(engine=EngineState(exists=True, ready=True))
    assert not any(isinstance(a, EnsureEngine) for a in r.actions)
    r = d.step(engine=EngineState(exists=False))
    (engine,) = [a for a in r.actions if isinstance(a, EnsureEngine)]
    assert engine.max_num_seqs == 703 and engine.tier == TP1
    d.now += 30
    r = d.step(engine=EngineState(exists=True, ready=True))
    assert EnsureLoadTest(TP1, SEARCH_ATTEMPT_BASE + 1, SearchLoad(64, 192)) in r.actions
    drive_search(d)
    dec = d.status.decision
    assert d.status.phase == "Decided"
    assert (dec.per_replica_concurrency, dec.per_replica_concurrency_source) == (72, "searched")
    assert dec.replicas == math.ceil(math.ceil(500 / 72) * 1.3) == 10
    assert [p.concurrency for p in dec.concurrency_curve] == [32, 64, 72, 76, 80, 96, 128]
    assert "searched on TP1" in dec.reason
    search = d.status.concurrency_search
    assert search.phase == "Finished" and search.result == 72 and search.gpu_minutes > 0
    assert d.tier("tp1-pp1").gpu_minutes >= search.gpu_minutes
    assert (dec.alternatives[0].tier, dec.alternatives[0].per_replica_concurrency_source) == ("TP1", "searched")
    events = [e.reason for r in d.log for e in r.events]
    assert events.count(reasons.SEARCH_POINT_MEASURED) == 6 and reasons.SEARCH_FINISHED in events


def test_a_tier_that_misses_at_the_load_concurrency_is_searched_downwards():
    d = measured_tp1(search_spec(slo={"latencyP99Ms": 1500}), p99=2600.0)
    drive_search(d)
    dec = d.status.decision
    found = max(p.concurrency for p in dec.concurrency_curve if p.slo_met)
    assert dec.per_replica_concurrency_source == "searched" and dec.per_replica_concurrency == found
    assert latency(found) <= 1500 < latency(min(p.concurrency for p in dec.concurrency_curve if not p.slo_met))
    assert len(dec.concurrency_curve) >= 4


def test_no_concurrency_meets_the_slo_cannot_keep_up():
    d = measured_tp1(search_spec(slo={"latencyP99Ms": 100}))
    drive_search(d)
    dec = d.status.decision
    assert 1 in {p.concurrency for p in dec.concurrency_curve}
    assert dec.classification == "cannot-keep-up" and dec.slo_met is False and dec.per_replica_concurrency == 1


def test_an_operator_restart_resumes_the_point_in_progress_without_repeating_finished_points():
    d = measured_tp1(search_spec())
    drive_search(d, until_points=3)
    before = d.status.concurrency_search
    # A new operator reads the status back from the API server.
    d.status = ExperimentStatus.from_dict(d.status.to_dict())
    assert d.status.concurrency_search == before
    need = needs(d.spec, d.status)
    assert need.load_test is not None and need.load_test.attempt == before.attempt
    # The Job of the point in progress is gone (deleted with its pod): it is ensured again under the same name.
    r = d.step(engine=EngineState(exists=True, ready=True), load_test=LoadTestState(before.attempt, False))
    assert EnsureLoadTest(TP1, before.attempt, SearchLoad(before.concurrency, max(3 * before.concurrency, 100))) in r.actions
    drive_search(d)
    tested = [p.concurrency for p in d.status.concurrency_search.points]
    assert len(tested) == len(set(tested))


def test_the_budget_stops_the_search_early_and_says_so():
    # The ladder's TP1 spent 2 GPU-min; the cap leaves room for about one short point.
    d = measured_tp1(search_spec(), p99=2600.0)
    d.spec = make_spec(
        capacity={"peakConcurrency": 500, "slo": {"latencyP99Ms": 5000}, "concurrencySearch": {"enabled": True}},
        budget={"maxGpuHours": (d.status.gpu_minutes_total + 1.2) / 60},
    )
    drive_search(d)
    search = d.status.concurrency_search
    assert search.stopped and search.stopped.startswith("budget:")
    assert d.status.phase == "Decided"
    assert d.status.decision.per_replica_concurrency_source == "searched"
    assert any(e.reason == reasons.SEARCH_STOPPED for r in d.log for e in r.events)


def test_needs_of_the_search_phases():
    d = measured_tp1(search_spec())
    pending = needs(d.spec, d.status)
    assert pending.engine is not None and pending.capacity is not None and pending.fleet and pending.load_test is None
    d.step(engine=EngineState(exists=False))
    deploying = needs(d.spec, d.status)
    assert deploying.engine is not None and deploying.capacity is None and deploying.load_test is None
    d.now += 30
    d.step(engine=EngineState(exists=True, ready=True))
    testing = needs(d.spec, d.status)
    assert testing.load_test is not None and testing.load_test.attempt == SEARCH_ATTEMPT_BASE + 1
    drive_search(d)
    assert needs(d.spec, d.status).engine is None


def test_the_search_is_off_unless_asked():
    d = Driver(make_spec(capacity={"slo": {"latencyP99Ms": 5000}}))
    d.step()
    d.measure("tp1-pp1", 3000, 2600, fb=30.0)
    assert d.status.phase == "Decided" and d.status.concurrency_search is None
    assert d.status.decision.per_replica_concurrency_source == "measured"


def test_a_spec_change_during_the_search_keeps_its_gpu_minutes_spent():
    d = measured_tp1(search_spec())
    drive_search(d, until_points=2)
    before = d.status.gpu_minutes_total
    d.now += 60
    d.spec = make_spec(
        load={"concurrency": 16}, capacity={"peakConcurrency": 500, "slo": {"latencyP99Ms": 5000}, "concurrencySearch": {"enabled": True}}
    )
    d.step()
    assert d.status.concurrency_search is None and not d.status.tiers
    assert d.status.gpu_minutes_total > before + 1.0  # the search's engine ran > 60 s on one GPU


def test_a_search_the_budget_stops_before_its_first_point_leaves_the_ladders_figure():
    spec = make_spec(
        capacity={"peakConcurrency": 500, "slo": {"latencyP99Ms": 5000}, "concurrencySearch": {"enabled": True}},
        budget={"maxGpuHours": 0.01},
    )
    d = measured_tp1(spec)
    assert d.status.phase == "Decided" and d.status.concurrency_search.stopped.startswith("the budget")
    assert d.status.decision.per_replica_concurrency_source == "measured"
