"""Multi-node tiers end to end: a model that needs two nodes, profiled as a LeaderWorkerSet.

A second sandbox of its own (module fixture: own state dir, free ports, own pod range) runs
the fleet ``deploy/sandbox/fleet-h100-multinode.yaml`` (two 8x H100 80 GB nodes joined by
400 Gb/s) with LeaderWorkerSet, and an operator process against it. The model is a
405B-class preset in bf16 (about 756 GiB of weights):

- every single-node tier (TP1..TP8) is skipped by the estimate without deploying;
- TP8 x PP2 runs as a LeaderWorkerSet group of two 8-GPU pods on the two nodes (the
  leader's simulator models PP over the inter-node link, the worker reports Ready), is
  load-tested, measured and decided; the recommendation says why it is no InferenceService (hf:// across nodes) and holds the LeaderWorkerSet;
- with the second node tainted, the group is placed only in part (leader running, worker
  Pending): the tier times out and is recorded Unschedulable with "placed 1 of 2 pods".

The sandbox is torn down (state dir purged) at the end of the module.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import OperatorProcess, SandboxHandle, wait_for
from kubernetes import client

from kneepoint.core.record_table import format_record_table
from kneepoint.core.status import ExperimentStatus
from kneepoint.kube import naming
from kneepoint.sandbox import binaries, controlplane

ROOT = Path(__file__).resolve().parents[2]
FLEET = ROOT / "deploy" / "sandbox" / "fleet-h100-multinode.yaml"
PRODUCT = "NVIDIA-H100-80GB-HBM3"
POD_CIDR = "127.43.0.0/16"  # the runner's pod addresses, apart from the default sandbox's 127.2.0.0/16
TAINT = {"key": "kneepoint.io/reserved", "value": "other-team", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def multinode_sandbox(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxHandle]:
    state = Path(os.environ.get("KNEEPOINT_MULTINODE_SANDBOX_DIR") or tmp_path_factory.mktemp("multinode") / "state")
    offset = controlplane.free_port_offset(
        start=11000
    )  # ports 13379-21259: below the ephemeral range, apart from the other tests' second sandbox
    saved = os.environ.get("KNEEPOINT_SANDBOX_POD_CIDR")
    os.environ["KNEEPOINT_SANDBOX_POD_CIDR"] = POD_CIDR  # inherited by the runner this `up` starts
    started = time.monotonic()
    try:
        handle = controlplane.up(state, FLEET, offset, say=lambda line: print(line, flush=True), with_lws=True)
    except controlplane.SandboxError:
        controlplane.down(state, purge=True)
        raise
    finally:
        if saved is None:
            os.environ.pop("KNEEPOINT_SANDBOX_POD_CIDR", None)
        else:
            os.environ["KNEEPOINT_SANDBOX_POD_CIDR"] = saved
    print(f"[multinode] sandbox with LWS up in {time.monotonic() - started:.1f}s at port offset {offset}", flush=True)
    found = binaries.find_all()
    assert found is not None
    try:
        yield SandboxHandle(handle, found.kubectl)
    finally:
        left = controlplane.down(state, purge=True)
        assert not left, f"processes left after down: {left}"


@pytest.fixture(scope="module")
def multinode_operator(multinode_sandbox: SandboxHandle, tmp_path_factory: pytest.TempPathFactory) -> Iterator[OperatorProcess]:
    op = OperatorProcess(multinode_sandbox, tmp_path_factory.mktemp("multinode-operator"))
    op.start()
    try:
        yield op
    finally:
        op.stop()


@pytest.fixture
def mn_namespace(multinode_sandbox: SandboxHandle) -> Iterator[str]:
    name = f"mn-{uuid.uuid4().hex[:8]}"
    multinode_sandbox.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        multinode_sandbox.kubectl("delete", "namespace", name, "--wait=false", check=False)


def experiment(name: str, namespace: str, tp: list[int], timeout: int = 300) -> dict[str, Any]:
    return {
        "apiVersion": naming.API_VERSION,
        "kind": naming.KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "model": {"uri": "hf://meta-llama/Llama-3.1-405B-Instruct", "architecture": {"preset": "llama-3.1-405b"}, "maxModelLen": 2048},
            "tiers": {"tensorParallel": tp, "pipelineParallel": [1, 2]},
            "load": {"concurrency": 8, "numRequests": 48, "inputLen": 256, "outputLen": 32, "warmupRequests": 4, "repeats": 1},
            "placement": {"gpuProduct": PRODUCT, "multiNodeTopologyKey": "topology.kubernetes.io/zone"},
            "budget": {"tierTimeoutSeconds": timeout, "loadTestTimeoutSeconds": 300},
        },
    }


class Api:
    """The few API reads and writes these tests make, as the sandbox's admin."""

    def __init__(self, handle: SandboxHandle):
        self.client = handle.api_client()
        self.core = client.CoreV1Api(self.client)
        self.custom = client.CustomObjectsApi(self.client)

    def create(self, body: dict[str, Any]) -> None:
        ns = body["metadata"]["namespace"]
        self.custom.create_namespaced_custom_object(naming.GROUP, naming.VERSION, ns, naming.PLURAL, body)

    def status(self, namespace: str, name: str) -> ExperimentStatus:
        obj = self.custom.get_namespaced_custom_object(naming.GROUP, naming.VERSION, namespace, naming.PLURAL, name)
        return ExperimentStatus.from_dict(obj.get("status"))

    def engine_pods(self, namespace: str) -> list[Any]:
        return self.core.list_namespaced_pod(namespace, label_selector=f"{naming.LABEL_ROLE}=engine").items

    def leader_worker_sets(self, namespace: str) -> list[dict[str, Any]]:
        data = self.custom.list_namespaced_custom_object(naming.LWS_GROUP, naming.LWS_VERSION, namespace, naming.LWS_PLURAL)
        return data.get("items", [])

    def events(self, namespace: str) -> list[Any]:
        return self.core.list_namespaced_event(namespace).items


