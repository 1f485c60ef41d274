"""Multi-node tiers in the ladder: PP across nodes only when TP alone cannot hold the model.

A 405B-class model in bf16 (about 756 GiB of weights) on 8x H100 80 GB nodes: no single-node
tier fits, TP8 x PP2 does and runs as a group of two 8-GPU pods. Driven pass by pass with
hand-made observations, like tests/unit/core/test_ladder.py.
"""

from __future__ import annotations

from dataclasses import replace

import ladder_driver

from kneepoint.core import reasons
from kneepoint.core.actions import EnsureEngine, EnsureLoadTest
from kneepoint.core.gpus import get_gpu_type
from kneepoint.core.observations import (
    START_UNSCHEDULABLE,
    DomainCapacity,
    EngineState,
    FleetView,
    LoadTestState,
    MetricWindow,
)
from kneepoint.core.record_table import format_decision, format_record_table
from kneepoint.core.spec import parse_spec
from kneepoint.core.tiers import Tier
from kneepoint.core.timestamps import rfc3339

H100 = get_gpu_type("h100-sxm")
H200 = get_gpu_type("h200")
T0 = ladder_driver.T0
PRODUCT = "NVIDIA-H100-80GB-HBM3"


def fleet(free=(8, 8), racks=None, product=PRODUCT, total=8):
    return FleetView(
        tuple(
            DomainCapacity(f"h100-{i}", product, total, f, f"h100-{i}-nvl0", total, "nvlink", racks[i] if racks else None)
            for i, f in enumerate(free)
        )
    )


def spec(preset="llama-3.1-405b", tp=(1, 2, 4, 8), pp=(1, 2), **over):
    doc = {
        "model": {"uri": "hf://meta-llama/Llama-3.1-405B-Instruct", "architecture": {"preset": preset}},
        "tiers": {"tensorParallel": list(tp), "pipelineParallel": list(pp)},
        "load": {"concurrency": 32, "numRequests": 200, "inputLen": 1024, "outputLen": 256},
        "placement": {"gpuProduct": PRODUCT},
        "budget": {"tierTimeoutSeconds": 600},
    }
    for key, value in over.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    return parse_spec(doc)


class Driver(ladder_driver.Driver):
    def __init__(self, spec, fleet_view, gpu=H100):
        super().__init__(spec, fleet_view, gpu=gpu)


def test_405b_on_80gb_nodes_skips_every_single_node_tier_and_plans_tp8_pp2_as_multi_node() -> None:
    d = Driver(spec(), fleet())
    d.step()
    tiers = {t.name: t for t in d.status.tiers}
    for name in ("tp1-pp1", "tp2-pp1", "tp4-pp1", "tp8-pp1"):
        assert tiers[name].phase == "Skipped" and tiers[name].does_not_fit, tiers[name]
        assert tiers[name].multi_node is None
    group = tiers["tp8-pp2"]
    assert group.phase == "Pending" and group.multi_node is True and group.nodes == 2 and group.gpus == 16


def test_pp_tiers_stay_single_node_when_they_fit_one_node() -> None:
    # 70B on H200: TP alone holds it, so PP is "not needed" and never marked multi-node.
    d = Driver(
        spec(preset="llama-3-70b", tp=(2, 4, 8), pp=(1, 2), placement={"gpuProduct": "NVIDIA-H200"}), fleet(product="NVIDIA-H200"), gpu=H200
    )
    d.step()
    pp2 = d.status.tier("tp8-pp2")
    assert pp2.phase == "Skipped" and "not needed" in pp2.reason and pp2.multi_node is True
    # A PP tier that fits one node (TP4 x PP2 = 8 GPUs) is a plain single-node tier.
    d = Driver(spec(preset="llama-3.1-405b", tp=(1, 2, 4), pp=(1, 2), model={"dtype": "fp8"}), fleet())
    d.step()
    assert d.status.tier("tp4-pp2").multi_node is False and d.status.tier("tp4-pp2").nodes is None


def test_tensor_parallel_spanning_nodes_is_refused_at_plan_time() -> None:
    d = Driver(spec(tp=(8, 16), pp=(1, 2)), fleet())
    r = d.step()
    tp16pp2 = d.status.tier("tp16-pp2")
    assert tp16pp2.phase == "Skipped"
    assert "tensor parallelism would span nodes" in tp16pp2.reason and "TP16" in tp16pp2.reason and "8" in tp16pp2.reason
    assert not any(isinstance(a, EnsureEngine) for a in r.actions)
    assert any(e.reason == reasons.TIER_SKIPPED_EVENT and "span nodes" in e.message for e in r.events)


def test_a_group_the_fleet_can_never_hold_is_skipped_at_plan_time() -> None:
    d = Driver(spec(), fleet(free=(8,)))
    d.step()
    group = d.status.tier("tp8-pp2")
    assert group.phase == "Skipped" and "needs 2 pods of 8 GPUs" in group.reason and "holds 1 such pod" in group.reason
    # With a topology key the group must fit inside one domain: two racks of one node each cannot.
    d = Driver(spec(placement={"multiNodeTopologyKey": "example.com/rack"}), fleet(racks=("a", "b")))
    d.step()
    assert "in one example.com/rack domain" in d.status.tier("tp8-pp2").reason


