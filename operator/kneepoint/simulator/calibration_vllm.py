"""Fit the simulator's single-GPU constants to real vLLM serving, and compare the two.

Real vLLM 0.24.0 on one H200 is the primary ground truth (``tests/data/vllm``; its README
says how every file was taken):

- **step times by composition**: the GPU span of every engine step, read from vLLM's
  torch-profiler traces, whose ``execute_context_<n>(<tokens>)_generation_<n>(<n>)``
  annotation names what the step computed (prefill chunks, decoding sequences);
- **the serving loop's host time**: inter-token latency P50 of the project's load generator
  (profiler off) minus the modelled GPU step of the same batch;
- **time to first token at concurrency 1**: the API server's intake of one 1024-token prompt and
  its prefill (with the intake below, the prefill needs no cost beyond its roofline: a constant
  for steps too large for vLLM's CUDA graphs was tried and fitted to zero);
- **the API server's intake per prompt token** (``serving.apiUsPerPromptToken``, 8 µs): not
  fitted here, since only a replay shows it. Requests reach vLLM's engine one after another, so a
  burst of prompts is prefilled later and in fewer, larger steps than it arrived; replaying the
  c32 and long-prompt captures in the simulator with 8 µs per token gives their TTFT P50 and
  TPOT within a few per cent (0 µs: TTFT P50 -41 % and -52 %, TPOT +9 % and +18 %; 12 µs: no
  better at c32);
- **its serial part** (``serving.apiSerialUsPerPromptToken``): not fitted here either; bounded
  by run 3's per-request bursts and chosen on the virtual-clock replay (``simulator.intake``,
  ``tests/unit/simulator/test_sim_intake.py``, docs/simulator.md "The intake").

The fit: Nelder-Mead (the dependency-free one of :mod:`calibration_fit`) on log(simulated /
measured) over the compositions, for the compute constants; then the host constants by least
squares. The collectives keep their fit to the PyTorch + NCCL
measurements (``tests/data/h200``), which remain the data for how TP scales: no multi-GPU
vLLM capture exists yet. ``python -m kneepoint.simulator.calibration_vllm tests/data/vllm
--write`` refits and rewrites ``kneepoint/data/simulator_calibration.json``; without
``--write`` it prints the comparison table that docs/simulator.md shows.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import statistics
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from kneepoint.core.architectures import get_preset
from kneepoint.core.gpus import get_gpu_type
from kneepoint.core.memory_estimate import estimate_memory
from kneepoint.core.tiers import Tier
from kneepoint.simulator.calibration import (
    CALIBRATION_FILE,
    Calibration,
    calibration_from_json,
    calibration_to_json,
    load_calibration,
)
from kneepoint.simulator.calibration_fit import MeasuredPoint, load_points, nelder_mead, predict
from kneepoint.simulator.intake import Intake
from kneepoint.simulator.perf_model import (
    Deployment,
    Hardware,
    PerfModel,
    StepWork,
    decode_work,
    default_cuda_graph_max_tokens,
    prefill_work,
    shape_from_architecture,
)

# The traces: (file, what they hold). Run 1's c32 trace served prompts that vLLM's prefix cache
# had seen (run 1 reused one seed), so only its decode-only steps are kept.
STEP_FILES = (
    ("8b-tp1-steps-c32-first.txt", "all"),
    ("8b-tp1-steps-c8.txt", "all"),
    ("8b-tp1-steps-c32.txt", "decode"),
    ("8b-tp1-steps-c128.txt", "all"),
)
FP8_STEP_FILES = (("70b-fp8-tp1-steps-r10-c1.txt", "all"), ("70b-fp8-tp1-steps-r10-c16a.txt", "all"))
"""Run 10's traces of Llama-3.1-70B with online fp8 on one H200 (the large-model example's flags,
``--max-num-seqs 64``): a lone 1,024-token prefill, decode at 1 and 16, and whole 8,192-token
prefill steps."""
HELD_OUT_14B_STEP_FILES = tuple((f"14b-tp1-steps-r18b-{n}.txt", "all") for n in ("c8p", "c32p", "c128p"))
"""Run 18b's traces of Qwen2.5-14B's shape in bf16 on one H200 (the operator's flags): held out, no fit reads them."""
FP8_TTFT_FILES = ("70b-fp8-tp1-loadgen-c1.json", "70b-fp8-tp1-loadgen-r6-c1b.json", "70b-fp8-tp1-loadgen-r10-c1.json")
FP8_PRESET, FP8_MAX_NUM_SEQS = "llama-3-70b", 64
MAX_NUM_SEQS = 128  # run 1's engine (the first trace's was 32: its steps fit either graph list alike)
PROMPT, OUTPUT = 1024, 256  # the traced workloads
MEAN_DECODE_CONTEXT = PROMPT + OUTPUT // 2 + 1
"""A decoding sequence's mean context in a steady 1024-in / 256-out load."""
ITL_FILES = {
    1: "8b-tp1-loadgen-c1.json",
    4: "8b-tp1-loadgen-c4.json",
    8: "8b-tp1-loadgen-c8.json",
    16: "8b-tp1-loadgen-c16.json",
    32: "8b-tp1-loadgen-c32-noprof.json",
}
TTFT_FILES = ("8b-tp1-loadgen-c1.json", "8b-tp1-loadgen-r3-c1.json")
TTFT_BY_LENGTH_FILE = "8b-tp1-c1-ttft-by-length.json.gz"
DECODE_ONLY_FILES = {
    1: "8b-tp1-loadgen-r6-d-c1.json",
    16: "8b-tp1-loadgen-r6-d-c16.json",
    64: "8b-tp1-loadgen-r6-d-c64.json",
}
"""Run 6's decode-dominated loads (128-token prompts, 512-token replies): the decode step at a short
context, which the traces (all at about 1,150 tokens) cannot separate from the KV read."""
DECODE_ONLY_CONTEXT = 128 + 512 // 2 + 1
CPU_FLOOR_FILES = {
    1: "1b-tp1-loadgen-r6-d-c1.json",
    4: "1b-tp1-loadgen-r6-d-c4.json",
    16: "1b-tp1-loadgen-r6-d-c16.json",
    64: "1b-tp1-loadgen-r6-d-c64.json",
}
"""Run 6's decode-dominated loads on the 1B, whose GPU step (1.0 ms of kernels at c1, traced) is
shorter than vLLM's CPU work per step: their inter-token latency is that CPU time. They give the
floor's shape (how it grows per sequence); they ran at the fastest speed the device's host showed,
so the level comes from :func:`load_1b_c1_tpots_ms` (docs/simulator.md, "The host's CPU speed")."""
HOST_SPEED_REFERENCES = "1b-tp1-r14-host-references.json.gz"
"""Run 14's c1 reference loads of the 1B (128/512, 3 requests each), one before every load of that run."""
_ANNOTATION = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")


PROFILER_BOUND_TOKENS = 2048
"""A non-graph step below this many tokens is launch-bound under the profiler: the trace's one
1024-token prefill spans 39.5 ms where the whole time to first token without the profiler is
32 ms. Such steps are shown and not fitted; the unprofiled TTFT stands for them."""


@dataclass(frozen=True)
class StepComposition:
    """One step composition of the real traces and its median GPU time."""

    prefill_seqs: int
    prefill_tokens: int
    decode_seqs: int
    count: int
    median_ms: float
    bound_tokens: int = PROFILER_BOUND_TOKENS
    """Below this many tokens a step with a prefill chunk is launch-bound under the profiler (the
    engine's; the 8B's 2,048)."""

    @property
    def fitted(self) -> bool:
        tokens = self.prefill_tokens + self.decode_seqs
        return not (self.prefill_seqs and tokens < self.bound_tokens)

    @property
    def label(self) -> str:
        if not self.prefill_seqs:
            return f"decode {self.decode_seqs}"
        return f"prefill {self.prefill_seqs} seqs/{self.prefill_tokens} tok + decode {self.decode_seqs}"

    def work(self) -> StepWork:
        """What the step computed: prompt chunks of equal share, each attending to itself only."""
        n, t, g = self.prefill_seqs, self.prefill_tokens, self.decode_seqs
        pairs = n * (t / n) * (t / n + 1) / 2 if n else 0.0
        return StepWork(
            decode_seqs=g,
            decode_context_tokens=g * MEAN_DECODE_CONTEXT,
            prefill_tokens=t,
            prefill_attention_pairs=pairs,
            prefill_seqs=n,
            sampled_seqs=g + n,
        )


def parse_annotation(name: str) -> tuple[int, int, int] | None:
    """(prefill seqs, prefill tokens, decode seqs) of a vLLM step annotation; None for other names."""
    m = _ANNOTATION.fullmatch(name)
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))) if m else None


