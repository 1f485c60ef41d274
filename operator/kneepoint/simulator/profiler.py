"""vLLM's torch profiler, simulated: ``--profiler-config``, ``POST /start_profile`` / ``/stop_profile``.

Real vLLM (``vllm/config/profiler.py``, ``vllm/profiler/wrapper.py``) takes
``--profiler-config '{"profiler":"torch","torch_profiler_dir":"/abs/dir",...}'``; while a
profile is active every worker records its GPU kernels, and at stop each rank writes a
Kineto/Chrome trace ``<dir>/...rank<R>.<ns>.pt.trace.json.gz`` with one
``gpu_user_annotation`` per engine step. The simulator writes the same format from its own
step model, so the trace reader (``kneepoint.core.kineto_trace``) and the profiler path of
the ladder run unchanged in the sandbox:

- per step and rank: compute kernels, then collective kernels (vLLM's custom all-reduce
  over NVLink, NCCL's ring all-reduce over PCIe, NCCL send/recv between pipeline stages)
  holding the step's modelled collective time;
- rank skew: each rank's compute is shorter than the slowest rank's by a seeded share of up
  to ``RANK_SKEW`` of the compute time, and that rank waits the difference inside its
  collectives (as a rank that arrives early at a real all-reduce spins inside it), so the
  smallest rank's collective time is the modelled transfer;
- the stop stalls the engine: real vLLM 0.24 (TP1, 8B) served nothing for 32 s while it
  wrote a 3 s slice of 316 steps (``8b-tp1-serve-with-profiler.log``: "Stopping profiler"
  18:31:22, "Profiler stopped" 18:31:54, generation throughput 0 in between), i.e. about
  3.2 ms per profiled step and model layer; the simulator holds its engine that long.

The server registers :func:`routes` and calls the engine hooks; everything else here is the model.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import os
import random
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from kneepoint.core.kineto_trace import KERNEL_CATEGORY, STEP_CATEGORY

log = logging.getLogger("kneepoint.sim")

PROFILERS = ("torch", "cuda")
_INT_FIELDS = {"delay_iterations": 0, "max_iterations": 0, "warmup_iterations": 0, "active_iterations": 1, "wait_iterations": 0}
_BOOL_FIELDS = (
    "torch_profiler_with_stack",
    "torch_profiler_with_flops",
    "torch_profiler_use_gzip",
    "torch_profiler_dump_cuda_time_total",
    "torch_profiler_record_shapes",
    "torch_profiler_with_memory",
    "capture_torch_profiler",
    "detailed_trace_annotation",
    "ignore_frontend",
)
_FIELDS = {"profiler", "torch_profiler_dir", *_INT_FIELDS, *_BOOL_FIELDS}

RANK_SKEW = 0.03
"""Largest share of a step's compute time by which a rank finishes before the slowest one."""
STOP_SECONDS_PER_STEP_LAYER = 32.0 / (316 * 32)
"""Engine stall at stop per profiled step and model layer (vLLM 0.24, Llama-3.1-8B TP1, 32 layers)."""
SEGMENTS_PER_STEP = 8
"""Compute/collective kernel pairs written per step (real vLLM: two all-reduces per layer; fewer keep files small)."""
COMPUTE_KERNEL = "nvjet_sm90_tst_128x32_64x10_2x1_v_bz_TNT"  # a real decode GEMM of the H200 trace
CUSTOM_ALLREDUCE = "void vllm::cross_device_reduce_1stage<__nv_bfloat16, {ranks}>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, __nv_bfloat16*, int, int)"
NCCL_ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
NCCL_SENDRECV = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"


class ProfilerConfigError(ValueError):
    """A --profiler-config that vLLM would refuse; the message names the field."""


@dataclass(frozen=True)
class ProfilerConfig:
    profiler: str | None
    torch_profiler_dir: str
    use_gzip: bool = True
    delay_iterations: int = 0
    max_iterations: int = 0


