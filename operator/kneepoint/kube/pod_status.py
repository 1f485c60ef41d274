"""Pure readings of pod, Job and node objects (plain dicts as the API returns them).

One function maps an engine's pods to "ready / cannot start, and why" (the way Katib's
``GetDeployedJobStatus`` maps a job to a state): table-tested without a cluster.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from kneepoint.core import node_labels
from kneepoint.core.observations import (
    START_CONFIG_ERROR,
    START_CRASH_LOOP,
    START_IMAGE_PULL,
    START_OUT_OF_MEMORY,
    START_UNSCHEDULABLE,
    DomainCapacity,
    EngineState,
    FleetView,
)
from kneepoint.kube import naming

# vLLM's own words when the model does not fit (REFERENCE.md section 2; the simulator prints
# the same): the EngineCore's (or, with TP > 1, a worker's) root cause, the line a tier's
# reason carries. The first marker found, in this order, names the cause.
OOM_MARKERS = (
    "No available memory for the cache blocks",
    # The KV pool cannot hold one max-model-len sequence.
    "larger than the available KV cache memory",
    "CUDA out of memory",
    "OutOfMemoryError",
)
# The kubelet's own word (the kernel's OOM killer ended the container).
_KUBELET_OOM = "OOMKilled"
# vLLM's pointers to a root cause printed earlier in the log: never the cause themselves.
_POINTER_LINES = (
    "Engine core initialization failed",
    "WorkerProc initialization failed",
    "See root cause above",
    "See stack trace for root cause",
)
# Figures vLLM logs on the way to the failure that say by how much it did not fit.
_CONTEXT_PREFIXES = ("Model loading took", "Available KV cache memory:")
# ``(EngineCore pid=3155) ERROR 12-01 18:27:09 [core.py:1231] `` and the like: vLLM's process
# tag and its logging prefix, dropped so the reason shows vLLM's message itself.
_VLLM_PREFIX = re.compile(
    r"^(?:\([^()]*?\bpid=\d+\)\s?)?"
    r"(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[[^\]]*\]\s?)?"
)
_EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?(?:[A-Z]\w*)?(?:Error|Exception|Exit|Interrupt): ")
REASON_MAX_CHARS = 500
# How much of a failed engine's log the operator reads: the root cause sits above the API
# server's traceback (about 110 lines from the end on a TP1 70B start; TP8 adds a traceback
# per worker rank). Both bounds hold, whichever is reached first.
LOG_TAIL_LINES = 1000
LOG_LIMIT_BYTES = 1024 * 1024
# A multi-node group whose every pod failed at once is read a few pods a pass, not all at once.
MAX_LOG_READS_PER_PASS = 4


def _get(obj: Mapping[str, Any] | None, *path: str, default: Any = None) -> Any:
    cur: Any = obj
    for key in path:
        if not isinstance(cur, Mapping):
            return default
        cur = cur.get(key)
    return default if cur is None else cur


def vllm_message(line: str) -> str:
    """A log line without vLLM's process tag and logging prefix."""
    return _VLLM_PREFIX.sub("", line.rstrip("\r\n"), count=1).strip()


@dataclass(frozen=True)
class EngineFailure:
    """Why an engine process ended, read from its output (log or termination message)."""

    out_of_memory: bool
    line: str
    """vLLM's own line: the root cause, or the last exception line when none is named."""

    def message(self, limit: int = REASON_MAX_CHARS) -> str:
        return self.line if len(self.line) <= limit else self.line[: limit - 3] + "..."