def load_compositions(
    data_dir: Path, files: tuple[tuple[str, str], ...] = STEP_FILES, bound_tokens: int = PROFILER_BOUND_TOKENS
) -> list[StepComposition]:
    """Median GPU time of every step composition in the traces' step tables (the 8B's by default)."""
    pooled: dict[tuple[int, int, int], list[float]] = {}
    for name, keep in files:
        lines = (data_dir / name).read_text().splitlines()
        for line in lines[1:]:
            _start, dur_us, _period, ctx_seqs, ctx_tokens, gen_seqs, _gen_tokens = line.split()
            key = (int(ctx_seqs), int(ctx_tokens), int(gen_seqs))
            if keep == "decode" and key[0]:
                continue
            pooled.setdefault(key, []).append(float(dur_us) / 1e3)
    return [StepComposition(k[0], k[1], k[2], len(v), statistics.median(v), bound_tokens) for k, v in sorted(pooled.items())]


def load_fp8_compositions(data_dir: Path) -> list[StepComposition]:
    """Run 10's 70B fp8 step table. Its lone 1,024-token prefill is GPU-bound (117.7 ms traced, 127-137 ms
    to the first token unprofiled); a step with a few prompt tokens beside the decodes is not a CUDA
    graph and takes the 80 layers' launch time (31 ms traced against a 21 ms decode step)."""
    return load_compositions(data_dir, FP8_STEP_FILES, bound_tokens=PROMPT)


def load_held_out_14b_compositions(data_dir: Path) -> list[StepComposition]:
    """Run 18b's step tables of the 14B (its first, profiler-inflated lone prefill left unfitted as the 8B's)."""
    return load_compositions(data_dir, HELD_OUT_14B_STEP_FILES)


def qwen14b_h200_tp1(cal: Calibration) -> PerfModel:
    """The perf model of run 18's engine: Qwen2.5-14B's shape, bf16, one H200, as ``kneepoint sim`` sizes it."""
    return engine_model(cal, "qwen2.5-14b")


