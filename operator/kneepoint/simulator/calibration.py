"""Calibration constants of the simulator's performance model, read from one data file.

The numbers live in ``kneepoint/data/simulator_calibration.json`` (fitted to the H200
measurements by :mod:`kneepoint.simulator.calibration_fit`), never in code, so a refit is a
data change. Efficiencies are fractions of the GPU catalogue's datasheet figures, which is
what lets one fit carry over to other GPU types: an H100 gets the same fraction of *its*
bandwidth and FLOPs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kneepoint.core.catalog_files import load_data_file

CALIBRATION_FILE = "simulator_calibration.json"


@dataclass(frozen=True)
class ComputeCalibration:
    """How one GPU turns bytes and FLOPs into time for a forward pass."""

    weight_bandwidth_efficiency: float
    """Fraction of peak HBM bandwidth reached while streaming weights through the GEMMs."""
    kv_bandwidth_efficiency: float
    """Fraction of peak HBM bandwidth reached by attention reading the KV cache."""
    compute_efficiency: float
    """Fraction of peak dense tensor FLOP/s reached by large GEMMs (prefill)."""
    roofline_sharpness: float
    """Exponent k of the smooth roofline (t_w^k + t_c^k)^(1/k); large k is a hard max."""
    overhead_us_per_layer: float
    """Fixed cost per decoder layer per step (small kernels: norms, activations, copies)."""
    overhead_us_per_step: float
    """Fixed cost per forward pass (embedding, final norm, sampling kernels)."""
    fp8_compute_efficiency: float | None = None
    """Fraction of the GPU's fp8 datasheet FLOP/s that vLLM's fp8 linear layers reach (online ``--quantization
    fp8``: fp8 weights, activations quantized per step); None: ``compute_efficiency``, as for bf16. It times the
    linear layers' FLOPs only: attention and the lm_head run at the bf16 rate, and the kernels around the GEMMs
    by ``fp8_elementwise_bytes_per_token_width`` (bf16's ``compute_efficiency`` carries all of these together).
    Fitted with that figure to the 70B fp8's steps on one H200 (run 10's trace, runs 5, 6 and 10's c1 TTFT) and
    run 34's lone 8B fp8 prefills on an H100."""
    fp8_gemm_row_factors: tuple[tuple[int, float], ...] = ()
    """vLLM's fp8 linear layers' time at M rows (a step's tokens, padded to its CUDA graph's size)
    over their time at 1-16 rows, as (M, factor) in increasing M; between two rows it is
    interpolated, past the last the last holds (there the FLOPs bind). vLLM's CUTLASS fp8 GEMMs
    on SM90 pick their tile by M ([1, 16], (16, 64], (64, 128], above): run 12 timed them on an
    H200 (``cutlass_scaled_mm``, Llama 8B and 70B shapes, their mean): 1.38x at 24 rows, 1.07x at 64,
    1.40x at 72, 2.32x at 136, 1.90x at 256. Empty: 1 everywhere (bf16's cuBLAS GEMMs stay within
    16 % of their 1-row time up to 128 rows). A GPU type with a table of its own in
    ``fp8_gemm_row_factors_by_gpu`` uses that one instead; every other GPU type uses this one."""
    fp8_gemm_row_factors_by_gpu: tuple[tuple[str, tuple[tuple[int, float], ...]], ...] = ()
    """(GPU catalogue name, row factors) for the GPU types whose fp8 GEMMs were timed by rows themselves.
    The factors are not a property of the kernel alone: a bad tile costs about the same time on an H100
    as on an H200 (the same SMs at the same clock; run 30: within 4 % at 17 and 129 rows on the 8B's
    shapes), while 1-16 rows stream the weights from the H100's slower memory, so the same penalty is a
    smaller share of the H100's time (1.09x at 24 rows against the H200's 1.38x)."""
    bf16_gemm_row_factors: tuple[tuple[int, float], ...] = ()
    """The same for bf16 (and fp16) engines' linear layers, cuBLAS's GEMMs, on their two bytes a parameter: they stay
    near their 1-16-row time further than fp8's and then rise with the rows (runs 12 and 12b on an H200, the 8B's
    and 70B's shapes: 1.03 at 32 rows, 1.09 at 65, 1.12 at 128, 1.21 at 160, 1.62 at 256, where the FLOPs bind), where
    the roofline alone keeps a decode step's weights at their streaming time up to where its FLOPs bind (about 170
    rows on an H200). Empty: 1 everywhere. A GPU type with a table in ``bf16_gemm_row_factors_by_gpu`` uses that one."""
    bf16_gemm_row_factors_by_gpu: tuple[tuple[str, tuple[tuple[int, float], ...]], ...] = ()
    """(GPU catalogue name, bf16 row factors) for the GPU types whose bf16 GEMMs were timed by rows themselves (the
    H100 SXM, runs 30-32: 1.08 at 128 rows, 1.24 at 256)."""
    fp8_activation_quant_ns_per_hidden: float = 0.0
    """Online fp8's per-step cost of quantizing activations, in ns per decoder layer per unit of the
    model's hidden size. Before each of a layer's four linear layers vLLM quantizes the activation
    rows to fp8 with a per-token scale (a max reduction over the row), fused by torch.compile into the
    norm and SiLU kernels: in run 10's 70B trace these take 28 µs a layer at 1 and 16 sequences where
    the 8B bf16's norm and SiLU kernels take 8. The rows are 1x to 3.5x the hidden size wide and a
    decode step's few rows leave the reductions latency-bound, so the cost grows with the width and
    barely with the rows. Fitted to the 70B fp8's c1 TPOT (runs 5, 6 and 10); 0: none (bf16)."""
    fp8_elementwise_bytes_per_token_width: float = 0.0
    """What an fp8 engine's step spends outside its GEMMs and attention, which fp8 does not make faster, as bytes
    per token per decoder layer per unit of the layer's summed linear widths (its linear parameters over its
    hidden size: 53,248 on Llama-3.1-8B) moved at the weight-streaming bandwidth. Run 34's 8B prefill of 3,072
    tokens on an H100, profiled: fp8's GEMMs 32.5 ms against bf16's 54.8, its other kernels (norms, SiLU, the
    activations' fp8 quantization, fused by torch.compile) 7.8 against 6.3, attention 4.6 against 4.9, and about
    5 ms of gaps in each step. Fitted end to end (``calibration_vllm.fit_fp8_elementwise``), so it carries the
    gaps with the kernels: 16 ms of that step where the kernels take 7.8. 0: none (and bf16 engines never)."""
    overhead_us_per_sampled_seq: float = 0.0
    """Fixed cost per sequence sampled in a step, whatever the model's depth and the sequence's
    context (vLLM's logits and sampler over the vocabulary, per-sequence step bookkeeping). Real
    vLLM's decode step grows by about 24 us per sequence at 384 tokens of context and 46 us at
    1,150 (runs 2-6, 8B); without this the KV read alone had to carry both. Plain PyTorch forward
    passes (tests/data/h200) have none, so their fit leaves it at 0. Fitted beside
    ``attention_us_per_seq_per_layer``, which carries the part that grows with the layers."""
    attention_us_per_seq_per_layer: float = 0.0
    """The decode attention kernel's fixed part per sequence and per decoder layer, whatever the context: vLLM
    0.24's FlashAttention 3 call alone, at zero context on its KV-read line, takes about 11 us a layer at 32
    sequences and 23 at 128 on an H100 (run 42, ``calibration_vllm.fit_attention_per_seq_per_layer``), so a
    sequence costs a 48-layer model half as much again as a 32-layer one. Measured, not fitted; counted with
    ``overhead_us_per_sampled_seq`` for every sampled sequence. Plain PyTorch passes: 0, as that one."""

    bandwidth_scale_by_gpu: tuple[tuple[str, float], ...] = ()
    """(GPU catalogue name, factor) for the GPU types whose memory reaches a different share of its datasheet rate than
    the GPU the efficiencies were fitted on (the H200): both bandwidth efficiencies are multiplied by the factor on that
    type. The H100 SXM's HBM3 streams an 8B decode step's weights about 4 % nearer its datasheet rate than the H200's
    HBM3e (runs 28-29's bf16 decode loads; run 37's traced steps agree), so one share for both made every H100 decode
    step 1-7 % long. Fitted by ``calibration_vllm.fit_bandwidth_scale``; a type not listed: 1."""

    def bandwidth_scale_for(self, gpu: str | None) -> float:
        """The factor on both bandwidth efficiencies for catalogue GPU ``gpu`` (1 where none was fitted)."""
        return dict(self.bandwidth_scale_by_gpu).get(gpu or "", 1.0)

    def fp8_row_factors_for(self, gpu: str | None) -> tuple[tuple[int, float], ...]:
        """The fp8 row factors of catalogue GPU ``gpu``: its own table if it has one, else the shared one."""
        return dict(self.fp8_gemm_row_factors_by_gpu).get(gpu or "", self.fp8_gemm_row_factors)

    def bf16_row_factors_for(self, gpu: str | None) -> tuple[tuple[int, float], ...]:
        """The bf16 row factors of catalogue GPU ``gpu``: its own table if it has one, else the shared one."""
        return dict(self.bf16_gemm_row_factors_by_gpu).get(gpu or "", self.bf16_gemm_row_factors)


@dataclass(frozen=True)
class CollectiveProtocol:
    """One way NCCL can run a collective; the fastest one wins for each message size."""

    name: str
    latency_us: float
    """Latency at 2 ranks."""
    latency_us_per_extra_rank: float
    """Added latency for every rank beyond 2 (ring steps)."""
    bandwidth_efficiency: float
    """Fraction of the link's one-direction bandwidth this protocol reaches on bus bytes."""


@dataclass(frozen=True)
class LinkCalibration:
    """Collectives over one kind of link between the GPUs of a replica."""

    protocols: tuple[CollectiveProtocol, ...]
    shared_bandwidth_gbps: float | None
    """Bandwidth of a resource all ranks share (host memory on the PCIe path), GB/s; None: none."""


@dataclass(frozen=True)
class EagerCalibration:
    """Host launch cost when CUDA graphs are off (``--enforce-eager``)."""

    host_us_per_layer_tp1: float
    host_us_per_layer_tp_many: float


@dataclass(frozen=True)
class PipelineCalibration:
    """Point-to-point activation transfer between pipeline stages."""

    p2p_latency_us: float
    inter_node_latency_us: float


@dataclass(frozen=True)
class ServingCalibration:
    """What vLLM's serving loop adds to the GPU's forward pass (fitted to real vLLM 0.24 on an H200)."""

    host_us_per_step: float
    """Time between two engine steps in which the GPU is idle (scheduling, input preparation, sampling's
    host side), read from real vLLM's inter-token latency minus its traced step time."""
    host_us_per_seq: float
    """Added host time per running sequence (output processing, detokenisation)."""
    api_us_per_request: float
    """This much per request between a request's arrival at vLLM's API server and the engine,
    whatever its prompt's length (parsing, validation, the hand-over to the engine core)."""
    api_gate_us_per_request: float
    """The part of ``api_us_per_request`` that the API server's process shares between the requests
    it holds, so that a burst leaves it together (``simulator.intake``)."""
    api_serial_us_per_request: float
    """The part of ``api_us_per_request`` handed over one request after another, after the gate."""
    api_us_per_prompt_token: float
    """This much per prompt token between a request's arrival at vLLM's API server and the engine
    (with the prefill, the unprofiled TTFT at concurrency 1)."""
    api_serial_us_per_prompt_token: float
    """The part of ``api_us_per_prompt_token`` taken one request after another (the rest overlaps
    between requests; ``simulator.intake``)."""
    api_us_per_output: float
    """The API server's loop, per output of a step (``OutputProcessor.process_outputs``: detokenizing, the
    request's collector; ``simulator.output_loop``). Run 24's stamps: 17.7 µs at 256 sequences."""
    api_us_per_write: float
    """The API server's loop, per write of a streamed response (its task wakes, builds the chunk, writes it;
    ``simulator.output_loop``): what makes a loop of more than 128 outputs a step fall behind the engine. Run 24's
    loop handled 13,105 outputs a second at 256 sequences, one write each: 76.3 µs, 58.6 of them the write."""
    cpu_floor_us_per_step: float
    """vLLM's CPU time per engine step (scheduling, input preparation, kernel launches, sampling and
    output processing). Asynchronous scheduling overlaps it with the GPU's work, so a step lasts at
    least this long; only a small model's GPU step is shorter (run 6: the 1B's decode step is 1.0 ms
    of kernels in a 1.5 ms period)."""
    cpu_floor_us_per_seq: float
    """Added CPU time per step for each scheduled sequence."""
    cpu_non_graph_us_per_layer: float
    """Added CPU time per layer of a step larger than vLLM's largest CUDA graph, which launches its
    kernels one by one (run 8: a lone 320-token prompt on the 8B takes ~6 ms more than its compute)."""


@dataclass(frozen=True)
class PowerCalibration:
    """Board power as a fraction of the catalogue's TDP, idle and fully busy."""

    idle_fraction: float
    busy_fraction: float


@dataclass(frozen=True)
class Calibration:
    """Every constant of the performance model."""

    compute: ComputeCalibration
    links: Mapping[str, LinkCalibration]
    eager: EagerCalibration
    pipeline: PipelineCalibration
    power: PowerCalibration
    serving: ServingCalibration


def _protocol(row: Mapping[str, Any]) -> CollectiveProtocol:
    return CollectiveProtocol(
        name=str(row["name"]),
        latency_us=float(row["latencyUs"]),
        latency_us_per_extra_rank=float(row["latencyUsPerExtraRank"]),
        bandwidth_efficiency=float(row["bandwidthEfficiency"]),
    )


def _at_least_zero(value: Any, field: str) -> float:
    """An optional constant that may be absent (0) but never negative."""
    number = float(value or 0.0)
    if not number >= 0.0:
        raise ValueError(f"{field} must be a number >= 0 (0 or absent: none): {value!r}")
    return number


def _row_factors(rows: Any, field: str = "compute.fp8GemmRowFactors") -> tuple[tuple[int, float], ...]:
    table = tuple((int(m), float(f)) for m, f in rows)
    if any(b[0] <= a[0] for a, b in zip(table, table[1:], strict=False)) or any(m < 1 or f <= 0 for m, f in table):
        raise ValueError(f"{field} must be [rows, factor] pairs with rows >= 1 increasing and factors > 0: {rows!r}")
    return table


def _row_factors_by_gpu(
    tables: Any, field: str = "compute.fp8GemmRowFactorsByGpu"
) -> tuple[tuple[str, tuple[tuple[int, float], ...]], ...]:
    if not isinstance(tables, Mapping):
        raise ValueError(f"{field} must map GPU catalogue names to row-factor tables: {tables!r}")
    return tuple((str(gpu), _row_factors(rows, f"{field}.{gpu}")) for gpu, rows in sorted(tables.items()))


def _scales_by_gpu(scales: Any) -> tuple[tuple[str, float], ...]:
    if not isinstance(scales, Mapping) or any(not isinstance(f, int | float) or not f > 0 for f in scales.values()):
        raise ValueError(f"compute.bandwidthScaleByGpu must map GPU catalogue names to factors > 0: {scales!r}")
    return tuple((str(gpu), float(f)) for gpu, f in sorted(scales.items()))


def calibration_from_json(doc: Mapping[str, Any]) -> Calibration:
    """Build a :class:`Calibration` from the JSON document's shape (camelCase keys)."""
    c = doc["compute"]
    links = {
        name: LinkCalibration(
            protocols=tuple(_protocol(p) for p in row["protocols"]),
            shared_bandwidth_gbps=None if row.get("sharedBandwidthGBps") is None else float(row["sharedBandwidthGBps"]),
        )
        for name, row in doc["links"].items()
    }
    e, p, w, v = doc["eager"], doc["pipeline"], doc["power"], doc["serving"]
    return Calibration(
        compute=ComputeCalibration(
            weight_bandwidth_efficiency=float(c["weightBandwidthEfficiency"]),
            kv_bandwidth_efficiency=float(c["kvBandwidthEfficiency"]),
            compute_efficiency=float(c["computeEfficiency"]),
            roofline_sharpness=float(c["rooflineSharpness"]),
            overhead_us_per_layer=float(c["overheadUsPerLayer"]),
            overhead_us_per_step=float(c["overheadUsPerStep"]),
            overhead_us_per_sampled_seq=float(c["overheadUsPerSampledSeq"]),
            attention_us_per_seq_per_layer=_at_least_zero(c.get("attentionUsPerSeqPerLayer"), "compute.attentionUsPerSeqPerLayer"),
            fp8_compute_efficiency=None if c.get("fp8ComputeEfficiency") is None else float(c["fp8ComputeEfficiency"]),
            fp8_gemm_row_factors=_row_factors(c.get("fp8GemmRowFactors") or []),
            fp8_gemm_row_factors_by_gpu=_row_factors_by_gpu(c.get("fp8GemmRowFactorsByGpu") or {}),
            bf16_gemm_row_factors=_row_factors(c.get("bf16GemmRowFactors") or [], "compute.bf16GemmRowFactors"),
            bf16_gemm_row_factors_by_gpu=_row_factors_by_gpu(c.get("bf16GemmRowFactorsByGpu") or {}, "compute.bf16GemmRowFactorsByGpu"),
            bandwidth_scale_by_gpu=_scales_by_gpu(c.get("bandwidthScaleByGpu") or {}),
            fp8_activation_quant_ns_per_hidden=float(c.get("fp8ActivationQuantNsPerHidden") or 0.0),
            fp8_elementwise_bytes_per_token_width=_at_least_zero(
                c.get("fp8ElementwiseBytesPerTokenWidth"), "compute.fp8ElementwiseBytesPerTokenWidth"
            ),
        ),
        links=links,
        eager=EagerCalibration(
            host_us_per_layer_tp1=float(e["hostUsPerLayerTp1"]),
            host_us_per_layer_tp_many=float(e["hostUsPerLayerTpMany"]),
        ),
        pipeline=PipelineCalibration(
            p2p_latency_us=float(p["p2pLatencyUs"]),
            inter_node_latency_us=float(p["interNodeLatencyUs"]),
        ),
        power=PowerCalibration(idle_fraction=float(w["idleFraction"]), busy_fraction=float(w["busyFraction"])),
        serving=ServingCalibration(
            host_us_per_step=float(v["hostUsPerStep"]),
            host_us_per_seq=float(v["hostUsPerSeq"]),
            api_us_per_request=float(v["apiUsPerRequest"]),
            api_gate_us_per_request=float(v["apiGateUsPerRequest"]),
            api_serial_us_per_request=float(v["apiSerialUsPerRequest"]),
            api_us_per_prompt_token=float(v["apiUsPerPromptToken"]),
            api_serial_us_per_prompt_token=float(v["apiSerialUsPerPromptToken"]),
            api_us_per_output=float(v["apiUsPerOutput"]),
            api_us_per_write=float(v["apiUsPerWrite"]),
            cpu_floor_us_per_step=float(v["cpuFloorUsPerStep"]),
            cpu_floor_us_per_seq=float(v["cpuFloorUsPerSeq"]),
            cpu_non_graph_us_per_layer=float(v["cpuNonGraphUsPerLayer"]),
        ),
    )


def calibration_to_json(cal: Calibration) -> dict[str, Any]:
    """Inverse of :func:`calibration_from_json` (used by the fitting tool to write the file)."""
    c = cal.compute
    return {
        "compute": {
            "weightBandwidthEfficiency": c.weight_bandwidth_efficiency,
            "kvBandwidthEfficiency": c.kv_bandwidth_efficiency,
            "computeEfficiency": c.compute_efficiency,
            "rooflineSharpness": c.roofline_sharpness,
            "overheadUsPerLayer": c.overhead_us_per_layer,
            "overheadUsPerStep": c.overhead_us_per_step,
            "overheadUsPerSampledSeq": c.overhead_us_per_sampled_seq,
            "attentionUsPerSeqPerLayer": c.attention_us_per_seq_per_layer,
            "fp8ComputeEfficiency": c.fp8_compute_efficiency,
            "fp8GemmRowFactors": [[rows, factor] for rows, factor in c.fp8_gemm_row_factors],
            "fp8GemmRowFactorsByGpu": {gpu: [[rows, factor] for rows, factor in table] for gpu, table in c.fp8_gemm_row_factors_by_gpu},
            "bf16GemmRowFactors": [[rows, factor] for rows, factor in c.bf16_gemm_row_factors],
            "bf16GemmRowFactorsByGpu": {gpu: [[rows, factor] for rows, factor in table] for gpu, table in c.bf16_gemm_row_factors_by_gpu},
            "fp8ActivationQuantNsPerHidden": c.fp8_activation_quant_ns_per_hidden,
            "fp8ElementwiseBytesPerTokenWidth": c.fp8_elementwise_bytes_per_token_width,
            "bandwidthScaleByGpu": dict(c.bandwidth_scale_by_gpu),
        },
        "links": {
            name: {
                "protocols": [
                    {
                        "name": p.name,
                        "latencyUs": p.latency_us,
                        "latencyUsPerExtraRank": p.latency_us_per_extra_rank,
                        "bandwidthEfficiency": p.bandwidth_efficiency,
                    }
                    for p in link.protocols
                ],
                "sharedBandwidthGBps": link.shared_bandwidth_gbps,
            }
            for name, link in cal.links.items()
        },
        "eager": {
            "hostUsPerLayerTp1": cal.eager.host_us_per_layer_tp1,
            "hostUsPerLayerTpMany": cal.eager.host_us_per_layer_tp_many,
        },
        "pipeline": {
            "p2pLatencyUs": cal.pipeline.p2p_latency_us,
            "interNodeLatencyUs": cal.pipeline.inter_node_latency_us,
        },
        "power": {"idleFraction": cal.power.idle_fraction, "busyFraction": cal.power.busy_fraction},
        "serving": {
            "hostUsPerStep": cal.serving.host_us_per_step,
            "hostUsPerSeq": cal.serving.host_us_per_seq,
            "apiUsPerRequest": cal.serving.api_us_per_request,
            "apiGateUsPerRequest": cal.serving.api_gate_us_per_request,
            "apiSerialUsPerRequest": cal.serving.api_serial_us_per_request,
            "apiUsPerPromptToken": cal.serving.api_us_per_prompt_token,
            "apiSerialUsPerPromptToken": cal.serving.api_serial_us_per_prompt_token,
            "apiUsPerOutput": cal.serving.api_us_per_output,
            "apiUsPerWrite": cal.serving.api_us_per_write,
            "cpuFloorUsPerStep": cal.serving.cpu_floor_us_per_step,
            "cpuFloorUsPerSeq": cal.serving.cpu_floor_us_per_seq,
            "cpuNonGraphUsPerLayer": cal.serving.cpu_non_graph_us_per_layer,
        },
    }


def load_calibration(path: str | os.PathLike[str] | None = None) -> Calibration:
    """The shipped calibration (``kneepoint/data/simulator_calibration.json``), or the one in the JSON file at ``path``
    (the same shape: one ``python -m kneepoint.simulator.calibration_vllm DATA --write --output FILE`` fitted to other
    captures). A file that cannot be read or is not a calibration raises ValueError naming the file and the field."""
    if path is None:
        return calibration_from_json(load_data_file(CALIBRATION_FILE))
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read it ({exc.strerror or exc})") from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a JSON document ({exc})") from exc
    if not isinstance(doc, Mapping):
        raise ValueError(f"{path}: must hold a JSON object shaped as the shipped {CALIBRATION_FILE}")
    try:
        return calibration_from_json(doc)
    except KeyError as exc:
        raise ValueError(f"{path}: lacks the field {exc.args[0]!r} (the shipped {CALIBRATION_FILE} has every field)") from exc
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{path}: {exc}") from exc
