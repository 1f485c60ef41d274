"""Properties of the roofline step-time model that the H200 points alone do not pin down."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st
from pytest import approx

from kneepoint.core.architectures import get_preset
from kneepoint.core.gpus import get_gpu_type
from kneepoint.core.memory_estimate import kv_bytes_per_token_per_gpu, weight_bytes_per_gpu
from kneepoint.core.tiers import Tier
from kneepoint.simulator.calibration import load_calibration
from kneepoint.simulator.perf_model import (
    Deployment,
    Hardware,
    PerfModel,
    StepWork,
    cuda_graph_padded_tokens,
    decode_work,
    prefill_work,
    row_factor,
    shape_from_architecture,
    smooth_max,
)

CAL = load_calibration()


def model(preset="llama-3-8b", gpu="h200", tp=1, pp=1, link="nvlink", eager=False, inter_node=None, dtype="bfloat16", cal=CAL) -> PerfModel:
    arch = get_preset(preset)
    tier = Tier(tp, pp)
    dep = Deployment(
        tp, pp, weight_bytes_per_gpu(arch, tier, dtype), kv_bytes_per_token_per_gpu(arch, tier, "bfloat16"), enforce_eager=eager
    )
    hw = Hardware.from_gpu(get_gpu_type(gpu), link, inter_node_gbps=inter_node, fp8_compute=dtype == "fp8")
    return PerfModel(shape_from_architecture(arch), hw, dep, cal)


def test_the_preset_path_matches_real_vllm_decode_steps() -> None:
    """The simulator's own path (preset -> estimator bytes -> model) lands on real vLLM's traced 8B
    decode steps (tests/data/vllm, 1024-in/256-out loads: mean context 1153), GPU part alone."""
    measured = {8: 5.02, 16: 5.38, 32: 6.12, 128: 10.23}
    for batch, ms in measured.items():
        simulated = model().gpu_step_time(decode_work(batch, 1152)).seconds * 1e3
        assert abs(simulated / ms - 1) <= 0.05, (batch, simulated, ms)


def test_tp_speeds_up_decode_as_the_pytorch_data_does() -> None:
    """8B decode, TP1 over TP2 and TP4 (NVLink), against the plain-PyTorch graph replays' ratios."""
    measured = {(2, 1): 5.25 / 4.11, (2, 128): 13.77 / 8.42, (4, 1): 5.25 / 3.41, (4, 128): 13.77 / 5.91}
    for (tp, batch), ratio in measured.items():
        simulated = model().gpu_step_time(decode_work(batch, 1024)).seconds / model(tp=tp).gpu_step_time(decode_work(batch, 1024)).seconds
        assert abs(simulated / ratio - 1) <= 0.20, (tp, batch, simulated, ratio)


@settings(max_examples=50, deadline=None)
@given(batch=st.integers(1, 256), ctx=st.integers(0, 8192), tp=st.sampled_from([1, 2, 4, 8]), link=st.sampled_from(["nvlink", "pcie"]))
def test_more_work_never_takes_less_time(batch, ctx, tp, link) -> None:
    # bf16 (cuBLAS): yes. Not so for fp8, where vLLM's kernel choice makes 24 sequences slower than 48 (below).
    m = model(tp=tp, link=link)
    t = m.decode_step(batch, ctx)
    assert m.decode_step(batch + 1, ctx).seconds >= t.seconds
    assert m.decode_step(batch, ctx + 64).seconds >= t.seconds
    assert 0.0 <= t.comm_fraction < 1.0
    assert (t.comm_seconds == 0.0) == (tp == 1)


@settings(max_examples=200, deadline=None)
@given(a=st.one_of(st.just(0.0), st.floats(1e-9, 10.0)), b=st.one_of(st.just(0.0), st.floats(1e-9, 10.0)), k=st.floats(1.0, 400.0))
def test_the_smooth_max_lies_between_the_max_and_the_sum_at_any_scale(a, b, k) -> None:
    # Seconds of weights and of FLOPs (a femtosecond at the least: no step's part is subnormal), down to a microsecond
    # scale: a microsecond raised to k near 100 is far below the smallest float.
    for scale in (1.0, 1e-3, 1e-6):
        t = smooth_max(a * scale, b * scale, k)
        assert max(a, b) * scale * (1 - 1e-9) <= t <= (a + b) * scale * (1 + 1e-9)