def parse_profiler_config(text: str) -> ProfilerConfig:
    """``--profiler-config`` as vLLM's ProfilerConfig reads it (JSON object, the same fields and checks)."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise ProfilerConfigError(f"--profiler-config: not JSON ({err.msg})") from None
    if not isinstance(raw, dict):
        raise ProfilerConfigError("--profiler-config: expected a JSON object")
    unknown = sorted(set(raw) - _FIELDS)
    if unknown:
        raise ProfilerConfigError(f"--profiler-config: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(_FIELDS))}")
    profiler = raw.get("profiler")
    if profiler is not None and profiler not in PROFILERS:
        raise ProfilerConfigError(f"--profiler-config.profiler: must be one of {', '.join(PROFILERS)} or null; got {profiler!r}")
    directory = raw.get("torch_profiler_dir", "")
    if not isinstance(directory, str):
        raise ProfilerConfigError("--profiler-config.torch_profiler_dir: must be a string")
    if directory and profiler != "torch":
        raise ProfilerConfigError("torch_profiler_dir is only applicable when profiler is set to 'torch'")
    if profiler == "torch" and not directory:
        raise ProfilerConfigError("torch_profiler_dir must be set when profiler is 'torch'")
    if profiler == "cuda":
        raise ProfilerConfigError("--profiler-config.profiler: the simulator writes torch traces only; use 'torch'")
    for name, low in _INT_FIELDS.items():
        value = raw.get(name, low if name != "active_iterations" else 5)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ProfilerConfigError(f"--profiler-config.{name}: must be an integer >= {low}; got {value!r}")
    for name in _BOOL_FIELDS:
        if name in raw and not isinstance(raw[name], bool):
            raise ProfilerConfigError(f"--profiler-config.{name}: must be true or false; got {raw[name]!r}")
    return ProfilerConfig(
        profiler=profiler,
        torch_profiler_dir=os.path.abspath(os.path.expanduser(directory)) if directory else "",
        use_gzip=raw.get("torch_profiler_use_gzip", True),
        delay_iterations=raw.get("delay_iterations", 0),
        max_iterations=raw.get("max_iterations", 0),
    )


@dataclass(frozen=True)
class ProfiledStep:
    start: float
    duration: float
    comm_seconds: float
    context_seqs: int
    context_tokens: int
    generation_seqs: int


def step_annotation(context_seqs: int, context_tokens: int, generation_seqs: int) -> str:
    """vLLM's per-step annotation name."""
    return f"execute_context_{context_seqs}({context_tokens})_generation_{generation_seqs}({generation_seqs})"


def collective_kernel_name(tensor_parallel: int, interconnect: str) -> str:
    """The collective kernel vLLM runs for this split: custom all-reduce needs NVLink; PP-only sends/receives."""
    if tensor_parallel == 1:
        return NCCL_SENDRECV
    return CUSTOM_ALLREDUCE.format(ranks=tensor_parallel) if interconnect == "nvlink" else NCCL_ALLREDUCE


