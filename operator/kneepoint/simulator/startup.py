"""How ``kneepoint sim`` starts and how it fails: vLLM's own lines, in vLLM's order and phases.

Taken from real vLLM 0.24.0 on an H200 (tests/data/vllm/): ``8b-tp1-serve.log`` for a healthy
start, ``70b-tp1-does-not-fit.log`` for a model that does not fit. The numbers are the
simulator's own (its memory estimate, its model-load time); the wording, the process tags
(``(APIServer pid=N)``, ``(EngineCore pid=N)``; the simulator is one process, so one pid)
and the sequence are vLLM's, so whatever reads a vLLM log (the operator's failure reader,
a person) reads the simulator's the same way.

A start is a timeline over the model-load time T (``--model-load-seconds``; /health answers
503 meanwhile). Each phase ends at the share of T it took in the real 8B start (89 s from
the first log line to ``Application startup complete``): the EngineCore starts at 26 s, the
weights are loaded at 31 s, torch.compile ends at 60 s, the KV cache is sized at 64 s, the
CUDA graphs are captured at 65 s, the engine is initialised at 88 s. A refusal happens where
vLLM's does: a bad TP/PP split at once (configuration), weights beyond the GPU while loading
them, no room for the KV cache when sizing it. It prints the EngineCore's root cause first
(with TP > 1 and a load failure, a worker's, then the EngineCore's ``WorkerProc
initialization failed``), then the API server's traceback ending ``RuntimeError: Engine core
initialization failed. See root cause above. Failed core proc(s): {}``, and exits 1 (an
uncaught exception in ``vllm serve``). That traceback is long enough that the kubelet's
termination message (the last 2048 bytes) holds none of the root cause, as with vLLM.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TextIO

# Where each phase ends, as a share of the start (8b-tp1-serve.log: seconds after the first line / 89 s).
PHASE_ENDS = {
    "config": 0.0,
    "engine": 26 / 89,
    "load_begin": 29 / 89,
    "weights": 31 / 89,
    "dynamo": 42 / 89,
    "compile": 60 / 89,
    "profile": 61 / 89,
    "kv_cache": 64 / 89,
    "graphs": 65 / 89,
    "init": 88 / 89,
    "ready": 1.0,
}
EXIT_REFUSED = 1
"""``vllm serve`` ends with an uncaught RuntimeError: Python's exit status 1."""

NO_KV_MEMORY = (
    "ValueError: No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing "
    "the engine (this flag also controls CPU memory reservation on the CPU backend, despite its name). See "
    "https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
)
ENGINE_INIT_FAILED = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}"
WORKER_INIT_FAILED = (
    "Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace for root cause."
)

