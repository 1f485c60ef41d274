"""``kneepoint estimate``: per-GPU memory of every TP/PP tier before spending GPU time.

Reads the model's shape (a preset, a Hugging Face config.json or explicit numbers), the
GPU type and the fixed workload, and prints one row per tier: weights per GPU, KV cache
per sequence, memory needed at the target concurrency, vLLM's budget, whether the tier
fits (and why not), and how many sequences of the given context its KV pool holds. The
arithmetic lives in :mod:`kneepoint.core.memory_estimate`; this module only parses flags
and renders.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from kneepoint.core.architectures import (
    ModelArchitecture,
    architecture_from_spec,
    from_hf_config,
    get_preset,
    match_preset_for_model_name,
    preset_info,
    preset_names,
)
from kneepoint.core.gpus import GIB, GpuType, all_gpu_types, find_gpu_type, gpu_names
from kneepoint.core.memory_estimate import (
    BYTES_PER_PARAM,
    DTYPE_ALIASES,
    KV_CACHE_DTYPE_BYTES,
    NCCL_BUFFER_BYTES,
    MemoryEstimate,
    estimate_memory,
)
from kneepoint.core.spec import TP_SIZES, ArchitectureSpec
from kneepoint.core.tiers import build_ladder


class InputError(click.ClickException):
    """Bad input: printed as one line ``Error: ...`` and exit code 2 (like a usage error, without the usage block)."""

    exit_code = 2


class _OneLineErrorCommand(click.Command):
    """Turn click's own usage errors (bad number, unknown flag) into one line naming the flag."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as exc:
            raise InputError(exc.format_message()) from None


def _parse_int_list(flag: str, text: str, allowed: tuple[int, ...] | None = None, minimum: int = 1) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    allowed_text = ", ".join(map(str, allowed)) if allowed else f"integers >= {minimum}"
    if not values:
        raise InputError(f"{flag}: expected a comma-separated list of {allowed_text}; got {text!r}")
    for v in values:
        if (allowed and v not in allowed) or v < minimum:
            raise InputError(f"{flag}: {v} is not allowed; use a comma-separated list of {allowed_text}")
    return values


def _resolve_architecture(preset: str | None, config: str | None, model: str | None, shape: dict[str, int | None]) -> ModelArchitecture:
    explicit: dict[str, Any] = {k: v for k, v in shape.items() if v is not None}
    sources = [
        name for name, given in (("--preset", preset), ("--config", config), ("--model", model), ("--num-layers ...", explicit)) if given
    ]
    if len(sources) != 1:
        raise InputError(
            "give exactly one architecture source: --preset NAME, --config config.json, --model HF-NAME or --num-layers with the "
            f"other shape flags{' (got ' + ', '.join(sources) + ')' if sources else ''}; presets: {', '.join(preset_names())}"
        )
    if preset:
        try:
            return get_preset(preset)
        except KeyError:
            raise InputError(f"--preset: unknown preset {preset!r}; known: {', '.join(preset_names())}") from None
    if model:
        matched = match_preset_for_model_name(model)
        if matched is None:
            raise InputError(
                f"--model: {model!r} matches no preset; use --config config.json or --preset (one of {', '.join(preset_names())})"
            )
        return get_preset(matched)
    if config:
        try:
            data = json.loads(Path(config).read_text(encoding="utf-8"))
        except OSError as exc:
            raise InputError(f"--config: cannot read {config!r}: {exc.strerror or exc}") from None
        except json.JSONDecodeError as exc:
            raise InputError(f"--config: {config!r} is not JSON ({exc.msg} at line {exc.lineno})") from None
        try:
            return from_hf_config(data, name=Path(config).parent.name or Path(config).name)
        except ValueError as exc:
            raise InputError(f"--config: {exc}") from None
    try:
        return architecture_from_spec(ArchitectureSpec(**explicit))
    except ValueError as exc:
        # Translate the spec field path into this command's flag names.
        message = str(exc).replace("spec.model.architecture.", "--").replace("spec.model.architecture", "shape flags")
        for camel, flag in (
            ("numLayers", "num-layers"),
            ("hiddenSize", "hidden-size"),
            ("numAttentionHeads", "num-attention-heads"),
            ("vocabSize", "vocab-size"),
            ("intermediateSize", "intermediate-size"),
            ("numExpertsPerToken", "num-experts-per-token"),
        ):
            message = message.replace(f"--{camel}", f"--{flag}")
        raise InputError(message) from None


