"""Per-GPU memory estimate of a vLLM replica at one TP/PP tier, before any GPU time is spent.

The estimate mirrors how vLLM sizes itself at start-up: it may use
``gpu_memory_utilization x device memory`` (the *budget*); weights, the activation peak
of its profiling forward pass and the runtime overhead (CUDA context, NCCL buffers, CUDA
graphs) come off the top, and what is left becomes the KV-cache *pool*. The engine starts
when the pool holds one ``max_model_len`` sequence (vLLM's own check); the workload fits
when it holds ``concurrency`` sequences of ``context`` tokens.

Two figures are kept apart on purpose (DESIGN.md section 7): vLLM pre-allocates the pool,
so framebuffer-used reads about the same on every tier. What a workload *needs* is weights
+ the KV cache it actually uses + overhead; :func:`needed_memory_bytes` computes that from
a measured KV-cache usage fraction.

Every constant below says where its number comes from. "The H200 data" means
``tests/data/h200`` (plain-PyTorch Llama shapes at TP 1/2/4, allocator and NVML readings);
docs/estimator.md has the table of measured against estimated values.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from kneepoint.core.architectures import REPLICATED, SPLIT, SPLIT_BY_KV_HEAD, ModelArchitecture, WeightGroup, kv_heads_per_rank
from kneepoint.core.gpus import GIB, GpuType
from kneepoint.core.spec import DTYPES, ExperimentSpec
from kneepoint.core.tiers import Tier, build_ladder

MIB = 1024**2

BYTES_PER_PARAM: dict[str, float] = {
    "float32": 4.0,
    "bfloat16": 2.0,
    "float16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}
"""Bytes per weight of a linear layer at each weight precision (spec.model.dtype values)."""

INT4_GROUP_SCALE_BYTES = 2.0 / 128
"""int4 checkpoints (AWQ/GPTQ) carry one fp16 scale per group of 128 weights: 1/64 byte per weight."""

DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
KV_CACHE_DTYPE_BYTES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "bfloat16": 2, "float16": 2, "float32": 4}
"""Explicit KV-cache precisions; ``auto`` means the activation precision (16-bit, or 32-bit for float32)."""

KV_BLOCK_TOKENS = 16
"""vLLM's default KV block size: a sequence occupies whole blocks (``--block-size`` 16 on CUDA)."""

# -- Runtime overhead, calibrated on the H200 data (NVML used - CUDA total + CUDA free etc.):
CUDA_CONTEXT_BYTES = 768 * MIB
"""Memory the process holds outside PyTorch's allocator at TP=1: CUDA context, loaded kernels,
cuBLAS handles. H200 data, TP=1 decode points: cuda_used - torch_reserved = 767-769 MiB."""

ALLOCATOR_SLACK_BYTES = 160 * MIB
"""PyTorch caching-allocator reserve above its peak allocation (fragmentation). H200 data, every
decode point: torch_reserved - torch_max_allocated = 17-351 MiB, mean 158 MiB."""

NCCL_BUFFER_BYTES = {"nvlink": 784 * MIB, "pcie": 328 * MIB}
"""NCCL communicator buffers per GPU once TP x PP > 1, outside PyTorch's allocator. H200 data:
non-PyTorch memory at TP 2 and 4 minus the TP=1 figure is 777-791 MiB with NVLink peer-to-peer
and 321-335 MiB with NCCL_P2P_DISABLE=1 (transfers through host memory, as on PCIe-only GPUs
without P2P). The same at TP=2 and TP=4; TP=8 is assumed equal (not measured)."""

CUDA_GRAPH_BYTES = 512 * MIB
"""Memory of vLLM's captured CUDA graphs (absent with --enforce-eager). Not measured here: vLLM's
start-up line "Graph capturing finished in N secs, took X GiB" reports 0.13-0.21 GiB for 1-3B models
(vllm-project/vllm PR #11349; generative-computing/mellea PR #416); 0.5 GiB is an allowance for
larger models, not a measurement."""

