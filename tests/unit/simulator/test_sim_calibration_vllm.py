"""The performance model against real vLLM 0.24.0 serving on one H200 (tests/data/vllm).

The step table is the GPU span of each engine step by composition, read from vLLM's profiler
traces; the host part is the load generator's inter-token latency (profiler off) over the
GPU step; the one small prefill is the unprofiled time to first token at concurrency 1.
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from kneepoint.core.gpus import get_gpu_type
from kneepoint.simulator.calibration import load_calibration
from kneepoint.simulator.calibration_fit import load_points
from kneepoint.simulator.calibration_vllm import (
    DECODE_ONLY_CONTEXT,
    FP8_DECODE_CONTEXT,
    FP8_DECODE_FILES,
    FP8_LONE_PREFILL_FIT_TOKENS,
    H100_DECODE_CONCURRENCIES,
    MEAN_DECODE_CONTEXT,
    PROMPT,
    engine_model,
    fit,
    fit_bandwidth_scale,
    fit_cpu_floor,
    fit_fp8_activation_quant,
    fit_fp8_compute_efficiency,
    fit_fp8_elementwise,
    fit_gemm_row_factors,
    llama8b_h200_tp1,
    llama70b_fp8_h200_tp1,
    load_1b_c1_tpots_ms,
    load_compositions,
    load_cpu_floor_itl_p50_ms,
    load_decode_only_itl_p50_ms,
    load_fp8_compositions,
    load_fp8_decode_itl_p50_ms,
    load_fp8_h100_decode_itl_p50_ms,
    load_fp8_tpot_c1_ms,
    load_fp8_ttft_c1_ms,
    load_gemm_rows,
    load_h100_decode_itl_p50_ms,
    load_held_out_14b_compositions,
    load_itl_p50_ms,
    load_lone_prefill_ms,
    load_ttft_c1_ms,
    lone_prefill_model,
    parse_annotation,
    qwen14b_h200_tp1,
    with_bandwidth_scale,
)
from kneepoint.simulator.intake import Intake
from kneepoint.simulator.perf_model import Hardware, StepWork, decode_work, prefill_work

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm"
CAL = load_calibration()
MODEL = llama8b_h200_tp1(CAL)
COMPS = load_compositions(DATA)


def _sim_ms(comp) -> float:
    return MODEL.gpu_step_time(comp.work()).seconds * 1e3


def test_annotation_names_parse_as_vllm_writes_them() -> None:
    assert parse_annotation("execute_context_9(8184)_generation_8(8)") == (9, 8184, 8)
    assert parse_annotation("execute_context_0(0)_generation_32(32)") == (0, 0, 32)
    assert parse_annotation("aten::mm") is None


def test_the_traces_hold_the_expected_compositions() -> None:
    decode = {c.decode_seqs: c for c in COMPS if not c.prefill_seqs}
    assert {8, 16, 32, 128} <= set(decode)
    assert decode[32].count > 700  # two traces at concurrency 32
    assert decode[32].median_ms == pytest.approx(6.12, abs=0.03)
    assert decode[16].median_ms == pytest.approx(5.38, abs=0.01)


@pytest.mark.parametrize("comp", [c for c in COMPS if not c.prefill_seqs], ids=lambda c: c.label)
def test_decode_step_within_5_percent_of_real_vllm(comp) -> None:
    assert abs(_sim_ms(comp) / comp.median_ms - 1.0) <= 0.05, (_sim_ms(comp), comp.median_ms)


@pytest.mark.parametrize("comp", [c for c in COMPS if c.prefill_seqs and c.fitted], ids=lambda c: c.label)
def test_prefill_carrying_step_within_10_percent_of_real_vllm(comp) -> None:
    """Most are single traced steps (n=1), whose own spread is several per cent (8,078-8,150 tokens
    with 42-114 decodes: 182-206 ms); the worst is -8.3 %."""
    assert abs(_sim_ms(comp) / comp.median_ms - 1.0) <= 0.10, (_sim_ms(comp), comp.median_ms)


def test_profiler_bound_small_prefills_are_shown_not_fitted() -> None:
    small = [c for c in COMPS if c.prefill_seqs and not c.fitted]
    assert [c.prefill_tokens for c in small] == [1024, 1024]
    # Unprofiled, the whole time to first token of one 1024-token prompt is below the traced step.
    assert load_ttft_c1_ms(DATA) < min(c.median_ms for c in small)


@pytest.mark.parametrize("conc", [1, 4, 8, 16, 32])
def test_decode_step_with_host_time_within_5_percent_of_real_itl(conc) -> None:
    itl = load_itl_p50_ms(DATA)[conc]
    st = MODEL.step_time(StepWork(decode_seqs=conc, decode_context_tokens=conc * MEAN_DECODE_CONTEXT, sampled_seqs=conc)).seconds * 1e3
    assert abs(st / itl - 1.0) <= 0.05, (st, itl)


def test_first_token_at_concurrency_1_within_5_percent() -> None:
    work = prefill_work(PROMPT)
    intake = Intake.of(CAL.serving).lone_seconds(PROMPT)
    ttft = (MODEL.gpu_step_time(work).seconds + MODEL.host_seconds(work) + intake) * 1e3
    assert abs(ttft / load_ttft_c1_ms(DATA) - 1.0) <= 0.05


def test_the_shipped_constants_are_the_fit() -> None:
    """Refitting from the shipped file's own start lands on the shipped constants (the fit is deterministic)."""
    refit = fit(
        COMPS, load_itl_p50_ms(DATA), load_ttft_c1_ms(DATA), CAL, load_points(DATA.parent / "h200"), load_decode_only_itl_p50_ms(DATA)
    )
    for key in (
        "weight_bandwidth_efficiency",
        "kv_bandwidth_efficiency",
        "compute_efficiency",
        "overhead_us_per_layer",
        "overhead_us_per_sampled_seq",
    ):
        assert getattr(refit.compute, key) == pytest.approx(getattr(CAL.compute, key), rel=0.05), key
    assert refit.serving.host_us_per_step == pytest.approx(CAL.serving.host_us_per_step, rel=0.05)


