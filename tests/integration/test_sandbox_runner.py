"""The pod runner against the real sandbox: engines serve, Jobs finish, Prometheus scrapes.

Each test works in its own namespace of the shared ``sandbox`` (its runner is the
``runner`` component that ``kneepoint sandbox up`` starts). The engine is the vLLM image,
run by the runner as ``kneepoint sim``; the load test is ``kneepoint loadgen`` reaching the
engine through its Service's DNS name (``KNEEPOINT_RESOLVE``).
"""

from __future__ import annotations

import importlib.util
import json
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

pytestmark = pytest.mark.slow

SUMMARY_KEYS = {
    "v", "ok", "outputTokensPerSecond", "totalTokensPerSecond", "requestsPerSecond", "ttftP50Ms", "ttftP90Ms",
    "ttftP95Ms", "ttftP99Ms", "ttftMeanMs", "tpotMeanMs", "tpotP99Ms", "itlP99Ms", "latencyP50Ms", "latencyP90Ms",
    "latencyP95Ms", "latencyP99Ms", "latencyMeanMs", "completed", "failed", "errorFraction", "errors",
    "inputTokensAsked", "inputTokensServed", "outputTokensAsked", "outputTokensServed", "concurrency", "repeats",
    "keptRepeat", "repeatOutputTokensPerSecond", "clientLimited", "clientCpuPeak", "loopLagP99Ms", "startedAt",
    "finishedAt", "durationSeconds",
}  # fmt: skip # a key list, filled to the line


def _needs(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not there yet (written by another part of the project)")


def _wait(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


@pytest.fixture()
def api(sandbox: Any) -> Iterator[client.ApiClient]:
    with sandbox.api_client() as api_client:
        yield api_client


@pytest.fixture()
def namespace(api: client.ApiClient) -> Iterator[str]:
    core = client.CoreV1Api(api)
    name = f"runner-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})

    def default_sa() -> bool:
        try:
            core.read_namespaced_service_account("default", name)
            return True
        except ApiException:
            return False

    _wait("the default ServiceAccount", default_sa, 30, 0.2)
    yield name
    core.delete_namespace(name)


def engine_objects(name: str, architecture: str = "llama-3-8b", gpus: int = 1, product: str = "NVIDIA-H200") -> list[dict[str, Any]]:
    """A vLLM Deployment and its Service, shaped like the operator's (CONTRACTS E)."""
    labels = {"app": name, "kneepoint.io/role": "engine"}
    container = {
        "name": "engine",
        "image": "vllm/vllm-openai:v0.33.0",
        "args": [
            "--model",
            "m",
            "--served-model-name",
            "m",
            "--tensor-parallel-size",
            str(gpus),
            "--max-num-seqs",
            "16",
            "--max-model-len",
            "4096",
            "--host",
            "0.0.0.0",
            "--port",
            "8000",
        ],
        "env": [
            {"name": "KNEEPOINT_SIM_ARCHITECTURE", "value": architecture},
            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "CONTAINER_NAME", "value": "engine"},
        ],
        "ports": [{"name": "http", "containerPort": 8000}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 1},
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "containers": [container],
                    "nodeSelector": {"nvidia.com/gpu.product": product},
                    "terminationGracePeriodSeconds": 5,
                },
            },
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": labels, "ports": [{"name": "http", "port": 8000, "targetPort": "http"}]},
    }
    return [deployment, service]


def loadgen_job(name: str, endpoint: str) -> dict[str, Any]:
    """A load-test Job like the operator's: its summary comes back as the termination message."""
    args = ["--endpoint", endpoint, "--model", "m", "--api", "completions", "--concurrency", "4", "--num-requests", "40",
            "--input-len", "128", "--output-len", "32", "--seed", "1", "--warmup-requests", "2", "--repeats", "1", "--no-progress"]  # fmt: skip # argv: each flag beside its value
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": {"kneepoint.io/role": "loadtest"}},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"kneepoint.io/role": "loadtest"}},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "containers": [
                        {"name": "loadgen", "image": "ghcr.io/kneepoint/kneepoint:0.1.0", "command": ["kneepoint", "loadgen"], "args": args}
                    ],
                },
            },
        },
    }


def create(api: client.ApiClient, namespace: str, objects: list[dict[str, Any]]) -> None:
    for obj in objects:
        if obj["kind"] == "Deployment":
            client.AppsV1Api(api).create_namespaced_deployment(namespace, obj)
        elif obj["kind"] == "Service":
            client.CoreV1Api(api).create_namespaced_service(namespace, obj)
        elif obj["kind"] == "Job":
            client.BatchV1Api(api).create_namespaced_job(namespace, obj)
        else:
            raise ValueError(obj["kind"])


def condition(obj: Any, kind: str) -> str | None:
    for entry in (obj.status.conditions or []) if obj.status else []:
        if entry.type == kind:
            return str(entry.status)
    return None


def pods_of(api: client.ApiClient, namespace: str, selector: str) -> list[client.V1Pod]:
    return list(client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=selector).items)


def wait_available(api: client.ApiClient, namespace: str, name: str, timeout: float = 90) -> client.V1Pod:
    apps = client.AppsV1Api(api)
    _wait(
        f"Deployment {name} Available", lambda: condition(apps.read_namespaced_deployment(name, namespace), "Available") == "True", timeout
    )
    (pod,) = [p for p in pods_of(api, namespace, f"app={name}") if p.metadata.deletion_timestamp is None]
    return pod


