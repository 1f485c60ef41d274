"""The sandbox behaves like a real cluster: CRD validation, GPU scheduling, Prometheus, teardown."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from kneepoint.sandbox import controlplane, flags, processes

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "examples" / "experiment.yaml"
PRETEND = {"kneepoint.io/sandbox-pretend": "true"}


@pytest.fixture()
def namespace(sandbox: Any) -> Iterator[str]:
    name = f"t-{uuid.uuid4().hex[:8]}"
    with sandbox.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": name}})
        deadline = time.monotonic() + 30  # pods are refused until the default ServiceAccount exists
        while True:
            try:
                core.read_namespaced_service_account("default", name)
                break
            except ApiException:
                assert time.monotonic() < deadline, "no default ServiceAccount in the new namespace"
                time.sleep(0.2)
    yield name
    with sandbox.api_client() as api:
        client.CoreV1Api(api).delete_namespace(name)


def _deployment(name: str, gpus: int) -> dict[str, Any]:
    labels = {"app": name, **PRETEND}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [
                        {"name": "engine", "image": "vllm/vllm-openai:v0.11.0", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
                    ]
                },
            },
        },
    }


def _wait_pod(core: client.CoreV1Api, namespace: str, app: str, done: Any, timeout: float = 60) -> client.V1Pod:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        pods = core.list_namespaced_pod(namespace, label_selector=f"app={app}").items
        if pods:
            last = pods[0]
            if done(last):
                return last
        time.sleep(0.3)
    raise AssertionError(f"pod of {app} did not reach the expected state; last seen: {last.status if last else None}")


def test_crd_from_crds_dir_is_established(sandbox: Any) -> None:
    with sandbox.api_client() as api:
        crd = client.ApiextensionsV1Api(api).read_custom_resource_definition("parallelismexperiments.kneepoint.io")
    conditions = {c.type: c.status for c in crd.status.conditions}
    assert conditions.get("Established") == "True"
    assert crd.spec.group == "kneepoint.io"


def test_example_experiment_is_accepted_and_a_bad_one_rejected_naming_the_field(sandbox: Any, namespace: str) -> None:
    example = yaml.safe_load(EXAMPLE.read_text())
    with sandbox.api_client() as api:
        custom = client.CustomObjectsApi(api)
        created = custom.create_namespaced_custom_object("kneepoint.io", "v1alpha1", namespace, "parallelismexperiments", example)
        assert created["metadata"]["name"] == example["metadata"]["name"]
        bad = json.loads(json.dumps(example))
        bad["metadata"]["name"] = "bad-concurrency"
        bad["spec"]["load"]["concurrency"] = 0
        with pytest.raises(ApiException) as caught:
            custom.create_namespaced_custom_object("kneepoint.io", "v1alpha1", namespace, "parallelismexperiments", bad)
    assert caught.value.status == 422
    body = json.loads(caught.value.body)
    assert body["reason"] == "Invalid"
    fields = [cause.get("field") for cause in body["details"]["causes"]]
    assert "spec.load.concurrency" in fields, body


def test_eight_gpu_deployment_lands_on_an_h200_node(sandbox: Any, namespace: str) -> None:
    with sandbox.api_client() as api:
        client.AppsV1Api(api).create_namespaced_deployment(namespace, _deployment("gpu8", 8))
        core = client.CoreV1Api(api)
        pod = _wait_pod(core, namespace, "gpu8", lambda p: p.status.phase == "Running")
        node = core.read_node(pod.spec.node_name)
    assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert node.status.allocatable["nvidia.com/gpu"] == "8"
    # KWOK gave the pretend pod a loopback IP, and the API server accepted it.
    assert pod.status.pod_ip.startswith("127.")


def test_sixteen_gpu_deployment_stays_pending_unschedulable(sandbox: Any, namespace: str) -> None:
    with sandbox.api_client() as api:
        client.AppsV1Api(api).create_namespaced_deployment(namespace, _deployment("gpu16", 16))
        core = client.CoreV1Api(api)

        def unschedulable(pod: client.V1Pod) -> bool:
            return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in pod.status.conditions or [])

        pod = _wait_pod(core, namespace, "gpu16", unschedulable)
    assert pod.status.phase == "Pending"
    assert pod.spec.node_name is None
    message = next(c.message for c in pod.status.conditions if c.type == "PodScheduled")
    assert "Insufficient nvidia.com/gpu" in message


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.loads(resp.read())


def test_prometheus_is_ready_and_scraping_the_control_plane(sandbox: Any) -> None:
    with urllib.request.urlopen(f"{sandbox.prometheus_url}/-/ready", timeout=10) as resp:
        assert resp.status == 200
    deadline = time.monotonic() + 30
    while True:
        targets = _get_json(f"{sandbox.prometheus_url}/api/v1/targets")["data"]["activeTargets"]
        health = {t["labels"]["job"]: t["health"] for t in targets}
        wanted = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "prometheus")
        if all(health.get(job) == "up" for job in wanted) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert {job: health.get(job) for job in wanted} == dict.fromkeys(wanted, "up")
    result = _get_json(f"{sandbox.prometheus_url}/api/v1/query?query=up%7Bjob%3D%22kube-apiserver%22%7D")
    assert result["data"]["result"][0]["value"][1] == "1"


def test_prometheus_discovers_engine_pods_by_label(sandbox: Any, namespace: str) -> None:
    """An engine pod (pretend, so KWOK runs it) shows up as vllm and dcgm targets at its loopback IP."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "engine-0", "labels": {"kneepoint.io/role": "engine", "kneepoint.io/tier": "tp1-pp1", **PRETEND}},
        "spec": {
            "containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.11.0", "ports": [{"name": "http", "containerPort": 8000}]}]
        },
    }
    with sandbox.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespaced_pod(namespace, pod)
        deadline = time.monotonic() + 30
        while not core.read_namespaced_pod("engine-0", namespace).status.pod_ip:
            assert time.monotonic() < deadline
            time.sleep(0.3)
        ip = core.read_namespaced_pod("engine-0", namespace).status.pod_ip
    deadline = time.monotonic() + 30
    found: dict[str, dict[str, Any]] = {}
    while time.monotonic() < deadline and len(found) < 2:
        for target in _get_json(f"{sandbox.prometheus_url}/api/v1/targets")["data"]["activeTargets"]:
            if target["labels"].get("namespace") == namespace and target["labels"]["job"] in ("vllm", "dcgm"):
                found[target["labels"]["job"]] = target
        time.sleep(1)
    assert set(found) == {"vllm", "dcgm"}
    assert found["vllm"]["labels"]["instance"] == f"{ip}:8000"
    assert found["dcgm"]["labels"]["instance"] == f"{ip}:9400"
    assert found["vllm"]["labels"]["pod"] == "engine-0"
    assert found["vllm"]["labels"]["tier"] == "tp1-pp1"