def _phase(api: Api, namespace: str, name: str, tier: str | None = None) -> str:
    status = api.status(namespace, name)
    if tier is None:
        return status.phase
    result = status.tier(tier)
    return result.phase if result else ""


def test_405b_skips_single_node_tiers_and_profiles_tp8_pp2_as_a_leader_worker_set(
    multinode_sandbox: SandboxHandle, multinode_operator: OperatorProcess, mn_namespace: str
) -> None:
    api = Api(multinode_sandbox)
    started = time.monotonic()
    api.create(experiment("big", mn_namespace, [1, 2, 4, 8]))

    # While the group is load-tested: one LeaderWorkerSet, two pods on two nodes, both Ready.
    wait_for(
        lambda: _phase(api, mn_namespace, "big", "tp8-pp2") in ("LoadTesting", "Collecting", "Measured"),
        240,
        what="tp8-pp2 to reach LoadTesting",
    )
    (lws,) = api.leader_worker_sets(mn_namespace)
    assert lws["metadata"]["name"] == "big-tp8-pp2" and lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert lws["metadata"]["annotations"][naming.LWS_EXCLUSIVE_TOPOLOGY] == "topology.kubernetes.io/zone"
    pods = {p.metadata.name: p for p in api.engine_pods(mn_namespace)}
    assert set(pods) == {"big-tp8-pp2-0", "big-tp8-pp2-0-1"}, sorted(pods)
    assert {p.spec.node_name for p in pods.values()} == {"h100-0", "h100-1"}
    for pod in pods.values():
        assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "8"
        assert any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions)
    leader_log = (multinode_sandbox.sandbox.paths.root / "pods" / f"{mn_namespace}_big-tp8-pp2-0_engine.log").read_text()
    assert "TP=8 PP=2" in leader_log
    assert not (multinode_sandbox.sandbox.paths.root / "pods" / f"{mn_namespace}_big-tp8-pp2-0-1_engine.log").exists()  # pretend

    wait_for(lambda: _phase(api, mn_namespace, "big") in ("Decided", "Failed"), 300, interval=2, what="the experiment to finish")
    took = time.monotonic() - started
    status = api.status(mn_namespace, "big")
    print(format_record_table(status.tiers))
    print(f"[multinode] 405B experiment decided in {took:.1f}s", flush=True)
    assert status.phase == "Decided", status.message
    for name in ("tp1-pp1", "tp2-pp1", "tp4-pp1", "tp8-pp1"):
        tier = status.tier(name)
        assert tier.phase == "Skipped" and tier.does_not_fit and tier.started_at is None, tier
    group = status.tier("tp8-pp2")
    assert group.phase == "Measured" and group.multi_node is True and group.nodes == 2 and group.gpus == 16
    assert group.node_names is not None and sorted(group.node_names) == ["h100-0", "h100-1"]
    assert (group.output_tokens_per_second or 0) > 0 and group.completed_requests == 48
    decision = status.decision
    assert (decision.tensor_parallel, decision.pipeline_parallel, decision.multi_node, decision.nodes) == (8, 2, True, 2)
    assert decision.classification == "does-not-fit"

    cm = api.core.read_namespaced_config_map(status.recommendation.config_map_name, mn_namespace)
    # hf:// weights across nodes: KServe's webhook accepts only pvc:// or oci:// for multi-node,
    # so the operator says why and publishes the LeaderWorkerSet instead.
    assert "inferenceservice.yaml" not in cm.data
    assert "accepts only pvc:// or oci:// storage" in (status.recommendation.not_exportable or "")
    lws = yaml.safe_load(cm.data["leaderworkerset.yaml"])
    assert lws["kind"] == "LeaderWorkerSet" and lws["spec"]["leaderWorkerTemplate"]["size"] == 2

    # cleanup.winner Delete: the group and its pods go away with the decision.
    wait_for(lambda: not api.leader_worker_sets(mn_namespace) and not api.engine_pods(mn_namespace), 60, what="the group's teardown")


