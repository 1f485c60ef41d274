"""Fault: more than one operator for one scope (leader election on a Lease, kube/leader_election.py).

- two operators started at the same moment on the same experiments: one leads, the other
  says once that it stands by; every child, event and GPU reservation happens once, and
  the GPUs committed never exceed the fleet;
- the leader SIGKILLed in the middle of a tier: the standby takes over within the lease
  duration plus a retry (the takeover time is measured) and finishes the ladder without
  measuring a tier twice;
- the leader's Lease overwritten with another holder: it stops (and starts over as a standby) within a retry period and
  writes nothing more; a new candidate takes over once that record expires;
- the chart installed with ``replicas: 2`` and its Deployment rolled (``kubectl rollout
  restart``) in the middle of an experiment: the new pods wait as standbys, the old leader
  releases the Lease on SIGTERM, a new pod leads, and the experiment finishes as if
  nothing happened.

These operators watch namespaces of their own (``<session prefix>le-*``), which the
session's operator (``<session prefix>-*``) does not: their scope, and so their Lease, is
theirs. They run with the election's defaults (15 s lease, 10 s renew deadline, 2 s retry).
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import SESSION_PREFIX, OperatorProcess
from experiment_api import Cluster, experiment, is_finished, tier
from fault_harness import ChildLedger, FaultLog
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kneepoint.kube.leader_election import ElectionTiming, lease_name

LEASE_NAMESPACE = "default"
"""Where a local operator's Lease goes when none exists yet and the kubeconfig names no namespace."""
DEFAULTS = ElectionTiming()
FLEET_H200_GPUS = 16


@pytest.fixture
def cluster(sandbox: Any) -> Iterator[Cluster]:
    with sandbox.api_client() as api:
        yield Cluster(api)


@pytest.fixture
def scope(sandbox: Any) -> Iterator[str]:
    """A namespace only this test's operators watch; its Lease is removed afterwards."""
    name = f"{SESSION_PREFIX}le-{uuid.uuid4().hex[:6]}"
    sandbox.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        sandbox.kubectl("delete", "namespace", name, "--wait=false", check=False)
        sandbox.kubectl("delete", "lease", "-n", LEASE_NAMESPACE, lease_name((name,)), "--ignore-not-found", check=False)


def _operators(sandbox: Any, tmp_path: Path, namespace: str, count: int) -> list[OperatorProcess]:
    return [OperatorProcess(sandbox, tmp_path / f"op{i}", extra_env={"KNEEPOINT_NAMESPACES": namespace}) for i in range(count)]


def _identity(op: OperatorProcess) -> str:
    return op.extra_env["KNEEPOINT_LEADER_IDENTITY"]


