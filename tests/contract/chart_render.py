"""Helpers for the chart's contract tests: the pinned helm, rendering, and the operator's
API permissions derived from its code.

The permissions are read from the source, not written down a second time: every
Kubernetes client method the operator's modules name (``read_namespaced_job``,
``list_pod_for_all_namespaces``, ...) becomes a (group, resource, verb, scope) tuple, and
every kopf handler decorator a list/watch on its resource. The chart's RBAC must grant
exactly that set, so an API call added to the code without its rule fails the tests.
"""

from __future__ import annotations

import ast
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client

from kneepoint.kube import manifests, naming

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "kneepoint"
PACKAGE = ROOT / "operator" / "kneepoint"
# Modules that run inside the operator process and may call the API (the node probe,
# the sandbox and the load generator have identities of their own).
OPERATOR_MODULES = sorted(
    [PACKAGE / "reconciler.py", PACKAGE / "settings.py"]
    + list((PACKAGE / "kube").glob("*.py"))
    + list((PACKAGE / "handlers").glob("*.py"))
    + list((PACKAGE / "metrics").glob("*.py"))
)
NAMESPACE = "namespace"
CLUSTER = "cluster"
OWN = "release-namespace"
"""Scope of what the operator does in its own namespace only: its leader-election Lease."""
OWN_NAMESPACE_RESOURCES = {("coordination.k8s.io", "leases")}
LOCAL_ONLY_METHODS = {
    # A `kneepoint operator` outside the cluster looks for the chart's Lease to join its election
    # (leader_election.find_lease_namespace); in a pod, KNEEPOINT_LEASE_NAMESPACE is set and this is never called.
    "list_lease_for_all_namespaces",
}

# Client classes the operator uses, and the API group each one serves.
API_GROUPS: dict[type, str] = {
    client.CoreV1Api: "",
    client.AppsV1Api: "apps",
    client.BatchV1Api: "batch",
    client.EventsV1Api: "events.k8s.io",
    client.CustomObjectsApi: naming.GROUP,
    client.CoordinationV1Api: "coordination.k8s.io",
}
VERBS = {
    "read": "get",
    "get": "get",
    "list": "list",
    "create": "create",
    "replace": "update",
    "patch": "patch",
    "delete": "delete",
    "delete_collection": "deletecollection",
}
CLUSTER_SCOPED = {"nodes", "namespaces", "persistentvolumes", "customresourcedefinitions"}
_METHOD = re.compile(
    r"^(?P<verb>read|get|list|create|replace|patch|delete_collection|delete)_(?P<ns>namespaced_|cluster_)?(?P<kind>[a-z_]+?)"
    r"(?P<sub>_status|_log)?(?P<all>_for_all_namespaces)?$"
)


@dataclass(frozen=True, order=True)
class Permission:
    """One verb on one resource (with subresource), in a namespace or cluster-wide."""

    group: str
    resource: str
    verb: str
    scope: str
    reason: str = ""

    def key(self) -> tuple[str, str, str, str]:
        return (self.group, self.resource, self.verb, self.scope)


