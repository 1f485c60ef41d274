"""KNEEPOINT_RESOLVE entries: Service DNS names -> a Ready pod's loopback address."""

from __future__ import annotations

from typing import Any

from kneepoint.loadgen.resolve_rules import parse_resolve_rules
from kneepoint.sandbox.runner.resolve import build_resolve_map, service_names


def svc(name: str, ns: str, selector: dict[str, str] | None, ports: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns}, "spec": {"selector": selector, "ports": ports, **spec}}


def pod(
    name: str,
    ns: str,
    labels: dict[str, str],
    ip: str,
    ready: bool = True,
    created: str = "2026-11-29T10:00:00Z",
    port: int = 8000,
    **meta: Any,
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns, "labels": labels, "creationTimestamp": created, **meta},
        "spec": {"containers": [{"name": "engine", "ports": [{"name": "http", "containerPort": port}]}]},
        "status": {"phase": "Running", "podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


ENGINE_SVC = svc("eng", "ns1", {"app": "eng"}, [{"name": "http", "port": 8000, "targetPort": "http"}])


def test_names_for_own_and_other_namespace() -> None:
    assert service_names("eng", "ns1", "ns1") == ["eng.ns1.svc.cluster.local", "eng.ns1.svc", "eng.ns1", "eng"]
    assert service_names("eng", "ns1", "ns2", "example.org") == ["eng.ns1.svc.example.org", "eng.ns1.svc", "eng.ns1"]


def test_named_target_port_resolves_to_ready_pod() -> None:
    result = build_resolve_map("ns1", [ENGINE_SVC], [pod("eng-a", "ns1", {"app": "eng"}, "127.2.0.5")])
    assert result.entries == (
        "eng.ns1.svc.cluster.local:8000:127.2.0.5",
        "eng.ns1.svc:8000:127.2.0.5",
        "eng.ns1:8000:127.2.0.5",
        "eng:8000:127.2.0.5",
    )
    # The load generator's own parser accepts what the runner writes (CONTRACTS B).
    rules = parse_resolve_rules([], result.env_value())
    assert rules[("eng.ns1.svc.cluster.local", 8000)] == "127.2.0.5"


def test_other_namespace_has_no_short_name_and_comes_after() -> None:
    other = svc("db", "ns0", {"app": "db"}, [{"port": 5432}])
    pods = [pod("eng-a", "ns1", {"app": "eng"}, "127.2.0.5"), pod("db-0", "ns0", {"app": "db"}, "127.2.0.6", port=5432)]
    entries = build_resolve_map("ns1", [other, ENGINE_SVC], pods).entries
    assert entries[0].startswith("eng.ns1.svc.cluster.local")
    assert "db.ns0:5432:127.2.0.6" in entries and not any(e.startswith("db:") for e in entries)


def test_unready_deleting_and_non_loopback_pods_are_skipped() -> None:
    pods = [
        pod("a", "ns1", {"app": "eng"}, "127.2.0.5", ready=False),
        pod("b", "ns1", {"app": "eng"}, "10.244.0.5"),
        pod("c", "ns1", {"app": "eng"}, "127.2.0.7", deletionTimestamp="2026-11-29T10:00:00Z"),
        pod("d", "ns1", {"app": "other"}, "127.2.0.8"),
    ]
    result = build_resolve_map("ns1", [ENGINE_SVC], pods)
    assert result.entries == ()
    assert result.skipped == ("ns1/eng:8000: no Ready pod selected",)


def test_oldest_ready_pod_wins() -> None:
    pods = [
        pod("b", "ns1", {"app": "eng"}, "127.2.0.9", created="2026-11-29T11:00:00Z"),
        pod("a", "ns1", {"app": "eng"}, "127.2.0.4", created="2026-11-29T11:00:00Z"),
        pod("z", "ns1", {"app": "eng"}, "127.2.0.3", created="2026-11-29T09:00:00Z"),
    ]
    assert build_resolve_map("ns1", [ENGINE_SVC], pods).entries[0].endswith(":127.2.0.3")


def test_port_remap_cannot_be_expressed() -> None:
    remapped = svc("web", "ns1", {"app": "eng"}, [{"port": 80, "targetPort": 8000}])
    result = build_resolve_map("ns1", [remapped], [pod("a", "ns1", {"app": "eng"}, "127.2.0.5")])
    assert result.entries == ()
    assert "target port 8000 differs" in result.skipped[0]


def test_selectorless_external_name_and_udp_are_left_out() -> None:
    services = [
        svc("kubernetes", "default", None, [{"port": 443, "targetPort": 6443}]),
        svc("ext", "ns1", {"app": "eng"}, [{"port": 8000}], type="ExternalName"),
        svc("dns", "ns1", {"app": "eng"}, [{"port": 8000, "protocol": "UDP"}]),
    ]
    result = build_resolve_map("ns1", services, [pod("a", "ns1", {"app": "eng"}, "127.2.0.5")])
    assert result.entries == () and result.skipped == ()


def test_ports_without_a_pod_point_at_the_refusing_address() -> None:
    remapped = svc("web", "ns1", {"app": "eng"}, [{"port": 80, "targetPort": 8000}])
    result = build_resolve_map(
        "ns1", [ENGINE_SVC, remapped], [pod("a", "ns1", {"app": "eng"}, "127.2.0.5", ready=False)], refuse_address="127.2.0.0"
    )
    assert "eng.ns1.svc.cluster.local:8000:127.2.0.0" in result.entries
    assert "web:80:127.2.0.0" in result.entries
    assert len(result.skipped) == 2
