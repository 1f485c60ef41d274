"""Operator scale: many experiments at once on a large simulated fleet, in the sandbox.

Starts (or reuses) a sandbox of its own (own state dir and ports, so the shared one stays
untouched) with ``--nodes`` KWOK GPU nodes, runs ``kneepoint operator`` against it as a
subprocess with its metrics on loopback, creates ``--experiments`` ParallelismExperiments
(mode Measure) at once and measures until every one is Decided, then for ``--idle-seconds``
more with nothing to do:

- reconcile latency p50/p99: the operator's own ``kneepoint_reconcile_duration_seconds``
  histogram (quantiles interpolated within buckets, as PromQL's histogram_quantile), and the
  same per part of a pass (``kneepoint_reconcile_part_seconds{part}``) and per API round trip
  by HTTP verb (``kneepoint_api_request_duration_seconds{verb}``, client side): whether a slow
  pass is the operator's work or the API server's answer;
- API requests per experiment: ``kneepoint_api_requests_total`` by method, while the
  experiments run and while idle;
- watch connections: the kube-apiserver's ``apiserver_longrunning_requests{verb="WATCH"}``
  by resource, before and after the operator started (the difference is the operator's),
  and the operator's TCP connections to the API server (psutil);
- operator CPU seconds and resident memory (psutil, sampled every second);
- the wait of a pass for one of the operator's pass slots
  (``kneepoint_reconcile_queue_seconds``, ``--max-concurrent-passes``), which is not part of the pass;
- time from the create call returning (what ``kubectl apply`` does) to the experiment's
  first child Deployment appearing in a watch;
- the machine's load average, sampled every second while the experiments ran.

Pinned cores (``--pin``, the default on a machine of 2 cores or more): the sandbox (this
process and every process it starts, or the processes of a reused sandbox) runs on core 0,
the operator on core 1 (``os.sched_setaffinity``), so the operator's CPU-seconds per pass and
its latency are its own and not the API server's. Other processes on the machine are not
pinned: the load average says how busy it was.

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
import statistics
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
    total = buckets[-1][1] if buckets else 0.0
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


def histogram_buckets(
    samples: list[tuple[str, dict[str, str], float]], metric: str = "kneepoint_reconcile_duration_seconds"
) -> list[tuple[float, float]]:
    """An unlabelled histogram's cumulative (upper bound, count) pairs; the pass duration's by default."""
    return [(float(labels["le"]), v) for name, labels, v in samples if name == f"{metric}_bucket"]


def buckets_by_label(samples: list[tuple[str, dict[str, str], float]], metric: str, label: str) -> dict[str, list[tuple[float, float]]]:
    """A labelled histogram's cumulative buckets, per value of ``label``."""
    out: dict[str, list[tuple[float, float]]] = {}
    for name, labels, v in samples:
        if name == f"{metric}_bucket" and label in labels:
            out.setdefault(labels[label], []).append((float(labels["le"]), v))
    return out


def quantiles_by_label(samples: list[tuple[str, dict[str, str], float]], metric: str, label: str) -> str:
    """'value p50 / p99 ms (count)' for each label value, most samples first."""
    rows = []
    for value, buckets in buckets_by_label(samples, metric, label).items():
        total = max((c for _, c in buckets), default=0.0)
        if total:
            p50, p99 = (histogram_quantile(q, buckets) * 1000 for q in (0.5, 0.99))
            rows.append((total, f"{value} {p50:.0f} / {p99:.0f} ms ({total:.0f})"))
    return ", ".join(text for _, text in sorted(rows, key=lambda r: -r[0])) or "none"


_SLOW_PASS = re.compile(r"pass took ([0-9.]+) s(?: \([^)]*\); actions: ([^\n]*))?")


def slow_passes(log: Path) -> list[tuple[float, str]]:
    """(seconds, the actions its step took) of every pass the operator logged (it logs each of a second or more)."""
    return [(float(m.group(1)), m.group(2) or "?") for m in _SLOW_PASS.finditer(log.read_text(errors="replace"))]


def longest_pass(slow: list[tuple[float, str]]) -> str:
    """The longest logged pass, and how many were logged."""
    return f"{max(t for t, _ in slow):.2f} s ({len(slow)} passes of 1 s or more)" if slow else "none of 1 s or more"


