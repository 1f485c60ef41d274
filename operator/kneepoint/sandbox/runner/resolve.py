"""Service names -> pod loopback addresses: the sandbox's stand-in for kube-proxy and DNS.

Pure (standard library only). In a cluster a load generator dials
``http://engine.ns.svc.cluster.local:8000``; cluster DNS returns the Service's ClusterIP and
kube-proxy forwards to a Ready pod. The sandbox has neither: ClusterIPs (10.96.x) must never
be dialled (network rule), and the endpoint controllers cannot help because the API server
refuses loopback addresses in Endpoints and EndpointSlices (the sandbox does not run them). So the runner gives each
process ``KNEEPOINT_RESOLVE`` (CONTRACTS B, curl's ``--resolve``): for every Service port,
``HOST:PORT:ADDR`` entries for the names DNS would answer -

- ``<svc>.<ns>.svc.<cluster-domain>``, ``<svc>.<ns>.svc``, ``<svc>.<ns>`` for every Service;
- ``<svc>`` for Services in the process's own namespace (its DNS search path);

where ADDR is the loopback address of one Ready pod the Service selects (the oldest,
then by name, so the choice is stable). ``--resolve`` swaps the address, never the port,
so a pod is used only when the Service's port equals its target port (named target ports
are looked up in the pod's containers).

A Service port without such a pod still gets entries, pointing at ``refuse_address``
(the runner passes its range's network address, where nothing listens): connecting is
refused at once, as kube-proxy rejects connections to a Service without endpoints, and
the name is never sent to the host's DNS resolver (which would leave loopback). Such
ports are also listed in ``skipped`` with the reason.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kneepoint.sandbox.runner.plans import container_port

ENV_VAR = "KNEEPOINT_RESOLVE"
DEFAULT_CLUSTER_DOMAIN = "cluster.local"


@dataclass(frozen=True)
class ResolveMap:
    """The entries for one process, and Service ports that could not get one (with why)."""

    entries: tuple[str, ...]
    skipped: tuple[str, ...] = field(default=())

    def env_value(self) -> str:
        """The comma-separated value for ``KNEEPOINT_RESOLVE``."""
        return ",".join(self.entries)


def _is_ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status") or {}
    if (pod.get("metadata") or {}).get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    for condition in status.get("conditions") or []:
        if condition.get("type") == "Ready":
            return condition.get("status") == "True"
    return False


def _loopback_ip(pod: Mapping[str, Any]) -> str | None:
    address = (pod.get("status") or {}).get("podIP")
    try:
        return address if address and ipaddress.ip_address(address).is_loopback else None
    except ValueError:
        return None


def _selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


def _target_port(pod: Mapping[str, Any], target: Any) -> int:
    for container in (pod.get("spec") or {}).get("containers") or []:
        port = container_port(container, target)
        if port:
            return port
    return 0


def service_names(name: str, namespace: str, own_namespace: str, cluster_domain: str = DEFAULT_CLUSTER_DOMAIN) -> list[str]:
    """The DNS names a process in ``own_namespace`` may use for Service ``namespace/name``."""
    names = [f"{name}.{namespace}.svc.{cluster_domain}", f"{name}.{namespace}.svc", f"{name}.{namespace}"]
    if namespace == own_namespace:
        names.append(name)
    return names


def build_resolve_map(
    own_namespace: str,
    services: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    cluster_domain: str = DEFAULT_CLUSTER_DOMAIN,
    refuse_address: str | None = None,
) -> ResolveMap:
    """``KNEEPOINT_RESOLVE`` entries for a process in ``own_namespace`` (see the module doc).

    Services of the own namespace come first; Services without a selector or of type
    ExternalName are left out (they have no pods to point at).
    """
    ready_by_namespace: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        if _is_ready(pod) and _loopback_ip(pod):
            metadata = pod.get("metadata") or {}
            ready_by_namespace.setdefault(str(metadata.get("namespace", "")), []).append(pod)
    for candidates in ready_by_namespace.values():
        candidates.sort(key=lambda p: (str((p.get("metadata") or {}).get("creationTimestamp", "")), str(p["metadata"].get("name", ""))))

    def order(service: Mapping[str, Any]) -> tuple[int, str, str]:
        metadata = service.get("metadata") or {}
        namespace = str(metadata.get("namespace", ""))
        return (0 if namespace == own_namespace else 1, namespace, str(metadata.get("name", "")))

    entries: list[str] = []
    skipped: list[str] = []
    for service in sorted(services, key=order):
        metadata = service.get("metadata") or {}
        spec = service.get("spec") or {}
        name, namespace = str(metadata.get("name", "")), str(metadata.get("namespace", ""))
        selector = spec.get("selector") or {}
        if not selector or spec.get("type") == "ExternalName":
            continue
        selected = [p for p in ready_by_namespace.get(namespace, []) if _selects(selector, (p.get("metadata") or {}).get("labels") or {})]
        for port_spec in spec.get("ports") or []:
            if str(port_spec.get("protocol") or "TCP") != "TCP":
                continue
            port = int(port_spec.get("port", 0))
            target = port_spec.get("targetPort", port)
            address = None
            mismatch = 0
            for pod in selected:
                target_port = _target_port(pod, target)
                if target_port == port:
                    address = _loopback_ip(pod)
                    break
                if target_port:
                    mismatch = target_port
            if address is None:
                if mismatch:
                    skipped.append(f"{namespace}/{name}:{port}: target port {mismatch} differs (--resolve cannot change ports)")
                elif selected:
                    skipped.append(f"{namespace}/{name}:{port}: no Ready pod has target port {target!r}")
                else:
                    skipped.append(f"{namespace}/{name}:{port}: no Ready pod selected")
                if refuse_address is None:
                    continue
                address = refuse_address
            for host in service_names(name, namespace, own_namespace, cluster_domain):
                entries.append(f"{host}:{port}:{address}")
    return ResolveMap(entries=tuple(entries), skipped=tuple(skipped))
