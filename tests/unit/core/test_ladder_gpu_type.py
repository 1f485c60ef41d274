"""The GPU type in every pass: an experiment placed by placement.nodeSelector alone decides exactly as the same
experiment placed by placement.gpuProduct, for every rule (the drivers of test_ladder.py, playing the reconciler).

Before the GPU product was recorded at placement, the pass that collected a tier's metrics had no GPU type under
nodeSelector: no needed-memory figure (M1=n/a), and an 8B model that fits one H200 was decided at TP4 (last-tier).
"""

from dataclasses import replace

import pytest
from ladder_driver import Driver, make_spec


class PoolDriver(Driver):
    """A driver whose metrics windows carry the engine's KV pool (vllm:cache_config_info) when ``pool_tokens`` is set."""

    pool_tokens = None

    def step(self, **obs):
        if obs.get("metrics") is not None and self.pool_tokens:
            obs["metrics"] = replace(obs["metrics"], kv_cache_pool_tokens=self.pool_tokens)
        return super().step(**obs)


class NodeSelectorDriver(PoolDriver):
    """Plays the reconciler for an experiment without placement.gpuProduct: the GPU type comes only from the
    fleet, and the fleet is read only while the ladder is planned or a tier is placed or deployed."""

    def step(self, **obs):
        current = next((t for t in self.status.tiers if t.phase not in ("Measured", "Skipped", "Failed")), None)
        if current is not None and current.phase not in ("Pending", "Waiting", "Deploying"):
            obs = {"gpu": None, "fleet": None, **obs}
        return super().step(**obs)


def by_product_and_by_selector(preset, pool_tokens=None):
    by_product = PoolDriver(make_spec(preset))
    by_selector = NodeSelectorDriver(make_spec(preset, placement={"gpuProduct": None, "nodeSelector": {"pool": "h200"}}))
    assert by_selector.spec.placement.gpu_product is None
    for d in (by_product, by_selector):
        d.pool_tokens = pool_tokens
        d.step()  # plan
    return by_product, by_selector


def assert_same_decision(a, b):
    # Everything but the hash of the spec's measurement-defining fields (placement is one of them).
    assert a.status.measured_spec_hash != b.status.measured_spec_hash
    assert replace(a.status, measured_spec_hash=None).to_dict() == replace(b.status, measured_spec_hash=None).to_dict()
    assert [e for r in a.log for e in r.events] == [e for r in b.log for e in r.events]


@pytest.mark.parametrize("pool_tokens", [None, 896_912])
def test_node_selector_placement_decides_memory_headroom_as_gpu_product(pool_tokens):
    a, b = by_product_and_by_selector("llama-3-8b", pool_tokens)
    for d in (a, b):
        d.measure("tp1-pp1", tok_s=3198, p99_ms=2497, kv=0.0648)
    assert_same_decision(a, b)
    tp1 = b.tier("tp1-pp1")
    # The tier's node and GPU product were recorded when it was placed; the needed figure exists.
    assert (tp1.node_name, tp1.gpu_product, tp1.gpu_memory_gi_b) == ("h200-0", "NVIDIA-H200", 139.8)
    assert 24 < tp1.peak_memory_gi_b < 25
    assert tp1.peak_memory_source == ("vllm-cache-config" if pool_tokens else "estimate")
    dec = b.status.decision
    assert (dec.tensor_parallel, dec.rule) == (1, "memory-headroom") and "M1=" in dec.reason and "n/a" not in dec.reason


def test_node_selector_placement_decides_throughput_gain_as_gpu_product():
    a, b = by_product_and_by_selector("llama-3-70b")
    for d in (a, b):
        d.measure("tp2-pp1", tok_s=1236, p99_ms=6800, kv=0.2, comm=0.1)
        d.measure("tp4-pp1", tok_s=1897, p99_ms=4400, kv=0.1, comm=0.17)
        d.measure("tp8-pp1", tok_s=2100, p99_ms=4300, kv=0.05, comm=0.3)
    assert_same_decision(a, b)
    dec = b.status.decision
    assert (dec.tensor_parallel, dec.rule) == (4, "throughput-gain")
    assert all(b.tier(n).peak_memory_gi_b is not None for n in ("tp2-pp1", "tp4-pp1", "tp8-pp1"))


def test_node_selector_placement_decides_p99_degradation_as_gpu_product():
    a, b = by_product_and_by_selector("llama-3-70b")
    for d in (a, b):
        d.measure("tp2-pp1", tok_s=1200, p99_ms=5000, kv=0.2, comm=0.1)
        d.measure("tp4-pp1", tok_s=1500, p99_ms=7000, kv=0.1, comm=0.17)  # ΔT +0.25, ΔP +0.40
    assert_same_decision(a, b)
    assert (b.status.decision.tensor_parallel, b.status.decision.rule) == (2, "p99-degradation")


def test_node_selector_placement_decides_comm_fraction_as_gpu_product():
    a, b = by_product_and_by_selector("llama-3-70b")
    for d in (a, b):
        d.measure("tp2-pp1", tok_s=1200, p99_ms=5000, kv=0.2, comm=0.1)
        d.measure("tp4-pp1", tok_s=1800, p99_ms=4000, kv=0.1, comm=0.45)
    assert_same_decision(a, b)
    assert (b.status.decision.tensor_parallel, b.status.decision.rule) == (2, "comm-fraction")
