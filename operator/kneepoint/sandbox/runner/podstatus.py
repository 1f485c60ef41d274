"""Pod status as the kubelet would write it, built from what the runner observed.

Pure (standard library only). The runner keeps one :class:`ContainerRecord` per container
(waiting / running / terminated, readiness, restarts) and turns them into a strategic-merge
patch for ``pods/status``: phase, pod and host addresses, the kubelet's four conditions
and ``containerStatuses``. Controllers then do their real work from it: a Deployment
becomes Available when its pod is Ready, a Job completes or fails from the pod's phase.

Termination, as the kubelet: exit code (a signal N becomes 128+N), reason ``Completed``
for 0 and ``Error`` otherwise, message = the termination-message file (at most 4096
bytes); with ``terminationMessagePolicy: FallbackToLogsOnError`` an empty file on failure
gives the log tail (last 80 lines, at most 2048 bytes). A simulator that refuses to start
because the model does not fit exits 1 with reason ``Error``, as vLLM does on a real
kubelet (the kernel's OOM killer is not involved): the operator reads the cause from the
container's log, which KWOK serves from the files :func:`pod_logs_object` names.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MAX_MESSAGE_BYTES = 4096
FALLBACK_LOG_LINES = 80
FALLBACK_LOG_BYTES = 2048
# KWOK's Logs resource (kwok.x-k8s.io/v1alpha1): which file ``kubectl logs [--previous]`` reads.
KWOK_LOGS_GROUP, KWOK_LOGS_VERSION, KWOK_LOGS_PLURAL = "kwok.x-k8s.io", "v1alpha1", "logs"

WAITING, RUNNING, TERMINATED = "waiting", "running", "terminated"
MANAGED_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


@dataclass
class ContainerRecord:
    """What the runner knows about one container of one pod."""

    name: str
    image: str
    state: str = WAITING
    reason: str = "ContainerCreating"
    message: str = ""
    started_at: str | None = None
    finished_at: str | None = None
    exit_code: int | None = None
    ready: bool = False
    started: bool = False
    restart_count: int = 0
    last_terminated: dict[str, Any] | None = None
    container_id: str = ""

    def wait(self, reason: str, message: str = "") -> None:
        """Waiting (ContainerCreating, CrashLoopBackOff, CreateContainerConfigError, ...)."""
        self.state, self.reason, self.message = WAITING, reason, message
        self.ready = self.started = False

    def run(self, now: str, container_id: str) -> None:
        """Running since ``now``."""
        self.state, self.reason, self.message = RUNNING, "", ""
        self.started_at, self.finished_at, self.exit_code = now, None, None
        self.started, self.ready = True, False
        self.container_id = container_id

    def terminate(self, now: str, exit_code: int, reason: str, message: str) -> None:
        """Terminated at ``now``; the previous state is kept for lastState on restart."""
        self.state, self.exit_code, self.reason, self.message = TERMINATED, exit_code, reason, message
        self.finished_at = now
        self.ready = self.started = False

    def begin_restart(self) -> None:
        """Move the current termination into lastState and count one restart."""
        if self.state == TERMINATED:
            self.last_terminated = self.terminated_dict()
            self.restart_count += 1

    def terminated_dict(self) -> dict[str, Any]:
        """``state.terminated`` of the current termination."""
        out: dict[str, Any] = {"exitCode": int(self.exit_code or 0), "reason": self.reason}
        if self.message:
            out["message"] = self.message
        if self.started_at:
            out["startedAt"] = self.started_at
        if self.finished_at:
            out["finishedAt"] = self.finished_at
        if self.container_id:
            out["containerID"] = self.container_id
        return out


def container_status(record: ContainerRecord) -> dict[str, Any]:
    """One entry of ``containerStatuses``."""
    if record.state == RUNNING:
        state: dict[str, Any] = {"running": {"startedAt": record.started_at}}
    elif record.state == TERMINATED:
        state = {"terminated": record.terminated_dict()}
    else:
        waiting: dict[str, Any] = {"reason": record.reason}
        if record.message:
            waiting["message"] = record.message
        state = {"waiting": waiting}
    out: dict[str, Any] = {
        "name": record.name,
        "image": record.image,
        "imageID": "",
        "ready": record.ready,
        "started": record.started,
        "restartCount": record.restart_count,
        "state": state,
        "lastState": {"terminated": record.last_terminated} if record.last_terminated else {},
    }
    if record.container_id:
        out["containerID"] = record.container_id
    return out


def exit_code_of(returncode: int) -> int:
    """A process's return code as a container's exit code (killed by signal N -> 128+N)."""
    return 128 - returncode if returncode < 0 else returncode


def termination_reason(exit_code: int, output_tail: str = "") -> str:
    """``Completed`` or ``Error``, as the kubelet (OOMKilled only comes from the kernel, which the sandbox has not)."""
    return "Completed" if exit_code == 0 else "Error"


def pod_logs_object(namespace: str, pod: str, uid: str, files: Mapping[str, tuple[str, str | None]]) -> dict[str, Any]:
    """KWOK's ``Logs`` for one pod: per container the file of its current log and of its previous one.

    ``files`` maps a container to (current, previous or None). The kubelet's rule decides
    which run each is (pods): ``--previous`` is the run in ``lastState.terminated``;
    the current log is the running or terminated run, else (waiting to restart) that same
    last run. The pod owns the object, so it goes with the pod.
    """
    logs = []
    for container in sorted(files):
        current, previous = files[container]
        entry: dict[str, Any] = {"containers": [container], "logsFile": current, "follow": False}
        if previous:
            entry["previousLogsFile"] = previous
        logs.append(entry)
    return {
        "apiVersion": f"{KWOK_LOGS_GROUP}/{KWOK_LOGS_VERSION}",
        "kind": "Logs",
        "metadata": {
            "name": pod,
            "namespace": namespace,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod, "uid": uid}],
        },
        "spec": {"logs": logs},
    }


def log_fallback(output_tail: str) -> str:
    """The kubelet's FallbackToLogsOnError text: last 80 lines, at most 2048 bytes."""
    lines = output_tail.splitlines()[-FALLBACK_LOG_LINES:]
    data = "\n".join(lines).encode("utf-8", "replace")[-FALLBACK_LOG_BYTES:]
    return data.decode("utf-8", "ignore")


