"""Reconciler fixes the fault-injection suite found (docs/reliability.md), on an in-memory API.

- A tier that waits for GPUs counts its own engine's pod as its own: an operator killed
  after creating the engine but before writing status must adopt it, not wait for the GPUs
  it holds (tests/integration/test_faults_operator_kill.py reproduces it in the sandbox).
- The GPU queue is FIFO: experiments that start waiting in the same second keep the order
  they joined in, and an experiment joins in the pass that starts its wait
  (tests/integration/test_faults_contention.py saw positions go up: 2 -> 5, 6 -> 8).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fake_cluster import FakeApi, node

from kneepoint.broker import WaitQueue
from kneepoint.core.tiers import Tier
from kneepoint.kube import naming
from kneepoint.reconciler import Reconciler
from kneepoint.settings import OperatorSettings

NOW = 1_800_000_000.0


def gpu_pod(name: str, node_name: str, gpus: int, labels: dict[str, str] | None = None, namespace: str = "ns") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"nodeName": node_name, "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]},
        "status": {"phase": "Running"},
    }


def experiment(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "kneepoint.io/v1alpha1",
        "kind": "ParallelismExperiment",
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "generation": 1},
        "spec": {
            "model": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct", "architecture": {"preset": "llama-3-8b"}},
            "tiers": {"tensorParallel": [8]},
            "placement": {"gpuProduct": "NVIDIA-H200"},
        },
    }


def tier_phase(api: FakeApi, name: str) -> str:
    return api.objects[name]["status"]["tiers"][0]["phase"]


def test_queue_keeps_join_order_within_one_second() -> None:
    q = WaitQueue()
    since = "2026-11-29T20:00:00Z"
    assert [q.position("H200", uid, since) for uid in ("uid-z", "uid-a", "uid-m")] == [1, 2, 3]
    assert q.position("H200", "uid-a", since) == 2  # asking again does not move it
    assert q.peek_position("H200", "uid-new") == 4
    q.leave("uid-z")
    assert [q.position("H200", uid, since) for uid in ("uid-z", "uid-a", "uid-m")] == [3, 1, 2]  # rejoins at the end
    # An earlier waitingSince (kept in status across operator restarts) still goes first.
    assert q.position("H200", "uid-old", "2026-11-29T19:59:59Z") == 1


def test_experiments_queue_in_the_order_they_started_waiting_and_nobody_overtakes() -> None:
    api = FakeApi([node("h200-0")], [gpu_pod("blocker", "h200-0", 8)])
    names = [f"e{i}" for i in range(6)]
    # uids sort against the arrival order: the old tie-break by uid reversed the queue.
    for i, name in enumerate(names):
        api.objects[name] = experiment(name)
        api.objects[name]["metadata"]["uid"] = f"uid-{9 - i}"
    clock = [NOW]
    r = Reconciler(api, api, OperatorSettings(), clock=lambda: clock[0])  # type: ignore[arg-type]

    async def pass_all() -> None:
        for name in names:
            await r.reconcile(name, "ns")

    asyncio.run(pass_all())  # plan, then the wait starts
    asyncio.run(pass_all())
    assert [api.objects[n]["status"]["queuePosition"] for n in names] == [1, 2, 3, 4, 5, 6]
    api.pods = []  # the blocker ends: the first in the queue deploys, the others move up
    clock[0] += 30
    asyncio.run(pass_all())
    assert tier_phase(api, "e0") == "Deploying"
    assert [api.objects[n]["status"].get("queuePosition") for n in names[1:]] == [1, 2, 3, 4, 5]


def test_a_tier_shows_its_queue_position_from_the_pass_that_starts_its_wait() -> None:
    # The sandbox test of two experiments on one node saw Waiting without queuePosition
    # for one poll interval: the place was only written on the next pass.
    api = FakeApi([node("h200-0")], [gpu_pod("blocker", "h200-0", 8)])
    names = ["first", "second"]
    for i, name in enumerate(names):
        api.objects[name] = experiment(name)
        api.objects[name]["metadata"]["uid"] = f"uid-{i}"
    r = Reconciler(api, api, OperatorSettings(), clock=lambda: NOW)  # type: ignore[arg-type]

    async def pass_all() -> None:
        for name in names:
            await r.reconcile(name, "ns")

    asyncio.run(pass_all())
    for position, name in enumerate(names, start=1):
        status = api.objects[name]["status"]
        assert status["tiers"][0]["phase"] == "Waiting"
        assert status["queuePosition"] == position and status["waitingFor"]


def test_a_waiting_tier_adopts_its_own_engine_instead_of_waiting_for_its_gpus() -> None:
    api = FakeApi([node("h200-0")], [gpu_pod("blocker", "h200-0", 8)])
    api.objects["x"] = experiment("x")
    r = Reconciler(api, api, OperatorSettings(), clock=lambda: NOW)  # type: ignore[arg-type]
    asyncio.run(r.reconcile("x", "ns"))
    asyncio.run(r.reconcile("x", "ns"))
    assert tier_phase(api, "x") == "Waiting"
    # What a kill leaves: the engine created (its pod holds the node's GPUs), status not written.
    own = naming.child_labels("x", Tier(8, 1), naming.ROLE_ENGINE)
    api.pods = [gpu_pod("x-tp8-pp1-abc", "h200-0", 8, labels=own)]
    api.created.append({"kind": "Deployment", "metadata": {"name": naming.engine_name("x", Tier(8, 1)), "namespace": "ns"}})
    r2 = Reconciler(api, api, OperatorSettings(), clock=lambda: NOW + 5)  # type: ignore[arg-type]  # the restarted operator
    asyncio.run(r2.reconcile("x", "ns"))
    assert tier_phase(api, "x") == "Deploying"
    assert sum(1 for b in api.created if b["kind"] == "Deployment") == 1  # adopted, not duplicated
    # Someone else's pod on those GPUs still makes it wait.
    api.objects["y"] = experiment("y")
    api.pods = [gpu_pod("x-tp8-pp1-abc", "h200-0", 8, labels=own, namespace="other")]
    asyncio.run(r2.reconcile("y", "ns"))
    asyncio.run(r2.reconcile("y", "ns"))
    assert tier_phase(api, "y") == "Waiting"