# Traceback frames as vLLM 0.24.0 prints them (70b-tp1-does-not-fit.log), pairs of (frame, code line).
_KV_FRAMES: tuple[tuple[str, str], ...] = (
    (
        'File "site-packages/vllm/v1/engine/core.py", line 1200, in run_engine_core',
        "engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)",
    ),
    ('File "site-packages/vllm/v1/engine/core.py", line 966, in __init__', "super().__init__("),
    ('File "site-packages/vllm/v1/engine/core.py", line 133, in __init__', "kv_cache_config = self._initialize_kv_caches(vllm_config)"),
    ('File "site-packages/vllm/v1/engine/core.py", line 294, in _initialize_kv_caches', "kv_cache_configs = get_kv_cache_configs("),
    ('File "site-packages/vllm/v1/core/kv_cache_utils.py", line 2101, in get_kv_cache_configs', "_check_enough_kv_cache_memory("),
    ('File "site-packages/vllm/v1/core/kv_cache_utils.py", line 740, in _check_enough_kv_cache_memory', "raise ValueError("),
)
# While loading weights (no capture of this one: the shape of vLLM's model-runner frames).
_LOAD_FRAMES: tuple[tuple[str, str], ...] = (
    (
        'File "site-packages/vllm/v1/engine/core.py", line 1200, in run_engine_core',
        "engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)",
    ),
    ('File "site-packages/vllm/v1/engine/core.py", line 966, in __init__', "super().__init__("),
    ('File "site-packages/vllm/v1/engine/core.py", line 118, in __init__', "self.model_executor = executor_class(vllm_config)"),
    (
        'File "site-packages/vllm/v1/worker/gpu_worker.py", line 280, in load_model',
        "self.model_runner.load_model(eep_scale_up=eep_scale_up)",
    ),
    ('File "site-packages/vllm/v1/worker/model_runner.py", line 290, in load_model', "self.model = model_loader.load_model("),
)
_WORKER_FRAMES: tuple[tuple[str, str], ...] = (
    (
        'File "site-packages/vllm/v1/engine/core.py", line 1200, in run_engine_core',
        "engine_core = EngineCoreProc(*args, engine_index=dp_rank, **kwargs)",
    ),
    ('File "site-packages/vllm/v1/engine/core.py", line 118, in __init__', "self.model_executor = executor_class(vllm_config)"),
    (
        'File "site-packages/vllm/v1/executor/multiproc_executor.py", line 172, in _init_executor',
        "self.workers = WorkerProc.wait_for_ready(unready_workers)",
    ),
    ('File "site-packages/vllm/v1/executor/multiproc_executor.py", line 690, in wait_for_ready', "raise e from None"),
)
_PROCESS_FRAMES = (
    ('File "python3.12/multiprocessing/process.py", line 314, in _bootstrap', "self.run()"),
    ('File "python3.12/multiprocessing/process.py", line 108, in run', "self._target(*self._args, **self._kwargs)"),
    ('File "site-packages/vllm/v1/engine/core.py", line 1235, in run_engine_core', "raise e"),
)
_API_FRAMES = (
    ('File "<frozen runpy>", line 198, in _run_module_as_main', None),
    ('File "<frozen runpy>", line 88, in _run_code', None),
    ('File "site-packages/vllm/entrypoints/cli/main.py", line 101, in <module>', "main()"),
    ('File "site-packages/vllm/entrypoints/cli/main.py", line 95, in main', "args.dispatch_function(args)"),
    ('File "site-packages/vllm/entrypoints/cli/serve.py", line 148, in cmd', "uvloop.run(run_server(args))"),
    ('File "site-packages/uvloop/__init__.py", line 96, in run', "return __asyncio.run("),
    ('File "python3.12/asyncio/runners.py", line 194, in run', "return runner.run(main)"),
    ('File "python3.12/asyncio/runners.py", line 118, in run', "return self._loop.run_until_complete(task)"),
    ('File "uvloop/loop.pyx", line 1515, in uvloop.loop.Loop.run_until_complete', None),
    ('File "site-packages/uvloop/__init__.py", line 48, in wrapper', "return await main"),
    (
        'File "site-packages/vllm/entrypoints/openai/api_server.py", line 663, in run_server',
        "await run_server_worker(listen_address, sock, args, **uvicorn_kwargs)",
    ),
    ('File "site-packages/vllm/entrypoints/openai/api_server.py", line 677, in run_server_worker', "async with build_async_engine_client("),
    ('File "python3.12/contextlib.py", line 210, in __aenter__', "return await anext(self.gen)"),
    (
        'File "site-packages/vllm/entrypoints/openai/api_server.py", line 99, in build_async_engine_client',
        "async with build_async_engine_client_from_engine_args(",
    ),
    ('File "python3.12/contextlib.py", line 210, in __aenter__', "return await anext(self.gen)"),
    (
        'File "site-packages/vllm/entrypoints/openai/api_server.py", line 135, in build_async_engine_client_from_engine_args',
        "async_llm = AsyncLLM.from_vllm_config(",
    ),
    ('File "site-packages/vllm/v1/engine/async_llm.py", line 217, in from_vllm_config', "return cls("),
    (
        'File "site-packages/vllm/v1/engine/async_llm.py", line 146, in __init__',
        "self.engine_core = EngineCoreClient.make_async_mp_client(",
    ),
    ('File "site-packages/vllm/tracing/otel.py", line 178, in sync_wrapper', "return func(*args, **kwargs)"),
    ('File "site-packages/vllm/v1/engine/core_client.py", line 132, in make_async_mp_client', "return AsyncMPClient(*client_args)"),
    ('File "site-packages/vllm/tracing/otel.py", line 178, in sync_wrapper', "return func(*args, **kwargs)"),
    ('File "site-packages/vllm/v1/engine/core_client.py", line 963, in __init__', "super().__init__("),
    ('File "site-packages/vllm/v1/engine/core_client.py", line 573, in __init__', "with launch_core_engines("),
    ('File "python3.12/contextlib.py", line 144, in __exit__', "next(self.gen)"),
    ('File "site-packages/vllm/v1/engine/utils.py", line 1213, in launch_core_engines', "wait_for_engine_startup("),
    ('File "site-packages/vllm/v1/engine/utils.py", line 1272, in wait_for_engine_startup', "raise RuntimeError("),
)
# Config errors are raised in the API server itself, before any engine process.
_CONFIG_FRAMES = _API_FRAMES[:5] + (
    (
        'File "site-packages/vllm/entrypoints/openai/api_server.py", line 99, in build_async_engine_client',
        "async with build_async_engine_client_from_engine_args(",
    ),
    ('File "site-packages/vllm/engine/arg_utils.py", line 1688, in create_engine_config', "parallel_config = ParallelConfig("),
)

