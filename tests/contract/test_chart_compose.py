"""The chart where platform teams put it: as a subchart, with its security context overridden,
scraped by a default kube-prometheus-stack, its node probe scheduled by values.

Every rendering is also checked against Kubernetes' own OpenAPI schemas (k8s_openapi), so a
value that lands in the wrong place of a pod spec fails here, not at install time. The
Prometheus Operator kinds are not in those schemas; test_monitoring.py covers them.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import k8s_openapi
import pytest
import yaml
from chart_render import ALL_ON, CHART, render, run_helm

from kneepoint.nodeprobe import daemonset as probe

# OpenShift's restricted-v2 assigns the UID: no fixed IDs anywhere.
OPENSHIFT: dict[str, Any] = {
    "podSecurityContext": {"runAsUser": None, "runAsGroup": None},
    "securityContext": {"runAsNonRoot": True},
    "probe": {"enabled": True, "securityContext": {"runAsUser": None, "runAsGroup": None}},
}
MONITORING_KINDS = {"ServiceMonitor", "PodMonitor"}


def _schema_errors(docs: list[dict[str, Any]]) -> list[str]:
    if k8s_openapi.spec_dir() is None:
        pytest.skip(k8s_openapi.download_error())
    out: list[str] = []
    for doc in docs:
        if doc["kind"] not in MONITORING_KINDS:
            out += k8s_openapi.errors(doc)
    return out


def _lint(helm: Path, chart: Path, values: dict[str, Any], tmp_path: Path) -> None:
    values_file = tmp_path / "lint-values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    proc = run_helm(helm, "lint", "--strict", str(chart), "--values", str(values_file))
    assert "0 chart(s) failed" in proc.stdout
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


def _pod(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind]
    return doc["spec"]["template"]["spec"]


@pytest.mark.parametrize("values", [{}, ALL_ON, OPENSHIFT], ids=["defaults", "everything-on", "openshift"])
def test_rendered_objects_pass_the_kubernetes_schema(helm: Path, tmp_path: Path, values: dict[str, Any]) -> None:
    assert _schema_errors(render(helm, values, tmp_path=tmp_path)) == []


def test_as_a_subchart_of_an_umbrella_chart(helm: Path, tmp_path: Path) -> None:
    umbrella = tmp_path / "platform"
    (umbrella / "charts").mkdir(parents=True)
    shutil.copytree(CHART, umbrella / "charts" / "kneepoint")
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["version"]
    (umbrella / "Chart.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v2",
                "name": "platform",
                "description": "An umbrella chart holding kneepoint",
                "version": "1.0.0",
                "icon": "https://example.com/icon.png",
                "dependencies": [{"name": "kneepoint", "version": version, "condition": "kneepoint.enabled"}],
            }
        )
    )
    values = {
        "global": {"imageRegistry": "registry.example", "labels": {"team": "ml"}},
        "kneepoint": {"enabled": True, **ALL_ON, **OPENSHIFT},
    }
    values["kneepoint"]["probe"] = {**ALL_ON["probe"], **OPENSHIFT["probe"]}
    (umbrella / "values.yaml").write_text(yaml.safe_dump(values))
    _lint(helm, umbrella, values, tmp_path)
    proc = run_helm(helm, "template", "platform", str(umbrella), "--namespace", "platform")
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert {"Deployment", "DaemonSet", "ServiceMonitor", "PodMonitor"} <= {d["kind"] for d in docs}
    assert _schema_errors(docs) == []
    assert "runAsUser" not in _pod(docs, "Deployment")["securityContext"]


def test_security_contexts_are_overridable(helm: Path, tmp_path: Path) -> None:
    _lint(helm, CHART, OPENSHIFT, tmp_path)
    docs = render(helm, OPENSHIFT, tmp_path=tmp_path)
    pod = _pod(docs, "Deployment")
    assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
    (container,) = pod["containers"]
    # A map value merges with the default: the container keeps its other defaults.
    assert container["securityContext"]["runAsNonRoot"] is True and container["securityContext"]["readOnlyRootFilesystem"] is True
    (probe_container,) = _pod(docs, "DaemonSet")["containers"]
    assert "runAsUser" not in probe_container["securityContext"] and probe_container["securityContext"]["runAsNonRoot"] is True
    default_pod = _pod(render(helm, tmp_path=tmp_path), "Deployment")
    assert default_pod["securityContext"]["runAsUser"] == 65532 == default_pod["securityContext"]["runAsGroup"]


def test_probe_scheduling_values_reach_the_daemonset_as_the_builder_makes_it(helm: Path, tmp_path: Path) -> None:
    tolerations = [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoExecute"}]
    resources = {"requests": {"cpu": "20m", "memory": "32Mi"}, "limits": {"memory": "128Mi"}}
    values = {
        "probe": {
            "enabled": True,
            "tolerations": tolerations,
            "nodeSelector": {"pool": "gpu"},
            "priorityClassName": "system-node-critical",
            "resources": resources,
        }
    }
    _lint(helm, CHART, values, tmp_path)
    docs = render(helm, values, tmp_path=tmp_path)
    (ds,) = [d for d in docs if d["kind"] == "DaemonSet"]
    expected = probe.build_probe_daemonset(
        "ghcr.io/kneepoint/kneepoint:0.1.0",
        "kneepoint-system",
        "kneepoint-probe",
        tolerations=tolerations,
        node_selector={"pool": "gpu"},
        priority_class_name="system-node-critical",
        resources=resources,
    )
    assert ds["spec"]["template"]["spec"] == expected["spec"]["template"]["spec"]
    assert _schema_errors(docs) == []


def _notes(helm: Path, tmp_path: Path, values: dict[str, Any]) -> str:
    """NOTES.txt's text: the same named template, rendered through a ConfigMap in a copy of the chart."""
    chart = tmp_path / "kneepoint"
    if not chart.exists():
        shutil.copytree(CHART, chart)
        (chart / "templates" / "zz-notes.yaml").write_text(
            'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n  notes: {{ include "kneepoint.notes" . | quote }}\n'
        )
    assert (CHART / "templates" / "NOTES.txt").read_text().strip() == '{{ include "kneepoint.notes" . }}'
    values_file = tmp_path / "notes-values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    proc = run_helm(helm, "template", "kneepoint", str(chart), "--values", str(values_file), "--show-only", "templates/zz-notes.yaml")
    return str(yaml.safe_load(proc.stdout)["data"]["notes"])


