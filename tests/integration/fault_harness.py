"""Instruments for the fault-injection suite (tests/integration/test_faults_*.py).

- :func:`experiment`: a small Measure-mode ParallelismExperiment (8B Llama on H200, tiny
  load, rules that walk the whole ladder) with per-test overrides merged in;
- :class:`Cluster`: apply, read status and events, wait for a status predicate;
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

import copy
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from experiment_api import closing_reasons, settled_events
from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

GROUP, VERSION, PLURAL = "kneepoint.io", "v1alpha1", "parallelismexperiments"
LABEL_EXPERIMENT = "kneepoint.io/experiment"
GPU = "nvidia.com/gpu"

# A tier takes about 15 s in the sandbox (2 s model load, a load test of a few seconds, the
# operator's 5 s Prometheus settle time). The load is sized so each test lasts a few
# seconds: shorter ones leave the counter queries with a single sample.
BASE_SPEC: dict[str, Any] = {
    "model": {
        "uri": "hf://meta-llama/Llama-3.1-8B-Instruct",
        "maxModelLen": 2048,
        "architecture": {"preset": "llama-3-8b"},
    },
    "tiers": {"tensorParallel": [1, 2]},
    "load": {"concurrency": 4, "numRequests": 48, "inputLen": 128, "outputLen": 64, "warmupRequests": 0, "repeats": 1},
    # Rules chosen so the ladder always walks to its last tier: the decision is then
    # deterministic (last-tier), whatever the simulator's noise does to the figures.
    "stopRules": {"memoryHeadroom": 0.01, "minThroughputGain": 0.001, "maxP99Degradation": 1.0, "maxCommFraction": 1.0},
    "placement": {"gpuProduct": "NVIDIA-H200"},
    "budget": {"tierTimeoutSeconds": 90, "loadTestTimeoutSeconds": 90},
}


def merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Deep merge (dicts merge, everything else replaces); a None value deletes the key."""
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def experiment(name: str, namespace: str, spec: dict[str, Any] | None = None, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ParallelismExperiment body: :data:`BASE_SPEC` (or ``base``) with ``spec`` merged in."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ParallelismExperiment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": merge(BASE_SPEC if base is None else base, spec or {}),
    }


def session_namespace(operator: Any, tag: str) -> str:
    """A namespace name the session's operator watches (it may watch only ``<prefix>-*``)."""
    pattern = (getattr(operator, "extra_env", None) or {}).get("KNEEPOINT_NAMESPACES", "")
    prefix = pattern[: -len("-*")] if pattern.endswith("-*") else "t"
    return f"{prefix}-{tag}"


def condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), None)


def tier(status: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in status.get("tiers") or [] if t.get("name") == name), None)


def is_finished(status: dict[str, Any]) -> bool:
    return status.get("phase") in ("Decided", "Failed")


class Cluster:
    """Admin access to the sandbox's API, as a user's kubectl would have."""

    def __init__(self, api: client.ApiClient):
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        ns = body["metadata"]["namespace"]
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, body)

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def status(self, namespace: str, name: str) -> dict[str, Any]:
        """The experiment's status ({} before the operator wrote one; retries while the API server is away)."""
        for attempt in range(60):
            try:
                obj = self.get(namespace, name)
                return (obj or {}).get("status") or {}
            except (ApiException, OSError, Exception) as exc:  # a restarting API server
                if attempt == 59:
                    raise
                last = exc
                time.sleep(0.5)
        raise AssertionError(f"unreachable: {last}")

    def delete(self, namespace: str, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)

    def events(self, namespace: str, name: str) -> list[dict[str, str]]:
        """Events on the experiment, oldest first: reason, message, type."""
        items = self.core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
        items.sort(key=lambda e: (e.first_timestamp or e.event_time or e.metadata.creation_timestamp, e.metadata.name))
        return [{"reason": e.reason or "", "message": e.message or "", "type": e.type or ""} for e in items]

    def wait(self, namespace: str, name: str, predicate: Callable[[dict[str, Any]], Any], timeout: float, what: str, interval: float = 0.5) -> dict[str, Any]:
        """Poll the status until ``predicate(status)`` is truthy; the last status is in the failure message."""
        deadline = time.monotonic() + timeout
        status: dict[str, Any] = {}
        while time.monotonic() < deadline:
            status = self.status(namespace, name)
            if predicate(status):
                return status
            time.sleep(interval)
        brief = {k: status.get(k) for k in ("phase", "currentTier", "message", "queuePosition", "waitingFor")}
        brief["tiers"] = [(t.get("name"), t.get("phase"), t.get("reason")) for t in status.get("tiers") or []]
        brief["conditions"] = [(c.get("type"), c.get("status"), c.get("reason")) for c in status.get("conditions") or []]
        raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} of {namespace}/{name}: {json.dumps(brief)}")

    def wait_finished(self, namespace: str, name: str, timeout: float) -> dict[str, Any]:
        status = self.wait(namespace, name, is_finished, timeout, "Decided or Failed")
        settled_events(lambda: self.events(namespace, name), closing_reasons(status))
        return status

    def children(self, namespace: str, experiment_name: str) -> dict[str, list[str]]:
        """Names of the experiment's children that still exist, per kind (pods included)."""
        sel = f"{LABEL_EXPERIMENT}={experiment_name}"
        return {
            "deployments": [d.metadata.name for d in self.apps.list_namespaced_deployment(namespace, label_selector=sel).items],
            "services": [s.metadata.name for s in self.core.list_namespaced_service(namespace, label_selector=sel).items],
            "jobs": [j.metadata.name for j in self.batch.list_namespaced_job(namespace, label_selector=sel).items],
            "pods": [p.metadata.name for p in self.core.list_namespaced_pod(namespace, label_selector=sel).items],
        }

    def gpus_held(self, namespaces: Iterable[str] | None = None) -> dict[str, int]:
        """GPUs requested by bound, non-terminated pods, per node (only ``namespaces`` when given)."""
        held: dict[str, int] = {}
        wanted = set(namespaces) if namespaces is not None else None
        for pod in self.core.list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded,status.phase!=Failed").items:
            if wanted is not None and pod.metadata.namespace not in wanted:
                continue
            if not pod.spec.node_name:
                continue
            gpus = sum(int((c.resources.requests or {}).get(GPU, 0)) for c in pod.spec.containers if c.resources)
            if gpus:
                held[pod.spec.node_name] = held.get(pod.spec.node_name, 0) + gpus
        return held


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
        time.time(), type_, kind, meta.namespace, meta.name, meta.uid, labels.get(LABEL_EXPERIMENT, ""),
        labels.get("kneepoint.io/role", ""), meta.deletion_timestamp is not None, gpus, node, phase, unschedulable,
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

    def start(self) -> "ChildLedger":
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

    def __enter__(self) -> "ChildLedger":
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
                    list_fn, label_selector=LABEL_EXPERIMENT, resource_version=listing.metadata.resource_version, timeout_seconds=3
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

    def duplicates(self, kinds: Iterable[str] = ("Deployment", "Service", "Job", "ConfigMap"), namespace: str | None = None) -> dict[str, set[str]]:
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
        self.path = Path(path) if path else (Path(os.environ["KNEEPOINT_FAULT_REPORT"]) if os.environ.get("KNEEPOINT_FAULT_REPORT") else None)

    def record(self, case: str, fault: str, survived: bool, **figures: Any) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps({"case": case, "fault": fault, "survived": survived, **figures}, sort_keys=True) + "\n")
