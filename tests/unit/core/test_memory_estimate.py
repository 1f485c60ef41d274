"""The memory estimator: against the real H200 measurements, vLLM's rules, and invariants.

The H200 files (tests/data/h200) hold either one run, or several runs keyed ``call1``..``call3``.
Call 1 is used: it is the run the data's README tabulates, the only one with every decode batch
for both shapes (call 2 of the 70B files has only the prefill), and the repeats agree within 1 %.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kneepoint.core.architectures import ModelArchitecture, get_preset, preset_names
from kneepoint.core.gpus import GIB, all_gpu_types, get_gpu_type
from kneepoint.core.memory_estimate import (
    BYTES_PER_PARAM,
    MIB,
    activation_bytes_per_gpu,
    default_max_num_batched_tokens,
    estimate_ladder,
    estimate_memory,
    kv_bytes_per_token_per_gpu,
    needed_memory_bytes,
    overhead_parts,
    pipeline_stage_layers,
    stage_weight_bytes_per_gpu,
    weight_bytes_per_gpu,
)
from kneepoint.core.spec import parse_spec
from kneepoint.core.tiers import Tier

H200_DATA = Path(__file__).resolve().parents[2] / "data" / "h200"
H200 = get_gpu_type("h200")
PRESET_OF = {"8b": "llama-3-8b", "70b": "llama-3-70b"}


@dataclass(frozen=True)
class Point:
    """One measured decode or prefill point on one rank."""

    file: str
    model: str
    tp: int
    p2p: bool
    kind: str
    size: int  # batch (decode) or prompt tokens (prefill)
    tokens_per_sequence: int
    kv_bytes: int
    weights_measured: int
    kv_per_token_measured: int
    peak_allocated: int
    nvml_used: int
    nvml_minus_cuda_total: int
    ranks: int


def _run(path: Path) -> dict:
    data = json.loads(path.read_text())
    return data["calls"]["call1"] if "calls" in data else data


def _points() -> list[Point]:
    points = []
    for path in sorted(H200_DATA.glob("llama*_tp*.json")):
        run = _run(path)
        summary = run["summary"]
        for rank in run["ranks"]:
            for kind, records in (("decode", rank["decode"]), ("prefill", rank.get("prefill", []))):
                for rec in records:
                    mem = rec.get("mem")
                    if not mem:
                        continue  # out of memory: checked separately
                    size = rec["batch"] if kind == "decode" else rec["tokens"]
                    tokens = rec["ctx"] + 1 if kind == "decode" else rec["tokens"]
                    points.append(
                        Point(
                            file=path.name,
                            model=rank["model"],
                            tp=rank["tp"],
                            p2p="nop2p" not in path.name,
                            kind=kind,
                            size=size,
                            tokens_per_sequence=tokens,
                            kv_bytes=rec["kv_cache_bytes_per_gpu"],
                            weights_measured=summary["weight_bytes_per_gpu"],
                            kv_per_token_measured=summary["kv_bytes_per_token_per_gpu"],
                            peak_allocated=mem["torch_max_allocated"],
                            nvml_used=mem["nvml_used"],
                            nvml_minus_cuda_total=mem["nvml_total"] - mem["cuda_total"],
                            ranks=len(run["ranks"]),
                        )
                    )
    return points


POINTS = _points()
DECODE = [p for p in POINTS if p.kind == "decode"]
PREFILL = [p for p in POINTS if p.kind == "prefill"]


def _id(p: Point) -> str:
    return f"{p.file}:{p.kind}{p.size}"


def test_data_covers_the_ladder():
    assert {(p.model, p.tp) for p in DECODE} == {(m, tp) for m in ("8b", "70b") for tp in (1, 2, 4)}
    assert len(DECODE) >= 60 and len(PREFILL) >= 20


@pytest.mark.parametrize("path", sorted(H200_DATA.glob("llama*_tp*.json")), ids=lambda p: p.name)
def test_weights_and_kv_per_token_equal_the_measured_bytes(path):
    summary = _run(path)["summary"]
    arch = get_preset(PRESET_OF[summary["model"]])
    tier = Tier(summary["tp"])
    assert weight_bytes_per_gpu(arch, tier, "bfloat16") == summary["weight_bytes_per_gpu"]
    assert kv_bytes_per_token_per_gpu(arch, tier, "bfloat16") == summary["kv_bytes_per_token_per_gpu"]


@pytest.mark.parametrize("p", DECODE, ids=_id)
def test_weights_plus_kv_within_10_percent_of_allocator_peak(p):
    arch = get_preset(PRESET_OF[p.model])
    tier = Tier(p.tp)
    estimated = (
        weight_bytes_per_gpu(arch, tier, "bfloat16") + kv_bytes_per_token_per_gpu(arch, tier, "bfloat16") * p.size * p.tokens_per_sequence
    )
    assert estimated == p.weights_measured + p.kv_bytes  # the KV cache the run allocated, byte for byte
    assert abs(estimated - p.peak_allocated) / p.peak_allocated <= 0.10


@pytest.mark.parametrize("p", PREFILL, ids=_id)
def test_prefill_peak_within_10_percent_with_activations(p):
    """A single long prompt: activations matter, so weights + KV + activation term are compared."""
    arch = get_preset(PRESET_OF[p.model])
    tier = Tier(p.tp)
    estimated = (
        weight_bytes_per_gpu(arch, tier, "bfloat16")
        + kv_bytes_per_token_per_gpu(arch, tier, "bfloat16") * p.tokens_per_sequence
        + activation_bytes_per_gpu(arch, tier, "bfloat16", max_num_batched_tokens=p.size, max_num_seqs=1)
    )
    assert abs(estimated - p.peak_allocated) / p.peak_allocated <= 0.10


@pytest.mark.parametrize("p", DECODE, ids=_id)
def test_nvml_minus_allocator_is_explained_by_the_overhead_term(p):
    """NVML used - allocator peak = NVML's reserve outside CUDA's total + context + slack + NCCL buffers.

    The runs captured one small CUDA graph inside PyTorch's allocator, so the estimator's
    allowance for vLLM's graphs is left out (enforce_eager=True).
    """
    context, nccl, graphs = overhead_parts(Tier(p.tp), "nvlink" if p.p2p else "pcie", enforce_eager=True)
    assert graphs == 0
    predicted = p.nvml_minus_cuda_total + context + nccl
    measured = p.nvml_used - p.peak_allocated
    assert abs(measured - predicted) <= 0.25 * GIB, f"measured {measured / GIB:.2f} GiB, predicted {predicted / GIB:.2f} GiB"


def _70b_tp1(concurrency: int, utilization: float) -> object:
    # The runs' largest forward pass was the 1024-token prefill, so vLLM's profiling size is set to it.
    return estimate_memory(
        get_preset("llama-3-70b"),
        H200,
        Tier(1),
        dtype="bfloat16",
        max_model_len=1025,
        concurrency=concurrency,
        context_len=1025,
        gpu_memory_utilization=utilization,
        max_num_batched_tokens=1024,
    )


def test_70b_tp1_whole_gpu_fits_batch_16_not_32():
    run = _run(H200_DATA / "llama70b_tp1.json")
    measured = {d["batch"]: d.get("failed") for d in run["summary"]["decode"]}
    assert measured[16] is None and measured[32] == "OOM" and measured[64] == "OOM"
    at16, at32 = _70b_tp1(16, 1.0), _70b_tp1(32, 1.0)
    assert at16.fits and at16.fits_target
    assert at32.fits and not at32.fits_target  # the engine starts, but 32 sequences do not fit
    assert 16 <= at32.max_concurrent_sequences < 32  # the data brackets the largest batch between 16 and 31
    assert not _70b_tp1(64, 1.0).fits_target


def test_70b_tp1_does_not_fit_at_all_under_vllm_utilization():
    est = _70b_tp1(1, 0.90)
    assert not est.fits and not est.fits_target and est.max_concurrent_sequences == 0
    assert est.weights_gib == pytest.approx(131.4, abs=0.05)
    assert "exceed the budget 125.8 GiB" in est.reason


def test_done_criterion_llama_70b_on_h200_ladder():
    arch = get_preset("llama-3-70b")
    estimates = {tp: estimate_memory(arch, H200, Tier(tp), max_model_len=4096, concurrency=32, context_len=1280) for tp in (1, 2, 4, 8)}
    assert not estimates[1].fits
    assert all(estimates[tp].fits_target for tp in (2, 4, 8))
    seqs = [estimates[tp].max_concurrent_sequences for tp in (2, 4, 8)]
    assert seqs == sorted(seqs) and seqs[0] > 32


def test_vllm_logged_activation_peak_is_reproduced():
    """vLLM PR #10511 logs 1.26 GiB for Meta-Llama-3-8B at TP 1 and 2 (8192 tokens, 256 sequences)."""
    arch = get_preset("llama-3-8b")
    for tp in (1, 2):
        act = activation_bytes_per_gpu(arch, Tier(tp), "bfloat16", max_num_batched_tokens=8192, max_num_seqs=256)
        assert act / GIB == pytest.approx(1.26, abs=0.03)


