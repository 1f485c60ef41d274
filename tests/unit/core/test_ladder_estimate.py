"""The plan's fit/skip uses the one estimate (memory_estimate.estimate_tier), engine settings included.

The ladder once re-implemented the estimate without ``engine.maxNumSeqs`` and
``--max-num-batched-tokens`` in ``engine.extraArgs``: both size vLLM's activation buffers,
so the plan has to change with them, and agree with ``kneepoint estimate``.
"""

from ladder_driver import H200, Driver, make_spec

from kneepoint.core.architectures import get_preset
from kneepoint.core.memory_estimate import estimate_ladder


def plan(**over):
    d = Driver(make_spec("llama-3-70b", tiers={"tensorParallel": [2, 4, 8]}, **over))
    d.step()
    return {t.name: t for t in d.status.tiers}, d.spec


def test_max_num_batched_tokens_in_extra_args_changes_the_plan():
    default, _ = plan()
    assert default["tp2-pp1"].phase == "Pending"
    huge, _ = plan(engine={"extraArgs": ["--max-num-batched-tokens=1048576"]})
    tp2 = huge["tp2-pp1"]
    assert tp2.phase == "Skipped" and tp2.does_not_fit and "does not fit" in tp2.reason
    assert tp2.estimated_memory_gi_b > default["tp2-pp1"].estimated_memory_gi_b
    split, _ = plan(engine={"extraArgs": ["--max-num-batched-tokens", "1048576"]})
    assert split["tp2-pp1"].estimated_memory_gi_b == tp2.estimated_memory_gi_b


def test_engine_max_num_seqs_changes_the_plan():
    default, _ = plan()
    more, _ = plan(engine={"maxNumSeqs": 1024})
    assert more["tp2-pp1"].estimated_memory_gi_b > default["tp2-pp1"].estimated_memory_gi_b


def test_plan_estimates_are_estimate_ladders():
    tiers, spec = plan(engine={"maxNumSeqs": 512, "extraArgs": ["--max-num-batched-tokens=65536"]})
    for est in estimate_ladder(spec, get_preset("llama-3-70b"), H200):
        assert tiers[est.tier.name].estimated_memory_gi_b == round(est.needed_bytes_per_gpu / 1024**3, 2)
