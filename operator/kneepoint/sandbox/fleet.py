"""The simulated GPU fleet: a small document of node groups -> Kubernetes Node objects.

Pure (standard library only): :func:`parse_fleet` validates the already-loaded document
(YAML parsing happens in the adapter) and :func:`node_objects` returns the Node dicts the
sandbox creates. Nodes carry what a real GPU node carries after NVIDIA GPU Feature
Discovery and kneepoint's node probe ran (CONTRACTS.md section D): GFD's
``nvidia.com/gpu.{product,count,memory}``, the ``kneepoint.io/*`` topology labels, and
``nvidia.com/gpu`` in capacity and allocatable. KWOK keeps the given status and marks the
nodes Ready.

Document shape (``deploy/sandbox/fleet.yaml``)::

    kind: SandboxFleet
    nodeGroups:
    - namePrefix: h200        # nodes h200-0, h200-1, ...
      count: 2
      gpuProduct: NVIDIA-H200 # GFD product label
      gpuCount: 8
      gpuMemoryMiB: 143771    # GFD's nvidia.com/gpu.memory
      interconnect: nvlink    # nvlink | pcie | mixed
      nvlinkDomainSize: 8     # GPUs in the largest all-NVLink group (1 on PCIe)
      cpu: "128"
      memory: 2Ti
      ephemeralStorage: 2Ti   # optional (default 2Ti): engine pods request ephemeral storage for the model cache
      interNodeGbps: 400      # optional: kneepoint.io/inter-node-gbps (PP across nodes)
      labels: {}              # optional extra labels
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kneepoint.core import node_labels as keys

FLEET_KIND = "SandboxFleet"
INTERCONNECTS = ("nvlink", "pcie", "mixed")
# Marks the nodes the sandbox owns, so a changed fleet file removes nodes no longer listed.
SANDBOX_NODE_LABEL = "kneepoint.io/sandbox-node"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_GROUP_KEYS = {
    "namePrefix",
    "count",
    "gpuProduct",
    "gpuCount",
    "gpuMemoryMiB",
    "interconnect",
    "nvlinkDomainSize",
    "cpu",
    "memory",
    "ephemeralStorage",
    "pods",
    "interNodeGbps",
    "labels",
}


class FleetError(ValueError):
    """The fleet document is invalid; the message names the field and what is allowed."""


@dataclass(frozen=True)
class NodeGroup:
    """``count`` identical simulated nodes named ``<name_prefix>-<i>``."""

    name_prefix: str
    count: int
    gpu_product: str
    gpu_count: int
    gpu_memory_mib: int
    interconnect: str
    nvlink_domain_size: int
    cpu: str
    memory: str
    pods: int = 110
    ephemeral_storage: str = "2Ti"
    """Allocatable ephemeral-storage: engine pods request it for the downloaded weights (default emptyDir cache)."""
    inter_node_gbps: float | None = None
    labels: dict[str, str] = field(default_factory=dict)

    def node_names(self) -> list[str]:
        """Names of this group's nodes."""
        return [f"{self.name_prefix}-{i}" for i in range(self.count)]


def _int(group: dict[str, Any], key: str, where: str, minimum: int, default: int | None = None) -> int:
    value = group.get(key)
    value = default if value is None else value  # an explicit null means "use the default"
    if value is None:
        raise FleetError(f"{where}.{key}: required (integer >= {minimum})")
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise FleetError(f"{where}.{key}: {value!r} is not an integer >= {minimum}")
    return value


def _str(group: dict[str, Any], key: str, where: str, default: str | None = None) -> str:
    value = group.get(key)
    value = default if value is None else value
    if value is None:
        raise FleetError(f"{where}.{key}: required (string)")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value:
        raise FleetError(f"{where}.{key}: {value!r} is not a non-empty string")
    return value


