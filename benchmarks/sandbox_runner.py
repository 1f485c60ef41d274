"""How fast the sandbox's pod runner brings pods up and down, and what it costs.

Against a running sandbox (``kneepoint sandbox up``; ``KNEEPOINT_SANDBOX_DIR`` picks one),
in a fresh namespace, ROUNDS times:

1. an engine Deployment (vLLM image -> ``kneepoint sim``, llama-3-8b on one H200, model
   load 2 s, readiness probe every 1 s) and its Service: seconds from create to the pod
   Running, to Ready and to the Deployment Available;
2. a load-test Job (``kneepoint loadgen``, 40 requests of 128 -> 32 tokens at
   concurrency 4, through the Service's DNS name): seconds from create to Complete, and
   the summary's output tokens/s;
3. deleting the Deployment: seconds until the pod is gone and the simulator process ended.

It also prints the runner process's CPU seconds and resident memory over the run.

Run: ``.venv/bin/python benchmarks/sandbox_runner.py [ROUNDS]`` (about 15 s per round).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psutil
from kubernetes import client

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from test_sandbox_runner import engine_objects, loadgen_job, simulator_processes  # noqa: E402 - after the sys.path entry above

from kneepoint.sandbox import controlplane, processes  # noqa: E402 - after the sys.path entry above


def _until(check: Any, timeout: float = 120.0) -> float:
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise TimeoutError("gave up")
        time.sleep(0.05)
    return time.monotonic()


def _ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))


def one_round(api: client.ApiClient, namespace: str) -> dict[str, float]:
    core, apps, batch = client.CoreV1Api(api), client.AppsV1Api(api), client.BatchV1Api(api)
    deployment, service = engine_objects("engine")
    began = time.monotonic()
    apps.create_namespaced_deployment(namespace, deployment)
    core.create_namespaced_service(namespace, service)

    def engine_pods() -> list[client.V1Pod]:
        return [p for p in core.list_namespaced_pod(namespace, label_selector="app=engine").items if p.metadata.deletion_timestamp is None]

    running = _until(lambda: any(p.status.phase == "Running" for p in engine_pods()))
    ready = _until(lambda: any(_ready(p) for p in engine_pods()))
    available = _until(
        lambda: any(
            c.type == "Available" and c.status == "True"
            for c in (apps.read_namespaced_deployment("engine", namespace).status.conditions or [])
        )
    )
    (pod,) = engine_pods()
    job_began = time.monotonic()
    batch.create_namespaced_job(namespace, loadgen_job("load", f"http://engine.{namespace}.svc.cluster.local:8000"))
    complete = _until(
        lambda: any(
            c.type in ("Complete", "Failed") and c.status == "True"
            for c in (batch.read_namespaced_job("load", namespace).status.conditions or [])
        )
    )
    (job_pod,) = core.list_namespaced_pod(namespace, label_selector="job-name=load").items
    summary = json.loads(job_pod.status.container_statuses[0].state.terminated.message)
    sims = simulator_processes(pod.status.pod_ip)
    deleted_at = time.monotonic()
    apps.delete_namespaced_deployment("engine", namespace)
    gone = _until(lambda: not core.list_namespaced_pod(namespace, label_selector="app=engine").items)
    ended = _until(lambda: not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in sims))
    batch.delete_namespaced_job("load", namespace, propagation_policy="Background")
    core.delete_namespaced_service("engine", namespace)
    _until(lambda: not core.list_namespaced_pod(namespace).items)
    return {
        "create->Running s": running - began,
        "create->Ready s": ready - began,
        "create->Available s": available - began,
        "Job create->Complete s": complete - job_began,
        "loadgen output tok/s": float(summary["outputTokensPerSecond"]),
        "delete->pod gone s": gone - deleted_at,
        "delete->process ended s": ended - deleted_at,
    }


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    sandbox = controlplane.resolve()
    record = processes.load_record(sandbox.paths.pid("runner"))
    runner = processes.live_process(record)
    if runner is None:
        sys.exit(f"no runner is running for the sandbox in {sandbox.paths.root}: run `kneepoint sandbox up` first")
    cpu_before = sum(runner.cpu_times()[:2])
    namespace = f"bench-runner-{uuid.uuid4().hex[:6]}"
    results: list[dict[str, float]] = []
    with controlplane.api_client(sandbox) as api:
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": namespace}})
        _until(lambda: bool(core.list_namespaced_service_account(namespace).items), 30)
        try:
            wall = time.monotonic()
            for _ in range(rounds):
                results.append(one_round(api, namespace))
            wall = time.monotonic() - wall
        finally:
            core.delete_namespace(namespace)
    cpu = sum(runner.cpu_times()[:2]) - cpu_before
    print(f"sandbox {sandbox.paths.root}, {rounds} rounds")
    print(f"{'measure':<26}{'median':>9}{'min':>9}{'max':>9}")
    for key in results[0]:
        values = [r[key] for r in results]
        print(f"{key:<26}{statistics.median(values):>9.2f}{min(values):>9.2f}{max(values):>9.2f}")
    print(f"runner CPU over the run: {cpu:.2f} s in {wall:.1f} s wall ({100 * cpu / wall:.1f} % of one core)")
    print(f"runner resident memory: {runner.memory_info().rss / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()