# -- vLLM's rules


def test_kv_heads_are_replicated_beyond_their_count():
    arch = get_preset("llama-3-70b")  # 8 KV heads
    per = {tp: kv_bytes_per_token_per_gpu(arch, Tier(tp), "bfloat16") for tp in (1, 2, 4, 8, 16)}
    assert per[1] == 2 * 80 * 8 * 128 * 2
    assert per[8] == per[16] == 2 * 80 * 1 * 128 * 2
    w8, w16 = weight_bytes_per_gpu(arch, Tier(8), "bfloat16"), weight_bytes_per_gpu(arch, Tier(16), "bfloat16")
    assert w16 > w8 / 2  # k/v projections do not shrink past TP=8


def test_mla_kv_cache_is_not_split_by_tp():
    arch = get_preset("deepseek-v3")
    one = kv_bytes_per_token_per_gpu(arch, Tier(1), "bfloat16")
    assert one == 61 * (512 + 64) * 2
    assert kv_bytes_per_token_per_gpu(arch, Tier(8), "bfloat16") == one


def test_fp8_kv_cache_halves_bf16():
    arch = get_preset("llama-3-8b")
    assert kv_bytes_per_token_per_gpu(arch, Tier(1), "bfloat16", "fp8") * 2 == kv_bytes_per_token_per_gpu(arch, Tier(1), "bfloat16")
    assert kv_bytes_per_token_per_gpu(arch, Tier(1), "float32") == 2 * kv_bytes_per_token_per_gpu(arch, Tier(1), "bfloat16")