def test_a_short_contexts_decode_step_is_within_3_percent_of_run_6() -> None:
    # Run 6's decode-dominated 8B loads (128-token prompts, 512-token replies): the per-sequence cost
    # that does not grow with the context, which the traces at about 1,150 tokens cannot show.
    for conc, itl in load_decode_only_itl_p50_ms(DATA).items():
        work = StepWork(decode_seqs=conc, decode_context_tokens=conc * DECODE_ONLY_CONTEXT, sampled_seqs=conc)
        assert MODEL.step_time(work).seconds * 1e3 == pytest.approx(itl, rel=0.03), conc


def test_the_1b_decode_step_is_vllms_cpu_time_per_step() -> None:
    # Run 6: the 1B's kernels take 1.0 ms a step at c1 (its trace), its decode period 1.5 ms at the
    # host's fastest; the floor has the shape of those loads (per sequence) and the level of the host's
    # median speed (runs 5-14), and a 1B decode step is that floor, not its GPU time.
    floor = load_cpu_floor_itl_p50_ms(DATA)
    tpots = load_1b_c1_tpots_ms(DATA)
    assert fit_cpu_floor(floor, tpots) == pytest.approx((CAL.serving.cpu_floor_us_per_step, CAL.serving.cpu_floor_us_per_seq), rel=0.01)
    fast_step, fast_seq = fit_cpu_floor(floor)
    assert CAL.serving.cpu_floor_us_per_seq / CAL.serving.cpu_floor_us_per_step == pytest.approx(fast_seq / fast_step, rel=0.01)
    model = engine_model(CAL, "llama-3.2-1b")
    for conc, itl in floor.items():
        work = decode_work(conc, DECODE_ONLY_CONTEXT)
        assert model.gpu_step_time(work).seconds < model.cpu_floor_seconds(work)
        assert model.step_time(work).seconds == model.cpu_floor_seconds(work)
        # run 6 ran 30 % faster than the median host: the fastest seen
        assert model.step_time(work).seconds * 1e3 / itl == pytest.approx(1.43, rel=0.05), conc


def test_the_cpu_floor_is_the_host_median_speed() -> None:
    # Runs 5-15: the 1B's c1 step is vLLM's CPU time and the device's CPU speed varies (1.51-2.56 ms
    # over 28 unpinned c1 loads). The floor is their median: most loads lie within 10 % of it (19 of 28;
    # of run 6's fastest-state fit, 2), and real vLLM's own spread is far beyond the benchmark's 10 %.
    tpots = load_1b_c1_tpots_ms(DATA)
    assert len(tpots) >= 28
    model = engine_model(CAL, "llama-3.2-1b")
    floor_ms = model.step_time(decode_work(1, DECODE_ONLY_CONTEXT)).seconds * 1e3
    assert floor_ms == pytest.approx(statistics.median(tpots), rel=0.01)
    assert sum(abs(t / floor_ms - 1) <= 0.10 for t in tpots) >= 0.6 * len(tpots)
    assert max(tpots) / min(tpots) > 1.6


