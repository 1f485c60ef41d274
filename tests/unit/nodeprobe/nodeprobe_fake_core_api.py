"""A CoreV1Api stand-in holding one Node and applying JSON merge patches to it like the API server."""

from __future__ import annotations

import copy
from typing import Any

from kubernetes.client import V1Node, V1ObjectMeta
from nodeprobe_recordings import NODE

from kneepoint.nodeprobe.node_writer import MERGE_PATCH


class FakeCoreV1Api:
    """Holds Node objects and applies JSON merge patches to their labels/annotations like the API server."""

    def __init__(self, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> None:
        self.node = V1Node(metadata=V1ObjectMeta(name=NODE, labels=dict(labels or {}), annotations=dict(annotations or {})))
        self.patches: list[dict[str, Any]] = []
        self.read_error: Exception | None = None
        self.patch_error: Exception | None = None

    def read_node(self, name: str) -> V1Node:
        if self.read_error:
            raise self.read_error
        assert name == NODE
        return copy.deepcopy(self.node)

    def patch_node(self, name: str, body: dict[str, Any], **kwargs: Any) -> V1Node:
        if self.patch_error:
            raise self.patch_error
        assert kwargs["_content_type"] == MERGE_PATCH and kwargs["field_manager"] == "kneepoint-probe"
        self.patches.append(body)
        for section in ("labels", "annotations"):
            current = getattr(self.node.metadata, section)
            for key, value in body["metadata"].get(section, {}).items():
                if value is None:
                    current.pop(key, None)
                else:
                    current[key] = value
        return self.node
