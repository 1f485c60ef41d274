"""Session fixture ``sandbox``: the real local control plane, started through the same code
as ``kneepoint sandbox up``.

A sandbox that already runs in the state dir (``KNEEPOINT_SANDBOX_DIR`` or the cache) is
reused as it is and left running; otherwise the fixture starts what is missing (building
binaries on a fresh machine) and, at the end of the session, stops only what it started.
Every test here is marked ``integration`` (deselect with ``-m 'not integration'``).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
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
