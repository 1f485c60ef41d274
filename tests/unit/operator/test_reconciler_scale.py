"""The reconciler's behaviour at scale: a shared fleet read per window, the capacity lock held only for the
check and its reservation, and no periodic re-reads of finished experiments (docs/performance.md)."""

from __future__ import annotations

import asyncio
import math
from typing import Any

from fake_cluster import FakeApi, node

from kneepoint.core.actions import DeleteAllChildren, DeleteTier, EnsureEngine, EnsureLoadTest, PublishRecommendation
from kneepoint.core.tiers import Tier
from kneepoint.handlers.experiment import _sleep
from kneepoint.reconciler import PART_CAPACITY_LOCK, PART_FLEET_READ, PART_OBSERVE, PART_WRITES, Reconciler, action_waves
from kneepoint.settings import OperatorSettings

PARTS = (PART_FLEET_READ, PART_CAPACITY_LOCK, PART_OBSERVE, PART_WRITES)


def experiment(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "kneepoint.io/v1alpha1",
        "kind": "ParallelismExperiment",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": 1},
        "spec": {
            "model": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct"},
            "mode": "Measure",
            "tiers": {"tensorParallel": [4, 8]},
            "placement": {"gpuProduct": "NVIDIA-H200"},
        },
    }


def reconciler(api: FakeApi, clock: list[float], cache_seconds: float = 2.0) -> Reconciler:
    settings = OperatorSettings(fleet_cache_seconds=cache_seconds)
    r = Reconciler(api, api, settings, clock=lambda: clock[0])  # type: ignore[arg-type]
    api.ledger_lock = r.ledger.lock
    return r


def test_experiments_share_one_fleet_read_per_window():
    api = FakeApi([node("h200-0"), node("h200-1")])
    clock = [1_800_000_000.0]
    for name in ("a", "b", "c"):
        api.objects[name] = experiment(name)
    r = reconciler(api, clock)

    async def run() -> None:
        await asyncio.gather(*(r.reconcile(name, "ns") for name in ("a", "b", "c")))

    asyncio.run(run())
    # Three experiments planned and deployed their first tier; the fleet was listed once.
    assert api.calls.count("nodes") == 1 and api.calls.count("pods") == 1
    assert sum(1 for b in api.created if b["kind"] == "Deployment") == 3
    clock[0] += 2.5
    api.objects["d"] = experiment("d")
    asyncio.run(r.reconcile("d", "ns"))
    assert api.calls.count("nodes") == 2  # a new window reads again


def test_without_the_cache_every_capacity_check_lists_the_fleet():
    api = FakeApi([node("h200-0"), node("h200-1")])
    clock = [1_800_000_000.0]
    api.objects["a"] = experiment("a")
    api.objects["b"] = experiment("b")
    r = reconciler(api, clock, cache_seconds=0.0)
    asyncio.run(r.reconcile("a", "ns"))
    asyncio.run(r.reconcile("b", "ns"))
    assert api.calls.count("nodes") == 4  # plan and deploy, for each experiment


