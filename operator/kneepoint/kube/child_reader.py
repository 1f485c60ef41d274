"""Reads the experiment's children, nodes and ConfigMaps from the API (the only reader).

Calls the synchronous Kubernetes client in worker threads and returns plain dicts exactly as
the API serves them (``_preload_content=False``), so the pure functions in ``pod_status``,
``fleet`` and ``load_test_result`` see the same shapes in tests and in production.

With a :class:`~kneepoint.kube.child_cache.ChildCache` (the operator's watches feed it), the
experiment, its engine Deployment, its pods and its load-test Jobs come from there when it has
them; a miss (nothing cached) is read from the API and offered to the cache, so the cache
never answers "absent" on its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kneepoint.core.tiers import Tier
from kneepoint.kube import child_cache, naming
from kneepoint.kube.child_cache import ChildCache
from kneepoint.kube.lws_api import LeaderWorkerSetApi

log = logging.getLogger("kneepoint.reader")


def _json(resp: Any) -> dict[str, Any]:
    return json.loads(resp.data)


class ChildReader:
    """Read-only API access for one operator process."""

    def __init__(self, api_client: client.ApiClient, on_request: Callable[[str], None] | None = None, cache: ChildCache | None = None):
        self.on_request = on_request or (lambda method: None)
        self.cache = cache
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.lws = LeaderWorkerSetApi(api_client, self.on_request)

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        self.on_request(getattr(fn, "__name__", "call"))

        def run() -> dict[str, Any] | None:
            try:
                return _json(fn(*args, _preload_content=False, **kwargs))
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise

        return await asyncio.to_thread(run)

    async def _cached(self, kind: str, namespace: str, name: str, fn: Any, *args: Any) -> dict[str, Any] | None:
        """From the cache, else from the API (offered to the cache)."""
        if self.cache is not None:
            obj = self.cache.get(kind, namespace, name)
            if obj is not None:
                return obj
        obj = await self._call(fn, *args)
        if self.cache is not None:
            if obj is None:
                self.cache.absent(kind, namespace, name)
            else:
                self.cache.offer(kind, obj)
        return obj

    async def deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._cached(child_cache.DEPLOYMENTS, namespace, name, self.apps.read_namespaced_deployment, name, namespace)

    async def leader_worker_set(self, namespace: str, name: str) -> dict[str, Any] | None:
        """A multi-node tier's LeaderWorkerSet, or None."""
        return await self.lws.get(namespace, name)

    async def leader_worker_set_served(self) -> bool:
        """Whether the cluster serves the LeaderWorkerSet API (cached; see ``lws_api``)."""
        return await self.lws.served()

    async def pods(self, namespace: str, labels: dict[str, str]) -> list[dict[str, Any]]:
        selector = ",".join(f"{k}={v}" for k, v in labels.items())
        data = await self._call(self.core.list_namespaced_pod, namespace, label_selector=selector)
        return (data or {}).get("items", [])

    async def _cached_pods(self, namespace: str, labels: dict[str, str], fresh: bool = False) -> list[dict[str, Any]]:
        """Pods from the cache when it holds any that match, else (or ``fresh``) from the API (offered to the cache)."""
        if self.cache is not None and not fresh:
            found = self.cache.select(child_cache.PODS, namespace, labels)
            if found:
                return found
        pods = await self.pods(namespace, labels)
        if self.cache is not None:
            self.cache.listed(child_cache.PODS, namespace, labels, pods)
        return pods

    async def engine_pods(self, experiment: str, namespace: str, tier: Tier) -> list[dict[str, Any]]:
        return await self._cached_pods(namespace, naming.child_labels(experiment, tier, naming.ROLE_ENGINE))

    async def container_log(
        self, namespace: str, pod: str, container: str, previous: bool, tail_lines: int, limit_bytes: int
    ) -> str | None:
        """The tail of one container's log (``previous``: the run before its current one), or None.

        None when the API cannot give it: 400 (no such run: no previous container, a
        container waiting to start, or a node that serves no logs), 403 (no ``pods/log``
        get: the chart's RBAC grants it), 404 (the pod is gone). The caller falls back to
        the termination message.
        """
        self.on_request("read_namespaced_pod_log")

        def run() -> str | None:
            try:
                resp = self.core.read_namespaced_pod_log(
                    pod,
                    namespace,
                    container=container,
                    previous=previous,
                    tail_lines=tail_lines,
                    limit_bytes=limit_bytes,
                    _preload_content=False,
                )
            except ApiException as exc:
                if exc.status in (400, 403, 404):
                    log.log(
                        logging.WARNING if exc.status == 403 else logging.INFO,
                        "No log of %s/%s container %s (previous=%s): %s %s",
                        namespace,
                        pod,
                        container,
                        previous,
                        exc.status,
                        (exc.body or exc.reason or "")[:200],
                    )
                    return None
                raise
            return bytes(resp.data).decode("utf-8", "replace")

        return await asyncio.to_thread(run)

    async def job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._cached(child_cache.JOBS, namespace, name, self.batch.read_namespaced_job, name, namespace)

    async def job_pods(self, namespace: str, job_name: str, fresh: bool = False) -> list[dict[str, Any]]:
        """The Job's pods; ``fresh``: from the API whatever the cache holds (a Job's and its pods' watch events
        come on different streams, so a finished Job can be cached before its pod's termination message)."""
        return await self._cached_pods(namespace, {"job-name": job_name}, fresh)

    async def config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._call(self.core.read_namespaced_config_map, name, namespace)

    async def persistent_volume_claim(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._call(self.core.read_namespaced_persistent_volume_claim, name, namespace)

    async def secret_keys(self, namespace: str, name: str) -> frozenset[str] | None:
        """The key names of a Secret (its values are dropped at once), or None when it does not exist.

        Raises ApiException 403 where the chart grants no get on it (rbac.hubTokenSecretNames).
        """
        secret = await self._call(self.core.read_namespaced_secret, name, namespace)
        if secret is None:
            return None
        return frozenset(secret.get("data") or {}) | frozenset(secret.get("stringData") or {})

    async def nodes(self) -> list[dict[str, Any]]:
        data = await self._call(self.core.list_node)
        return (data or {}).get("items", [])

    async def active_pods_on_nodes(self) -> list[dict[str, Any]]:
        """Pods that hold resources (not Succeeded/Failed), cluster-wide: what the scheduler counts."""
        data = await self._call(self.core.list_pod_for_all_namespaces, field_selector="status.phase!=Succeeded,status.phase!=Failed")
        return (data or {}).get("items", [])

    async def experiment(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._cached(
            child_cache.EXPERIMENTS,
            namespace,
            name,
            self.custom.get_namespaced_custom_object,
            naming.GROUP,
            naming.VERSION,
            namespace,
            naming.PLURAL,
            name,
        )
