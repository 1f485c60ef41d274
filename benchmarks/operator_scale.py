"""Operator scale: many experiments at once on a large simulated fleet, in the sandbox.

Starts (or reuses) a sandbox of its own (own state dir and ports, so the shared one stays
untouched) with ``--nodes`` KWOK GPU nodes, runs ``kneepoint operator`` against it as a
subprocess with its metrics on loopback, creates ``--experiments`` ParallelismExperiments
(mode Measure) at once and measures until every one is Decided, then for ``--idle-seconds``
more with nothing to do:

- reconcile latency p50/p99: the operator's own ``kneepoint_reconcile_duration_seconds``
  histogram (quantiles interpolated within buckets, as PromQL's histogram_quantile);
- API requests per experiment: ``kneepoint_api_requests_total`` by method, while the
  experiments run and while idle;
- watch connections: the kube-apiserver's ``apiserver_longrunning_requests{verb="WATCH"}``
  by resource, before and after the operator started (the difference is the operator's),
  and the operator's TCP connections to the API server (psutil);
- operator CPU seconds and resident memory (psutil, sampled every second);
- time from the create call returning (what ``kubectl apply`` does) to the experiment's
  first child Deployment appearing in a watch.

The stand-in (test-only, said in docs/performance.md): engines and load tests do not run as
processes. Before the operator starts, this benchmark installs the API server's
MutatingAdmissionPolicies of ``kneepoint.sandbox.pretend`` for its namespace: the operator's
engine and load-test pods are labelled ``kneepoint.io/sandbox-pretend: "true"`` when created,
so KWOK's stages mark them Running/Ready and the Jobs' pods Succeeded, and each load-test
pod's termination message is the fixed load-generator summary below (KWOK's pod-complete
stage copies it from the pod annotation the policy adds). The operator itself runs as in
production, with no test-only setting. Everything else is real: API server, scheduler over the fleet's nodes and GPUs,
controllers, Prometheus (queried; it has no series for pretend engines, so the operator
waits ``KNEEPOINT_METRICS_DEADLINE_SECONDS`` and records the tier without them).

    .venv/bin/python benchmarks/operator_scale.py --nodes 500 --experiments 100
    .venv/bin/python benchmarks/operator_scale.py --nodes 20 --experiments 5 --idle-seconds 20   # a quick look
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import yaml

# A load-generator summary (CONTRACTS A) every pretend load test reports. Every tier gets the
# same one, so the throughput-gain rule stops each ladder after TP1 -> TP2 (two tiers).
PRETEND_SUMMARY = {
    "v": 1,
    "ok": True,
    "outputTokensPerSecond": 1000.0,
    "totalTokensPerSecond": 5000.0,
    "requestsPerSecond": 7.8,
    "ttftP50Ms": 100.0,
    "ttftP90Ms": 120.0,
    "ttftP95Ms": 130.0,
    "ttftP99Ms": 150.0,
    "ttftMeanMs": 105.0,
    "tpotMeanMs": 20.0,
    "tpotP99Ms": 25.0,
    "itlP99Ms": 30.0,
    "latencyP50Ms": 2600.0,
    "latencyP90Ms": 2800.0,
    "latencyP95Ms": 2900.0,
    "latencyP99Ms": 3000.0,
    "latencyMeanMs": 2650.0,
    "completed": 200,
    "failed": 0,
    "errorFraction": 0.0,
    "errors": {},
    "inputTokensAsked": 512,
    "inputTokensServed": 513,
    "outputTokensAsked": 128,
    "outputTokensServed": 128,
    "concurrency": 32,
    "repeats": 1,
    "keptRepeat": 0,
    "repeatOutputTokensPerSecond": [1000.0],
    "clientLimited": False,
    "clientCpuPeak": 0.1,
    "loopLagP99Ms": 1.0,
    "startedAt": None,
    "finishedAt": None,
    "durationSeconds": 25.6,
}
OPERATOR_ENV = {
    "KNEEPOINT_SCRAPE_INTERVAL": "2",  # the sandbox's Prometheus scrapes every 2 s
    "KNEEPOINT_METRICS_SETTLE_SECONDS": "2",
    "KNEEPOINT_METRICS_DEADLINE_SECONDS": "8",  # pretend engines have no series: do not wait 180 s for them
}


def fleet_document(nodes: int) -> dict[str, Any]:
    """Four fifths 8x H200 NVLink nodes, one fifth 8x L40S PCIe nodes."""
    h200 = max(1, nodes * 4 // 5)
    groups = [
        {
            "namePrefix": "h200",
            "count": h200,
            "gpuProduct": "NVIDIA-H200",
            "gpuCount": 8,
            "gpuMemoryMiB": 143771,
            "interconnect": "nvlink",
            "nvlinkDomainSize": 8,
            "cpu": "192",
            "memory": "2Ti",
            "interNodeGbps": 400,
        }
    ]
    if nodes - h200 > 0:
        groups.append(
            {
                "namePrefix": "l40s",
                "count": nodes - h200,
                "gpuProduct": "NVIDIA-L40S",
                "gpuCount": 8,
                "gpuMemoryMiB": 46068,
                "interconnect": "pcie",
                "nvlinkDomainSize": 1,
                "cpu": "64",
                "memory": "512Gi",
            }
        )
    return {"kind": "SandboxFleet", "nodeGroups": groups}


def experiment(name: str, namespace: str, index: int) -> dict[str, Any]:
    """A Measure-mode experiment; models and concurrency vary a little between experiments."""
    model = ("hf://meta-llama/Llama-3.1-8B-Instruct", "hf://Qwen/Qwen2.5-14B-Instruct")[index % 2]
    return {
        "apiVersion": "kneepoint.io/v1alpha1",
        "kind": "ParallelismExperiment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"uri": model, "maxModelLen": 4096},
            "mode": "Measure",
            "load": {"concurrency": 32, "numRequests": 200, "inputLen": 512, "outputLen": 128},
            "placement": {"gpuProduct": "NVIDIA-H200"},
        },
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------------------------
# Prometheus text


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m:
            labels = dict(_LABEL.findall(m.group(2) or ""))
            try:
                out.append((m.group(1), labels, float(m.group(3))))
            except ValueError:
                pass
    return out


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """PromQL's histogram_quantile over cumulative (upper bound, count) pairs."""
    buckets = sorted(buckets)
    total = buckets[-1][1]
    if total <= 0:
        return math.nan
    rank = q * total
    prev_bound, prev_count = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return prev_bound
            return prev_bound + (bound - prev_bound) * (rank - prev_count) / max(count - prev_count, 1e-12)
        prev_bound, prev_count = bound, count
    return prev_bound