# -- Activation peak of vLLM's profiling run (a forward pass of max_num_batched_tokens tokens,
#    then a sampler pass over min(max_num_seqs, tokens) sequences):
ACTIVATION_WORKSPACE_BYTES = 480 * MIB
"""Fixed workspaces that exist whatever the token count (attention-backend and GEMM workspaces,
rotary and sampler scratch). Fitted so that the formula gives vLLM's logged "PyTorch activation
peak memory 1.26GiB" for Meta-Llama-3-8B on H100 (vllm-project/vllm PR #10511, 8192 tokens, 256
sequences); the same line at TP=2 (also 1.26 GiB) is then reproduced without refitting."""

SAMPLER_BYTES_PER_LOGIT = 26
"""Bytes per (sequence, vocabulary entry) during sampling: 16-bit logits (2), their fp32 copy,
softmax probabilities, log-probabilities and sorted values for top-p/top-k (4 x 4) and int64 sort
indices (8). Derived from the sampler's tensors, not measured."""

VLLM_LARGE_GPU_BYTES = 160 * GIB
VLLM_H100_CLASS_BYTES = 70 * GIB


def default_max_num_batched_tokens(gpu: GpuType) -> int:
    """vLLM's OpenAI-server default ``--max-num-batched-tokens`` for this GPU (vLLM 0.33 arg_utils):
    16384 on GPUs with >= 160 GiB, 8192 on >= 70 GiB GPUs that are not A100s, else 2048."""
    if gpu.memory_bytes >= VLLM_LARGE_GPU_BYTES:
        return 16384
    if gpu.memory_bytes >= VLLM_H100_CLASS_BYTES and "a100" not in gpu.name.lower():
        return 8192
    return 2048


def normalise_dtype(dtype: str) -> str:
    """Canonical weight dtype (``bf16`` -> ``bfloat16``); ``ValueError`` naming the allowed values."""
    canonical = DTYPE_ALIASES.get(dtype.strip().lower(), dtype.strip().lower())
    if canonical not in BYTES_PER_PARAM:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {dtype!r}")
    return canonical


def activation_bytes_per_value(dtype: str) -> int:
    """Activations run in 16-bit for every weight precision except float32."""
    return 4 if normalise_dtype(dtype) == "float32" else 2


def kv_cache_bytes_per_value(dtype: str, kv_cache_dtype: str = "auto") -> int:
    """Bytes per cached K/V value: ``auto`` follows the activation precision (vLLM: the model dtype)."""
    wanted = kv_cache_dtype.strip().lower()
    if wanted == "auto":
        return activation_bytes_per_value(dtype)
    wanted = DTYPE_ALIASES.get(wanted, wanted)
    if wanted not in KV_CACHE_DTYPE_BYTES:
        raise ValueError(f"kv_cache_dtype must be one of auto, {', '.join(KV_CACHE_DTYPE_BYTES)}; got {kv_cache_dtype!r}")
    return KV_CACHE_DTYPE_BYTES[wanted]


def _kv_dtype_name(dtype: str, kv_cache_dtype: str) -> str:
    wanted = kv_cache_dtype.strip().lower()
    if wanted == "auto":
        return "float32" if normalise_dtype(dtype) == "float32" else ("float16" if normalise_dtype(dtype) == "float16" else "bfloat16")
    return DTYPE_ALIASES.get(wanted, wanted)


def round_up_to_blocks(tokens: int, block_tokens: int = KV_BLOCK_TOKENS) -> int:
    """Tokens a sequence of ``tokens`` occupies in whole KV blocks."""
    return math.ceil(tokens / block_tokens) * block_tokens


def pipeline_stage_layers(num_layers: int, pipeline_parallel: int) -> list[tuple[int, int]]:
    """Layer ranges ``[start, end)`` of each pipeline stage, split as vLLM's ``get_pp_indices`` does:
    equal shares, the remainder going one each to the stages before the last."""
    per = num_layers // pipeline_parallel
    sizes = [per] * pipeline_parallel
    for i in range(2, num_layers % pipeline_parallel + 2):
        sizes[-i] += 1
    ranges, start = [], 0
    for size in sizes:
        ranges.append((start, start + size))
        start += size
    return ranges


