"""The only module that calls the LeaderWorkerSet API (sigs.k8s.io/lws, leaderworkerset.x-k8s.io/v1).

Multi-node tiers run as a LeaderWorkerSet, a custom resource the cluster may not have:
every call here treats "the API is not served" as an answer, not an error. The reader and
the writer (``child_reader``, ``child_writer``) delegate to one instance each; the chart's
RBAC contract test maps this module's custom-object calls to ``leaderworkersets``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kneepoint.kube import naming

# A negative discovery answer is re-checked after this long (LWS may be installed meanwhile).
NOT_SERVED_TTL_SECONDS = 60.0


class LeaderWorkerSetApi:
    """Discovery, read, create and label-selected delete of LeaderWorkerSets."""

    def __init__(
        self, api_client: client.ApiClient, on_request: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic
    ):
        self.custom = client.CustomObjectsApi(api_client)
        self.on_request = on_request or (lambda method: None)
        self.clock = clock
        self._served: bool | None = None
        self._checked_at = 0.0

    async def served(self) -> bool:
        """Whether the cluster serves leaderworkerset.x-k8s.io/v1 (cached: yes for good, no for a minute)."""
        if self._served or (self._served is False and self.clock() - self._checked_at < NOT_SERVED_TTL_SECONDS):
            return bool(self._served)
        self.on_request("get_api_resources")

        def run() -> bool:
            try:
                resources = json.loads(self.custom.get_api_resources(naming.LWS_GROUP, naming.LWS_VERSION, _preload_content=False).data)
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise
            return any(r.get("name") == naming.LWS_PLURAL for r in resources.get("resources", []))

        self._served = await asyncio.to_thread(run)
        self._checked_at = self.clock()
        return self._served

    async def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The LeaderWorkerSet as the API serves it, or None (absent, or the API not served)."""
        self.on_request("get_namespaced_custom_object")

        def run() -> dict[str, Any] | None:
            try:
                resp = self.custom.get_namespaced_custom_object(
                    naming.LWS_GROUP, naming.LWS_VERSION, namespace, naming.LWS_PLURAL, name, _preload_content=False
                )
            except ApiException as exc:
                if exc.status == 404:
                    return None
                raise
            return json.loads(resp.data)

        return await asyncio.to_thread(run)

    async def create(self, body: dict[str, Any]) -> bool:
        """Create unless it exists (409 counts as present). True when this call created it."""
        namespace = body["metadata"]["namespace"]
        self.on_request("create_namespaced_custom_object")

        def run() -> bool:
            try:
                self.custom.create_namespaced_custom_object(
                    naming.LWS_GROUP, naming.LWS_VERSION, namespace, naming.LWS_PLURAL, body, _preload_content=False
                )
                return True
            except ApiException as exc:
                if exc.status == 409:
                    return False
                raise

        return await asyncio.to_thread(run)

    async def names(self, namespace: str, selector: str) -> list[str]:
        """Names of the LeaderWorkerSets matching a label selector ([] when the API is not served)."""
        if not await self.served():
            return []
        self.on_request("list_namespaced_custom_object")

        def run() -> list[str]:
            try:
                data = json.loads(
                    self.custom.list_namespaced_custom_object(
                        naming.LWS_GROUP, naming.LWS_VERSION, namespace, naming.LWS_PLURAL, label_selector=selector, _preload_content=False
                    ).data
                )
            except ApiException as exc:
                if exc.status == 404:
                    return []
                raise
            return [i["metadata"]["name"] for i in data.get("items", []) if not i["metadata"].get("deletionTimestamp")]

        return await asyncio.to_thread(run)

    async def delete_by_labels(self, namespace: str, selector: str, keep: set[str] | None = None) -> int:
        """Delete matching LeaderWorkerSets (Background: LWS's StatefulSets and pods follow). Returns how many."""
        names = [n for n in await self.names(namespace, selector) if not keep or n not in keep]
        body = client.V1DeleteOptions(propagation_policy="Background")

        def run() -> int:
            deleted = 0
            for name in names:
                self.on_request("delete_namespaced_custom_object")
                try:
                    self.custom.delete_namespaced_custom_object(
                        naming.LWS_GROUP, naming.LWS_VERSION, namespace, naming.LWS_PLURAL, name, body=body
                    )
                    deleted += 1
                except ApiException as exc:
                    if exc.status != 404:
                        raise
            return deleted

        return await asyncio.to_thread(run) if names else 0