def test_weight_precisions():
    arch = get_preset("llama-3-70b")
    sizes = {d: weight_bytes_per_gpu(arch, Tier(1), d) for d in BYTES_PER_PARAM}
    assert sizes["bfloat16"] == sizes["float16"] == 2 * arch.num_parameters
    assert sizes["float32"] == 4 * arch.num_parameters
    embeddings = 2 * arch.vocab_size * arch.hidden_size
    # Quantized checkpoints keep embedding and lm_head (and norms) in 16-bit.
    assert sizes["fp8"] == sizes["int8"]
    assert sizes["fp8"] - 2 * embeddings == pytest.approx(arch.num_parameters - embeddings, rel=1e-4)
    assert sizes["int4"] < sizes["fp8"] < sizes["bfloat16"]
    assert estimate_memory(arch, H200, Tier(1), dtype="fp8", max_model_len=4096, concurrency=32, context_len=1280).fits_target


def test_pipeline_stages_split_layers_like_vllm():
    assert pipeline_stage_layers(80, 1) == [(0, 80)]
    assert pipeline_stage_layers(80, 3) == [(0, 27), (27, 54), (54, 80)]
    assert pipeline_stage_layers(61, 4) == [(0, 15), (15, 30), (30, 46), (46, 61)]  # remainder to the stage before the last
    arch = get_preset("llama-3.1-405b")
    tier = Tier(8, 2)
    first, last = (stage_weight_bytes_per_gpu(arch, tier, "bfloat16", s) for s in (0, 1))
    assert last - first == 2 * arch.hidden_size  # 63 layers each; embedding first, lm_head + final norm last
    total = sum(stage_weight_bytes_per_gpu(arch, Tier(1, 2), "bfloat16", s) for s in (0, 1))
    assert total == weight_bytes_per_gpu(arch, Tier(1), "bfloat16")


