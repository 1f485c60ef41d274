"""Fault: the experiment is deleted mid-tier; every child goes, GPUs are free, no process is left.

Two experiments run at once; one is deleted while its first tier deploys (the engine is
loading), the other while its first tier's load test runs (engine serving, Job pod
sending requests). For each, from the ``kubectl delete`` call: how long until the
experiment object is gone (kopf's finalizer released), until no child object (Deployment,
ReplicaSet's pods, Service, Job, ConfigMap) is left, until no pod holds a GPU, and until no
engine simulator or load generator process of the namespace runs on this machine.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from experiment_api import Cluster, experiment, tier
from fault_harness import ChildLedger, FaultLog, session_namespace

TIMEOUT = 60


def _processes_of(namespace: str) -> list[str]:
    """Processes the runner started for pods of ``namespace`` (engines and load generators)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if "kneepoint" not in cmd or (" sim " not in f"{cmd} " and " loadgen " not in f"{cmd} "):
                continue
            env = proc.environ()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if env.get("POD_NAMESPACE") == namespace or f".{namespace}.svc" in cmd:
            found.append(f"{proc.info['pid']} {cmd[:80]}")
    return found


@pytest.fixture
def namespaces(sandbox: Any, operator: Any) -> Iterator[list[str]]:
    names = [session_namespace(operator, f"del{i}-{uuid.uuid4().hex[:6]}") for i in range(2)]
    for ns in names:
        sandbox.kubectl("create", "namespace", ns)
    try:
        yield names
    finally:
        for ns in names:
            sandbox.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def _wait_gone(cluster: Cluster, namespace: str, name: str, started: float, pids: set[int]) -> dict[str, float]:
    marks: dict[str, float] = {}
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline and len(marks) < 4:
        now = time.monotonic() - started
        if "experiment" not in marks and cluster.get(namespace, name) is None:
            marks["experiment"] = now
        children = cluster.workload_names(namespace, name)
        children["configmaps"] = [
            c.metadata.name
            for c in cluster.core.list_namespaced_config_map(namespace, label_selector=f"kneepoint.io/experiment={name}").items
        ]
        if "children" not in marks and not any(children.values()):
            marks["children"] = now
        if "gpus" not in marks and not cluster.gpus_held([namespace]):
            marks["gpus"] = now
        if "processes" not in marks and not _processes_of(namespace) and not any(psutil.pid_exists(p) for p in pids):
            marks["processes"] = now
        time.sleep(0.1)
    assert len(marks) == 4, (
        namespace,
        marks,
        cluster.workload_names(namespace, name),
        cluster.gpus_held([namespace]),
        _processes_of(namespace),
    )
    return {k: round(v, 2) for k, v in marks.items()}


def test_deleting_an_experiment_mid_tier_removes_every_child_and_frees_its_gpus(sandbox: Any, operator: Any, namespaces: list[str]) -> None:
    # A long model load keeps the first experiment in Deploying long enough to delete it there.
    slow_load = {"engine": {"env": [{"name": "KNEEPOINT_SIM_MODEL_LOAD_SECONDS", "value": "30"}]}}
    long_test = {"load": {"numRequests": 400}}
    cases = [("deploying", namespaces[0], "Deploying", slow_load), ("loadtesting", namespaces[1], "LoadTesting", long_test)]
    with sandbox.api_client() as api:
        cluster = Cluster(api)
        with ChildLedger(api, set(namespaces)) as ledger:
            for name, ns, _, spec in cases:
                cluster.create(experiment(name, ns, {"tiers": {"tensorParallel": [2, 4]}, **spec}))
            results = {}
            for name, ns, phase, _ in cases:
                cluster.wait(ns, name, lambda s, p=phase: (tier(s, "tp2-pp1") or {}).get("phase") == p, 90, f"tp2 {phase}", interval=0.2)
                if phase == "LoadTesting":  # the load generator is sending requests
                    deadline = time.monotonic() + 30
                    while not any("loadgen" in p for p in _processes_of(ns)) and time.monotonic() < deadline:
                        time.sleep(0.2)
                deadline = time.monotonic() + 20  # the engine pod is bound a moment after the phase shows
                while sum((held := cluster.gpus_held([ns])).values()) != 2 and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert sum(held.values()) == 2, held
                # The sandbox runner starts a bound pod's process when its pod watch reports the
                # binding: on a loaded machine that comes a few seconds after the pod holds GPUs.
                deadline = time.monotonic() + 30
                while not (running := _processes_of(ns)) and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert running, f"no engine process found for {ns} 30 s after its pod was bound"
                pids = {int(line.split()[0]) for line in running}
                started = time.monotonic()
                cluster.delete(ns, name)
                results[name] = _wait_gone(cluster, ns, name, started, pids)
                print(name, "processes at delete:", running)
            time.sleep(2)
        for _name, ns, _, _ in cases:
            assert ledger.duplicates(namespace=ns) == {}
            # The operator did not create anything after the delete (no tier 2 engine).
            assert not any(n.endswith("tp4-pp1") for n in ledger.created("Deployment", ns)), ledger.created("Deployment", ns)
    assert operator.proc.poll() is None
    print("seconds after delete:", results)
    for name, marks in results.items():
        FaultLog().record(
            "delete-mid-tier", f"experiment deleted during {name}", True, **{f"{k}_gone_seconds": v for k, v in marks.items()}
        )
        assert marks["gpus"] <= 30 and marks["children"] <= 30, marks