def test_gpus_are_promised_under_the_lock_and_written_after_it():
    # Three TP4 engines on two 8-GPU nodes: one node takes two, the third goes to the other,
    # although every check saw the same cached (empty) pod list: the ledger held the promises.
    api = FakeApi([node("h200-0"), node("h200-1")])
    clock = [1_800_000_000.0]
    for name in ("a", "b", "c"):
        api.objects[name] = experiment(name)
    r = reconciler(api, clock)

    async def run() -> None:
        await asyncio.gather(*(r.reconcile(name, "ns") for name in ("a", "b", "c")))

    asyncio.run(run())
    placed: dict[str, int] = {}
    for body in api.created:
        if body["kind"] == "Deployment":
            pref = body["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
            host = pref[0]["preference"]["matchExpressions"][0]["values"][0]
            placed[host] = placed.get(host, 0) + 4
    assert sorted(placed.values()) == [4, 8]
    assert api.lock_held_during_writes and not any(api.lock_held_during_writes)


def test_a_decided_experiment_is_not_polled():
    api = FakeApi([node("h200-0")])
    clock = [1_800_000_000.0]
    body = experiment("a")
    body["spec"]["tiers"] = {"tensorParallel": [16]}  # no node holds it: planned, skipped, Failed at once
    api.objects["a"] = body
    r = reconciler(api, clock)
    assert asyncio.run(r.reconcile("a", "ns")) is None
    assert api.objects["a"]["status"]["phase"] == "Failed"


def test_sleep_without_deadline_returns_on_wake():
    async def run() -> bool:
        wake = asyncio.Event()
        task = asyncio.create_task(_sleep(wake, False, math.inf))
        await asyncio.sleep(0.05)
        assert not task.done()
        wake.set()
        await asyncio.wait_for(task, 2.0)
        return True

    assert asyncio.run(run())


def test_cached_view_with_reservations_equals_a_fresh_fleet_view():
    from kneepoint.broker import FleetCache
    from kneepoint.kube import fleet

    nodes = [node("h200-0"), node("h200-1"), node("h200-2", gpus=4)]
    pods = [
        {
            "metadata": {"name": "p1", "namespace": "x"},
            "spec": {"nodeName": "h200-0", "containers": [{"resources": {"requests": {"nvidia.com/gpu": "6"}}}]},
            "status": {"phase": "Running"},
        },
        {
            "metadata": {"name": "p2", "namespace": "x"},
            "spec": {"nodeName": "h200-2", "containers": [{"resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
            "status": {"phase": "Pending"},
        },
    ]
    cache = FleetCache(max_age=2.0, nodes=nodes, pods=pods)
    for reserved in ({}, {"h200-0": 4}, {"h200-1": 2, "h200-2": 1}):
        fresh = fleet.fleet_view(nodes, pods, "nvidia.com/gpu", "NVIDIA-H200", {}, reserved)
        assert cache.view("nvidia.com/gpu", "NVIDIA-H200", {}, None, reserved) == fresh
    assert len(cache.views) == 1  # one base view, reused


def test_a_stale_fleet_read_is_refreshed_in_the_background_and_an_old_one_waited_for():
    api = FakeApi([node("h200-0")])
    clock = [1_800_000_000.0]
    r = reconciler(api, clock, cache_seconds=2.0)

    async def run() -> None:
        first = await r._fleet_lists()  # nothing cached: waits for the read
        assert [n["metadata"]["name"] for n in first[0]] == ["h200-0"] and r.fleet_cache.reads == 1
        api.nodes_list = [node("h200-0"), node("h200-1")]
        clock[0] += 3  # stale, but younger than 3 windows: the last read now, a refresh behind it
        nodes, _ = await r._fleet_lists()
        assert len(nodes) == 1 and r.fleet_cache.refreshing is not None
        await r.fleet_cache.refreshing
        assert len((await r._fleet_lists())[0]) == 2
        api.nodes_list = [node("h200-0")]
        clock[0] += 10  # five windows later: this pass waits for a fresh read
        assert len((await r._fleet_lists())[0]) == 1

    asyncio.run(run())


def test_a_pass_does_not_wait_for_its_events_but_the_wake_up_posts_them_all_before_it_ends():
    api = FakeApi([node("h200-0")])
    gate = asyncio.Event()
    posted: list[str] = []

    async def post_event(involved: Any, reason: str, *args: Any) -> None:
        await gate.wait()
        posted.append(reason)

    api.post_event = post_event  # type: ignore[method-assign]
    api.objects["a"] = experiment("a")
    clock = [1_800_000_000.0]
    r = reconciler(api, clock)

    async def run() -> None:
        wake = asyncio.ensure_future(r.reconcile("a", "ns"))
        # The plan's pass and the first tier's deploy pass both write status while no event has been posted yet.
        while api.calls.count("patch_status") < 2:
            await asyncio.sleep(0)
        assert posted == [] and not wake.done()
        gate.set()
        await wake

    asyncio.run(run())
    assert "PlanReady" in posted and "TierDeploying" in posted


def test_a_finished_job_whose_cached_pod_has_no_summary_yet_reads_its_pods_from_the_api():
    from kneepoint.core.tiers import Tier
    from kneepoint.kube import manifests
    from kneepoint.kube.child_cache import ChildCache

    summary = '{"v": 1, "ok": true, "outputTokensPerSecond": 1000.0}'
    running = {"status": {"containerStatuses": [{"name": manifests.LOADGEN_CONTAINER, "state": {"running": {}}}]}}
    ended = {
        "status": {
            "containerStatuses": [
                {"name": manifests.LOADGEN_CONTAINER, "state": {"terminated": {"exitCode": 0, "message": summary, "finishedAt": "t"}}}
            ]
        }
    }
    asked: list[bool] = []

    class Reader(FakeApi):
        cache = ChildCache()

        async def job(self, namespace: str, name: str) -> dict[str, Any]:
            return {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}

        async def job_pods(self, namespace: str, job_name: str, fresh: bool = False) -> list[dict[str, Any]]:
            asked.append(fresh)
            return [ended if fresh else running]  # the Job's watch event came before its pod's

    api = Reader([node("h200-0")])
    r = reconciler(api, [1_800_000_000.0])
    state = asyncio.run(r._load_test("ns", "a", Tier(1, 1), 1))
    assert asked == [False, True]
    assert state.succeeded and state.summary is not None and state.summary["outputTokensPerSecond"] == 1000.0


def test_the_watch_handlers_that_fill_the_cache_run_on_the_event_loop():
    # kopf runs a plain function in a worker thread; the passes iterate the cache on the loop meanwhile.
    import inspect

    from kneepoint.handlers import experiment as handlers

    assert inspect.iscoroutinefunction(handlers.child_changed) and inspect.iscoroutinefunction(handlers.experiment_changed)


def test_every_pass_records_where_its_time_went_by_part():
    # kneepoint_reconcile_part_seconds: a pass that checks capacity has all four parts, each sample
    # no longer than the pass it belongs to.
    api = FakeApi([node("h200-0")])
    clock = [1_800_000_000.0]
    api.objects["a"] = experiment("a")
    r = reconciler(api, clock)
    asyncio.run(r.reconcile("a", "ns"))
    registry = r.metrics.registry
    passes = registry.get_sample_value("kneepoint_reconcile_duration_seconds_count")
    whole = registry.get_sample_value("kneepoint_reconcile_duration_seconds_sum")
    assert passes and passes >= 2  # planned, then deployed
    counts = {p: registry.get_sample_value("kneepoint_reconcile_part_seconds_count", {"part": p}) for p in PARTS}
    assert counts[PART_OBSERVE] == passes and counts[PART_WRITES] == passes
    assert counts[PART_FLEET_READ] == counts[PART_CAPACITY_LOCK] and 1 <= counts[PART_FLEET_READ] < passes  # not the plan pass
    for p in PARTS:
        assert (registry.get_sample_value("kneepoint_reconcile_part_seconds_sum", {"part": p}) or 0.0) <= whole


def test_a_steps_actions_run_at_once_where_they_touch_different_objects():
    tp1, tp2 = Tier(1, 1), Tier(2, 1)
    publish = PublishRecommendation(decision=None)  # type: ignore[arg-type]  # the waves never look inside
    # The last pass of a ladder: the cleanup and the recommendation's ConfigMap at once.
    assert action_waves([DeleteAllChildren(), publish]) == [[DeleteAllChildren(), publish]]
    # Different tiers' children at once.
    assert action_waves([DeleteTier(tp1), EnsureEngine(tp2)]) == [[DeleteTier(tp1), EnsureEngine(tp2)]]
    # A load test's retry: the old Job's delete-collection (by the tier's labels) must not catch the new Job.
    retry = [DeleteTier(tp1, keep_engine=True), EnsureLoadTest(tp1, 2)]
    assert action_waves(retry) == [[retry[0]], [retry[1]]]
    # A kept winner: its teardown, its engine again, then the cleanup that spares it, beside the recommendation.
    keep = [DeleteTier(tp1), EnsureEngine(tp1), DeleteAllChildren(keep_tier=tp1), publish]
    assert action_waves(keep) == [[keep[0]], [keep[1]], [keep[2], publish]]
    assert action_waves([EnsureEngine(tp2), DeleteAllChildren()]) == [[EnsureEngine(tp2)], [DeleteAllChildren()]]
    assert action_waves([]) == []


def _passes_in_writes_at_once(limit: int, experiments: int) -> tuple[int, Reconciler]:
    """Start ``experiments`` wake-ups with every status patch held; how many passes reach their write at once."""
    api = FakeApi([node(f"h200-{i}") for i in range(experiments)])  # a TP4 engine for every one
    gate = asyncio.Event()
    writing: set[str] = set()
    most = [0]
    patch = api.patch_status

    async def held_patch(namespace: str, name: str, body: dict[str, Any]) -> None:
        writing.add(name)
        most[0] = max(most[0], len(writing))
        await gate.wait()
        writing.discard(name)
        await patch(namespace, name, body)

    api.patch_status = held_patch  # type: ignore[method-assign]
    names = [f"e{i}" for i in range(experiments)]
    for name in names:
        api.objects[name] = experiment(name)
    r = Reconciler(api, api, OperatorSettings(fleet_cache_seconds=2.0, max_concurrent_passes=limit), clock=lambda: 1_800_000_000.0)  # type: ignore[arg-type]

    async def run() -> None:
        wakeups = asyncio.gather(*(r.reconcile(name, "ns") for name in names))
        for _ in range(200):  # every pass that can start has reached its held write
            await asyncio.sleep(0)
        gate.set()
        await wakeups

    asyncio.run(run())
    assert sum(1 for b in api.created if b["kind"] == "Deployment") == experiments  # every one planned and deployed
    return most[0], r


def test_passes_run_at_most_the_slots_at_once_and_their_wait_is_kept_apart():
    # kneepoint_reconcile_queue_seconds: one sample per pass, as many as kneepoint_reconcile_duration_seconds.
    at_once, r = _passes_in_writes_at_once(limit=2, experiments=5)
    assert at_once == 2
    registry = r.metrics.registry
    passes = registry.get_sample_value("kneepoint_reconcile_duration_seconds_count")
    assert passes and passes >= 10  # plan and deploy, five times
    assert registry.get_sample_value("kneepoint_reconcile_queue_seconds_count") == passes
    assert (registry.get_sample_value("kneepoint_reconcile_queue_seconds_sum") or 0.0) > 0.0  # some waited for the gate


def test_without_a_limit_every_experiments_pass_writes_at_once():
    at_once, _ = _passes_in_writes_at_once(limit=0, experiments=5)
    assert at_once == 5


def test_the_pass_limit_is_read_from_the_environment_and_checked(monkeypatch):
    import pytest

    monkeypatch.setenv("KNEEPOINT_MAX_CONCURRENT_PASSES", "3")
    assert OperatorSettings.from_env().max_concurrent_passes == 3
    monkeypatch.setenv("KNEEPOINT_MAX_CONCURRENT_PASSES", "-1")
    with pytest.raises(ValueError, match=r"KNEEPOINT_MAX_CONCURRENT_PASSES must be 0 \(no limit\) or a positive"):
        OperatorSettings.from_env()
    monkeypatch.setenv("KNEEPOINT_MAX_CONCURRENT_PASSES", "eight")
    with pytest.raises(ValueError, match="KNEEPOINT_MAX_CONCURRENT_PASSES must be a whole number, not 'eight'"):
        OperatorSettings.from_env()