def _resolve_gpu(name: str | None) -> GpuType:
    if not name:
        raise InputError(f"--gpu: required; one of {', '.join(gpu_names())} (or a GFD product label such as NVIDIA-H200)")
    gpu = find_gpu_type(name)
    if gpu is None:
        raise InputError(f"--gpu: unknown GPU type {name!r}; known: {', '.join(gpu_names())}")
    return gpu


def _fmt_gib(value: int) -> str:
    return f"{value / GIB:.1f} GiB"


def _render_table(arch: ModelArchitecture, gpu: GpuType, estimates: list[MemoryEstimate]) -> str:
    first = estimates[0]
    active = f", {arch.active_parameters_per_token / 1e9:.1f}B active" if arch.is_moe else ""
    attention = "MLA" if arch.uses_mla else f"{arch.num_attention_heads} heads / {arch.num_key_value_heads} KV heads"
    lines = [
        f"model {arch.name}: {arch.num_parameters / 1e9:.1f}B parameters{active}, {arch.num_layers} layers, {attention}",
        f"GPU {gpu.name} ({gpu.display_name}, {gpu.memory_bytes / GIB:.1f} GiB); weights {first.dtype}, KV cache {first.kv_cache_dtype}",
        f"workload {first.concurrency} sequences x {first.context_len} tokens; max-model-len {first.max_model_len}; "
        f"gpu-memory-utilization {first.gpu_memory_utilization:.2f}; CUDA graphs {'off' if first.enforce_eager else 'on'}; "
        f"profile {first.max_num_batched_tokens} tokens",
        "",
    ]
    header = ["tier", "GPUs", "weights/GPU", "KV/seq", f"needed@{first.concurrency}", "budget", "fits", f"max seqs@{first.context_len}"]
    rows = []
    for e in estimates:
        fits = "yes" if e.fits_target else f"NO: {e.short_reason}"
        rows.append(
            [
                e.tier.label,
                str(e.tier.gpus),
                _fmt_gib(e.weights_bytes_per_gpu),
                f"{e.kv_bytes_per_sequence_per_gpu / GIB:.3f} GiB",
                _fmt_gib(e.needed_bytes_per_gpu),
                _fmt_gib(e.budget_bytes_per_gpu),
                fits,
                str(e.max_concurrent_sequences),
            ]
        )
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    left = {0, 6}  # text columns; numbers are right-aligned
    for r in [header, *rows]:
        lines.append("  ".join(c.ljust(widths[i]) if i in left else c.rjust(widths[i]) for i, c in enumerate(r)).rstrip())
    lines.append("")
    for e in estimates:
        lines.append(f"{e.tier.label}: {e.reason}")
    lines.append("")
    lines.append(
        f"needed = weights + KV for {first.concurrency} x {first.context_len} tokens + activations + overhead (CUDA context, NCCL, "
        "CUDA graphs); budget = gpu-memory-utilization x GPU memory; max seqs = KV pool / KV per sequence. See docs/estimator.md."
    )
    return "\n".join(lines)


def _render_presets() -> str:
    header = ["preset", "parameters", "active", "layers", "hidden", "heads/KV", "experts", "source"]
    rows = []
    for name in preset_names():
        arch, info = get_preset(name), preset_info(name)
        experts = f"{arch.num_experts} (top {arch.num_experts_per_token})" if arch.is_moe else "-"
        heads = f"{arch.num_attention_heads}/MLA" if arch.uses_mla else f"{arch.num_attention_heads}/{arch.num_key_value_heads}"
        rows.append(
            [
                name,
                f"{arch.num_parameters / 1e9:.2f}B",
                f"{arch.active_parameters_per_token / 1e9:.2f}B",
                str(arch.num_layers),
                str(arch.hidden_size),
                heads,
                experts,
                info.get("source", ""),
            ]
        )
    return _columns(header, rows)


