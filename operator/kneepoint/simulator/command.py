"""``kneepoint sim``: a vLLM-compatible engine simulator, started with vLLM's own flags.

Takes ``vllm serve``'s flags (those that change what is simulated; any other vLLM flag is
accepted and ignored with a warning) plus the simulator's own, each with an environment
fallback because the sandbox runner sets them from node labels (contract C). At start it
sizes itself as vLLM would, with the foundation's memory estimator: when the weights and a
minimal KV cache do not fit in ``gpu-memory-utilization x memory`` it fails as vLLM does
(``startup``: the EngineCore's root cause, then the API server's traceback) and exits 1;
otherwise it prints vLLM's start-up lines over the model-load time and serves until SIGTERM.

Exit codes: 0 after a clean shutdown, 1 when the model does not fit (or vLLM would refuse
the configuration), 2 for bad flags (one line naming the flag and the allowed values).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import socket
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

import click

from kneepoint.core.architectures import (
    ModelArchitecture,
    architecture_from_mapping,
    architecture_from_text,
    get_preset,
    match_preset_for_model_name,
    preset_names,
)
from kneepoint.core.gpus import GIB, GpuType, find_gpu_type, gpu_names
from kneepoint.core.memory_estimate import (
    KV_BLOCK_TOKENS,
    MemoryEstimate,
    default_max_num_batched_tokens,
    estimate_memory,
    tier_incompatibility,
)
from kneepoint.core.tiers import Tier
from kneepoint.simulator.calibration import load_calibration
from kneepoint.simulator.engine import SimulatorSettings
from kneepoint.simulator.perf_model import (
    INTERCONNECTS,
    Deployment,
    Hardware,
    PerfModel,
    default_cuda_graph_max_tokens,
    shape_from_architecture,
)
from kneepoint.simulator.profiler import ProfilerConfig, ProfilerConfigError, parse_profiler_config
from kneepoint.simulator.server import VLLM_VERSION, serve_forever
from kneepoint.simulator.startup import NO_KV_MEMORY, EngineRefusal, StartupFigures, run_failure

log = logging.getLogger("kneepoint.sim")

DEFAULT_MAX_MODEL_LEN = 8192
"""Used when --max-model-len is not given: the simulator has no model config to read it from."""
AUTO_MAX_MODEL_LEN_CAP = 131072
LOAD_BYTES_PER_SECOND = 2e9
LOAD_SECONDS_CAP = 30.0
VLLM_DEFAULT_GPU_MEMORY_UTILIZATION = 0.92

# --dtype and --quantization -> the estimator's weight precision.
_DTYPES = {
    "auto": "bfloat16",
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "half": "float16",
    "fp16": "float16",
    "float32": "float32",
    "float": "float32",
}
_QUANTIZATION = {
    "fp8": "fp8",
    "fbgemm_fp8": "fp8",
    "modelopt": "fp8",
    "awq": "int4",
    "awq_marlin": "int4",
    "gptq": "int4",
    "gptq_marlin": "int4",
    "marlin": "int4",
    "bitsandbytes": "int4",
    "experts_int8": "int8",
    "int8": "int8",
}
_KV_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "bfloat16", "float16")


def fail(flag: str, message: str) -> NoReturn:
    """Bad input: one line naming the flag, exit 2."""
    click.echo(f"kneepoint sim: {flag}: {message}", err=True)
    sys.exit(2)


class _VllmCommand(click.Command):
    """Reads argv the way vLLM's FlexibleArgumentParser does: ``--foo_bar`` is ``--foo-bar``, and
    ``--served-model-name a b`` lists several names."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        out: list[str] = []
        i = 0
        while i < len(args):
            arg = args[i]
            if arg.startswith("--") and len(arg) > 2:
                name, eq, value = arg.partition("=")
                arg = name.replace("_", "-") + eq + value
            if arg == "--served-model-name":
                i += 1
                while i < len(args) and not args[i].startswith("-"):
                    out += ["--served-model-name", args[i]]
                    i += 1
                continue
            out.append(arg)
            i += 1
        return super().parse_args(ctx, out)