def parse_group(group: Any, where: str) -> NodeGroup:
    """Validate one node group (``where`` is its path, e.g. ``nodeGroups[0]``)."""
    if not isinstance(group, dict):
        raise FleetError(f"{where}: expected a mapping with keys {sorted(_GROUP_KEYS)}")
    unknown = sorted(set(group) - _GROUP_KEYS)
    if unknown:
        raise FleetError(f"{where}.{unknown[0]}: unknown key (allowed: {', '.join(sorted(_GROUP_KEYS))})")
    prefix = _str(group, "namePrefix", where)
    if not _DNS_LABEL.match(prefix) or len(prefix) > 50:
        raise FleetError(f"{where}.namePrefix: {prefix!r} is not a lowercase DNS label (a-z, 0-9, '-'; at most 50)")
    count = _int(group, "count", where, 1)
    gpu_count = _int(group, "gpuCount", where, 0)
    if gpu_count:
        product = _str(group, "gpuProduct", where)
        if not _LABEL_VALUE.match(product) or len(product) > 63:
            raise FleetError(f"{where}.gpuProduct: {product!r} is not a valid label value (e.g. NVIDIA-H200)")
        memory_mib = _int(group, "gpuMemoryMiB", where, 1)
    else:
        product, memory_mib = "", 0
    interconnect = _str(group, "interconnect", where, "pcie")
    if interconnect not in INTERCONNECTS:
        raise FleetError(f"{where}.interconnect: {interconnect!r} is not one of {', '.join(INTERCONNECTS)}")
    domain = _int(group, "nvlinkDomainSize", where, 1, gpu_count if interconnect == "nvlink" and gpu_count else 1)
    if gpu_count and domain > gpu_count:
        raise FleetError(f"{where}.nvlinkDomainSize: {domain} is more than gpuCount {gpu_count}")
    if interconnect == "pcie" and domain != 1:
        raise FleetError(f"{where}.nvlinkDomainSize: {domain} with interconnect pcie (allowed: 1)")
    if interconnect == "nvlink" and gpu_count > 1 and domain == 1:
        raise FleetError(f"{where}.nvlinkDomainSize: 1 with interconnect nvlink (use pcie, or a size >= 2)")
    cpu = _str(group, "cpu", where)
    memory = _str(group, "memory", where)
    storage = str(group.get("ephemeralStorage") or "2Ti")
    for key, value in (("cpu", cpu), ("memory", memory), ("ephemeralStorage", storage)):
        if not _QUANTITY.match(value):
            raise FleetError(f"{where}.{key}: {value!r} is not a Kubernetes quantity (e.g. 128, 500m, 2Ti)")
    pods = _int(group, "pods", where, 1, 110)
    gbps = group.get("interNodeGbps")
    if gbps is not None and (isinstance(gbps, bool) or not isinstance(gbps, (int, float)) or gbps <= 0):
        raise FleetError(f"{where}.interNodeGbps: {gbps!r} is not a positive number")
    labels = group.get("labels") or {}
    if not isinstance(labels, dict):
        raise FleetError(f"{where}.labels: expected a mapping of label key -> string value")
    clean: dict[str, str] = {}
    for key, value in labels.items():
        text = value if isinstance(value, str) else str(value).lower() if isinstance(value, bool) else str(value)
        if not isinstance(key, str) or not _LABEL_KEY.match(key):
            raise FleetError(f"{where}.labels: {key!r} is not a valid label key")
        if not _LABEL_VALUE.match(text) or len(text) > 63:
            raise FleetError(f"{where}.labels.{key}: {text!r} is not a valid label value")
        clean[key] = text
    return NodeGroup(
        name_prefix=prefix,
        count=count,
        gpu_product=product,
        gpu_count=gpu_count,
        gpu_memory_mib=memory_mib,
        interconnect=interconnect,
        nvlink_domain_size=domain,
        cpu=cpu,
        memory=memory,
        pods=pods,
        ephemeral_storage=storage,
        inter_node_gbps=float(gbps) if gbps is not None else None,
        labels=clean,
    )


def parse_fleet(document: Any) -> list[NodeGroup]:
    """Validate a loaded fleet document; raises FleetError naming the first bad field."""
    if not isinstance(document, dict):
        raise FleetError("fleet: expected a mapping with kind: SandboxFleet and nodeGroups: [...]")
    kind = document.get("kind", FLEET_KIND)
    if kind != FLEET_KIND:
        raise FleetError(f"kind: {kind!r} (allowed: {FLEET_KIND})")
    unknown = sorted(set(document) - {"kind", "apiVersion", "nodeGroups"})
    if unknown:
        raise FleetError(f"{unknown[0]}: unknown key (allowed: kind, nodeGroups)")
    groups = document.get("nodeGroups")
    if not isinstance(groups, list) or not groups:
        raise FleetError("nodeGroups: required, a non-empty list of node groups")
    parsed = [parse_group(group, f"nodeGroups[{i}]") for i, group in enumerate(groups)]
    seen: dict[str, str] = {}
    for i, group in enumerate(parsed):
        for name in group.node_names():
            if name in seen:
                raise FleetError(f"nodeGroups[{i}].namePrefix: node name {name} also comes from {seen[name]}")
            seen[name] = f"nodeGroups[{i}]"
    return parsed


def node_labels(group: NodeGroup, node_name: str) -> dict[str, str]:
    """Labels of one node: hostname, GFD's, kneepoint's topology labels, then the group's extras."""
    labels = {
        "kubernetes.io/hostname": node_name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "type": "kwok",
        SANDBOX_NODE_LABEL: "true",
    }
    if group.gpu_count:
        domains = -(-group.gpu_count // group.nvlink_domain_size)  # a smaller last group counts too
        labels.update(
            {
                keys.NODE_GPU_PRESENT: "true",
                keys.NODE_GPU_PRODUCT: group.gpu_product,
                keys.NODE_GPU_COUNT: str(group.gpu_count),
                keys.NODE_GPU_MEMORY: str(group.gpu_memory_mib),
                keys.NODE_PROBE_GPU_PRODUCT: group.gpu_product,
                keys.NODE_PROBE_GPU_COUNT: str(group.gpu_count),
                keys.NODE_PROBE_GPU_MEMORY_MIB: str(group.gpu_memory_mib),
                keys.NODE_INTERCONNECT: group.interconnect,
                # The largest all-NVLink group is the first one; the id is unique in the cluster.
                keys.NODE_NVLINK_DOMAIN: f"{node_name}-nvl0",
                keys.NODE_NVLINK_DOMAIN_SIZE: str(group.nvlink_domain_size),
                keys.NODE_NVLINK_DOMAINS: str(domains),
            }
        )
    if group.inter_node_gbps is not None:
        labels[keys.NODE_INTER_NODE_GBPS] = _number(group.inter_node_gbps)
    labels.update(group.labels)
    return labels


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def node_objects(groups: list[NodeGroup]) -> list[dict[str, Any]]:
    """The Node objects (with status) for every node of every group, in fleet order."""
    nodes: list[dict[str, Any]] = []
    for group in groups:
        resources = {"cpu": group.cpu, "memory": group.memory, "ephemeral-storage": group.ephemeral_storage, "pods": str(group.pods)}
        if group.gpu_count:
            resources[keys.GPU_RESOURCE] = str(group.gpu_count)
        for name in group.node_names():
            nodes.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "labels": node_labels(group, name),
                        "annotations": {KWOK_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    },
                    # No kwok taint: manifests must schedule here exactly as on a real cluster.
                    "spec": {"providerID": f"kwok://{name}"},
                    "status": {"allocatable": dict(resources), "capacity": dict(resources)},
                }
            )
    return nodes
