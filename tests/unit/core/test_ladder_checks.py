"""Plan-time checks of the objects the engine needs, and the first tier's scrape check, through the ladder."""

from ladder_driver import Driver, make_spec

from kneepoint.core import reasons
from kneepoint.core.actions import EnsureEngine
from kneepoint.core.observations import EngineState, LoadTestState
from kneepoint.core.status import get_condition


def test_missing_claim_fails_the_plan_naming_the_field_and_is_rechecked_until_it_appears():
    d = Driver(make_spec("llama-3-8b"))
    missing = ("spec.model.uri: PersistentVolumeClaim team-a/weights not found",)
    r = d.step(missing_objects=missing)
    assert d.status.phase == "Failed" and not d.status.tiers and not r.actions
    failed = get_condition(d.status.conditions, reasons.FAILED)
    assert failed.reason == reasons.MISSING_OBJECT and "PersistentVolumeClaim team-a/weights not found" in failed.message
    assert [e.reason for e in r.events] == [reasons.MISSING_OBJECT] and r.requeue_after == 30.0
    assert d.status.finished_at is None
    # Still missing: no new event, same requeue.
    r = d.step(missing_objects=missing)
    assert r.events == [] and r.requeue_after == 30.0 and d.status.phase == "Failed"
    # The claim appears: the ladder is planned and runs.
    r = d.step()
    assert get_condition(d.status.conditions, reasons.FAILED).status == "False"
    assert get_condition(d.status.conditions, reasons.PLANNED).status == "True"
    assert d.status.phase != "Failed" and d.status.tiers
    assert any(isinstance(a, EnsureEngine) for a in d.step().actions)


def test_first_tier_says_at_once_when_prometheus_has_no_engine_series():
    d = Driver(make_spec("llama-3-8b"))
    d.step()  # plan
    d.step()  # EnsureEngine
    d.now += 30
    d.step(engine=EngineState(exists=True, ready=True, node_name="h200-0"))  # load test starts
    assert d.tier("tp1-pp1").phase == "LoadTesting"
    d.now += 40
    why = "Prometheus http://prom:9090 has no vllm:num_requests_running series for the engine's pods ns/x-tp1-pp1-*"
    running = LoadTestState(1, True, False, False, None)
    r = d.step(engine=EngineState(exists=True, ready=True), load_test=running, engine_not_scraped=why)
    cond = get_condition(d.status.conditions, reasons.METRICS_AVAILABLE)
    assert cond.status == "False" and cond.reason == reasons.ENGINE_NOT_SCRAPED
    assert why in cond.message and "monitoring.labels.release" in cond.message and "release=<its Helm release name>" in cond.message
    assert [e.reason for e in r.events] == [reasons.ENGINE_NOT_SCRAPED]
    assert d.tier("tp1-pp1").phase == "LoadTesting"  # the load test goes on
    r = d.step(engine=EngineState(exists=True, ready=True), load_test=running, engine_not_scraped=why)
    assert reasons.ENGINE_NOT_SCRAPED not in [e.reason for e in r.events]  # said once
    d.step(engine=EngineState(exists=True, ready=True), load_test=running)
    assert get_condition(d.status.conditions, reasons.METRICS_AVAILABLE).reason == reasons.ENGINE_SCRAPED