def test_llama_405b_needs_two_nodes_of_h200_in_bf16():
    arch = get_preset("llama-3.1-405b")
    tp8 = estimate_memory(arch, H200, Tier(8), max_model_len=4096, concurrency=32, context_len=1280)
    pp2 = estimate_memory(arch, H200, Tier(8, 2), max_model_len=4096, concurrency=32, context_len=1280)
    assert tp8.fits_target and tp8.max_concurrent_sequences > 32  # 94.5 GiB of weights per GPU
    assert pp2.weights_bytes_per_gpu < tp8.weights_bytes_per_gpu and pp2.max_concurrent_sequences > tp8.max_concurrent_sequences
    h100 = get_gpu_type("h100-sxm")
    assert not estimate_memory(arch, h100, Tier(8), max_model_len=4096, concurrency=32, context_len=1280).fits
    assert estimate_memory(arch, h100, Tier(8, 2), max_model_len=4096, concurrency=32, context_len=1280).fits


def test_engine_start_check_uses_max_model_len():
    arch = get_preset("llama-3-70b")
    kwargs = dict(concurrency=1, context_len=1024, gpu_memory_utilization=1.0, max_num_batched_tokens=1024)
    assert estimate_memory(arch, H200, Tier(1), max_model_len=8192, **kwargs).fits
    too_long = estimate_memory(arch, H200, Tier(1), max_model_len=32768, **kwargs)
    assert not too_long.fits and "less than one 32768-token sequence" in too_long.reason


def test_incompatible_tiers_are_refused():
    qwen = get_preset("qwen2.5-7b")  # 28 heads
    est = estimate_memory(qwen, H200, Tier(8), max_model_len=4096, concurrency=1, context_len=1024)
    assert not est.fits and est.max_concurrent_sequences == 0 and "28 attention heads" in est.reason
    v100 = get_gpu_type("v100-32gb")
    small = get_preset("llama-3.2-1b")
    assert "no bfloat16" in estimate_memory(small, v100, Tier(1), max_model_len=4096, concurrency=1, context_len=1024).reason
    assert estimate_memory(small, v100, Tier(1), dtype="float16", max_model_len=4096, concurrency=1, context_len=1024).fits


def test_overhead_parts():
    assert overhead_parts(Tier(1), "nvlink", enforce_eager=False)[1:] == (0, 512 * MIB)
    assert overhead_parts(Tier(2), "nvlink", enforce_eager=True)[1:] == (784 * MIB, 0)
    assert overhead_parts(Tier(1, 2), "pcie", enforce_eager=True)[1] == 328 * MIB
    with pytest.raises(ValueError, match="interconnect must be one of nvlink, pcie"):
        overhead_parts(Tier(2), "ethernet", enforce_eager=False)


def test_default_profile_tokens_follow_vllm():
    assert default_max_num_batched_tokens(get_gpu_type("h200")) == 8192
    assert default_max_num_batched_tokens(get_gpu_type("h100-sxm")) == 8192
    assert default_max_num_batched_tokens(get_gpu_type("a100-80gb")) == 2048
    assert default_max_num_batched_tokens(get_gpu_type("l40s")) == 2048


