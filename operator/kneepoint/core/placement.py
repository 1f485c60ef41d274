"""Where a tier fits in a fleet: a node (or NVLink domain) for one replica, nodes for a multi-node group.

Pure placement over a :class:`~kneepoint.core.observations.FleetView` (the data the broker
read); the plan asks whether a tier could ever fit, a Pending tier where it fits now.
"""

from __future__ import annotations

from kneepoint.core.observations import DomainCapacity, FleetView


def can_ever_hold(fleet: FleetView, gpus: int, require_nvlink: bool) -> bool:
    """Whether some node could hold a replica of ``gpus`` GPUs in one domain, if it were empty."""
    for d in fleet.domains:
        if d.gpus_total < gpus:
            continue
        if require_nvlink and gpus > 1 and d.nvlink_domain_size < gpus:
            continue
        return True
    return False


def free_now(fleet: FleetView, gpus: int, require_nvlink: bool) -> DomainCapacity | None:
    """A domain with ``gpus`` free GPUs now, preferring the tightest fit (less fragmentation)."""
    fits = [d for d in fleet.domains if d.gpus_free >= gpus and (not require_nvlink or gpus == 1 or d.nvlink_domain_size >= gpus)]
    return min(fits, key=lambda d: (d.gpus_free, d.node_name)) if fits else None


# Multi-node groups (one replica = ``pods`` pods of ``gpus_per_pod`` GPUs each).


def _group_slots(fleet: FleetView, gpus_per_pod: int, require_nvlink: bool, free: bool) -> dict[str | None, list[DomainCapacity]]:
    """Per topology domain, one entry per pod a node can take (a node with room for two pods appears twice)."""
    slots: dict[str | None, list[DomainCapacity]] = {}
    for d in sorted(fleet.domains, key=lambda d: (-(d.gpus_free if free else d.gpus_total), d.node_name)):
        if require_nvlink and gpus_per_pod > 1 and d.nvlink_domain_size < gpus_per_pod:
            continue
        room = (d.gpus_free if free else d.gpus_total) // max(1, gpus_per_pod)
        slots.setdefault(d.topology_domain, []).extend([d] * room)
    return slots


def can_ever_hold_group(fleet: FleetView, gpus_per_pod: int, pods: int, require_nvlink: bool, topology_key: str | None = None) -> bool:
    """Whether the fleet, if empty, could place ``pods`` pods of ``gpus_per_pod`` GPUs each (TP inside each
    pod's NVLink domain), all in one topology domain when ``topology_key`` is set."""
    slots = _group_slots(fleet, gpus_per_pod, require_nvlink, free=False)
    if topology_key is None:
        return sum(len(v) for v in slots.values()) >= pods
    return any(len(v) >= pods for k, v in slots.items() if k is not None)


def free_group(
    fleet: FleetView, gpus_per_pod: int, pods: int, require_nvlink: bool, topology_key: str | None = None
) -> tuple[DomainCapacity, ...] | None:
    """Nodes with room now for the group's pods (most free first, one entry per pod), or None.

    With ``topology_key`` all of them share one value of that label; without it the group
    may use any nodes. A node listed twice takes two of the group's pods.
    """
    slots = _group_slots(fleet, gpus_per_pod, require_nvlink, free=True)
    if topology_key is None:
        merged = sorted((d for v in slots.values() for d in v), key=lambda d: (-d.gpus_free, d.node_name))
        return tuple(merged[:pods]) if len(merged) >= pods else None
    for key in sorted(k for k in slots if k is not None):
        if len(slots[key]) >= pods:
            return tuple(slots[key][:pods])
    return None


def group_nodes_possible(fleet: FleetView, gpus_per_pod: int, require_nvlink: bool) -> int:
    """How many pods of ``gpus_per_pod`` GPUs the whole fleet could hold if it were empty (for messages)."""
    return sum(len(v) for v in _group_slots(fleet, gpus_per_pod, require_nvlink, free=False).values())