def test_multi_node_tier_deploys_as_a_group_and_is_measured_and_decided() -> None:
    d = Driver(spec(), fleet())
    d.step()
    r = d.step()
    ensure = next(a for a in r.actions if isinstance(a, EnsureEngine))
    assert ensure.tier == Tier(8, 2) and ensure.group_size == 2 and ensure.node_names == ("h100-0", "h100-1")
    assert any("LeaderWorkerSet of 2 pods" in e.message for e in r.events)
    d.now += 40
    # Leader Ready, worker still starting: not ready yet.
    r = d.step(engine=EngineState(exists=True, ready=False, node_name="h100-0", pods_total=2, pods_placed=2))
    assert d.status.tier("tp8-pp2").phase == "Deploying"
    r = d.step(
        engine=EngineState(exists=True, ready=True, node_name="h100-0", pods_total=2, pods_placed=2, node_names=("h100-0", "h100-1"))
    )
    assert any(isinstance(a, EnsureLoadTest) for a in r.actions)
    assert d.status.tier("tp8-pp2").node_names == ("h100-0", "h100-1")
    d.now += 70
    load = {
        "v": 1,
        "ok": True,
        "outputTokensPerSecond": 900.0,
        "latencyP99Ms": 9000.0,
        "ttftP95Ms": 800.0,
        "errorFraction": 0.0,
        "completed": 200,
        "startedAt": rfc3339(d.now - 65),
        "finishedAt": rfc3339(d.now - 5),
        "durationSeconds": 60.0,
    }
    d.step(engine=EngineState(exists=True, ready=True), load_test=LoadTestState(1, True, True, False, load))
    d.now += 20
    r = d.step(metrics=MetricWindow(peak_fb_used_gib=70.0, peak_kv_cache_usage=0.05, preemptions=0, gpu_utilization=0.8))
    assert d.status.phase == "Decided"
    decision = d.status.decision
    assert (decision.tensor_parallel, decision.pipeline_parallel, decision.multi_node, decision.nodes) == (8, 2, True, 2)
    assert "16 (2 nodes)" in format_record_table(d.status.tiers)
    assert "one replica spans 2 nodes" in format_decision(decision)


def test_group_waits_for_two_nodes_with_free_gpus_then_deploys() -> None:
    d = Driver(spec(), fleet(free=(8, 4)))
    d.step()
    r = d.step()
    tier = d.status.tier("tp8-pp2")
    assert tier.phase == "Waiting" and "2 nodes with 8 free" in tier.reason and "pods that would fit now: 1" in tier.reason
    assert not any(isinstance(a, EnsureEngine) for a in r.actions)
    d.fleet = fleet(free=(8, 8))
    r = d.step(queue_position=1)
    assert any(isinstance(a, EnsureEngine) and a.group_size == 2 for a in r.actions)


def test_group_inside_one_topology_domain() -> None:
    view = fleet(free=(8, 8, 8), racks=("a", "b", "b"))
    d = Driver(spec(placement={"multiNodeTopologyKey": "example.com/rack"}), view)
    d.step()
    r = d.step()
    ensure = next(a for a in r.actions if isinstance(a, EnsureEngine))
    assert ensure.node_names == ("h100-1", "h100-2")


def test_partly_scheduled_group_times_out_as_unschedulable_with_pods_placed() -> None:
    d = Driver(spec(budget={"tierTimeoutSeconds": 30}), fleet())
    d.step()
    d.step()
    partial = EngineState(
        exists=True,
        ready=False,
        node_name="h100-0",
        start_failure=START_UNSCHEDULABLE,
        failure_message="placed 1 of 2 pods; pod x-tp8-pp2-0-1: 0/2 nodes are available: 1 Insufficient nvidia.com/gpu",
        pods_total=2,
        pods_placed=1,
        node_names=("h100-0",),
    )
    d.now += 10
    d.step(engine=partial)
    assert d.status.tier("tp8-pp2").phase == "Deploying"
    d.now += 25
    r = d.step(engine=partial)
    tier = d.status.tier("tp8-pp2")
    assert tier.phase == "Failed" and tier.pods_placed == 1 and tier.node_names == ("h100-0",)
    assert "Unschedulable: placed 1 of 2 pods" in tier.reason and "not Ready within 30 s" in tier.reason
    assert any(e.reason == reasons.TIER_UNSCHEDULABLE for e in r.events)
    assert d.status.phase == "Failed"  # the only runnable tier failed: no decision


def test_cluster_without_leader_worker_set_fails_the_tier_with_the_reason() -> None:
    d = Driver(spec(), fleet())
    d.step()
    d.step(leader_worker_set_api=False)
    tier = d.status.tier("tp8-pp2")
    assert tier.phase == "Failed" and "does not serve leaderworkerset.x-k8s.io/v1" in tier.reason


def test_simulate_mode_keeps_one_simulator_for_a_multi_node_tier() -> None:
    d = Driver(spec(mode="Simulate", model={"uri": "sim://llama-405b"}), fleet())
    d.step()
    r = d.step()
    ensure = next(a for a in r.actions if isinstance(a, EnsureEngine))
    assert ensure.group_size == 1 and d.status.tier("tp8-pp2").multi_node is True


def test_keep_winner_re_ensures_the_group() -> None:
    d = Driver(spec(cleanup={"winner": "Keep"}), fleet())
    d.step()
    tier = replace(
        d.status.tier("tp8-pp2"),
        phase="Collecting",
        load_test_finished_at=rfc3339(T0 - 60),
        started_at=rfc3339(T0 - 200),
        output_tokens_per_second=900.0,
        latency_p99_ms=9000.0,
    )
    d.status = d.status.with_tier(tier)
    r = d.step(metrics=MetricWindow(peak_kv_cache_usage=0.05))
    ensure = [a for a in r.actions if isinstance(a, EnsureEngine)]
    assert ensure and ensure[0].group_size == 2