def test_a_small_models_weights_at_tp2_still_take_their_time() -> None:
    # With the fitted sharpness (95-108) the plain formula dropped any part under about 0.6-1.4 ms: the 1B's weights
    # streamed at TP2 (0.3 ms) counted nothing, and its step did not grow from TP2 to TP1 by what halving them costs.
    k = CAL.compute.roofline_sharpness
    assert k > 50 and (3e-4) ** k == 0.0  # what the plain sum of powers lost
    work = decode_work(8, 1024)
    tp1, tp2, tp4 = (model("llama-3.2-1b", tp=tp) for tp in (1, 2, 4))
    for m in (tp1, tp2, tp4):
        weights = m.deployment.weight_bytes_per_gpu / m._weight_bw
        assert m._stage_compute(work, 1.0) > weights + m._overhead
    assert tp2._stage_compute(work, 1.0) > tp4._stage_compute(work, 1.0) > tp4._overhead


def test_pcie_collectives_cost_more_than_nvlink() -> None:
    nv, pcie = model(tp=4), model(tp=4, link="pcie")
    for batch in (1, 64, 256):
        assert pcie.decode_step(batch, 1024).comm_seconds > nv.decode_step(batch, 1024).comm_seconds
    assert pcie.prefill(2048).comm_fraction > 0.5


def test_prefill_is_compute_bound_and_scales_with_tokens() -> None:
    m = model()
    t1, t4 = m.gpu_step_time(prefill_work(1024)).seconds, m.gpu_step_time(prefill_work(4096)).seconds
    assert 3.5 < t4 / t1 < 4.6  # linear GEMMs plus a growing attention share
    # A slower GPU (fewer FLOPs and less bandwidth) is slower at the same work.
    assert model(gpu="a100-80gb").gpu_step_time(prefill_work(1024)).seconds > 2.5 * t1


def test_pipeline_parallel_bubble_and_hops() -> None:
    tp1 = model(preset="llama-3-70b", tp=2)
    pp2 = model(preset="llama-3-70b", tp=2, pp=2)
    one = pp2.decode_step(1, 1024)
    # One sequence cannot fill two stages: half the stage time is bubble, no faster than one stage holding all layers.
    assert one.bubble_seconds > 0 and one.seconds >= 0.95 * tp1.decode_step(1, 1024).seconds
    many = pp2.decode_step(64, 1024)
    assert many.bubble_seconds == 0.0
    # Stages on different nodes pay the slower hop.
    far = model(preset="llama-3-70b", tp=2, pp=2, inter_node=100).decode_step(64, 1024)  # 100 Gb/s
    assert far.seconds > many.seconds


def test_moe_reads_only_the_experts_its_tokens_pick() -> None:
    m = model(preset="mixtral-8x7b", tp=2)
    few, many = m.decode_step(1, 512), m.decode_step(64, 512)
    assert many.seconds / few.seconds > 1.5  # batch 1 touches 2 of 8 experts, batch 64 nearly all
    assert shape_from_architecture(get_preset("mixtral-8x7b")).expert_weight_fraction > 0.9


def test_enforce_eager_adds_the_host_launch_floor() -> None:
    graph, eager = model(), model(eager=True)
    assert eager.decode_step(1, 1024).seconds > graph.decode_step(1, 1024).seconds
    layers = 32
    assert eager.decode_step(1, 1024).seconds >= layers * CAL.eager.host_us_per_layer_tp1 * 1e-6


def test_mixed_step_costs_more_than_its_decode_part_alone() -> None:
    m = model(tp=2)
    decode = decode_work(32, 1024)
    mixed = StepWork(
        decode_seqs=32,
        decode_context_tokens=decode.decode_context_tokens,
        prefill_tokens=512,
        prefill_attention_pairs=512 * 513 / 2,
        prefill_seqs=1,
        sampled_seqs=33,
    )
    assert m.step_time(mixed).seconds > m.step_time(decode).seconds
    assert m.step_time(StepWork()).seconds == 0.0
    assert m.step_time(prefill_work(256, prior_tokens=1024)).seconds > m.step_time(prefill_work(256)).seconds


