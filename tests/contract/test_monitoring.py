"""deploy/prometheus and deploy/grafana: the scrape jobs keep the right pods and give them
the labels the operator's queries and the dashboard use; every PromQL expression of the
dashboard names real metrics and only labels those jobs produce.

The relabelling is checked by applying the jobs' relabel_configs (Prometheus' semantics:
anchored RE2-style regexes, ``;`` separator, ``$1`` replacement) to the service-discovery
labels of pods the operator's own builders produce. The sandbox integration test runs the
same files through a real Prometheus.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from kneepoint.core.spec import parse_spec
from kneepoint.core.tiers import Tier
from kneepoint.kube import manifests, naming
from kneepoint.metrics import promql
from kneepoint.operator_metrics import OperatorMetrics

ROOT = Path(__file__).resolve().parents[2]
SCRAPE = yaml.safe_load((ROOT / "deploy" / "prometheus" / "scrape-config.yaml").read_text())
DASHBOARD = json.loads((ROOT / "deploy" / "grafana" / "kneepoint-dashboard.json").read_text())

# vLLM 0.33's exposition names (REFERENCE.md section 1: counters get _total, histograms
# _bucket/_sum/_count) and dcgm-exporter's fields (section 4).
VLLM_COUNTERS = {"vllm:prompt_tokens", "vllm:generation_tokens", "vllm:num_preemptions", "vllm:request_success"}
VLLM_GAUGES = {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:cache_config_info"}
VLLM_HISTOGRAMS = {
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_queue_time_seconds",
    "vllm:request_prefill_time_seconds",
    "vllm:request_decode_time_seconds",
    "vllm:request_inference_time_seconds",
    "vllm:request_prompt_tokens",
    "vllm:request_generation_tokens",
    "vllm:iteration_tokens_total",
}
DCGM = {
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
}


def _operator_metric_names() -> set[str]:
    """What the operator's /metrics really serves (its registry, collected)."""
    registry = CollectorRegistry()
    OperatorMetrics(registry)
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    return {family.name + suffix for family in registry.collect() for suffix in suffixes[family.type]}


KNOWN_METRICS = (
    {f"{c}_total" for c in VLLM_COUNTERS}
    | VLLM_GAUGES
    | {f"{h}{suffix}" for h in VLLM_HISTOGRAMS for suffix in ("_bucket", "_sum", "_count")}
    | DCGM
    | _operator_metric_names()
)
# Labels the scrape jobs (or the exporters themselves) put on the series the dashboard reads.
KNOWN_LABELS = {
    "namespace", "pod", "container", "node", "experiment", "tier",  # target labels (scrape-config.yaml)
    "exported_namespace", "exported_pod",  # dcgm-exporter's own, renamed (honor_labels: false)
    "le", "model_name", "engine", "gpu", "phase", "method", "part", "verb",  # the metrics' own labels
}  # fmt: skip # one row per source of labels
PROMQL_WORDS = {
    "sum", "max", "min", "avg", "count", "rate", "increase", "irate", "histogram_quantile", "label_replace",
    "max_over_time", "avg_over_time", "by", "without", "on", "ignoring", "group_left", "group_right", "or", "and",
    "unless", "offset", "label_values",
}  # fmt: skip # a word list, filled to the line


def _expressions() -> list[tuple[str, str]]:
    out = []
    for panel in DASHBOARD["panels"]:
        for target in panel.get("targets", []):
            out.append((panel["title"], target["expr"]))
    for var in DASHBOARD["templating"]["list"]:
        if var["type"] == "query":
            out.append((f"variable {var['name']}", var["query"]["query"]))
    return out


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects (strings, label matchers, grouping and ranges removed)."""
    text = re.sub(r"label_values\((.*),\s*[A-Za-z_]\w*\)$", r"label_values(\1)", expr)
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group(0)
        following = text[match.end() :].lstrip()[:1]
        if word in PROMQL_WORDS or following == "(":
            continue
        names.add(word)
    return names


def label_names(expr: str) -> set[str]:
    """Label names used in matchers and groupings, and the label label_values() lists."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    names = set()
    for selector in re.findall(r"\{([^}]*)\}", text):
        names |= set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", selector))
    for grouping in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", text):
        names |= {n.strip() for n in grouping.split(",") if n.strip()}
    names |= set(re.findall(r"label_values\(.*,\s*([A-Za-z_][A-Za-z0-9_]*)\)$", expr))
    return names


