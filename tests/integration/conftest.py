"""Session fixture ``sandbox``: the real local control plane, started through the same code
as ``kneepoint sandbox up``.

A sandbox that already runs in the state dir (``KNEEPOINT_SANDBOX_DIR`` or the cache) is
reused as it is and left running; otherwise the fixture starts what is missing (building
binaries on a fresh machine) and, at the end of the session, stops only what it started.
Every test here is marked ``integration`` (deselect with ``-m 'not integration'``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any

import pytest

from kneepoint.sandbox import binaries, controlplane


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "integration: needs the sandbox control plane (started once per session)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


@dataclass
class SandboxHandle:
    """What tests need from the running sandbox."""

    sandbox: controlplane.Sandbox
    kubectl_path: Path

    @property
    def kubeconfig(self) -> Path:
        return self.sandbox.kubeconfig

    @property
    def prometheus_url(self) -> str:
        return self.sandbox.prometheus_url

    def api_client(self) -> Any:
        """A new kubernetes.client.ApiClient as the sandbox's admin (close it, or use ``with``)."""
        return controlplane.api_client(self.sandbox)

    def kubectl(self, *args: str, check: bool = True) -> Any:
        """Run the sandbox's kubectl (same release as the server) against it."""
        return controlplane.kubectl(self.sandbox, self.kubectl_path, *args, check=check)


@pytest.fixture(scope="session")
def sandbox() -> Iterator[SandboxHandle]:
    _, before = controlplane.status()
    running_before = {row.name for row in before if row.state != "stopped"}
    if not running_before:
        # Nothing runs there: start from empty state, so a test session never inherits
        # objects (or a large Prometheus WAL) from an earlier session that ended abruptly.
        # The built binaries live elsewhere (the cache) and are kept.
        controlplane.down(purge=True, say=lambda line: print(line, flush=True))
    try:
        handle = controlplane.up(say=lambda line: print(line, flush=True))
    except controlplane.SandboxError:
        # Leave nothing behind that this session started, then report the failure.
        _, after = controlplane.status()
        controlplane.down(only=[row.name for row in after if row.state != "stopped" and row.name not in running_before])
        raise
    found = binaries.find_all()
    assert found is not None
    try:
        yield SandboxHandle(handle, found.kubectl)
    finally:
        if handle.started:
            controlplane.down(only=handle.started)


# ---------------------------------------------------------------------------------------
# The operator under test, as a real process against the sandbox.


# Short timings so a tier takes seconds in the sandbox (Prometheus scrapes every 2 s there).
OPERATOR_ENV = {
    "KNEEPOINT_SCRAPE_INTERVAL": "2",
    "KNEEPOINT_METRICS_SETTLE_SECONDS": "5",
    "KNEEPOINT_METRICS_DEADLINE_SECONDS": "60",
    "KNEEPOINT_POLL_SECONDS": "2",
    "KNEEPOINT_WAITING_POLL_SECONDS": "3",
}


class OperatorProcess:
    """``kneepoint operator`` started as a subprocess; tests may kill and restart it."""

    def __init__(self, sandbox: SandboxHandle, log_dir: Path, kubeconfig: Path | None = None, extra_env: dict[str, str] | None = None):
        self.sandbox = sandbox
        self.kubeconfig = kubeconfig or sandbox.kubeconfig
        self.log_dir = log_dir
        # One leader-election identity for every start of this object: a restart after a kill is
        # the same candidate and reclaims its Lease at once, as a pod restarted in place with a
        # fixed name would (test_faults_leader starts distinct objects to test the election).
        self.extra_env = {"KNEEPOINT_LEADER_IDENTITY": f"test-operator-{uuid.uuid4().hex[:8]}", **(extra_env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"operator-{self.starts}.log"

    def start(self) -> None:
        self.starts += 1
        env = dict(os.environ)
        env.update(OPERATOR_ENV)
        env.update(
            {
                "KUBECONFIG": str(self.kubeconfig),
                "KNEEPOINT_PROMETHEUS_URL": self.sandbox.prometheus_url,
                "KNEEPOINT_METRICS_PORT": "0",
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.extra_env)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")  # noqa: SIM115 - the child keeps its own copy; ours is closed at once
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kneepoint", "operator"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()

    def kill(self) -> None:
        """SIGKILL, as a node failure or OOM kill would: no cleanup runs."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> None:
        self.kill()
        self.start()

    def logs(self) -> str:
        return "".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("operator-*.log")))


# Namespaces of this pytest session share a prefix, and the session's operator watches only
# that prefix: another session (or a person) running an operator against the same shared
# sandbox then never reconciles this session's experiments, nor this one theirs.
SESSION_PREFIX = f"t{uuid.uuid4().hex[:4]}"


def leaders_of_every_namespace(sandbox: SandboxHandle) -> list[str]:
    """Live kneepoint operators whose scope is every namespace (``kneepoint demo --keep`` leaves one):
    "<lease namespace>/<lease name> held by <identity>" for each Lease renewed within its duration."""
    from datetime import datetime

    from kubernetes import client as k8s

    from kneepoint.kube.leader_election import SCOPE_ANNOTATION

    with sandbox.api_client() as api:
        leases = k8s.CoordinationV1Api(api).list_lease_for_all_namespaces(label_selector="app.kubernetes.io/name=kneepoint").items
    now = datetime.now(UTC)
    out = []
    for lease in leases:
        spec = lease.spec
        if (lease.metadata.annotations or {}).get(SCOPE_ANNOTATION) != "*" or not spec or not spec.holder_identity:
            continue
        if spec.renew_time and (now - spec.renew_time).total_seconds() <= (spec.lease_duration_seconds or 15) + 5:
            out.append(f"{lease.metadata.namespace}/{lease.metadata.name} held by {spec.holder_identity}")
    return out


@pytest.fixture(scope="session")
def operator(sandbox: SandboxHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    """One operator for the session, watching this session's test namespaces (``SESSION_PREFIX-*``)."""
    foreign = leaders_of_every_namespace(sandbox)
    if foreign:
        # It would drive this session's experiments too: every event and child twice.
        pytest.exit(
            f"an operator watching every namespace runs in the sandbox ({'; '.join(foreign)}), e.g. from `kneepoint demo --keep`; "
            "stop it (`kneepoint sandbox down`) or run the tests on a second sandbox (docs/reliability.md: "
            "KNEEPOINT_SANDBOX_DIR, KNEEPOINT_SANDBOX_PORT_OFFSET, KNEEPOINT_SANDBOX_POD_CIDR)",
            returncode=4,
        )
    op = OperatorProcess(sandbox, tmp_path_factory.mktemp("operator"), extra_env={"KNEEPOINT_NAMESPACES": f"{SESSION_PREFIX}-*"})
    op.start()
    try:
        yield op
    finally:
        op.stop()


@pytest.fixture
def namespace(sandbox: SandboxHandle) -> Iterator[str]:
    """A fresh namespace per test; deleted afterwards (finalizers are the operator's to remove)."""
    name = f"{SESSION_PREFIX}-{uuid.uuid4().hex[:8]}"
    sandbox.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        # Experiments first, while the session's operator still runs to remove kopf's
        # finalizer: a namespace deleted around one would stay Terminating for good.
        sandbox.kubectl("delete", "parallelismexperiments.kneepoint.io", "--all", "-n", name, "--timeout=30s", check=False)
        sandbox.kubectl("delete", "namespace", name, "--wait=false", check=False)


def wait_for(predicate: Any, timeout: float, interval: float = 1.0, what: str = "condition") -> Any:
    """Poll ``predicate`` until it returns a truthy value or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last value: {last!r}")
