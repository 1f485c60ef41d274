"""Fault: ten experiments applied at once want more GPUs than the fleet has.

Each of the ten wants one TP4 replica on an H200 node; the sandbox fleet has two such
nodes of 8 GPUs (16 GPUs), so at most four can run and six must queue (40 GPUs wanted). From what the API server
recorded while they ran:

- no over-commit: engine Deployments alive at one moment never asked for more than the 16
  GPUs, no node ever had more than its 8 GPUs bound, and no engine pod was ever
  Unschedulable (the operator waited instead of creating what cannot be placed);
- the waiting ones showed a queue position in status, and a queue is FIFO: no experiment's
  shown position ever went up (nobody was overtaken), and they deployed in queue order;
- all ten finish Decided, each tier measured once, nothing created twice, nothing left.
"""

from __future__ import annotations

import time
from typing import Any

from experiment_api import Cluster, experiment, is_finished, tier
from fault_harness import ChildLedger, FaultLog

COUNT = 10
FLEET_H200_GPUS = 16


def test_ten_experiments_on_too_few_gpus_queue_without_over_commit(sandbox: Any, operator: Any, namespace: str) -> None:
    names = [f"q{i}" for i in range(COUNT)]
    # TP4 runs fast: a longer output keeps each load test several scrape intervals long.
    spec = {"tiers": {"tensorParallel": [4]}, "load": {"numRequests": 64, "outputLen": 128}}
    positions: dict[str, list[int]] = {n: [] for n in names}
    deployed_at: dict[str, float] = {}
    finished: dict[str, float] = {}
    with sandbox.api_client() as api:
        cluster = Cluster(api)
        with ChildLedger(api, {namespace}) as ledger:
            began = time.monotonic()
            for name in names:
                cluster.create(experiment(name, namespace, spec))
            deadline = time.monotonic() + 420
            while time.monotonic() < deadline and len(finished) < COUNT:
                items = cluster.custom.list_namespaced_custom_object("kneepoint.io", "v1alpha1", namespace, "parallelismexperiments")[
                    "items"
                ]
                for item in items:
                    name, status = item["metadata"]["name"], item.get("status") or {}
                    position = status.get("queuePosition")
                    if position is not None and (not positions[name] or positions[name][-1] != position):
                        positions[name].append(position)
                    if (tier(status, "tp4-pp1") or {}).get("phase") in ("Deploying", "LoadTesting", "Collecting", "Measured"):
                        deployed_at.setdefault(name, time.monotonic() - began)
                    if is_finished(status) and name not in finished:
                        finished[name] = time.monotonic() - began
                time.sleep(0.5)
            time.sleep(3)
        statuses = {n: cluster.status(namespace, n) for n in names}

    assert sorted(finished) == sorted(names), {n: (s.get("phase"), s.get("message")) for n, s in statuses.items()}
    for name, status in statuses.items():
        assert status["phase"] == "Decided", (name, status.get("message"))
        assert tier(status, "tp4-pp1")["phase"] == "Measured" and tier(status, "tp4-pp1")["attempts"] == 1
    assert ledger.max_gpus_committed() <= FLEET_H200_GPUS, ledger.max_gpus_committed()
    assert all(v <= 8 for v in ledger.max_gpus_bound_per_node().values()), ledger.max_gpus_bound_per_node()
    assert ledger.unschedulable_pods() == set()
    assert ledger.duplicates(namespace=namespace) == {}
    waited = {n: p for n, p in positions.items() if p}
    print("positions shown:", waited, "deployed after (s):", deployed_at)
    assert len(waited) >= COUNT - 4, waited  # all but the first four queued
    assert max(max(p) for p in waited.values()) >= COUNT - 4 - 1, waited  # deep positions were shown
    assert all(p == sorted(p, reverse=True) for p in waited.values()), waited  # never overtaken
    # Deployed in queue order: whoever first showed a smaller position deployed no later.
    first = {n: p[0] for n, p in waited.items()}
    order = sorted(waited, key=lambda n: deployed_at[n])
    assert [first[n] for n in order] == sorted(first[n] for n in order) or all(
        deployed_at[a] <= deployed_at[b] + 3 for a in waited for b in waited if first[a] < first[b]
    ), (first, deployed_at)
    for name in names:
        assert cluster.workload_names(namespace, name) == {"deployments": [], "services": [], "jobs": [], "pods": []}
    assert cluster.gpus_held([namespace]) == {}
    total = max(finished.values())
    FaultLog().record(
        "contention",
        "10 experiments x 4 GPUs on a 16-GPU fleet",
        True,
        all_decided_seconds=round(total, 1),
        max_gpus_committed=ledger.max_gpus_committed(),
        max_bound_per_node=ledger.max_gpus_bound_per_node(),
        deepest_queue_position=max(max(p) for p in waited.values()),
    )
    print("finished after (s):", {n: round(t, 1) for n, t in sorted(finished.items(), key=lambda kv: kv[1])})
