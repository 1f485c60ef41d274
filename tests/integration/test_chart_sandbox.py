"""The Helm chart against the sandbox's real API server, authorizer and pod runner.

- the chart (CRD included) is rendered with the pinned helm and applied server-side;
- the operator's ServiceAccount gets exactly what it needs, checked with
  ``kubectl auth can-i --as=system:serviceaccount:...``, in namespaced and cluster-wide mode;
- the chart's operator pod, run by the sandbox's runner with that ServiceAccount's token,
  drives a Simulate-mode experiment to Decided; the Argo CD health check reads the
  result as Healthy;
- a second Prometheus started with deploy/prometheus/scrape-config.yaml scrapes the
  experiment's engine, and every Grafana dashboard panel about engines and GPUs returns
  data from it.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from kneepoint.sandbox import binaries

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kneepoint"
EXPERIMENT = "chart-sim"


def _wait(what: str, check: Callable[[], Any], timeout: float, interval: float = 0.5, detail: Callable[[], str] = lambda: "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{detail()}")


def _render(
    helm: Path, release: str, namespace: str, values: dict[str, Any], tmp: Path, include_crds: bool = False
) -> list[dict[str, Any]]:
    values_file = tmp / f"{release}-values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    args = [str(helm), "template", release, str(CHART), "--namespace", namespace, "--values", str(values_file)]
    if include_crds:
        args.append("--include-crds")
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def _apply(sandbox: Any, docs: list[dict[str, Any]], tmp: Path, name: str) -> str:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    proc = sandbox.kubectl("apply", "--server-side", "--field-manager=kneepoint-chart-test", "-f", str(path), check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


@dataclass
class Install:
    release: str
    namespace: str
    team: str
    other: str
    service_account: str
    pods_dir: Path

    @property
    def subject(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.service_account}"

    def operator_log(self) -> str:
        logs = sorted(self.pods_dir.glob(f"{self.namespace}_*_operator.log"))
        return "\n".join(p.read_text()[-4000:] for p in logs) or "(no operator log)"


@pytest.fixture(scope="module")
def install(sandbox: Any, helm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Install]:
    """The chart in namespaced mode: the operator in kp-sys-*, watching kp-team-* only."""
    suffix = uuid.uuid4().hex[:6]
    inst = Install(
        f"kp-{suffix}",
        f"kp-sys-{suffix}",
        f"kp-team-{suffix}",
        f"kp-other-{suffix}",
        f"kp-{suffix}-kneepoint",
        sandbox.sandbox.paths.root / "pods",
    )
    tmp = tmp_path_factory.mktemp("chart")
    for ns in (inst.namespace, inst.team, inst.other):
        sandbox.kubectl("create", "namespace", ns)
    values = {
        # One pod: the memory and CPU figures below are the leader's (test_faults_leader runs two replicas).
        "replicas": 1,
        "watchNamespaces": [inst.team],
        # The sandbox runs pods as host processes: a metrics server would listen on every
        # interface of this machine (the network rule allows loopback only).
        "metrics": {"port": 0},
        "prometheus": {"url": sandbox.prometheus_url, "scrapeIntervalSeconds": 2},
    }
    docs = _render(helm, inst.release, inst.namespace, values, tmp, include_crds=True)
    out = _apply(sandbox, docs, tmp, inst.release)
    assert "customresourcedefinition.apiextensions.k8s.io/parallelismexperiments.kneepoint.io serverside-applied" in out
    try:
        yield inst
    finally:
        # Experiments first, while the operator still runs: kopf's finalizer on them is
        # removed by the operator, and a namespace holding one would never finish deleting.
        sandbox.kubectl("delete", "parallelismexperiments.kneepoint.io", "--all", "-n", inst.team, "--timeout=60s", check=False)
        for ns in (inst.team, inst.other, inst.namespace):
            sandbox.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        sandbox.kubectl("delete", "clusterrole,clusterrolebinding", "-l", f"app.kubernetes.io/instance={inst.release}", check=False)


def _can_i(sandbox: Any, subject: str, *args: str) -> bool:
    proc = sandbox.kubectl("auth", "can-i", f"--as={subject}", *args, check=False)
    answer = proc.stdout.strip()
    assert answer in ("yes", "no"), proc.stderr
    return answer == "yes"


def test_chart_applies_server_side_and_the_operator_pod_runs(sandbox: Any, install: Install) -> None:
    def running() -> bool:
        proc = sandbox.kubectl("get", "pods", "-n", install.namespace, "-o", "json")
        pods = json.loads(proc.stdout)["items"]
        return any(p["status"].get("phase") == "Running" for p in pods)

    _wait("the operator pod to run", running, 90, detail=install.operator_log)
    _wait("the operator to start", lambda: "Operator started" in install.operator_log(), 60, detail=install.operator_log)
    assert f"namespaces {install.team}" in install.operator_log()


@pytest.mark.parametrize(
    ("args", "where", "allowed"),
    [
        (("patch", "parallelismexperiments.kneepoint.io", "--subresource=status"), "team", True),
        (("patch", "parallelismexperiments.kneepoint.io"), "team", True),
        (("watch", "parallelismexperiments.kneepoint.io"), "team", True),
        (("create", "deployments.apps"), "team", True),
        (("deletecollection", "jobs.batch"), "team", True),
        (("delete", "jobs.batch"), "team", False),  # a tier goes with one delete-collection request per kind
        (("update", "configmaps"), "team", True),
        (("create", "events"), "team", True),
        (("get", "secrets"), "team", False),
        (("list", "secrets"), "team", False),
        (("update", "deployments.apps"), "team", False),
        (("create", "pods"), "team", False),
        (("create", "deployments.apps"), "other", False),
        (("get", "configmaps"), "other", False),
        (("patch", "parallelismexperiments.kneepoint.io", "--subresource=status"), "other", False),
        (("get", "secrets"), "other", False),
        (("create", "deployments.apps"), "operator", False),
        (("list", "pods"), "all", True),
        (("watch", "pods"), "all", False),
        (("list", "nodes"), "cluster", True),
        (("patch", "nodes"), "cluster", False),
        (("watch", "customresourcedefinitions.apiextensions.k8s.io"), "cluster", True),
        (("list", "namespaces"), "cluster", True),
    ],
)
def test_namespaced_service_account_permissions(sandbox: Any, install: Install, args: tuple[str, ...], where: str, allowed: bool) -> None:
    scope = {
        "team": ["-n", install.team],
        "other": ["-n", install.other],
        "operator": ["-n", install.namespace],
        "all": ["--all-namespaces"],
        "cluster": [],
    }[where]
    assert _can_i(sandbox, install.subject, *args, *scope) is allowed


def test_cluster_wide_service_account_permissions(sandbox: Any, helm: Path, tmp_path: Path) -> None:
    """Cluster-wide mode (watchNamespaces: []): only the RBAC objects, no second operator."""
    suffix = uuid.uuid4().hex[:6]
    release, namespace = f"kpcw-{suffix}", f"kpcw-sys-{suffix}"
    sandbox.kubectl("create", "namespace", namespace)
    try:
        docs = _render(helm, release, namespace, {}, tmp_path)
        rbac = [d for d in docs if d["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
        assert {d["kind"] for d in rbac} == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
        _apply(sandbox, rbac, tmp_path, release)
        subject = f"system:serviceaccount:{namespace}:{release}-kneepoint"
        for ns in ("default", "kube-public"):
            assert _can_i(sandbox, subject, "create", "deployments.apps", "-n", ns)
            assert _can_i(sandbox, subject, "patch", "parallelismexperiments.kneepoint.io", "--subresource=status", "-n", ns)
            assert not _can_i(sandbox, subject, "get", "secrets", "-n", ns)
            assert not _can_i(sandbox, subject, "update", "deployments.apps", "-n", ns)
        assert _can_i(sandbox, subject, "watch", "pods", "--all-namespaces")
        # kopf watches namespaces only to resolve a list of them; cluster-wide it does not.
        assert not _can_i(sandbox, subject, "list", "namespaces")
        assert not _can_i(sandbox, subject, "delete", "nodes")
    finally:
        sandbox.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        sandbox.kubectl("delete", "clusterrole,clusterrolebinding", "-l", f"app.kubernetes.io/instance={release}", check=False)


# --------------------------------------------------------------------------- the whole loop


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class DeployPrometheus:
    url: str


@pytest.fixture()
def deploy_prometheus(sandbox: Any, tmp_path: Path) -> Iterator[DeployPrometheus]:
    """A second Prometheus running deploy/prometheus/scrape-config.yaml against the sandbox.

    The file is meant for in-cluster use; outside the cluster, each kubernetes_sd_config
    needs the sandbox's kubeconfig, which is the only change made to it here.
    """
    found = binaries.find_all()
    assert found is not None
    config = yaml.safe_load((ROOT / "deploy" / "prometheus" / "scrape-config.yaml").read_text())
    for job in config["scrape_configs"]:
        for sd in job["kubernetes_sd_configs"]:
            sd["kubeconfig_file"] = str(sandbox.kubeconfig)
    config["global"] = {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "2s"}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = _free_port()
    log = (tmp_path / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [str(found.prometheus), f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip # argv: each flag beside its value
    url = f"http://127.0.0.1:{port}"

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return proc.poll() is not None  # exited: stop waiting, the assertion below says why

    try:
        _wait("the deploy/ Prometheus to be ready", ready, 60)
        assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()[-3000:]
        yield DeployPrometheus(url)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _query(url: str, expr: str, at: float | None = None) -> list[dict[str, Any]]:
    params = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    with urllib.request.urlopen(f"{url}/api/v1/query?{urllib.parse.urlencode(params)}", timeout=10) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def _query_range(url: str, expr: str, start: float, end: float, step: str = "2s") -> list[dict[str, Any]]:
    """What a Grafana panel asks for: a range query over the dashboard's time range."""
    params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": step}
    with urllib.request.urlopen(f"{url}/api/v1/query_range?{urllib.parse.urlencode(params)}", timeout=10) as resp:
        body = json.load(resp)
    assert body["status"] == "success", body
    return list(body["data"]["result"])