def slow_passes_by_actions(slow: list[tuple[float, str]]) -> str:
    """The logged passes grouped by the actions their step took: count and median seconds."""
    groups: dict[str, list[float]] = {}
    for took, what in slow:
        groups.setdefault(what, []).append(took)
    rows = sorted(groups.items(), key=lambda kv: -len(kv[1]))
    return "; ".join(f"{what}: {len(t)} (median {statistics.median(t):.2f} s)" for what, t in rows) or "none"


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


class OperatorCounters(threading.Thread):
    """The operator's counters, read every 2 s and summed over its restarts.

    A leader that misses its Lease's renew deadline starts over (the process re-executes itself,
    docs/operator.md): its counters start from 0 again. A counter that went down is one that
    restarted; what it had counted at the last read before is kept. What a restarted process
    counted in the last 2 s before it restarted is lost (said with the figures).
    """

    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port = port
        self.last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self.offset: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self.restarts = 0
        self.stop_event = threading.Event()
        self.lock = threading.Lock()

    def poll(self) -> None:
        try:
            samples = operator_metrics(self.port)
        except OSError:
            return  # restarting: not serving yet
        with self.lock:
            went_down = False
            for name, labels, value in samples:
                key = (name, tuple(sorted(labels.items())))
                before = self.last.get(key)
                # Only counters (a gauge goes down on its own): *_total, and a histogram's *_bucket/_count/_sum.
                counter = name.endswith(("_total", "_bucket", "_count", "_sum"))
                if counter and before is not None and value < before:
                    self.offset[key] = self.offset.get(key, 0.0) + before
                    went_down = True
                self.last[key] = value
            self.restarts += went_down

    def run(self) -> None:
        while not self.stop_event.wait(2.0):
            self.poll()

    def snapshot(self) -> list[tuple[str, dict[str, str], float]]:
        """Now, as operator_metrics would give it had the process never restarted."""
        self.poll()
        with self.lock:
            return [(name, dict(labels), value + self.offset.get((name, labels), 0.0)) for (name, labels), value in self.last.items()]