def rank_documents(
    steps: list[ProfiledStep],
    tensor_parallel: int,
    pipeline_parallel: int,
    interconnect: str,
    gpu_name: str,
    gpu_memory_bytes: int,
    seed: int,
    base_time_ns: int,
) -> list[dict[str, Any]]:
    """One Kineto-shaped trace document per rank for the profiled steps."""
    world = tensor_parallel * pipeline_parallel
    rng = random.Random(seed)
    collective = collective_kernel_name(tensor_parallel, interconnect)
    docs = []
    events: list[list[dict[str, Any]]] = [
        [{"ph": "M", "name": "process_name", "pid": r, "tid": 0, "args": {"name": f"GPU {r}"}}] for r in range(world)
    ]
    for step in steps:
        compute = max(0.0, step.duration - step.comm_seconds)
        arrival = [rng.random() for _ in range(world)]
        first = min(arrival)
        name = step_annotation(step.context_seqs, step.context_tokens, step.generation_seqs)
        start_us, dur_us = step.start * 1e6, step.duration * 1e6
        for r in range(world):
            wait = compute * RANK_SKEW * (arrival[r] - first) if world > 1 else 0.0
            own_compute = (compute - wait) * 1e6
            own_collective = (step.comm_seconds + wait) * 1e6
            out = events[r]
            out.append(
                {
                    "ph": "X",
                    "cat": "user_annotation",
                    "name": name,
                    "pid": 1000 + r,
                    "tid": 1000 + r,
                    "ts": round(start_us - 20.0, 3),
                    "dur": round(dur_us, 3),
                }
            )
            out.append(
                {"ph": "X", "cat": STEP_CATEGORY, "name": name, "pid": r, "tid": 7, "ts": round(start_us, 3), "dur": round(dur_us, 3)}
            )
            t = start_us
            for _ in range(SEGMENTS_PER_STEP):
                for kernel, length in ((COMPUTE_KERNEL, own_compute), (collective, own_collective if world > 1 else 0.0)):
                    piece = length / SEGMENTS_PER_STEP
                    if piece <= 0:
                        continue
                    out.append(
                        {
                            "ph": "X",
                            "cat": KERNEL_CATEGORY,
                            "name": kernel,
                            "pid": r,
                            "tid": 7,
                            "ts": round(t, 3),
                            "dur": round(piece, 3),
                            "args": {"device": r, "stream": 7},
                        }
                    )
                    t += piece
    for r in range(world):
        docs.append(
            {
                "schemaVersion": 1,
                "deviceProperties": [{"id": r, "name": gpu_name, "totalGlobalMem": gpu_memory_bytes}],
                "distributedInfo": {"backend": "nccl", "rank": r, "world_size": world},
                "displayTimeUnit": "ms",
                "baseTimeNanoseconds": base_time_ns,
                "traceEvents": events[r],
                "traceName": "kneepoint sim",
            }
        )
    return docs


def trace_file_name(rank: int, tensor_parallel: int, ns: int, use_gzip: bool) -> str:
    """``dp0_pp<P>_tp<T>_dcp0_ep0_rank<R>.<ns>.pt.trace.json[.gz]`` (worker name, then time_ns, as torch's handler)."""
    suffix = ".pt.trace.json.gz" if use_gzip else ".pt.trace.json"
    return f"dp0_pp{rank // tensor_parallel}_tp{rank % tensor_parallel}_dcp0_ep0_rank{rank}.{ns}{suffix}"


def write_traces(directory: str, docs: list[dict[str, Any]], tensor_parallel: int, use_gzip: bool) -> list[str]:
    """Write each rank's document; a file appears only complete (written aside, then renamed)."""
    os.makedirs(directory, exist_ok=True)
    paths = []
    for rank, doc in enumerate(docs):
        data = json.dumps(doc, separators=(",", ":")).encode()
        path = os.path.join(directory, trace_file_name(rank, tensor_parallel, time.time_ns(), use_gzip))
        tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp")
        with open(tmp, "wb") as f:
            f.write(gzip.compress(data, compresslevel=1) if use_gzip else data)
        os.replace(tmp, path)
        paths.append(path)
    return paths