# --------------------------------------------------------------------------- dashboard


def test_dashboard_is_a_grafana_dashboard_with_the_required_panels() -> None:
    assert DASHBOARD["uid"] and DASHBOARD["title"] and DASHBOARD["schemaVersion"] >= 36
    titles = " | ".join(p["title"] for p in DASHBOARD["panels"])
    for needed in (
        "P50 / P99",
        "Time to first token",
        "GPU utilisation per GPU",
        "Framebuffer used per GPU",
        "KV-cache usage",
        "Output throughput per tier",
    ):
        assert needed in titles, needed
    variables = [v["name"] for v in DASHBOARD["templating"]["list"]]
    assert variables == ["datasource", "namespace", "experiment", "tier"]
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    for panel in DASHBOARD["panels"]:
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


@pytest.mark.parametrize(("where", "expr"), _expressions(), ids=[w for w, _ in _expressions()])
def test_every_expression_names_real_metrics_and_known_labels(where: str, expr: str) -> None:
    names = metric_names(expr)
    assert names, f"{where}: no metric found in {expr}"
    assert names <= KNOWN_METRICS, f"{where}: unknown metric(s) {sorted(names - KNOWN_METRICS)}"
    labels = label_names(expr)
    assert labels <= KNOWN_LABELS, f"{where}: labels no scrape job produces: {sorted(labels - KNOWN_LABELS)}"
    assert expr.count("(") == expr.count(")"), f"{where}: unbalanced parentheses"


def test_dashboard_reads_what_the_operator_decides_on() -> None:
    """The operator's own window queries use these metrics; the dashboard shows each."""
    exprs = " ".join(e for _, e in _expressions())
    for metric in (promql.FB_USED, promql.GPU_UTIL, promql.KV_USAGE, promql.NVLINK_TX, promql.PREEMPTIONS):
        assert metric in exprs, metric


def test_gpu_panels_match_the_engine_pods_by_name_like_the_operator() -> None:
    # promql.pod_selectors matches '<engine name>-.*'; the dashboard builds the same prefix
    # from its experiment and tier variables.
    engine = naming.engine_name("llama-8b-h200", Tier(2, 1))
    pod = f"{engine}-5d9f8c7b6-x2x9q"
    pattern = "($experiment)-($tier)-.+".replace("$experiment", "llama-8b-h200").replace("$tier", "tp2-pp1")
    assert re.fullmatch(pattern, pod)
    gpu_exprs = [e for _, e in _expressions() if "DCGM_" in e]
    assert gpu_exprs and all('exported_pod=~"($experiment)-($tier)-.+"' in e for e in gpu_exprs)


# --------------------------------------------------------------------------- scrape config


def _relabel(labels: dict[str, str], rules: list[dict[str, Any]]) -> dict[str, str] | None:
    """Prometheus relabelling (replace/keep/drop), enough for these jobs; None = dropped."""
    labels = dict(labels)
    for rule in rules:
        action = rule.get("action", "replace")
        separator = rule.get("separator", ";")
        value = separator.join(labels.get(name, "") for name in rule.get("source_labels", []))
        regex = re.compile(f"^(?:{rule.get('regex', '(.*)')})$")
        match = regex.match(value)
        if action == "keep" and not match:
            return None
        if action == "drop" and match:
            return None
        if action == "replace" and match:
            replacement = re.sub(r"\$(\d+)", r"\\g<\1>", str(rule.get("replacement", "$1")))
            result = match.expand(replacement)
            if result:
                labels[rule["target_label"]] = result
            else:
                labels.pop(rule["target_label"], None)
    return {k: v for k, v in labels.items() if not k.startswith("__") or k == "__address__"}


