"""Turn a node's :class:`~kneepoint.nodeprobe.topology.Topology` into its labels and annotation.

Pure (standard library only). The keys are the ones CONTRACTS section D fixes; the operator's
TP placement and the sandbox fleet read the same keys:

- ``kneepoint.io/gpu-product``: NVML's name of GPU 0, spaces turned into ``-`` as GFD does for
  ``nvidia.com/gpu.product`` (``NVIDIA H200`` -> ``NVIDIA-H200``);
- ``kneepoint.io/gpu-count``; ``kneepoint.io/gpu-memory-mib`` (the smallest GPU's total memory,
  MiB, the unit of GFD's ``nvidia.com/gpu.memory``);
- ``kneepoint.io/nvlink-domain``: id of the largest all-NVLink group, ``<node>-nvl0`` (unique in
  the cluster because node names are), or the multi-node clique ``<ClusterUUID>.<CliqueID>``
  when every GPU of that group reports the same one;
- ``kneepoint.io/nvlink-domain-size`` (``1`` on PCIe-only nodes), ``kneepoint.io/nvlink-domains``
  (number of maximal all-NVLink groups), ``kneepoint.io/interconnect`` (nvlink|pcie|mixed);
- annotation ``kneepoint.io/gpu-topology``: compact JSON with the GPUs, the nvidia-smi-style
  link matrix, the PCIe matrix and every domain with its id.

The probe writes only ``kneepoint.io/`` keys; ``nvidia.com/`` labels belong to GFD.
A label whose value NVML could not give (a name or memory read that failed) is left out,
so the writer removes any older value instead of keeping a stale one.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from kneepoint.core import node_labels as keys
from kneepoint.nodeprobe.topology import Topology

# The keys are defined in kneepoint.core.node_labels (the operator and the sandbox read them).
LABEL_GPU_PRODUCT = keys.NODE_PROBE_GPU_PRODUCT
LABEL_GPU_COUNT = keys.NODE_PROBE_GPU_COUNT
LABEL_GPU_MEMORY_MIB = keys.NODE_PROBE_GPU_MEMORY_MIB
LABEL_NVLINK_DOMAIN = keys.NODE_NVLINK_DOMAIN
LABEL_NVLINK_DOMAIN_SIZE = keys.NODE_NVLINK_DOMAIN_SIZE
LABEL_NVLINK_DOMAINS = keys.NODE_NVLINK_DOMAINS
LABEL_INTERCONNECT = keys.NODE_INTERCONNECT
ANNOTATION_GPU_TOPOLOGY = keys.NODE_GPU_TOPOLOGY_ANNOTATION

# Every label key the probe owns: the writer removes any of these it did not just compute.
PROBE_LABEL_KEYS: tuple[str, ...] = (
    LABEL_GPU_PRODUCT,
    LABEL_GPU_COUNT,
    LABEL_GPU_MEMORY_MIB,
    LABEL_NVLINK_DOMAIN,
    LABEL_NVLINK_DOMAIN_SIZE,
    LABEL_NVLINK_DOMAINS,
    LABEL_INTERCONNECT,
)
PROBE_ANNOTATION_KEYS: tuple[str, ...] = (ANNOTATION_GPU_TOPOLOGY,)

ANNOTATION_VERSION = 1
MAX_LABEL_VALUE = 63
_LABEL_VALUE_RE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_NODE_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class NodeMarks:
    """What the probe puts on a node: labels and annotations (all values strings)."""

    labels: dict[str, str]
    annotations: dict[str, str]


def is_valid_label_value(value: str) -> bool:
    """Kubernetes label-value syntax: at most 63 of ``[A-Za-z0-9-_.]``, alphanumeric at both ends."""
    return len(value) <= MAX_LABEL_VALUE and bool(_LABEL_VALUE_RE.match(value))


def sanitize_label_value(text: str) -> str:
    """Make ``text`` a valid label value: whitespace runs -> ``-``, other invalid characters dropped.

    Ends are trimmed to alphanumerics and the result cut to 63 characters (then trimmed again).
    """
    value = re.sub(r"\s+", "-", text.strip())
    value = re.sub(r"[^A-Za-z0-9._-]", "", value)
    value = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", value)
    value = value[:MAX_LABEL_VALUE]
    return re.sub(r"[^A-Za-z0-9]+$", "", value)


def gfd_product_name(name: str) -> str:
    """The product as GFD labels it (``NVIDIA H100 80GB HBM3`` -> ``NVIDIA-H100-80GB-HBM3``)."""
    return sanitize_label_value(name)


def validate_node_name(node_name: str) -> str:
    """Return ``node_name`` if it is a valid node name (RFC 1123 subdomain), else raise ValueError."""
    if not node_name or len(node_name) > 253 or not _NODE_NAME_RE.match(node_name):
        raise ValueError(
            f"--node-name: {node_name!r} is not a Kubernetes node name (lowercase letters, digits, '-' and '.', at most 253 characters)"
        )
    return node_name


def domain_id(node_name: str, number: int) -> str:
    """``<node>-nvl<number>``; node names too long for a label keep a prefix plus a hash of the whole name."""
    suffix = f"-nvl{number}"
    candidate = f"{node_name}{suffix}"
    if is_valid_label_value(candidate):
        return candidate
    digest = hashlib.sha256(node_name.encode()).hexdigest()[:10]
    room = MAX_LABEL_VALUE - len(suffix) - len(digest) - 1
    prefix = sanitize_label_value(node_name[:room]) or "node"
    return f"{prefix}-{digest}{suffix}"


def domain_ids(topology: Topology, node_name: str) -> list[str]:
    """The id of every domain of ``topology`` in its order (largest first)."""
    ids = []
    for number, domain in enumerate(topology.domains):
        clique = topology.domain_clique(domain)
        ids.append(clique.label if clique is not None else domain_id(node_name, number))
    return ids


def node_labels(topology: Topology, node_name: str) -> dict[str, str]:
    """The ``kneepoint.io/`` labels for a node with ``topology`` (CONTRACTS section D)."""
    if not topology.gpus:
        raise ValueError("node_labels: the topology has no GPUs; a node without GPUs gets no labels")
    ids = domain_ids(topology, node_name)
    labels = {
        LABEL_GPU_COUNT: str(len(topology.gpus)),
        LABEL_NVLINK_DOMAIN: ids[0],
        LABEL_NVLINK_DOMAIN_SIZE: str(len(topology.largest_domain)),
        LABEL_NVLINK_DOMAINS: str(len(topology.domains)),
        LABEL_INTERCONNECT: topology.interconnect,
    }
    first_name = topology.gpus[0].name
    if first_name:
        product = gfd_product_name(first_name)
        if product:
            labels[LABEL_GPU_PRODUCT] = product
    memories = [gpu.memory_mib for gpu in topology.gpus if gpu.memory_mib is not None]
    if len(memories) == len(topology.gpus):
        labels[LABEL_GPU_MEMORY_MIB] = str(min(memories))
    return {key: labels[key] for key in PROBE_LABEL_KEYS if key in labels}


def topology_annotation(topology: Topology, node_name: str) -> str:
    """Compact JSON for ``kneepoint.io/gpu-topology``: GPUs, link and PCIe matrices, domains."""
    ids = domain_ids(topology, node_name)
    document: dict[str, Any] = {
        "v": ANNOTATION_VERSION,
        "interconnect": topology.interconnect,
        "gpus": [
            {
                "index": gpu.index,
                "name": gpu.name,
                "uuid": gpu.uuid,
                "pciBusId": gpu.pci_bus_id,
                "memoryMiB": gpu.memory_mib,
                "activeNvlinks": gpu.active_nvlinks,
            }
            for gpu in topology.gpus
        ],
        "links": topology.link_matrix(),
        "pcie": topology.pcie_matrix(),
        "domains": [{"id": ids[n], "gpus": list(domain)} for n, domain in enumerate(topology.domains)],
    }
    return json.dumps(document, separators=(",", ":"), sort_keys=False)


def node_marks(topology: Topology, node_name: str) -> NodeMarks:
    """Labels and annotations for a node; raises ValueError for an invalid node name or no GPUs."""
    validate_node_name(node_name)
    return NodeMarks(
        labels=node_labels(topology, node_name),
        annotations={ANNOTATION_GPU_TOPOLOGY: topology_annotation(topology, node_name)},
    )