def test_monitors_carry_kube_prometheus_stacks_release_label_by_default_and_the_notes_say_so(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, {"monitoring": ALL_ON["monitoring"]}, tmp_path=tmp_path)
    monitors = [d for d in docs if d["kind"] in MONITORING_KINDS]
    assert len(monitors) == 3
    # kube-prometheus-stack 88.5: serviceMonitorSelectorNilUsesHelmValues/podMonitorSelectorNilUsesHelmValues
    # true -> the Prometheus selects matchLabels release: <release name>.
    assert all(m["metadata"]["labels"]["release"] == "kube-prometheus-stack" for m in monitors)
    renamed = render(helm, {"monitoring": {**ALL_ON["monitoring"], "labels": {"release": "monitoring"}}}, tmp_path=tmp_path)
    assert {m["metadata"]["labels"]["release"] for m in renamed if m["kind"] in MONITORING_KINDS} == {"monitoring"}
    notes = _notes(helm, tmp_path, {"monitoring": {"engines": {"podMonitor": {"enabled": True}}}})
    assert "release=kube-prometheus-stack" in notes and "set monitoring.labels.release" in notes
    assert "Monitors: none" in _notes(helm, tmp_path, {})


@pytest.mark.parametrize(
    ("exporter", "selector", "namespace_selector", "port"),
    [
        # dcgm-exporter's chart 4.8.2: templates/service.yaml port name "metrics", selectorLabels app.kubernetes.io/name.
        ("dcgm-exporter", {"app.kubernetes.io/name": "dcgm-exporter"}, {"any": True}, "metrics"),
        # GPU Operator v26.7: assets/state-dcgm-exporter/0400_service.yaml port "gpu-metrics", label app.
        ("gpu-operator", {"app": "nvidia-dcgm-exporter"}, {"matchNames": ["gpu-operator"]}, "gpu-metrics"),
    ],
)
def test_dcgm_service_monitor_is_opt_in_and_matches_the_exporters_service(
    helm: Path, tmp_path: Path, exporter: str, selector: dict[str, str], namespace_selector: dict[str, Any], port: str
) -> None:
    assert not [d for d in render(helm, tmp_path=tmp_path) if d["kind"] == "ServiceMonitor"]
    docs = render(helm, {"monitoring": {"dcgmExporter": {"serviceMonitor": {"enabled": True, "exporter": exporter}}}}, tmp_path=tmp_path)
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert monitor["spec"]["selector"] == {"matchLabels": selector}
    assert monitor["spec"]["namespaceSelector"] == namespace_selector
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == port and endpoint["honorLabels"] is False
