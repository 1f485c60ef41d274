"""Multi-node tiers in the Kubernetes adapters: the LeaderWorkerSet builder, the leader's
Service, the KServe recommendation, the group's state from its pods, and fleet topology."""

from __future__ import annotations

import pytest

from kneepoint.core import node_labels, placement
from kneepoint.core import observations as obs
from kneepoint.core.spec import parse_spec
from kneepoint.core.tiers import Tier
from kneepoint.kube import fleet, manifests, naming, pod_status

OWNER = manifests.Owner("big", "team-a", "uid-1")
CTX = manifests.BuildContext(
    operator_image="ghcr.io/kneepoint/kneepoint:test", architecture_json="llama-3.1-405b", gpu_product="NVIDIA-H100-80GB-HBM3"
)


def spec(**placement):
    return parse_spec(
        {
            "model": {"uri": "hf://meta-llama/Llama-3.1-405B-Instruct", "architecture": {"preset": "llama-3.1-405b"}},
            "tiers": {"tensorParallel": [8], "pipelineParallel": [1, 2]},
            "load": {"concurrency": 32},
            "placement": {"gpuProduct": "NVIDIA-H100-80GB-HBM3", **placement},
        }
    )


def flag(args, name):
    return args[args.index(name) + 1]


def test_leader_worker_set_group_of_pp_pods_with_tp_gpus_each():
    lws = manifests.build_engine_leader_worker_set(spec(), OWNER, Tier(8, 2), CTX)
    assert (lws["apiVersion"], lws["kind"]) == ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")
    assert lws["metadata"]["name"] == "big-tp8-pp2" and lws["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert lws["metadata"]["labels"][naming.LABEL_TIER] == "tp8-pp2"
    assert naming.LWS_EXCLUSIVE_TOPOLOGY not in lws["metadata"]["annotations"]
    s = lws["spec"]
    assert s["replicas"] == 1 and s["startupPolicy"] == "LeaderCreated"
    assert s["networkConfig"] == {"subdomainPolicy": "UniquePerReplica"}  # the client Service keeps the LWS's name
    group = s["leaderWorkerTemplate"]
    assert group["size"] == 2 and group["restartPolicy"] == "RecreateGroupOnPodRestart"

    leader, worker = group["leaderTemplate"], group["workerTemplate"]
    assert leader["metadata"]["labels"][naming.LABEL_GROUP_ROLE] == "leader"
    assert worker["metadata"]["labels"][naming.LABEL_GROUP_ROLE] == "worker"
    assert leader["metadata"]["labels"][naming.LABEL_ROLE] == worker["metadata"]["labels"][naming.LABEL_ROLE] == "engine"
    (lc,), (wc,) = leader["spec"]["containers"], worker["spec"]["containers"]
    for c in (lc, wc):
        assert c["name"] == "engine" and c["image"] == "vllm/vllm-openai:v0.33.0"
        assert c["resources"]["limits"] == {"nvidia.com/gpu": "8"}  # TP per pod, not TP x PP
        assert (flag(c["args"], "--tensor-parallel-size"), flag(c["args"], "--pipeline-parallel-size")) == ("8", "2")
        assert flag(c["args"], "--nnodes") == "2" and flag(c["args"], "--distributed-executor-backend") == "mp"
        assert flag(c["args"], "--master-addr") == "$(LWS_LEADER_ADDRESS)"
    assert flag(lc["args"], "--node-rank") == "0" and "--headless" not in lc["args"]
    assert lc["readinessProbe"]["httpGet"]["path"] == "/health" and lc["ports"][0]["name"] == "http"
    assert flag(wc["args"], "--node-rank") == "$(LWS_WORKER_INDEX)" and wc["args"][-1] == "--headless"
    assert "readinessProbe" not in wc and "ports" not in wc
    # Each pod keeps TP inside one NVLink domain of at least TP GPUs.
    for pod in (leader["spec"], worker["spec"]):
        term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
        assert {"key": node_labels.NODE_NVLINK_DOMAIN_SIZE, "operator": "Gt", "values": ["7"]} in term["matchExpressions"]
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def test_topology_key_becomes_the_exclusive_topology_annotation():
    lws = manifests.build_engine_leader_worker_set(
        spec(multiNodeTopologyKey="example.com/rack"), OWNER, Tier(8, 2), CTX, topology_key="example.com/rack"
    )
    assert lws["metadata"]["annotations"][naming.LWS_EXCLUSIVE_TOPOLOGY] == "example.com/rack"


def test_simulate_mode_has_no_group():
    s = parse_spec({"model": {"uri": "sim://x", "architecture": {"preset": "llama-3.1-405b"}}, "mode": "Simulate"})
    with pytest.raises(ValueError, match="Measure mode only"):
        manifests.build_engine_leader_worker_set(s, OWNER, Tier(8, 2), CTX)


def test_leader_only_service_selects_the_leader():
    svc = manifests.build_engine_service(spec(), OWNER, Tier(8, 2), leader_only=True)
    assert svc["metadata"]["name"] == "big-tp8-pp2"
    assert svc["spec"]["selector"][naming.LABEL_GROUP_ROLE] == "leader"
    assert naming.LABEL_GROUP_ROLE not in manifests.build_engine_service(spec(), OWNER, Tier(8, 1))["spec"]["selector"]


READY = {"type": "Ready", "status": "True"}
NOT_READY = {"type": "Ready", "status": "False"}
UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 2 node(s) had untolerated taint.",
}
LWS = {"metadata": {"name": "big-tp8-pp2"}, "spec": {"leaderWorkerTemplate": {"size": 2}}}