def test_bad_arguments_raise_naming_the_argument():
    arch = get_preset("llama-3-8b")
    with pytest.raises(ValueError, match="dtype must be one of bfloat16, float16"):
        estimate_memory(arch, H200, Tier(1), dtype="fp4", max_model_len=4096, concurrency=1, context_len=10)
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of auto"):
        estimate_memory(arch, H200, Tier(1), kv_cache_dtype="int2", max_model_len=4096, concurrency=1, context_len=10)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        estimate_memory(arch, H200, Tier(1), max_model_len=4096, concurrency=1, context_len=10, gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="concurrency must be at least 1"):
        estimate_memory(arch, H200, Tier(1), max_model_len=4096, concurrency=0, context_len=10)


def test_estimate_fields_add_up():
    est = estimate_memory(get_preset("llama-3-70b"), H200, Tier(2), max_model_len=4096, concurrency=32, context_len=1280)
    assert est.overhead_bytes_per_gpu == est.context_bytes_per_gpu + est.nccl_bytes_per_gpu + est.cuda_graph_bytes_per_gpu
    assert est.kv_pool_bytes_per_gpu == est.budget_bytes_per_gpu - est.weights_bytes_per_gpu - est.non_kv_overhead_bytes_per_gpu
    assert est.needed_bytes_per_gpu == est.weights_bytes_per_gpu + est.non_kv_overhead_bytes_per_gpu + est.kv_cache_bytes_needed_per_gpu
    assert est.kv_bytes_per_sequence_per_gpu == est.kv_bytes_per_token_per_gpu * 1280  # 1280 is a whole number of 16-token blocks
    assert est.max_concurrent_sequences == est.kv_pool_bytes_per_gpu // est.kv_bytes_per_sequence_per_gpu
    doc = est.to_dict()
    assert doc["tier"]["name"] == "tp2-pp1" and doc["weights_gib"] == round(est.weights_gib, 3)
    json.dumps(doc)


# -- the "needed" figure of the memory stop rule


def test_needed_memory_uses_the_used_part_of_the_pool():
    assert needed_memory_bytes(10 * GIB, 100 * GIB, 0.25, 2 * GIB) == 37 * GIB
    assert needed_memory_bytes(10 * GIB, 100 * GIB, 0.0, 2 * GIB) == 12 * GIB
    with pytest.raises(ValueError, match="kv_usage_fraction must be between 0 and 1"):
        needed_memory_bytes(1, 1, 1.5, 1)


def test_needed_differs_from_framebuffer_used():
    """The trap of DESIGN.md section 7: the pre-allocated pool makes every tier look full."""
    arch = get_preset("llama-3-8b")
    tiers = [estimate_memory(arch, H200, Tier(tp), max_model_len=4096, concurrency=32, context_len=1280) for tp in (1, 2, 4)]
    framebuffer = [e.weights_bytes_per_gpu + e.kv_pool_bytes_per_gpu + e.non_kv_overhead_bytes_per_gpu for e in tiers]
    assert max(framebuffer) - min(framebuffer) < 0.01 * H200.memory_bytes  # all ~ the budget
    needed = [e.needed_bytes_at_kv_usage(0.05) for e in tiers]
    assert needed[0] > needed[1] > needed[2]


def test_estimate_ladder_reads_the_spec():
    spec = parse_spec(
        {
            "model": {"uri": "hf://meta-llama/Llama-3.3-70B-Instruct", "maxModelLen": 8192},
            "engine": {"gpuMemoryUtilization": 0.95, "extraArgs": ["--max-num-batched-tokens", "4096"]},
            "tiers": {"tensorParallel": [1, 2, 4], "pipelineParallel": [1, 2]},
            "load": {"concurrency": 64, "inputLen": 2048, "outputLen": 512},
        }
    )
    estimates = estimate_ladder(spec, get_preset("llama-3-70b"), H200)
    assert [e.tier.name for e in estimates] == ["tp1-pp1", "tp2-pp1", "tp4-pp1", "tp4-pp2"]
    first = estimates[0]
    assert (first.concurrency, first.context_len, first.max_model_len, first.max_num_batched_tokens) == (64, 2560, 8192, 4096)
    assert first.gpu_memory_utilization == 0.95 and not first.fits


# -- invariants

dtypes = st.sampled_from(sorted(BYTES_PER_PARAM))
presets = st.sampled_from(preset_names())
gpus = st.sampled_from(all_gpu_types())