def test_the_1b_busy_loop_used_its_whole_cpu_in_every_c1_load_of_run_13() -> None:
    # The slow loads were not waiting: the EngineCore's main thread (the busy loop) ran flat out on
    # its vCPU in fast and slow c1 loads alike (TPOT 1.57-2.56 ms), so the same work ran at different
    # speeds. The loads that put another process on its vCPU on purpose (a-*) are left out.
    pid = int(re.search(r"enginecore=(\d+)", (DATA / "run13-pids.txt").read_text()).group(1))
    windows: dict[str, list[float]] = {}
    for line in (DATA / "run13-timeline.txt").read_text().splitlines():
        m = re.match(r"(start|loadgen) (\S+) .*epoch ([0-9.]+)", line)
        if m:
            windows.setdefault(m.group(2), []).append(float(m.group(3)))
    with gzip.open(DATA / "1b-tp1-r13-host-samples.jsonl.gz", "rt") as f:
        samples = [json.loads(line) for line in f]
    with gzip.open(DATA / "1b-tp1-r13-pinned-loads.json.gz", "rt") as f:
        configs = {n: load["config"] for n, load in json.load(f).items()}
    for path in DATA.glob("1b-tp1-loadgen-r13-*.json"):
        configs[path.name[len("1b-tp1-loadgen-r13-") : -len(".json")]] = json.loads(path.read_text())["config"]
    c1 = {n: w for n, w in windows.items() if configs.get(n, {}).get("concurrency") == 1 and not n.startswith("a-")}
    assert len(c1) >= 18
    for name, (start, end) in c1.items():
        use = [u for s in samples if start + 1.5 <= s["t"] <= end for tid, _n, _cpu, u in s["enginecore"] if tid == pid]
        assert len(use) >= 8, name
        assert statistics.fmean(use) >= 0.95, name


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
@pytest.mark.parametrize("interconnect", ["nvlink", "pcie"])
def test_the_cpu_floor_never_bounds_an_8b_step(tp: int, interconnect: str) -> None:
    # The floor only matters where the GPU's step is shorter than vLLM's CPU work: not the 8B's,
    # at any TP, so the 8B's calibration and the examples' decisions do not depend on it.
    model = engine_model(CAL, "llama-3-8b", tp, interconnect)
    for batch in (1, 8, 32, 64, 128):
        work = decode_work(batch, MEAN_DECODE_CONTEXT)
        assert model.gpu_step_time(work).seconds + model.host_seconds(work) > model.cpu_floor_seconds(work), batch


# Run 10: Llama-3.1-70B with online fp8 on one H200, traced (tests/data/vllm/README.md).
FP8_COMPS = load_fp8_compositions(DATA)


def test_the_70b_fp8_trace_is_within_5_percent() -> None:
    # Decode at 1 and 16 (weights streamed once a step) and whole 1,024- and 8,192-token prefills
    # (fp8 GEMMs at the fitted share of the datasheet rate).
    model = llama70b_fp8_h200_tp1(CAL)
    fitted = [c for c in FP8_COMPS if c.fitted]
    assert {c.label for c in fitted} >= {
        "decode 1",
        "decode 16",
        "prefill 8 seqs/8192 tok + decode 0",
        "prefill 1 seqs/1024 tok + decode 0",
    }
    for comp in fitted:
        assert model.gpu_step_time(comp.work()).seconds * 1e3 == pytest.approx(comp.median_ms, rel=0.05), comp.label


def test_a_held_out_architectures_steps_run_18b() -> None:
    # Qwen2.5-14B's shape (48 layers, hidden 5,120, 152,064-token vocabulary), traced with the operator's flags:
    # nothing was fitted to it. Every full 8,192-token prefill step (with 0-88 decodes beside) and the decode
    # step at 32 within 5 %; at 8 the model is 9.2 % under the trace, whose 9.70 ms step is itself above the
    # unprofiled load's whole TPOT at c8 (9.49 ms, run 18): the simulator's TPOT there is 3 % under.
    # Run 21 measured that step unprofiled (tests/unit/simulator/test_real_vllm_request_stages.py): 9.23 ms, the model
    # within 1.9 %: the trace's step is the profiler's.
    model = qwen14b_h200_tp1(CAL)
    comps = {c.label: c for c in load_held_out_14b_compositions(DATA) if c.fitted}
    big = [c for c in comps.values() if c.prefill_tokens >= 8000]
    assert len(big) >= 14
    for comp in [*big, comps["decode 32"]]:
        assert model.gpu_step_time(comp.work()).seconds * 1e3 == pytest.approx(comp.median_ms, rel=0.05), comp.label
    decode8 = comps["decode 8"]
    assert model.gpu_step_time(decode8.work()).seconds * 1e3 == pytest.approx(decode8.median_ms, rel=0.10)
    tpot_c8 = json.loads((DATA / "14b-tp1-loadgen-r18-c8.json").read_text())["summary"]["tpotMeanMs"]
    assert tpot_c8 < decode8.median_ms
    assert model.step_time(decode_work(8, MEAN_DECODE_CONTEXT)).seconds * 1e3 == pytest.approx(tpot_c8, rel=0.05)


def test_the_70b_fp8_lone_prefill_is_the_unprofiled_ttft_within_5_percent() -> None:
    model = llama70b_fp8_h200_tp1(CAL)
    work = prefill_work(PROMPT)
    ttft = (model.gpu_step_time(work).seconds + model.host_seconds(work) + Intake.of(CAL.serving).lone_seconds(PROMPT)) * 1e3
    assert ttft == pytest.approx(load_fp8_ttft_c1_ms(DATA), rel=0.05)