def _kept_repeat(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["repeats"][int(doc["summary"].get("keptRepeat", 0))]


def _itl_p50_ms(data_dir: Path, files: dict[int, str]) -> dict[int, float]:
    """Inter-token latency P50 (ms) of each capture's kept repeat, by concurrency."""
    return {c: float(_kept_repeat(json.loads((data_dir / f).read_text()))["itlMs"]["p50"]) for c, f in files.items()}


def load_itl_p50_ms(data_dir: Path) -> dict[int, float]:
    """Inter-token latency P50 (ms) by concurrency, profiler off."""
    return _itl_p50_ms(data_dir, ITL_FILES)


def load_decode_only_itl_p50_ms(data_dir: Path) -> dict[int, float]:
    """Run 6's inter-token latency P50 (ms) by concurrency at a short context."""
    return _itl_p50_ms(data_dir, DECODE_ONLY_FILES)


def load_cpu_floor_itl_p50_ms(data_dir: Path) -> dict[int, float]:
    """The 1B's inter-token latency P50 (ms) by concurrency: vLLM's CPU time per step."""
    return _itl_p50_ms(data_dir, CPU_FLOOR_FILES)


FP8_DECODE_FILES = {c: f"8b-fp8-tp1-loadgen-r12-d-c{c}.json" for c in (8, 16, 24, 32, 40, 48, 64, 96, 128)}
"""Run 12b's decode-dominated loads (128-token prompts, 256-token replies) on the 8B with online fp8: held out from
every fit, they check :data:`GEMM_ROW_FILES`' kernel times in serving (TPOT 3.58 ms at c16, 4.63 at c24, 4.39 at c48)."""
FP8_DECODE_CONTEXT = 128 + 256 // 2 + 1


def load_fp8_decode_itl_p50_ms(data_dir: Path) -> dict[int, float]:
    """Run 12b's inter-token latency P50 (ms) on the 8B fp8 by concurrency."""
    return _itl_p50_ms(data_dir, FP8_DECODE_FILES)


FP8_H100_DECODE_RUNS = {
    "llama-3-8b": ("8b-fp8-h100-tp1", ("r28", "r29")),
    "qwen2.5-14b": ("14b-fp8-h100-tp1", ("r31",)),
}
"""Run 12b's decode-dominated loads on an H100 SXM with online fp8, by architecture preset: (capture prefix, runs).
Runs 28 and 29 took them twice on the 8B; run 31 once on Qwen2.5-14B's shape (held out: model and GPU)."""


def _takes_itl_p50_ms(data_dir: Path, prefix: str, runs: tuple[str, ...], concurrencies: Iterable[int]) -> dict[int, list[float]]:
    """The inter-token latency P50 (ms) of ``<prefix>-loadgen-<run>-d-c<n>.json`` by concurrency n: each run's take."""
    takes: dict[int, list[float]] = {}
    for run in runs:
        files = {c: f"{prefix}-loadgen-{run}-d-c{c}.json" for c in concurrencies}
        for c, itl in _itl_p50_ms(data_dir, files).items():
            takes.setdefault(c, []).append(itl)
    return takes


def load_fp8_h100_decode_itl_p50_ms(data_dir: Path, preset: str = "llama-3-8b") -> dict[int, list[float]]:
    """The inter-token latency P50 (ms) of :data:`FP8_H100_DECODE_RUNS`' loads of ``preset``, by concurrency: each take's."""
    prefix, runs = FP8_H100_DECODE_RUNS[preset]
    return _takes_itl_p50_ms(data_dir, prefix, runs, FP8_DECODE_FILES)


H100_DECODE_RUNS = ("r28", "r29")
H100_DECODE_CONCURRENCIES = (1, 16, 64, 128)
"""The 8B's decode-dominated loads in bf16 on an H100 SXM (``8b-h100-tp1-loadgen-<run>-d-c<n>.json``: 128-token
prompts, 512-token replies, as run 6's on the H200), taken on two machines (runs 28 and 29): what
:func:`fit_bandwidth_scale` fits the H100's memory to. Held out from it: the fp8 loads of
:data:`FP8_H100_DECODE_RUNS`, the H100 lone prefills and run 37's traced steps."""
BANDWIDTH_SCALE_GPU = "h100-sxm"


def load_h100_decode_itl_p50_ms(data_dir: Path) -> dict[int, list[float]]:
    """The inter-token latency P50 (ms) of the loads of :data:`H100_DECODE_CONCURRENCIES` by concurrency: each take's
    (runs 28, 29)."""
    return _takes_itl_p50_ms(data_dir, "8b-h100-tp1", H100_DECODE_RUNS, H100_DECODE_CONCURRENCIES)


def with_bandwidth_scale(cal: Calibration, gpu: str, scale: float) -> Calibration:
    """``cal`` with ``gpu``'s factor on both bandwidth efficiencies set to ``scale`` (the other GPU types' kept)."""
    scales = dict(cal.compute.bandwidth_scale_by_gpu) | {gpu: scale}
    return replace(cal, compute=replace(cal.compute, bandwidth_scale_by_gpu=tuple(sorted(scales.items()))))


def fit_bandwidth_scale(takes: dict[int, list[float]], cal: Calibration, gpu: str = BANDWIDTH_SCALE_GPU) -> float:
    """``compute.bandwidthScaleByGpu[gpu]``: a golden-section search over 0.8-1.2 on the squared log error of the
    8B's bf16 decode step + host (the host constants as fitted on the H200) against every take of ``takes``, at
    :data:`DECODE_ONLY_CONTEXT`. Only the memory moves: the H100 has the H200's SMs at the H200's clock."""

    def loss(scale: float) -> float:
        model = engine_model(with_bandwidth_scale(cal, gpu, scale), "llama-3-8b", gpu_name=gpu)
        return sum(
            math.log(model.step_time(decode_work(c, DECODE_ONLY_CONTEXT)).seconds * 1e3 / itl) ** 2
            for c, itls in takes.items()
            for itl in itls
        )

    return golden_section(loss, 0.8, 1.2, steps=40)


def _line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through the points, the slope held at >= 0."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = max(sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs), 0.0)
    return my - slope * mx, slope


def load_1b_c1_tpots_ms(data_dir: Path) -> list[float]:
    """TPOT (ms) of every unpinned, unprofiled c1 load of the 1B: the captures of runs 5, 6 and 13
    and run 14's references. The 1B's c1 step is vLLM's CPU time, so these sample the host's speed."""
    values = []
    for path in sorted(data_dir.glob("1b-tp1-loadgen-*.json")):
        doc = json.loads(path.read_text())
        if doc["config"]["concurrency"] == 1:
            values.append(float(doc["summary"]["tpotMeanMs"]))
    with gzip.open(data_dir / HOST_SPEED_REFERENCES, "rt") as f:
        values += [float(load["summary"]["tpotMeanMs"]) for load in json.load(f).values()]
    return values


def fit_cpu_floor(itl_p50: dict[int, float], c1_tpots_ms: list[float] | None = None) -> tuple[float, float]:
    """(us per step, us per sequence) of vLLM's CPU time per step: least squares on ITL P50 by concurrency,
    then, given the host's c1 samples, scaled so that the floor of one sequence is their median (the CPU
    work per step and per sequence both run at the host's speed)."""
    step, seq = _line([float(c) for c in itl_p50], [v * 1e3 for v in itl_p50.values()])
    if c1_tpots_ms:
        scale = statistics.median(c1_tpots_ms) * 1e3 / (step + seq)
        step, seq = step * scale, seq * scale
    return step, seq


def load_ttft_c1_ms(data_dir: Path) -> float:
    """Real vLLM's TTFT P50 of a lone 1,024-token prompt: the median over every c1 load of it (runs
    2 and 3, and run 7's three, whose engine ran in a slower state of the device's host: 33.9-39.2
    ms against 32.0)."""
    values = [float(json.loads((data_dir / name).read_text())["summary"]["ttftP50Ms"]) for name in TTFT_FILES]
    with gzip.open(data_dir / TTFT_BY_LENGTH_FILE, "rt") as f:
        loads = json.load(f)["loads"]
    values += [float(load["summary"]["ttftP50Ms"]) for load in loads.values() if load["config"]["inputLen"] == PROMPT]
    return statistics.median(values)


def llama8b_h200_tp1(cal: Calibration, max_num_seqs: int = MAX_NUM_SEQS) -> PerfModel:
    """The perf model of the captures' engine: Llama-3.1-8B, bf16, one H200, as ``kneepoint sim`` sizes it."""
    return engine_model(cal, "llama-3-8b", max_num_seqs=max_num_seqs)


def engine_model(
    cal: Calibration,
    preset: str,
    tp: int = 1,
    interconnect: str = "nvlink",
    max_num_seqs: int = MAX_NUM_SEQS,
    dtype: str = "bfloat16",
    gpu_name: str = "h200",
) -> PerfModel:
    """The perf model of ``preset`` in ``dtype`` (bfloat16 or fp8) on ``tp`` GPUs of catalogue type ``gpu_name``
    (the captures' H200 unless told), as ``kneepoint sim`` sizes it."""
    arch, gpu = get_preset(preset), get_gpu_type(gpu_name)
    est = estimate_memory(
        arch,
        gpu,
        Tier(tp, 1),
        dtype=dtype,
        max_model_len=4096,
        concurrency=max_num_seqs,
        context_len=4096,
        gpu_memory_utilization=0.9,
        max_num_seqs=max_num_seqs,
        interconnect=interconnect,
    )
    deployment = Deployment(
        tensor_parallel=tp,
        pipeline_parallel=1,
        weight_bytes_per_gpu=est.weights_bytes_per_gpu,
        kv_bytes_per_token_per_gpu=est.kv_bytes_per_token_per_gpu,
        weight_dtype=dtype,
        cuda_graph_max_tokens=default_cuda_graph_max_tokens(max_num_seqs),
    )
    hardware = Hardware.from_gpu(gpu, interconnect, fp8_compute=dtype == "fp8")
    return PerfModel(shape_from_architecture(arch), hardware, deployment, cal)


def llama70b_fp8_h200_tp1(cal: Calibration) -> PerfModel:
    """Run 10's engine: Llama-3.1-70B with online fp8 on one H200, as ``kneepoint sim`` sizes it."""
    return engine_model(cal, FP8_PRESET, max_num_seqs=FP8_MAX_NUM_SEQS, dtype="fp8")


def _fp8_c1_median_ms(data_dir: Path, figure: str) -> float:
    """One summary figure of the 70B fp8's lone 1,024/256 loads (runs 5, 6 and 10): their median."""
    return statistics.median(float(json.loads((data_dir / name).read_text())["summary"][figure]) for name in FP8_TTFT_FILES)


def load_fp8_ttft_c1_ms(data_dir: Path) -> float:
    """Real vLLM's TTFT P50 of a lone 1,024-token prompt on the 70B fp8: the median of runs 5, 6 and 10."""
    return _fp8_c1_median_ms(data_dir, "ttftP50Ms")


LONE_PREFILL_RUNS = {
    "8b-fp8-h100": ("8b-fp8-h100-tp1-r34-stages.json.gz", "llama-3-8b", "fp8", "h100-sxm"),
    "8b-h100": ("8b-h100-tp1-r34b-stages.json.gz", "llama-3-8b", "bfloat16", "h100-sxm"),
    "1b-h100": ("1b-h100-tp1-r34c-stages.json.gz", "llama-3.2-1b", "bfloat16", "h100-sxm"),
    "14b-fp8-h100": ("14b-fp8-h100-tp1-r35-stages.json.gz", "qwen2.5-14b", "fp8", "h100-sxm"),
    "14b-h100": ("14b-h100-tp1-r35b-stages.json.gz", "qwen2.5-14b", "bfloat16", "h100-sxm"),
}
"""Runs 34 and 35's stamped lone prompts of 256 to 3,968 tokens on one H100 (kit-scripts/exp-lone-lengths.sh; run 35:
Qwen2.5-14B's shape, held out): archive, architecture preset, dtype and GPU catalogue name of each engine."""
FP8_LONE_PREFILL_FIT_TOKENS = (1536, 2048, 3072, 3968)
"""The 8B fp8's lone prompts whose step the GPU bounds: below them the engine thread's launch of a step above the
CUDA graphs (about 17 ms on run 34's host) outlasts the GPU's work."""


def load_lone_prefill_ms(data_dir: Path, run: str) -> dict[int, tuple[int, float]]:
    """{prompt tokens: (the step's scheduled tokens, median ms from its plan to the prompt's first token)} of one of
    :data:`LONE_PREFILL_RUNS`: for each lone request of load ``p<N>``, from the ``Scheduler.schedule`` stamp that took
    it to the first ``update_from_output`` stamp that gave a first token, both inside the request's own send and end."""
    with gzip.open(data_dir / LONE_PREFILL_RUNS[run][0], "rt") as f:
        doc = json.load(f)
    scheds = [(s[2], int(s[4])) for s in doc["stamps"] if s[1] == "sched" and s[6]]
    updates = [s[2] for s in doc["stamps"] if s[1] == "update" and s[4]]
    out: dict[int, tuple[int, float]] = {}
    for label, client in doc["clients"].items():
        if not re.fullmatch(r"p\d+", label):
            continue
        spans, tokens = [], 0
        for r in client["requests"]:
            planned = next((x for x in scheds if r["start"] <= x[0] <= r["end"]), None)
            if planned is None:
                continue
            first = next((u for u in updates if planned[0] < u <= r["end"]), None)
            if first is not None:
                spans.append((first - planned[0]) * 1e3)
                tokens = planned[1]
        if spans:
            out[int(label[1:])] = (tokens, statistics.median(spans))
    return out


def lone_prefill_model(cal: Calibration, run: str) -> PerfModel:
    """The perf model of one of :data:`LONE_PREFILL_RUNS`' engines."""
    _archive, preset, dtype, gpu = LONE_PREFILL_RUNS[run]
    return engine_model(cal, preset, dtype=dtype, gpu_name=gpu)


def fit_fp8_elementwise(
    lone: dict[int, tuple[int, float]], compositions: list[StepComposition], ttft_c1_ms: float, cal: Calibration
) -> tuple[float, float]:
    """(``compute.fp8ElementwiseBytesPerTokenWidth``, ``compute.fp8ComputeEfficiency``) together: a golden-section
    search on the first over 0-40 bytes, the second refitted to the 70B fp8 (:func:`fit_fp8_compute_efficiency`) at
    each, on the log error of the 8B fp8's step against run 34's lone prefills that the GPU bounds
    (:data:`FP8_LONE_PREFILL_FIT_TOKENS`, an H100). The 70B alone cannot tell the two apart: its GEMMs are 4x the
    8B's FLOPs per token for 2x its elementwise bytes."""

    def both(ew: float) -> tuple[float, Calibration]:
        trial = replace(cal, compute=replace(cal.compute, fp8_elementwise_bytes_per_token_width=ew))
        eff = fit_fp8_compute_efficiency(compositions, ttft_c1_ms, trial)
        return eff, replace(trial, compute=replace(trial.compute, fp8_compute_efficiency=eff))

    def loss(ew: float) -> float:
        model = lone_prefill_model(both(ew)[1], "8b-fp8-h100")
        return sum(math.log(model.step_time(prefill_work(lone[n][0])).seconds * 1e3 / lone[n][1]) ** 2 for n in FP8_LONE_PREFILL_FIT_TOKENS)

    ew = golden_section(loss, 0.0, 40.0, steps=40)
    return ew, both(ew)[0]


GEMM_ROW_FILES = {
    "h200": ("h200-gemm-by-rows-r12.jsonl", "h200-gemm-by-rows-r12b.jsonl"),
    "h100-sxm": ("h100-gemm-by-rows-r30.jsonl", "h100-gemm-by-rows-r31.jsonl", "h100-gemm-by-rows-r32.jsonl"),
}
"""vLLM's fp8 and bf16 linear kernels timed by rows (kit-scripts/gemm_by_rows.py), by GPU catalogue name:
runs 12 and 12b on an H200, runs 30 (the 8B's and 70B's shapes) and 31-32 (Qwen2.5-14B's, held out) on an H100 SXM."""
GEMM_ROW_SHARED_GPU = "h200"
"""Whose table is ``compute.fp8GemmRowFactors``, what a GPU type without a table of its own uses (the first measured)."""
GEMM_ROW_SHAPES = (("70b", 1), ("8b", 1))
"""Whose per-layer times the fp8 row factors average (both runs timed both; run 12's 70B at TP 2 and 4 agree within 8 %)."""
GEMM_ROW_LIMIT = 256
"""The largest CUDA graph the operator's engines capture (2 x --max-num-seqs 128); above it a step's FLOPs bind."""


def load_gemm_rows(data_dir: Path, kind: str = "fp8", gpu: str = GEMM_ROW_SHARED_GPU) -> dict[tuple[str, int], dict[int, float]]:
    """One decoder layer's linear-layer time (µs, its four GEMMs summed) on ``gpu`` by (model, TP) and rows; a
    later run's figure replaces an earlier one's for the same GEMM and rows."""
    per_gemm: dict[tuple[str, int, str, int], float] = {}
    for name in GEMM_ROW_FILES[gpu]:
        for line in (data_dir / name).read_text().splitlines():
            row = json.loads(line)
            if row.get("kind") == kind and "us" in row:
                per_gemm[(row["model"], int(row["tp"]), row["layer"], int(row["m"]))] = float(row["us"])
    layers: dict[tuple[str, int], dict[int, float]] = {}
    for (model, tp, _layer, m), us in per_gemm.items():
        layers.setdefault((model, tp), {}).setdefault(m, 0.0)
        layers[(model, tp)][m] += us
    return layers


def fit_gemm_row_factors(layers: dict[tuple[str, int], dict[int, float]], rising: bool = False) -> tuple[tuple[int, float], ...]:
    """``compute.fp8GemmRowFactors`` from the fp8 timings, ``compute.bf16GemmRowFactors`` from the bf16 ones
    (:func:`load_gemm_rows`'s ``kind``, ``rising=True``): each row count's time over the same shape's mean time at
    1-16 rows (what the memory-bound model already gives), averaged over :data:`GEMM_ROW_SHAPES`, from 16 rows to
    :data:`GEMM_ROW_LIMIT`. ``rising``: each factor at least the one before. bf16's cuBLAS timings dip by up to 3.5 %
    where it changes kernel (48 -> 56 rows on the H200), less than fp8's tile changes by a factor of ten, and a step of
    more sequences is not modelled shorter than one of fewer for that; fp8's dips (1.47x at 17 rows, 1.07x at 64) are
    kept, as its decode steps show them (runs 12 and 28)."""
    ratios: dict[int, list[float]] = {}
    for shape in GEMM_ROW_SHAPES:
        times = layers[shape]
        base = statistics.mean(us for m, us in times.items() if m <= 16)
        for m, us in times.items():
            if 16 <= m <= GEMM_ROW_LIMIT:
                ratios.setdefault(m, []).append(1.0 if m == 16 else us / base)
    table, floor = [], 0.0
    for m, rs in sorted(ratios.items()):
        factor = round(statistics.mean(rs), 3)
        floor = max(floor, factor) if rising else factor
        table.append((m, floor))
    return tuple(table)


ATTENTION_KERNEL_FILE = "h100-attn-by-context-r42.jsonl"
"""Run 42: vLLM 0.24's decode attention call alone by context, sequences and head shape (kit-scripts/attn_by_context.py)."""
ATTENTION_KERNEL_SPLITS = 32  # the split count vLLM's FlashAttention backend gives the call under its CUDA graphs
ATTENTION_KERNEL_FROM = 400  # the KV-read line is fitted from here on (below, a floor and 128-token steps)


def _attention_kernel_rows(data_dir: Path) -> list[dict[str, Any]]:
    """Run 42's timings of the decode attention call at vLLM's split count."""
    rows = (json.loads(line) for line in (data_dir / ATTENTION_KERNEL_FILE).read_text().splitlines())
    return [row for row in rows if row.get("what") == "attn" and row["splits"] == ATTENTION_KERNEL_SPLITS]


def _kernel_us(rows: list[dict[str, Any]]) -> dict[tuple[str, int, int], float]:
    return {(row["shape"], int(row["batch"]), int(row["ctx"])): float(row["us_p50"]) for row in rows}


def load_attention_kernel_us(data_dir: Path) -> dict[tuple[str, int, int], float]:
    """One decode attention call's time (µs: one layer) by (head shape, sequences, context) at vLLM's split count."""
    return _kernel_us(_attention_kernel_rows(data_dir))


def fit_attention_per_seq_per_layer(kernel: dict[tuple[str, int, int], float]) -> float:
    """``compute.attentionUsPerSeqPerLayer``: how much the kernel's fixed part (its KV-read line from
    :data:`ATTENTION_KERNEL_FROM` tokens on, at zero context) grows per sequence between the fewest and the
    most sequences timed, averaged over the head shapes timed."""
    growth = []
    for shape in sorted({s for s, _, _ in kernel}):
        fixed = {}
        for batch in sorted({b for s, b, _ in kernel if s == shape}):
            points = sorted((c, us) for (s, b, c), us in kernel.items() if s == shape and b == batch and c >= ATTENTION_KERNEL_FROM)
            fixed[batch] = _line([float(c) for c, _ in points], [us for _, us in points])[0]
        low, high = min(fixed), max(fixed)
        growth.append((fixed[high] - fixed[low]) / (high - low))
    return round(statistics.fmean(growth), 4)


KV_READ_GPU = "h100-sxm"
"""The GPU run 42's attention kernel ran on: what :func:`fit_kv_read_efficiency` divides its KV read by."""


def kv_read_bytes_per_second(data_dir: Path) -> float:
    """The decode attention kernel's KV read rate alone (run 42): at the most sequences timed, the slope of its time
    over the context from :data:`ATTENTION_KERNEL_FROM` tokens on, as bytes of KV a second, averaged over the head
    shapes timed (its fixed part and its steps every 128 tokens aside)."""
    rows = _attention_kernel_rows(data_dir)
    # KV bytes one token of context of one sequence holds in one layer, from each timing's own byte count
    per_token = {(row["shape"], int(row["batch"])): row["kv_gbps"] * 1e3 * row["us_p50"] / (row["batch"] * row["ctx"]) for row in rows}
    kernel = _kernel_us(rows)
    rates = []
    for shape in sorted({s for s, _, _ in kernel}):
        batch = max(b for s, b, _ in kernel if s == shape)
        points = sorted((c, us) for (s, b, c), us in kernel.items() if s == shape and b == batch and c >= ATTENTION_KERNEL_FROM)
        slope_us = _line([float(c) for c, _ in points], [us for _, us in points])[1]
        rates.append(batch * per_token[(shape, batch)] / (slope_us * 1e-6))
    return statistics.fmean(rates)


def fit_kv_read_efficiency(rate: float, cal: Calibration) -> float:
    """``compute.kvBandwidthEfficiency``: the share of the datasheet bandwidth that makes the model read the KV cache
    on :data:`KV_READ_GPU` at ``rate`` (:func:`kv_read_bytes_per_second`), given that GPU's bandwidth scale. Measured,
    not fitted: the step table's compositions, all at about 1,150 tokens of context, could not tell the KV read from
    a per-sequence cost, and the fit read it 13 % slower than the kernel does (0.808)."""
    gpu = get_gpu_type(KV_READ_GPU)
    return round(rate / (gpu.hbm_bandwidth_gbps * 1e9 * cal.compute.bandwidth_scale_for(KV_READ_GPU)), 4)


def load_fp8_tpot_c1_ms(data_dir: Path) -> float:
    """Real vLLM's TPOT mean of a lone 1,024/256 request on the 70B fp8 (the median of runs 5, 6 and 10): what
    ``fp8ActivationQuantNsPerHidden`` is fitted to."""
    return _fp8_c1_median_ms(data_dir, "tpotMeanMs")


def fit_fp8_activation_quant(tpot_c1_ms: float, cal: Calibration) -> float:
    """``compute.fp8ActivationQuantNsPerHidden`` that makes the 70B fp8's decode step at one sequence (mean
    context of a 1,024/256 request) last ``tpot_c1_ms``, every other constant held. The step is GPU-bound and
    the cost adds to it linearly, so one evaluation without the cost gives it; never below 0."""
    model = llama70b_fp8_h200_tp1(replace(cal, compute=replace(cal.compute, fp8_activation_quant_ns_per_hidden=0.0)))
    step_ms = model.step_time(decode_work(1, MEAN_DECODE_CONTEXT)).seconds * 1e3
    shape = model.shape
    return max(0.0, (tpot_c1_ms - step_ms) * 1e6 / (shape.hidden_size * shape.num_layers))


def fit_fp8_compute_efficiency(compositions: list[StepComposition], ttft_c1_ms: float, cal: Calibration) -> float:
    """The fraction of the fp8 datasheet rate that reproduces the 70B fp8 trace's fitted prefill steps
    (1,024 tokens and more) and the unprofiled TTFT at c1, every other constant held:
    a golden-section search on the same log-error loss as :func:`fit`'s."""
    host = Intake.of(cal.serving).lone_seconds(PROMPT) + cal.serving.host_us_per_step * 1e-6

    def loss(eff: float) -> float:
        model = llama70b_fp8_h200_tp1(replace(cal, compute=replace(cal.compute, fp8_compute_efficiency=eff)))
        total = sum(
            math.log(model.gpu_step_time(c.work()).seconds * 1e3 / c.median_ms) ** 2 for c in compositions if c.fitted and c.prefill_seqs
        )
        ttft = (model.gpu_step_time(prefill_work(PROMPT)).seconds + host) * 1e3
        return total + 4.0 * math.log(ttft / ttft_c1_ms) ** 2

    return golden_section(loss, 0.2, 1.0, steps=80)


def golden_section(loss: Callable[[float], float], lo: float, hi: float, steps: int) -> float:
    """The minimum of a unimodal ``loss`` on [lo, hi] by golden-section search: ``steps`` narrowings, the middle of the
    last. Each narrowing keeps one of its two inner points as an inner point of the next, so it costs one evaluation."""
    golden = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - golden * (hi - lo), lo + golden * (hi - lo)
    fa, fb = loss(a), loss(b)
    for _ in range(steps):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - golden * (hi - lo)
            fa = loss(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + golden * (hi - lo)
            fb = loss(b)
    return (lo + hi) / 2.0


# Physical ceilings, as fractions of the H200 datasheet (HBM 4.8 TB/s, 989 bf16 TFLOP/s): the
# copy bandwidth (4.28 TB/s) and bf16 matmul rate (about 800 TFLOP/s) measured on that GPU
# (tests/data/h200). Without them the fit trades weight streaming for a fixed per-layer cost,
# which fits one 8B GPU and no other model.
CEILINGS = {"weight_bandwidth_efficiency": 4.28 / 4.8, "compute_efficiency": 800.0 / 989.0}

SCALING_WEIGHT = 0.3
"""Weight of the PyTorch TP-scaling term against the real vLLM step table (whose sum of squares is
over 26 compositions): enough to keep a per-layer cost that does not shrink with TP, not so much
that plain PyTorch's slower kernels set vLLM's single-GPU times."""

_FIT_KEYS = (  # the KV read's efficiency is the kernel's (fit_kv_read_efficiency), held through the fit
    "weight_bandwidth_efficiency",
    "compute_efficiency",
    "roofline_sharpness",
    "overhead_us_per_layer",
    "overhead_us_per_sampled_seq",
)


def _with(cal: Calibration, vec: list[float]) -> Calibration:
    fitted: dict[str, Any] = dict(zip(_FIT_KEYS, vec, strict=True))
    return replace(cal, compute=replace(cal.compute, **fitted))


def tp_scaling_pairs(points: list[MeasuredPoint]) -> list[tuple[MeasuredPoint, MeasuredPoint]]:
    """(TP>1 point, its TP1 counterpart: same model, kind and batch, same call) of the PyTorch data."""
    tp1 = {(p.model, p.kind, p.batch, p.source.split()[-1]): p for p in points if p.tensor_parallel == 1}
    tp1_any = {(p.model, p.kind, p.batch): p for p in points if p.tensor_parallel == 1}
    pairs = []
    for p in points:
        if p.tensor_parallel > 1:
            base = tp1.get((p.model, p.kind, p.batch, p.source.split()[-1])) or tp1_any.get((p.model, p.kind, p.batch))
            if base is not None:
                pairs.append((p, base))
    return pairs


def scaling_error(pair: tuple[MeasuredPoint, MeasuredPoint], cal: Calibration) -> float:
    """Simulated over measured speed-up from TP1 to the pair's TP (PyTorch graph replays), minus one."""
    point, base = pair
    simulated = predict(point, cal).seconds / predict(base, cal).seconds
    return simulated / (point.measured_ms / base.measured_ms) - 1.0


def fit(
    compositions: list[StepComposition],
    itl_p50: dict[int, float],
    ttft_c1_ms: float,
    start: Calibration,
    h200_points: list[MeasuredPoint] | None = None,
    decode_only_itl_p50: dict[int, float] | None = None,
) -> Calibration:
    """Compute constants on the step table and TTFT at c1 (with how TP scales in
    the PyTorch data: a fixed per-layer cost does not shrink with TP, streamed weights do); then the
    host constants."""
    host0 = start.serving
    host_step, intake = host0.host_us_per_step * 1e-6, Intake.of(host0).lone_seconds(PROMPT)  # fixed through the fit
    pairs = tp_scaling_pairs(h200_points or [])

    def loss(vec: list[float]) -> float:
        trial = _with(start, vec)
        model = llama8b_h200_tp1(trial)
        total = 0.0
        for comp in compositions:
            if comp.fitted:
                total += math.log(model.gpu_step_time(comp.work()).seconds * 1e3 / comp.median_ms) ** 2
        # One 1024-token prefill at concurrency 1, the serving loop's time around it included.
        ttft = (model.gpu_step_time(prefill_work(PROMPT)).seconds + host_step + intake) * 1e3
        total += 4.0 * math.log(ttft / ttft_c1_ms) ** 2  # the one unprofiled prefill, for the small ones
        for conc, itl in (decode_only_itl_p50 or {}).items():
            # A short context's decode step, the serving loop's start values around it.
            work = StepWork(decode_seqs=conc, decode_context_tokens=conc * DECODE_ONLY_CONTEXT, sampled_seqs=conc)
            step = model.gpu_step_time(work).seconds + model.host_seconds(work)
            total += math.log(step * 1e3 / itl) ** 2
        if pairs:
            total += SCALING_WEIGHT * statistics.fmean(math.log(1.0 + scaling_error(pair, trial)) ** 2 for pair in pairs)
        for key, ceiling in CEILINGS.items():
            total += 1e3 * max(0.0, getattr(trial.compute, key) / ceiling - 1.0) ** 2
        total += 1e3 * max(0.0, 2.0 - trial.compute.roofline_sharpness) ** 2  # no smooth max above the sum
        return total

    c = start.compute
    x0 = [min(getattr(c, k), 0.95 * CEILINGS.get(k, math.inf)) for k in _FIT_KEYS]
    vec = nelder_mead(loss, x0, iterations=6000)
    cal = _with(start, vec)
    # Host time: ITL P50 minus the GPU's decode step, linear in the running sequences.
    model = llama8b_h200_tp1(cal)
    xs, ys = [], []
    for conc, itl in sorted(itl_p50.items()):
        gpu = (
            model.gpu_step_time(StepWork(decode_seqs=conc, decode_context_tokens=conc * MEAN_DECODE_CONTEXT, sampled_seqs=conc)).seconds
            * 1e3
        )
        xs.append(float(conc))
        ys.append((itl - gpu) * 1e3)  # microseconds
    intercept, slope = _line(xs, ys)
    return replace(cal, serving=replace(cal.serving, host_us_per_step=max(intercept, 0.0), host_us_per_seq=slope))


def comparison_rows(compositions: list[StepComposition], cal: Calibration, model: PerfModel | None = None) -> list[dict[str, Any]]:
    """Simulated against real GPU time per composition, on the 8B's engine unless ``model`` is given."""
    model = model or llama8b_h200_tp1(cal)
    rows = []
    for comp in compositions:
        sim = model.gpu_step_time(comp.work()).seconds * 1e3
        rows.append(
            {
                "composition": comp.label + ("" if comp.fitted else " (profiler-bound, not fitted)"),
                "fitted": comp.fitted,
                "steps": comp.count,
                "real_ms": comp.median_ms,
                "sim_ms": sim,
                "error": sim / comp.median_ms - 1.0,
            }
        )
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    out = ["| step composition | steps traced | real vLLM ms | simulated ms | error |", "|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['composition']} | {r['steps']} | {r['real_ms']:.2f} | {r['sim_ms']:.2f} | {r['error']:+.1%} |")
    return "\n".join(out)


def _rounded(obj: Any) -> Any:
    if isinstance(obj, float):
        return float(f"{obj:.4g}")
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    return obj


def _takes_line(engine: str, note: str, conc: int, step_ms: float, takes: list[float], runs: tuple[str, ...]) -> str:
    """One printed line: the modelled decode step + host beside each run's ITL P50 of the same load."""
    return (
        f"{engine} decode step + host at {conc:>3} seqs ({note}): real ITL P50 "
        + " / ".join(f"{itl:.2f}" for itl in takes)
        + f" ms (runs {' / '.join(runs)}), simulated {step_ms:.2f} ms ("
        + " / ".join(f"{step_ms / itl - 1:+.1%}" for itl in takes)
        + ")"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path, help="the real vLLM captures (tests/data/vllm)")
    parser.add_argument(
        "--h200-dir", type=Path, default=None, help="the PyTorch + NCCL measurements for TP scaling (default: DATA_DIR/../h200)"
    )
    parser.add_argument("--write", action="store_true", help="refit and rewrite the calibration file (--output)")
    parser.add_argument(
        "--calibration", type=Path, default=None, help="the calibration to report on and refit from (default: the shipped one)"
    )
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="with --write: the file to write (default: the shipped kneepoint/data/simulator_calibration.json); "
        "`kneepoint sim --calibration FILE` serves with it",
    )
    args = parser.parse_args(argv)
    if args.output and not args.write:
        parser.error("--output: only with --write")
    args.h200_dir = args.h200_dir or args.data_dir.parent / "h200"
    comps = load_compositions(args.data_dir)
    try:
        cal = load_calibration(args.calibration)
    except ValueError as exc:
        parser.error(f"--calibration: {exc}")
    if args.write:
        # measured, not fitted: set first, so that the fit's constants carry only the rest
        attention = fit_attention_per_seq_per_layer(load_attention_kernel_us(args.data_dir))
        bf16 = {gpu: fit_gemm_row_factors(load_gemm_rows(args.data_dir, "bf16", gpu), rising=True) for gpu in GEMM_ROW_FILES}
        own_bf16 = tuple((gpu, table) for gpu, table in sorted(bf16.items()) if gpu != GEMM_ROW_SHARED_GPU)
        cal = replace(
            cal,
            compute=replace(
                cal.compute,
                attention_us_per_seq_per_layer=attention,
                bf16_gemm_row_factors=bf16[GEMM_ROW_SHARED_GPU],
                bf16_gemm_row_factors_by_gpu=own_bf16,
            ),
        )
        rate = kv_read_bytes_per_second(args.data_dir)
        # Twice: the KV read is the kernel's on the H100, whose bandwidth scale is fitted after the rest.
        for _ in range(2):
            cal = replace(cal, compute=replace(cal.compute, kv_bandwidth_efficiency=fit_kv_read_efficiency(rate, cal)))
            cal = fit(
                comps,
                load_itl_p50_ms(args.data_dir),
                load_ttft_c1_ms(args.data_dir),
                cal,
                load_points(args.h200_dir),
                load_decode_only_itl_p50_ms(args.data_dir),
            )
            floor_step, floor_seq = fit_cpu_floor(load_cpu_floor_itl_p50_ms(args.data_dir), load_1b_c1_tpots_ms(args.data_dir))
            cal = replace(cal, serving=replace(cal.serving, cpu_floor_us_per_step=floor_step, cpu_floor_us_per_seq=floor_seq))
            # before the fp8 fits: run 34's lone prefills, to which fp8's elementwise bytes are fitted, ran on an H100
            scale = fit_bandwidth_scale(load_h100_decode_itl_p50_ms(args.data_dir), cal)
            cal = with_bandwidth_scale(cal, BANDWIDTH_SCALE_GPU, float(f"{scale:.4g}"))
        quant = fit_fp8_activation_quant(load_fp8_tpot_c1_ms(args.data_dir), cal)
        cal = replace(cal, compute=replace(cal.compute, fp8_activation_quant_ns_per_hidden=quant))
        lone = load_lone_prefill_ms(args.data_dir, "8b-fp8-h100")
        ew, fp8 = fit_fp8_elementwise(lone, load_fp8_compositions(args.data_dir), load_fp8_ttft_c1_ms(args.data_dir), cal)
        cal = replace(cal, compute=replace(cal.compute, fp8_compute_efficiency=fp8, fp8_elementwise_bytes_per_token_width=ew))
        tables = {gpu: fit_gemm_row_factors(load_gemm_rows(args.data_dir, "fp8", gpu)) for gpu in GEMM_ROW_FILES}
        own = tuple((gpu, table) for gpu, table in sorted(tables.items()) if gpu != GEMM_ROW_SHARED_GPU)
        cal = replace(cal, compute=replace(cal.compute, fp8_gemm_row_factors=tables[GEMM_ROW_SHARED_GPU], fp8_gemm_row_factors_by_gpu=own))
        shipped = Path(str(resources.files("kneepoint.data").joinpath(CALIBRATION_FILE)))
        doc = json.loads((args.calibration or shipped).read_text())
        target = args.output or shipped
        c = cal.compute
        doc["compute"].update(
            _rounded(
                {
                    "weightBandwidthEfficiency": c.weight_bandwidth_efficiency,
                    "kvBandwidthEfficiency": c.kv_bandwidth_efficiency,
                    "computeEfficiency": c.compute_efficiency,
                    "rooflineSharpness": c.roofline_sharpness,
                    "overheadUsPerLayer": c.overhead_us_per_layer,
                    "overheadUsPerSampledSeq": c.overhead_us_per_sampled_seq,
                    "attentionUsPerSeqPerLayer": c.attention_us_per_seq_per_layer,
                    "fp8ComputeEfficiency": c.fp8_compute_efficiency,
                    "fp8ActivationQuantNsPerHidden": c.fp8_activation_quant_ns_per_hidden,
                    "fp8ElementwiseBytesPerTokenWidth": c.fp8_elementwise_bytes_per_token_width,
                }
            )
        )
        written = calibration_to_json(cal)
        doc["compute"]["fp8GemmRowFactors"] = written["compute"]["fp8GemmRowFactors"]
        doc["compute"]["fp8GemmRowFactorsByGpu"] = written["compute"]["fp8GemmRowFactorsByGpu"]
        doc["compute"]["bf16GemmRowFactors"] = written["compute"]["bf16GemmRowFactors"]
        doc["compute"]["bf16GemmRowFactorsByGpu"] = written["compute"]["bf16GemmRowFactorsByGpu"]
        doc["compute"]["bandwidthScaleByGpu"] = written["compute"]["bandwidthScaleByGpu"]
        doc["serving"] = _rounded(written["serving"])  # every serving constant, as the loader reads it
        target.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"wrote {target}")
        cal = calibration_from_json(doc)
    rows = comparison_rows(comps, cal)
    print(format_table(rows))
    worst = max((r for r in rows if r["fitted"]), key=lambda r: abs(r["error"]))
    model = llama8b_h200_tp1(cal)
    print(f"\n{len(rows)} compositions; worst fitted error {worst['error']:+.1%} ({worst['composition']})")
    for conc, itl in sorted(load_itl_p50_ms(args.data_dir).items()):
        st = model.step_time(StepWork(decode_seqs=conc, decode_context_tokens=conc * MEAN_DECODE_CONTEXT, sampled_seqs=conc)).seconds * 1e3
        print(f"decode step + host at {conc:>3} seqs: real ITL P50 {itl:.2f} ms, simulated {st:.2f} ms ({st / itl - 1:+.1%})")
    for conc, itl in sorted(load_decode_only_itl_p50_ms(args.data_dir).items()):
        st = model.step_time(StepWork(decode_seqs=conc, decode_context_tokens=conc * DECODE_ONLY_CONTEXT, sampled_seqs=conc)).seconds * 1e3
        print(
            f"decode step + host at {conc:>3} seqs, {DECODE_ONLY_CONTEXT} tokens of context: real ITL P50 {itl:.2f} ms, simulated {st:.2f} ms ({st / itl - 1:+.1%})"
        )
    small = engine_model(cal, "llama-3.2-1b")
    tpots = load_1b_c1_tpots_ms(args.data_dir)
    floor_c1 = small.cpu_floor_seconds(decode_work(1, DECODE_ONLY_CONTEXT)) * 1e3
    near = sum(abs(t / floor_c1 - 1) <= 0.10 for t in tpots)
    print(
        f"1B c1 decode step (the CPU floor): {floor_c1:.2f} ms; {len(tpots)} c1 loads over runs 5-14 span "
        f"{min(tpots):.2f}-{max(tpots):.2f} ms, {near} within 10 % of the floor"
    )
    for conc, itl in sorted(load_cpu_floor_itl_p50_ms(args.data_dir).items()):
        work = StepWork(decode_seqs=conc, decode_context_tokens=conc * DECODE_ONLY_CONTEXT, sampled_seqs=conc)
        gpu, st = small.gpu_step_time(work).seconds * 1e3, small.step_time(work).seconds * 1e3
        print(
            f"1B decode step at {conc:>3} seqs: run 6 (the host at its fastest) ITL P50 {itl:.2f} ms, simulated {st:.2f} ms ({st / itl - 1:+.1%}; GPU {gpu:.2f} ms)"
        )
    for gpu_name in GEMM_ROW_FILES:
        print(
            f"fp8 GEMM time by rows over 1-16 rows on {gpu_name} (compute.fp8GemmRowFactors"
            + ("" if gpu_name == GEMM_ROW_SHARED_GPU else f"ByGpu.{gpu_name}")
            + "): "
            + ", ".join(f"{m}: {f:.2f}" for m, f in cal.compute.fp8_row_factors_for(gpu_name))
        )
    eight_fp8 = engine_model(cal, "llama-3-8b", dtype="fp8")
    for conc, itl in sorted(load_fp8_decode_itl_p50_ms(args.data_dir).items()):
        st = eight_fp8.step_time(decode_work(conc, FP8_DECODE_CONTEXT)).seconds * 1e3
        print(
            f"8B fp8 decode step + host at {conc:>3} seqs (held out): real ITL P50 {itl:.2f} ms, simulated {st:.2f} ms ({st / itl - 1:+.1%})"
        )
    eight_h100 = engine_model(cal, "llama-3-8b", gpu_name=BANDWIDTH_SCALE_GPU)
    scale = cal.compute.bandwidth_scale_for(BANDWIDTH_SCALE_GPU)
    for conc, takes in sorted(load_h100_decode_itl_p50_ms(args.data_dir).items()):
        st = eight_h100.step_time(decode_work(conc, DECODE_ONLY_CONTEXT)).seconds * 1e3
        print(_takes_line("8b-h100-tp1", f"bandwidth x {scale} on the H100", conc, st, takes, H100_DECODE_RUNS))
    for preset, (prefix, runs) in FP8_H100_DECODE_RUNS.items():
        on_h100 = engine_model(cal, preset, dtype="fp8", gpu_name="h100-sxm")
        for conc, takes in sorted(load_fp8_h100_decode_itl_p50_ms(args.data_dir, preset).items()):
            st = on_h100.step_time(decode_work(conc, FP8_DECODE_CONTEXT)).seconds * 1e3
            print(_takes_line(prefix, "held out", conc, st, takes, runs))
    for run in LONE_PREFILL_RUNS:
        lone_model = lone_prefill_model(cal, run)
        print(
            f"{run} lone prompt, its step's plan to its first token (real / simulated): "
            + ", ".join(
                f"{n}: {ms:.1f} / {lone_model.step_time(prefill_work(tokens)).seconds * 1e3:.1f} ms"
                for n, (tokens, ms) in sorted(load_lone_prefill_ms(args.data_dir, run).items())
            )
        )
    errors = [scaling_error(pair, cal) for pair in tp_scaling_pairs(load_points(args.h200_dir))]
    print(
        f"TP scaling vs the PyTorch data ({len(errors)} TP>1 points over their TP1 point): mean |error| "
        f"{statistics.fmean(abs(e) for e in errors):.1%}, worst {max(errors, key=abs):+.1%}"
    )
    ttft = (
        model.gpu_step_time(prefill_work(PROMPT)).seconds
        + model.host_seconds(prefill_work(PROMPT))
        + Intake.of(cal.serving).lone_seconds(PROMPT)
    ) * 1e3
    real = load_ttft_c1_ms(args.data_dir)
    print(f"1024-token prefill + host at concurrency 1: real TTFT P50 {real:.2f} ms, simulated {ttft:.2f} ms ({ttft / real - 1:+.1%})")
    fp8_model = llama70b_fp8_h200_tp1(cal)
    print(f"\n70B fp8 (run 10's traces; fp8 at {cal.compute.fp8_compute_efficiency} of the datasheet rate):")
    print(format_table(comparison_rows(load_fp8_compositions(args.data_dir), cal, fp8_model)))
    ttft = (fp8_model.gpu_step_time(prefill_work(PROMPT)).seconds + fp8_model.host_seconds(prefill_work(PROMPT))) * 1e3
    ttft += Intake.of(cal.serving).lone_seconds(PROMPT) * 1e3
    real = load_fp8_ttft_c1_ms(args.data_dir)
    print(
        f"70B fp8 1024-token prefill + host at concurrency 1: real TTFT P50 {real:.2f} ms, simulated {ttft:.2f} ms ({ttft / real - 1:+.1%})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
