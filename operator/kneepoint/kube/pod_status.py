"""Pure readings of an engine's pods (plain dicts as the API returns them).

One function maps an engine's pods to "ready / cannot start, and why" (the way Katib's
``GetDeployedJobStatus`` maps a job to a state): table-tested without a cluster. The
fleet's nodes are read in ``fleet`` (``fleet_view``), the load-test Job in ``load_test_result``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from kneepoint.core.observations import (
    START_CONFIG_ERROR,
    START_CRASH_LOOP,
    START_IMAGE_PULL,
    START_OUT_OF_MEMORY,
    START_UNSCHEDULABLE,
    EngineState,
)
from kneepoint.kube import naming
from kneepoint.kube.objects import dig

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
    if any(line == _KUBELET_OOM for line in lines):
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
        if dig(pod, "metadata", "deletionTimestamp") or _is_ready(pod):
            continue
        name = str(dig(pod, "metadata", "name", default=""))
        uid = str(dig(pod, "metadata", "uid", default=name))
        for cs in dig(pod, "status", "containerStatuses", default=[]):
            if cs.get("name") != container:
                continue
            terminated = dig(cs, "state", "terminated")
            last = dig(cs, "lastState", "terminated")
            run, previous = (terminated, False) if terminated else (last, True)
            if not run or (int(run.get("exitCode") or 0) == 0 and run.get("reason") != _KUBELET_OOM):
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
    pods = [p for p in pods if not dig(p, "metadata", "deletionTimestamp")]
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for p in pods for c in dig(p, "status", "conditions", default=[]))
    node = next((dig(p, "spec", "nodeName") for p in pods if dig(p, "spec", "nodeName")), None)
    if ready:
        return EngineState(exists=True, ready=True, node_name=node)
    failure, message, restarts = None, None, 0
    for pod in pods:
        for cond in dig(pod, "status", "conditions", default=[]):
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
                failure, message = START_UNSCHEDULABLE, cond.get("message")
        log_text = (logs or {}).get(str(dig(pod, "metadata", "name", default="")))
        for cs in dig(pod, "status", "containerStatuses", default=[]):
            restarts = max(restarts, int(cs.get("restartCount") or 0))
            waiting = dig(cs, "state", "waiting", default={})
            terminated = dig(cs, "state", "terminated", default={})
            last = dig(cs, "lastState", "terminated", default={})
            run = terminated or last
            # The log first (vLLM's root cause), then the termination message, then the kubelet's reason.
            cause = (
                classify_engine_output(log_text) or classify_engine_output(run.get("message")) or classify_engine_output(run.get("reason"))
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
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in dig(pod, "status", "conditions", default=[]))


def _group_rank(pod: Mapping[str, Any]) -> tuple[int, str]:
    """Leader first, then workers by LWS worker index (name as the tie-break)."""
    labels = dig(pod, "metadata", "labels", default={})
    if labels.get(naming.LABEL_GROUP_ROLE) == naming.GROUP_LEADER:
        return (-1, "")
    try:
        index = int(labels.get(naming.LWS_WORKER_INDEX, ""))
    except ValueError:
        index = 1 << 30
    return (index, str(dig(pod, "metadata", "name", default="")))


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
    size = int(dig(leader_worker_set, "spec", "leaderWorkerTemplate", "size", default=1) or 1)
    live = sorted((p for p in pods if not dig(p, "metadata", "deletionTimestamp")), key=_group_rank)
    # Why the pods that are not Ready cannot start (a Ready pod would hide them in engine_state).
    base = engine_state(leader_worker_set, [p for p in live if not _is_ready(p)], logs)
    placed = [p for p in live if dig(p, "spec", "nodeName")]
    node_names = tuple(dict.fromkeys(dig(p, "spec", "nodeName") for p in placed))
    ready = len(live) >= size and sum(1 for p in live if _is_ready(p)) >= size
    leader_node = next((dig(p, "spec", "nodeName") for p in placed if _group_rank(p)[0] == -1), None)
    failure, message = base.start_failure, base.failure_message
    if failure == START_UNSCHEDULABLE or (failure is None and len(placed) < size and len(live) >= size):
        left_out = next((p for p in live if not dig(p, "spec", "nodeName")), None)
        why = ""
        if left_out is not None:
            for cond in dig(left_out, "status", "conditions", default=[]):
                if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                    why = f"; pod {dig(left_out, 'metadata', 'name')}: {cond.get('message') or cond.get('reason') or 'not scheduled'}"
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
