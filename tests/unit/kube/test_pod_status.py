"""Table tests: pods, Jobs and nodes as the API serves them -> what the ladder observes."""

import json

import pytest

from kneepoint.core import observations as obs
from kneepoint.core import placement
from kneepoint.kube import fleet, load_test_result, pod_status


def pod(conditions=(), statuses=(), node="h200-0", deleting=False):
    meta = {"name": "p"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {"nodeName": node},
        "status": {"conditions": list(conditions), "containerStatuses": list(statuses)},
    }


DEPLOYMENT = {"metadata": {"name": "d"}}
READY = {"type": "Ready", "status": "True"}
UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
}


@pytest.mark.parametrize(
    "pods, expected",
    [
        ([pod([READY])], (True, None)),
        ([pod([UNSCHEDULABLE], node=None)], (False, obs.START_UNSCHEDULABLE)),
        (
            [
                pod(
                    statuses=[
                        {
                            "name": "engine",
                            "restartCount": 2,
                            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                            "lastState": {
                                "terminated": {
                                    "reason": "Error",
                                    "message": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                                }
                            },
                        }
                    ]
                )
            ],
            (False, obs.START_OUT_OF_MEMORY),
        ),
        (
            [
                pod(
                    statuses=[
                        {
                            "name": "engine",
                            "restartCount": 4,
                            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
                            "lastState": {"terminated": {"reason": "Error", "message": "ValueError: bad flag"}},
                        }
                    ]
                )
            ],
            (False, obs.START_CRASH_LOOP),
        ),
        (
            [pod(statuses=[{"name": "engine", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "not found"}}}])],
            (False, obs.START_IMAGE_PULL),
        ),
        (
            [
                pod(
                    statuses=[
                        {
                            "name": "engine",
                            "state": {"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "hf" not found'}},
                        }
                    ]
                )
            ],
            (False, obs.START_CONFIG_ERROR),
        ),
        ([pod(statuses=[{"name": "engine", "state": {"terminated": {"reason": "OOMKilled"}}}])], (False, obs.START_OUT_OF_MEMORY)),
        ([pod([READY], deleting=True)], (False, None)),
        ([], (False, None)),
    ],
)
def test_engine_state(pods, expected):
    state = pod_status.engine_state(DEPLOYMENT, pods)
    assert state.exists
    assert (state.ready, state.start_failure) == expected


def test_engine_state_without_deployment():
    assert pod_status.engine_state(None, []).exists is False


def test_crash_loop_counts_restarts():
    p = pod(
        statuses=[
            {
                "name": "engine",
                "restartCount": 4,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"message": "boom"}},
            }
        ]
    )
    state = pod_status.engine_state(DEPLOYMENT, [p])
    assert state.restarts == 4 and state.failure_message == "boom"


@pytest.mark.parametrize(
    "conditions, expected",
    [
        ([{"type": "Complete", "status": "True"}], (True, False)),
        (
            [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "message": "Job has reached the specified backoff limit",
                }
            ],
            (False, True),
        ),
        ([{"type": "Failed", "status": "False"}], (False, False)),
        ([], (False, False)),
    ],
)
def test_job_outcome(conditions, expected):
    succeeded, failed, message = load_test_result.job_outcome({"status": {"conditions": conditions}})
    assert (succeeded, failed) == expected
    if failed:
        assert "BackoffLimitExceeded" in message


def test_termination_message_takes_latest_and_parses_summary():
    summary = {"v": 1, "ok": True, "outputTokensPerSecond": 1234.5}
    pods = [
        {
            "status": {
                "containerStatuses": [
                    {"name": "loadgen", "state": {"terminated": {"finishedAt": "2026-01-01T00:00:01Z", "message": "old"}}}
                ]
            }
        },
        {
            "status": {
                "containerStatuses": [
                    {"name": "loadgen", "state": {"terminated": {"finishedAt": "2026-01-01T00:00:09Z", "message": json.dumps(summary)}}}
                ]
            }
        },
    ]
    message = load_test_result.termination_message(pods, "loadgen")
    assert load_test_result.parse_summary(message) == summary
    assert load_test_result.parse_summary("not json") is None
    assert load_test_result.parse_summary(json.dumps({"v": 2})) is None


def node(name, product, gpus, domain_size, ready=True, extra=None):
    labels = {"nvidia.com/gpu.product": product, "kneepoint.io/nvlink-domain-size": str(domain_size)}
    labels.update(extra or {})
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def gpu_pod(node_name, gpus, phase="Running"):
    return {
        "spec": {"nodeName": node_name, "containers": [{"resources": {"requests": {"nvidia.com/gpu": str(gpus)}}}]},
        "status": {"phase": phase},
    }


def test_fleet_view_counts_free_gpus_and_filters():
    nodes = [
        node("h200-0", "NVIDIA-H200", 8, 8),
        node("h200-1", "NVIDIA-H200", 8, 8),
        node("l40s-0", "NVIDIA-L40S", 4, 1),
        node("h200-down", "NVIDIA-H200", 8, 8, ready=False),
    ]
    pods = [gpu_pod("h200-0", 4), gpu_pod("h200-0", 2), gpu_pod("h200-1", 8, phase="Succeeded")]
    view = fleet.fleet_view(nodes, pods, "nvidia.com/gpu", "NVIDIA-H200", {}, reserved={"h200-1": 1})
    free = {d.node_name: d.gpus_free for d in view.domains}
    assert free == {"h200-0": 2, "h200-1": 7}
    assert view.has_nvlink()
    assert placement.free_now(view, 2, True).node_name == "h200-0"  # tightest fit first
    assert placement.free_now(view, 8, True) is None
    assert placement.can_ever_hold(view, 8, True) and not placement.can_ever_hold(view, 16, True)
    pcie = fleet.fleet_view(nodes, pods, "nvidia.com/gpu", "NVIDIA-L40S", {}, None)
    assert not pcie.has_nvlink() and pcie.domains[0].interconnect == "pcie"
    assert placement.can_ever_hold(pcie, 4, require_nvlink=False)
    assert not placement.can_ever_hold(pcie, 4, require_nvlink=True)
