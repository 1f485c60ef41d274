"""An in-memory API for the reconciler's unit tests: GPU nodes, GPU pods and the reader/writer pair."""

from __future__ import annotations

import asyncio
import copy
from typing import Any


def node(name: str, gpus: int = 8) -> dict[str, Any]:
    """A Ready H200 node whose GPUs form one NVLink domain."""
    return {
        "metadata": {
            "name": name,
            "labels": {
                "nvidia.com/gpu.product": "NVIDIA-H200",
                "kneepoint.io/nvlink-domain-size": str(gpus),
                "kneepoint.io/interconnect": "nvlink",
                "kneepoint.io/nvlink-domain": f"{name}-nvl0",
            },
        },
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def apply_merge_patch(base: Any, patch: Any) -> Any:
    """RFC 7386, as the API server applies a status merge patch."""
    if not isinstance(patch, dict) or not isinstance(base, dict):
        return patch
    out = dict(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = apply_merge_patch(out.get(key), value)
    return out


class FakeApi:
    """Reader and writer over in-memory objects. Every call is recorded in ``calls`` and yields to the
    loop like real I/O; a create of an existing object is a 409 (False); Deployments read back as created."""

    def __init__(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]] | None = None) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.nodes_list = nodes
        self.pods = pods or []
        self.calls: list[str] = []
        self.created: list[dict[str, Any]] = []
        self.lock_held_during_writes: list[bool] = []
        self.ledger_lock: asyncio.Lock | None = None

    async def _io(self, what: str) -> None:
        self.calls.append(what)
        await asyncio.sleep(0)

    # reader
    async def experiment(self, namespace: str, name: str) -> dict[str, Any] | None:
        await self._io("experiment")
        return copy.deepcopy(self.objects.get(name))

    async def nodes(self) -> list[dict[str, Any]]:
        await self._io("nodes")
        return copy.deepcopy(self.nodes_list)

    async def active_pods_on_nodes(self) -> list[dict[str, Any]]:
        await self._io("pods")
        return copy.deepcopy(self.pods)

    async def config_map(self, namespace: str, name: str) -> None:
        await self._io("config_map")

    async def deployment(self, namespace: str, name: str) -> dict[str, Any] | None:
        await self._io("deployment")
        return next((copy.deepcopy(b) for b in self.created if b["kind"] == "Deployment" and b["metadata"]["name"] == name), None)

    async def engine_pods(self, *args: Any) -> list[dict[str, Any]]:
        await self._io("engine_pods")
        return []

    # writer
    async def create(self, body: dict[str, Any]) -> bool:
        self.lock_held_during_writes.append(bool(self.ledger_lock and self.ledger_lock.locked()))
        await self._io("create")
        if any(b["kind"] == body["kind"] and b["metadata"]["name"] == body["metadata"]["name"] for b in self.created):
            return False  # 409: it exists
        self.created.append(body)
        return True

    async def patch_status(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        await self._io("patch_status")
        obj = self.objects[name]
        obj["status"] = apply_merge_patch(obj.get("status") or {}, patch.get("status", patch))

    async def post_event(self, *args: Any) -> None:
        await self._io("event")

    async def delete_all(self, *args: Any) -> int:
        await self._io("delete_all")
        return 0
