"""Pod status built like the kubelet's: phase, conditions, containerStatuses, termination."""

from __future__ import annotations

from typing import Any

import pytest

from kneepoint.sandbox.runner.podstatus import (
    ContainerRecord,
    PodObservation,
    build_status_patch,
    container_status,
    exit_code_of,
    log_fallback,
    pod_phase,
    signal_name,
    termination_message,
    termination_reason,
)

T0, T1, T2 = "2026-11-29T10:00:00Z", "2026-11-29T10:00:05Z", "2026-11-29T10:01:00Z"


def running(name: str = "c", ready: bool = True) -> ContainerRecord:
    record = ContainerRecord(name, "img")
    record.run(T0, "sandbox://1")
    record.ready = ready
    return record


def terminated(code: int, name: str = "c") -> ContainerRecord:
    record = running(name)
    record.terminate(T1, code, "Completed" if code == 0 else "Error", "")
    return record


def crashlooping() -> ContainerRecord:
    record = terminated(1)
    record.begin_restart()
    record.wait("CrashLoopBackOff", "back-off 10s")
    return record


@pytest.mark.parametrize(
    ("policy", "records", "phase"),
    [
        ("Always", [ContainerRecord("c", "i")], "Pending"),
        ("Always", [running()], "Running"),
        ("Always", [crashlooping()], "Running"),
        ("Always", [terminated(0)], "Running"),
        ("Never", [terminated(0)], "Succeeded"),
        ("Never", [terminated(2)], "Failed"),
        ("Never", [terminated(0), running("d")], "Running"),
        ("Never", [terminated(0, "a"), terminated(1, "b")], "Failed"),
        ("OnFailure", [terminated(1)], "Running"),
        ("OnFailure", [terminated(0)], "Succeeded"),
    ],
)
def test_pod_phase(policy: str, records: list[ContainerRecord], phase: str) -> None:
    assert pod_phase(policy, False, True, records) == phase


def test_pod_phase_init() -> None:
    assert pod_phase("Never", True, False, [ContainerRecord("c", "i")]) == "Failed"
    assert pod_phase("Always", False, False, [ContainerRecord("c", "i")]) == "Pending"


def test_exit_codes_and_reasons() -> None:
    assert exit_code_of(-9) == 137 and exit_code_of(-15) == 143 and exit_code_of(3) == 3
    assert signal_name(137) == "SIGKILL" and signal_name(1) == ""
    assert termination_reason(0, "CUDA out of memory") == "Completed"
    # As a real kubelet: vLLM refusing to start for want of memory is an ordinary Error (the log says why).
    assert termination_reason(1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate") == "Error"
    assert termination_reason(1, "ValueError: No available memory for the cache blocks.") == "Error"
    assert termination_reason(1, "Traceback: boom") == "Error"


def test_termination_message_file_first_then_fallback_by_policy() -> None:
    tail = "\n".join(f"line {i}" for i in range(200))
    assert termination_message(b'{"v": 1}', tail, "File", 0) == '{"v": 1}'
    assert termination_message(b"x" * 5000, tail, "File", 1) == "x" * 4096
    assert termination_message(b"", tail, "File", 1) == ""
    assert termination_message(b"", tail, "FallbackToLogsOnError", 0) == ""
    fallback = termination_message(b"", tail, "FallbackToLogsOnError", 1)
    assert fallback.startswith("line 120") and fallback.endswith("line 199")
    assert len(log_fallback("y" * 10_000).encode()) == 2048


def test_container_status_shapes() -> None:
    record = crashlooping()
    status = container_status(record)
    assert status["state"] == {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s"}}
    assert status["lastState"]["terminated"]["exitCode"] == 1
    assert status["restartCount"] == 1 and status["ready"] is False
    done = container_status(terminated(0))
    assert done["state"]["terminated"] == {
        "exitCode": 0,
        "reason": "Completed",
        "startedAt": T0,
        "finishedAt": T1,
        "containerID": "sandbox://1",
    }
    assert done["lastState"] == {}


def pod(conditions: list[dict[str, Any]] | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "n", "generation": 1},
        "spec": {"containers": [{"name": "c"}], **spec},
        "status": {"conditions": conditions or [{"type": "PodScheduled", "status": "True", "lastTransitionTime": T0}]},
    }


def observe(records: list[ContainerRecord], phase: str = "Running") -> PodObservation:
    return PodObservation(pod_ip="127.2.0.5", host_ip="127.0.0.1", start_time=T0, phase=phase, initialized=True, records=records)


def conditions(patch: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in patch["status"]["conditions"]}


def test_ready_pod_patch() -> None:
    patch = build_status_patch(pod(), observe([running()]), T1)
    status = patch["status"]
    assert status["phase"] == "Running" and status["podIP"] == "127.2.0.5" and status["hostIP"] == "127.0.0.1"
    assert status["podIPs"] == [{"ip": "127.2.0.5"}, {"$patch": "replace"}]
    cond = conditions(patch)
    assert set(cond) == {"PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready"}  # PodScheduled is the scheduler's
    assert all(c["status"] == "True" and c["lastTransitionTime"] == T1 and c["observedGeneration"] == 1 for c in cond.values())
    assert status["containerStatuses"][0]["state"] == {"running": {"startedAt": T0}}


def test_transition_time_kept_while_status_unchanged() -> None:
    before = [
        {"type": "Ready", "status": "True", "lastTransitionTime": T0},
        {"type": "ContainersReady", "status": "False", "lastTransitionTime": T0},
    ]
    cond = conditions(build_status_patch(pod(before), observe([running()]), T2))
    assert cond["Ready"]["lastTransitionTime"] == T0
    assert cond["ContainersReady"]["lastTransitionTime"] == T2


def test_unready_and_completed_reasons() -> None:
    cond = conditions(build_status_patch(pod(), observe([running(ready=False)]), T1))
    assert cond["Ready"]["status"] == "False" and cond["Ready"]["reason"] == "ContainersNotReady"
    assert cond["Ready"]["message"] == "containers with unready status: [c]"
    cond = conditions(build_status_patch(pod(), observe([terminated(0)], "Succeeded"), T1))
    assert cond["Ready"]["reason"] == "PodCompleted" and cond["PodReadyToStartContainers"]["status"] == "False"
    # Stale reason/message of an earlier patch must be cleared explicitly (strategic merge keeps absent keys).
    assert cond["Ready"]["message"] is None
    assert conditions(build_status_patch(pod(), observe([running()]), T1))["Ready"]["reason"] is None


def test_readiness_gates_hold_ready_back() -> None:
    gated = pod([{"type": "example.com/gate", "status": "False"}], readinessGates=[{"conditionType": "example.com/gate"}])
    cond = conditions(build_status_patch(gated, observe([running()]), T1))
    assert cond["ContainersReady"]["status"] == "True"
    assert cond["Ready"]["status"] == "False" and cond["Ready"]["reason"] == "ReadinessGatesNotReady"
    gated["status"]["conditions"][0]["status"] = "True"
    assert conditions(build_status_patch(gated, observe([running()]), T1))["Ready"]["status"] == "True"
