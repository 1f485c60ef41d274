"""The Helm chart (charts/kneepoint): lint, rendered objects, RBAC derived from the code,
CRD copies, the node-probe objects against their builders, and the monitoring copies.

Runs the pinned helm (built from its Go module into the sandbox's cache on first use);
skips only when helm is missing and cannot be built.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import (
    ALL_ON,
    CHART,
    CLUSTER,
    NAMESPACE,
    OWN,
    ROOT,
    operator_permissions,
    render,
    rule_permissions,
    run_helm,
)

from kneepoint.kube import manifests, naming
from kneepoint.nodeprobe import daemonset as probe
from kneepoint.settings import OperatorSettings

DEFAULT_IMAGE = "ghcr.io/kneepoint/kneepoint:0.1.0"
# Labels the chart adds to the metadata of every object; the builders do not know them.
HELM_LABELS = {"helm.sh/chart", "app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by"}


def _by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def _one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in _by_kind(docs, kind) if name is None or d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {[d['metadata']['name'] for d in found]}"
    return found[0]


def _env(container: dict[str, Any]) -> dict[str, str]:
    """Literal env values; downward-API ones (the metrics address = status.podIP) are set by the kubelet."""
    return {e["name"]: e.get("value", "") for e in container.get("env", []) if "valueFrom" not in e}


# --------------------------------------------------------------------------- lint


@pytest.mark.parametrize("values", [{}, ALL_ON], ids=["defaults", "everything-on"])
def test_helm_lint_is_clean(helm: Path, tmp_path: Path, values: dict[str, Any]) -> None:
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    proc = run_helm(helm, "lint", "--strict", str(CHART), "--values", str(values_file))
    assert "0 chart(s) failed" in proc.stdout
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"logFormat": "xml"}, "logFormat"),
        ({"watchNamespaces": ["Team_A"]}, "watchNamespaces"),
        ({"prometheus": {"url": "prometheus:9090"}}, "url"),
        ({"metrics": {"port": 70000}}, "port"),
        ({"replicaCount": 2}, "replicaCount"),
        ({"probe": {"intervalSeconds": 0}}, "intervalSeconds"),
    ],
)
def test_values_schema_refuses_bad_values_naming_the_key(helm: Path, tmp_path: Path, values: dict[str, Any], message: str) -> None:
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    proc = run_helm(helm, "template", "kneepoint", str(CHART), "--values", str(values_file), check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


# --------------------------------------------------------------------------- CRDs


def test_chart_crds_are_byte_identical_copies_of_crds() -> None:
    canonical = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    copies = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert canonical, "no CRDs in crds/"
    assert copies.keys() == canonical.keys(), "charts/kneepoint/crds/ must hold exactly the files of crds/"
    for name, data in canonical.items():
        assert copies[name] == data, (
            f"charts/kneepoint/crds/{name} differs from crds/{name}: copy it again (cp crds/{name} charts/kneepoint/crds/)"
        )


def test_include_crds_renders_the_crd(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, tmp_path=tmp_path, include_crds=True)
    crd = _one(docs, "CustomResourceDefinition")
    assert crd["metadata"]["name"] == "parallelismexperiments.kneepoint.io"
    assert crd == yaml.safe_load((ROOT / "crds" / "parallelismexperiments.kneepoint.io.yaml").read_text())


# --------------------------------------------------------------------------- objects


def test_default_render_has_the_operator_and_cluster_wide_rbac_only(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, tmp_path=tmp_path)
    kinds = sorted((d["apiVersion"], d["kind"]) for d in docs)
    assert kinds == [
        ("apps/v1", "Deployment"),
        ("policy/v1", "PodDisruptionBudget"),
        ("rbac.authorization.k8s.io/v1", "ClusterRole"),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
        ("rbac.authorization.k8s.io/v1", "Role"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding"),
        ("v1", "Service"),
        ("v1", "ServiceAccount"),
    ]
    for doc in docs:
        if doc["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            assert doc["metadata"]["namespace"] == "kneepoint-system"


def test_everything_on_renders_every_kind_with_its_api_version(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, ALL_ON, tmp_path=tmp_path)
    kinds = {(d["apiVersion"], d["kind"]) for d in docs}
    assert kinds == {
        ("apps/v1", "Deployment"),
        ("apps/v1", "DaemonSet"),
        ("policy/v1", "PodDisruptionBudget"),
        ("v1", "ServiceAccount"),
        ("v1", "Service"),
        ("v1", "ConfigMap"),
        ("rbac.authorization.k8s.io/v1", "ClusterRole"),
        ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
        ("rbac.authorization.k8s.io/v1", "Role"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding"),
        ("monitoring.coreos.com/v1", "ServiceMonitor"),
        ("monitoring.coreos.com/v1", "PodMonitor"),
    }
    names = [(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]) for d in docs]
    assert len(names) == len(set(names)), "two objects with the same kind, namespace and name"


def test_operator_deployment_is_non_root_read_only_and_rolls_with_a_standby(helm: Path, tmp_path: Path) -> None:
    deployment = _one(render(helm, tmp_path=tmp_path), "Deployment")
    spec = deployment["spec"]
    # Two replicas, one leading (leader election); a rolling update never removes the old pod before the new one runs.
    assert spec["replicas"] == 2
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pod = spec["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["serviceAccountName"] == "kneepoint"
    (container,) = pod["containers"]
    assert container["command"] == ["kneepoint"] and container["args"] == ["operator"]
    assert container["image"] == DEFAULT_IMAGE
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["ports"] == [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}]
    assert container["readinessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert {m["mountPath"] for m in container["volumeMounts"]} == {"/tmp"}
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()


def test_leader_election_values_reach_the_operator(helm: Path, tmp_path: Path) -> None:
    from kneepoint.kube.leader_election import ElectionTiming, timing_from_env

    (container,) = _one(render(helm, tmp_path=tmp_path), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert timing_from_env(_env(container)) == ElectionTiming(), "the chart's defaults must be the elector's own"
    downward = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"] if "valueFrom" in e}
    assert downward["KNEEPOINT_LEASE_NAMESPACE"] == "metadata.namespace"
    assert downward["KNEEPOINT_POD_NAME"] == "metadata.name"
    values = {"leaderElection": {"leaseDurationSeconds": 30, "renewDeadlineSeconds": 20, "retryPeriodSeconds": 4}}
    (container,) = _one(render(helm, values, tmp_path=tmp_path), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert timing_from_env(_env(container)) == ElectionTiming(30, 20, 4)


def test_pdb_keeps_one_operator_pod_and_is_absent_for_one_replica(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, tmp_path=tmp_path)
    pdb = _one(docs, "PodDisruptionBudget")
    pod_labels = _one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    pod = _one(docs, "Deployment")["spec"]["template"]["spec"]
    assert (
        pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"]
        == "kubernetes.io/hostname"
    )
    single = render(helm, {"replicas": 1}, tmp_path=tmp_path)
    assert not _by_kind(single, "PodDisruptionBudget")
    assert "affinity" not in _one(single, "Deployment")["spec"]["template"]["spec"]
    assert _one(single, "Deployment")["spec"]["replicas"] == 1


def test_default_images_are_the_operators_own_default() -> None:
    # The chart, the operator's settings and the manifest builders name one image.
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert f"{values['image']['repository']}:{chart['appVersion']}" == DEFAULT_IMAGE
    assert OperatorSettings().operator_image == DEFAULT_IMAGE
    assert manifests.BuildContext().operator_image == DEFAULT_IMAGE


def test_env_from_values_reaches_the_operator_settings(helm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    values = {
        "image": {"tag": "0.2.0"},
        "workloadImage": "registry.example/kneepoint:jobs",
        "prometheus": {"url": "http://prom.monitoring:9090", "scrapeIntervalSeconds": 30},
        "watchNamespaces": ["team-a", "team-b"],
        "logFormat": "json",
        "metrics": {"port": 9100},
        "extraEnv": [{"name": "KNEEPOINT_POLL_SECONDS", "value": "7"}],
    }
    (container,) = _one(render(helm, values, tmp_path=tmp_path), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "ghcr.io/kneepoint/kneepoint:0.2.0"
    env = _env(container)
    for name in list(env):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = OperatorSettings.from_env()
    assert settings.prometheus_url == "http://prom.monitoring:9090"
    assert settings.prometheus_scrape_interval_seconds == 30.0
    assert settings.operator_image == "registry.example/kneepoint:jobs"
    assert settings.namespaces == ("team-a", "team-b")
    assert settings.json_logs is True
    assert settings.metrics_port == 9100
    assert settings.ladder.poll_seconds == 7.0


def test_default_env_gives_the_default_settings(helm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (container,) = _one(render(helm, tmp_path=tmp_path), "Deployment")["spec"]["template"]["spec"]["containers"]
    for name, value in _env(container).items():
        monkeypatch.setenv(name, value)
    defaults = OperatorSettings()
    settings = OperatorSettings.from_env()
    assert settings == defaults, "the chart's defaults must be the operator's own defaults"


def test_metrics_port_zero_drops_port_probe_and_service(helm: Path, tmp_path: Path) -> None:
    values = {"metrics": {"port": 0}, "monitoring": {"operator": {"serviceMonitor": {"enabled": True}}}}
    docs = render(helm, values, tmp_path=tmp_path)
    (container,) = _one(docs, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert "ports" not in container and "readinessProbe" not in container
    assert _env(container)["KNEEPOINT_METRICS_PORT"] == "0"
    assert not _by_kind(docs, "Service") and not _by_kind(docs, "ServiceMonitor")


def test_metrics_service_targets_the_operator_pod(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, tmp_path=tmp_path)
    service = _one(docs, "Service")
    pod_labels = _one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8080, "targetPort": "metrics", "protocol": "TCP"}]


def test_scheduling_values_reach_the_pod(helm: Path, tmp_path: Path) -> None:
    values = {
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "resources": {"requests": {"cpu": "50m", "memory": "100Mi"}, "limits": {"memory": "300Mi"}},
        "priorityClassName": "system-cluster-critical",
        "imagePullSecrets": [{"name": "ghcr"}],
    }
    pod = _one(render(helm, values, tmp_path=tmp_path), "Deployment")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == values["nodeSelector"]
    assert pod["tolerations"] == values["tolerations"]
    assert pod["containers"][0]["resources"] == values["resources"]
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["imagePullSecrets"] == [{"name": "ghcr"}]


# --------------------------------------------------------------------------- RBAC


# Granted only by name, when rbac.hubTokenSecretNames lists some (the plan-time Secret check).
SECRETS_BY_NAME = {("", "secrets", "get")}


def _keys(perms: set[Any], scope: str | None = None) -> set[tuple[str, str, str, str]]:
    return {p.key() for p in perms if (scope is None or p.scope == scope) and p.key()[:3] not in SECRETS_BY_NAME}


def test_cluster_wide_rbac_grants_exactly_what_the_code_calls(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, tmp_path=tmp_path)
    role = _one(docs, "ClusterRole")
    granted = {(g, r, v) for g, r, v, _ in rule_permissions(role["rules"], CLUSTER)}
    needed = {(g, r, v) for g, r, v, scope in _keys(operator_permissions(clusterwide=True)) if scope != OWN}
    assert granted - needed == set(), f"granted but never used by the code: {sorted(granted - needed)}"
    assert needed - granted == set(), f"used by the code but not granted: {sorted(needed - granted)}"
    binding = _one(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kneepoint", "namespace": "kneepoint-system"}]


@pytest.mark.parametrize("values", [{}, {"watchNamespaces": ["team-a"]}], ids=["cluster-wide", "namespaced"])
def test_leader_election_rbac_is_leases_in_the_release_namespace_only(helm: Path, tmp_path: Path, values: dict[str, Any]) -> None:
    docs = render(helm, values, tmp_path=tmp_path)
    role = _one(docs, "Role", "kneepoint-leader-election")
    assert role["metadata"]["namespace"] == "kneepoint-system"
    needed = _keys(operator_permissions(clusterwide=not values), OWN)
    assert (
        rule_permissions(role["rules"], OWN)
        == needed
        == {("coordination.k8s.io", "leases", verb, OWN) for verb in ("get", "create", "update")}
    )
    binding = _one(docs, "RoleBinding", "kneepoint-leader-election")
    assert binding["metadata"]["namespace"] == "kneepoint-system"
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "kneepoint-leader-election"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kneepoint", "namespace": "kneepoint-system"}]
    for doc in _by_kind(docs, "ClusterRole"):
        assert not any("leases" in rule.get("resources", []) for rule in doc["rules"])


def test_namespaced_rbac_keeps_writes_inside_the_watched_namespaces(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, {"watchNamespaces": ["team-a", "team-b"]}, tmp_path=tmp_path)
    needed = operator_permissions(clusterwide=False)
    roles = [r for r in _by_kind(docs, "Role") if r["metadata"]["name"] == "kneepoint"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    for role in roles:
        assert rule_permissions(role["rules"], NAMESPACE) == _keys(needed, NAMESPACE)
    bindings = [b for b in _by_kind(docs, "RoleBinding") if b["metadata"]["name"] == "kneepoint"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kneepoint", "namespace": "kneepoint-system"}]
        assert binding["roleRef"]["kind"] == "Role"
    cluster_role = _one(docs, "ClusterRole")
    assert rule_permissions(cluster_role["rules"], CLUSTER) == _keys(needed, CLUSTER)
    # Cluster-wide, the operator only reads: nodes and pods (GPU capacity), CRDs and namespaces (kopf).
    assert {v for _, _, v, _ in rule_permissions(cluster_role["rules"], CLUSTER)} == {"list", "watch"}


def test_rbac_never_names_secrets_nor_wildcards(helm: Path, tmp_path: Path) -> None:
    for values in ({}, ALL_ON):
        for doc in render(helm, values, tmp_path=tmp_path):
            for rule in doc.get("rules", []):
                assert "secrets" not in rule.get("resources", []), doc["metadata"]["name"]
                for key in ("apiGroups", "resources", "verbs"):
                    assert "*" not in rule.get(key, []), (doc["metadata"]["name"], rule)


@pytest.mark.parametrize("values", [{}, {"watchNamespaces": ["team-a"]}], ids=["cluster-wide", "namespaced"])
def test_secrets_are_readable_only_by_the_names_given(helm: Path, tmp_path: Path, values: dict[str, Any]) -> None:
    # The code reads a hubTokenSecretRef's Secret (plan-time check) ...
    assert {p.key()[:3] for p in operator_permissions(clusterwide=not values)} >= SECRETS_BY_NAME
    # ... and the chart lets it only for the Secrets named, get only.
    docs = render(helm, {**values, "rbac": {"hubTokenSecretNames": ["hf-token"]}}, tmp_path=tmp_path)
    secret_rules = [r for d in docs for r in d.get("rules", []) if "secrets" in r.get("resources", [])]
    assert secret_rules and all(
        r == {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["hf-token"], "verbs": ["get"]} for r in secret_rules
    )


def test_rbac_rules_carry_a_reason_comment() -> None:
    text = (CHART / "templates" / "rbac.yaml").read_text()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.lstrip().startswith("- apiGroups:"):
            assert lines[i - 1].lstrip().startswith("#"), f"rbac.yaml line {i + 1}: a rule without a comment saying why"


def test_rbac_create_false_renders_no_rbac(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, {"rbac": {"create": False}}, tmp_path=tmp_path)
    assert not [d for d in docs if d["apiVersion"].startswith("rbac.authorization.k8s.io")]


# --------------------------------------------------------------------------- node probe


def _without_helm_labels(doc: dict[str, Any]) -> dict[str, Any]:
    doc = json.loads(json.dumps(doc))
    labels = doc["metadata"].get("labels", {})
    for key in HELM_LABELS:
        labels.pop(key, None)
    return doc


def test_probe_is_off_by_default(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, tmp_path=tmp_path)
    assert not _by_kind(docs, "DaemonSet")


@pytest.mark.parametrize(
    ("values", "kwargs"),
    [
        ({}, {}),
        (
            {"intervalSeconds": 60, "runtimeClassName": "", "image": {"repository": "registry.example/probe", "tag": "1.2"}},
            {"interval_seconds": 60, "runtime_class_name": None},
        ),
    ],
    ids=["defaults", "overrides"],
)
def test_probe_objects_equal_the_builders(helm: Path, tmp_path: Path, values: dict[str, Any], kwargs: dict[str, Any]) -> None:
    docs = render(helm, {"probe": {"enabled": True, **values}}, tmp_path=tmp_path)
    image = f"{values['image']['repository']}:{values['image']['tag']}" if "image" in values else DEFAULT_IMAGE
    expected_ds = probe.build_probe_daemonset(image, "kneepoint-system", "kneepoint-probe", **kwargs)
    assert _without_helm_labels(_one(docs, "DaemonSet")) == expected_ds
    rendered = {
        (d["kind"], d["metadata"]["name"]): _without_helm_labels(d)
        for d in docs
        if d["metadata"].get("labels", {}).get("app.kubernetes.io/name") == probe.PROBE_NAME and d["kind"] != "DaemonSet"
    }
    expected = {(d["kind"], d["metadata"]["name"]): d for d in probe.build_probe_rbac("kneepoint-system", "kneepoint-probe")}
    assert rendered == expected


# --------------------------------------------------------------------------- monitoring, dashboard


def test_monitoring_objects_are_off_by_default_and_match_deploy_prometheus(helm: Path, tmp_path: Path) -> None:
    assert not [d for d in render(helm, tmp_path=tmp_path) if d["apiVersion"].startswith("monitoring.coreos.com")]
    docs = render(helm, {"monitoring": ALL_ON["monitoring"]}, tmp_path=tmp_path)
    rendered = {(d["kind"], d["metadata"]["name"]): d["spec"] for d in docs if d["apiVersion"] == "monitoring.coreos.com/v1"}
    plain = yaml.safe_load_all((ROOT / "deploy" / "prometheus" / "servicemonitors.yaml").read_text())
    copies = {(d["kind"], d["metadata"]["name"]): d["spec"] for d in plain if d}
    assert rendered == copies, "deploy/prometheus/servicemonitors.yaml must equal the chart's monitoring objects"


def test_engine_pod_monitor_selects_engines_by_the_operators_labels(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, {"monitoring": {"engines": {"podMonitor": {"enabled": True}}}, "watchNamespaces": ["team-a"]}, tmp_path=tmp_path)
    monitor = _one(docs, "PodMonitor")["spec"]
    assert monitor["selector"] == {"matchLabels": {"kneepoint.io/role": "engine"}}
    assert monitor["namespaceSelector"] == {"matchNames": ["team-a"]}
    endpoint, trace = monitor["podMetricsEndpoints"]
    assert endpoint["port"] == manifests.ENGINE_PORT_NAME
    assert trace["port"] == naming.TRACE_PORT_NAME  # the trace sidecar's gauges (docs/trace.md)
    for e in (endpoint, trace):
        targets = {r["targetLabel"] for r in e["relabelings"]}
        assert {"experiment", "tier"} <= targets


def test_dcgm_service_monitor_keeps_exporter_labels_as_exported(helm: Path, tmp_path: Path) -> None:
    docs = render(helm, {"monitoring": {"dcgmExporter": {"serviceMonitor": {"enabled": True}}}}, tmp_path=tmp_path)
    (endpoint,) = _one(docs, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["honorLabels"] is False


def test_dashboard_configmap_holds_the_deploy_grafana_dashboard(helm: Path, tmp_path: Path) -> None:
    source = (ROOT / "deploy" / "grafana" / "kneepoint-dashboard.json").read_text()
    assert (CHART / "files" / "kneepoint-dashboard.json").read_text() == source, (
        "charts/kneepoint/files/kneepoint-dashboard.json must be a copy of deploy/grafana/kneepoint-dashboard.json"
    )
    docs = render(helm, {"grafana": {"dashboard": {"enabled": True}}}, tmp_path=tmp_path)
    cm = _one(docs, "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["kneepoint-dashboard.json"]) == json.loads(source)
