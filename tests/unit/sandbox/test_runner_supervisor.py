"""One pod under the runner, with real processes and an in-memory stand-in for the API.

The stand-in keeps one pod, applies status patches to it the way the API server's
strategic merge does for the fields the runner writes, and records deletions. The
processes are real: ``kneepoint --version`` (exits 0) and ``kneepoint --bogus`` (exits 2).
"""

from __future__ import annotations

import asyncio
import copy
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from kneepoint.sandbox.runner.ipam import LoopbackPool
from kneepoint.sandbox.runner.pods import LOST_REASON, PodSupervisor, RunnerSettings
from kneepoint.sandbox.runner.resolve import ResolveMap


class MemoryApi:
    """The calls a supervisor makes, against one pod held in memory."""

    server = "https://127.0.0.1:6443"
    ca_data = "Q0E="

    def __init__(self, pod: dict[str, Any]) -> None:
        self.pod = pod
        self.patches: list[dict[str, Any]] = []
        self.deleted: list[tuple[str, str, str]] = []

    def patch_pod_status(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any] | None:
        if self.deleted:
            return None
        self.patches.append(copy.deepcopy(body))
        status = self.pod.setdefault("status", {})
        for key, value in body["status"].items():
            if key == "conditions":
                merged = {c["type"]: c for c in status.get("conditions", [])}
                merged.update({c["type"]: c for c in value})
                status["conditions"] = list(merged.values())
            elif key == "podIPs":
                status[key] = [v for v in value if "$patch" not in v]
            else:
                status[key] = value
        self.pod["metadata"]["resourceVersion"] = str(int(self.pod["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(self.pod)

    def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        self.deleted.append((namespace, name, uid))

    def read_config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        return None

    def read_secret(self, namespace: str, name: str) -> dict[str, str] | None:
        return None

    def request_token(self, *args: Any) -> tuple[str, float]:
        raise AssertionError("these pods mount no token")


class Services:
    """The runner side of a supervisor."""

    def __init__(self, tmp_path: Path, api: MemoryApi, session: aiohttp.ClientSession) -> None:
        self.settings = RunnerSettings(
            state_dir=tmp_path,
            python=sys.executable,
            crash_backoff_seconds=0.1,
            crash_backoff_max_seconds=0.2,
            status_debounce_seconds=0.01,
        )
        self.gateway = api
        self.pool = LoopbackPool("127.2.0.0/24")
        self.session = session

    def node(self, name: str) -> Mapping[str, Any] | None:
        return {"metadata": {"name": name, "labels": {}}}

    def resolve_map(self, namespace: str) -> ResolveMap:
        return ResolveMap(entries=())


def make_pod(command: list[str], policy: str, status: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1", "resourceVersion": "1", "generation": 1},
        "spec": {
            "nodeName": "h200-0",
            "restartPolicy": policy,
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "c", "image": "ghcr.io/kneepoint/kneepoint:0.1.0", "command": command}],
        },
        "status": status or {"phase": "Pending"},
    }


async def until(check: Any, timeout: float = 20.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.05)


@pytest.fixture()
async def session() -> Any:
    async with aiohttp.ClientSession() as http:
        yield http


def container(api: MemoryApi) -> dict[str, Any]:
    return dict(api.pod["status"].get("containerStatuses", [{}])[0])


async def test_job_pod_succeeds_and_frees_its_address(tmp_path: Path, session: aiohttp.ClientSession) -> None:
    api = MemoryApi(make_pod(["kneepoint", "--version"], "Never"))
    services = Services(tmp_path, api, session)
    supervisor = PodSupervisor(services, copy.deepcopy(api.pod))
    supervisor.start()
    await until(lambda: api.pod["status"]["phase"] == "Succeeded")
    status = api.pod["status"]
    assert status["podIP"] == "127.2.0.1" and status["hostIP"] == "127.0.0.1"
    assert api.patches[0]["status"]["phase"] in ("Pending", "Running")
    assert container(api)["state"]["terminated"]["exitCode"] == 0
    assert container(api)["state"]["terminated"]["reason"] == "Completed"
    await until(lambda: len(services.pool) == 0)
    assert "kneepoint" in (tmp_path / "pods" / "ns_p_c.log").read_text()
    supervisor.vanished()
    await asyncio.wait_for(supervisor.finished.wait(), 10)


async def test_always_pod_crash_loops_with_backoff(tmp_path: Path, session: aiohttp.ClientSession) -> None:
    api = MemoryApi(make_pod(["kneepoint", "--bogus"], "Always"))
    supervisor = PodSupervisor(Services(tmp_path, api, session), copy.deepcopy(api.pod))
    supervisor.start()
    await until(lambda: container(api).get("restartCount", 0) >= 2)
    assert api.pod["status"]["phase"] == "Running"
    assert container(api)["lastState"]["terminated"]["exitCode"] == 2
    assert any(p["status"]["containerStatuses"][0]["state"].get("waiting", {}).get("reason") == "CrashLoopBackOff" for p in api.patches)
    api.pod["metadata"]["deletionTimestamp"] = "2026-11-29T10:00:00Z"
    supervisor.update(copy.deepcopy(api.pod))
    await asyncio.wait_for(supervisor.finished.wait(), 10)
    assert api.deleted == [("ns", "p", "uid-1")]


async def test_adopted_job_pod_whose_process_is_gone_fails(tmp_path: Path, session: aiohttp.ClientSession) -> None:
    before = {
        "phase": "Running",
        "podIP": "127.2.0.9",
        "startTime": "2026-11-29T10:00:00Z",
        "containerStatuses": [{"name": "c", "restartCount": 0, "state": {"running": {"startedAt": "2026-11-29T10:00:01Z"}}}],
    }
    api = MemoryApi(make_pod(["kneepoint", "--version"], "Never", before))
    services = Services(tmp_path, api, session)
    supervisor = PodSupervisor(services, copy.deepcopy(api.pod))
    supervisor.start()
    await until(lambda: api.pod["status"]["phase"] == "Failed")
    terminated = container(api)["state"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (137, LOST_REASON)
    assert api.pod["status"]["podIP"] == "127.2.0.9" and api.pod["status"]["startTime"] == "2026-11-29T10:00:00Z"
    supervisor.vanished()
    await asyncio.wait_for(supervisor.finished.wait(), 10)


async def test_adopted_deployment_pod_restarts_on_its_address(tmp_path: Path, session: aiohttp.ClientSession) -> None:
    before = {
        "phase": "Running",
        "podIP": "127.2.0.9",
        "containerStatuses": [{"name": "c", "restartCount": 3, "state": {"running": {"startedAt": "2026-11-29T10:00:01Z"}}}],
    }
    api = MemoryApi(make_pod(["kneepoint", "--bogus"], "Always", before))
    services = Services(tmp_path, api, session)
    supervisor = PodSupervisor(services, copy.deepcopy(api.pod))
    supervisor.start()
    await until(lambda: container(api).get("restartCount", 0) >= 4)
    first = next(p for p in api.patches if p["status"]["containerStatuses"][0]["restartCount"] == 4)
    assert first["status"]["containerStatuses"][0]["lastState"]["terminated"]["reason"] == LOST_REASON
    assert services.pool.address_of("uid-1") == "127.2.0.9"
    supervisor.vanished()
    await asyncio.wait_for(supervisor.finished.wait(), 10)
    assert api.deleted == [] and len(services.pool) == 0


async def test_runner_shutdown_stops_without_restarting(tmp_path: Path, session: aiohttp.ClientSession) -> None:
    # An interpreter stand-in that runs for a minute: the supervisor only sees a long-running process.
    sleeper = tmp_path / "python"
    sleeper.write_text("#!/bin/sh\nexec sleep 60\n")
    sleeper.chmod(0o755)
    api = MemoryApi(make_pod(["kneepoint", "operator"], "Always"))
    services = Services(tmp_path, api, session)
    services.settings = RunnerSettings(state_dir=tmp_path, python=str(sleeper), status_debounce_seconds=0.01)
    supervisor = PodSupervisor(services, copy.deepcopy(api.pod))
    supervisor.start()
    await until(lambda: "running" in container(api).get("state", {}))
    (process,) = supervisor.processes.values()
    pid = process.pid
    patches = len(api.patches)
    await asyncio.wait_for(supervisor.shutdown(5.0), 10)
    await asyncio.sleep(0.3)
    assert supervisor.processes == {}
    assert len(api.patches) == patches  # the pod's status is left as it was
    assert api.deleted == []
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    # No restarted container outlives the shutdown either.
    assert [p for p in psutil.Process().children(recursive=True) if p.name() == "sleep"] == []
