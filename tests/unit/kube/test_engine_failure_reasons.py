"""Why an engine could not start reaches the tier's reason, on a real kubelet too.

vLLM writes no termination message. With the default policy (File) a failed engine's
``state.terminated`` says only ``reason: Error`` (the kernel's OOM killer is not involved
when vLLM refuses to start), so an out-of-memory start would read as an ordinary failure
and a crash loop would show the kubelet's back-off line instead of the engine's error.
The engine container therefore asks for ``FallbackToLogsOnError``: the kubelet puts the
log tail there. The fault suite found this (tests/integration/test_faults_tiers.py).
"""

from __future__ import annotations

from typing import Any

from kneepoint.core.observations import START_CRASH_LOOP, START_OUT_OF_MEMORY
from kneepoint.core.spec import parse_spec
from kneepoint.core.tiers import Tier
from kneepoint.kube import manifests, pod_status

OWNER = manifests.Owner("llama8b", "team-a", "uid-1")
CTX = manifests.BuildContext(architecture_json="llama-3-8b", gpu_product="NVIDIA-H200")
SPEC = parse_spec({"model": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct", "architecture": {"preset": "llama-3-8b"}}})


def test_engine_container_falls_back_to_its_log_tail_on_error() -> None:
    for mode_spec in (SPEC, parse_spec({"mode": "Simulate", "model": {"uri": "sim://llama-3-8b"}})):
        deployment = manifests.build_engine_deployment(mode_spec, OWNER, Tier(2, 1), CTX)
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def _pod(terminated: dict[str, Any], waiting: dict[str, Any] | None = None, restarts: int = 0) -> dict[str, Any]:
    state = {"waiting": waiting} if waiting else {"terminated": terminated}
    return {
        "metadata": {"name": "llama8b-tp1-pp1-x"},
        "spec": {"nodeName": "h200-0"},
        "status": {
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [
                {"name": "engine", "restartCount": restarts, "state": state, "lastState": {"terminated": terminated} if waiting else {}}
            ],
        },
    }


def test_out_of_memory_is_read_from_the_log_tail_when_the_kubelet_says_error() -> None:
    line = "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing the engine."
    state = pod_status.engine_state({"metadata": {}}, [_pod({"exitCode": 1, "reason": "Error", "message": f"INFO loading\n{line}\n"})])
    assert state.start_failure == START_OUT_OF_MEMORY
    assert line in (state.failure_message or "")


def test_crash_loop_message_is_the_engines_last_words() -> None:
    words = "kneepoint sim: --block-size: must be one of 1, 8, 16, 32, 64, 128; got 7"
    pod = _pod({"exitCode": 2, "reason": "Error", "message": words}, waiting={"reason": "CrashLoopBackOff", "message": "back-off 20s"}, restarts=3)
    state = pod_status.engine_state({"metadata": {}}, [pod])
    assert state.start_failure == START_CRASH_LOOP and state.restarts == 3
    assert state.failure_message == words
