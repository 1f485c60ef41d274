"""The runner and a multi-node group: the operator's LeaderWorkerSet pods, as LWS's webhook
leaves them, become one simulator (the leader, modelling PP over the inter-node link) and
pretend workers that only report Ready."""

from __future__ import annotations

import copy
from typing import Any

from kneepoint.core.spec import parse_spec
from kneepoint.core.tiers import Tier
from kneepoint.kube import manifests
from kneepoint.sandbox.runner.plans import ENGINE, PRETEND, EnvSources, classify_container, plan_container

NODE = {
    "metadata": {
        "name": "h100-1",
        "labels": {
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "kneepoint.io/interconnect": "nvlink",
            "kneepoint.io/nvlink-domain-size": "8",
            "kneepoint.io/inter-node-gbps": "400",
        },
    },
    "status": {"allocatable": {"nvidia.com/gpu": "8"}},
}
SPEC = parse_spec(
    {
        "model": {"uri": "hf://meta-llama/Llama-3.1-405B-Instruct", "architecture": {"preset": "llama-3.1-405b"}},
        "tiers": {"tensorParallel": [8], "pipelineParallel": [1, 2]},
        "placement": {"gpuProduct": "NVIDIA-H100-80GB-HBM3"},
    }
)
LWS = manifests.build_engine_leader_worker_set(
    SPEC, manifests.Owner("big", "ns1", "u"), Tier(8, 2), manifests.BuildContext(gpu_product="NVIDIA-H100-80GB-HBM3")
)


def admitted(template: dict[str, Any], name: str, worker_index: str) -> dict[str, Any]:
    """The pod as LWS's pod webhook admits it: the LWS_* variables first in every container's env."""
    pod = {"metadata": {**copy.deepcopy(template["metadata"]), "name": name, "namespace": "ns1"}, "spec": copy.deepcopy(template["spec"])}
    pod["spec"]["nodeName"] = "h100-1"
    lws_env = [
        {"name": "LWS_LEADER_ADDRESS", "value": "big-tp8-pp2-0.big-tp8-pp2-0.ns1"},
        {"name": "LWS_GROUP_SIZE", "value": "2"},
        {"name": "LWS_WORKER_INDEX", "value": worker_index},
    ]
    for container in pod["spec"]["containers"]:
        container["env"] = lws_env + container.get("env", [])
    return pod


def plan(pod: dict[str, Any]):
    container = pod["spec"]["containers"][0]
    return plan_container(
        pod,
        container,
        python="/venv/bin/python",
        pod_ip="127.2.0.9",
        host_ip="127.0.0.1",
        node=NODE,
        sources=EnvSources(),
        runtime_env={},
        forced_env={},
    )


def flag(argv, name):
    return argv[list(argv).index(name) + 1]


def test_leader_runs_one_simulator_for_the_group_over_the_inter_node_link():
    leader = admitted(LWS["spec"]["leaderWorkerTemplate"]["leaderTemplate"], "big-tp8-pp2-0", "0")
    result = plan(leader)
    assert result.kind == ENGINE and result.listen == ("127.2.0.9", 8000)
    assert list(result.argv[1:4]) == ["-m", "kneepoint", "sim"]
    assert (flag(result.argv, "--tensor-parallel-size"), flag(result.argv, "--pipeline-parallel-size")) == ("8", "2")
    assert flag(result.argv, "--master-addr") == "big-tp8-pp2-0.big-tp8-pp2-0.ns1"  # $(LWS_LEADER_ADDRESS) expanded
    assert result.env["KNEEPOINT_SIM_INTER_NODE_GBPS"] == "400"
    assert result.env["KNEEPOINT_SIM_GPU"] == "NVIDIA-H100-80GB-HBM3"


def test_headless_workers_only_report_ready():
    worker = admitted(LWS["spec"]["leaderWorkerTemplate"]["workerTemplate"], "big-tp8-pp2-0-1", "1")
    container = worker["spec"]["containers"][0]
    assert classify_container(container) == PRETEND
    result = plan(worker)
    assert result.kind == PRETEND and result.argv == () and result.listen is None


def test_single_node_pipeline_parallel_keeps_its_stages_on_the_node():
    deployment = manifests.build_engine_deployment(SPEC, manifests.Owner("big", "ns1", "u"), Tier(4, 2), manifests.BuildContext())
    template = deployment["spec"]["template"]
    pod = {
        "metadata": {**template["metadata"], "name": "big-tp4-pp2-x", "namespace": "ns1"},
        "spec": {**template["spec"], "nodeName": "h100-1"},
    }
    result = plan(pod)
    assert result.kind == ENGINE and "KNEEPOINT_SIM_INTER_NODE_GBPS" not in result.env