def _holder(cluster: Cluster, name: str, namespace: str = LEASE_NAMESPACE) -> str | None:
    try:
        lease = client.CoordinationV1Api(cluster.api).read_namespaced_lease(name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return lease.spec.holder_identity if lease.spec else None


def _wait(what: str, check: Any, timeout: float, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _cleanup(cluster: Cluster, namespace: str, operators: list[OperatorProcess]) -> None:
    """Experiments first, while an operator still runs to remove kopf's finalizer; then the operators."""
    for item in cluster.custom.list_namespaced_custom_object("kneepoint.io", "v1alpha1", namespace, "parallelismexperiments")["items"]:
        try:
            cluster.delete(namespace, item["metadata"]["name"])
        except ApiException:
            pass
    deadline = time.monotonic() + 30
    while (
        time.monotonic() < deadline
        and cluster.custom.list_namespaced_custom_object("kneepoint.io", "v1alpha1", namespace, "parallelismexperiments")["items"]
    ):
        time.sleep(0.5)
    for op in operators:
        op.stop()


def _measured_events(cluster: Cluster, namespace: str, name: str) -> list[str]:
    return [e["message"].split()[0] for e in cluster.events(namespace, name, order="first") if e["reason"] == "TierMeasured"]


def _no_event_twice(cluster: Cluster, namespace: str, name: str) -> None:
    events = [(e["reason"], e["message"]) for e in cluster.events(namespace, name, order="first")]
    twice = sorted({e for e in events if events.count(e) > 1})
    assert twice == [], f"events posted twice on {name}: {twice}"


def test_two_operators_started_at_once_drive_every_experiment_once(sandbox: Any, cluster: Cluster, scope: str, tmp_path: Path) -> None:
    # Five experiments of one TP4 tier want 20 H200 GPUs of the fleet's 16: one must queue, so
    # two operators each keeping a ledger would over-commit if both acted.
    names = [f"both{i}" for i in range(5)]
    spec = {"tiers": {"tensorParallel": [4]}}
    ops = _operators(sandbox, tmp_path, scope, 2)
    with ChildLedger(cluster.api, {scope}) as ledger:
        try:
            for op in ops:  # as a Deployment's two replicas start: at the same moment
                op.start()
            for name in names:
                cluster.create(experiment(name, scope, spec))
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and not all(is_finished(cluster.status(scope, n)) for n in names):
                time.sleep(1)
            statuses = {n: cluster.wait_finished(scope, n, 30) for n in names}
            time.sleep(3)
            logs = [op.logs() for op in ops]
            holder = _holder(cluster, lease_name((scope,)))
        finally:
            _cleanup(cluster, scope, ops)

    for name, status in statuses.items():
        assert status["phase"] == "Decided", (name, status.get("message"))
        assert tier(status, "tp4-pp1")["attempts"] == 1
        assert _measured_events(cluster, scope, name) == ["TP4"], name
        _no_event_twice(cluster, scope, name)
    leading = [i for i, log in enumerate(logs) if "Leading: Lease" in log]
    assert len(leading) == 1, logs
    (leader,) = leading
    standby = 1 - leader
    assert holder == _identity(ops[leader])
    assert logs[standby].count("Standby: Lease") == 1, logs[standby][-3000:]
    assert "reconcile" not in logs[standby].lower() and "Created " not in logs[standby]
    duplicates = ledger.duplicates(namespace=scope)
    assert duplicates == {}
    assert ledger.max_gpus_committed() <= FLEET_H200_GPUS, ledger.max_gpus_committed()
    assert all(v <= 8 for v in ledger.max_gpus_bound_per_node().values()), ledger.max_gpus_bound_per_node()
    assert ledger.unschedulable_pods() == set()
    FaultLog().record(
        "leader-election",
        "two operators started at once, 5 experiments x 4 GPUs on 16",
        True,
        duplicates=len(duplicates),
        max_gpus_committed=ledger.max_gpus_committed(),
        over_commits=max(0, ledger.max_gpus_committed() - FLEET_H200_GPUS),
    )


def test_leader_sigkilled_mid_tier_the_standby_finishes_without_measuring_twice(
    sandbox: Any, cluster: Cluster, scope: str, tmp_path: Path
) -> None:
    name = f"takeover-{uuid.uuid4().hex[:4]}"
    lease = lease_name((scope,))
    first, second = ops = _operators(sandbox, tmp_path, scope, 2)
    with ChildLedger(cluster.api, {scope}) as ledger:
        try:
            first.start()
            _wait("the first operator to lead", lambda: _holder(cluster, lease) == _identity(first), 60)
            second.start()
            _wait("the second to say it stands by", lambda: "Standby: Lease" in second.logs(), 60)
            cluster.create(experiment(name, scope))
            seen = cluster.wait(
                scope, name, lambda s: (tier(s, "tp1-pp1") or {}).get("phase") == "LoadTesting", 120, "tp1 LoadTesting", interval=0.1
            )
            killed = time.monotonic()
            first.kill()
            _wait("the standby to take the Lease", lambda: _holder(cluster, lease) == _identity(second), 60, interval=0.1)
            takeover = time.monotonic() - killed
            final = cluster.wait_finished(scope, name, 240)
            standby_log = second.logs()
        finally:
            _cleanup(cluster, scope, ops)

    assert seen["currentTier"] == "tp1-pp1"
    # The standby saw the last renew at most a retry period before the kill; it may take over a lease duration
    # after that, and tries every retry period (x 1.2 jitter).
    assert takeover <= DEFAULTS.lease_duration + 2 * 1.2 * DEFAULTS.retry_period + 3, takeover
    assert "Leading: Lease" in standby_log
    assert final["phase"] == "Decided", final.get("message")
    assert [(t["name"], t["phase"], t["attempts"]) for t in final["tiers"]] == [("tp1-pp1", "Measured", 1), ("tp2-pp1", "Measured", 1)]
    assert final["decision"]["rule"] == "last-tier"
    jobs = ledger.created("Job", scope)
    assert sorted(jobs) == [f"{scope}/{name}-tp1-pp1-load1", f"{scope}/{name}-tp2-pp1-load1"], jobs
    assert ledger.duplicates(namespace=scope) == {}
    assert _measured_events(cluster, scope, name) == ["TP1", "TP2"]
    _no_event_twice(cluster, scope, name)
    print(f"takeover after SIGKILL: {takeover:.1f} s")
    FaultLog().record(
        "leader-election",
        "leader SIGKILLed while tp1 load-tests",
        True,
        takeover_seconds=round(takeover, 1),
        duplicates=0,
        tiers_measured_twice=0,
    )


def test_a_leader_that_sees_its_lease_taken_stops_at_once_and_writes_nothing_more(
    sandbox: Any, cluster: Cluster, scope: str, tmp_path: Path
) -> None:
    name = f"taken-{uuid.uuid4().hex[:4]}"
    lease = lease_name((scope,))
    first, second = ops = _operators(sandbox, tmp_path, scope, 2)
    coordination = client.CoordinationV1Api(cluster.api)
    with ChildLedger(cluster.api, {scope}) as ledger:
        try:
            first.start()
            _wait("the first operator to lead", lambda: _holder(cluster, lease) == _identity(first), 60)
            cluster.create(experiment(name, scope))
            cluster.wait(
                scope, name, lambda s: (tier(s, "tp1-pp1") or {}).get("phase") == "LoadTesting", 120, "tp1 LoadTesting", interval=0.1
            )
            # Someone else's record in the Lease, as after a takeover the old leader did not notice. The leader renews
            # the Lease meanwhile, so a write from a stale read is refused (409): read again and retry, as a client of
            # the Lease must.
            for _ in range(20):
                body = coordination.read_namespaced_lease(lease, LEASE_NAMESPACE)
                body.spec.holder_identity = "intruder"
                body.spec.renew_time = datetime.now(UTC)
                try:
                    coordination.replace_namespaced_lease(lease, LEASE_NAMESPACE, body)
                    break
                except ApiException as exc:
                    if exc.status != 409:
                        raise
            else:
                pytest.fail("the intruder's record never got into the Lease: every write conflicted with a renewal")
            taken = time.monotonic()
            _wait("the first operator to give up its leadership", lambda: "Lost the leadership" in first.logs(), 30)
            stopped = time.monotonic() - taken
            snapshot = len(ledger.snapshot())
            status_then = cluster.status(scope, name)
            time.sleep(5)
            # Nothing more from it: no child changed by the operator, status as it left it.
            # (created or deleted: changes of their status come from the cluster's controllers)
            children_after = [
                s
                for s in ledger.snapshot()[snapshot:]
                if s.kind in ("Deployment", "Service", "Job", "ConfigMap") and s.type in ("ADDED", "DELETED")
            ]
            assert cluster.status(scope, name) == status_then
            # A new candidate waits for the intruder's record to expire, then finishes the ladder.
            second.start()
            final = cluster.wait_finished(scope, name, 240)
            first_log = first.logs()
        finally:
            _cleanup(cluster, scope, ops)

    assert stopped <= DEFAULTS.retry_period + 3, stopped
    assert "is held by intruder, not by this process" in first_log, first_log[-3000:]
    # It started over in place as a standby (a fresh process image: nothing of its leadership kept).
    assert "starting over as a standby without another write" in first_log, first_log[-3000:]
    assert first_log.count("Standby: Lease") >= 1 or first_log.count("Leading: Lease") >= 2, first_log[-3000:]
    assert children_after == [], children_after
    assert final["phase"] == "Decided", final.get("message")
    assert [(t["name"], t["phase"], t["attempts"]) for t in final["tiers"]] == [("tp1-pp1", "Measured", 1), ("tp2-pp1", "Measured", 1)]
    assert ledger.duplicates(namespace=scope) == {}
    _no_event_twice(cluster, scope, name)
    print(f"lease taken: the leader exited {stopped:.1f} s later")
    FaultLog().record(
        "leader-election",
        "Lease overwritten by another holder while tp1 load-tests",
        True,
        stopped_seconds=round(stopped, 1),
        writes_after=len(children_after),
    )


# --------------------------------------------------------------------------- the chart, two replicas


def _render(helm: Path, release: str, namespace: str, values: dict[str, Any], tmp: Path) -> list[dict[str, Any]]:
    import yaml

    values_file = tmp / f"{release}-values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    chart = Path(__file__).resolve().parents[2] / "charts" / "kneepoint"
    proc = subprocess.run(
        [str(helm), "template", release, str(chart), "--namespace", namespace, "--values", str(values_file)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def _operator_pods(cluster: Cluster, namespace: str) -> list[Any]:
    return [
        p
        for p in cluster.core.list_namespaced_pod(namespace, label_selector="app.kubernetes.io/component=operator").items
        if not p.metadata.deletion_timestamp
    ]


def test_rolling_update_of_the_charts_two_replicas_mid_experiment(sandbox: Any, helm: Path, cluster: Cluster, tmp_path: Path) -> None:
    import yaml

    suffix = uuid.uuid4().hex[:5]
    release, system, team = f"kl-{suffix}", f"{SESSION_PREFIX}le-sys-{suffix}", f"{SESSION_PREFIX}le-team-{suffix}"
    for ns in (system, team):
        sandbox.kubectl("create", "namespace", ns)
    values = {
        "replicas": 2,
        "watchNamespaces": [team],
        "metrics": {"port": 0},  # pods are host processes here: no server on every interface
        "prometheus": {"url": sandbox.prometheus_url, "scrapeIntervalSeconds": 2},
        "extraEnv": [
            {"name": k, "value": v}
            for k, v in {
                "KNEEPOINT_METRICS_SETTLE_SECONDS": "5",
                "KNEEPOINT_POLL_SECONDS": "2",
                "KNEEPOINT_WAITING_POLL_SECONDS": "3",
                "KNEEPOINT_METRICS_DEADLINE_SECONDS": "60",
            }.items()
        ],
    }
    docs = [d for d in _render(helm, release, system, values, tmp_path) if d["kind"] != "CustomResourceDefinition"]
    manifest = tmp_path / "chart.yaml"
    manifest.write_text(yaml.safe_dump_all(docs))
    deployment = next(d["metadata"]["name"] for d in docs if d["kind"] == "Deployment")
    lease = lease_name((team,))
    name = f"roll-{suffix}"
    pods_dir = sandbox.sandbox.paths.root / "pods"
    try:
        sandbox.kubectl("apply", "--server-side", "--field-manager=kneepoint-leader-test", "-f", str(manifest))
        assert any(d["kind"] == "PodDisruptionBudget" for d in docs)
        sandbox.kubectl("rollout", "status", f"deployment/{deployment}", "-n", system, "--timeout=120s")
        before = {p.metadata.name for p in _operator_pods(cluster, system)}
        assert len(before) == 2
        holder = _wait("one of the two pods to lead", lambda: _holder(cluster, lease, system), 90)
        assert holder.split("_")[0] in before
        # A local `kneepoint operator` of the same scope finds the chart's Lease and stands by, saying so in one line.
        local = OperatorProcess(sandbox, tmp_path / "local", extra_env={"KNEEPOINT_NAMESPACES": team})
        local.start()
        try:
            _wait("the local operator to stand by", lambda: "Standby: Lease" in local.logs(), 60, interval=0.5)
            time.sleep(3)
            local_log = local.logs()
        finally:
            local.stop()
        assert local_log.count("Standby: Lease") == 1 and f"Lease {system}/{lease} " in local_log, local_log[-2000:]
        assert f"held by {holder}" in local_log and "Leading" not in local_log
        with ChildLedger(cluster.api, {team}) as ledger:
            cluster.create(experiment(name, team))
            cluster.wait(
                team, name, lambda s: (tier(s, "tp1-pp1") or {}).get("phase") == "LoadTesting", 120, "tp1 LoadTesting", interval=0.1
            )
            rolled = time.monotonic()
            sandbox.kubectl("rollout", "restart", f"deployment/{deployment}", "-n", system)
            samples: list[tuple[float, str | None]] = []

            def new_leader() -> str | None:
                current = _holder(cluster, lease, system)
                samples.append((time.monotonic() - rolled, current))
                return current if current and current.split("_")[0] not in before else None

            new_holder = _wait("a pod of the new ReplicaSet to lead", new_leader, 180, interval=0.2)
            handover = time.monotonic() - rolled
            sandbox.kubectl("rollout", "status", f"deployment/{deployment}", "-n", system, "--timeout=180s")
            final = cluster.wait_finished(team, name, 240)
        after = {p.metadata.name for p in _operator_pods(cluster, system)}
        logs = "\n".join(p.read_text(errors="replace") for p in sorted(pods_dir.glob(f"{system}_*_operator.log")))
    finally:
        try:
            cluster.delete(team, name)
            _wait("the experiment to go", lambda: cluster.get(team, name) is None, 60, interval=0.5)
        except (ApiException, AssertionError):
            pass
        sandbox.kubectl("delete", "-f", str(manifest), "--ignore-not-found", "--wait=true", "--timeout=60s", check=False)
        for ns in (team, system):
            sandbox.kubectl("delete", "namespace", ns, "--wait=false", check=False)

    assert len(after) == 2 and not (after & before), (before, after)
    assert new_holder.split("_")[0] in after
    # No moment with two holders is possible (one Lease); the gap without one is what a release saves.
    leaderless = [t for t, h in samples if not h]
    assert final["phase"] == "Decided", final.get("message")
    assert [(t["name"], t["phase"], t["attempts"]) for t in final["tiers"]] == [("tp1-pp1", "Measured", 1), ("tp2-pp1", "Measured", 1)]
    assert sorted(ledger.created("Job", team)) == [f"{team}/{name}-tp1-pp1-load1", f"{team}/{name}-tp2-pp1-load1"]
    assert ledger.duplicates(namespace=team) == {}
    assert _measured_events(cluster, team, name) == ["TP1", "TP2"]
    _no_event_twice(cluster, team, name)
    assert "Released Lease" in logs, logs[-4000:]
    print(f"rolling update: a new pod led {handover:.1f} s after `rollout restart`; samples without a holder: {len(leaderless)}")
    FaultLog().record(
        "leader-election",
        "chart replicas 2, rollout restart while tp1 load-tests",
        True,
        new_leader_after_seconds=round(handover, 1),
        duplicates=0,
        tiers_measured_twice=0,
        samples=json.dumps(samples[-5:]),
    )