def operator_metrics(port: int) -> list[tuple[str, dict[str, str], float]]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return parse_metrics(resp.read().decode())


def api_requests(samples: list[tuple[str, dict[str, str], float]]) -> dict[str, float]:
    return {labels["method"]: v for name, labels, v in samples if name == "kneepoint_api_requests_total"}


def reconcile_buckets(samples: list[tuple[str, dict[str, str], float]]) -> list[tuple[float, float]]:
    return [(float(labels["le"]), v) for name, labels, v in samples if name == "kneepoint_reconcile_duration_seconds_bucket"]


def scalar(samples: list[tuple[str, dict[str, str], float]], metric: str) -> float:
    return sum(v for name, _, v in samples if name == metric)


def apiserver_metrics(api: Any) -> list[tuple[str, dict[str, str], float]]:
    resp = api.rest_client.pool_manager.request("GET", api.configuration.host + "/metrics", preload_content=True)
    return parse_metrics(resp.data.decode())


def apiserver_watches(samples: list[tuple[str, dict[str, str], float]]) -> dict[str, float]:
    """Open WATCH requests on the API server by resource (apiserver_longrunning_requests)."""
    out: dict[str, float] = {}
    for name, labels, v in samples:
        if name == "apiserver_longrunning_requests" and labels.get("verb") == "WATCH":
            key = labels.get("resource", "?") + (f".{labels['group']}" if labels.get("group") else "")
            out[key] = out.get(key, 0.0) + v
    return out


def apiserver_latency(before: list[tuple[str, dict[str, str], float]], after: list[tuple[str, dict[str, str], float]]) -> dict[str, float]:
    """Mean API-server request duration per verb between two scrapes (every client's requests), seconds."""

    def sums(samples: list[tuple[str, dict[str, str], float]]) -> dict[tuple[str, str], float]:
        out: dict[tuple[str, str], float] = {}
        for name, labels, v in samples:
            if name in ("apiserver_request_duration_seconds_sum", "apiserver_request_duration_seconds_count"):
                key = (name.rsplit("_", 1)[1], labels.get("verb", "?"))
                out[key] = out.get(key, 0.0) + v
        return out

    a, b = sums(before), sums(after)
    verbs = {verb for _, verb in b}
    result = {}
    for verb in verbs:
        count = b.get(("count", verb), 0.0) - a.get(("count", verb), 0.0)
        if count > 0:
            result[verb] = (b.get(("sum", verb), 0.0) - a.get(("sum", verb), 0.0)) / count
    return result