def _render_gpus() -> str:
    header = ["gpu", "name", "memory", "HBM GB/s", "bf16 TFLOP/s", "link", "GFD product label"]
    rows = [
        [
            g.name,
            g.display_name,
            f"{g.memory_bytes / GIB:.1f} GiB",
            f"{g.hbm_bandwidth_gbps:.0f}",
            f"{g.bf16_tflops:.0f}",
            g.interconnect,
            g.product_labels[0] if g.product_labels else "",
        ]
        for g in all_gpu_types()
    ]
    return _columns(header, rows)


def _columns(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in [header, *rows])


_DTYPE_CHOICES = tuple(BYTES_PER_PARAM) + tuple(DTYPE_ALIASES)
_KV_CHOICES = ("auto",) + tuple(KV_CACHE_DTYPE_BYTES)


@click.command(cls=_OneLineErrorCommand, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--preset", help="Architecture preset (see --list-presets).")
@click.option("--config", "config_path", help="Path to the model's Hugging Face config.json.")
@click.option("--model", help="Model name matched to a preset (meta-llama/Llama-3.1-8B-Instruct -> llama-3-8b).")
@click.option("--num-layers", type=int, help="Explicit shape: transformer layers.")
@click.option("--hidden-size", type=int, help="Explicit shape: hidden size.")
@click.option("--num-attention-heads", type=int, help="Explicit shape: attention heads.")
@click.option("--num-key-value-heads", type=int, help="Explicit shape: KV heads (default: attention heads).")
@click.option("--head-dim", type=int, help="Explicit shape: head size (default: hidden / heads).")
@click.option("--intermediate-size", type=int, help="Explicit shape: MLP intermediate size.")
@click.option("--vocab-size", type=int, help="Explicit shape: vocabulary size.")
@click.option("--num-experts", type=int, help="Explicit shape: routed experts (MoE).")
@click.option("--num-experts-per-token", type=int, help="Explicit shape: experts per token (MoE).")
@click.option("--moe-intermediate-size", type=int, help="Explicit shape: one expert's intermediate size (MoE).")
@click.option("--gpu", help="GPU type (see --list-gpus) or GFD product label, e.g. h200 or NVIDIA-H200.")
@click.option("--dtype", default="bfloat16", show_default=True, help=f"Weight precision: {', '.join(BYTES_PER_PARAM)}.")
@click.option("--kv-cache-dtype", default="auto", show_default=True, help=f"KV-cache precision: {', '.join(_KV_CHOICES)}.")
@click.option("--concurrency", type=int, default=32, show_default=True, help="Sequences in flight (the target).")
@click.option("--context", "context_len", type=int, help="Tokens per sequence (default: input-len + output-len = 1280).")
@click.option("--input-len", type=int, help="Prompt tokens (context = input + output).")
@click.option("--output-len", type=int, help="Output tokens (context = input + output).")
@click.option("--max-model-len", type=int, default=4096, show_default=True, help="vLLM --max-model-len.")
@click.option("--gpu-memory-utilization", type=float, default=0.90, show_default=True, help="vLLM --gpu-memory-utilization, in (0, 1].")
@click.option("--tp", "tp_text", default="1,2,4,8", show_default=True, help="Tensor-parallel sizes, comma-separated.")
@click.option("--pp", "pp_text", default="1", show_default=True, help="Pipeline-parallel sizes, comma-separated.")
@click.option("--enforce-eager", is_flag=True, help="No CUDA graphs (vLLM --enforce-eager).")
@click.option("--max-num-batched-tokens", type=int, help="vLLM --max-num-batched-tokens (default: vLLM's for the GPU).")
@click.option("--max-num-seqs", type=int, help="vLLM --max-num-seqs (default: --concurrency).")
@click.option("--interconnect", help=f"Link between the GPUs, for NCCL buffers: {', '.join(NCCL_BUFFER_BYTES)} (default: the GPU's).")
@click.option("--output", "output_format", default="table", show_default=True, help="table or json.")
@click.option("--list-presets", is_flag=True, help="List architecture presets and exit.")
@click.option("--list-gpus", is_flag=True, help="List GPU types and exit.")
def command(
    preset: str | None,
    config_path: str | None,
    model: str | None,
    num_layers: int | None,
    hidden_size: int | None,
    num_attention_heads: int | None,
    num_key_value_heads: int | None,
    head_dim: int | None,
    intermediate_size: int | None,
    vocab_size: int | None,
    num_experts: int | None,
    num_experts_per_token: int | None,
    moe_intermediate_size: int | None,
    gpu: str | None,
    dtype: str,
    kv_cache_dtype: str,
    concurrency: int,
    context_len: int | None,
    input_len: int | None,
    output_len: int | None,
    max_model_len: int,
    gpu_memory_utilization: float,
    tp_text: str,
    pp_text: str,
    enforce_eager: bool,
    max_num_batched_tokens: int | None,
    max_num_seqs: int | None,
    interconnect: str | None,
    output_format: str,
    list_presets: bool,
    list_gpus: bool,
) -> None:
    """Estimate per-GPU memory for every TP/PP tier: which tiers cannot fit, and how many sequences the others hold."""
    if list_presets or list_gpus:
        if list_presets:
            click.echo(_render_presets())
        if list_gpus:
            click.echo(("\n" if list_presets else "") + _render_gpus())
        return
    if output_format not in ("table", "json"):
        raise InputError(f"--output: must be table or json; got {output_format!r}")
    if dtype.lower() not in _DTYPE_CHOICES:
        raise InputError(f"--dtype: must be one of {', '.join(BYTES_PER_PARAM)}; got {dtype!r}")
    if kv_cache_dtype.lower() not in _KV_CHOICES:
        raise InputError(f"--kv-cache-dtype: must be one of {', '.join(_KV_CHOICES)}; got {kv_cache_dtype!r}")
    if interconnect is not None and interconnect not in NCCL_BUFFER_BYTES:
        raise InputError(f"--interconnect: must be one of {', '.join(NCCL_BUFFER_BYTES)}; got {interconnect!r}")
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise InputError(f"--gpu-memory-utilization: must be in (0, 1]; got {gpu_memory_utilization}")
    for flag, value in (
        ("--concurrency", concurrency),
        ("--max-model-len", max_model_len),
        ("--context", context_len),
        ("--input-len", input_len),
        ("--output-len", output_len),
        ("--max-num-batched-tokens", max_num_batched_tokens),
        ("--max-num-seqs", max_num_seqs),
    ):
        if value is not None and value < 1:
            raise InputError(f"{flag}: must be at least 1; got {value}")
    if context_len is not None and (input_len is not None or output_len is not None):
        raise InputError("--context: give either --context or --input-len/--output-len, not both")
    if context_len is None:
        context_len = (input_len if input_len is not None else 1024) + (output_len if output_len is not None else 256)
    if context_len > max_model_len:
        raise InputError(f"--context: {context_len} tokens exceed --max-model-len {max_model_len}")
    tps = _parse_int_list("--tp", tp_text, allowed=TP_SIZES)
    pps = _parse_int_list("--pp", pp_text, minimum=1)

    arch = _resolve_architecture(
        preset,
        config_path,
        model,
        {
            "num_layers": num_layers,
            "hidden_size": hidden_size,
            "num_attention_heads": num_attention_heads,
            "num_key_value_heads": num_key_value_heads,
            "head_dim": head_dim,
            "intermediate_size": intermediate_size,
            "vocab_size": vocab_size,
            "num_experts": num_experts,
            "num_experts_per_token": num_experts_per_token,
            "moe_intermediate_size": moe_intermediate_size,
        },
    )
    gpu_type = _resolve_gpu(gpu)
    estimates = [
        estimate_memory(
            arch,
            gpu_type,
            tier,
            dtype=dtype,
            kv_cache_dtype=kv_cache_dtype,
            max_model_len=max_model_len,
            concurrency=concurrency,
            context_len=context_len,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            interconnect=interconnect,
        )
        for tier in build_ladder(tps, pps)
    ]
    if output_format == "json":
        document = {
            "architecture": {
                **arch.to_dict(),
                "num_parameters": arch.num_parameters,
                "active_parameters_per_token": arch.active_parameters_per_token,
            },
            "gpu": {"name": gpu_type.name, "displayName": gpu_type.display_name, "memoryBytes": gpu_type.memory_bytes},
            "tiers": [e.to_dict() for e in estimates],
        }
        click.echo(json.dumps(document, indent=2))
        return
    click.echo(_render_table(arch, gpu_type, estimates))
