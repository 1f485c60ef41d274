"""The only module that writes to the Kubernetes API: children, status and events.

Every write is idempotent: creating an object that already exists (HTTP 409) counts as
success, deleting one that is gone (404) too. That is what makes a reconcile pass safe to
repeat after a crash at any point.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kneepoint.core.tiers import Tier
from kneepoint.core.timestamps import now_rfc3339
from kneepoint.kube import child_cache, naming
from kneepoint.kube.child_cache import ChildCache
from kneepoint.kube.lws_api import LeaderWorkerSetApi

log = logging.getLogger("kneepoint.kube")
EVENT_THREADS = 4


class ChildWriter:
    """Write access for one operator process."""

    def __init__(
        self,
        api_client: client.ApiClient,
        component: str = "kneepoint-operator",
        on_request: Callable[[str], None] | None = None,
        fence: Callable[[str], None] | None = None,
        cache: ChildCache | None = None,
    ):
        count = on_request or (lambda method: None)
        check = fence or (lambda method: None)

        def before_request(method: str) -> None:
            # Every call this writer makes passes here first: the leader-election fence raises
            # LeadershipLost in a process that no longer holds the Lease, so it writes nothing.
            check(method)
            count(method)

        self.on_request = before_request
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.lws = LeaderWorkerSetApi(api_client, self.on_request)
        self.component = component
        # Events post in the background (see Reconciler._write) on threads of their own: a burst of them never
        # queues ahead of a pass's creates, deletes and status patch for the shared worker threads.
        self.event_threads = ThreadPoolExecutor(max_workers=EVENT_THREADS, thread_name_prefix="kneepoint-events")
        self.cache = cache
        """The reader's cache: told what this writer deleted and which experiment its status patch returned."""

    async def create(self, body: dict[str, Any]) -> bool:
        """Create ``body`` unless it exists. Returns True when this call created it."""
        kind, ns = body["kind"], body["metadata"]["namespace"]
        if kind == naming.LWS_KIND:
            created_group = await self.lws.create(body)
            if created_group:
                log.info("Created %s %s/%s", kind, ns, body["metadata"]["name"])
            return created_group
        fn = {
            "Deployment": self.apps.create_namespaced_deployment,
            "Service": self.core.create_namespaced_service,
            "Job": self.batch.create_namespaced_job,
            "ConfigMap": self.core.create_namespaced_config_map,
        }[kind]

        self.on_request(fn.__name__)

        def run() -> bool:
            try:
                fn(ns, body, _preload_content=False)
                return True
            except ApiException as exc:
                if exc.status == 409:
                    return False
                raise

        created = await asyncio.to_thread(run)
        if created:
            log.info("Created %s %s/%s", kind, ns, body["metadata"]["name"])
        return created

    async def replace_config_map(self, body: dict[str, Any]) -> None:
        """Create or replace a ConfigMap (the recommendation changes when the decision is re-made)."""
        ns, name = body["metadata"]["namespace"], body["metadata"]["name"]
        self.on_request("create_namespaced_config_map")

        def run() -> None:
            try:
                self.core.create_namespaced_config_map(ns, body, _preload_content=False)
            except ApiException as exc:
                if exc.status != 409:
                    raise
                self.core.replace_namespaced_config_map(name, ns, body, _preload_content=False)

        await asyncio.to_thread(run)

    async def delete_by_labels(self, namespace: str, labels: dict[str, str], kinds: tuple[str, ...], keep: set[str] | None = None) -> int:
        """Delete children matching ``labels``, but those named in ``keep``: one delete-collection request per kind,
        all kinds at once (Background propagation: pods go with their owners). Returns how many the API deleted."""
        selector = _selector(labels)
        fields = ",".join(f"metadata.name!={name}" for name in sorted(keep or ())) or None
        collection = {
            "deployments": self.apps.delete_collection_namespaced_deployment,
            "services": self.core.delete_collection_namespaced_service,
            "jobs": self.batch.delete_collection_namespaced_job,
        }

        def run(kind: str) -> int:
            fn = collection[kind]
            self.on_request(fn.__name__)
            resp = fn(namespace, label_selector=selector, field_selector=fields, propagation_policy="Background", _preload_content=False)
            try:
                return len(json.loads(resp.data).get("items") or [])
            except (ValueError, AttributeError):
                return 0

        counts = await asyncio.gather(*(asyncio.to_thread(run, kind) for kind in kinds))
        if self.cache is not None:
            kept = keep or set()
            # A kept engine's pods stay too: they carry its tier label (the Deployment's name is the engine's).
            kept_tiers = {d["metadata"].get("labels", {}).get(naming.LABEL_TIER) for d in self._cached(namespace, kept)}
            self.cache.forget(
                [k for k in (child_cache.DEPLOYMENTS, child_cache.JOBS) if k in kinds],
                namespace,
                labels,
                lambda o: o["metadata"]["name"] in kept,
            )
            self.cache.forget(
                (child_cache.PODS,),
                namespace,
                labels,
                lambda o: (
                    (o["metadata"].get("labels") or {}).get(naming.LABEL_TIER) in kept_tiers
                    and (o["metadata"].get("labels") or {}).get(naming.LABEL_ROLE) == naming.ROLE_ENGINE
                ),
            )
        count = sum(counts)
        if count:
            log.info("Deleted %d object(s) in %s matching %s", count, namespace, selector)
        return count

    def _cached(self, namespace: str, names: set[str]) -> list[dict[str, Any]]:
        assert self.cache is not None
        return [o for o in (self.cache.objects[child_cache.DEPLOYMENTS].get((namespace, n)) for n in names) if o is not None]

    async def delete_tier(self, experiment: str, namespace: str, tier: Tier, keep_engine: bool = False) -> int:
        labels = {naming.LABEL_EXPERIMENT: naming.experiment_label_value(experiment), naming.LABEL_TIER: tier.name}
        kinds = ("jobs",) if keep_engine else ("deployments", "services", "jobs")
        deleted = await self.delete_by_labels(namespace, labels, kinds)
        if not keep_engine:
            deleted += await self.lws.delete_by_labels(namespace, _selector(labels))
        return deleted

    async def delete_all(self, experiment: str, namespace: str, keep_tier: Tier | None = None) -> int:
        labels = {naming.LABEL_EXPERIMENT: naming.experiment_label_value(experiment)}
        keep = {naming.engine_name(experiment, keep_tier)} if keep_tier else None
        deleted = await self.delete_by_labels(namespace, labels, ("deployments", "services", "jobs"), keep=keep)
        return deleted + await self.lws.delete_by_labels(namespace, _selector(labels), keep=keep)

    async def patch_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the experiment's status subresource; the experiment as the API returned it (offered to the cache,
        so the next pass starts from this write without reading the experiment again)."""
        self.on_request("patch_namespaced_custom_object_status")

        def run() -> dict[str, Any]:
            resp = self.custom.patch_namespaced_custom_object_status(
                naming.GROUP, naming.VERSION, namespace, naming.PLURAL, name, {"status": patch}, _preload_content=False
            )
            return dict(json.loads(resp.data))

        body = await asyncio.to_thread(run)
        if self.cache is not None:
            self.cache.offer(child_cache.EXPERIMENTS, body)
        return body

    async def post_event(self, involved: dict[str, Any], reason: str, message: str, type_: str = "Normal") -> None:
        """Post a core/v1 Event on the experiment. Failures are logged, never fatal."""
        meta = involved["metadata"]
        now = now_rfc3339()
        body = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": naming.API_VERSION,
                "kind": naming.KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "reason": reason,
            "message": message[:1024],
            "type": type_,
            "source": {"component": self.component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": self.component,
            "reportingInstance": self.component,
        }

        self.on_request("create_namespaced_event")

        def run() -> None:
            try:
                self.core.create_namespaced_event(meta["namespace"], body, _preload_content=False)
            except ApiException as exc:
                log.warning("Could not post event %s on %s/%s: %s", reason, meta["namespace"], meta["name"], exc.reason)

        await asyncio.get_running_loop().run_in_executor(self.event_threads, run)


def _selector(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in labels.items())