def _group_bytes_per_gpu(group: WeightGroup, arch: ModelArchitecture, tensor_parallel: int, dtype: str) -> float:
    if group.split == SPLIT:
        params = group.parameters / tensor_parallel
    elif group.split == SPLIT_BY_KV_HEAD:
        params = group.parameters * kv_heads_per_rank(arch.num_key_value_heads, tensor_parallel) / arch.num_key_value_heads
    else:
        assert group.split == REPLICATED
        params = group.parameters
    if group.quantizable:
        per = BYTES_PER_PARAM[dtype] + (INT4_GROUP_SCALE_BYTES if dtype == "int4" else 0.0)
    else:
        per = 4.0 if dtype == "float32" else 2.0  # unquantized tensors stay in the activation precision
    return params * per


def stage_weight_bytes_per_gpu(arch: ModelArchitecture, tier: Tier, dtype: str, stage: int) -> int:
    """Weight bytes one GPU of pipeline stage ``stage`` holds (first stage: embedding; last: lm_head)."""
    dtype = normalise_dtype(dtype)
    ranges = pipeline_stage_layers(arch.num_layers, tier.pipeline_parallel)
    start, end = ranges[stage]
    groups = list(arch.embedding_groups(first_stage=stage == 0, last_stage=stage == len(ranges) - 1))
    for i in range(start, end):
        groups += arch.layer_groups(i)
    total = sum(_group_bytes_per_gpu(g, arch, tier.tensor_parallel, dtype) for g in groups)
    return round(total * arch.parameter_scale)


def weight_bytes_per_gpu(arch: ModelArchitecture, tier: Tier, dtype: str) -> int:
    """Weight bytes on the most loaded GPU of the tier."""
    return max(stage_weight_bytes_per_gpu(arch, tier, dtype, s) for s in range(tier.pipeline_parallel))


def kv_bytes_per_token_per_gpu(arch: ModelArchitecture, tier: Tier, dtype: str, kv_cache_dtype: str = "auto", stage: int = 0) -> int:
    """KV-cache bytes one token occupies on one GPU of a pipeline stage (its layers only)."""
    start, end = pipeline_stage_layers(arch.num_layers, tier.pipeline_parallel)[stage]
    return (end - start) * arch.kv_values_per_token_per_layer(tier.tensor_parallel) * kv_cache_bytes_per_value(dtype, kv_cache_dtype)


def _forward_values_per_token(arch: ModelArchitecture, tensor_parallel: int, has_dense: bool, has_moe: bool) -> int:
    """Live activation values per token at the largest point of one layer on one GPU.

    vLLM frees activations layer by layer, so the peak is the widest layer stage: the
    residual stream and normalised input (2 x hidden) plus, in the MLP, gate+up (2 x I/TP)
    and the activated product (I/TP); in a fused MoE, per routed expert the same plus its
    hidden-size output; in attention, q/k/v and the attention output.
    """
    tp = tensor_parallel
    d = arch.hidden_size
    base = 2 * d
    if arch.uses_mla:
        nope = arch.qk_nope_head_dim or arch.head_dim - arch.qk_rope_head_dim
        v = arch.v_head_dim or nope
        heads = math.ceil(arch.num_attention_heads / tp)
        attention = heads * (arch.head_dim + nope + 2 * v) + arch.kv_lora_rank + arch.qk_rope_head_dim + arch.q_lora_rank
    else:
        heads = math.ceil(arch.num_attention_heads / tp)
        attention = (2 * heads + 2 * kv_heads_per_rank(arch.num_key_value_heads, tp)) * arch.head_dim
    widest = attention
    if has_dense:
        widest = max(widest, 3 * math.ceil(arch.intermediate_size / tp))
    if has_moe:
        per_expert = 3 * math.ceil(arch.moe_intermediate_size / tp) + d
        shared = 3 * math.ceil(arch.shared_intermediate_size / tp)
        widest = max(widest, arch.num_experts_per_token * per_expert + shared + arch.num_experts)
    return base + widest


