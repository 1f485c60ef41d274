"""Faults: the API server and Prometheus restart while an experiment runs.

The sandbox's own processes are stopped through its process records
(``controlplane.down(only=[...])``: SIGTERM to the component's process group, SIGKILL after
10 s) and started again by a second ``controlplane.up()``, which starts what is missing and
reuses the rest, exactly as ``kneepoint sandbox up`` would. Each test restores the
component even when it fails.

- API server: stopped while the first tier's load test runs, down for about 10 s. The
  operator (the same process throughout) must reconnect and finish: Decided with the rules'
  decision, each tier measured once, no child created twice, nothing left.
- Prometheus: stopped the moment the first tier's load test ends, so every query of its
  window fails; started again about 12 s later (its data is on disk; it answers once it
  has replayed its WAL). The user sees MetricsAvailable False / PrometheusUnreachable
  while it is down; then the tier gets its metrics (nothing missing) and the experiment is
  Decided. This test runs its own operator with a 300 s metrics deadline, so the outcome
  does not depend on how long the replay takes.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import OperatorProcess
from experiment_api import Cluster, condition, experiment, tier
from fault_harness import ChildLedger, FaultLog

from kneepoint.sandbox import controlplane


def _restart(sandbox: Any, component: str) -> float:
    """Start ``component`` again (and anything else missing); returns the seconds it took."""
    root = sandbox.sandbox.paths.root
    fleet = json.loads((root / "sandbox.json").read_text()).get("fleet")
    began = time.monotonic()
    controlplane.up(state_dir=root, fleet_path=Path(fleet) if fleet else None, say=lambda line: None)
    return time.monotonic() - began


@pytest.fixture
def restorer(sandbox: Any) -> Iterator[list[str]]:
    """Components a test stopped; started again at teardown whatever happened."""
    stopped: list[str] = []
    yield stopped
    if stopped:
        _restart(sandbox, stopped[0])


def _stop(sandbox: Any, component: str, stopped: list[str]) -> None:
    stopped.append(component)
    left = controlplane.down(state_dir=sandbox.sandbox.paths.root, only=[component], say=lambda line: None)
    assert left == [], left


class _Api:
    """A status reader that tolerates the API server being away (it answers None then)."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster

    def status(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            obj = self.cluster.get(namespace, name)
            return (obj or {}).get("status") or {}
        except Exception:  # noqa: BLE001 - connection refused while it restarts
            return None


def test_api_server_restart_mid_experiment(sandbox: Any, operator: Any, namespace: str, restorer: list[str]) -> None:
    name = f"api-{uuid.uuid4().hex[:5]}"
    with sandbox.api_client() as api:
        cluster = Cluster(api)
        with ChildLedger(api, {namespace}) as ledger:
            cluster.create(experiment(name, namespace, {"load": {"numRequests": 120}}))
            cluster.wait(
                namespace, name, lambda s: (tier(s, "tp1-pp1") or {}).get("phase") == "LoadTesting", 90, "tp1 LoadTesting", interval=0.2
            )
            down_at = time.monotonic()
            _stop(sandbox, "kube-apiserver", restorer)
            assert _Api(cluster).status(namespace, name) is None  # it is really down
            time.sleep(8)
            up_seconds = _restart(sandbox, "kube-apiserver")
            restorer.clear()
            back_at = time.monotonic()
            before = cluster.status(namespace, name)

            # The operator's next status write after the API server came back.
            def progressed(s: dict[str, Any]) -> bool:
                return s != before and s.get("observedGeneration") is not None

            cluster.wait(namespace, name, progressed, 120, "a status write after the restart")
            resumed = time.monotonic() - back_at
            final = cluster.wait_finished(namespace, name, 240)
    assert operator.proc.poll() is None, "the operator process must have lived through it"
    assert final["phase"] == "Decided", final
    assert (final["decision"]["tensorParallel"], final["decision"]["rule"]) == (2, "last-tier")
    assert [(t["name"], t["phase"], t["attempts"]) for t in final["tiers"]] == [("tp1-pp1", "Measured", 1), ("tp2-pp1", "Measured", 1)]
    assert ledger.duplicates(namespace=namespace) == {}
    assert ledger.reconnects >= 1  # the ledger itself saw the API server go away
    assert cluster.workload_names(namespace, name) == {"deployments": [], "services": [], "jobs": [], "pods": []}
    assert cluster.gpus_held([namespace]) == {}
    FaultLog().record(
        "control-plane-restart",
        "kube-apiserver stopped ~10 s mid load test",
        True,
        down_seconds=round(back_at - down_at, 1),
        apiserver_start_seconds=round(up_seconds, 1),
        operator_resumed_seconds=round(resumed, 1),
    )


def test_prometheus_restart_while_a_tier_collects(sandbox: Any, restorer: list[str], tmp_path: Path) -> None:
    # Its own operator, with a metrics deadline longer than any restart: a restarted Prometheus
    # replays its WAL before it answers (a minute for a sandbox used for an hour or two), and
    # the outcome must not depend on that.
    namespace = f"kpf-prom-{uuid.uuid4().hex[:6]}"
    name = "prom"
    sandbox.kubectl("create", "namespace", namespace)
    op = OperatorProcess(
        sandbox,
        tmp_path / "operator",
        # A settle longer than the load test's unmeasured profiled slice (docs/trace.md): the settle counts from
        # the measured window's end, so without it the tier is Collecting for one pass only and the test misses it.
        extra_env={
            "KNEEPOINT_NAMESPACES": namespace,
            "KNEEPOINT_METRICS_DEADLINE_SECONDS": "300",
            "KNEEPOINT_METRICS_SETTLE_SECONDS": "40",
        },
    )
    op.start()
    try:
        with sandbox.api_client() as api:
            cluster = Cluster(api)
            cluster.create(experiment(name, namespace, {"tiers": {"tensorParallel": [1]}}))
            cluster.wait(
                namespace, name, lambda s: (tier(s, "tp1-pp1") or {}).get("phase") == "Collecting", 90, "tp1 Collecting", interval=0.1
            )
            _stop(sandbox, "prometheus", restorer)
            down_at = time.monotonic()
            seen = cluster.wait(
                namespace,
                name,
                lambda s: (condition(s, "MetricsAvailable") or {}).get("reason") == "PrometheusUnreachable",
                60,
                "PrometheusUnreachable",
            )
            assert "retrying" in condition(seen, "MetricsAvailable")["message"]
            assert tier(seen, "tp1-pp1")["phase"] == "Collecting"
            time.sleep(max(0.0, 12 - (time.monotonic() - down_at)))
            start_seconds = _restart(sandbox, "prometheus")
            restorer.clear()
            back_at = time.monotonic()
            final = cluster.wait_finished(namespace, name, 120)
            recovered = time.monotonic() - back_at
    finally:
        sandbox.kubectl("delete", "parallelismexperiments.kneepoint.io", "--all", "-n", namespace, "--timeout=30s", check=False)
        op.stop()
        sandbox.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    assert final["phase"] == "Decided", final
    tp1 = tier(final, "tp1-pp1")
    assert tp1["phase"] == "Measured" and not tp1.get("missingMetrics"), tp1
    assert tp1.get("peakMemoryGiB") is not None and tp1.get("kvCacheUsagePeak") is not None, tp1
    assert condition(final, "MetricsAvailable")["status"] == "True", condition(final, "MetricsAvailable")
    assert not final["decision"].get("unevaluatedRules"), final["decision"]
    FaultLog().record(
        "control-plane-restart",
        "Prometheus stopped while a tier collects",
        True,
        down_seconds=round(back_at - down_at, 1),
        prometheus_start_seconds=round(start_seconds, 1),
        recovered_seconds=round(recovered, 1),
    )