def classify_engine_output(text: str | None) -> EngineFailure | None:
    """The root cause of a failed vLLM start in ``text`` (a pod log or its tail), or None.

    Out of memory when one of vLLM's does-not-fit lines is there (the first in
    :data:`OOM_MARKERS` order names it), with the figures vLLM printed on the way
    (``Model loading took ...``, ``Available KV cache memory: ...``). Otherwise the first
    exception line that is not a pointer to a cause printed elsewhere (``Engine core
    initialization failed. See root cause above``, TP > 1's ``WorkerProc initialization
    failed``); that pointer is the answer only when nothing else is there, as in the
    kubelet's termination message (the last 2048 bytes / 80 lines) of a real vLLM failure.
    """
    if not text:
        return None
    lines = [vllm_message(raw) for raw in text.splitlines()]
    lines = [line for line in lines if line]
    for marker in OOM_MARKERS:
        hit = next((line for line in lines if marker in line), None)
        if hit is not None:
            context = []
            for prefix in _CONTEXT_PREFIXES:
                # The last such line before the failure (a restarted engine's log has one run only).
                found = [line for line in lines if line.startswith(prefix)]
                if found and found[-1] not in hit:
                    context.append(found[-1])
            return EngineFailure(True, hit + (f" ({'; '.join(context)})" if context else ""))
    if any(_KUBELET_OOM == line for line in lines):
        return EngineFailure(True, _KUBELET_OOM)
    exceptions = [line for line in lines if _EXCEPTION_LINE.match(line)]
    cause = next((line for line in exceptions if not any(p in line for p in _POINTER_LINES)), None)
    if cause is not None:
        return EngineFailure(False, cause)
    if exceptions:
        return EngineFailure(False, exceptions[-1])
    return None


@dataclass(frozen=True)
class FailedRun:
    """One terminated run of an engine container whose log the operator reads (once)."""

    pod: str
    container: str
    previous: bool
    """True: the run before the container's current one (``kubectl logs --previous``)."""
    key: str
    """Names the run (pod uid, container, container id or finish time): a log is read once per run."""


def failed_engine_runs(pods: Iterable[Mapping[str, Any]], container: str) -> list[FailedRun]:
    """The engine containers that ended in failure and are not Ready: whose log holds why.

    A container terminated and not restarted yet is read as it is (``previous=False``); one
    restarted since, running or waiting in CrashLoopBackOff, through ``previous=True``. A
    Ready pod, a clean exit (code 0) and a pod being deleted need no read.
    """
    out = []
    for pod in pods:
        if _get(pod, "metadata", "deletionTimestamp") or _is_ready(pod):
            continue
        name = str(_get(pod, "metadata", "name", default=""))
        uid = str(_get(pod, "metadata", "uid", default=name))
        for cs in _get(pod, "status", "containerStatuses", default=[]):
            if cs.get("name") != container:
                continue
            terminated = _get(cs, "state", "terminated")
            last = _get(cs, "lastState", "terminated")
            run, previous = (terminated, False) if terminated else (last, True)
            if not run or int(run.get("exitCode") or 0) == 0 and run.get("reason") != _KUBELET_OOM:
                continue
            run_id = run.get("containerID") or run.get("finishedAt") or str(cs.get("restartCount") or 0)
            out.append(FailedRun(name, container, previous, f"{uid}/{container}/{run_id}"))
    return out