def _experiment(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "kneepoint.io/v1alpha1",
        "kind": "ParallelismExperiment",
        "metadata": {"name": EXPERIMENT, "namespace": namespace},
        "spec": {
            "mode": "Simulate",
            "model": {"uri": "sim://llama-3-8b", "maxModelLen": 2048, "architecture": {"preset": "llama-3-8b"}},
            "tiers": {"tensorParallel": [1, 2]},
            "load": {"concurrency": 4, "numRequests": 60, "inputLen": 128, "outputLen": 32, "warmupRequests": 2, "repeats": 1},
            "placement": {"gpuProduct": "NVIDIA-H200"},
            "capacity": {"peakConcurrency": 16},
        },
    }


def _argocd_health(obj: dict[str, Any]) -> tuple[str, str]:
    lua51 = pytest.importorskip("lupa.lua51")
    runtime = lua51.LuaRuntime()

    def convert(value: Any) -> Any:
        if isinstance(value, dict):
            return runtime.table_from({k: convert(v) for k, v in value.items()})
        if isinstance(value, list):
            return runtime.table_from([convert(v) for v in value])
        return value

    runtime.globals().obj = convert(obj)
    result = runtime.execute((ROOT / "deploy" / "gitops" / "argocd-health-check.lua").read_text())
    return result["status"], result["message"]