API = "APIServer"
CORE = "EngineCore"


@dataclass(frozen=True)
class StartupFigures:
    """The simulator's own numbers for vLLM's start-up lines."""

    model: str
    served_model_name: str
    tensor_parallel: int
    pipeline_parallel: int
    dtype: str
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int
    gpu_memory_utilization: float
    weights_gib: float
    available_kv_gib: float
    """What vLLM logs as ``Available KV cache memory``: budget - weights - activations - overhead (negative when nothing is left)."""
    kv_cache_tokens: int
    graph_gib: float
    enforce_eager: bool
    load_seconds: float
    host: str = "0.0.0.0"
    port: int = 8000
    version: str = "0.33.0"


class EngineRefusal(Exception):
    """vLLM would not start: where it fails and the root cause it logs (its exception line)."""

    def __init__(self, phase: str, root_cause: str, figures: StartupFigures | None, note: str = "") -> None:
        super().__init__(root_cause)
        if phase not in ("config", "weights", "kv_cache"):
            raise ValueError(f"unknown failing phase {phase!r}")
        self.phase = phase
        self.root_cause = root_cause
        self.figures = figures
        self.note = note


@dataclass(frozen=True)
class Line:
    """One log line: at ``at`` x T seconds after the start, from ``proc`` (None: vLLM's untagged lines)."""

    at: float
    proc: str
    level: str | None
    source: str | None
    text: str


def _gib(value: float) -> str:
    """vLLM's ``%s`` of a GiB figure rounded to 2 places: ``15.0``, ``131.45``, ``-8.06``."""
    return str(round(value, 2))