def engine_state(
    deployment: Mapping[str, Any] | None,
    pods: Iterable[Mapping[str, Any]],
    logs: Mapping[str, str | None] | None = None,
) -> EngineState:
    """Whether the tier's engine is Ready, or why it cannot start.

    ``logs`` maps a pod's name to the log of its failed engine run (see
    :func:`failed_engine_runs`); the termination message is the fallback where there is no
    log. A real vLLM writes its root cause only in the log (the termination message's
    last 2048 bytes hold just the API server's traceback).
    """
    if deployment is None:
        return EngineState(exists=False)
    pods = [p for p in pods if not _get(p, "metadata", "deletionTimestamp")]
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for p in pods for c in _get(p, "status", "conditions", default=[])
    )
    node = next((_get(p, "spec", "nodeName") for p in pods if _get(p, "spec", "nodeName")), None)
    if ready:
        return EngineState(exists=True, ready=True, node_name=node)
    failure, message, restarts = None, None, 0
    for pod in pods:
        for cond in _get(pod, "status", "conditions", default=[]):
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
                failure, message = START_UNSCHEDULABLE, cond.get("message")
        log_text = (logs or {}).get(str(_get(pod, "metadata", "name", default="")))
        for cs in _get(pod, "status", "containerStatuses", default=[]):
            restarts = max(restarts, int(cs.get("restartCount") or 0))
            waiting = _get(cs, "state", "waiting", default={})
            terminated = _get(cs, "state", "terminated", default={})
            last = _get(cs, "lastState", "terminated", default={})
            run = terminated or last
            # The log first (vLLM's root cause), then the termination message, then the kubelet's reason.
            cause = (
                classify_engine_output(log_text)
                or classify_engine_output(run.get("message"))
                or classify_engine_output(run.get("reason"))
            )
            if cause is not None and cause.out_of_memory:
                failure, message = START_OUT_OF_MEMORY, cause.message()
            elif failure == START_OUT_OF_MEMORY:
                continue
            elif waiting.get("reason") in ("ImagePullBackOff", "ErrImagePull", "InvalidImageName"):
                failure, message = START_IMAGE_PULL, waiting.get("message") or waiting.get("reason")
            elif waiting.get("reason") == "CreateContainerConfigError":
                failure, message = START_CONFIG_ERROR, waiting.get("message")
            elif waiting.get("reason") == "CrashLoopBackOff":
                failure = START_CRASH_LOOP
                if cause is not None:
                    message = cause.message()
                else:
                    message = (last.get("message") or waiting.get("message") or "").strip()[-REASON_MAX_CHARS:]
    return EngineState(exists=True, ready=False, node_name=node, start_failure=failure, failure_message=message, restarts=restarts)