def termination_message(file_bytes: bytes, output_tail: str, policy: str, exit_code: int) -> str:
    """``state.terminated.message``: the file's first 4096 bytes, else (policy allowing) the log tail."""
    message = file_bytes[:MAX_MESSAGE_BYTES].decode("utf-8", "replace")
    if not message and policy == "FallbackToLogsOnError" and exit_code != 0:
        message = log_fallback(output_tail)
    return message


def signal_name(exit_code: int) -> str:
    """``SIGKILL`` for 137 etc.; empty when the code is no signal's."""
    if exit_code > 128:
        try:
            return signal.Signals(exit_code - 128).name
        except ValueError:
            return ""
    return ""


def pod_phase(restart_policy: str, init_failed: bool, initialized: bool, records: Sequence[ContainerRecord]) -> str:
    """Pending / Running / Succeeded / Failed from the containers, as the kubelet decides."""
    if init_failed and restart_policy == "Never":
        return "Failed"
    if not initialized:
        return "Pending"
    running = waiting = succeeded = failed = 0
    for record in records:
        if record.state == RUNNING:
            running += 1
        elif record.state == TERMINATED:
            if record.exit_code == 0:
                succeeded += 1
            else:
                failed += 1
        elif record.last_terminated is not None:
            # Waiting to restart (CrashLoopBackOff) counts as running: the pod is not done.
            running += 1
        else:
            waiting += 1
    if waiting:
        return "Pending"
    if running:
        return "Running"
    if restart_policy == "Always":
        return "Running"
    if failed and restart_policy == "OnFailure":
        return "Running"
    return "Failed" if failed else "Succeeded"


