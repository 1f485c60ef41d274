"""Roofline step-time model of one engine step of a tensor/pipeline-parallel LLM replica.

One engine step runs a forward pass over every token scheduled in it: one token per
decoding sequence plus the prompt chunks being prefilled. Per GPU of a pipeline stage the
step costs

    overhead (per layer and per pass)
    + smooth_max(weights read / HBM bandwidth, FLOPs / peak FLOP/s)   (the GEMMs: memory- or
                                                                         compute-bound)
    + KV cache read / HBM bandwidth                                   (attention)
    + collectives: two all-reduces per layer at TP > 1, one after the vocabulary-parallel
      embedding, one gather of the logits, each latency + bus bytes / link bandwidth
      (NVLink, or PCIe through host memory), the fastest NCCL protocol winning;

and pipeline parallelism runs min(PP, sequences) micro-batches through PP stages with a
point-to-point hop between stages, idle stage slots being the bubble. Efficiencies and
overheads come from :mod:`kneepoint.simulator.calibration` (fitted to H200 measurements);
bandwidths and FLOPs from the GPU catalogue. Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kneepoint.core.architectures import ModelArchitecture
from kneepoint.core.gpus import GpuType
from kneepoint.simulator.calibration import Calibration, LinkCalibration

INTERCONNECTS = ("nvlink", "pcie")


@dataclass(frozen=True)
class ModelShape:
    """The transformer figures the step time depends on (built from a ModelArchitecture)."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    head_dim: int
    vocab_size: int
    active_params_per_token_per_layer: float
    """Linear-layer parameters one token multiplies through in one layer (routed experts: its top-k)."""
    num_experts: int = 0
    """Routed experts per MoE layer; 0 for a dense model."""
    experts_per_token: int = 0
    expert_weight_fraction: float = 0.0
    """Share of all weights that sit in routed experts (read only when some token picks them)."""


def shape_from_architecture(arch: ModelArchitecture) -> ModelShape:
    """The perf model's view of an architecture, from the same weight groups the estimator counts."""
    active = 0.0
    expert = 0
    total = 0
    for i in range(arch.num_layers):
        for g in arch.layer_groups(i):
            total += g.parameters
            if g.expert:
                expert += g.parameters
                active += g.parameters * arch.num_experts_per_token / arch.num_experts
            elif g.quantizable:  # the linear layers (norms and routers are negligible work)
                active += g.parameters
    total += sum(g.parameters for g in arch.embedding_groups())
    return ModelShape(
        num_layers=arch.num_layers,
        hidden_size=arch.hidden_size,
        num_attention_heads=arch.num_attention_heads,
        head_dim=arch.head_dim,
        vocab_size=arch.vocab_size,
        active_params_per_token_per_layer=active * arch.parameter_scale / arch.num_layers,
        num_experts=arch.num_experts,
        experts_per_token=arch.num_experts_per_token,
        expert_weight_fraction=expert / total if total else 0.0,
    )


@dataclass(frozen=True)
class Hardware:
    """The figures of one GPU type and the link between the GPUs of a replica."""

    hbm_gbps: float
    peak_tflops: float
    interconnect: str
    link_gbps: float
    """One-direction bandwidth per GPU of that link, GB/s."""
    inter_node_gbps: float | None = None
    """Link between nodes for pipeline stages placed on different nodes, in gigabits/s as network
    links are rated (400 = 400 Gb/s RDMA; node label kneepoint.io/inter-node-gbps). None: same node."""
    fp8_compute: bool = False
    """``peak_tflops`` is the fp8 rate (fp8 weights on a GPU with fp8 tensor cores)."""
    gpu: str | None = None
    """The GPU catalogue's name for this type (picks its own measured tables where the calibration has them)."""
    bf16_tflops: float | None = None
    """The bf16 datasheet rate, where ``peak_tflops`` is the fp8 one: an fp8 engine's attention and lm_head
    stay bf16. None: ``peak_tflops``."""

    @classmethod
    def from_gpu(cls, gpu: GpuType, interconnect: str, *, fp8_compute: bool = False, inter_node_gbps: float | None = None) -> Hardware:
        """Hardware for a catalogue GPU; ``interconnect`` is ``nvlink`` or ``pcie``."""
        if interconnect not in INTERCONNECTS:
            raise ValueError(f"interconnect must be one of {', '.join(INTERCONNECTS)}, not {interconnect!r}")
        link = gpu.link_bandwidth_gbps if interconnect == "nvlink" else gpu.pcie_bandwidth_gbps
        tflops = gpu.fp8_tflops if fp8_compute and gpu.fp8_tflops > 0 else gpu.bf16_tflops
        return cls(
            hbm_gbps=gpu.hbm_bandwidth_gbps,
            peak_tflops=tflops,
            interconnect=interconnect,
            link_gbps=link,
            inter_node_gbps=inter_node_gbps,
            fp8_compute=fp8_compute and gpu.fp8_tflops > 0,
            gpu=gpu.name,
            bf16_tflops=gpu.bf16_tflops,
        )