def startup_lines(f: StartupFigures, until: str = "ready") -> list[Line]:
    """vLLM's start-up lines with the simulator's numbers, up to and including phase ``until``."""
    t = f.load_seconds
    at = PHASE_ENDS

    def secs(a: str, b: str) -> float:
        return (at[b] - at[a]) * t

    lines = [
        Line(
            0.0,
            API,
            "INFO",
            "api_utils.py:273",
            f"non-default args: {{'model': {f.model!r}, 'tensor_parallel_size': {f.tensor_parallel}, "
            f"'pipeline_parallel_size': {f.pipeline_parallel}, 'max_model_len': {f.max_model_len}, 'served_model_name': "
            f"[{f.served_model_name!r}], 'gpu_memory_utilization': {f.gpu_memory_utilization}, 'max_num_seqs': {f.max_num_seqs}}}",
        ),
        Line(0.0, API, "INFO", "model.py:1725", f"Using max model len {f.max_model_len}"),
        Line(0.0, API, "INFO", "scheduler.py:252", f"Chunked prefill is enabled with max_num_batched_tokens={f.max_num_batched_tokens}."),
    ]
    if until == "config":
        return lines
    lines += [
        Line(
            at["engine"],
            CORE,
            "INFO",
            "core.py:114",
            f"Initializing a V1 LLM engine (v{f.version}) with config: model={f.model!r}, "
            f"dtype=torch.{f.dtype}, max_seq_len={f.max_model_len}, tensor_parallel_size={f.tensor_parallel}, "
            f"pipeline_parallel_size={f.pipeline_parallel}, enforce_eager={f.enforce_eager} (kneepoint sim)",
        ),
        Line(at["load_begin"], CORE, "INFO", "model_runner.py:281", "Loading model from scratch..."),
    ]
    if until == "weights":
        return lines
    lines.append(
        Line(
            at["weights"],
            CORE,
            "INFO",
            "model_runner.py:302",
            f"Model loading took {_gib(f.weights_gib)} GiB and {secs('load_begin', 'weights'):.6f} seconds",
        )
    )
    compile_s = 0.0 if f.enforce_eager else secs("weights", "compile")
    if not f.enforce_eager:
        lines += [
            Line(at["dynamo"], CORE, "INFO", "backends.py:1148", f"Dynamo bytecode transform time: {secs('weights', 'dynamo'):.2f} s"),
            Line(at["compile"], CORE, "INFO", "monitor.py:53", f"torch.compile took {compile_s:.2f} s in total"),
        ]
    lines += [
        Line(at["profile"], CORE, "INFO", "monitor.py:81", f"Initial profiling/warmup run took {secs('compile', 'profile'):.2f} s"),
        Line(at["kv_cache"], CORE, "INFO", "gpu_worker.py:508", f"Available KV cache memory: {_gib(f.available_kv_gib)} GiB"),
    ]
    if until == "kv_cache":
        return lines
    lines += [
        Line(at["kv_cache"], CORE, "INFO", "kv_cache_utils.py:2146", f"GPU KV cache size: {f.kv_cache_tokens:,} tokens"),
        Line(
            at["kv_cache"],
            CORE,
            "INFO",
            "kv_cache_utils.py:2147",
            f"Maximum concurrency for {f.max_model_len:,} tokens per request: {f.kv_cache_tokens / max(1, f.max_model_len):.2f}x",
        ),
    ]
    if not f.enforce_eager:
        lines.append(
            Line(
                at["graphs"],
                CORE,
                "INFO",
                "model_runner.py:726",
                f"Graph capturing finished in {secs('kv_cache', 'graphs'):.0f} secs, took {f.graph_gib:.2f} GiB",
            )
        )
    lines += [
        Line(
            at["init"],
            CORE,
            "INFO",
            "core.py:337",
            f"init engine (profile, create kv cache, warmup model) took {secs('weights', 'init'):.2f} s (compilation: {compile_s:.2f} s)",
        ),
        Line(at["ready"], API, "INFO", "api_server.py:581", f"Starting vLLM server on http://{f.host}:{f.port}"),
        Line(at["ready"], API, None, None, f"INFO:     Started server process [{os.getpid()}]"),
        Line(at["ready"], API, None, None, "INFO:     Waiting for application startup."),
        Line(at["ready"], API, None, None, "INFO:     Application startup complete."),
    ]
    return lines


def _traceback(
    at: float, proc: str, level: str | None, source: str | None, frames: Iterable[tuple[str, str | None]], exception: str
) -> list[Line]:
    out = [Line(at, proc, level, source, "Traceback (most recent call last):")]
    for frame, code in frames:
        out.append(Line(at, proc, level, source, f"  {frame}"))
        if code:
            out.append(Line(at, proc, level, source, f"    {code}"))
    out.append(Line(at, proc, level, source, exception))
    return out