def member(name, role, node, conditions, index="0"):
    labels = {naming.LABEL_GROUP_ROLE: role, naming.LWS_WORKER_INDEX: index}
    return {"metadata": {"name": name, "labels": labels}, "spec": {"nodeName": node} if node else {}, "status": {"conditions": conditions}}


def test_group_ready_only_when_every_pod_is():
    leader = member("big-tp8-pp2-0", "leader", "h100-0", [READY])
    worker = member("big-tp8-pp2-0-1", "worker", "h100-1", [NOT_READY], "1")
    state = pod_status.group_state(LWS, [worker, leader])
    assert not state.ready and state.start_failure is None and (state.pods_placed, state.pods_total) == (2, 2)
    worker["status"]["conditions"] = [READY]
    state = pod_status.group_state(LWS, [worker, leader])
    assert state.ready and state.node_name == "h100-0" and state.node_names == ("h100-0", "h100-1")


def test_group_partly_scheduled_reports_pods_placed_and_the_scheduler_message():
    leader = member("big-tp8-pp2-0", "leader", "h100-0", [READY])
    worker = member("big-tp8-pp2-0-1", "worker", None, [UNSCHEDULABLE], "1")
    state = pod_status.group_state(LWS, [leader, worker])
    assert not state.ready and state.start_failure == obs.START_UNSCHEDULABLE
    assert state.failure_message.startswith("placed 1 of 2 pods; pod big-tp8-pp2-0-1: 0/3 nodes are available")
    assert state.pods_placed == 1 and state.node_names == ("h100-0",)


def test_group_not_yet_created_or_missing():
    assert pod_status.group_state(None, []) == obs.EngineState(exists=False)
    leader = member("big-tp8-pp2-0", "leader", "h100-0", [READY])
    state = pod_status.group_state(LWS, [leader])  # worker StatefulSet not created yet
    assert state.exists and not state.ready and state.start_failure is None and state.pods_placed == 1


def test_group_container_failures_read_like_a_deployments():
    leader = member("big-tp8-pp2-0", "leader", "h100-0", [])
    leader["status"]["containerStatuses"] = [
        {
            "name": "engine",
            "restartCount": 1,
            "state": {"terminated": {"reason": "Error", "message": "torch.OutOfMemoryError: CUDA out of memory."}},
        }
    ]
    worker = member("big-tp8-pp2-0-1", "worker", "h100-1", [READY], "1")
    state = pod_status.group_state(LWS, [leader, worker])
    assert state.start_failure == obs.START_OUT_OF_MEMORY and state.restarts == 1


def test_fleet_view_fills_the_topology_domain():
    def node(name, rack):
        labels = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", node_labels.NODE_NVLINK_DOMAIN_SIZE: "8"}
        if rack:
            labels["example.com/rack"] = rack
        return {
            "metadata": {"name": name, "labels": labels},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]},
        }

    view = fleet.fleet_view(
        [node("a", "r1"), node("b", "r1"), node("c", None)], [], "nvidia.com/gpu", None, {}, topology_key="example.com/rack"
    )
    assert [d.topology_domain for d in view.domains] == ["r1", "r1", None]
    assert placement.can_ever_hold_group(view, 8, 2, True, "example.com/rack")
    assert not placement.can_ever_hold_group(view, 8, 3, True, "example.com/rack")  # c has no rack label
    assert placement.can_ever_hold_group(view, 8, 3, True, None)
    assert [d.node_name for d in placement.free_group(view, 8, 2, True, "example.com/rack")] == ["a", "b"]
    assert placement.free_group(view, 4, 4, True, "example.com/rack") is not None  # two pods per node