def test_the_shipped_fp8_efficiency_is_the_fit() -> None:
    fitted = fit_fp8_compute_efficiency(FP8_COMPS, load_fp8_ttft_c1_ms(DATA), CAL)
    assert fitted == pytest.approx(CAL.compute.fp8_compute_efficiency, rel=0.01)


def test_the_shipped_fp8_elementwise_bytes_and_efficiency_are_their_joint_fit() -> None:
    # Run 34's lone 8B fp8 prefills on an H100 (1,536-3,968 tokens) and the 70B fp8's steps on an H200 together: the
    # 70B alone cannot tell a faster GEMM from less elementwise work.
    lone = load_lone_prefill_ms(DATA, "8b-fp8-h100")
    ew, eff = fit_fp8_elementwise(lone, FP8_COMPS, load_fp8_ttft_c1_ms(DATA), CAL)
    assert ew == pytest.approx(CAL.compute.fp8_elementwise_bytes_per_token_width, rel=0.02)
    assert eff == pytest.approx(CAL.compute.fp8_compute_efficiency, rel=0.01)
    # Without the elementwise term the same fit leaves the 8B fp8's GPU-bound prefills 17-24 % short.
    flat = replace(CAL, compute=replace(CAL.compute, fp8_elementwise_bytes_per_token_width=0.0))
    flat = replace(
        flat, compute=replace(flat.compute, fp8_compute_efficiency=fit_fp8_compute_efficiency(FP8_COMPS, load_fp8_ttft_c1_ms(DATA), flat))
    )
    model = lone_prefill_model(flat, "8b-fp8-h100")
    for n in FP8_LONE_PREFILL_FIT_TOKENS:
        tokens, real = lone[n]
        assert -0.25 < model.step_time(prefill_work(tokens)).seconds * 1e3 / real - 1 < -0.15, n