# --------------------------------------------------------------------------------------------
# Sampling the operator process


class ProcessSampler(threading.Thread):
    """RSS, CPU and TCP connections to the API server of one process, once a second."""

    def __init__(self, pid: int, apiserver_port: int) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.apiserver_port = apiserver_port
        self.samples: list[tuple[float, float, float, int]] = []  # (time, rss bytes, cpu seconds, connections)
        self.stop_event = threading.Event()

    def sample(self) -> tuple[float, float, float, int]:
        times = self.proc.cpu_times()
        conns = sum(
            1
            for c in self.proc.net_connections(kind="tcp")
            if c.raddr and c.raddr.port == self.apiserver_port and c.status == psutil.CONN_ESTABLISHED
        )
        return (time.monotonic(), float(self.proc.memory_info().rss), times.user + times.system, conns)

    def run(self) -> None:
        while not self.stop_event.is_set():
            try:
                self.samples.append(self.sample())
            except psutil.Error:
                return
            self.stop_event.wait(1.0)

    def between(self, start: float, end: float) -> list[tuple[float, float, float, int]]:
        return [s for s in self.samples if start <= s[0] <= end]


class FirstChildWatch(threading.Thread):
    """Records when each experiment's first engine Deployment shows up (monotonic time)."""

    def __init__(self, api: Any, namespace: str) -> None:
        super().__init__(daemon=True)
        from kubernetes import client, watch

        self.apps = client.AppsV1Api(api)
        self.watch = watch.Watch()
        self.namespace = namespace
        self.first: dict[str, float] = {}
        self.ready = threading.Event()

    def run(self) -> None:
        self.ready.set()
        try:
            for event in self.watch.stream(
                self.apps.list_namespaced_deployment, self.namespace, label_selector="kneepoint.io/role=engine", timeout_seconds=3600
            ):
                if event["type"] == "ADDED":
                    owner = (event["object"].metadata.labels or {}).get("kneepoint.io/experiment")
                    if owner and owner not in self.first:
                        self.first[owner] = time.monotonic()
        except Exception:  # noqa: BLE001 - the watch ends when the benchmark stops it
            return


# --------------------------------------------------------------------------------------------
# The run