def failure_lines(refusal: EngineRefusal) -> list[Line]:
    """vLLM's output when it refuses to start: the start-up up to the failing phase, the root cause, the API server's traceback."""
    f = refusal.figures
    at = PHASE_ENDS[refusal.phase]
    lines = startup_lines(f, refusal.phase) if f is not None else []
    if refusal.note:
        lines.append(Line(at, CORE if refusal.phase != "config" else API, "WARNING", "kneepoint.sim", f"kneepoint sim: {refusal.note}"))
    if refusal.phase == "config":
        return lines + _traceback(at, API, None, None, _CONFIG_FRAMES, refusal.root_cause)
    error = ("ERROR", "core.py:1231")
    if refusal.phase == "weights" and f is not None and f.tensor_parallel * f.pipeline_parallel > 1:
        # With several ranks each worker process loads its shard; rank 0 reports, the EngineCore points at it.
        worker = ("ERROR", "multiproc_executor.py:772")
        lines.append(Line(at, "Worker_TP0", *worker, "WorkerProc failed to start."))
        lines += _traceback(at, "Worker_TP0", *worker, _LOAD_FRAMES[3:], refusal.root_cause)
        core_exception, frames = WORKER_INIT_FAILED, _WORKER_FRAMES
    else:
        core_exception, frames = refusal.root_cause, _KV_FRAMES if refusal.phase == "kv_cache" else _LOAD_FRAMES
    lines.append(Line(at, CORE, *error, "EngineCore failed to start."))
    lines += _traceback(at, CORE, *error, frames, core_exception)
    lines.append(Line(at, CORE, None, None, f"Process {CORE}:"))
    lines += _traceback(at, CORE, None, None, _PROCESS_FRAMES + frames, core_exception)
    lines += _traceback(at, API, None, None, _API_FRAMES, ENGINE_INIT_FAILED)
    return lines


def render(line: Line, now: datetime | None = None) -> str:
    """``(EngineCore pid=123) INFO 12-01 18:22:40 [gpu_worker.py:508] Available KV cache memory: 109.49 GiB``."""
    tag = f"({line.proc} pid={os.getpid()}) "
    if line.level is None:
        return tag + line.text
    stamp = (now or datetime.now()).strftime("%m-%d %H:%M:%S")
    return f"{tag}{line.level} {stamp} [{line.source}] {line.text}"


def _write(lines: Iterable[Line], out: TextIO) -> None:
    for line in lines:
        out.write(render(line) + "\n")
    out.flush()


def run_failure(refusal: EngineRefusal, out: TextIO | None = None, sleep: Callable[[float], None] = time.sleep) -> int:
    """Print the failure as it unfolds over the model-load time, then return the exit status (1)."""
    out = out or sys.stdout
    total = refusal.figures.load_seconds if refusal.figures is not None else 0.0
    started = time.monotonic()
    for at, group in _by_time(failure_lines(refusal)):
        wait = at * total - (time.monotonic() - started)
        if wait > 0:
            sleep(wait)
        _write(group, out)
    return EXIT_REFUSED


async def run_startup(figures: StartupFigures, stop: asyncio.Event, out: TextIO | None = None) -> bool:
    """Print the start-up lines over the model-load time; False when ``stop`` was set first."""
    out = out or sys.stdout
    loop = asyncio.get_running_loop()
    started = loop.time()
    for at, group in _by_time(startup_lines(figures)):
        wait = at * figures.load_seconds - (loop.time() - started)
        if wait > 0:
            try:
                await asyncio.wait_for(stop.wait(), wait)
            except TimeoutError:
                pass
        if stop.is_set():
            return False
        _write(group, out)
    return True


def _by_time(lines: list[Line]) -> list[tuple[float, list[Line]]]:
    groups: list[tuple[float, list[Line]]] = []
    for line in lines:
        if groups and groups[-1][0] == line.at:
            groups[-1][1].append(line)
        else:
            groups.append((line.at, [line]))
    return groups