def activation_bytes_per_gpu(
    arch: ModelArchitecture,
    tier: Tier,
    dtype: str,
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    stage: int | None = None,
) -> int:
    """Activation peak of vLLM's profiling run on one GPU of a stage (default: the last stage).

    ``workspace + max(forward peak over max_num_batched_tokens tokens, sampler over
    min(max_num_seqs, tokens) sequences)``; only the last stage samples.
    """
    stages = pipeline_stage_layers(arch.num_layers, tier.pipeline_parallel)
    stage = len(stages) - 1 if stage is None else stage
    start, end = stages[stage]
    has_moe = arch.is_moe and end > arch.first_dense_layers
    has_dense = (not arch.is_moe) or start < arch.first_dense_layers
    per_token = _forward_values_per_token(arch, tier.tensor_parallel, has_dense, has_moe) * activation_bytes_per_value(dtype)
    forward = max_num_batched_tokens * per_token
    sampler = 0
    if stage == len(stages) - 1:
        sampler = min(max_num_seqs, max_num_batched_tokens) * arch.vocab_size * SAMPLER_BYTES_PER_LOGIT
    return ACTIVATION_WORKSPACE_BYTES + max(forward, sampler)


def overhead_parts(tier: Tier, interconnect: str, enforce_eager: bool) -> tuple[int, int, int]:
    """(CUDA context + allocator slack, NCCL buffers, CUDA graphs) bytes per GPU."""
    if interconnect not in NCCL_BUFFER_BYTES:
        raise ValueError(f"interconnect must be one of {', '.join(NCCL_BUFFER_BYTES)}; got {interconnect!r}")
    nccl = NCCL_BUFFER_BYTES[interconnect] if tier.gpus > 1 else 0
    graphs = 0 if enforce_eager else CUDA_GRAPH_BYTES
    return CUDA_CONTEXT_BYTES + ALLOCATOR_SLACK_BYTES, nccl, graphs


def tier_incompatibility(arch: ModelArchitecture, tier: Tier, gpu: GpuType, dtype: str) -> str | None:
    """Why vLLM would refuse this tier outright (before memory matters), or None."""
    tp = tier.tensor_parallel
    if arch.num_attention_heads % tp:
        return f"{arch.num_attention_heads} attention heads are not divisible by TP={tp} (vLLM refuses this tier)"
    kv = arch.num_key_value_heads
    if not arch.uses_mla and kv % tp and tp % kv:
        return f"{kv} KV heads and TP={tp}: neither divides the other (vLLM refuses this tier)"
    if tier.pipeline_parallel > arch.num_layers:
        return f"PP={tier.pipeline_parallel} exceeds the {arch.num_layers} layers"
    dtype = normalise_dtype(dtype)
    if dtype == "bfloat16" and not gpu.bf16_supported:
        return f"{gpu.display_name} has no bfloat16 support; use float16"
    return None