class SimProfiler:
    """The engine's profiler state: active or not, the steps recorded, the stall at stop."""

    def __init__(
        self,
        config: ProfilerConfig,
        tensor_parallel: int,
        pipeline_parallel: int,
        layers: int,
        interconnect: str,
        gpu_name: str,
        gpu_memory_bytes: int,
        seed: int = 0,
    ) -> None:
        self.config = config
        self.tp, self.pp = tensor_parallel, pipeline_parallel
        self.layers_per_stage = max(1, -(-layers // pipeline_parallel))
        self.interconnect = interconnect
        self.gpu_name, self.gpu_memory_bytes = gpu_name, gpu_memory_bytes
        self._seed = seed
        self._active = False
        self._running = False
        self._seen = 0
        self._steps: list[ProfiledStep] = []
        self._engine_free = asyncio.Event()
        self._engine_free.set()
        self._pending: list[ProfiledStep] | None = None
        self.written: list[str] = []
        self._wall_offset_ns = time.time_ns() - int(time.monotonic() * 1e9)

    @property
    def active(self) -> bool:
        return self._active

    def start(self) -> None:
        if self._active:
            log.info("start_profile received when profiler is already active. Ignoring request.")
            return
        self._active = True
        self._seen = 0
        self._steps = []
        self._running = self.config.delay_iterations == 0
        log.info("Torch profiling enabled. Traces will be saved to: %s", self.config.torch_profiler_dir)

    def record_step(
        self, start: float, duration: float, comm_seconds: float, context_seqs: int, context_tokens: int, generation_seqs: int
    ) -> None:
        """Called by the engine loop after each step (vLLM's worker profiler.step())."""
        if not self._active:
            return
        self._seen += 1
        if not self._running and self.config.delay_iterations and self._seen == self.config.delay_iterations:
            self._running = True
            return
        if not self._running:
            return
        self._steps.append(ProfiledStep(start, duration, comm_seconds, context_seqs, context_tokens, generation_seqs))
        if self.config.max_iterations and len(self._steps) >= self.config.max_iterations:
            log.info("Max profiling iterations reached. Stopping profiler...")
            self._running = False
            self._pending = self._steps
            self._steps = []
            self._engine_free.clear()  # the engine writes before its next step, as vLLM's does

    async def engine_turn(self) -> bool:
        """Awaited by the engine loop before each step: writes a pending trace, holding the engine.

        True when the engine was held (its pacing restarts instead of counting the stall as lag)."""
        held = self._pending is not None or not self._engine_free.is_set()
        if self._pending is not None:
            steps, self._pending = self._pending, None
            await self._write(steps)
        await self._engine_free.wait()
        return held

    async def stop(self) -> None:
        """``/stop_profile``: write the traces; returns once written (the engine is held meanwhile)."""
        if not self._active:
            log.info("stop_profile received when profiler is not active. Ignoring request.")
            return
        self._active = False
        steps, self._steps = self._steps, []
        if self._running:
            self._running = False
            self._engine_free.clear()
            await self._write(steps)
        while self._pending is not None or not self._engine_free.is_set():  # an auto-stop still writing
            await asyncio.sleep(0.01)

    def stall_seconds(self, steps: int) -> float:
        return steps * self.layers_per_stage * STOP_SECONDS_PER_STEP_LAYER

    async def _write(self, steps: list[ProfiledStep]) -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            docs = rank_documents(
                steps,
                self.tp,
                self.pp,
                self.interconnect,
                self.gpu_name,
                self.gpu_memory_bytes,
                self._seed + len(self.written),
                self._wall_offset_ns,
            )
            if steps:
                paths = await asyncio.to_thread(write_traces, self.config.torch_profiler_dir, docs, self.tp, self.config.use_gzip)
                self.written.extend(paths)
            rest = self.stall_seconds(len(steps)) - (loop.time() - began)
            if rest > 0:
                await asyncio.sleep(rest)
            log.info("Profiler stopped successfully (%d steps, %d rank traces).", len(steps), len(docs) if steps else 0)
        finally:
            self._engine_free.set()


def routes(profiler: SimProfiler) -> list[web.RouteDef]:
    """The two routes real vLLM registers when a profiler is configured."""

    async def start_profile(request: web.Request) -> web.Response:
        log.info("Starting profiler...")
        profiler.start()
        log.info("Profiler started.")
        return web.Response(status=200)

    async def stop_profile(request: web.Request) -> web.Response:
        log.info("Stopping profiler...")
        await profiler.stop()
        log.info("Profiler stopped.")
        return web.Response(status=200)

    return [web.post("/start_profile", start_profile), web.post("/stop_profile", stop_profile)]
