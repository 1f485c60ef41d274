"""Instruments for the fault-injection suite (tests/integration/test_faults_*.py).

(The experiment bodies and :class:`experiment_api.Cluster`, which applies them and reads status
and events, are experiment_api.py's: one harness for every integration suite.)

- :func:`session_namespace`: a namespace the session's operator watches;
- :class:`ChildLedger`: watches every kneepoint child (Deployments, Services, Jobs, pods,
  ConfigMaps) in the given namespaces from the API server, reconnecting across API server
  restarts, and keeps every ADDED/MODIFIED/DELETED it saw with a timestamp, so a test can
  ask afterwards: was a child created twice, how many GPUs were committed at once, did an
  engine pod ever go Unschedulable, when did the last child disappear;
- :class:`FaultLog`: counts faults injected and survived for docs/reliability.md
  (``KNEEPOINT_FAULT_REPORT=path`` appends one JSON line per fault).

What a test asserts is always what the user sees (status, conditions, events) plus what the
API server holds (children, pods): never the operator's internals.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiment_api import GPU, LABEL_EXPERIMENT, LABEL_ROLE
from kubernetes import client, watch


def session_namespace(operator: Any, tag: str) -> str:
    """A namespace name the session's operator watches (it may watch only ``<prefix>-*``)."""
    pattern = (getattr(operator, "extra_env", None) or {}).get("KNEEPOINT_NAMESPACES", "")
    prefix = pattern[: -len("-*")] if pattern.endswith("-*") else "t"
    return f"{prefix}-{tag}"


# ---------------------------------------------------------------------------------------
# Watching children


@dataclass
class Seen:
    """One watch event of one child."""

    at: float
    type: str  # ADDED, MODIFIED, DELETED
    kind: str
    namespace: str
    name: str
    uid: str
    experiment: str
    role: str
    deleting: bool
    gpus: int = 0
    node: str | None = None
    phase: str | None = None
    unschedulable: bool = False


def _gpus_of(containers: Any) -> int:
    total = 0
    for c in containers or []:
        requests = (c.resources.requests if c.resources else None) or {}
        total += int(requests.get(GPU, 0) or 0)
    return total


def _seen(kind: str, type_: str, obj: Any) -> Seen:
    meta = obj.metadata
    labels = meta.labels or {}
    gpus, node, phase, unschedulable = 0, None, None, False
    if kind == "Deployment":
        gpus = _gpus_of(obj.spec.template.spec.containers)
    elif kind == "Pod":
        gpus = _gpus_of(obj.spec.containers)
        node = obj.spec.node_name
        phase = obj.status.phase if obj.status else None
        for cond in (obj.status.conditions if obj.status else None) or []:
            if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
                unschedulable = True
    return Seen(
        time.time(),
        type_,
        kind,
        meta.namespace,
        meta.name,
        meta.uid,
        labels.get(LABEL_EXPERIMENT, ""),
        labels.get(LABEL_ROLE, ""),
        meta.deletion_timestamp is not None,
        gpus,
        node,
        phase,
        unschedulable,
    )