def run_helm(helm: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def render(
    helm: Path,
    values: dict[str, Any] | None = None,
    *,
    tmp_path: Path,
    release: str = "kneepoint",
    namespace: str = "kneepoint-system",
    include_crds: bool = False,
) -> list[dict[str, Any]]:
    """``helm template`` the chart with ``values``; the documents as dicts (empty ones dropped)."""
    values_file = tmp_path / f"values-{abs(hash(yaml.safe_dump(values or {}))):x}.yaml"
    values_file.write_text(yaml.safe_dump(values or {}))
    args = ["template", release, str(CHART), "--namespace", namespace, "--values", str(values_file)]
    if include_crds:
        args.append("--include-crds")
    proc = run_helm(helm, *args)
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def rule_permissions(rules: list[dict[str, Any]], scope: str) -> set[tuple[str, str, str, str]]:
    """Expand RBAC rules into (group, resource, verb, scope) tuples."""
    out = set()
    for rule in rules:
        for group in rule.get("apiGroups", []):
            for resource in rule.get("resources", []):
                for verb in rule.get("verbs", []):
                    out.add((group, resource, verb, scope))
    return out


def _client_methods() -> dict[str, type]:
    methods: dict[str, type] = {}
    for cls in API_GROUPS:
        for name in dir(cls):
            if _METHOD.match(name) and not name.endswith("_with_http_info"):
                methods.setdefault(name, cls)
    return methods


# Modules whose CustomObjectsApi calls address another custom resource than the experiments:
# module file name -> (API group, plural).
CUSTOM_OBJECT_MODULES = {"lws_api.py": (naming.LWS_GROUP, naming.LWS_PLURAL)}


def _plural(kind: str, cls: type) -> str:
    if cls is client.CustomObjectsApi:
        # The operator's own custom objects are its experiments (naming.PLURAL).
        return naming.PLURAL
    return kind.replace("_", "") + "s"


def client_call_permissions(path: Path) -> set[Permission]:
    """Permissions implied by every Kubernetes client method named in ``path``."""
    methods = _client_methods()
    out: set[Permission] = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in methods:
            if node.attr == "get_api_resources":
                continue  # API discovery: every authenticated user may read it (system:discovery)
            if node.attr in LOCAL_ONLY_METHODS:
                continue
            match = _METHOD.match(node.attr)
            assert match is not None
            cls = methods[node.attr]
            group = API_GROUPS[cls]
            resource = _plural(match["kind"], cls)
            if cls is client.CustomObjectsApi and path.name in CUSTOM_OBJECT_MODULES:
                group, resource = CUSTOM_OBJECT_MODULES[path.name]
            if match["sub"]:
                resource += "/" + match["sub"][1:]  # pods/status, pods/log
            namespaced = match["ns"] == "namespaced_" and not match["all"]
            scope = NAMESPACE if namespaced and resource not in CLUSTER_SCOPED else CLUSTER
            if namespaced and (group, resource) in OWN_NAMESPACE_RESOURCES:
                scope = OWN
            out.add(Permission(group, resource, VERBS[match["verb"]], scope, f"{path.name}: {node.attr}"))
    return out


def _resolve(node: ast.expr) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "naming":
        return str(getattr(naming, node.attr))
    raise AssertionError(f"cannot resolve kopf decorator argument {ast.dump(node)}")


def kopf_handler_permissions(path: Path) -> set[Permission]:
    """kopf lists and watches every resource a handler is registered for; a daemon's
    resource is also patched (kopf's finalizer and its annotations)."""
    out: set[Permission] = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for deco in node.decorator_list:
            if not isinstance(deco, ast.Call):
                continue
            name = ast.unparse(deco.func)
            if not name.startswith("kopf.") or len(deco.args) < 3:
                continue
            group, _version, plural = (_resolve(a) for a in deco.args[:3])
            group = "" if group == "" else group
            for verb in ("list", "watch"):
                out.add(Permission(group, plural, verb, NAMESPACE, f"{path.name}: @{name}"))
            if name in ("kopf.daemon", "kopf.timer", "kopf.on.create", "kopf.on.update", "kopf.on.resume", "kopf.on.delete"):
                out.add(Permission(group, plural, "patch", NAMESPACE, f"{path.name}: @{name} (finalizer, progress annotations)"))
    return out


def framework_permissions(clusterwide: bool) -> set[Permission]:
    """What kopf itself reads: CRDs always, namespaces only when it watches a list of them."""
    out = {
        Permission("apiextensions.k8s.io", "customresourcedefinitions", verb, CLUSTER, "kopf resource observer")
        for verb in ("list", "watch")
    }
    if not clusterwide:
        out |= {Permission("", "namespaces", verb, CLUSTER, "kopf namespace observer") for verb in ("list", "watch")}
    return out


def owner_reference_permissions() -> set[Permission]:
    """blockOwnerDeletion on children needs update on the owner's finalizers (where enforced)."""
    ref = manifests.Owner("x", "ns", "uid").reference()
    if ref.get("blockOwnerDeletion"):
        return {Permission(naming.GROUP, f"{naming.PLURAL}/finalizers", "update", NAMESPACE, "ownerReferences.blockOwnerDeletion")}
    return set()


def operator_permissions(clusterwide: bool) -> set[Permission]:
    """Everything the operator needs, derived from its code (see the module docstring)."""
    perms: set[Permission] = set()
    for path in OPERATOR_MODULES:
        perms |= client_call_permissions(path)
    perms |= kopf_handler_permissions(PACKAGE / "handlers" / "experiment.py")
    perms |= framework_permissions(clusterwide)
    perms |= owner_reference_permissions()
    return perms


# Every optional part of the chart switched on (the chart tests and the subchart tests render it).
ALL_ON: dict[str, Any] = {
    "watchNamespaces": ["team-a", "team-b"],
    "probe": {"enabled": True},
    "grafana": {"dashboard": {"enabled": True}},
    "monitoring": {
        "operator": {"serviceMonitor": {"enabled": True}},
        "engines": {"podMonitor": {"enabled": True, "simulatorDcgm": True}},
        "dcgmExporter": {"serviceMonitor": {"enabled": True}},
    },
}