def parse_max_model_len(text: str) -> int | None:
    """``4096``, ``32k`` (x1000), ``32K`` (x1024), ``1m``/``1M``, as vLLM reads them; None for ``auto``/``-1``."""
    t = text.strip()
    if t.lower() in ("auto", "-1"):
        return None
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([kKmM]?)", t)
    if not m:
        fail("--max-model-len", f"expected a token count such as 4096, 32k or auto; got {text!r}")
    value = int(float(m.group(1)) * {"": 1, "k": 1000, "K": 1024, "m": 1000**2, "M": 1024**2}[m.group(2)])
    if value < 1:
        fail("--max-model-len", f"must be at least 1; got {text!r}")
    return value


CALIBRATION_ENV = "KNEEPOINT_SIM_CALIBRATION"
"""``--calibration``'s environment fallback, which the benchmarks that start the simulator in-process pass on too."""
DEFAULT_ARCHITECTURE = "llama-3-8b"  # the model of the H200 calibration data


def resolve_architecture(text: str | None, model: str) -> ModelArchitecture:
    """--architecture as a preset name, a config.json path or inline JSON; else the preset the model name matches."""
    if text:
        path = Path(text)
        try:
            if not text.strip().startswith("{") and path.is_file():
                return architecture_from_mapping(json.loads(path.read_text()), name=path.name)
            return architecture_from_text(text)
        except (ValueError, OSError) as exc:
            fail("--architecture", f"{exc} (give a preset: {', '.join(preset_names())}; a config.json path; or inline JSON)")
    preset = match_preset_for_model_name(model)
    if preset is None:
        # A placeholder name (``--model m``) should still start, as a quick try-out does; the
        # calibrated case stands in, and the log says so and how to choose.
        log.warning(
            "model %r matches no preset: simulating %s; pass --architecture (or KNEEPOINT_SIM_ARCHITECTURE) "
            "as a preset (%s), a config.json path or inline JSON",
            model,
            DEFAULT_ARCHITECTURE,
            ", ".join(preset_names()),
        )
        preset = DEFAULT_ARCHITECTURE
    return get_preset(preset)


def default_max_num_seqs(gpu: GpuType) -> int:
    """vLLM's API-server default: 1024 on >= 70 GiB non-A100 GPUs and on >= 160 GiB GPUs, else 256."""
    if gpu.memory_bytes >= 160 * GIB:
        return 1024
    if gpu.memory_bytes >= 70 * GIB and "a100" not in gpu.name.lower():
        return 1024
    return 256


def _cuda_oom_line(gpu: GpuType, est: MemoryEstimate) -> str:
    total = gpu.memory_bytes
    free = max(0, total - est.context_bytes_per_gpu - est.nccl_bytes_per_gpu)
    return (
        f"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate {(est.weights_bytes_per_gpu - free) / GIB:.2f} GiB. "
        f"GPU 0 has a total capacity of {total / GIB:.2f} GiB of which {free / GIB:.2f} GiB is free."
    )


def available_kv_bytes(est: MemoryEstimate) -> int:
    """What vLLM logs as ``Available KV cache memory``: the budget less weights, activations and overhead (may be negative)."""
    return est.budget_bytes_per_gpu - est.weights_bytes_per_gpu - est.activation_bytes_per_gpu - est.overhead_bytes_per_gpu


def check_fit(
    gpu: GpuType, arch: ModelArchitecture, tier: Tier, est: MemoryEstimate, requested_len: int | None, figures: StartupFigures | None = None
) -> None:
    """Raise EngineRefusal where vLLM would refuse to start, with its root-cause line."""
    incompatible = tier_incompatibility(arch, tier, gpu, est.dtype)
    if incompatible:
        raise EngineRefusal("config", f"ValueError: {incompatible}", figures)
    if est.weights_bytes_per_gpu + est.context_bytes_per_gpu + est.nccl_bytes_per_gpu > gpu.memory_bytes:
        raise EngineRefusal(
            "weights", _cuda_oom_line(gpu, est), figures, f"{est.weights_bytes_per_gpu / GIB:.2f} GiB of weights per GPU exceed the GPU"
        )
    if est.kv_pool_bytes_per_gpu <= 0:
        raise EngineRefusal("kv_cache", NO_KV_MEMORY, figures, est.reason)
    if requested_len is not None and not est.fits:
        tokens = est.kv_pool_bytes_per_gpu // est.kv_bytes_per_token_per_gpu
        raise EngineRefusal(
            "kv_cache",
            (
                f"ValueError: To serve at least one request with the models's max seq len ({requested_len}), "
                f"({requested_len * est.kv_bytes_per_token_per_gpu / GIB:.2f} GiB KV cache is needed, which is larger than "
                f"the available KV cache memory ({est.kv_pool_bytes_per_gpu / GIB:.2f} GiB). Based on the available memory, "
                f"the estimated maximum model length is {tokens}. Try increasing `gpu_memory_utilization` or decreasing "
                "`max_model_len` when initializing the engine."
            ),
            figures,
        )