def _is_ready(pod: Mapping[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in _get(pod, "status", "conditions", default=[]))


def _group_rank(pod: Mapping[str, Any]) -> tuple[int, str]:
    """Leader first, then workers by LWS worker index (name as the tie-break)."""
    labels = _get(pod, "metadata", "labels", default={})
    if labels.get(naming.LABEL_GROUP_ROLE) == naming.GROUP_LEADER:
        return (-1, "")
    try:
        index = int(labels.get(naming.LWS_WORKER_INDEX, ""))
    except ValueError:
        index = 1 << 30
    return (index, str(_get(pod, "metadata", "name", default="")))


def group_state(
    leader_worker_set: Mapping[str, Any] | None,
    pods: Iterable[Mapping[str, Any]],
    logs: Mapping[str, str | None] | None = None,
) -> EngineState:
    """A multi-node tier's engine (one LeaderWorkerSet group): Ready only when every pod is.

    Counts the pods bound to a node, so a group the scheduler placed only in part (leader
    running, workers Pending) reports Unschedulable with ``placed K of N pods`` and the
    scheduler's words for the first pod left out. Container failures (out of memory, crash
    loops, config errors) are read as for a Deployment's pod.
    """
    if leader_worker_set is None:
        return EngineState(exists=False)
    size = int(_get(leader_worker_set, "spec", "leaderWorkerTemplate", "size", default=1) or 1)
    live = sorted((p for p in pods if not _get(p, "metadata", "deletionTimestamp")), key=_group_rank)
    # Why the pods that are not Ready cannot start (a Ready pod would hide them in engine_state).
    base = engine_state(leader_worker_set, [p for p in live if not _is_ready(p)], logs)
    placed = [p for p in live if _get(p, "spec", "nodeName")]
    node_names = tuple(dict.fromkeys(_get(p, "spec", "nodeName") for p in placed))
    ready = len(live) >= size and sum(1 for p in live if _is_ready(p)) >= size
    leader_node = next((_get(p, "spec", "nodeName") for p in placed if _group_rank(p)[0] == -1), None)
    failure, message = base.start_failure, base.failure_message
    if failure == START_UNSCHEDULABLE or (failure is None and len(placed) < size and len(live) >= size):
        left_out = next((p for p in live if not _get(p, "spec", "nodeName")), None)
        why = ""
        if left_out is not None:
            for cond in _get(left_out, "status", "conditions", default=[]):
                if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                    why = f"; pod {_get(left_out, 'metadata', 'name')}: {cond.get('message') or cond.get('reason') or 'not scheduled'}"
        if failure == START_UNSCHEDULABLE or why:
            failure, message = START_UNSCHEDULABLE, f"placed {len(placed)} of {size} pods{why}"
    return EngineState(
        exists=True,
        ready=ready,
        node_name=leader_node or (node_names[0] if node_names else None),
        start_failure=None if ready else failure,
        failure_message=None if ready else message,
        restarts=base.restarts,
        pods_total=size,
        pods_placed=len(placed),
        node_names=node_names,
    )


def job_outcome(job: Mapping[str, Any] | None) -> tuple[bool, bool, str | None]:
    """(succeeded, failed, message) from a Job's conditions."""
    if job is None:
        return False, False, None
    for cond in _get(job, "status", "conditions", default=[]):
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            return True, False, None
        if cond.get("type") == "Failed":
            return False, True, f"{cond.get('reason', 'Failed')}: {cond.get('message', '')}".strip(": ")
    if _get(job, "status", "succeeded", default=0) >= 1:
        return True, False, None
    return False, False, None


def termination_message(pods: Iterable[Mapping[str, Any]], container: str) -> str | None:
    """The termination message of ``container`` in the most recent terminated pod."""
    best: tuple[str, str] | None = None
    for pod in pods:
        for cs in _get(pod, "status", "containerStatuses", default=[]):
            if cs.get("name") != container:
                continue
            term = _get(cs, "state", "terminated")
            if term and term.get("message"):
                stamp = term.get("finishedAt") or ""
                if best is None or stamp > best[0]:
                    best = (stamp, term["message"])
    return best[1] if best else None


def parse_summary(message: str | None) -> dict[str, Any] | None:
    """The load generator's summary (CONTRACTS A) from a termination message, or None."""
    if not message:
        return None
    try:
        data = json.loads(message)
    except ValueError:
        return None
    return data if isinstance(data, dict) and data.get("v") == 1 else None


def _gpu_quantity(value: Any) -> int:
    try:
        return int(str(value))
    except (TypeError, ValueError):
        return 0


def placement_problem(
    nodes: Iterable[Mapping[str, Any]], gpu_resource: str, gpu_product: str | None, node_selector: Mapping[str, str]
) -> str | None:
    """Why no node can ever hold the experiment's engines, naming the spec field; None when one can.

    Checked in the order a user would fix it: the GPU resource, the node selector, the product.
    """
    ready = [
        n for n in nodes
        if not _get(n, "spec", "unschedulable")
        and any(c.get("type") == "Ready" and c.get("status") == "True" for c in _get(n, "status", "conditions", default=[]))
    ]
    with_resource = [n for n in ready if _gpu_quantity(_get(n, "status", "allocatable", default={}).get(gpu_resource)) > 0]
    if not with_resource:
        offered = sorted({k for n in ready for k, v in _get(n, "status", "allocatable", default={}).items() if "/" in k and _gpu_quantity(v) > 0})
        return f"spec.placement.gpuResource: no Ready node offers {gpu_resource}" + (
            f" (extended resources on the nodes: {', '.join(offered)})" if offered else ""
        )
    selected = [n for n in with_resource if all(_get(n, "metadata", "labels", default={}).get(k) == v for k, v in node_selector.items())]
    if not selected:
        wanted = ", ".join(f"{k}={v}" for k, v in sorted(node_selector.items()))
        return f"spec.placement.nodeSelector: {wanted} matches none of the {len(with_resource)} node(s) offering {gpu_resource}"
    if gpu_product:
        labels = [_get(n, "metadata", "labels", default={}) for n in selected]
        products = sorted({node_gpu_product(lb) for lb in labels} - {""})
        if gpu_product not in products:
            return (f"spec.placement.gpuProduct: no node offering {gpu_resource} is labelled {gpu_product} "
                    f"(products in the fleet: {', '.join(products) or 'none labelled'})")  # fmt: skip
    return None


# GPU Feature Discovery appends this to the product under time-slicing (renameByDefault false).
SHARED_SUFFIX = "-SHARED"


def node_gpu_product(labels: Mapping[str, str]) -> str:
    """The node's GPU product: GFD's label without its time-slicing suffix, else the node probe's; "" if neither."""
    gfd = labels.get(node_labels.NODE_GPU_PRODUCT)
    if gfd:
        return gfd.removesuffix(SHARED_SUFFIX)
    return labels.get(node_labels.NODE_PROBE_GPU_PRODUCT) or ""


def product_selector(labels: Mapping[str, str], gpu_product: str) -> tuple[str, str] | None:
    """The node label (key, value) by which this node matched ``gpu_product``, for the engine's nodeSelector.

    GFD's ``nvidia.com/gpu.product`` as it is on the node (with ``-SHARED`` under time-slicing),
    else the probe's ``kneepoint.io/gpu-product``; None when the node has another product.
    """
    gfd = labels.get(node_labels.NODE_GPU_PRODUCT)
    if gfd and gfd.removesuffix(SHARED_SUFFIX) == gpu_product:
        return node_labels.NODE_GPU_PRODUCT, gfd
    if not gfd and labels.get(node_labels.NODE_PROBE_GPU_PRODUCT) == gpu_product:
        return node_labels.NODE_PROBE_GPU_PRODUCT, gpu_product
    return None


def product_selectors(nodes: Iterable[Mapping[str, Any]], gpu_product: str) -> dict[str, tuple[str, str]]:
    """Node name -> the label it matched ``gpu_product`` by (nodes of other products left out)."""
    out = {}
    for node in nodes:
        selector = product_selector(_get(node, "metadata", "labels", default={}), gpu_product)
        if selector is not None:
            out[_get(node, "metadata", "name")] = selector
    return out


def fleet_view(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    gpu_resource: str,
    gpu_product: str | None,
    node_selector: Mapping[str, str],
    reserved: Mapping[str, int] | None = None,
    topology_key: str | None = None,
) -> FleetView:
    """Free GPUs per node for the experiment's product and selector.

    ``reserved`` holds GPUs promised to engines created a moment ago whose pods the API
    does not show yet, so two passes in quick succession never promise the same GPUs twice.
    ``topology_key`` (the spec's multi-node topology label) fills each node's domain value.
    """
    used: dict[str, int] = {}
    for pod in pods:
        node = _get(pod, "spec", "nodeName")
        if not node or _get(pod, "status", "phase") in ("Succeeded", "Failed"):
            continue
        for c in _get(pod, "spec", "containers", default=[]):
            req = _get(c, "resources", "requests", default={}).get(gpu_resource) or _get(c, "resources", "limits", default={}).get(gpu_resource)
            used[node] = used.get(node, 0) + _gpu_quantity(req)
    domains = []
    for node in nodes:
        labels = _get(node, "metadata", "labels", default={})
        name = _get(node, "metadata", "name")
        if _get(node, "spec", "unschedulable"):
            continue
        if any(labels.get(k) != v for k, v in node_selector.items()):
            continue
        product = node_gpu_product(labels)
        if gpu_product and product != gpu_product:
            continue
        total = _gpu_quantity(_get(node, "status", "allocatable", default={}).get(gpu_resource))
        if total <= 0:
            continue
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in _get(node, "status", "conditions", default=[]))
        if not ready:
            continue
        size = _gpu_quantity(labels.get(node_labels.NODE_NVLINK_DOMAIN_SIZE)) or 1
        free = total - used.get(name, 0) - (reserved or {}).get(name, 0)
        domains.append(
            DomainCapacity(
                node_name=name,
                gpu_product=product,
                gpus_total=total,
                gpus_free=max(0, free),
                nvlink_domain=labels.get(node_labels.NODE_NVLINK_DOMAIN),
                nvlink_domain_size=size,
                interconnect=labels.get(node_labels.NODE_INTERCONNECT) or ("nvlink" if size > 1 else "pcie"),
                topology_domain=labels.get(topology_key) if topology_key else None,
            )
        )
    return FleetView(tuple(sorted(domains, key=lambda d: d.node_name)))