def test_service_accounts_are_subject_to_rbac(sandbox: Any, namespace: str) -> None:
    proc = sandbox.kubectl("auth", "can-i", "list", "nodes", f"--as=system:serviceaccount:{namespace}:default", check=False)
    assert proc.stdout.strip() == "no"
    proc = sandbox.kubectl("auth", "can-i", "list", "nodes")
    assert proc.stdout.strip() == "yes"


def _free_offset() -> int:
    """A port offset whose every port is free on loopback and below the ephemeral range (for a second sandbox)."""
    return controlplane.free_port_offset(start=20000)


def test_up_is_idempotent_and_down_leaves_no_process(sandbox: Any, tmp_path: Path) -> None:
    """A second sandbox in its own state dir on other ports: up, up again (reuse), down."""
    state = tmp_path / "state"
    offset = _free_offset()
    shared_before = {row.name: row.pid for row in controlplane.status()[1]}
    env = {**os.environ, "KNEEPOINT_SANDBOX_DIR": str(state)}
    cli = [sys.executable, "-m", "kneepoint", "sandbox"]
    first = subprocess.run([*cli, "up", "--port-offset", str(offset), "--no-runner"], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    second = subprocess.run([*cli, "up", "--no-runner"], env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "everything reused" in second.stdout
    # A changed fleet file reshapes the nodes without restarting anything.
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        yaml.safe_dump(
            {
                "kind": "SandboxFleet",
                "nodeGroups": [
                    {
                        "namePrefix": "h200",
                        "count": 3,
                        "gpuProduct": "NVIDIA-H200",
                        "gpuCount": 8,
                        "gpuMemoryMiB": 143771,
                        "interconnect": "nvlink",
                        "cpu": "192",
                        "memory": "2Ti",
                        "labels": {"zone": "b"},
                    },
                ],
            }
        )
    )
    third = subprocess.run([*cli, "up", "--no-runner", "--fleet", str(fleet)], env=env, capture_output=True, text=True, timeout=120)
    assert third.returncode == 0, third.stdout + third.stderr
    assert "everything reused" in third.stdout
    assert "created h200-2" in third.stdout and "deleted l40s-0" in third.stdout
    sandbox2 = controlplane.resolve(state)
    with controlplane.api_client(sandbox2) as api:
        nodes = client.CoreV1Api(api).list_node().items
    assert sorted(n.metadata.name for n in nodes) == ["h200-0", "h200-1", "h200-2"]
    assert all(n.metadata.labels["zone"] == "b" for n in nodes)

    marker = str(state.resolve())
    pids = {p.pid for p in processes.marked_processes(marker)}
    assert len(pids) >= 6  # etcd, apiserver, controller-manager, scheduler, kwok, prometheus
    status = subprocess.run([*cli, "status"], env=env, capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stdout
    assert f"export KUBECONFIG={state.resolve() / 'kubeconfig'}" in status.stdout

    down = subprocess.run([*cli, "down"], env=env, capture_output=True, text=True, timeout=120)
    assert down.returncode == 0, down.stdout + down.stderr
    assert processes.marked_processes(marker) == []
    for pid in pids:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    # Its ports are free again; the shared sandbox was not touched.
    from kneepoint.sandbox.layout import Ports

    deadline = time.monotonic() + 10  # sockets of killed processes may take a moment to close
    while True:
        busy = {p: processes.port_owner(p) for p in Ports().shifted(offset).as_dict().values() if processes.port_in_use(p)}
        if not busy or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert busy == {}
    # Untouched means the same processes are still alive; their health probes (2 s each) may
    # lag while two control planes share two cores, so health is given a while to settle.
    # The optional components (LWS, the runner) run only when asked for: same pid or none.
    deadline = time.monotonic() + 60
    while True:
        rows = controlplane.status()[1]
        required = [row for row in rows if row.name not in flags.OPTIONAL_COMPONENTS]
        if all(row.state == "running" for row in required) or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert {row.name: row.pid for row in rows} == shared_before
    assert all(row.state == "running" for row in required), [(r.name, r.state, r.detail) for r in required]


def test_a_port_taken_by_another_program_is_named(tmp_path: Path) -> None:
    offset = _free_offset()
    from kneepoint.sandbox.layout import Ports

    port = Ports().shifted(offset).etcd_client
    with socket.socket() as blocker:
        blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the port may be in TIME_WAIT
        blocker.bind(("127.0.0.1", port))
        blocker.listen()
        env = {**os.environ, "KNEEPOINT_SANDBOX_DIR": str(tmp_path / "state")}
        proc = subprocess.run(
            [sys.executable, "-m", "kneepoint", "sandbox", "up", "--port-offset", str(offset), "--no-runner"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 1
    assert f"port 127.0.0.1:{port} is taken by pid {os.getpid()}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_node_that_goes_not_ready_comes_back_with_its_addresses(sandbox: Any) -> None:
    """Stop 31's CI: the nodes went NotReady while the API server restarted (their leases late), KWOK's
    node-initialize stage set them Ready again and cleared their addresses, and the API server, which dials a
    node's InternalIP for pod logs, answered every log read of h200-0 with 500 "no preferred addresses found"."""
    node = "l40s-0"
    with sandbox.api_client() as api:
        core = client.CoreV1Api(api)
        before = core.read_node_status(node).status
        assert any(a.type == "InternalIP" for a in before.addresses or []), before.addresses
        not_ready = {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KneepointTest", "message": "lease late"}]}}
        core.patch_node_status(node, not_ready)
        deadline = time.monotonic() + 30
        while True:
            status = core.read_node_status(node).status
            ready = next(c for c in status.conditions if c.type == "Ready")
            if (ready.status == "True" and ready.reason != "KneepointTest") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert ready.status == "True", ready  # KWOK set it Ready again
        assert [(a.type, a.address) for a in status.addresses or []] == [(a.type, a.address) for a in before.addresses]
        assert status.daemon_endpoints.kubelet_endpoint.port == before.daemon_endpoints.kubelet_endpoint.port
        assert status.allocatable == before.allocatable