@click.command(
    cls=_VllmCommand, context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": ["-h", "--help"]}
)
@click.option("--model", default=None, help="Model name or path, as vllm serve takes it (also the first positional argument).")
@click.option("--served-model-name", multiple=True, help="Name(s) clients use; the first one labels the metrics.")
@click.option("--tensor-parallel-size", "-tp", type=int, default=1, show_default=True)
@click.option("--pipeline-parallel-size", "-pp", type=int, default=1, show_default=True)
@click.option("--max-num-seqs", type=int, default=None, help="Default: vLLM's for the GPU (1024 on H100/H200, else 256).")
@click.option("--max-num-batched-tokens", type=int, default=None, help="Default: vLLM's for the GPU (8192 on H100/H200).")
@click.option("--max-model-len", default=None, help=f"Tokens, e.g. 4096 or 32k; auto = largest that fits. Default {DEFAULT_MAX_MODEL_LEN}.")
@click.option("--gpu-memory-utilization", type=float, default=VLLM_DEFAULT_GPU_MEMORY_UTILIZATION, show_default=True)
@click.option("--dtype", default="auto", show_default=True, help="auto, bfloat16, float16, float32.")
@click.option("--quantization", "-q", default=None, help=f"Weight quantization: {', '.join(sorted(_QUANTIZATION))}.")
@click.option("--kv-cache-dtype", default="auto", show_default=True, help=", ".join(_KV_DTYPES))
@click.option("--enforce-eager", is_flag=True, help="No CUDA graphs: adds the measured host launch cost per layer.")
@click.option("--block-size", type=int, default=KV_BLOCK_TOKENS, show_default=True, help="KV-cache block size in tokens.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=8000, show_default=True)
@click.option(
    "--gpu",
    envvar="KNEEPOINT_SIM_GPU",
    default="h200",
    show_default=True,
    help="GPU catalogue name or GFD product label (NVIDIA-H200). Env KNEEPOINT_SIM_GPU.",
)
@click.option(
    "--interconnect",
    envvar="KNEEPOINT_SIM_INTERCONNECT",
    default=None,
    help="nvlink or pcie (default: the GPU's usual link). Env KNEEPOINT_SIM_INTERCONNECT.",
)
@click.option(
    "--architecture",
    envvar="KNEEPOINT_SIM_ARCHITECTURE",
    default=None,
    help="Preset name, path to config.json, or inline JSON. Default: the preset the model name matches.",
)
@click.option(
    "--noise",
    envvar="KNEEPOINT_SIM_NOISE",
    type=float,
    default=0.02,
    show_default=True,
    help="Relative step-time noise (standard deviation). Env KNEEPOINT_SIM_NOISE.",
)
@click.option("--seed", envvar="KNEEPOINT_SIM_SEED", type=int, default=0, show_default=True)
@click.option(
    "--dcgm-port",
    envvar="KNEEPOINT_SIM_DCGM_PORT",
    type=int,
    default=9400,
    show_default=True,
    help="DCGM-exporter-style metrics port; 0 turns it off.",
)
@click.option(
    "--model-load-seconds",
    envvar="KNEEPOINT_SIM_MODEL_LOAD_SECONDS",
    type=float,
    default=None,
    help="Seconds /health answers 503 (default: weights per GPU / 2 GB/s, at most 30 s).",
)
@click.option("--truth-log", envvar="KNEEPOINT_SIM_TRUTH_LOG", default=None, help="Write one JSON line per finished request.")
@click.option(
    "--fail-fraction",
    envvar="KNEEPOINT_SIM_FAIL_FRACTION",
    type=float,
    default=0.0,
    show_default=True,
    help="Fault injection: answer this share (0-1) of completion requests with HTTP 500. Env KNEEPOINT_SIM_FAIL_FRACTION.",
)
@click.option(
    "--inter-node-gbps",
    envvar="KNEEPOINT_SIM_INTER_NODE_GBPS",
    type=float,
    default=None,
    help="Link between pipeline stages on different nodes, Gb/s (400 = 400 Gb/s RDMA; default: stages share a node).",
)
@click.option(
    "--profiler-config",
    envvar="KNEEPOINT_SIM_PROFILER_CONFIG",
    default=None,
    metavar="JSON",
    help='As vLLM: \'{"profiler":"torch","torch_profiler_dir":"/abs/dir"}\' serves POST /start_profile and '
    "/stop_profile and writes one trace per rank (docs/trace.md).",
)
@click.option(
    "--calibration",
    envvar=CALIBRATION_ENV,
    default=None,
    metavar="FILE",
    help="The step model's constants: a JSON file shaped as the shipped kneepoint/data/simulator_calibration.json, such as "
    "one `python -m kneepoint.simulator.calibration_vllm DATA --write --output FILE` fitted to your own captures "
    '(docs/simulator.md, "Calibration"). Default: the shipped one. Env KNEEPOINT_SIM_CALIBRATION.',
)
@click.option(
    "--async-scheduling/--no-async-scheduling",
    default=True,
    show_default=True,
    help="As vLLM 0.24 (on by default there): step k+1 is planned while step k runs, so a request reaching a busy engine joins step k+2.",
)
@click.pass_context
def command(ctx: click.Context, **opts: Any) -> None:
    """Serve a vLLM-compatible engine simulator (no GPU needed)."""
    logging.basicConfig(
        level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(asctime)s [kneepoint.sim] %(message)s", datefmt="%m-%d %H:%M:%S"
    )
    extra = list(ctx.args)
    model = opts["model"]
    if model is None and extra and not extra[0].startswith("-"):
        model = extra.pop(0)  # vllm serve MODEL
    if extra:
        log.warning("ignoring vLLM flag(s) the simulator does not model: %s", " ".join(extra))
    if not model:
        fail("--model", "required (a model name or path, as vllm serve takes it)")
    try:
        settings = build_settings(model, opts)
    except EngineRefusal as refusal:
        # vLLM's shape: the start-up up to where it fails, the root cause, the API server's traceback, exit 1.
        sys.exit(run_failure(refusal))
    try:
        asyncio.run(serve_forever(settings))
    except OSError as exc:  # port in use, address not available
        click.echo(f"kneepoint sim: cannot listen on {settings.host}:{settings.port}/{settings.dcgm_port}: {exc}", err=True)
        sys.exit(1)


def build_settings(model: str, opts: dict[str, Any]) -> SimulatorSettings:
    """Validate the flags, size the engine like vLLM, and return the server's settings (exits on errors)."""
    tp, pp = opts["tensor_parallel_size"], opts["pipeline_parallel_size"]
    try:
        calibration = load_calibration(opts.get("calibration"))
    except ValueError as exc:
        fail("--calibration", str(exc))
    if opts.get("calibration"):
        log.info("Step model's constants from %s", opts["calibration"])
    if tp < 1:
        fail("--tensor-parallel-size", f"must be at least 1; got {tp}")
    if pp < 1:
        fail("--pipeline-parallel-size", f"must be at least 1; got {pp}")
    util = opts["gpu_memory_utilization"]
    if not 0.0 < util <= 1.0:
        fail("--gpu-memory-utilization", f"must be in (0, 1]; got {util}")
    gpu = find_gpu_type(opts["gpu"])
    if gpu is None:
        fail("--gpu", f"unknown GPU type {opts['gpu']!r}; known: {', '.join(gpu_names())} (or a GFD product label)")
    interconnect = (opts["interconnect"] or gpu.interconnect).strip().lower()
    if interconnect not in INTERCONNECTS:
        fail("--interconnect", f"must be one of {', '.join(INTERCONNECTS)}; got {opts['interconnect']!r}")
    if interconnect == "nvlink" and gpu.interconnect != "nvlink":
        fail("--interconnect", f"{gpu.name} has no NVLink (its catalogue link is {gpu.interconnect}); use pcie")
    dtype_flag = opts["dtype"].strip().lower()
    if dtype_flag not in _DTYPES:
        fail("--dtype", f"must be one of {', '.join(_DTYPES)}; got {opts['dtype']!r}")
    weight_dtype = _DTYPES[dtype_flag]
    quant = opts["quantization"]
    if quant:
        q = quant.strip().lower()
        if q not in _QUANTIZATION:
            fail("--quantization", f"must be one of {', '.join(sorted(_QUANTIZATION))}; got {quant!r}")
        weight_dtype = _QUANTIZATION[q]
    kv_dtype = opts["kv_cache_dtype"].strip().lower()
    if kv_dtype not in _KV_DTYPES:
        fail("--kv-cache-dtype", f"must be one of {', '.join(_KV_DTYPES)}; got {opts['kv_cache_dtype']!r}")
    block = opts["block_size"]
    if block not in (1, 8, 16, 32, 64, 128):
        fail("--block-size", f"must be one of 1, 8, 16, 32, 64, 128; got {block}")
    if opts["noise"] < 0:
        fail("--noise", f"must be >= 0; got {opts['noise']}")
    for flag, key in (("--port", "port"), ("--dcgm-port", "dcgm_port")):
        if not 0 <= opts[key] <= 65535 or (key == "port" and opts[key] == 0):
            fail(flag, f"must be a port number; got {opts[key]}")
    if not 0.0 <= opts["fail_fraction"] <= 1.0:
        fail("--fail-fraction", f"must be in [0, 1]; got {opts['fail_fraction']}")
    if opts["inter_node_gbps"] is not None and opts["inter_node_gbps"] <= 0:
        fail("--inter-node-gbps", f"must be > 0; got {opts['inter_node_gbps']}")
    arch = resolve_architecture(opts["architecture"], model)
    max_num_seqs = opts["max_num_seqs"] or default_max_num_seqs(gpu)
    max_batched = opts["max_num_batched_tokens"] or default_max_num_batched_tokens(gpu)
    if max_num_seqs < 1:
        fail("--max-num-seqs", f"must be at least 1; got {max_num_seqs}")
    if max_batched < 1:
        fail("--max-num-batched-tokens", f"must be at least 1; got {max_batched}")
    if max_batched < max_num_seqs:
        fail("--max-num-batched-tokens", f"({max_batched}) must be >= --max-num-seqs ({max_num_seqs}), as vLLM requires")
    requested_len = parse_max_model_len(opts["max_model_len"]) if opts["max_model_len"] is not None else DEFAULT_MAX_MODEL_LEN
    tier = Tier(tp, pp)
    est = estimate_memory(
        arch,
        gpu,
        tier,
        dtype=weight_dtype,
        kv_cache_dtype=kv_dtype,
        max_model_len=requested_len or block,
        concurrency=max_num_seqs,
        context_len=requested_len or block,
        gpu_memory_utilization=util,
        enforce_eager=opts["enforce_eager"],
        max_num_batched_tokens=max_batched,
        max_num_seqs=max_num_seqs,
        interconnect=interconnect,
    )
    load_seconds = opts["model_load_seconds"]
    if load_seconds is None:
        load_seconds = min(LOAD_SECONDS_CAP, est.weights_bytes_per_gpu / LOAD_BYTES_PER_SECOND)
    if load_seconds < 0:
        fail("--model-load-seconds", f"must be >= 0; got {load_seconds}")
    names = tuple(opts["served_model_name"]) or (model,)
    pool_tokens = max(0, est.kv_pool_bytes_per_gpu) // est.kv_bytes_per_token_per_gpu
    num_blocks = int(pool_tokens // block)
    figures = StartupFigures(
        model=model,
        served_model_name=names[0],
        tensor_parallel=tp,
        pipeline_parallel=pp,
        dtype=weight_dtype,
        max_model_len=requested_len or num_blocks * block,
        max_num_batched_tokens=max_batched,
        max_num_seqs=max_num_seqs,
        gpu_memory_utilization=util,
        weights_gib=est.weights_bytes_per_gpu / GIB,
        available_kv_gib=available_kv_bytes(est) / GIB,
        kv_cache_tokens=num_blocks * block,
        graph_gib=est.cuda_graph_bytes_per_gpu / GIB,
        enforce_eager=opts["enforce_eager"],
        load_seconds=load_seconds,
        host=opts["host"],
        port=opts["port"],
        version=VLLM_VERSION,
    )
    check_fit(gpu, arch, tier, est, requested_len, figures)
    if requested_len is None:  # auto: the largest length the pool holds
        requested_len = min(AUTO_MAX_MODEL_LEN_CAP, num_blocks * block)
        figures = replace(figures, max_model_len=requested_len)
    if num_blocks < 1 or num_blocks * block < requested_len:
        raise EngineRefusal("kv_cache", NO_KV_MEMORY, figures)
    log.info(
        "Model %s as %s: %d layers, %.2f B parameters; %s TP=%d PP=%d over %s",
        model,
        arch.name,
        arch.num_layers,
        arch.num_parameters / 1e9,
        gpu.display_name,
        tp,
        pp,
        interconnect,
    )
    fp8 = weight_dtype == "fp8"
    hardware = Hardware.from_gpu(gpu, interconnect, fp8_compute=fp8, inter_node_gbps=opts["inter_node_gbps"])
    deployment = Deployment(
        tensor_parallel=tp,
        pipeline_parallel=pp,
        weight_bytes_per_gpu=est.weights_bytes_per_gpu,
        kv_bytes_per_token_per_gpu=est.kv_bytes_per_token_per_gpu,
        activation_bytes=4 if weight_dtype == "float32" else 2,
        weight_dtype=weight_dtype,
        enforce_eager=opts["enforce_eager"],
        cuda_graph_max_tokens=default_cuda_graph_max_tokens(max_num_seqs),
    )
    perf = PerfModel(shape_from_architecture(arch), hardware, deployment, calibration)
    # vllm:cache_config_info's labels as vLLM 0.24 writes them (tests/data/vllm/8b-tp1-cache-config-info-mns128.txt).
    # Prefix caching is vLLM's default (on); the simulator serves no prompt twice from cache.
    pool = num_blocks * block
    cache_config = {
        "_block_size_resolved": "True",
        "block_size": str(block),
        "cache_dtype": kv_dtype,
        "calculate_kv_scales": "False",
        "enable_prefix_caching": "True",
        "gpu_memory_utilization": str(util),
        "hash_block_size": "None",
        "is_attention_free": "False",
        "kv_cache_dtype_skip_layers": "[]",
        "kv_cache_max_concurrency": str(pool / requested_len),
        "kv_cache_memory_bytes": "None",
        "kv_cache_size_tokens": str(pool),
        "kv_offloading_backend": "native",
        "kv_offloading_size": "None",
        "kv_sharing_fast_prefill": "False",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "mamba_page_size_padded": "None",
        "mamba_ssm_cache_dtype": "auto",
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(num_blocks),
        "num_gpu_blocks_override": "None",
        "prefix_caching_hash_algo": "sha256",
        "sliding_window": "None",
        "user_specified_block_size": "False",
        "user_specified_mamba_block_size": "False",
    }
    return SimulatorSettings(
        model=model,
        served_model_names=names,
        host=opts["host"],
        port=opts["port"],
        dcgm_port=opts["dcgm_port"],
        max_model_len=requested_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_batched,
        num_gpu_blocks=num_blocks,
        block_size=block,
        gpus=tier.gpus,
        gpu=gpu,
        interconnect=interconnect,
        memory_used_bytes_per_gpu=est.budget_bytes_per_gpu,
        weights_bytes_per_gpu=est.weights_bytes_per_gpu,
        cache_config=cache_config,
        perf=perf,
        noise=opts["noise"],
        seed=opts["seed"],
        model_load_seconds=load_seconds,
        truth_log=opts["truth_log"],
        hostname=os.environ.get("NODE_NAME") or socket.gethostname(),
        pod=os.environ.get("POD_NAME") or None,
        namespace=os.environ.get("POD_NAMESPACE") or None,
        container=os.environ.get("CONTAINER_NAME") or None,
        fail_fraction=opts["fail_fraction"],
        startup=figures,
        profiler=_profiler_config(opts.get("profiler_config")),
        async_scheduling=opts["async_scheduling"],
    )


def _profiler_config(text: str | None) -> ProfilerConfig | None:
    if text is None:
        return None
    try:
        return parse_profiler_config(text)
    except ProfilerConfigError as err:
        fail("--profiler-config", str(err).removeprefix("--profiler-config").lstrip(".:").strip())
