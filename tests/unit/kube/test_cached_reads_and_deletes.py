"""The reader answers from the watch-fed cache and asks the API only on a miss; the writer deletes a tier with one
delete-collection request per kind and tells the cache (docs/performance.md, operator scale)."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace
from typing import Any

from kubernetes import client

from kneepoint.core.tiers import Tier
from kneepoint.kube import naming
from kneepoint.kube.child_cache import DEPLOYMENTS, EXPERIMENTS, JOBS, PODS, ChildCache
from kneepoint.kube.child_reader import ChildReader
from kneepoint.kube.child_writer import ChildWriter

TIER = Tier(1, 1)


def api_client() -> client.ApiClient:
    return client.ApiClient(client.Configuration())


def response(data: dict[str, Any]) -> SimpleNamespace:
    return SimpleNamespace(data=json.dumps(data).encode())


def deployment(rv: str = "5") -> dict[str, Any]:
    labels = naming.child_labels("e", TIER, naming.ROLE_ENGINE)
    return {
        "kind": "Deployment",
        "metadata": {"name": "e-tp1-pp1", "namespace": "ns", "uid": "d1", "resourceVersion": rv, "labels": labels},
    }


def test_a_cached_child_is_not_read_again_and_a_miss_is_read_once_then_cached() -> None:
    cache = ChildCache()
    calls: list[str] = []
    reader = ChildReader(api_client(), on_request=calls.append, cache=cache)

    def read_namespaced_deployment(name: str, namespace: str, **_: Any) -> SimpleNamespace:
        return response(deployment())

    reader.apps.read_namespaced_deployment = read_namespaced_deployment  # type: ignore[method-assign]
    got = asyncio.run(reader.deployment("ns", "e-tp1-pp1"))
    assert got is not None and calls == ["read_namespaced_deployment"]
    assert cache.get(DEPLOYMENTS, "ns", "e-tp1-pp1") is not None
    assert asyncio.run(reader.deployment("ns", "e-tp1-pp1")) == got
    assert calls == ["read_namespaced_deployment"]  # the second read came from the cache


def test_pods_come_from_the_cache_when_it_has_some_and_fresh_reads_ask_the_api() -> None:
    cache = ChildCache()
    calls: list[str] = []
    reader = ChildReader(api_client(), on_request=calls.append, cache=cache)
    pod = {"metadata": {"name": "e-load1-x", "namespace": "ns", "uid": "p1", "resourceVersion": "3", "labels": {"job-name": "e-load1"}}}

    def list_namespaced_pod(namespace: str, **kwargs: Any) -> SimpleNamespace:
        assert kwargs["label_selector"] == "job-name=e-load1"
        return response({"items": [pod]})

    reader.core.list_namespaced_pod = list_namespaced_pod  # type: ignore[method-assign]
    assert len(asyncio.run(reader.job_pods("ns", "e-load1"))) == 1  # a miss: read, then cached
    assert len(asyncio.run(reader.job_pods("ns", "e-load1"))) == 1
    assert calls == ["list_namespaced_pod"]
    asyncio.run(reader.job_pods("ns", "e-load1", fresh=True))
    assert calls == ["list_namespaced_pod"] * 2


def test_the_status_patch_response_is_what_the_next_pass_reads() -> None:
    cache = ChildCache()
    writer = ChildWriter(api_client(), cache=cache)
    returned = {"metadata": {"name": "e", "namespace": "ns", "uid": "u", "resourceVersion": "12"}, "status": {"phase": "Profiling"}}

    def patch_namespaced_custom_object_status(*args: Any, **_: Any) -> SimpleNamespace:
        assert args[-1] == {"status": {"phase": "Profiling"}}
        return response(returned)

    writer.custom.patch_namespaced_custom_object_status = patch_namespaced_custom_object_status  # type: ignore[method-assign]
    assert asyncio.run(writer.patch_status("ns", "e", {"phase": "Profiling"})) == returned
    assert cache.get(EXPERIMENTS, "ns", "e") == returned


def test_a_tier_is_deleted_with_one_request_per_kind_and_leaves_the_cache_at_once() -> None:
    cache = ChildCache()
    fenced: list[str] = []
    writer = ChildWriter(api_client(), fence=fenced.append, cache=cache)
    asked: list[tuple[str, dict[str, Any]]] = []

    def collection(name: str) -> Any:
        def delete(namespace: str, **kwargs: Any) -> SimpleNamespace:
            asked.append((name, kwargs))
            return response({"items": [{}]})

        delete.__name__ = name
        return delete

    writer.apps.delete_collection_namespaced_deployment = collection("delete_collection_namespaced_deployment")  # type: ignore[method-assign]
    writer.core.delete_collection_namespaced_service = collection("delete_collection_namespaced_service")  # type: ignore[method-assign]
    writer.batch.delete_collection_namespaced_job = collection("delete_collection_namespaced_job")  # type: ignore[method-assign]

    async def not_served() -> bool:
        return False

    writer.lws.served = not_served  # type: ignore[method-assign]
    engine_pod = {"metadata": {"name": "e-tp1-pp1-x", "namespace": "ns", "uid": "p1", "labels": naming.child_labels("e", TIER, "engine")}}
    job = {"metadata": {"name": "e-tp1-pp1-load1", "namespace": "ns", "uid": "j1", "labels": naming.child_labels("e", TIER, "loadtest")}}
    cache.offer(DEPLOYMENTS, deployment())
    cache.offer(PODS, engine_pod)
    cache.offer(JOBS, job)

    assert asyncio.run(writer.delete_tier("e", "ns", TIER)) == 3
    assert sorted(name for name, _ in asked) == [
        "delete_collection_namespaced_deployment",
        "delete_collection_namespaced_job",
        "delete_collection_namespaced_service",
    ]
    selector = f"{naming.LABEL_EXPERIMENT}=e,{naming.LABEL_TIER}={TIER.name}"
    assert all(kw["label_selector"] == selector and kw["propagation_policy"] == "Background" for _, kw in asked)
    assert sorted(fenced) == sorted(name for name, _ in asked)  # every request passed the leader fence
    assert cache.objects[DEPLOYMENTS] == {} and cache.objects[PODS] == {} and cache.objects[JOBS] == {}
    cache.offer(DEPLOYMENTS, deployment(rv="6"))  # a late watch event of the deleted Deployment
    assert cache.objects[DEPLOYMENTS] == {}


def test_delete_all_keeps_the_winner_and_its_pods() -> None:
    cache = ChildCache()
    writer = ChildWriter(api_client(), cache=cache)
    asked: list[dict[str, Any]] = []

    def delete(namespace: str, **kwargs: Any) -> SimpleNamespace:
        asked.append(kwargs)
        return response({"items": []})

    for api, name in ((writer.apps, "deployment"), (writer.core, "service"), (writer.batch, "job")):
        setattr(api, f"delete_collection_namespaced_{name}", delete)

    async def not_served() -> bool:
        return False

    writer.lws.served = not_served  # type: ignore[method-assign]
    cache.offer(DEPLOYMENTS, deployment())
    cache.offer(PODS, {"metadata": {"name": "p", "namespace": "ns", "uid": "p1", "labels": naming.child_labels("e", TIER, "engine")}})
    asyncio.run(writer.delete_all("e", "ns", keep_tier=TIER))
    assert {kw["field_selector"] for kw in asked} == {f"metadata.name!={naming.engine_name('e', TIER)}"}
    assert cache.get(DEPLOYMENTS, "ns", "e-tp1-pp1") is not None and len(cache.select(PODS, "ns", {})) == 1