def test_a_step_above_the_largest_cuda_graph_has_a_higher_cpu_floor() -> None:
    # vLLM launches such a step's kernels one by one (run 8): serving.cpuNonGraphUsPerLayer per layer more.
    from kneepoint.simulator.perf_model import default_cuda_graph_max_tokens

    assert default_cuda_graph_max_tokens(128) == 256 and default_cuda_graph_max_tokens(64) == 128  # the serve logs
    assert default_cuda_graph_max_tokens(1024) == 512
    m = model()
    per_layer = CAL.serving.cpu_non_graph_us_per_layer * 1e-6
    inside, above = prefill_work(256), prefill_work(257)
    assert m.cpu_floor_seconds(above) - m.cpu_floor_seconds(inside) == approx(32 * per_layer)
    # It binds where the GPU's part is shorter (a lone 320-token prompt), not on a large prefill.
    assert m.step_time(prefill_work(320)).seconds == approx(m.cpu_floor_seconds(prefill_work(320)))
    big = prefill_work(4096)
    assert m.step_time(big).seconds == approx(m.gpu_step_time(big).seconds + m.host_seconds(big))
    # With --enforce-eager there is no graph to fall out of: the eager floor stands instead.
    eager = model(eager=True)
    assert eager.cpu_floor_seconds(above) == approx(eager.cpu_floor_seconds(inside))


def test_cuda_graph_padding_follows_vllms_capture_sizes() -> None:
    # cudagraph_capture_sizes in the serve logs: 1, 2, 4, then every 8 (every 16 above 256), up to the largest graph.
    padded = {n: cuda_graph_padded_tokens(n, 256) for n in (1, 2, 3, 5, 8, 9, 17, 24, 25, 129, 255, 256)}
    assert padded == {1: 1, 2: 2, 3: 4, 5: 8, 8: 8, 9: 16, 17: 24, 24: 24, 25: 32, 129: 136, 255: 256, 256: 256}
    assert cuda_graph_padded_tokens(257, 256) == 257  # no graph: as it is
    assert cuda_graph_padded_tokens(260, 512) == 272 and cuda_graph_padded_tokens(500, 512) == 512
    assert cuda_graph_padded_tokens(0, 256) == 0


def test_row_factor_interpolates_between_its_rows() -> None:
    table = ((16, 1.0), (24, 1.4), (64, 1.0))
    assert row_factor(table, 8) == 1.0 and row_factor(table, 16) == 1.0
    assert row_factor(table, 20) == approx(1.2) and row_factor(table, 24) == approx(1.4) and row_factor(table, 44) == approx(1.2)
    assert row_factor(table, 1000) == 1.0 and row_factor((), 24) == 1.0


def test_fp8_decode_follows_vllms_kernel_dispatch_and_bf16_does_not() -> None:
    """Run 12: vLLM's fp8 CUTLASS GEMMs at 17-40 and 65-128 rows are slower than at 16 or 48-64 (run 12b's 8B fp8
    TPOT: 3.58 ms at c16, 4.63 at c24, 4.39 at c48); the model's decode step follows."""
    fp8 = model(dtype="fp8")
    step = {b: fp8.gpu_step_time(decode_work(b, 257)).seconds for b in (16, 24, 48, 72)}
    assert step[24] > 1.15 * step[16] and step[24] > step[48] and step[72] > step[48]
    flat = model(dtype="fp8", cal=replace(CAL, compute=replace(CAL.compute, fp8_gemm_row_factors=())))
    assert flat.gpu_step_time(decode_work(16, 257)).seconds == approx(step[16])  # at 1-16 rows: the memory-bound model as it was
    assert flat.gpu_step_time(decode_work(24, 257)).seconds < step[24]
    # bf16 engines never read the table.
    bf16 = model()
    no_table = model(cal=replace(CAL, compute=replace(CAL.compute, fp8_gemm_row_factors=())))
    for b in (1, 24, 72, 136):
        assert bf16.gpu_step_time(decode_work(b, 257)) == no_table.gpu_step_time(decode_work(b, 257))
    # --enforce-eager has no graphs: 17 rows stay 17 (the table's 17-row figure), not 24.
    eager = model(dtype="fp8", eager=True)
    table = CAL.compute.fp8_gemm_row_factors
    assert eager.gpu_step_time(decode_work(17, 257)).seconds != approx(eager.gpu_step_time(decode_work(24, 257)).seconds)
    assert dict(table)[17] != dict(table)[24]


@settings(max_examples=50, deadline=None)
@given(batch=st.integers(1, 300), ctx=st.integers(0, 4096), tp=st.sampled_from([1, 2, 4]))
def test_the_fp8_row_factors_only_ever_add_time(batch, ctx, tp) -> None:
    flat = replace(CAL, compute=replace(CAL.compute, fp8_gemm_row_factors=()))
    work = decode_work(batch, ctx)
    assert (
        model("llama-3-70b", tp=tp, dtype="fp8").gpu_step_time(work).seconds
        >= model("llama-3-70b", tp=tp, dtype="fp8", cal=flat).gpu_step_time(work).seconds
    )
