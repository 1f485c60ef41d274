"""Write the probe's labels and annotation onto a Node through the Kubernetes API.

The only nodeprobe module that uses the ``kubernetes`` client, imported inside the functions
that need it. One JSON merge patch per change (``null`` removes a key), computed by the pure
:func:`plan_patch` from the node as read: keys the probe owns (``PROBE_LABEL_KEYS``) that it
did not compute this time are removed, other keys (GFD's, the sandbox's
``kneepoint.io/inter-node-gbps``, anyone else's) are never touched, and nothing is sent when
the node already carries exactly these values, so running the probe again is a no-op.
"""

from __future__ import annotations

from typing import Any

from kneepoint.nodeprobe.node_labels import PROBE_ANNOTATION_KEYS, PROBE_LABEL_KEYS, NodeMarks

FIELD_MANAGER = "kneepoint-probe"
MERGE_PATCH = "application/merge-patch+json"


class NodeWriteError(Exception):
    """The node could not be read or patched; the message is one line."""


def _section(current: dict[str, str], wanted: dict[str, str], owned: tuple[str, ...]) -> dict[str, str | None]:
    changes: dict[str, str | None] = {key: value for key, value in wanted.items() if current.get(key) != value}
    for key in owned:
        if key in current and key not in wanted:
            changes[key] = None  # stale: a value the probe wrote earlier but no longer computes
    return changes


def plan_patch(
    current_labels: dict[str, str] | None,
    current_annotations: dict[str, str] | None,
    marks: NodeMarks,
) -> dict[str, Any] | None:
    """The merge patch that brings a node to ``marks``, or None when it already carries them."""
    labels = _section(current_labels or {}, marks.labels, PROBE_LABEL_KEYS)
    annotations = _section(current_annotations or {}, marks.annotations, PROBE_ANNOTATION_KEYS)
    metadata: dict[str, Any] = {}
    if labels:
        metadata["labels"] = labels
    if annotations:
        metadata["annotations"] = annotations
    return {"metadata": metadata} if metadata else None


def load_core_api() -> Any:
    """A ``CoreV1Api`` from the in-cluster service account, else from the kubeconfig."""
    try:
        from kubernetes import client, config  # only the writer needs the client
        from kubernetes.config.config_exception import ConfigException
    except ImportError as err:
        raise NodeWriteError(f"the kubernetes Python client is not installed: {err}") from err
    try:
        config.load_incluster_config()
    except ConfigException:
        try:
            config.load_kube_config()
        except (ConfigException, OSError) as err:
            raise NodeWriteError(f"no Kubernetes configuration: not in a pod and no usable kubeconfig ({err})") from err
    return client.CoreV1Api()


def _api_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [OSError]
    try:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        errors += [ApiException, HTTPError]
    except ImportError:
        pass
    return tuple(errors)


def _one_line(err: BaseException) -> str:
    status = getattr(err, "status", None)
    reason = getattr(err, "reason", None)
    if status is not None:
        return f"HTTP {status} {reason or ''}".strip()
    return " ".join(str(err).split()) or type(err).__name__


class NodeWriter:
    """Applies :class:`NodeMarks` to nodes through a ``CoreV1Api``-like object."""

    def __init__(self, api: Any | None = None) -> None:
        self._api = api

    @property
    def api(self) -> Any:
        """The API object, created from the environment on first use."""
        if self._api is None:
            self._api = load_core_api()
        return self._api

    def apply(self, node_name: str, marks: NodeMarks) -> dict[str, Any] | None:
        """Patch ``node_name`` to carry ``marks``; returns the patch sent, or None when none was needed."""
        errors = _api_errors()
        try:
            node = self.api.read_node(node_name)
        except errors as err:
            raise NodeWriteError(f"reading node {node_name}: {_one_line(err)}") from err
        metadata = node.metadata
        patch = plan_patch(metadata.labels, metadata.annotations, marks)
        if patch is None:
            return None
        try:
            self.api.patch_node(node_name, patch, field_manager=FIELD_MANAGER, _content_type=MERGE_PATCH)
        except errors as err:
            raise NodeWriteError(f"patching node {node_name}: {_one_line(err)}") from err
        return patch