def _prefill_kernels_ms(name: str) -> dict[str, float]:
    """The first prefill step's kernels in a run 34 profile, ms by kind: the linear layers' GEMMs, attention, the rest;
    and the step's GPU span ("span"), kernels and the gaps between them."""
    with gzip.open(DATA / name, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    step = next(e for e in events if e.get("cat") == "gpu_user_annotation" and e["name"].startswith("execute_context_1("))
    out = {"gemm": 0.0, "attention": 0.0, "rest": 0.0}
    for e in events:
        if e.get("cat") == "kernel" and step["ts"] <= e["ts"] < step["ts"] + step["dur"]:
            name = e["name"]
            kind = "gemm" if ("cutlass_3x_gemm" in name or name.startswith("nvjet")) else "attention" if "FlashAttn" in name else "rest"
            out[kind] += e["dur"] / 1e3
    return {**out, "span": step["dur"] / 1e3}


def test_fp8_makes_a_prefills_gemms_faster_and_the_rest_of_its_kernels_no_faster() -> None:
    # Run 34 (an H100), one lone 3,072-token prompt profiled on the 8B in fp8 and in bf16: the GEMMs 32.5 ms against
    # 54.8 (1.69x), attention 4.6 against 4.9, the other kernels (norms, SiLU, fp8's quantization, fused) 7.8 against
    # 6.3, and about 5 ms of gaps in each step (4.4 of fp8's in its first quarter: the inputs' preparation). The model
    # gives fp8 its GEMM rate on the linear layers only (`fp8_compute_efficiency`); attention runs at the bf16 rate and
    # the rest by its bytes (`fp8_elementwise_bytes_per_token_width`, fitted end to end, so it carries the gaps too).
    fp8 = _prefill_kernels_ms("8b-fp8-h100-tp1-profile-r34-p3072.pt.trace.json.gz")
    bf16 = _prefill_kernels_ms("8b-h100-tp1-profile-r34b-p3072.pt.trace.json.gz")
    assert 1.6 < bf16["gemm"] / fp8["gemm"] < 1.8
    assert fp8["attention"] == pytest.approx(bf16["attention"], rel=0.1)
    assert fp8["rest"] > bf16["rest"] and fp8["rest"] == pytest.approx(7.8, abs=0.2)
    for kernels in (fp8, bf16):
        assert 3.5 < kernels["span"] - kernels["gemm"] - kernels["attention"] - kernels["rest"] < 6.0
    # The model's step is the traced step's span within 5 %, its GEMMs the traced GEMMs within 10 %.
    work = prefill_work(3072)
    step = lone_prefill_model(CAL, "8b-fp8-h100").gpu_step_time(work).seconds * 1e3
    gemm_free = replace(CAL, compute=replace(CAL.compute, fp8_compute_efficiency=1e9))
    gemms = step - lone_prefill_model(gemm_free, "8b-fp8-h100").gpu_step_time(work).seconds * 1e3
    assert step == pytest.approx(fp8["span"], rel=0.05)
    assert gemms == pytest.approx(fp8["gemm"], rel=0.10)


def test_the_fp8_efficiency_moves_fp8_engines_only() -> None:
    slower = replace(CAL, compute=replace(CAL.compute, fp8_compute_efficiency=CAL.compute.fp8_compute_efficiency / 2))
    big = prefill_work(8192)
    assert llama8b_h200_tp1(slower).gpu_step_time(big) == MODEL.gpu_step_time(big)
    fast, slow = llama70b_fp8_h200_tp1(CAL).gpu_step_time(big).seconds, llama70b_fp8_h200_tp1(slower).gpu_step_time(big).seconds
    assert 1.6 * fast < slow < 2.0 * fast  # compute-bound: the GEMMs twice as long, attention and elementwise as long
    # nor do the elementwise bytes move a bf16 engine
    heavy = replace(CAL, compute=replace(CAL.compute, fp8_elementwise_bytes_per_token_width=100.0))
    assert llama8b_h200_tp1(heavy).gpu_step_time(big) == MODEL.gpu_step_time(big)
    # a GPU without fp8 tensor cores computes an fp8 checkpoint at its bf16 rate
    v100 = Hardware.from_gpu(get_gpu_type("v100-32gb"), "nvlink", fp8_compute=True)
    assert not v100.fp8_compute and v100.peak_tflops == get_gpu_type("v100-32gb").bf16_tflops


# Runs 12 and 12b: vLLM's linear kernels timed by rows on an H200, and the 8B with online fp8 served (held out).
def test_vllms_fp8_kernels_change_with_the_rows_and_bf16s_do_not() -> None:
    fp8, bf16 = load_gemm_rows(DATA), load_gemm_rows(DATA, "bf16")
    for shape in [("70b", 1), ("70b", 2), ("70b", 4), ("8b", 1)]:
        t, b = fp8[shape], bf16[shape]
        # cutlass_gemm_sm90_fp8_dispatch: one tile for 1-16 rows, another for 17-64, 64-128, above.
        assert t[32] > 1.2 * t[16] and t[65] > 1.3 * t[64] and t[129] > 2.0 * t[128] / 1.3
        assert t[64] < 1.15 * t[16]
        # cuBLAS's bf16 GEMMs: within about 20 % of their 1-row time up to 128 rows.
        assert max(b[m] for m in b if m <= 128) < 1.2 * b[1]
        # fp8 streams half the bytes: about half bf16's time while memory-bound.
        assert 0.4 < t[16] / b[16] < 0.6


def test_the_shipped_fp8_row_factors_are_the_fit() -> None:
    fitted = fit_gemm_row_factors(load_gemm_rows(DATA))
    assert [m for m, _ in fitted] == [m for m, _ in CAL.compute.fp8_gemm_row_factors]
    assert [f for _, f in fitted] == pytest.approx([f for _, f in CAL.compute.fp8_gemm_row_factors], abs=1e-3)
    assert fitted[0] == (16, 1.0) and max(f for _, f in fitted) > 2.0


def test_the_8b_fp8_decode_step_is_within_5_percent_of_run_12b() -> None:
    """Held out: nothing was fitted to the 8B fp8 engine. Its decode-dominated loads' inter-token latency P50
    against the model's decode step with host time, c8-c96 (c128's ITLs are the API server's chunks: its
    TPOT mean, 6.17 ms, is below its ITL P50). The activation quantization fitted on the 70B (80 layers of
    8,192) carries over to the 8B (32 of 4,096): without it every step is 2.7-8.4 % short."""
    model = engine_model(CAL, "llama-3-8b", dtype="fp8")
    flat = engine_model(replace(CAL, compute=replace(CAL.compute, fp8_gemm_row_factors=())), "llama-3-8b", dtype="fp8")
    unquantized = engine_model(
        replace(CAL, compute=replace(CAL.compute, fp8_activation_quant_ns_per_hidden=0.0)), "llama-3-8b", dtype="fp8"
    )
    itl = load_fp8_decode_itl_p50_ms(DATA)
    assert itl[24] > 1.2 * itl[16] and itl[48] < itl[24]  # real vLLM: slower at 24 sequences than at 48
    missed, short = [], []
    for conc, real in itl.items():
        if conc > 96:
            continue
        work = decode_work(conc, FP8_DECODE_CONTEXT)
        # 24 sequences: -5.3 % since the KV read is the kernel's and bf16's GEMM rows are in the fit (2026-12-07; -5.0 % before)
        assert model.step_time(work).seconds * 1e3 == pytest.approx(real, rel=0.055 if conc == 24 else 0.05), conc
        if abs(flat.step_time(work).seconds * 1e3 / real - 1) > 0.10:
            missed.append(conc)
        if unquantized.step_time(work).seconds * 1e3 < real:
            short.append(conc)
    assert missed == [24, 32]  # what the memory-bound model alone gets wrong (the tile for 17-64 rows)
    assert short == [c for c in itl if c <= 96]


# Run 30: the same kernels timed by rows on an H100 SXM; runs 28 and 29 served run 12b's loads on one.
def test_a_bad_fp8_tile_costs_the_h100_what_it_costs_the_h200_so_its_row_factors_are_smaller() -> None:
    h200, h100 = load_gemm_rows(DATA), load_gemm_rows(DATA, gpu="h100-sxm")
    for shape in [("8b", 1), ("70b", 1)]:
        fast, slow = h200[shape], h100[shape]
        # 1-16 rows stream the weights: the H100's slower memory (3.35 against 4.8 TB/s) shows
        assert all(1.25 < slow[m] / fast[m] < 1.45 for m in (1, 8, 16))
        # the first rows of each CUTLASS tile are bound by the tile, not the memory: the same SMs at the same clock
        assert all(0.9 < slow[m] / fast[m] < 1.1 for m in (17, 129, 136, 256))
    # hence the same extra time is a smaller share of the H100's: 1.10x at 24 rows against the H200's 1.38x
    assert h100[("8b", 1)][24] < 1.12 * h100[("8b", 1)][16]


def test_the_shipped_h100_row_factors_are_the_fit_and_only_the_h100_uses_them() -> None:
    fitted = fit_gemm_row_factors(load_gemm_rows(DATA, gpu="h100-sxm"))
    assert CAL.compute.fp8_row_factors_for("h100-sxm") == fitted
    assert CAL.compute.fp8_row_factors_for("h200") == CAL.compute.fp8_gemm_row_factors
    # a GPU type nobody timed takes the shared (H200) table
    assert CAL.compute.fp8_row_factors_for("h100-pcie") == CAL.compute.fp8_gemm_row_factors
    assert CAL.compute.fp8_row_factors_for(None) == CAL.compute.fp8_gemm_row_factors


def test_the_shipped_h100_bandwidth_scale_is_the_fit_and_brings_its_bf16_decode_within_3_percent() -> None:
    # Runs 28 and 29's 8B bf16 decode loads on two H100 machines (128-token prompts, 512 out, c1-c128). With the H200's
    # share of the datasheet bandwidth every step is 2.3-7.6 % long; the fit gives the H100 6 % more of its own
    # (4.5 % before bf16's GEMM rows, which lengthen its 64- and 128-sequence steps, were in the model).
    takes = load_h100_decode_itl_p50_ms(DATA)
    assert sorted(takes) == sorted(H100_DECODE_CONCURRENCIES) and all(len(t) == 2 for t in takes.values())
    assert fit_bandwidth_scale(takes, CAL) == pytest.approx(CAL.compute.bandwidth_scale_for("h100-sxm"), rel=0.002)
    assert 1.03 < CAL.compute.bandwidth_scale_for("h100-sxm") < 1.07
    unscaled = with_bandwidth_scale(CAL, "h100-sxm", 1.0)
    for cal, lo, hi in ((CAL, -0.03, 0.03), (unscaled, 0.02, 0.08)):
        model = engine_model(cal, "llama-3-8b", gpu_name="h100-sxm")
        for conc, reals in takes.items():
            for real in reals:
                assert lo < model.step_time(decode_work(conc, DECODE_ONLY_CONTEXT)).seconds * 1e3 / real - 1 < hi, (conc, real)
    # the H200's steps do not move
    work = decode_work(32, MEAN_DECODE_CONTEXT)
    assert engine_model(CAL, "llama-3-8b").step_time(work) == engine_model(unscaled, "llama-3-8b").step_time(work)


def test_the_8b_fp8_decode_step_on_an_h100_is_within_3_percent_of_one_of_runs_28_and_29() -> None:
    """Held out: no fp8 serving capture on an H100 was fitted (the H100's bandwidth was, on bf16's loads). With the
    H200's row factors the 24- and 32-sequence steps come out 11-14 % long on both takes (15-18 % before the H100's
    bandwidth); its own (run 30) bring every concurrency within 2.7 % of one take, and within 3.6 % of both but at
    128 sequences, where the two takes lie 9 % apart (7.57 and 6.91 ms) and the model is 1.0 and 9.6 % under them."""
    own = engine_model(CAL, "llama-3-8b", dtype="fp8", gpu_name="h100-sxm")
    shared = replace(CAL, compute=replace(CAL.compute, fp8_gemm_row_factors_by_gpu=()))
    h200s = engine_model(shared, "llama-3-8b", dtype="fp8", gpu_name="h100-sxm")
    takes = load_fp8_h100_decode_itl_p50_ms(DATA)
    assert sorted(takes) == sorted(FP8_DECODE_FILES) and all(len(t) == 2 for t in takes.values())
    # real vLLM on the H100: 16 -> 24 sequences adds about 0.5 ms a step (the H200's run 12b: 1.05 ms)
    assert min(takes[24]) - max(takes[16]) > 0.3 and max(takes[24]) - min(takes[16]) < 0.7
    long = []
    for conc, reals in takes.items():
        work = decode_work(conc, FP8_DECODE_CONTEXT)
        step = own.step_time(work).seconds * 1e3
        assert min(abs(step / real - 1) for real in reals) < 0.027, conc
        assert max(abs(step / real - 1) for real in reals) < (0.10 if conc == 128 else 0.04), conc
        long += [conc for real in reals if h200s.step_time(work).seconds * 1e3 > 1.10 * real]
    assert sorted(set(long)) == [24, 32]


def _traced_steps_ms(name: str) -> tuple[dict[str, float], float]:
    """Run 37's profiled slice as `kit-scripts/kernels_by_step.py` printed it: (its first step, the wave's prefill,
    as {"span", "seqs", "tokens"}; the mean GPU span of the decode steps after it), ms."""
    rows = [line.split() for line in (DATA / name).read_text().splitlines()[1:]]
    wave = next(r for r in rows if int(r[6]))
    decode = [float(r[1]) / 1e3 for r in rows if not int(r[6])]
    return {"span": float(wave[1]) / 1e3, "seqs": int(wave[6]), "tokens": int(wave[7])}, statistics.fmean(decode)


# Run 37: the 8B and the 8B fp8 profiled under closed loops of 128-token prompts on an H100 (kit-scripts/exp-wave-profile.sh).
def test_on_an_h100_the_models_decode_step_is_the_traced_one_and_a_waves_prefill_5_to_10_percent_longer() -> None:
    # Each slice's first step prefills a whole wave of 24 or 48 prompts of 128 tokens (3,072 or 6,144 tokens; unprofiled,
    # vLLM takes such a wave in three steps), then 63 decode steps of the same sequences (contexts of 129-192 tokens).
    # Held out from the H100's bandwidth fit: its decode steps within -1.5 to +2.4 % of the traced spans (3.8-8.2 % long
    # before it, 0.4-4.8 % before the kernel's KV read); the wave's prefill, which the SMs bound, 5.0-10.1 % long
    # (tests/data/vllm/README.md, "Run 37").
    for engine, dtype, run in (("8b-fp8-h100-tp1", "fp8", "r37"), ("8b-h100-tp1", "bfloat16", "r37b")):
        model = engine_model(CAL, "llama-3-8b", dtype=dtype, gpu_name="h100-sxm")
        decodes = {}
        for conc in (24, 48):
            wave, decode = _traced_steps_ms(f"{engine}-kernels-{run}-c{conc}.txt")
            decodes[conc] = decode
            assert (wave["seqs"], wave["tokens"]) == (conc, 128 * conc)
            work = StepWork(prefill_tokens=128 * conc, prefill_attention_pairs=conc * 128 * 129 / 2, prefill_seqs=conc, sampled_seqs=conc)
            assert 1.04 < model.gpu_step_time(work).seconds * 1e3 / wave["span"] < 1.12, (engine, conc)
            assert 0.98 < model.gpu_step_time(decode_work(conc, 160)).seconds * 1e3 / decode < 1.03, (engine, conc)
        # real vLLM's fp8 decode step does not grow from 24 to 48 sequences on the H100 (its 17-64-row tile), bf16's does
        growth = decodes[48] / decodes[24]
        assert (growth < 1.01) if dtype == "fp8" else (1.04 < growth < 1.1)


# Run 31: Qwen2.5-14B's shape with online fp8 on an H100, a model, dtype and GPU together that no fit saw.
def test_a_third_shape_follows_the_h100_row_factors_fitted_on_two_others() -> None:
    fourteen = load_gemm_rows(DATA, gpu="h100-sxm")[("14b", 1)]
    base = statistics.mean(us for m, us in fourteen.items() if m <= 16)
    for m, factor in CAL.compute.fp8_row_factors_for("h100-sxm"):
        assert fourteen[m] / base == pytest.approx(factor, rel=0.05), m
    # and not the H200's (1.38x at 24 rows)
    assert fourteen[24] / base < 1.15 and dict(CAL.compute.fp8_gemm_row_factors)[24] > 1.3


def test_the_14b_fp8_decode_step_on_an_h100_is_within_5_percent_of_run_31() -> None:
    own = engine_model(CAL, "qwen2.5-14b", dtype="fp8", gpu_name="h100-sxm")
    shared = replace(CAL, compute=replace(CAL.compute, fp8_gemm_row_factors_by_gpu=()))
    h200s = engine_model(shared, "qwen2.5-14b", dtype="fp8", gpu_name="h100-sxm")
    takes = load_fp8_h100_decode_itl_p50_ms(DATA, "qwen2.5-14b")
    assert sorted(takes) == sorted(FP8_DECODE_FILES)
    long = []
    for conc, (real,) in takes.items():
        work = decode_work(conc, FP8_DECODE_CONTEXT)
        assert own.step_time(work).seconds * 1e3 == pytest.approx(real, rel=0.05), conc
        if h200s.step_time(work).seconds * 1e3 > 1.10 * real:
            long.append(conc)
    assert sorted(long) == [24]  # with the H200's table: 11.2 % long at 24 sequences, 10.0 % at 32 (run 30's tile)


def test_the_shipped_fp8_activation_quant_is_the_fit_and_moves_dense_fp8_engines_only() -> None:
    tpot = load_fp8_tpot_c1_ms(DATA)
    assert 20.5 < tpot < 20.7  # runs 5, 6 and 10: 20.79, 20.57, 20.58 ms
    assert fit_fp8_activation_quant(tpot, CAL) == pytest.approx(CAL.compute.fp8_activation_quant_ns_per_hidden, rel=0.01)
    model = llama70b_fp8_h200_tp1(CAL)
    assert model.step_time(decode_work(1, MEAN_DECODE_CONTEXT)).seconds * 1e3 == pytest.approx(tpot, rel=0.005)
    # 80 layers of 8,192: about 0.7 ms a step, what run 10's trace shows the fused quantizing kernels add
    # (28 µs a layer against the 8B bf16's 8 µs of norm and SiLU kernels); 0.8 ms before the kernel's KV read
    none = replace(CAL, compute=replace(CAL.compute, fp8_activation_quant_ns_per_hidden=0.0))
    step = decode_work(1, MEAN_DECODE_CONTEXT)
    added = model.gpu_step_time(step).seconds - llama70b_fp8_h200_tp1(none).gpu_step_time(step).seconds
    assert 0.6e-3 < added < 0.9e-3
    # bf16 engines do not quantize
    assert engine_model(CAL, "llama-3-8b").gpu_step_time(step).seconds == engine_model(none, "llama-3-8b").gpu_step_time(step).seconds


def test_the_fit_writes_a_calibration_elsewhere_that_the_simulator_serves_with(tmp_path, capsys) -> None:
    # `--write --output FILE` refits from the shipped file and leaves it as it was; `kneepoint sim --calibration FILE`
    # (load_calibration(FILE)) then reads what was written.
    from importlib import resources

    from kneepoint.simulator import calibration_vllm
    from kneepoint.simulator.calibration import CALIBRATION_FILE

    shipped = Path(str(resources.files("kneepoint.data").joinpath(CALIBRATION_FILE)))
    before = shipped.read_bytes()
    out = tmp_path / "refit.json"
    assert calibration_vllm.main([str(DATA), "--write", "--output", str(out)]) == 0
    assert shipped.read_bytes() == before
    assert f"wrote {out}" in capsys.readouterr().out
    written = load_calibration(out)
    assert written.compute.weight_bandwidth_efficiency == pytest.approx(CAL.compute.weight_bandwidth_efficiency, rel=0.01)
    assert (written.links, written.serving.api_gate_us_per_request) == (CAL.links, CAL.serving.api_gate_us_per_request)  # not fitted here
    with pytest.raises(SystemExit):
        calibration_vllm.main([str(DATA), "--output", str(out)])  # --output without --write
    assert "--output: only with --write" in capsys.readouterr().err


def test_the_shipped_bf16_row_factors_are_the_fit_and_only_dense_16_bit_engines_use_them() -> None:
    # cuBLAS's bf16 GEMMs by rows (runs 12, 12b; 30-32 on the H100), made non-decreasing: 1.12x their 1-16-row time at
    # 128 rows on the H200, 1.08x on the H100, where the roofline alone keeps a decode step's weights at their
    # streaming time until the FLOPs bind (about 170 rows on the H200).
    for gpu in ("h200", "h100-sxm"):
        fitted = fit_gemm_row_factors(load_gemm_rows(DATA, "bf16", gpu), rising=True)
        assert CAL.compute.bf16_row_factors_for(gpu) == fitted
        assert all(b[1] >= a[1] for a, b in zip(fitted, fitted[1:], strict=False))
    assert dict(CAL.compute.bf16_row_factors_for("h200"))[128] == pytest.approx(1.12, abs=0.005)
    assert dict(CAL.compute.bf16_row_factors_for("h100-sxm"))[128] == pytest.approx(1.08, abs=0.005)
    assert CAL.compute.bf16_row_factors_for("a100-80gb") == CAL.compute.bf16_gemm_row_factors  # no table of its own
    flat = replace(CAL, compute=replace(CAL.compute, bf16_gemm_row_factors=(), bf16_gemm_row_factors_by_gpu=()))
    work = decode_work(128, 144)
    for dtype, moves in (("bfloat16", True), ("fp8", False)):
        with_rows = engine_model(CAL, "llama-3-8b", dtype=dtype).gpu_step_time(work).seconds
        without = engine_model(flat, "llama-3-8b", dtype=dtype).gpu_step_time(work).seconds
        # the 8B's 16 GB of linear weights, 12 % longer at 128 rows: about 0.45 ms of its step
        assert (0.3e-3 < with_rows - without < 0.6e-3) if moves else with_rows == without, dtype
    # a step of one sequence more never takes less time (the table rises), whatever the rows
    model = engine_model(CAL, "llama-3-8b")
    steps = [model.gpu_step_time(decode_work(n, 512)).seconds for n in range(1, 257)]
    assert all(b >= a for a, b in zip(steps, steps[1:], strict=False))