def cuda_graph_padded_tokens(tokens: int, graph_max_tokens: int) -> int:
    """The rows a step of ``tokens`` runs its GEMMs over: vLLM pads a step that fits a CUDA graph to
    the next captured size (1, 2, 4, then every 8 up to 256 and every 16 above, as the serve logs'
    ``cudagraph_capture_sizes`` list them); a larger step runs as it is."""
    if tokens > graph_max_tokens or tokens <= 0:
        return tokens
    if tokens <= 4:
        return 1 << (tokens - 1).bit_length()
    step = 8 if tokens <= 256 else 16
    return min(-(-tokens // step) * step, graph_max_tokens)


def smooth_max(a: float, b: float, k: float) -> float:
    """The roofline's smooth maximum (a^k + b^k)^(1/k) of two non-negative times, computed on their ratio to the
    larger: with the fitted k (95-108), a time under about 0.6-1.4 ms raised to k leaves the float range (1e-308)
    and the plain sum would drop it (a 1B's weights at TP2, an 8B's at TP8)."""
    hi = max(a, b)
    if hi <= 0.0:
        return 0.0
    return hi * ((a / hi) ** k + (b / hi) ** k) ** (1.0 / k)


def row_factor(table: tuple[tuple[int, float], ...], rows: int) -> float:
    """The table's factor at ``rows`` (linear between its rows, 1 before the first, the last after it)."""
    if not table or rows < table[0][0]:
        return 1.0
    for (m0, f0), (m1, f1) in zip(table, table[1:], strict=False):
        if rows <= m1:
            return f0 + (f1 - f0) * (rows - m0) / (m1 - m0)
    return table[-1][1]


def default_cuda_graph_max_tokens(max_num_seqs: int) -> int:
    """vLLM's default ``max_cudagraph_capture_size``: min(2 x --max-num-seqs, 512) (the serve logs
    of tests/data/vllm print 256 at 128 sequences, 128 at 64)."""
    return min(2 * max_num_seqs, 512)


@dataclass(frozen=True)
class Deployment:
    """How the model is laid out on the replica's GPUs, as per-GPU byte counts."""

    tensor_parallel: int
    pipeline_parallel: int
    weight_bytes_per_gpu: float
    kv_bytes_per_token_per_gpu: float
    """KV cache bytes one token occupies on one GPU (its stage's layers, its TP shard)."""
    activation_bytes: int = 2
    """Bytes per activation element (bf16/fp16: 2), what the collectives move."""
    enforce_eager: bool = False
    weight_dtype: str = "bfloat16"
    """The weights' type as vLLM loads them (``bfloat16``, ``float16``, ``float32``, ``fp8``, ``int4``, ``int8``): which
    measured GEMM table by rows a dense model's linear layers follow (bf16/fp16's cuBLAS, fp8's CUTLASS, none else)."""
    cuda_graph_max_tokens: int = 256
    """vLLM's largest CUDA graph in tokens a step (:func:`default_cuda_graph_max_tokens`); a
    larger step runs its kernels without a graph."""


@dataclass(frozen=True)
class StepWork:
    """What one engine step computes, aggregated over the sequences scheduled in it."""

    decode_seqs: int = 0
    decode_context_tokens: int = 0
    """Sum over decoding sequences of the tokens each attends to (its context, new token included)."""
    prefill_tokens: int = 0
    prefill_attention_pairs: float = 0.0
    """Sum over prefill chunks of (query, key) pairs: chunk x prior + chunk x (chunk + 1) / 2."""
    prefill_prior_tokens: int = 0
    """Sum over prefill chunks of tokens already in the KV cache that the chunk attends to."""
    prefill_seqs: int = 0
    sampled_seqs: int = 0
    """Sequences that sample a token at the end of this step (the lm_head runs only for them)."""

    @property
    def tokens(self) -> int:
        return self.decode_seqs + self.prefill_tokens

    @property
    def seqs(self) -> int:
        return self.decode_seqs + self.prefill_seqs


def decode_work(batch: int, context_tokens: int) -> StepWork:
    """A pure decode step: ``batch`` sequences with ``context_tokens`` already cached each."""
    return StepWork(decode_seqs=batch, decode_context_tokens=batch * (context_tokens + 1), sampled_seqs=batch)


def prefill_work(tokens: int, prior_tokens: int = 0) -> StepWork:
    """One sequence prefilling ``tokens`` prompt tokens after ``prior_tokens`` cached ones."""
    pairs = tokens * prior_tokens + tokens * (tokens + 1) / 2
    return StepWork(prefill_tokens=tokens, prefill_attention_pairs=pairs, prefill_prior_tokens=prior_tokens, prefill_seqs=1, sampled_seqs=1)


@dataclass(frozen=True)
class StepTime:
    """The modelled duration of one step and how it splits."""

    seconds: float
    comm_seconds: float
    """Time in collectives and pipeline hops (the part measured as 'comm share')."""
    bubble_seconds: float
    """Stage time left idle because fewer micro-batches than pipeline stages were in flight."""
    link_bytes_per_gpu: float
    """Bytes each GPU sent over the replica's link during the step (received: the same)."""

    @property
    def comm_fraction(self) -> float:
        return self.comm_seconds / self.seconds if self.seconds > 0 else 0.0


def collective_seconds(link: LinkCalibration, link_gbps: float, bus_bytes: float, ranks: int) -> float:
    """Time of one collective moving ``bus_bytes`` per rank: the fastest protocol's latency + bytes/bandwidth."""
    best = math.inf
    for proto in link.protocols:
        t_us = proto.latency_us + proto.latency_us_per_extra_rank * (ranks - 2)
        t_us += bus_bytes / (link_gbps * 1e3 * proto.bandwidth_efficiency)
        best = min(best, t_us)
    if link.shared_bandwidth_gbps:
        # Host-memory path: every rank's traffic crosses the one shared resource.
        best += ranks * bus_bytes / (link.shared_bandwidth_gbps * 1e3)
    return best * 1e-6


def allreduce_bus_bytes(message_bytes: float, ranks: int) -> float:
    """Bytes each rank sends in a ring all-reduce (nccl-tests' bus-bandwidth convention)."""
    return 2.0 * (ranks - 1) / ranks * message_bytes


def allgather_bus_bytes(total_bytes: float, ranks: int) -> float:
    """Bytes each rank sends in an all-gather whose result is ``total_bytes``."""
    return (ranks - 1) / ranks * total_bytes


class PerfModel:
    """Step times for one replica: a model shape on some GPUs with some parallelism."""

    def __init__(self, shape: ModelShape, hardware: Hardware, deployment: Deployment, calibration: Calibration) -> None:
        if deployment.tensor_parallel < 1 or deployment.pipeline_parallel < 1:
            raise ValueError("tensor_parallel and pipeline_parallel must be >= 1")
        self.shape = shape
        self.hardware = hardware
        self.deployment = deployment
        self.calibration = calibration
        self.link = calibration.links[hardware.interconnect]
        tp, pp = deployment.tensor_parallel, deployment.pipeline_parallel
        self._stage_layers = math.ceil(shape.num_layers / pp)
        c = calibration.compute
        bandwidth = hardware.hbm_gbps * 1e9 * c.bandwidth_scale_for(hardware.gpu)
        self._weight_bw = bandwidth * c.weight_bandwidth_efficiency
        self._kv_bw = bandwidth * c.kv_bandwidth_efficiency
        efficiency = c.compute_efficiency
        if hardware.fp8_compute and c.fp8_compute_efficiency is not None:
            efficiency = c.fp8_compute_efficiency
        self._flops = hardware.peak_tflops * 1e12 * efficiency
        # On fp8 tensor cores only the linear layers' GEMMs are fp8: attention and the lm_head run at the bf16
        # rate, and the kernels around the GEMMs (norms, SiLU, the activations' quantization) by their bytes
        # (run 34: an 8B fp8 prefill's GEMMs 1.7x faster than bf16's, the rest of its kernels as long).
        self._bf16_flops = (
            (hardware.bf16_tflops or hardware.peak_tflops) * 1e12 * c.compute_efficiency if hardware.fp8_compute else self._flops
        )
        self._k = c.roofline_sharpness
        self._overhead = (c.overhead_us_per_layer * self._stage_layers + c.overhead_us_per_step) * 1e-6
        # A sampled sequence's fixed cost: the sampler's and bookkeeping's once, attention's fixed part in every layer
        # of the model (all stages; run 42).
        self._per_sampled_seq = (c.overhead_us_per_sampled_seq + c.attention_us_per_seq_per_layer * shape.num_layers) * 1e-6
        # FLOPs per token through one stage's layers on one GPU, and per sampled token in lm_head.
        self._linear_flops_per_token = 2.0 * shape.active_params_per_token_per_layer * self._stage_layers / tp
        self._lm_head_flops_per_token = 2.0 * shape.vocab_size * shape.hidden_size / tp
        self._attn_flops_per_pair = 4.0 * shape.num_attention_heads * shape.head_dim * self._stage_layers / tp
        # Bytes the fp8 engine's elementwise kernels move per token: the calibration's figure per unit of a layer's
        # summed linear widths (its linear parameters over the hidden size), over the stage's layers.
        width = shape.active_params_per_token_per_layer / shape.hidden_size
        fp8_ew = c.fp8_elementwise_bytes_per_token_width if hardware.fp8_compute else 0.0
        self._elementwise_bytes_per_token = fp8_ew * width * self._stage_layers / tp
        self._expert_fraction = shape.expert_weight_fraction
        eager = calibration.eager
        host_us = eager.host_us_per_layer_tp1 if tp == 1 else eager.host_us_per_layer_tp_many
        self._eager_floor = host_us * self._stage_layers * 1e-6 if deployment.enforce_eager else 0.0
        v = calibration.serving
        self._host_step = v.host_us_per_step * 1e-6
        self._host_seq = v.host_us_per_seq * 1e-6
        self._cpu_floor_step = v.cpu_floor_us_per_step * 1e-6
        self._cpu_floor_seq = v.cpu_floor_us_per_seq * 1e-6
        # Under --enforce-eager no step has a graph to fall out of (the eager floor stands instead).
        self._cpu_non_graph = 0.0 if deployment.enforce_eager else v.cpu_non_graph_us_per_layer * self._stage_layers * 1e-6
        self._graph_max_tokens = deployment.cuda_graph_max_tokens
        # vLLM's dense linear layers take longer with the step's rows than streaming their weights once (fp8's CUTLASS
        # GEMMs change tile with the rows, bf16's cuBLAS ones rise toward where the FLOPs bind); routed experts run
        # other kernels and the lm_head is another GEMM, so only the dense linear bytes scale.
        dense_fp8 = hardware.fp8_compute and not shape.num_experts
        dense_16bit = deployment.weight_dtype in ("bfloat16", "float16") and not hardware.fp8_compute and not shape.num_experts
        self._rows = c.fp8_row_factors_for(hardware.gpu) if dense_fp8 else c.bf16_row_factors_for(hardware.gpu) if dense_16bit else ()
        bytes_per_param = 1.0 if dense_fp8 else 2.0
        self._linear_bytes = min(
            bytes_per_param * shape.active_params_per_token_per_layer * self._stage_layers / tp, deployment.weight_bytes_per_gpu
        )
        # Online fp8 quantizes each linear layer's input rows every step (latency-bound at decode sizes).
        # Not divided by TP: no fp8 capture above TP1 exists, and latency-bound kernels do not shrink with their rows.
        if dense_fp8:
            self._overhead += c.fp8_activation_quant_ns_per_hidden * shape.hidden_size * self._stage_layers * 1e-9

    # -- pieces ----------------------------------------------------------------------------
    def _weights_read(self, tokens: int) -> float:
        w = self.deployment.weight_bytes_per_gpu
        if not self.shape.num_experts or tokens <= 0:
            return w
        e, k = self.shape.num_experts, self.shape.experts_per_token
        touched = e * (1.0 - (1.0 - k / e) ** tokens)  # expected distinct experts hit by the tokens
        return w * (1.0 - self._expert_fraction + self._expert_fraction * touched / e)

    def _collectives(self, work: StepWork, micro: float) -> tuple[float, float]:
        """(seconds, bus bytes per GPU) of one stage's collectives for a micro-batch share ``micro``."""
        tp = self.deployment.tensor_parallel
        if tp == 1:
            return 0.0, 0.0
        shape = self.shape
        act = self.deployment.activation_bytes
        message = work.tokens * micro * shape.hidden_size * act
        count = 2 * self._stage_layers + 1  # two per layer, one after the vocabulary-parallel embedding
        ar_bus = allreduce_bus_bytes(message, tp)
        ar = collective_seconds(self.link, self.hardware.link_gbps, ar_bus, tp)
        seconds = count * ar
        bus = count * ar_bus
        if work.sampled_seqs:
            # The vocabulary-parallel lm_head gathers every sampled row's logits.
            logits_total = max(work.sampled_seqs * micro, 1.0) * shape.vocab_size * act
            ag_bus = allgather_bus_bytes(logits_total, tp)
            seconds += collective_seconds(self.link, self.hardware.link_gbps, ag_bus, tp)
            bus += ag_bus
        return seconds, bus

    def _stage_compute(self, work: StepWork, micro: float) -> float:
        tokens = work.tokens * micro
        other_flops = (
            self._lm_head_flops_per_token * work.sampled_seqs * micro + self._attn_flops_per_pair * work.prefill_attention_pairs * micro
        )
        n = math.ceil(tokens)
        weights = self._weights_read(n)
        if self._rows:
            rows = n if self.deployment.enforce_eager else cuda_graph_padded_tokens(n, self._graph_max_tokens)
            weights += self._linear_bytes * (row_factor(self._rows, rows) - 1.0)
        t_w = weights / self._weight_bw
        t_c = self._linear_flops_per_token * tokens / self._flops + other_flops / self._bf16_flops
        if self._elementwise_bytes_per_token:
            t_c += self._elementwise_bytes_per_token * tokens / self._weight_bw
        t_main = smooth_max(t_w, t_c, self._k)
        kv_tokens = (work.decode_context_tokens + work.prefill_prior_tokens) * micro
        t_kv = kv_tokens * self.deployment.kv_bytes_per_token_per_gpu / self._kv_bw
        return self._overhead + t_main + t_kv

    def _hop_seconds(self, work: StepWork, micro: float) -> float:
        nbytes = work.tokens * micro * self.shape.hidden_size * self.deployment.activation_bytes
        hw, pipe = self.hardware, self.calibration.pipeline
        if hw.inter_node_gbps:
            return pipe.inter_node_latency_us * 1e-6 + nbytes / (hw.inter_node_gbps * 1e9 / 8)
        best_eff = max(p.bandwidth_efficiency for p in self.link.protocols)
        return pipe.p2p_latency_us * 1e-6 + nbytes / (hw.link_gbps * 1e9 * best_eff)

    # -- the model -------------------------------------------------------------------------
    def host_seconds(self, work: StepWork) -> float:
        """The serving loop's time between GPU steps (vLLM's host side), for a step over ``work.seqs``."""
        return self._host_step + self._host_seq * work.seqs

    def cpu_floor_seconds(self, work: StepWork) -> float:
        """vLLM's CPU time for a step over ``work.seqs``: with asynchronous scheduling it overlaps
        the GPU's work, so it bounds the step only when the GPU's part is shorter (small models,
        and steps too large for a CUDA graph, whose kernels are launched one by one)."""
        floor = self._cpu_floor_step + self._cpu_floor_seq * work.seqs
        if work.tokens > self._graph_max_tokens:
            floor += self._cpu_non_graph
        return floor

    def gpu_step_time(self, work: StepWork) -> StepTime:
        """The GPU's part of one step (what a profiler trace's step annotation spans)."""
        if work.tokens <= 0:
            return StepTime(0.0, 0.0, 0.0, 0.0)
        pp = self.deployment.pipeline_parallel
        micro_batches = max(1, min(pp, work.seqs))
        micro = 1.0 / micro_batches
        comm, bus = self._collectives(work, micro)
        compute = self._stage_compute(work, micro)
        stage = max(compute + comm, self._eager_floor)
        sampling = self._per_sampled_seq * work.sampled_seqs  # once per step, after the last stage
        if pp == 1:
            return StepTime(stage + sampling, comm, 0.0, bus)
        hop = self._hop_seconds(work, micro)
        total = pp * stage + (pp - 1) * hop + sampling
        bubble = pp * stage * (pp - micro_batches) / pp
        # Each stage GPU runs its collectives once per micro-batch.
        return StepTime(total, pp * comm + (pp - 1) * hop, bubble, bus * micro_batches)

    def step_time(self, work: StepWork) -> StepTime:
        """Duration of one engine step doing ``work``: the GPU's part and the serving loop's host time,
        or vLLM's CPU time for the step when that is longer (no noise; the scheduler adds it)."""
        gpu = self.gpu_step_time(work)
        if gpu.seconds <= 0:
            return gpu
        return replace(gpu, seconds=max(gpu.seconds + self.host_seconds(work), self.cpu_floor_seconds(work)))

    def decode_step(self, batch: int, context_tokens: int) -> StepTime:
        """Step time of ``batch`` sequences decoding one token with ``context_tokens`` cached each."""
        return self.step_time(decode_work(batch, context_tokens))

    def prefill(self, tokens: int) -> StepTime:
        """Time to prefill one prompt of ``tokens`` tokens in one step (a TTFT proxy)."""
        return self.step_time(prefill_work(tokens))