def _sd_labels(pod: dict[str, Any], namespace: str, name: str, ip: str, node: str, phase: str = "Running") -> list[dict[str, str]]:
    """Kubernetes SD (role pod): one target per container port, with these meta labels."""
    targets = []
    for container in pod["spec"]["containers"]:
        for port in container.get("ports", []):
            labels = {
                "__address__": f"{ip}:{port['containerPort']}",
                "__meta_kubernetes_namespace": namespace,
                "__meta_kubernetes_pod_name": name,
                "__meta_kubernetes_pod_ip": ip,
                "__meta_kubernetes_pod_node_name": node,
                "__meta_kubernetes_pod_phase": phase,
                "__meta_kubernetes_pod_container_name": container["name"],
                "__meta_kubernetes_pod_container_image": container["image"],
                "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
                "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
            }
            for key, value in pod["metadata"].get("labels", {}).items():
                labels["__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)] = value
            targets.append(labels)
    return targets


def _job(name: str) -> dict[str, Any]:
    (job,) = [j for j in SCRAPE["scrape_configs"] if j["job_name"] == name]
    return job


def _targets(job: str, pods: list[tuple[dict[str, Any], str]]) -> list[dict[str, str]]:
    out = []
    for i, (pod, name) in enumerate(pods):
        for labels in _sd_labels(pod, "llm", name, f"10.0.0.{i + 1}", f"gpu-node-{i}"):
            kept = _relabel(labels, _job(job)["relabel_configs"])
            if kept is not None:
                out.append(kept)
    return out


@pytest.fixture(scope="module")
def pods() -> dict[str, tuple[dict[str, Any], str]]:
    """Pod templates as the operator builds them, plus a dcgm-exporter pod."""
    example = yaml.safe_load((ROOT / "deploy" / "examples" / "experiment.yaml").read_text())
    owner = manifests.Owner("llama-8b-h200", "llm", "uid-1")
    tier = Tier(2, 1)
    out: dict[str, tuple[dict[str, Any], str]] = {}
    for mode in ("Measure", "Simulate"):
        spec = parse_spec({**example["spec"], "mode": mode})
        deployment = manifests.build_engine_deployment(spec, owner, tier, manifests.BuildContext())
        pod_name = f"{naming.engine_name(owner.name, tier)}-5d9f8c7b6-{mode.lower()}"
        out[f"engine-{mode}"] = (deployment["spec"]["template"], pod_name)
        job = manifests.build_load_test_job(spec, owner, tier, 1, manifests.BuildContext())
        job["spec"]["template"]["spec"]["containers"][0]["ports"] = [{"name": "http", "containerPort": 8000}]
        out[f"loadtest-{mode}"] = (job["spec"]["template"], "load-1-abcde")
    out["dcgm"] = (
        {
            "metadata": {"labels": {"app": "nvidia-dcgm-exporter"}},
            "spec": {
                "containers": [
                    {
                        "name": "nvidia-dcgm-exporter",
                        "image": "nvcr.io/nvidia/k8s/dcgm-exporter:4.5.3",
                        "ports": [{"name": "metrics", "containerPort": 9400}],
                    }
                ]
            },
        },
        "nvidia-dcgm-exporter-7xk2p",
    )
    return out


def test_scrape_jobs_are_kubernetes_pod_discovery() -> None:
    names = [j["job_name"] for j in SCRAPE["scrape_configs"]]
    assert names == ["kneepoint-engines", "kneepoint-trace", "dcgm-exporter", "kneepoint-sim-dcgm", "kneepoint-operator"]
    for job in SCRAPE["scrape_configs"]:
        assert job["kubernetes_sd_configs"] == [{"role": "pod"}]
        for rule in job["relabel_configs"]:
            re.compile(rule.get("regex", "(.*)"))


def test_engine_job_keeps_engine_pods_with_experiment_and_tier(pods: dict[str, tuple[dict[str, Any], str]]) -> None:
    targets = _targets("kneepoint-engines", list(pods.values()))
    assert len(targets) == 2, "one target per engine pod (Measure and Simulate), none for load tests or dcgm"
    for target in targets:
        assert target["experiment"] == "llama-8b-h200" and target["tier"] == "tp2-pp1"
        assert target["namespace"] == "llm" and target["pod"].startswith("llama-8b-h200-tp2-pp1-")
        assert target["container"] == manifests.ENGINE_CONTAINER
        assert target["__address__"].endswith(":8000")


def test_operator_queries_select_what_the_engine_job_labels(pods: dict[str, tuple[dict[str, Any], str]]) -> None:
    (target,) = _targets("kneepoint-engines", [pods["engine-Measure"]])
    sd_selector, _ = promql.pod_selectors("llm", naming.engine_name("llama-8b-h200", Tier(2, 1)))
    matchers = dict(re.findall(r'(\w+)=~?"([^"]*)"', sd_selector))
    assert target["namespace"] == matchers["namespace"]
    # PromQL string escaping doubles backslashes; the regex is what is inside.
    assert re.fullmatch(matchers["pod"].replace("\\\\", "\\"), target["pod"])


def test_trace_job_keeps_the_engine_pods_sidecar_under_the_labels_the_operator_selects(pods: dict[str, tuple[dict[str, Any], str]]) -> None:
    targets = _targets("kneepoint-trace", list(pods.values()))
    assert len(targets) == 2, "one trace target per engine pod (Measure and Simulate)"
    for target in targets:
        assert target["container"] == manifests.TRACE_CONTAINER and target["__address__"].endswith(f":{manifests.TRACE_PORT}")
        sd_selector = promql.trace_queries("llm", naming.engine_name("llama-8b-h200", Tier(2, 1)), 60)[0].expr
        matchers = dict(re.findall(r'(\w+)=~?"([^"]*)"', sd_selector))
        assert target["namespace"] == matchers["namespace"]
        assert re.fullmatch(matchers["pod"].replace("\\\\", "\\"), target["pod"])


def test_dcgm_job_keeps_only_the_exporter_and_renames_its_pod_labels(pods: dict[str, tuple[dict[str, Any], str]]) -> None:
    targets = _targets("dcgm-exporter", list(pods.values()))
    assert len(targets) == 1 and targets[0]["__address__"].endswith(":9400")
    assert targets[0]["pod"] == "nvidia-dcgm-exporter-7xk2p"
    # The target's pod/namespace labels exist, so the exporter's own ones arrive as exported_*.
    assert _job("dcgm-exporter")["honor_labels"] is False


def test_sim_dcgm_job_keeps_only_simulate_mode_engines(pods: dict[str, tuple[dict[str, Any], str]]) -> None:
    targets = _targets("kneepoint-sim-dcgm", list(pods.values()))
    assert len(targets) == 1
    assert targets[0]["pod"].endswith("-simulate") and targets[0]["__address__"].endswith(":9400")
    assert targets[0]["tier"] == "tp2-pp1"


def test_operator_job_keeps_the_charts_operator_pod() -> None:
    template = (ROOT / "charts" / "kneepoint" / "templates" / "_helpers.tpl").read_text()
    assert 'app.kubernetes.io/name: {{ include "kneepoint.name" . }}' in template
    pod = {
        "metadata": {"labels": {"app.kubernetes.io/name": "kneepoint", "app.kubernetes.io/component": "operator"}},
        "spec": {
            "containers": [
                {"name": "operator", "image": "ghcr.io/kneepoint/kneepoint:0.1.0", "ports": [{"name": "metrics", "containerPort": 8080}]}
            ]
        },
    }
    targets = _targets("kneepoint-operator", [(pod, "kneepoint-6c9d-abcde")])
    assert [t["__address__"] for t in targets] == ["10.0.0.1:8080"]
