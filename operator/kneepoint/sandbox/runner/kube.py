"""The sandbox pod runner's only door to the Kubernetes API.

Adapter (kubernetes client, threads). Objects travel as the API's JSON dicts (camelCase),
never as the client's model classes, so the pure modules read them as the documentation
writes them. Watches run in threads (the client is synchronous) and hand events to the
runner's asyncio loop through a callback; every other call is made from a worker thread
by the runner (``asyncio.to_thread``).

The runner acts with the admin kubeconfig the sandbox gives it, as a kubelet acts with
its node credentials: it reads the Secrets and ConfigMaps a pod's env names, asks for
ServiceAccount tokens bound to the pod (TokenRequest), writes ``pods/status`` and
finishes deletions.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config
from kubernetes.client.rest import ApiException
from kubernetes.watch.watch import iter_resp_lines

from kneepoint.core.timestamps import parse_rfc3339
from kneepoint.sandbox.runner.podstatus import KWOK_LOGS_GROUP, KWOK_LOGS_PLURAL, KWOK_LOGS_VERSION

log = logging.getLogger(__name__)

SMP = "application/strategic-merge-patch+json"
WATCH_TIMEOUT_SECONDS = 240
# kind -> (list call name, list kwargs)
_LISTS: dict[str, tuple[str, dict[str, Any]]] = {
    "pods": ("list_pod_for_all_namespaces", {"field_selector": "spec.nodeName!="}),
    "nodes": ("list_node", {}),
    "services": ("list_service_for_all_namespaces", {}),
}

EventSink = Callable[[str, str, dict[str, Any]], None]
"""(kind, event type ADDED/MODIFIED/DELETED/SYNCED, object or {"items": [...]})."""


class KubeGateway:
    """API calls of the runner, on JSON dicts."""

    def __init__(self, kubeconfig: Path) -> None:
        self.kubeconfig = kubeconfig
        self.api_client = config.new_client_from_config(config_file=str(kubeconfig))
        self.core = client.CoreV1Api(self.api_client)
        self.custom = client.CustomObjectsApi(self.api_client)
        self.server, self.ca_data = _cluster_of(kubeconfig)

    # --- reads -------------------------------------------------------------------------

    def _json(self, response: Any) -> Any:
        return json.loads(response.data)

    def list(self, kind: str) -> tuple[list[dict[str, Any]], str]:
        """All objects of ``kind`` (pods: scheduled ones only) and the list's resourceVersion."""
        name, kwargs = _LISTS[kind]
        body = self._json(getattr(self.core, name)(_preload_content=False, **kwargs))
        return body.get("items") or [], str((body.get("metadata") or {}).get("resourceVersion", ""))

    def watch(self, kind: str, resource_version: str) -> Iterator[dict[str, Any]]:
        """Raw watch events (``{"type", "object"}``) from ``resource_version``, until the server ends it."""
        name, kwargs = _LISTS[kind]
        response = getattr(self.core, name)(
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_TIMEOUT_SECONDS,
            _preload_content=False,
            _request_timeout=(10, WATCH_TIMEOUT_SECONDS + 30),
            **kwargs,
        )
        try:
            for line in iter_resp_lines(response):
                if line:
                    yield json.loads(line)
        finally:
            response.release_conn()

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self._json(self.core.read_namespaced_pod(name, namespace, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def read_config_map(self, namespace: str, name: str) -> dict[str, str] | None:
        """The ConfigMap's data, None when it does not exist."""
        try:
            body = self._json(self.core.read_namespaced_config_map(name, namespace, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(body.get("data") or {})

    def read_secret(self, namespace: str, name: str) -> dict[str, str] | None:
        """The Secret's data decoded to text (undecodable bytes kept as surrogates), None when absent."""
        try:
            body = self._json(self.core.read_namespaced_secret(name, namespace, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        data = {k: base64.b64decode(v).decode("utf-8", "surrogateescape") for k, v in (body.get("data") or {}).items()}
        data.update(body.get("stringData") or {})
        return data

    # --- writes ------------------------------------------------------------------------

    def patch_pod_status(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """Strategic-merge patch of ``pods/status``; the patched pod, None when it is gone."""
        try:
            return self._json(self.core.patch_namespaced_pod_status(name, namespace, body, _content_type=SMP, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def put_pod_logs(self, body: dict[str, Any]) -> bool:
        """Create or replace KWOK's ``Logs`` object of a pod; False when the pod or the Logs CRD is gone (404)."""
        meta = body["metadata"]
        group, version, plural = KWOK_LOGS_GROUP, KWOK_LOGS_VERSION, KWOK_LOGS_PLURAL
        try:
            self.custom.create_namespaced_custom_object(group, version, meta["namespace"], plural, body, _preload_content=False)
            return True
        except ApiException as exc:
            if exc.status == 404:
                return False
            if exc.status != 409:
                raise
        patch = {"spec": body["spec"]}
        try:
            self.custom.patch_namespaced_custom_object(
                group,
                version,
                meta["namespace"],
                plural,
                meta["name"],
                patch,
                _content_type="application/merge-patch+json",
                _preload_content=False,
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        """Delete with grace 0, only the pod with ``uid`` (a recreated namesake stays)."""
        options = client.V1DeleteOptions(grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid))
        try:
            self.core.delete_namespaced_pod(name, namespace, body=options, grace_period_seconds=0, _preload_content=False)
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def request_token(
        self, namespace: str, service_account: str, pod_name: str, pod_uid: str, expiration_seconds: int, audience: str | None
    ) -> tuple[str, float]:
        """A TokenRequest bound to the pod: (token, expiry as a Unix time)."""
        spec: dict[str, Any] = {
            "expirationSeconds": expiration_seconds,
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": pod_name, "uid": pod_uid},
        }
        if audience:
            spec["audiences"] = [audience]
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        result = self._json(self.core.create_namespaced_service_account_token(service_account, namespace, body, _preload_content=False))
        status = result.get("status") or {}
        expiry = _parse_time(str(status.get("expirationTimestamp", ""))) or time.time() + expiration_seconds
        return str(status["token"]), expiry


def _parse_time(text: str) -> float | None:
    try:
        return parse_rfc3339(text)
    except ValueError:
        return None


def _cluster_of(kubeconfig: Path) -> tuple[str, str]:
    """(server URL, base64 CA bundle) of the kubeconfig's current context."""
    document = yaml.safe_load(kubeconfig.read_text()) or {}
    contexts = {c["name"]: c.get("context") or {} for c in document.get("contexts") or []}
    clusters = {c["name"]: c.get("cluster") or {} for c in document.get("clusters") or []}
    context = contexts.get(document.get("current-context", "")) or next(iter(contexts.values()), {})
    cluster = clusters.get(context.get("cluster", "")) or next(iter(clusters.values()), {})
    ca_data = cluster.get("certificate-authority-data", "")
    if not ca_data and cluster.get("certificate-authority"):
        path = Path(cluster["certificate-authority"])
        if not path.is_absolute():
            path = kubeconfig.parent / path
        ca_data = base64.b64encode(path.read_bytes()).decode()
    return str(cluster.get("server", "")), str(ca_data)


class WatchFeed:
    """One thread per kind: list, report SYNCED with every object, then watch; relist on 410."""

    def __init__(self, gateway: KubeGateway, kinds: tuple[str, ...], sink: EventSink) -> None:
        self.gateway = gateway
        self.kinds = kinds
        self.sink = sink
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(kind,), name=f"watch-{kind}", daemon=True) for kind in kinds]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.stopping.set()

    def _run(self, kind: str) -> None:
        backoff = 0.5
        while not self.stopping.is_set():
            try:
                items, resource_version = self.gateway.list(kind)
                self.sink(kind, "SYNCED", {"items": items})
                backoff = 0.5
                while not self.stopping.is_set():
                    gone = False
                    for event in self.gateway.watch(kind, resource_version):
                        if self.stopping.is_set():
                            return
                        kind_of_event = event.get("type")
                        obj = event.get("object") or {}
                        if kind_of_event == "ERROR":
                            gone = obj.get("code") == 410
                            log.info("Watch ended kind=%s code=%s message=%s", kind, obj.get("code"), obj.get("message"))
                            break
                        resource_version = str((obj.get("metadata") or {}).get("resourceVersion", resource_version))
                        if kind_of_event != "BOOKMARK":
                            self.sink(kind, str(kind_of_event), obj)
                    if gone:
                        break  # relist
            except Exception as exc:  # noqa: BLE001 - a watch thread must outlive API hiccups
                if self.stopping.is_set():
                    return
                log.warning(
                    "Watch failed kind=%s error=%s; retrying in %.1fs",
                    kind,
                    str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                    backoff,
                )
                self.stopping.wait(backoff)
                backoff = min(backoff * 2, 10.0)