@st.composite
def architectures(draw) -> ModelArchitecture:
    heads = draw(st.sampled_from([8, 16, 32, 64]))
    moe = draw(st.booleans())
    experts = draw(st.integers(2, 64)) if moe else 0
    return ModelArchitecture(
        name="drawn",
        num_layers=draw(st.integers(1, 96)),
        hidden_size=heads * draw(st.sampled_from([64, 128])),
        num_attention_heads=heads,
        num_key_value_heads=draw(st.sampled_from([h for h in (1, 2, 4, 8, 16, 32, 64) if heads % h == 0])),
        head_dim=draw(st.sampled_from([64, 128])),
        intermediate_size=draw(st.integers(256, 60000)),
        vocab_size=draw(st.integers(1000, 260000)),
        tie_word_embeddings=draw(st.booleans()),
        num_experts=experts,
        num_experts_per_token=draw(st.integers(1, experts)) if moe else 0,
        moe_intermediate_size=draw(st.integers(128, 20000)) if moe else 0,
    )


@settings(max_examples=200, deadline=None)
@given(arch=st.one_of(architectures(), presets.map(get_preset)), dtype=dtypes, tp=st.sampled_from([1, 2, 4, 8, 16, 32]))
def test_more_tp_never_increases_weights_per_gpu(arch, dtype, tp):
    assert weight_bytes_per_gpu(arch, Tier(tp * 2), dtype) <= weight_bytes_per_gpu(arch, Tier(tp), dtype)
    assert kv_bytes_per_token_per_gpu(arch, Tier(tp * 2), dtype) <= kv_bytes_per_token_per_gpu(arch, Tier(tp), dtype)


@settings(max_examples=200, deadline=None)
@given(arch=st.one_of(architectures(), presets.map(get_preset)), dtype=dtypes, pp=st.integers(1, 8))
def test_more_pp_never_increases_weights_per_gpu(arch, dtype, pp):
    assert weight_bytes_per_gpu(arch, Tier(1, pp + 1), dtype) <= weight_bytes_per_gpu(arch, Tier(1, pp), dtype) or pp + 1 > arch.num_layers


@settings(max_examples=200, deadline=None)
@given(
    arch=st.one_of(architectures(), presets.map(get_preset)),
    gpu=gpus,
    tp=st.sampled_from([1, 2, 4, 8]),
    concurrency=st.integers(1, 512),
    extra=st.integers(0, 512),
    context=st.integers(1, 4096),
)
def test_larger_concurrency_never_fits_better(arch, gpu, tp, concurrency, extra, context):
    kwargs = dict(dtype="float16", max_model_len=4096, context_len=context)
    small = estimate_memory(arch, gpu, Tier(tp), concurrency=concurrency, **kwargs)
    large = estimate_memory(arch, gpu, Tier(tp), concurrency=concurrency + extra, **kwargs)
    assert large.max_concurrent_sequences <= small.max_concurrent_sequences
    assert not (large.fits_target and not small.fits_target)
    assert large.needed_bytes_per_gpu >= small.needed_bytes_per_gpu
    assert small.fits_target == (small.fits and small.max_concurrent_sequences >= concurrency)


@settings(max_examples=150, deadline=None)
@given(arch=presets.map(get_preset), gpu=gpus, tp=st.sampled_from([1, 2, 4, 8]), util=st.floats(0.3, 0.99), more=st.floats(0.0, 0.5))
def test_more_memory_never_fits_fewer_sequences(arch, gpu, tp, util, more):
    kwargs = dict(dtype="float16", max_model_len=4096, concurrency=32, context_len=1280)
    low = estimate_memory(arch, gpu, Tier(tp), gpu_memory_utilization=util, **kwargs)
    high = estimate_memory(arch, gpu, Tier(tp), gpu_memory_utilization=min(1.0, util + more), **kwargs)
    assert high.max_concurrent_sequences >= low.max_concurrent_sequences
    assert high.fits or not low.fits
