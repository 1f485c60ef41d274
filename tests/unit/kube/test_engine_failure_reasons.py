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
from kneepoint.kube import fleet, manifests, pod_status

OWNER = manifests.Owner("llama8b", "team-a", "uid-1")
CTX = manifests.BuildContext(architecture_json="llama-3-8b", gpu_product="NVIDIA-H200")
SPEC = parse_spec({"model": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct", "architecture": {"preset": "llama-3-8b"}}})


def test_engine_container_falls_back_to_its_log_tail_on_error() -> None:
    for mode_spec in (SPEC, parse_spec({"mode": "Simulate", "model": {"uri": "sim://llama-3-8b"}})):
        deployment = manifests.build_engine_deployment(mode_spec, OWNER, Tier(2, 1), CTX)
        container = deployment["spec"]["template"]["spec"]["containers"][0]
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
    pod = _pod(
        {"exitCode": 2, "reason": "Error", "message": words}, waiting={"reason": "CrashLoopBackOff", "message": "back-off 20s"}, restarts=3
    )
    state = pod_status.engine_state({"metadata": {}}, [pod])
    assert state.start_failure == START_CRASH_LOOP and state.restarts == 3
    assert state.failure_message == words


# --- placement no node can ever satisfy: the plan fails naming the field -------------------


def _node(name: str, product: str = "NVIDIA-H200", resources: dict[str, str] | None = None, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product, **labels}},
        "spec": {},
        "status": {"allocatable": resources or {"nvidia.com/gpu": "8", "cpu": "192"}, "conditions": [{"type": "Ready", "status": "True"}]},
    }


FLEET = [_node("h200-0"), _node("h200-1", zone="b"), _node("l40s-0", "NVIDIA-L40S", {"nvidia.com/gpu": "4"})]


def test_placement_that_fits_a_node_is_no_problem() -> None:
    assert fleet.placement_problem(FLEET, "nvidia.com/gpu", "NVIDIA-H200", {}) is None
    assert fleet.placement_problem(FLEET, "nvidia.com/gpu", None, {"zone": "b"}) is None


def test_gpu_resource_no_node_offers_names_the_field_and_what_nodes_offer() -> None:
    message = fleet.placement_problem(FLEET, "example.com/gpu", "NVIDIA-H200", {})
    assert message == "spec.placement.gpuResource: no Ready node offers example.com/gpu (extended resources on the nodes: nvidia.com/gpu)"


def test_node_selector_matching_nothing_names_the_field() -> None:
    message = fleet.placement_problem(FLEET, "nvidia.com/gpu", "NVIDIA-H200", {"zone": "z"})
    assert message and message.startswith("spec.placement.nodeSelector: zone=z matches none of the 3 node(s)")


def test_gpu_product_not_in_the_fleet_names_the_field_and_the_products_there() -> None:
    message = fleet.placement_problem(FLEET, "nvidia.com/gpu", "NVIDIA-A100-SXM4-80GB", {})
    assert message == (
        "spec.placement.gpuProduct: no node offering nvidia.com/gpu is labelled NVIDIA-A100-SXM4-80GB "
        "(products in the fleet: NVIDIA-H200, NVIDIA-L40S)"
    )


def test_not_ready_and_cordoned_nodes_do_not_count() -> None:
    down = _node("h200-9")
    down["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    cordoned = _node("h200-8")
    cordoned["spec"]["unschedulable"] = True
    assert (
        fleet.placement_problem([down, cordoned], "nvidia.com/gpu", None, {})
        == "spec.placement.gpuResource: no Ready node offers nvidia.com/gpu"
    )