@dataclass
class ChildLedger:
    """Every watch event of kneepoint's children in ``namespaces`` (all when empty)."""

    api: client.ApiClient
    namespaces: set[str] = field(default_factory=set)
    events: list[Seen] = field(default_factory=list)
    reconnects: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> ChildLedger:
        apps, core, batch = client.AppsV1Api(self.api), client.CoreV1Api(self.api), client.BatchV1Api(self.api)
        for kind, fn in (
            ("Deployment", apps.list_deployment_for_all_namespaces),
            ("Service", core.list_service_for_all_namespaces),
            ("Job", batch.list_job_for_all_namespaces),
            ("Pod", core.list_pod_for_all_namespaces),
            ("ConfigMap", core.list_config_map_for_all_namespaces),
        ):
            t = threading.Thread(target=self._run, args=(kind, fn), daemon=True, name=f"ledger-{kind}")
            t.start()
            self._threads.append(t)
        self._ready_until(time.monotonic() + 20)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=8)

    def __enter__(self) -> ChildLedger:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _ready_until(self, deadline: float) -> None:
        # Each thread marks itself listed once; wait so no early ADDED is missed.
        while time.monotonic() < deadline and len(getattr(self, "_listed", set())) < len(self._threads):
            time.sleep(0.05)

    def _record(self, seen: Seen) -> None:
        if self.namespaces and seen.namespace not in self.namespaces:
            return
        with self._lock:
            self.events.append(seen)

    def _run(self, kind: str, list_fn: Any) -> None:
        known: dict[str, Seen] = {}
        first = True
        while not self._stop.is_set():
            try:
                listing = list_fn(label_selector=LABEL_EXPERIMENT)
                now_uids = set()
                for obj in listing.items:
                    s = _seen(kind, "ADDED" if obj.metadata.uid not in known else "MODIFIED", obj)
                    now_uids.add(s.uid)
                    if s.uid not in known or not first:
                        self._record(s)
                    known[s.uid] = s
                for uid in list(known):
                    if uid not in now_uids:
                        gone = known.pop(uid)
                        self._record(Seen(time.time(), "DELETED", kind, gone.namespace, gone.name, uid, gone.experiment, gone.role, True))
                if first:
                    listed = getattr(self, "_listed", set())
                    listed.add(kind)
                    self._listed = listed
                    first = False
                w = watch.Watch()
                for event in w.stream(
                    # Short server-side timeouts: stop() is then noticed within seconds.
                    list_fn,
                    label_selector=LABEL_EXPERIMENT,
                    resource_version=listing.metadata.resource_version,
                    timeout_seconds=3,
                ):
                    if self._stop.is_set():
                        w.stop()
                        break
                    obj = event["object"]
                    s = _seen(kind, event["type"], obj)
                    if event["type"] == "DELETED":
                        known.pop(s.uid, None)
                    else:
                        known[s.uid] = s
                    self._record(s)
            except Exception:  # noqa: BLE001 - API server restarting, 410 Gone: list again
                self.reconnects += 1
                self._stop.wait(0.5)

    # -- questions -------------------------------------------------------------------
    def snapshot(self) -> list[Seen]:
        with self._lock:
            return list(self.events)

    def created(self, kind: str, namespace: str | None = None) -> dict[str, set[str]]:
        """name -> every uid ever seen under that name."""
        out: dict[str, set[str]] = {}
        for s in self.snapshot():
            if s.kind == kind and (namespace is None or s.namespace == namespace):
                out.setdefault(f"{s.namespace}/{s.name}", set()).add(s.uid)
        return out

    def duplicates(
        self, kinds: Iterable[str] = ("Deployment", "Service", "Job", "ConfigMap"), namespace: str | None = None
    ) -> dict[str, set[str]]:
        """Children whose name was created more than once (a second object with a new uid)."""
        out = {}
        for kind in kinds:
            for name, uids in self.created(kind, namespace).items():
                if len(uids) > 1:
                    out[f"{kind} {name}"] = uids
        return out

    def unschedulable_pods(self) -> set[str]:
        return {f"{s.namespace}/{s.name}" for s in self.snapshot() if s.kind == "Pod" and s.unschedulable}

    def max_gpus_committed(self) -> int:
        """The most GPUs that engine Deployments not being deleted asked for at one moment."""
        live: dict[str, int] = {}
        peak = 0
        for s in self.snapshot():
            if s.kind != "Deployment":
                continue
            if s.type == "DELETED" or s.deleting:
                live.pop(s.uid, None)
            else:
                live[s.uid] = s.gpus
            peak = max(peak, sum(live.values()))
        return peak

    def max_gpus_bound_per_node(self) -> dict[str, int]:
        """Per node, the most GPUs that bound, non-terminated pods held at one moment."""
        live: dict[str, tuple[str, int]] = {}
        peak: dict[str, int] = {}
        for s in self.snapshot():
            if s.kind != "Pod":
                continue
            if s.type == "DELETED" or s.phase in ("Succeeded", "Failed") or not s.node or not s.gpus:
                live.pop(s.uid, None)
            else:
                live[s.uid] = (s.node, s.gpus)
            per: dict[str, int] = {}
            for node, gpus in live.values():
                per[node] = per.get(node, 0) + gpus
            for node, gpus in per.items():
                peak[node] = max(peak.get(node, 0), gpus)
        return peak

    def last_deleted_at(self, namespace: str, experiment_name: str) -> float | None:
        gone = [s.at for s in self.snapshot() if s.namespace == namespace and s.experiment == experiment_name and s.type == "DELETED"]
        return max(gone) if gone else None


# ---------------------------------------------------------------------------------------
# Figures for docs/reliability.md


class FaultLog:
    """One JSON line per injected fault (``KNEEPOINT_FAULT_REPORT``), so the docs' counts are measured."""

    def __init__(self, path: str | None = None):
        self.path = (
            Path(path) if path else (Path(os.environ["KNEEPOINT_FAULT_REPORT"]) if os.environ.get("KNEEPOINT_FAULT_REPORT") else None)
        )

    def record(self, case: str, fault: str, survived: bool, **figures: Any) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"case": case, "fault": fault, "survived": survived, **figures}, sort_keys=True) + "\n")
