"""Test-side access to ParallelismExperiments in the sandbox, for the operator's integration tests.

- :func:`example_spec` / :func:`experiment`: a spec from ``deploy/examples`` (or the small
  :data:`BASE_SPEC` of the fault suite) with per-test overrides merged in, wrapped as an object;
- :class:`Cluster`: create, read, patch and delete experiments, read their events,
  children and the GPUs pods hold, wait for a status predicate (the one harness of the
  ladder, resilience and fault suites; fault_harness.py adds the watching instruments);
- :class:`ChildPoller`: a background thread that lists the experiments' children and every
  node's GPU requests a few times a second while a test runs, so the test can ask
  afterwards whether a child ever existed twice, was re-created, or GPUs were ever promised
  beyond a node's allocatable.

Tests assert what a user sees (status, conditions, events, printer columns) and what the API
server holds (children, pods), never the operator's internals.
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kneepoint.core.node_labels import GPU_RESOURCE as GPU
from kneepoint.kube.naming import GROUP, KIND, LABEL_EXPERIMENT, LABEL_ROLE, LABEL_TIER, PLURAL, ROLE_ENGINE, VERSION

EXAMPLES = Path(__file__).resolve().parents[2] / "deploy" / "examples"
CHILD_KINDS = ("deployments", "services", "jobs", "pods", "configmaps")

NO_SEARCH: dict[str, Any] = {"concurrencySearch": {"enabled": False}}
"""capacity override for tests of other things on deploy/examples/experiment.yaml, whose concurrency search is on."""

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
    # The fault and resilience suites are about the full ladder (every tier deployed, faults injected into each):
    # predict-first would leave TP1 Predicted here (TP2 wins by last-tier, far from every threshold).
    "plan": {"predictFirst": False},
}


def closing_reasons(status: dict[str, Any]) -> set[str]:
    """The events the pass that decided posts last (none to wait for after a failure)."""
    return {"DecisionMade", "DecisionUpdated"} if status.get("phase") == "Decided" else set()


def settled_events(read: Callable[[], list[dict[str, Any]]], closing: set[str], timeout: float = 15.0) -> list[dict[str, Any]]:
    """Events once one of ``closing`` is among them (when given) and two reads half a second apart agree.

    The operator writes a pass's status first and posts that pass's events after it, all at
    once: a test that saw the status may read the events a moment too early. Past the
    timeout, the last read.
    """
    deadline = time.monotonic() + timeout
    previous = None
    while True:
        current = read()
        if (current == previous and (not closing or closing & {e["reason"] for e in current})) or time.monotonic() > deadline:
            return current
        previous = current
        time.sleep(0.5)


def expand_reasons(events: list[dict[str, Any]]) -> list[str]:
    """One reason per occurrence (an event's count folds repeats)."""
    return [e["reason"] for e in events for _ in range(e["count"])]


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


def example_spec(file_name: str, **overrides: Any) -> dict[str, Any]:
    """The spec of ``deploy/examples/<file_name>`` with ``overrides`` (top-level spec keys) merged in."""
    doc = yaml.safe_load((EXAMPLES / file_name).read_text(encoding="utf-8"))
    return merge(doc["spec"], overrides)


def experiment(name: str, namespace: str, spec: dict[str, Any] | None = None, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ParallelismExperiment body: :data:`BASE_SPEC` (or ``base``) with ``spec`` merged in."""
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": merge(BASE_SPEC if base is None else base, spec or {}),
    }


def tier(status: dict[str, Any], name: str) -> dict[str, Any] | None:
    """One entry of status.tiers by name (tp2-pp1)."""
    return next((t for t in status.get("tiers") or [] if t.get("name") == name), None)


def condition(status: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in status.get("conditions") or [] if c.get("type") == type_), None)


def is_finished(status: dict[str, Any]) -> bool:
    return status.get("phase") in ("Decided", "Failed")


def gpu_request(pod: Any) -> int:
    """GPUs a pod (kubernetes client object) requests, over all its containers."""
    total = 0
    for c in pod.spec.containers or []:
        res = c.resources
        value = ((res.requests or {}) if res else {}).get(GPU) or ((res.limits or {}) if res else {}).get(GPU)
        total += int(value or 0)
    return total


class Cluster:
    """Admin access to the sandbox's API, as a user's kubectl would have."""

    def __init__(self, api: client.ApiClient):
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.batch = client.BatchV1Api(api)

    # -- the experiment
    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.custom.create_namespaced_custom_object(GROUP, VERSION, body["metadata"]["namespace"], PLURAL, body)

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
            except (ApiException, OSError, Exception) as exc:
                if attempt == 59:
                    raise
                last = exc
                time.sleep(0.5)
        raise AssertionError(f"unreachable: {last}")

    def patch_spec(self, namespace: str, name: str, spec_patch: dict[str, Any]) -> dict[str, Any]:
        return self.custom.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, {"spec": spec_patch})

    def delete(self, namespace: str, name: str) -> None:
        self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)

    def wait(
        self, namespace: str, name: str, predicate: Callable[[dict[str, Any]], Any], timeout: float, what: str, interval: float = 0.5
    ) -> dict[str, Any]:
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

    def wait_tier_phase(self, namespace: str, name: str, tier_name: str, phase: str, timeout: float) -> dict[str, Any]:
        return self.wait(
            namespace, name, lambda s: (tier(s, tier_name) or {}).get("phase") == phase, timeout, f"{tier_name} {phase}", interval=0.2
        )

    # -- what the operator wrote about it
    def events(self, namespace: str, name: str, order: str = "last") -> list[dict[str, Any]]:
        """The experiment's events (reason, message, type, count), oldest first.

        ``order``: ``last`` places a repeated event (count > 1) where it last happened,
        ``first`` where it first did.
        """
        items = self.core.list_namespaced_event(namespace, field_selector=f"involvedObject.kind={KIND},involvedObject.name={name}").items
        if order == "first":
            items.sort(key=lambda e: (e.first_timestamp or e.event_time or e.metadata.creation_timestamp, e.metadata.name))
        else:
            items.sort(key=lambda e: (e.last_timestamp or e.event_time or e.metadata.creation_timestamp, e.metadata.creation_timestamp))
        return [{"reason": e.reason or "", "message": e.message or "", "type": e.type or "", "count": e.count or 1} for e in items]

    def reasons(self, namespace: str, name: str) -> list[str]:
        return expand_reasons(self.events(namespace, name))

    def settled_reasons(self, namespace: str, name: str, last: str, timeout: float = 30.0) -> list[str]:
        """The event reasons once ``last`` is among them and two reads agree (see settled_events)."""
        return expand_reasons(settled_events(lambda: self.events(namespace, name), {last}, timeout))

    def children(self, namespace: str, name: str) -> dict[str, list[Any]]:
        """Every object labelled as this experiment's child, by kind (deleting ones included)."""
        selector = f"{LABEL_EXPERIMENT}={name}"
        return {
            "deployments": self.apps.list_namespaced_deployment(namespace, label_selector=selector).items,
            "services": self.core.list_namespaced_service(namespace, label_selector=selector).items,
            "jobs": self.batch.list_namespaced_job(namespace, label_selector=selector).items,
            "pods": self.core.list_namespaced_pod(namespace, label_selector=selector).items,
            "configmaps": self.core.list_namespaced_config_map(namespace, label_selector=selector).items,
        }

    def child_names(self, namespace: str, name: str) -> dict[str, list[str]]:
        """Sorted names of the children, only the kinds that have some (ConfigMaps included)."""
        return {kind: sorted(o.metadata.name for o in objs) for kind, objs in self.children(namespace, name).items() if objs}

    def workload_names(self, namespace: str, name: str) -> dict[str, list[str]]:
        """Names of the Deployments, Services, Jobs and pods that still exist, every kind listed (empty or not)."""
        return {kind: [o.metadata.name for o in objs] for kind, objs in self.children(namespace, name).items() if kind != "configmaps"}

    def gpu_pods(self, namespace: str) -> list[str]:
        """Pods in ``namespace`` that hold GPUs (not finished)."""
        pods = self.core.list_namespaced_pod(namespace).items
        return [p.metadata.name for p in pods if gpu_request(p) and p.status.phase not in ("Succeeded", "Failed")]

    def node_gpus(self) -> dict[str, tuple[int, int]]:
        """node -> (GPUs requested by pods bound to it and not finished, allocatable GPUs)."""
        allocatable = {n.metadata.name: int((n.status.allocatable or {}).get(GPU) or 0) for n in self.core.list_node().items}
        used = self.gpus_held()
        return {node: (used.get(node, 0), alloc) for node, alloc in allocatable.items()}

    def gpus_held(self, namespaces: Iterable[str] | None = None) -> dict[str, int]:
        """GPUs requested by bound, non-terminated pods, per node (only ``namespaces`` when given)."""
        held: dict[str, int] = defaultdict(int)
        wanted = set(namespaces) if namespaces is not None else None
        for pod in self.core.list_pod_for_all_namespaces(field_selector="status.phase!=Succeeded,status.phase!=Failed").items:
            if (wanted is not None and pod.metadata.namespace not in wanted) or not pod.spec.node_name:
                continue
            if gpus := gpu_request(pod):
                held[pod.spec.node_name] += gpus
        return dict(held)


@dataclass
class ChildPoller:
    """Lists the experiments' Deployments, Services, Jobs and engine pods and the nodes' GPU use every ``interval`` seconds.

    Use as a context manager around the part of a test where the operator works.
    """

    experiments: Cluster
    targets: list[tuple[str, str]]
    """(namespace, experiment name) pairs."""
    interval: float = 0.3
    max_live: dict[tuple[str, str, str, str], int] = field(default_factory=lambda: defaultdict(int))
    """(namespace, experiment, kind, tier) -> most objects of that kind for that tier alive at once (not deleting)."""
    uids: dict[tuple[str, str, str], set[str]] = field(default_factory=lambda: defaultdict(set))
    """(namespace, kind, object name) -> every uid seen under that name (more than one: re-created)."""
    overcommitted: list[tuple[str, int, int]] = field(default_factory=list)
    """(node, requested, allocatable) samples where requests exceeded allocatable."""
    unschedulable: set[str] = field(default_factory=set)
    """Engine pods of the targets the scheduler reported Unschedulable."""
    children_seen: dict[tuple[str, str, str], tuple[dict[str, str], list[tuple[str, str, bool]]]] = field(default_factory=dict)
    """(namespace, kind, name) -> (labels, [(owner kind, owner uid, controller)]) of every Deployment, Service and Job seen."""
    job_args: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    """(namespace, Job name) -> the load generator's arguments of every Job seen."""
    engine_gpus: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))
    """(namespace, experiment) -> the most GPUs one of its engine pods requested."""
    statuses: list[tuple[float, str, dict[str, Any]]] = field(default_factory=list)
    """(monotonic time, experiment, status) for every poll."""
    polls: int = 0
    errors: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="child-poller", daemon=True)

    def __enter__(self) -> ChildPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._poll()
            except Exception as exc:  # noqa: BLE001 - an API hiccup must not end the thread
                self.errors.append(f"{type(exc).__name__}: {exc}"[:300])
            self._stop.wait(self.interval)

    def _poll(self) -> None:
        api = self.experiments
        for namespace, name in self.targets:
            selector = f"{LABEL_EXPERIMENT}={name}"
            live: dict[tuple[str, str, str, str], int] = defaultdict(int)
            listed = (
                ("deployments", api.apps.list_namespaced_deployment(namespace, label_selector=selector).items),
                ("jobs", api.batch.list_namespaced_job(namespace, label_selector=selector).items),
                ("services", api.core.list_namespaced_service(namespace, label_selector=selector).items),
            )
            for kind, objs in listed:
                for obj in objs:
                    meta = obj.metadata
                    owners = [(o.kind, o.uid, bool(o.controller)) for o in meta.owner_references or []]
                    self.children_seen[(namespace, kind, meta.name)] = (dict(meta.labels or {}), owners)
                    self.uids[(namespace, kind, meta.name)].add(meta.uid)
                    if kind == "jobs":
                        self.job_args[(namespace, meta.name)] = list(obj.spec.template.spec.containers[0].args or [])
                    if meta.deletion_timestamp is None:
                        live[(namespace, name, kind, (meta.labels or {}).get(LABEL_TIER, ""))] += 1
            for key, count in live.items():
                self.max_live[key] = max(self.max_live[key], count)
            for pod in api.core.list_namespaced_pod(namespace, label_selector=f"{selector},{LABEL_ROLE}={ROLE_ENGINE}").items:
                self.engine_gpus[(namespace, name)] = max(self.engine_gpus[(namespace, name)], gpu_request(pod))
                for cond in pod.status.conditions or []:
                    if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
                        self.unschedulable.add(f"{namespace}/{pod.metadata.name}")
            self.statuses.append((time.monotonic(), name, api.status(namespace, name)))
        for node, (used, alloc) in api.node_gpus().items():
            if used > alloc:
                self.overcommitted.append((node, used, alloc))
        self.polls += 1

    def recreated(self) -> dict[tuple[str, str, str], set[str]]:
        """Children deleted and created again under the same name."""
        return {key: uids for key, uids in self.uids.items() if len(uids) > 1}

    def duplicated(self) -> dict[tuple[str, str, str, str], int]:
        """(namespace, experiment, kind, tier) that had more than one live object at once."""
        return {key: n for key, n in self.max_live.items() if n > 1}

    def tiers_deployed(self, namespace: str, name: str) -> set[str]:
        """Tiers that had an engine Deployment at any poll."""
        return {key[3] for key in self.max_live if key[:3] == (namespace, name, "deployments")}

    def seen_statuses(self, name: str) -> list[dict[str, Any]]:
        return [s for _, n, s in self.statuses if n == name]
