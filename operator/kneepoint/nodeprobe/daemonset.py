"""Manifests that run ``kneepoint probe`` on every GPU node: DaemonSet, ServiceAccount and RBAC.

Pure (standard library only): builders return plain dicts that the Helm chart renders and
tests inspect. Choices, and why:

- **GPU nodes only**: required node affinity with two alternative terms, ``nvidia.com/gpu.present``
  (set by the GPU Operator) or ``feature.node.kubernetes.io/pci-10de.present`` (NVIDIA's PCI
  vendor id, set by Node Feature Discovery), plus a toleration for the usual
  ``nvidia.com/gpu`` taint.
- **NVML without hostPath and without claiming a GPU**: the NVIDIA container runtime injects
  the driver's ``libnvidia-ml.so`` and the device nodes when ``NVIDIA_VISIBLE_DEVICES=all`` with
  ``NVIDIA_DRIVER_CAPABILITIES=utility`` (NVML is a utility capability); this is how GFD and
  dcgm-exporter read every GPU without an ``nvidia.com/gpu`` request, so the probe takes no
  GPU away from workloads. ``runtimeClassName: nvidia`` selects that runtime where it is not
  the node's default (pass ``runtime_class_name=None`` to leave it out).
- **Non-root**: NVML only opens ``/dev/nvidia*`` (mode 0666 under the NVIDIA runtime), so the
  container runs as user 65534 with no capabilities, no privilege escalation and a read-only
  root filesystem. Clusters whose toolkit sets
  ``accept-nvidia-visible-devices-envvar-when-unprivileged = false`` ignore the variable for
  unprivileged pods; there the probe sees no GPU and exits with one line (see docs/nodeprobe.md).
- **NODE_NAME** comes from the downward API (``spec.nodeName``); the probe patches only that node.
"""

from __future__ import annotations

import copy
from typing import Any

PROBE_NAME = "kneepoint-probe"
DEFAULT_INTERVAL_SECONDS = 300
NON_ROOT_UID = 65534  # "nobody": owns nothing on the node
GPU_NODE_LABELS: tuple[tuple[str, str], ...] = (
    ("nvidia.com/gpu.present", "true"),
    ("feature.node.kubernetes.io/pci-10de.present", "true"),
)


def _labels() -> dict[str, str]:
    return {
        "app.kubernetes.io/name": PROBE_NAME,
        "app.kubernetes.io/component": "node-probe",
        "app.kubernetes.io/part-of": "kneepoint",
    }


DEFAULT_TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
DEFAULT_RESOURCES = {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
DEFAULT_SECURITY_CONTEXT = {
    "runAsNonRoot": True,
    "runAsUser": NON_ROOT_UID,
    "runAsGroup": NON_ROOT_UID,
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def build_probe_daemonset(
    image: str,
    namespace: str,
    service_account: str,
    *,
    runtime_class_name: str | None = "nvidia",
    interval_seconds: int = DEFAULT_INTERVAL_SECONDS,
    image_pull_policy: str = "IfNotPresent",
    tolerations: list[dict[str, Any]] | None = None,
    node_selector: dict[str, str] | None = None,
    priority_class_name: str | None = None,
    resources: dict[str, Any] | None = None,
    security_context: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The DaemonSet that runs ``kneepoint probe --interval N`` on each GPU node.

    ``tolerations``, ``resources`` and ``security_context`` replace the defaults (tolerate
    nvidia.com/gpu:NoSchedule; 10m/64Mi, 256Mi limit; non-root 65534, read-only, no
    capabilities); ``node_selector`` and ``priority_class_name`` are added when given.

    ``image`` must contain kneepoint (its entry point ``kneepoint``); ``service_account`` needs
    get/patch on nodes (:func:`build_probe_rbac`). Raises ValueError for an empty image,
    namespace or service account, or an interval below 1 second.
    """
    for flag, value in (("image", image), ("namespace", namespace), ("service_account", service_account)):
        if not value:
            raise ValueError(f"build_probe_daemonset: {flag} must not be empty")
    if interval_seconds < 1:
        # A DaemonSet pod that exits is restarted with back-off: the probe must keep looping.
        raise ValueError(f"build_probe_daemonset: interval_seconds must be >= 1, got {interval_seconds}")
    labels = _labels()
    selector = {"app.kubernetes.io/name": PROBE_NAME}
    container = {
        "name": "probe",
        "image": image,
        "imagePullPolicy": image_pull_policy,
        "command": ["kneepoint", "probe"],
        "args": ["--interval", str(interval_seconds)],
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "utility"},
        ],
        "resources": copy.deepcopy(resources if resources is not None else DEFAULT_RESOURCES),
        "securityContext": copy.deepcopy(security_context if security_context is not None else DEFAULT_SECURITY_CONTEXT),
    }
    pod_spec: dict[str, Any] = {
        "serviceAccountName": service_account,
        "automountServiceAccountToken": True,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    # Terms are ORed: a node labelled by either the GPU Operator or NFD qualifies.
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]} for key, value in GPU_NODE_LABELS
                    ]
                }
            }
        },
        "tolerations": copy.deepcopy(tolerations if tolerations is not None else DEFAULT_TOLERATIONS),
        "containers": [container],
    }
    if not pod_spec["tolerations"]:
        del pod_spec["tolerations"]
    if node_selector:
        pod_spec["nodeSelector"] = dict(node_selector)
    if priority_class_name:
        pod_spec["priorityClassName"] = priority_class_name
    if runtime_class_name:
        pod_spec["runtimeClassName"] = runtime_class_name
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": PROBE_NAME, "namespace": namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": selector},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def build_probe_rbac(namespace: str, service_account: str) -> list[dict[str, Any]]:
    """ServiceAccount, ClusterRole (get/patch nodes) and ClusterRoleBinding for the probe."""
    labels = _labels()
    role_name = f"{PROBE_NAME}-nodes"
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": service_account, "namespace": namespace, "labels": labels},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role_name, "labels": labels},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": role_name, "labels": labels},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
            "subjects": [{"kind": "ServiceAccount", "name": service_account, "namespace": namespace}],
        },
    ]