def install_pretend_policies(api: Any, namespace: str) -> None:
    """Make the operator's engine and load-test pods in ``namespace`` pretend pods (see the module doc),
    and wait until the API server applies the policies (a dry-run pod comes back marked)."""
    from kubernetes import client, dynamic

    from kneepoint.kube import naming
    from kneepoint.sandbox import pretend

    message = json.dumps(PRETEND_SUMMARY, separators=(",", ":"))
    resources = dynamic.DynamicClient(api).resources
    for obj in pretend.admission_policies(namespace, message, prefix=f"kneepoint-pretend-{namespace}"):
        resources.get(api_version=obj["apiVersion"], kind=obj["kind"]).create(body=obj)
    probe = {
        "metadata": {"generateName": "pretend-probe-", "labels": {naming.LABEL_ROLE: naming.ROLE_LOADTEST}},
        "spec": {"containers": [{"name": "probe", "image": "busybox"}]},
    }
    deadline = time.monotonic() + 30
    while True:
        meta = client.CoreV1Api(api).create_namespaced_pod(namespace, probe, dry_run="All").metadata
        if (meta.labels or {}).get(pretend.PRETEND_LABEL) == "true" and pretend.PRETEND_MESSAGE_ANNOTATION in (meta.annotations or {}):
            return
        if time.monotonic() > deadline:
            raise SystemExit("operator_scale: the pretend admission policies were not applied within 30 s")
        time.sleep(0.5)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = q * (len(ordered) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, default=500)
    p.add_argument("--experiments", type=int, default=100)
    p.add_argument("--state-dir", type=Path, default=Path("/tmp/kneepoint-scale"))
    p.add_argument("--port-offset", type=int, default=41000)
    p.add_argument("--idle-seconds", type=float, default=120.0, help="measure this long after every experiment decided")
    p.add_argument("--timeout", type=float, default=1800.0, help="give up when not every experiment decided by then")
    p.add_argument("--keep-sandbox", action="store_true", help="leave the sandbox running (default: stop it)")
    args = p.parse_args(argv)
    # Stop on SIGTERM as on Ctrl-C: the finally blocks stop the operator and the sandbox.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.nodes < 1 or args.experiments < 1:
        print("operator_scale: --nodes and --experiments must be at least 1", file=sys.stderr)
        return 2

    from kubernetes import client

    from kneepoint.sandbox import controlplane

    fleet_path = args.state_dir.parent / f"{args.state_dir.name}-fleet.yaml"
    fleet_path.parent.mkdir(parents=True, exist_ok=True)
    fleet_path.write_text(yaml.safe_dump(fleet_document(args.nodes), sort_keys=False))
    began = time.monotonic()
    sandbox = controlplane.up(
        state_dir=args.state_dir,
        fleet_path=fleet_path,
        port_offset=args.port_offset,
        with_runner=False,
        say=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(f"sandbox up with {args.nodes} nodes in {time.monotonic() - began:.0f} s", file=sys.stderr)
    api = controlplane.api_client(sandbox)
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    namespace = f"scale-{int(time.time())}"
    core.create_namespace({"metadata": {"name": namespace}})
    install_pretend_policies(api, namespace)
    watcher = FirstChildWatch(api, namespace)  # started before the baseline, so its own watch is not counted
    watcher.start()
    watcher.ready.wait()
    if sandbox.started:
        time.sleep(35)  # the controller-manager's garbage collector opens its watches on new resources lazily
    server_before = apiserver_metrics(api)
    watches_before = apiserver_watches(server_before)

    metrics_port = free_port()
    env = dict(
        os.environ,
        **OPERATOR_ENV,
        KUBECONFIG=str(sandbox.kubeconfig),
        KNEEPOINT_PROMETHEUS_URL=sandbox.prometheus_url,
        KNEEPOINT_METRICS_PORT=str(metrics_port),
        KNEEPOINT_METRICS_ADDRESS="127.0.0.1",
        PYTHONUNBUFFERED="1",
    )
    log_path = sandbox.paths.logs / "operator-scale.log"
    sampler: ProcessSampler | None = None
    with open(log_path, "wb") as log:
        operator = subprocess.Popen(
            [sys.executable, "-m", "kneepoint", "operator"], env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                operator_metrics(metrics_port)
                break
            except OSError:
                if operator.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"operator did not start; see {log_path}") from None
                time.sleep(0.5)
        time.sleep(3)  # kopf's watches connect
        sampler = ProcessSampler(operator.pid, sandbox.ports.apiserver)
        sampler.start()
        idle_start_metrics = operator_metrics(metrics_port)

        applied: dict[str, float] = {}
        t0 = time.monotonic()
        for i in range(args.experiments):
            name = f"exp-{i:03d}"
            custom.create_namespaced_custom_object(
                "kneepoint.io", "v1alpha1", namespace, "parallelismexperiments", experiment(name, namespace, i)
            )
            applied[name] = time.monotonic()
        print(f"created {args.experiments} experiments in {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)

        phases: dict[str, str] = {}
        while time.monotonic() - t0 < args.timeout:
            items = custom.list_namespaced_custom_object("kneepoint.io", "v1alpha1", namespace, "parallelismexperiments")["items"]
            phases = {o["metadata"]["name"]: (o.get("status") or {}).get("phase", "Pending") for o in items}
            done = sum(1 for v in phases.values() if v in ("Decided", "Failed"))
            if done == args.experiments:
                break
            print(f"  {time.monotonic() - t0:5.0f} s: {done}/{args.experiments} decided or failed", file=sys.stderr, flush=True)
            time.sleep(5)
        t_done = time.monotonic()
        busy = operator_metrics(metrics_port)
        server_after = apiserver_metrics(api)
        watches_during = apiserver_watches(server_after)
        time.sleep(args.idle_seconds)
        t_idle_end = time.monotonic()
        idle = operator_metrics(metrics_port)
        decisions: dict[str, int] = {}
        for o in custom.list_namespaced_custom_object("kneepoint.io", "v1alpha1", namespace, "parallelismexperiments")["items"]:
            st = o.get("status") or {}
            d = f"{st.get('phase')} {st.get('decidedTier') or ''}".strip()
            decisions[str(d)] = decisions.get(str(d), 0) + 1
    finally:
        if sampler is not None:
            sampler.stop_event.set()
        if operator.poll() is None:
            os.killpg(operator.pid, signal.SIGTERM)
            try:
                operator.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(operator.pid, signal.SIGKILL)
        watcher.watch.stop()

    assert sampler is not None
    n = args.experiments
    active = sampler.between(t0, t_done)
    idle_samples = sampler.between(t_done, t_idle_end)
    rss_peak = max(s[1] for s in sampler.samples) / 2**20
    cpu_active = (active[-1][2] - active[0][2]) if len(active) > 1 else math.nan
    cpu_idle = (idle_samples[-1][2] - idle_samples[0][2]) if len(idle_samples) > 1 else math.nan
    buckets_busy = reconcile_buckets(busy)
    req_start, req_busy, req_idle = api_requests(idle_start_metrics), api_requests(busy), api_requests(idle)
    total_busy = sum(req_busy.values()) - sum(req_start.values())
    total_idle = sum(req_idle.values()) - sum(req_busy.values())
    to_child = [watcher.first[k] - applied[k] for k in applied if k in watcher.first]
    passes = scalar(busy, "kneepoint_reconcile_passes_total")
    count = scalar(busy, "kneepoint_reconcile_duration_seconds_count")
    total_seconds = scalar(busy, "kneepoint_reconcile_duration_seconds_sum")
    operator_watches = {k: watches_during.get(k, 0) - watches_before.get(k, 0) for k in set(watches_during) | set(watches_before)}
    operator_watches = {k: v for k, v in operator_watches.items() if v}

    print(f"operator scale: {n} experiments (mode Measure, pretend engines and load tests) on {args.nodes} KWOK GPU nodes")
    print(f"all decided or failed after {t_done - t0:.0f} s; outcomes: {', '.join(f'{k} {v}' for k, v in sorted(decisions.items()))}")
    rows = [
        ("reconcile passes", f"{passes:.0f} ({passes / n:.1f} per experiment)"),
        (
            "reconcile latency p50 / p99 (histogram)",
            f"{histogram_quantile(0.5, buckets_busy) * 1000:.0f} ms / "
            f"{histogram_quantile(0.99, buckets_busy) * 1000:.0f} ms "
            f"(mean {total_seconds / max(count, 1) * 1000:.0f} ms)",
        ),
        ("API requests per experiment (until all decided)", f"{total_busy / n:.1f} ({total_busy:.0f} in all)"),
        (
            "API requests while idle",
            f"{total_idle:.0f} in {t_idle_end - t_done:.0f} s "
            f"({total_idle / n / max(t_idle_end - t_done, 1) * 3600:.1f} per experiment per hour)",
        ),
        ("watch streams the operator opened (apiserver)", ", ".join(f"{k} {v:.0f}" for k, v in sorted(operator_watches.items())) or "none"),
        (
            "operator TCP connections to the API server",
            f"max {max(s[3] for s in sampler.samples)}, idle {idle_samples[-1][3] if idle_samples else 'n/a'}",
        ),
        (
            "operator CPU",
            f"{cpu_active:.1f} s while the experiments ran ({cpu_active / max(t_done - t0, 1):.0%} of a core), "
            f"{cpu_idle:.1f} s in {t_idle_end - t_done:.0f} s idle",
        ),
        ("operator resident memory, peak", f"{rss_peak:.0f} MiB"),
        (
            "apply -> first child (engine Deployment)",
            f"p50 {pct(to_child, 0.5):.2f} s, p99 {pct(to_child, 0.99):.2f} s, max {max(to_child):.2f} s ({len(to_child)} of {n} seen)",
        ),
    ]
    width = max(len(r[0]) for r in rows)
    for label, value in rows:
        print(f"{label.ljust(width)}  {value}")
    latency = apiserver_latency(server_before, server_after)
    print(
        "API server mean request latency while the experiments ran (all clients): "
        + ", ".join(f"{verb} {latency[verb] * 1000:.0f} ms" for verb in sorted(latency))
    )
    print(f"machine load average (1/5/15 min) at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} cores")
    print(
        "API requests by method (until all decided): "
        + ", ".join(
            f"{m} {req_busy[m] - req_start.get(m, 0):.0f}" for m in sorted(req_busy, key=lambda m: -(req_busy[m] - req_start.get(m, 0)))
        )
    )
    print(
        "API requests by method (idle): "
        + (", ".join(f"{m} {req_idle[m] - req_busy.get(m, 0):.0f}" for m in sorted(req_idle) if req_idle[m] - req_busy.get(m, 0)) or "none")
    )
    print(f"operator log: {log_path}")
    try:
        core.delete_namespace(namespace)
    except Exception:  # noqa: BLE001 - best-effort cleanup: gone already, or the API server stopped
        pass
    api.close()
    if not args.keep_sandbox:
        controlplane.down(args.state_dir, say=lambda line: print(line, file=sys.stderr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
