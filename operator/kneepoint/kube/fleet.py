"""Pure readings of the fleet: which nodes offer the experiment's GPUs, how many are free, per NVLink domain.

Nodes and pods are plain dicts as the API serves them; the node labels are GFD's and the
node probe's (core/node_labels.py). Table-tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kneepoint.core import node_labels
from kneepoint.core.observations import DomainCapacity, FleetView
from kneepoint.kube.objects import dig


def _gpu_quantity(value: Any) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def placement_problem(
    nodes: Iterable[Mapping[str, Any]], gpu_resource: str, gpu_product: str | None, node_selector: Mapping[str, str]
) -> str | None:
    """Why no node can ever hold the experiment's engines, naming the spec field; None when one can.

    Checked in the order a user would fix it: the GPU resource, the node selector, the product.
    """
    ready = [
        n
        for n in nodes
        if not dig(n, "spec", "unschedulable")
        and any(c.get("type") == "Ready" and c.get("status") == "True" for c in dig(n, "status", "conditions", default=[]))
    ]
    with_resource = [n for n in ready if _gpu_quantity(dig(n, "status", "allocatable", default={}).get(gpu_resource)) > 0]
    if not with_resource:
        offered = sorted(
            {k for n in ready for k, v in dig(n, "status", "allocatable", default={}).items() if "/" in k and _gpu_quantity(v) > 0}
        )
        return f"spec.placement.gpuResource: no Ready node offers {gpu_resource}" + (
            f" (extended resources on the nodes: {', '.join(offered)})" if offered else ""
        )
    selected = [n for n in with_resource if all(dig(n, "metadata", "labels", default={}).get(k) == v for k, v in node_selector.items())]
    if not selected:
        wanted = ", ".join(f"{k}={v}" for k, v in sorted(node_selector.items()))
        return f"spec.placement.nodeSelector: {wanted} matches none of the {len(with_resource)} node(s) offering {gpu_resource}"
    if gpu_product:
        labels = [dig(n, "metadata", "labels", default={}) for n in selected]
        products = sorted({node_gpu_product(lb) for lb in labels} - {""})
        if gpu_product not in products:
            return (
                f"spec.placement.gpuProduct: no node offering {gpu_resource} is labelled {gpu_product} "
                f"(products in the fleet: {', '.join(products) or 'none labelled'})"
            )
    return None


# GPU Feature Discovery appends this to the product under time-slicing (renameByDefault false).
SHARED_SUFFIX = "-SHARED"


def node_gpu_product(labels: Mapping[str, str]) -> str:
    """The node's GPU product: GFD's label without its time-slicing suffix, else the node probe's; "" if neither."""
    gfd = labels.get(node_labels.NODE_GPU_PRODUCT)
    if gfd:
        return gfd.removesuffix(SHARED_SUFFIX)
    return labels.get(node_labels.NODE_PROBE_GPU_PRODUCT) or ""


def product_selector(labels: Mapping[str, str], gpu_product: str) -> tuple[str, str] | None:
    """The node label (key, value) by which this node matched ``gpu_product``, for the engine's nodeSelector.

    GFD's ``nvidia.com/gpu.product`` as it is on the node (with ``-SHARED`` under time-slicing),
    else the probe's ``kneepoint.io/gpu-product``; None when the node has another product.
    """
    gfd = labels.get(node_labels.NODE_GPU_PRODUCT)
    if gfd and gfd.removesuffix(SHARED_SUFFIX) == gpu_product:
        return node_labels.NODE_GPU_PRODUCT, gfd
    if not gfd and labels.get(node_labels.NODE_PROBE_GPU_PRODUCT) == gpu_product:
        return node_labels.NODE_PROBE_GPU_PRODUCT, gpu_product
    return None


def product_selectors(nodes: Iterable[Mapping[str, Any]], gpu_product: str) -> dict[str, tuple[str, str]]:
    """Node name -> the label it matched ``gpu_product`` by (nodes of other products left out)."""
    out = {}
    for node in nodes:
        selector = product_selector(dig(node, "metadata", "labels", default={}), gpu_product)
        if selector is not None:
            out[dig(node, "metadata", "name")] = selector
    return out


def fleet_view(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    gpu_resource: str,
    gpu_product: str | None,
    node_selector: Mapping[str, str],
    reserved: Mapping[str, int] | None = None,
    topology_key: str | None = None,
) -> FleetView:
    """Free GPUs per node for the experiment's product and selector.

    ``reserved`` holds GPUs promised to engines created a moment ago whose pods the API
    does not show yet, so two passes in quick succession never promise the same GPUs twice.
    ``topology_key`` (the spec's multi-node topology label) fills each node's domain value.
    """
    used: dict[str, int] = {}
    for pod in pods:
        node = dig(pod, "spec", "nodeName")
        if not node or dig(pod, "status", "phase") in ("Succeeded", "Failed"):
            continue
        for c in dig(pod, "spec", "containers", default=[]):
            req = dig(c, "resources", "requests", default={}).get(gpu_resource) or dig(c, "resources", "limits", default={}).get(
                gpu_resource
            )
            used[node] = used.get(node, 0) + _gpu_quantity(req)
    domains = []
    for node in nodes:
        labels = dig(node, "metadata", "labels", default={})
        name = dig(node, "metadata", "name")
        if dig(node, "spec", "unschedulable"):
            continue
        if any(labels.get(k) != v for k, v in node_selector.items()):
            continue
        product = node_gpu_product(labels)
        if gpu_product and product != gpu_product:
            continue
        total = _gpu_quantity(dig(node, "status", "allocatable", default={}).get(gpu_resource))
        if total <= 0:
            continue
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in dig(node, "status", "conditions", default=[]))
        if not ready:
            continue
        size = _gpu_quantity(labels.get(node_labels.NODE_NVLINK_DOMAIN_SIZE)) or 1
        free = total - used.get(name, 0) - (reserved or {}).get(name, 0)
        domains.append(
            DomainCapacity(
                node_name=name,
                gpu_product=product,
                gpus_total=total,
                gpus_free=max(0, free),
                nvlink_domain=labels.get(node_labels.NODE_NVLINK_DOMAIN),
                nvlink_domain_size=size,
                interconnect=labels.get(node_labels.NODE_INTERCONNECT) or ("nvlink" if size > 1 else "pcie"),
                topology_domain=labels.get(topology_key) if topology_key else None,
            )
        )
    return FleetView(tuple(sorted(domains, key=lambda d: d.node_name)))