def prometheus_query(url: str, query: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode({'query': query})}", timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def simulator_processes(pod_ip: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "sim" in cmdline and "--host" in cmdline and pod_ip in cmdline:
            found.append(process)
    return found


def test_engine_serves_loadgen_job_completes_and_prometheus_scrapes(sandbox: Any, api: client.ApiClient, namespace: str) -> None:
    _needs("kneepoint.simulator.command")
    _needs("kneepoint.loadgen.command")
    create(api, namespace, engine_objects("engine"))
    pod = wait_available(api, namespace, "engine")
    assert pod.status.pod_ip.startswith("127.") and pod.status.pod_ip != "127.0.0.1"
    assert pod.status.container_statuses[0].ready

    create(api, namespace, [loadgen_job("load", f"http://engine.{namespace}.svc.cluster.local:8000")])
    batch = client.BatchV1Api(api)
    _wait(
        "Job load to finish",
        lambda: (
            condition(batch.read_namespaced_job("load", namespace), "Complete") == "True"
            or condition(batch.read_namespaced_job("load", namespace), "Failed") == "True"
        ),
        180,
    )
    (job_pod,) = pods_of(api, namespace, "job-name=load")
    terminated = job_pod.status.container_statuses[0].state.terminated
    assert condition(batch.read_namespaced_job("load", namespace), "Complete") == "True", terminated
    assert job_pod.status.phase == "Succeeded" and terminated.exit_code == 0 and terminated.reason == "Completed"
    summary = json.loads(terminated.message)
    assert set(summary) >= SUMMARY_KEYS, SUMMARY_KEYS - set(summary)
    assert summary["v"] == 1 and summary["ok"] is True
    assert summary["completed"] == 40 and summary["failed"] == 0
    assert summary["outputTokensPerSecond"] > 0

    labels = f'namespace="{namespace}",pod="{pod.metadata.name}"'
    for metric in ("vllm:num_requests_running", "DCGM_FI_DEV_FB_USED"):
        series = _wait(f"{metric} in Prometheus", lambda m=metric: prometheus_query(sandbox.prometheus_url, f"{m}{{{labels}}}"), 30, 1.0)
        assert series[0]["metric"]["pod"] == pod.metadata.name


def test_service_account_kubeconfig_acts_as_the_pod(sandbox: Any, api: client.ApiClient, namespace: str) -> None:
    _needs("kneepoint.simulator.command")
    create(api, namespace, engine_objects("engine"))
    pod = wait_available(api, namespace, "engine")
    kubeconfig = sandbox.sandbox.paths.root / "runner" / "pods" / pod.metadata.uid / "kubeconfig"
    assert kubeconfig.exists()
    with config.new_client_from_config(config_file=str(kubeconfig)) as as_pod:
        review = client.AuthenticationV1Api(as_pod).create_self_subject_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        )
        assert review.status.user_info.username == f"system:serviceaccount:{namespace}:default"
        assert review.status.user_info.extra["authentication.kubernetes.io/pod-name"] == [pod.metadata.name]
        with pytest.raises(ApiException) as denied:
            client.CoreV1Api(as_pod).list_namespaced_secret(namespace)
        assert denied.value.status == 403  # RBAC applies: the default ServiceAccount may not read Secrets


def test_deleted_engine_stops_and_oom_engine_is_reported(sandbox: Any, api: client.ApiClient, namespace: str) -> None:
    _needs("kneepoint.simulator.command")
    create(api, namespace, engine_objects("engine"))
    pod = wait_available(api, namespace, "engine")
    running = simulator_processes(pod.status.pod_ip)
    assert len(running) == 1
    client.AppsV1Api(api).delete_namespaced_deployment("engine", namespace)
    _wait("the engine pod to go", lambda: not pods_of(api, namespace, "app=engine"), 30)
    _wait("the simulator process to end", lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in running), 15)

    # 70B weights in bf16 (~140 GB) do not fit one 46 GB L40S: the simulator exits like vLLM's OOM.
    create(api, namespace, engine_objects("big", architecture="llama-3-70b", product="NVIDIA-L40S"))

    def oom_reported() -> Any:
        pods = pods_of(api, namespace, "app=big")
        statuses = (pods[0].status.container_statuses or []) if pods else []
        last = statuses[0].last_state.terminated if statuses and statuses[0].last_state else None
        return last if last is not None else None

    last = _wait("the OOM exit of the big engine", oom_reported, 60)
    # As on a real kubelet: vLLM's refusal is an ordinary Error (the kernel's OOM killer was not
    # involved), and its termination message (the log's tail) holds the API server's traceback only.
    assert last.exit_code == 1 and last.reason == "Error"
    assert "RuntimeError: Engine core initialization failed" in last.message and "out of memory" not in last.message
    # The cause is in the log, which the API server serves through KWOK (kubectl logs --previous).
    big = pods_of(api, namespace, "app=big")[0]
    core = client.CoreV1Api(api)
    previous = core.read_namespaced_pod_log(big.metadata.name, namespace, container="engine", previous=True)
    assert "torch.OutOfMemoryError: CUDA out of memory" in previous and previous.rstrip().endswith("Failed core proc(s): {}")
    tail = core.read_namespaced_pod_log(big.metadata.name, namespace, container="engine", previous=True, tail_lines=3)
    assert len(tail.splitlines()) == 3 and tail.rstrip().endswith("Failed core proc(s): {}")