@dataclass(frozen=True)
class MemoryEstimate:
    """The estimate for one tier on one GPU type; byte figures are per GPU of the binding pipeline stage."""

    tier: Tier
    gpu_name: str
    dtype: str
    kv_cache_dtype: str
    """Resolved KV precision (``auto`` replaced by what it means)."""
    concurrency: int
    context_len: int
    max_model_len: int
    gpu_memory_utilization: float
    max_num_batched_tokens: int
    enforce_eager: bool
    interconnect: str
    gpu_memory_bytes: int
    weights_bytes_per_gpu: int
    kv_bytes_per_token_per_gpu: int
    kv_bytes_per_sequence_per_gpu: int
    """One sequence of ``context_len`` tokens, rounded up to whole KV blocks."""
    kv_cache_bytes_needed_per_gpu: int
    """concurrency x kv_bytes_per_sequence_per_gpu."""
    activation_bytes_per_gpu: int
    context_bytes_per_gpu: int
    """CUDA context + caching-allocator slack."""
    nccl_bytes_per_gpu: int
    cuda_graph_bytes_per_gpu: int
    overhead_bytes_per_gpu: int
    """context + NCCL + CUDA graphs: the runtime overhead."""
    needed_bytes_per_gpu: int
    """weights + activations + overhead + the KV cache the target concurrency needs."""
    budget_bytes_per_gpu: int
    """gpu_memory_utilization x GPU memory."""
    kv_pool_bytes_per_gpu: int
    """budget - weights - activations - overhead, at least 0: what vLLM would pre-allocate for KV."""
    max_concurrent_sequences: int
    """Sequences of ``context_len`` tokens the pool holds."""
    fits: bool
    """The engine can start: its pool holds at least one ``max_model_len`` sequence (vLLM's check)."""
    fits_target: bool
    """The pool also holds ``concurrency`` sequences of ``context_len`` tokens."""
    reason: str
    """One line with the numbers behind ``fits``/``fits_target``."""
    short_reason: str
    """A few words for table cells ("weights > budget")."""
    pipeline_stage: int = 0
    """The pipeline stage whose GPUs bind (fewest sequences); 0 without PP."""

    @property
    def weights_gib(self) -> float:
        return self.weights_bytes_per_gpu / GIB

    @property
    def kv_per_sequence_gib(self) -> float:
        return self.kv_bytes_per_sequence_per_gpu / GIB

    @property
    def kv_cache_needed_gib(self) -> float:
        return self.kv_cache_bytes_needed_per_gpu / GIB

    @property
    def activation_gib(self) -> float:
        return self.activation_bytes_per_gpu / GIB

    @property
    def overhead_gib(self) -> float:
        return self.overhead_bytes_per_gpu / GIB

    @property
    def needed_gib(self) -> float:
        return self.needed_bytes_per_gpu / GIB

    @property
    def budget_gib(self) -> float:
        return self.budget_bytes_per_gpu / GIB

    @property
    def kv_pool_gib(self) -> float:
        return self.kv_pool_bytes_per_gpu / GIB

    @property
    def non_kv_overhead_bytes_per_gpu(self) -> int:
        """Activations + runtime overhead: what is neither weights nor KV cache."""
        return self.activation_bytes_per_gpu + self.overhead_bytes_per_gpu

    def pool_bytes_for_tokens(self, pool_tokens: int) -> int:
        """Bytes per GPU of a KV pool of ``pool_tokens`` tokens (vLLM's ``kv_cache_size_tokens``): each GPU holds
        every token's K/V for its own heads and layers."""
        return pool_tokens * self.kv_bytes_per_token_per_gpu

    def needed_bytes_at_kv_usage(self, kv_usage_fraction: float) -> int:
        """Needed memory when vLLM reports this KV-cache usage fraction (see :func:`needed_memory_bytes`)."""
        return needed_memory_bytes(
            self.weights_bytes_per_gpu, self.kv_pool_bytes_per_gpu, kv_usage_fraction, self.non_kv_overhead_bytes_per_gpu
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form with tier name and GiB figures added."""
        out = dataclasses.asdict(self)
        out["tier"] = {
            "name": self.tier.name,
            "label": self.tier.label,
            "tensorParallel": self.tier.tensor_parallel,
            "pipelineParallel": self.tier.pipeline_parallel,
            "gpus": self.tier.gpus,
        }
        for name in ("weights", "kv_per_sequence", "kv_cache_needed", "activation", "overhead", "needed", "budget", "kv_pool"):
            out[f"{name}_gib"] = round(getattr(self, f"{name}_gib"), 3)
        return out


def needed_memory_bytes(
    weights_bytes_per_gpu: int, kv_pool_bytes_per_gpu: int, kv_usage_fraction: float, overhead_bytes_per_gpu: int
) -> int:
    """Memory a tier's workload needs per GPU: weights + used KV (fraction x pool) + overhead.

    ``kv_usage_fraction`` is vLLM's measured ``vllm:kv_cache_usage_perc`` (0-1) at peak.
    Framebuffer-used cannot tell this: vLLM pre-allocates the whole pool, so it reads the
    same on every tier. Pass as ``overhead_bytes_per_gpu`` everything that is neither
    weights nor KV (``MemoryEstimate.non_kv_overhead_bytes_per_gpu``: activations + runtime).
    """
    if not 0.0 <= kv_usage_fraction <= 1.0:
        raise ValueError(f"kv_usage_fraction must be between 0 and 1; got {kv_usage_fraction}")
    return int(weights_bytes_per_gpu + round(kv_usage_fraction * kv_pool_bytes_per_gpu) + overhead_bytes_per_gpu)


def _gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def estimate_memory(
    arch: ModelArchitecture,
    gpu: GpuType,
    tier: Tier,
    *,
    dtype: str = "bfloat16",
    kv_cache_dtype: str = "auto",
    max_model_len: int,
    concurrency: int,
    context_len: int,
    gpu_memory_utilization: float = 0.90,
    enforce_eager: bool = False,
    max_num_batched_tokens: int | None = None,
    max_num_seqs: int | None = None,
    interconnect: str | None = None,
) -> MemoryEstimate:
    """Estimate one tier: weights, KV cache, activations and overhead per GPU, and whether it fits.

    ``max_num_batched_tokens`` defaults to vLLM's server default for the GPU,
    ``max_num_seqs`` to ``concurrency`` (the experiment sets ``--max-num-seqs`` so), and
    ``interconnect`` to the GPU's default link (``nvlink``/``pcie``, for the NCCL buffers).
    With PP, every stage is estimated and the one holding the fewest sequences binds, as
    vLLM sizes one pool for all stages.
    """
    dtype = normalise_dtype(dtype)
    kv_cache_bytes_per_value(dtype, kv_cache_dtype)  # validates kv_cache_dtype early
    for label, value in (("max_model_len", max_model_len), ("concurrency", concurrency), ("context_len", context_len)):
        if value < 1:
            raise ValueError(f"{label} must be at least 1; got {value}")
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1]; got {gpu_memory_utilization}")
    tokens = max_num_batched_tokens or default_max_num_batched_tokens(gpu)
    seqs = max_num_seqs or concurrency
    link = interconnect or gpu.interconnect
    context_part, nccl_part, graph_part = overhead_parts(tier, link, enforce_eager)
    overhead = context_part + nccl_part + graph_part
    budget = int(gpu_memory_utilization * gpu.memory_bytes)
    ctx_tokens = round_up_to_blocks(context_len)
    mml_tokens = round_up_to_blocks(max_model_len)
    incompatible = tier_incompatibility(arch, tier, gpu, dtype)

    # Estimate each pipeline stage; the one with the fewest sequences binds.
    stages = []
    for s in range(tier.pipeline_parallel):
        weights = stage_weight_bytes_per_gpu(arch, tier, dtype, s)
        kv_token = kv_bytes_per_token_per_gpu(arch, tier, dtype, kv_cache_dtype, stage=s)
        activation = activation_bytes_per_gpu(arch, tier, dtype, max_num_batched_tokens=tokens, max_num_seqs=seqs, stage=s)
        pool = max(0, budget - weights - activation - overhead)
        per_seq = kv_token * ctx_tokens
        max_seqs = pool // per_seq if per_seq else 0
        stages.append((max_seqs, -weights, s, weights, kv_token, activation, pool, per_seq))
    max_seqs, _, stage, weights, kv_token, activation, pool, per_seq = min(stages)
    if incompatible:
        max_seqs = 0
    kv_needed = concurrency * per_seq
    needed = weights + activation + overhead + kv_needed
    mml_seq = kv_token * mml_tokens
    fits = incompatible is None and pool > 0 and pool >= mml_seq
    fits_target = fits and max_seqs >= concurrency

    non_kv = weights + activation + overhead
    util = f"{gpu_memory_utilization:.2f} x {gpu.memory_bytes / GIB:.1f} GiB"
    if incompatible:
        reason = incompatible
        short = "no bf16 on this GPU" if "bfloat16" in incompatible else ("heads vs TP" if "heads" in incompatible else "PP > layers")
    elif weights >= budget:
        reason = f"weights {_gib(weights)}/GPU exceed the budget {_gib(budget)} ({util})"
        short = "weights > budget"
    elif pool <= 0:
        reason = (
            f"weights {_gib(weights)} + activations {_gib(activation)} + overhead {_gib(overhead)} = {_gib(non_kv)}/GPU "
            f"leave no KV cache in the budget {_gib(budget)} ({util})"
        )
        short = "no room for KV cache"
    elif not fits:
        reason = (
            f"KV pool {pool / GIB:.2f} GiB/GPU is less than one {max_model_len}-token sequence ({mml_seq / GIB:.2f} GiB); "
            f"lower max-model-len or add GPUs"
        )
        short = f"< 1 seq of {max_model_len} tokens"
    elif not fits_target:
        reason = (
            f"KV pool {_gib(pool)}/GPU holds {max_seqs} sequences of {context_len} tokens, fewer than the {concurrency} asked "
            f"(needs {_gib(kv_needed)})"
        )
        short = f"only {max_seqs} of {concurrency} seqs"
    else:
        reason = (
            f"KV pool {_gib(pool)}/GPU holds {max_seqs} sequences of {context_len} tokens; {concurrency} need {_gib(kv_needed)} "
            f"(needed {_gib(needed)} of budget {_gib(budget)})"
        )
        short = ""
    return MemoryEstimate(
        tier=tier,
        gpu_name=gpu.name,
        dtype=dtype,
        kv_cache_dtype=_kv_dtype_name(dtype, kv_cache_dtype),
        concurrency=concurrency,
        context_len=context_len,
        max_model_len=max_model_len,
        gpu_memory_utilization=gpu_memory_utilization,
        max_num_batched_tokens=tokens,
        enforce_eager=enforce_eager,
        interconnect=link,
        gpu_memory_bytes=gpu.memory_bytes,
        weights_bytes_per_gpu=weights,
        kv_bytes_per_token_per_gpu=kv_token,
        kv_bytes_per_sequence_per_gpu=per_seq,
        kv_cache_bytes_needed_per_gpu=kv_needed,
        activation_bytes_per_gpu=activation,
        context_bytes_per_gpu=context_part,
        nccl_bytes_per_gpu=nccl_part,
        cuda_graph_bytes_per_gpu=graph_part,
        overhead_bytes_per_gpu=overhead,
        needed_bytes_per_gpu=needed,
        budget_bytes_per_gpu=budget,
        kv_pool_bytes_per_gpu=pool,
        max_concurrent_sequences=max_seqs,
        fits=fits,
        fits_target=fits_target,
        reason=reason,
        short_reason=short,
        pipeline_stage=stage,
    )


def _extra_arg_int(extra_args: tuple[str, ...], flag: str) -> int | None:
    """The integer value of ``flag`` in vLLM extra args (``--flag N`` or ``--flag=N``), else None."""
    for i, arg in enumerate(extra_args):
        value = None
        if arg == flag and i + 1 < len(extra_args):
            value = extra_args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
        if value is not None:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def estimate_ladder(spec: ExperimentSpec, arch: ModelArchitecture, gpu: GpuType) -> list[MemoryEstimate]:
    """Estimate every tier of the experiment's ladder with its fixed model, engine and load settings."""
    return [estimate_tier(spec, arch, gpu, tier) for tier in build_ladder(spec.tiers.tensor_parallel, spec.tiers.pipeline_parallel)]


def estimate_tier(spec: ExperimentSpec, arch: ModelArchitecture, gpu: GpuType, tier: Tier) -> MemoryEstimate:
    """Estimate one tier with the experiment's model, engine and load settings (the one estimate the ladder uses).

    Context per sequence is ``load.inputLen + load.outputLen``; ``--max-num-batched-tokens``
    is taken from ``engine.extraArgs`` when set there; in mode Simulate a fixed
    ``simulation.interconnect`` replaces the GPU's default link.
    """
    link = None
    if spec.mode == "Simulate" and spec.simulation.interconnect != "auto":
        link = spec.simulation.interconnect
    return estimate_memory(
        arch,
        gpu,
        tier,
        dtype=spec.model.dtype,
        kv_cache_dtype=spec.model.kv_cache_dtype,
        max_model_len=spec.model.max_model_len,
        concurrency=spec.load.concurrency,
        context_len=spec.load.input_len + spec.load.output_len,
        gpu_memory_utilization=spec.engine.gpu_memory_utilization,
        enforce_eager=spec.engine.enforce_eager,
        max_num_batched_tokens=_extra_arg_int(spec.engine.extra_args, "--max-num-batched-tokens"),
        max_num_seqs=spec.max_num_seqs,
        interconnect=link,
    )