class LoadSampler(threading.Thread):
    """The machine's 1-minute load average, once a second (context for every timing figure)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.samples: list[tuple[float, float]] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            self.samples.append((time.monotonic(), os.getloadavg()[0]))
            self.stop_event.wait(1.0)

    def between(self, start: float, end: float) -> list[float]:
        return [v for t, v in self.samples if start <= t <= end]


SANDBOX_CORE, OPERATOR_CORE = 0, 1


def pin_sandbox(marker: str) -> int:
    """Pin this process (so every sandbox process it starts) and a reused sandbox's processes to SANDBOX_CORE.

    A sandbox process carries KNEEPOINT_SANDBOX_ID=<its state dir> in its environment. Returns how many
    running processes were pinned besides this one.
    """
    os.sched_setaffinity(0, {SANDBOX_CORE})
    pinned = 0
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get("KNEEPOINT_SANDBOX_ID") == marker:
                for task in [proc, *proc.children(recursive=True)]:
                    os.sched_setaffinity(task.pid, {SANDBOX_CORE})
                    pinned += 1
        except (psutil.Error, OSError):
            continue
    return pinned


def method_kind(method: str) -> str:
    """A client method as verb and resource: read_namespaced_deployment -> "get deployment"."""
    verbs = {"read": "get", "get": "get", "list": "list", "create": "create", "patch": "patch", "delete": "delete", "replace": "update"}
    verb, _, rest = method.partition("_")
    if verb == "delete" and rest.startswith("collection_"):
        verb, rest = "deletecollection", rest[len("collection_") :]
    for prefix in ("namespaced_", "for_all_namespaces"):
        rest = rest.replace(prefix, "")
    resource = rest.strip("_").replace("custom_object_status", "experiment status").replace("custom_object", "custom object")
    return f"{verbs.get(verb, verb)} {resource or method}"


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
    p.add_argument("--port-offset", type=int, default=17000)  # every port below the ephemeral range (docs/sandbox.md)
    p.add_argument("--idle-seconds", type=float, default=120.0, help="measure this long after every experiment decided")
    p.add_argument("--timeout", type=float, default=1800.0, help="give up when not every experiment decided by then")
    p.add_argument("--keep-sandbox", action="store_true", help="leave the sandbox running (default: stop it)")
    p.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=(os.cpu_count() or 1) >= 2,
        help=f"sandbox on core {SANDBOX_CORE}, operator on core {OPERATOR_CORE} (default on 2 or more cores)",
    )
    p.add_argument(
        "--max-concurrent-passes",
        type=int,
        default=None,
        help="the operator's KNEEPOINT_MAX_CONCURRENT_PASSES (default: the operator's own default; 0: no limit)",
    )
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
    if args.pin:
        os.sched_setaffinity(0, {SANDBOX_CORE})  # before up: every process it starts inherits the core
    sandbox = controlplane.up(
        state_dir=args.state_dir,
        fleet_path=fleet_path,
        port_offset=args.port_offset,
        with_runner=False,
        say=lambda line: print(line, file=sys.stderr, flush=True),
    )
    print(f"sandbox up with {args.nodes} nodes in {time.monotonic() - began:.0f} s", file=sys.stderr)
    if args.pin:
        print(f"pinned to core {SANDBOX_CORE}: this process and {pin_sandbox(sandbox.marker)} sandbox processes", file=sys.stderr)
    api = controlplane.api_client(sandbox)
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    namespace = f"scale-{int(time.time())}"
    leftover = [n.metadata.name for n in core.list_namespace().items if n.metadata.name.startswith("scale-")]
    if leftover:
        # Their experiments would be reconciled by this run's operator too (it watches every namespace).
        raise SystemExit(
            f"operator_scale: the sandbox at {args.state_dir} holds an earlier run's experiments ({', '.join(leftover)}); "
            f"remove it first: kneepoint sandbox down --state-dir {args.state_dir} --purge"
        )
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
    if args.max_concurrent_passes is not None:
        env["KNEEPOINT_MAX_CONCURRENT_PASSES"] = str(args.max_concurrent_passes)
    log_path = sandbox.paths.logs / "operator-scale.log"
    sampler: ProcessSampler | None = None
    load_sampler = LoadSampler()
    with open(log_path, "wb") as log:
        operator = subprocess.Popen(
            [sys.executable, "-m", "kneepoint", "operator"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            # Pinned before it runs a line, so every thread it starts stays on its core.
            preexec_fn=(lambda: os.sched_setaffinity(0, {OPERATOR_CORE})) if args.pin else None,
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
        load_sampler.start()
        counters = OperatorCounters(metrics_port)
        idle_start_metrics = counters.snapshot()
        counters.start()

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
        busy = counters.snapshot()
        server_after = apiserver_metrics(api)
        watches_during = apiserver_watches(server_after)
        time.sleep(args.idle_seconds)
        t_idle_end = time.monotonic()
        idle = counters.snapshot()
        counters.stop_event.set()
        decisions: dict[str, int] = {}
        for o in custom.list_namespaced_custom_object("kneepoint.io", "v1alpha1", namespace, "parallelismexperiments")["items"]:
            st = o.get("status") or {}
            d = f"{st.get('phase')} {st.get('decidedTier') or ''}".strip()
            decisions[str(d)] = decisions.get(str(d), 0) + 1
    finally:
        if sampler is not None:
            sampler.stop_event.set()
        load_sampler.stop_event.set()
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
    buckets_busy = histogram_buckets(busy)
    buckets_queue = histogram_buckets(busy, "kneepoint_reconcile_queue_seconds")
    req_start, req_busy, req_idle = api_requests(idle_start_metrics), api_requests(busy), api_requests(idle)
    total_busy = sum(req_busy.values()) - sum(req_start.values())
    total_idle = sum(req_idle.values()) - sum(req_busy.values())
    to_child = [watcher.first[k] - applied[k] for k in applied if k in watcher.first]
    passes = scalar(busy, "kneepoint_reconcile_passes_total")
    count = scalar(busy, "kneepoint_reconcile_duration_seconds_count")
    total_seconds = scalar(busy, "kneepoint_reconcile_duration_seconds_sum")
    operator_watches = {k: watches_during.get(k, 0) - watches_before.get(k, 0) for k in set(watches_during) | set(watches_before)}
    operator_watches = {k: v for k, v in operator_watches.items() if v}
    count_all = max((c for b, c in buckets_busy), default=0.0)
    by_kind: dict[str, float] = {}
    for m in req_busy:
        by_kind[method_kind(m)] = by_kind.get(method_kind(m), 0.0) + req_busy[m] - req_start.get(m, 0)
    by_kind = {k: v for k, v in by_kind.items() if v}

    loads = load_sampler.between(t0, t_done)
    print(f"operator scale: {n} experiments (mode Measure, pretend engines and load tests) on {args.nodes} KWOK GPU nodes")
    print(
        f"cores: operator on core {OPERATOR_CORE}, sandbox on core {SANDBOX_CORE}"
        if args.pin
        else "cores: not pinned (operator and sandbox share every core)"
    )
    print(f"all decided or failed after {t_done - t0:.0f} s; outcomes: {', '.join(f'{k} {v}' for k, v in sorted(decisions.items()))}")
    slow = slow_passes(log_path)
    rows = [
        ("reconcile passes", f"{passes:.0f} ({passes / n:.1f} per experiment)"),
        (
            "reconcile latency p50 / p99 (histogram)",
            f"{histogram_quantile(0.5, buckets_busy) * 1000:.0f} ms / "
            f"{histogram_quantile(0.99, buckets_busy) * 1000:.0f} ms "
            f"(mean {total_seconds / max(count, 1) * 1000:.0f} ms)",
        ),
        (
            "reconcile latency distribution (histogram)",
            ", ".join(
                f"<= {bound * 1000:.0f} ms {count / max(count_all, 1):.1%}"
                for bound, count in sorted(buckets_busy)
                if not math.isinf(bound)
            ),
        ),
        (
            "wait for a pass slot p50 / p99 (histogram; not in the pass)",
            f"{histogram_quantile(0.5, buckets_queue) * 1000:.0f} ms / {histogram_quantile(0.99, buckets_queue) * 1000:.0f} ms "
            f"(limit {env.get('KNEEPOINT_MAX_CONCURRENT_PASSES', 'the default')})",
        ),
        ("longest pass (the operator's log: passes of 1 s or more)", longest_pass(slow)),
        ("passes of 1 s or more by the actions they took", slow_passes_by_actions(slow)),
        (
            "pass time by part, p50 / p99 (histogram; passes)",
            quantiles_by_label(busy, "kneepoint_reconcile_part_seconds", "part"),
        ),
        (
            "the operator's API round trips, p50 / p99 (client side; requests)",
            quantiles_by_label(busy, "kneepoint_api_request_duration_seconds", "verb"),
        ),
        ("operator CPU-seconds per pass", f"{cpu_active / max(passes, 1) * 1000:.1f} ms ({cpu_active:.1f} s / {passes:.0f} passes)"),
        ("API requests per experiment (until all decided)", f"{total_busy / n:.1f} ({total_busy:.0f} in all)"),
        (
            "API requests per experiment by kind",
            ", ".join(f"{kind} {v / n:.2f}" for kind, v in sorted(by_kind.items(), key=lambda kv: -kv[1])),
        ),
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
    print(
        f"machine load average while the experiments ran (1 min, sampled each second): mean {sum(loads) / max(len(loads), 1):.1f}, "
        f"max {max(loads, default=math.nan):.1f}; at the end (1/5/15 min): {' '.join(f'{x:.1f}' for x in os.getloadavg())} "
        f"on {os.cpu_count()} cores"
    )
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
    lost = log_path.read_text(errors="replace").count("Lost the leadership")
    print(
        f"operator restarts (leadership lost: the Lease not renewed within its deadline): {lost} "
        f"(counters summed over {counters.restarts} restart(s) seen; each loses at most its last 2 s of counts)"
    )
    print(f"operator log: {log_path}")
    try:
        core.delete_namespace(namespace)
    except Exception:  # noqa: BLE001 - best-effort cleanup: gone already, or the API server stopped
        pass
    api.close()
    if not args.keep_sandbox:
        # Purged: the experiments' namespace cannot finish deleting without the operator (kopf's finalizers),
        # and a next run in a reused sandbox would reconcile them again.
        controlplane.down(args.state_dir, purge=True, say=lambda line: print(line, file=sys.stderr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
