"""daemonset: the probe's DaemonSet and RBAC builders; and the nodeprobe import boundaries."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kneepoint.nodeprobe.daemonset import build_probe_daemonset, build_probe_rbac

PACKAGE = Path(__file__).resolve().parents[3] / "operator" / "kneepoint" / "nodeprobe"


def build(**kwargs) -> dict:
    return build_probe_daemonset("ghcr.io/example/kneepoint:0.1.0", "kneepoint-system", "kneepoint-probe", **kwargs)


def test_daemonset_runs_on_gpu_nodes_only() -> None:
    spec = build()["spec"]["template"]["spec"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = [term["matchExpressions"][0]["key"] for term in terms]
    assert keys == ["nvidia.com/gpu.present", "feature.node.kubernetes.io/pci-10de.present"]
    assert all(len(term["matchExpressions"]) == 1 for term in terms)  # ORed terms, each one condition
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]


def test_daemonset_reaches_nvml_through_the_nvidia_runtime_without_hostpath_or_gpu_claims() -> None:
    ds = build()
    spec = ds["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert spec["runtimeClassName"] == "nvidia"
    assert "volumes" not in spec and "volumeMounts" not in container
    assert "hostPath" not in json.dumps(ds)
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])
    env = {e["name"]: e for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"]["value"] == "utility"
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "runtimeClassName" not in build(runtime_class_name=None)["spec"]["template"]["spec"]


def test_daemonset_runs_the_probe_loop_as_non_root() -> None:
    ds = build(interval_seconds=120)
    container = ds["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["kneepoint", "probe"] and container["args"] == ["--interval", "120"]
    security = container["securityContext"]
    assert security["runAsNonRoot"] is True and security["runAsUser"] != 0
    assert security["allowPrivilegeEscalation"] is False and security["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in security
    assert ds["metadata"] == {
        "name": "kneepoint-probe",
        "namespace": "kneepoint-system",
        "labels": ds["spec"]["template"]["metadata"]["labels"],
    }
    selector = ds["spec"]["selector"]["matchLabels"]
    assert selector.items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    assert ds["spec"]["template"]["spec"]["serviceAccountName"] == "kneepoint-probe"


def test_daemonset_round_trips_through_yaml() -> None:
    ds = build()
    assert yaml.safe_load(yaml.safe_dump(ds)) == ds


@pytest.mark.parametrize(("kwargs", "message"), [({"interval_seconds": 0}, "interval_seconds must be >= 1")])
def test_daemonset_refuses_a_once_only_interval(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build(**kwargs)


def test_daemonset_refuses_empty_arguments() -> None:
    with pytest.raises(ValueError, match="image must not be empty"):
        build_probe_daemonset("", "ns", "sa")


def test_rbac_grants_get_and_patch_on_nodes_to_the_service_account() -> None:
    account, role, binding = build_probe_rbac("kneepoint-system", "kneepoint-probe")
    assert account["kind"] == "ServiceAccount" and account["metadata"]["namespace"] == "kneepoint-system"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kneepoint-probe", "namespace": "kneepoint-system"}]


def _top_level_imports(path: Path) -> set[str]:
    """Modules a file imports at module level (not inside functions)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def _all_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_reader_imports_pynvml_and_only_the_writer_imports_kubernetes() -> None:
    for path in PACKAGE.glob("*.py"):
        imports = _all_imports(path)
        assert ("pynvml" in imports) == (path.name == "nvml_reader.py"), path.name
        assert ("kubernetes" in imports) == (path.name == "node_writer.py"), path.name


@pytest.mark.parametrize("module", ["nvml_reader", "topology", "node_labels", "daemonset"])
def test_pure_modules_need_only_the_standard_library_at_import(module: str) -> None:
    third_party = _top_level_imports(PACKAGE / f"{module}.py") - set(sys.stdlib_module_names) - {"__future__", "kneepoint"}
    assert third_party == set()


def test_reader_path_imports_no_kubernetes_click_or_pynvml() -> None:
    # What the device machine ran: the reader and the pure modules, without kneepoint installed.
    code = (
        "import sys; import kneepoint.nodeprobe.nvml_reader, kneepoint.nodeprobe.topology, kneepoint.nodeprobe.node_labels;"
        "print(sorted(m for m in ('kubernetes', 'click', 'pynvml', 'yaml') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