def test_experiment_reaches_decided_through_the_charts_operator(
    sandbox: Any, install: Install, deploy_prometheus: DeployPrometheus, tmp_path: Path
) -> None:
    test_chart_applies_server_side_and_the_operator_pod_runs(sandbox, install)
    started = time.time()
    _apply(sandbox, [_experiment(install.team)], tmp_path, "experiment")

    def body() -> dict[str, Any]:
        proc = sandbox.kubectl("get", "parallelismexperiments.kneepoint.io", EXPERIMENT, "-n", install.team, "-o", "json")
        return dict(json.loads(proc.stdout))

    def finished() -> dict[str, Any] | None:
        obj = body()
        phase = (obj.get("status") or {}).get("phase")
        return obj if phase in ("Decided", "Failed") else None

    operator = _operator_process(sandbox, install)
    peak_rss = operator.memory_info().rss

    def finished_sampling() -> dict[str, Any] | None:
        nonlocal peak_rss
        peak_rss = max(peak_rss, operator.memory_info().rss)
        return finished()

    obj = _wait("the experiment to be Decided", finished_sampling, 300, 0.5, detail=install.operator_log)
    cpu = operator.cpu_times()
    # The figure docs/install.md quotes for the chart's resources (pytest -s prints it).
    print(
        f"\n[chart] operator pod process: RSS peak {peak_rss / 2**20:.0f} MiB, CPU {cpu.user + cpu.system:.1f} s, "
        f"experiment Decided after {time.time() - started:.0f} s"
    )
    status = obj["status"]
    assert status["phase"] == "Decided", json.dumps(status, indent=2)[-3000:]
    decided = next(c for c in status["conditions"] if c["type"] == "Decided")
    assert decided["status"] == "True" and status["observedGeneration"] == obj["metadata"]["generation"]
    assert status["decision"]["replicas"] >= 1
    # The operator wrote its recommendation ConfigMap and posted events with its own token.
    recommendation = json.loads(
        sandbox.kubectl("get", "configmap", status["recommendation"]["configMapName"], "-n", install.team, "-o", "json").stdout
    )
    assert "inferenceservice.yaml" in recommendation["data"]
    events = json.loads(sandbox.kubectl("get", "events", "-n", install.team, "-o", "json").stdout)["items"]
    assert any(e["reason"] == "DecisionMade" for e in events)
    assert _argocd_health(obj) == ("Healthy", decided["message"])
    # A spec change the operator has not seen yet makes the same object Progressing.
    stale = json.loads(json.dumps(obj))
    stale["metadata"]["generation"] += 1
    assert _argocd_health(stale)[0] == "Progressing"

    # deploy/prometheus/scrape-config.yaml found the engine and gave it the labels the
    # dashboard filters by; the simulator's DCGM series carry the pod as exported_pod.
    url = deploy_prometheus.url
    measured = [t for t in status["tiers"] if t.get("phase") == "Measured"]
    assert measured, status["tiers"]
    tier = measured[0]["name"]
    at = time.time()
    window = f"{int(at - started) + 5}s"
    engines = _query(
        url,
        f'max_over_time(vllm:num_requests_running{{job="kneepoint-engines", namespace="{install.team}", experiment="{EXPERIMENT}", tier="{tier}"}}[{window}])',
        at,
    )
    assert engines, f"no engine series scraped by the kneepoint-engines job; targets: {_targets(url)}"
    assert engines[0]["metric"]["pod"].startswith(f"{EXPERIMENT}-{tier}-")
    gpus = _query(url, f'max_over_time(DCGM_FI_DEV_FB_USED{{job="kneepoint-sim-dcgm", exported_namespace="{install.team}"}}[{window}])', at)
    # The window spans every tier the ladder ran: the series are this experiment's pods, the measured tier's among them.
    assert gpus and all(s["metric"]["exported_pod"].startswith(f"{EXPERIMENT}-") for s in gpus), gpus
    assert any(s["metric"]["exported_pod"].startswith(f"{EXPERIMENT}-{tier}-") for s in gpus), gpus

    # Every engine and GPU panel of the dashboard has data for this experiment.
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "kneepoint-dashboard.json").read_text())
    empty = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            if "kneepoint_" in expr:
                continue  # the operator's own metrics: its metrics port is off in the sandbox
            if "DCGM_FI_PROF_NVLINK" in expr and tier.startswith("tp1-"):
                continue  # one GPU: the simulator reports no NVLink traffic series worth asserting
            concrete = (
                expr.replace("$namespace", install.team)
                .replace("$experiment", EXPERIMENT)
                .replace("$tier", ".*")
                .replace("$__rate_interval", "10s")
            )
            if not _query_range(url, concrete, started, at):
                empty.append(f"{panel['title']}: {concrete}")
    assert not empty, "dashboard queries without data:\n" + "\n".join(empty)


def _operator_process(sandbox: Any, install: Install) -> psutil.Process:
    """The host process the runner started for the operator pod (found by its pod's kubeconfig)."""
    pods = json.loads(sandbox.kubectl("get", "pods", "-n", install.namespace, "-o", "json").stdout)["items"]
    uids = [p["metadata"]["uid"] for p in pods]
    for proc in psutil.process_iter(["cmdline", "environ"]):
        try:
            cmdline, environ = proc.info["cmdline"] or [], proc.info["environ"] or {}
        except (psutil.Error, OSError):
            continue
        if cmdline[-2:] == ["kneepoint", "operator"] and any(u in environ.get("KUBECONFIG", "") for u in uids):
            return proc
    raise AssertionError(f"no process runs the operator pod of {install.namespace}")


def _targets(url: str) -> str:
    with urllib.request.urlopen(f"{url}/api/v1/targets?state=any", timeout=10) as resp:
        body = json.load(resp)
    return json.dumps([(t["labels"], t["health"], t.get("lastError")) for t in body["data"]["activeTargets"]])[:3000]