def test_partly_scheduled_group_times_out_as_unschedulable_with_pods_placed(
    multinode_sandbox: SandboxHandle, multinode_operator: OperatorProcess, mn_namespace: str
) -> None:
    api = Api(multinode_sandbox)
    # Another team reserves h100-1: the operator's GPU count still sees two free nodes (it does
    # not read taints), the scheduler places the leader on h100-0 and cannot place the worker.
    node = api.core.read_node("h100-1")
    api.core.patch_node("h100-1", {"spec": {"taints": [*(node.spec.taints or []), TAINT]}})
    try:
        api.create(experiment("partial", mn_namespace, [8], timeout=20))
        wait_for(
            lambda: _phase(api, mn_namespace, "partial") in ("Decided", "Failed"), 180, interval=2, what="the partial group to time out"
        )
        status = api.status(mn_namespace, "partial")
        group = status.tier("tp8-pp2")
        print(f"[multinode] partial group: {group.reason}", flush=True)
        assert group.phase == "Failed" and group.pods_placed == 1 and group.node_names == ("h100-0",)
        assert "not Ready within 20 s (Unschedulable: placed 1 of 2 pods" in group.reason
        assert "untolerated taint" in group.reason
        assert status.phase == "Failed" and status.decision is None
        reasons_seen = {e.reason for e in api.events(mn_namespace)}
        assert "TierUnschedulable" in reasons_seen
        wait_for(lambda: not api.leader_worker_sets(mn_namespace), 60, what="the failed group's teardown")
    finally:
        node = api.core.read_node("h100-1")
        kept = [t for t in (node.spec.taints or []) if t.key != TAINT["key"]]
        api.core.patch_node("h100-1", {"spec": {"taints": kept or None}})