@dataclass(frozen=True)
class PodObservation:
    """Everything :func:`build_status_patch` needs about one pod's runtime."""

    pod_ip: str
    host_ip: str
    start_time: str
    phase: str
    initialized: bool
    init_records: Sequence[ContainerRecord] = field(default=())
    records: Sequence[ContainerRecord] = field(default=())
    message: str = ""
    reason: str = ""


def _condition(
    previous: Mapping[str, Mapping[str, Any]], kind: str, status: bool, reason: str, message: str, now: str, generation: Any
) -> dict[str, Any]:
    value = "True" if status else "False"
    before = previous.get(kind) or {}
    changed = before.get("status") != value
    out: dict[str, Any] = {
        "type": kind,
        "status": value,
        "lastProbeTime": None,
        "lastTransitionTime": now if changed or not before.get("lastTransitionTime") else before["lastTransitionTime"],
    }
    # Always present: in a strategic-merge patch an absent key would keep a stale value.
    out["reason"] = reason if reason and not status else None
    out["message"] = message if message and not status else None
    if generation is not None:
        out["observedGeneration"] = generation
    return out


def build_status_patch(pod: Mapping[str, Any], observed: PodObservation, now: str) -> dict[str, Any]:
    """The strategic-merge patch body for ``pods/status``.

    Conditions merge by type, so conditions others own (PodScheduled, readiness gates,
    DisruptionTarget) stay; ``lastTransitionTime`` is kept while a condition's status does
    not change. ``podIPs`` is replaced, not merged.
    """
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    spec = pod.get("spec") or {}
    generation = metadata.get("generation")
    previous = {c.get("type"): c for c in status.get("conditions") or []}
    terminal = observed.phase in ("Succeeded", "Failed")
    unready = [r.name for r in observed.records if not r.ready]
    containers_ready = not unready and not terminal and bool(observed.records)
    gates = [g.get("conditionType") for g in spec.get("readinessGates") or []]
    gates_open = all((previous.get(g) or {}).get("status") == "True" for g in gates)
    not_ready_reason = "PodCompleted" if terminal else "ContainersNotReady"
    not_ready_message = "" if terminal else f"containers with unready status: [{' '.join(unready)}]"
    ready_reason, ready_message = not_ready_reason, not_ready_message
    if containers_ready and not gates_open:
        ready_reason, ready_message = "ReadinessGatesNotReady", "the status of pod readiness gate is not set to True"
    pending_init = [r.name for r in observed.init_records if not (r.state == TERMINATED and r.exit_code == 0)]
    conditions = [
        _condition(previous, "PodReadyToStartContainers", not terminal, "", "", now, generation),
        _condition(
            previous,
            "Initialized",
            observed.initialized,
            "ContainersNotInitialized",
            f"containers with incomplete status: [{' '.join(pending_init)}]",
            now,
            generation,
        ),
        _condition(previous, "ContainersReady", containers_ready, not_ready_reason, not_ready_message, now, generation),
        _condition(previous, "Ready", containers_ready and gates_open, ready_reason, ready_message, now, generation),
    ]
    body: dict[str, Any] = {
        "phase": observed.phase,
        "hostIP": observed.host_ip,
        "hostIPs": [{"ip": observed.host_ip}],
        "podIP": observed.pod_ip,
        "podIPs": [{"ip": observed.pod_ip}, {"$patch": "replace"}],
        "startTime": observed.start_time,
        "conditions": conditions,
        "containerStatuses": [container_status(r) for r in observed.records],
    }
    if observed.init_records:
        body["initContainerStatuses"] = [container_status(r) for r in observed.init_records]
    if generation is not None:
        body["observedGeneration"] = generation
    if observed.reason:
        body["reason"] = observed.reason
    if observed.message:
        body["message"] = observed.message
    return {"status": body}
