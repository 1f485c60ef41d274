"""Fit the performance model's constants to the H200 measurements, and compare the two.

The measurement set (``tests/data/h200``; README.md there explains the method) times a
plain-PyTorch Megatron-style Llama 8B and 70B on H200s at TP 1, 2 and 4, over NVLink and
with NCCL peer-to-peer disabled (all-reduce through host memory, the stand-in for PCIe-only
GPUs): decode steps by CUDA-graph replay at batch 1..128 with 1024 tokens cached, the same
with every collective turned into a no-op (so the communication share is measured), prefill
of one 1024- or 4096-token prompt, and NCCL all-reduce sweeps.

The fit is least squares on log(simulated / measured), done in three passes with a
dependency-free Nelder-Mead: (1) compute constants on the no-communication times, (2) link
constants on the communication times (step time minus no-comm time, plus the in-graph
all-reduce sweep), (3) everything together on the full step times, with the squared error of
the communication share added. Run ``python -m kneepoint.simulator.calibration_fit
tests/data/h200 --write`` to refit and rewrite ``kneepoint/data/simulator_calibration.json``;
without ``--write`` it prints the comparison table that docs/simulator.md shows.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from kneepoint.core.architectures import ModelArchitecture
from kneepoint.core.gpus import get_gpu_type
from kneepoint.simulator.calibration import (
    CALIBRATION_FILE,
    Calibration,
    CollectiveProtocol,
    ComputeCalibration,
    EagerCalibration,
    LinkCalibration,
    calibration_from_json,
    calibration_to_json,
    load_calibration,
)
from kneepoint.simulator.perf_model import (
    Deployment,
    Hardware,
    ModelShape,
    PerfModel,
    StepTime,
    allreduce_bus_bytes,
    collective_seconds,
    decode_work,
    prefill_work,
    shape_from_architecture,
)


@dataclass(frozen=True)
class MeasuredPoint:
    """One graph-replay timing from the measurement set."""

    source: str
    """File and call it came from, e.g. ``llama8b_tp2.json call1``."""
    model: str
    kind: str
    """``decode`` or ``prefill``."""
    tensor_parallel: int
    interconnect: str
    batch: int
    """Decode batch, or prompt tokens for prefill."""
    context_tokens: int
    measured_ms: float
    measured_nocomm_ms: float | None
    measured_comm_share: float | None
    shape: ModelShape
    deployment: Deployment

    @property
    def label(self) -> str:
        link = "" if self.tensor_parallel == 1 else (" NVLink" if self.interconnect == "nvlink" else " no-P2P")
        what = f"B={self.batch}" if self.kind == "decode" else f"{self.batch} tok"
        return f"{self.model} TP{self.tensor_parallel}{link} {self.kind} {what}"


@dataclass(frozen=True)
class AllReducePoint:
    """One in-graph all-reduce time from the sweep files."""

    source: str
    interconnect: str
    ranks: int
    message_bytes: int
    measured_us: float


def _calls(doc: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    if "calls" in doc:
        return list(doc["calls"].items())
    return [("run", doc)]


def _shape(config: dict[str, Any], name: str) -> ModelShape:
    arch = ModelArchitecture(
        name=name,
        num_layers=int(config["layers"]),
        hidden_size=int(config["hidden"]),
        num_attention_heads=int(config["heads"]),
        num_key_value_heads=int(config["kv_heads"]),
        head_dim=int(config["head_dim"]),
        intermediate_size=int(config["inter"]),
        vocab_size=int(config["vocab"]),
    )
    return shape_from_architecture(arch)


def load_points(data_dir: Path) -> list[MeasuredPoint]:
    """Every graph-replay decode and prefill point of every call in ``llama*.json``."""
    points: list[MeasuredPoint] = []
    for path in sorted(data_dir.glob("llama*.json")):
        interconnect = "pcie" if "nop2p" in path.name else "nvlink"
        for call, doc in _calls(json.loads(path.read_text())):
            summary = doc["summary"]
            rank0 = doc["ranks"][0]
            shape = _shape(rank0["config"], str(summary["model"]))
            tp = int(summary["tp"])
            deployment = Deployment(
                tensor_parallel=tp,
                pipeline_parallel=1,
                weight_bytes_per_gpu=float(summary["weight_bytes_per_gpu"]),
                kv_bytes_per_token_per_gpu=float(summary["kv_bytes_per_token_per_gpu"]),
            )
            ctx = int(rank0["ctx_len_in_cache"])
            model = str(summary["model"]).upper()
            source = f"{path.name} {call}"
            for row in summary.get("decode", []):
                if "graph_comm_median_ms" not in row:
                    continue  # out of memory at this batch
                points.append(
                    MeasuredPoint(
                        source=source,
                        model=model,
                        kind="decode",
                        tensor_parallel=tp,
                        interconnect=interconnect,
                        batch=int(row["batch"]),
                        context_tokens=ctx,
                        measured_ms=float(row["graph_comm_median_ms"]),
                        measured_nocomm_ms=float(row["graph_nocomm_median_ms"]) if tp > 1 else float(row["graph_comm_median_ms"]),
                        measured_comm_share=float(row["comm_share"]) if tp > 1 else 0.0,
                        shape=shape,
                        deployment=deployment,
                    )
                )
            for row in summary.get("prefill", []):
                if "graph_comm_median_ms" not in row:
                    continue  # eager-only timing (launch-bound in that VM): not a graph-replay point
                nocomm = row.get("graph_nocomm_median_ms")
                share = row.get("comm_share_graph")
                points.append(
                    MeasuredPoint(
                        source=source,
                        model=model,
                        kind="prefill",
                        tensor_parallel=tp,
                        interconnect=interconnect,
                        batch=int(row["tokens"]),
                        context_tokens=0,
                        measured_ms=float(row["graph_comm_median_ms"]),
                        measured_nocomm_ms=float(nocomm)
                        if nocomm is not None
                        else (float(row["graph_comm_median_ms"]) if tp == 1 else None),
                        measured_comm_share=float(share) if share is not None else (0.0 if tp == 1 else None),
                        shape=shape,
                        deployment=deployment,
                    )
                )
    return points


def load_allreduce_points(data_dir: Path) -> list[AllReducePoint]:
    """In-graph all-reduce latencies (the sweep's ``graph`` section) of every sweep file."""
    out: list[AllReducePoint] = []
    for path in sorted(data_dir.glob("allreduce*.json")):
        interconnect = "pcie" if "nop2p" in path.name else "nvlink"
        for call, doc in _calls(json.loads(path.read_text())):
            rank0 = doc["ranks"][0]
            for row in rank0.get("graph", []):
                out.append(
                    AllReducePoint(
                        source=f"{path.name} {call}",
                        interconnect=interconnect,
                        ranks=int(rank0["world"]),
                        message_bytes=int(row["bytes"]),
                        measured_us=float(row["per_allreduce_us_median"]),
                    )
                )
    return out


def eager_constants(data_dir: Path) -> EagerCalibration:
    """Host launch floor per layer without CUDA graphs: the least eager time per layer, TP1 vs TP>1.

    Per file, the smallest eager step time over batches divided by the layer count (the
    smallest is the least disturbed by the VM's CPU noise); the median over files.
    """
    tp1: list[float] = []
    many: list[float] = []
    for path in sorted(data_dir.glob("llama8b*.json")):  # 70B TP1 eager is GPU-bound, not launch-bound
        per_file: list[float] = []
        tp = 1
        for _, doc in _calls(json.loads(path.read_text())):
            summary = doc["summary"]
            tp = int(summary["tp"])
            layers = int(doc["ranks"][0]["config"]["layers"])
            per_file += [float(r["eager_median_ms"]) / layers for r in summary.get("decode", []) if "eager_median_ms" in r]
        if per_file:
            (tp1 if tp == 1 else many).append(min(per_file) * 1e3)
    return EagerCalibration(
        host_us_per_layer_tp1=round(statistics.median(tp1), 1), host_us_per_layer_tp_many=round(statistics.median(many), 1)
    )


H200 = get_gpu_type("h200")


def predict(point: MeasuredPoint, cal: Calibration) -> StepTime:
    """The simulator's step time for the measured configuration."""
    # Graph replays of a plain-PyTorch model: the GPU's part alone, no serving loop and no sampler.
    cal = replace(cal, compute=replace(cal.compute, overhead_us_per_sampled_seq=0.0, attention_us_per_seq_per_layer=0.0))
    model = PerfModel(point.shape, Hardware.from_gpu(H200, point.interconnect), point.deployment, cal)
    work = decode_work(point.batch, point.context_tokens) if point.kind == "decode" else prefill_work(point.batch)
    return model.gpu_step_time(work)


def predict_allreduce_us(point: AllReducePoint, cal: Calibration) -> float:
    hw = Hardware.from_gpu(H200, point.interconnect)
    bus = allreduce_bus_bytes(point.message_bytes, point.ranks)
    return collective_seconds(cal.links[point.interconnect], hw.link_gbps, bus, point.ranks) * 1e6


# -- parameter vector <-> calibration ---------------------------------------------------------
_COMPUTE_KEYS = (
    "weight_bandwidth_efficiency",
    "kv_bandwidth_efficiency",
    "compute_efficiency",
    "roofline_sharpness",
    "overhead_us_per_layer",
    "overhead_us_per_step",
)


def _link_vector(link: LinkCalibration) -> list[float]:
    v: list[float] = []
    for p in link.protocols:
        v += [p.latency_us, max(p.latency_us_per_extra_rank, 1e-3), p.bandwidth_efficiency]
    if link.shared_bandwidth_gbps:
        v.append(link.shared_bandwidth_gbps)
    return v


def _link_from(vec: Sequence[float], template: LinkCalibration) -> LinkCalibration:
    protos = []
    for i, p in enumerate(template.protocols):
        lat, extra, eff = vec[3 * i : 3 * i + 3]
        protos.append(CollectiveProtocol(p.name, lat, extra, eff))
    shared = vec[3 * len(protos)] if template.shared_bandwidth_gbps else None
    return LinkCalibration(tuple(protos), shared)


def _with_compute(cal: Calibration, vec: Sequence[float]) -> Calibration:
    # fp8's rate and row factors are fitted to real vLLM only (calibration_vllm): the PyTorch data are bf16
    fitted: dict[str, Any] = dict(zip(_COMPUTE_KEYS, vec, strict=True))
    compute = ComputeCalibration(
        **fitted,
        fp8_compute_efficiency=cal.compute.fp8_compute_efficiency,
        fp8_gemm_row_factors=cal.compute.fp8_gemm_row_factors,
        fp8_gemm_row_factors_by_gpu=cal.compute.fp8_gemm_row_factors_by_gpu,
        bandwidth_scale_by_gpu=cal.compute.bandwidth_scale_by_gpu,
    )
    return replace(cal, compute=compute)


def _with_links(cal: Calibration, nv: Sequence[float], pcie: Sequence[float]) -> Calibration:
    links = dict(cal.links)
    links["nvlink"] = _link_from(nv, cal.links["nvlink"])
    links["pcie"] = _link_from(pcie, cal.links["pcie"])
    return replace(cal, links=links)


def nelder_mead(
    f: Callable[[list[float]], float], x0: Sequence[float], *, step: float = 0.15, iterations: int = 4000, tol: float = 1e-10
) -> list[float]:
    """Minimise ``f`` over log-parameters (every parameter positive); returns the parameters."""
    n = len(x0)
    y0 = [math.log(v) for v in x0]

    def g(y: list[float]) -> float:
        return f([math.exp(v) for v in y])

    simplex = [y0] + [[y0[j] + (step if j == i else 0.0) for j in range(n)] for i in range(n)]
    values = [g(s) for s in simplex]
    for _ in range(iterations):
        order = sorted(range(n + 1), key=values.__getitem__)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if values[-1] - values[0] < tol:
            break
        centroid = [sum(s[j] for s in simplex[:-1]) / n for j in range(n)]
        worst = simplex[-1]
        reflected = [c + (c - w) for c, w in zip(centroid, worst)]
        fr = g(reflected)
        if fr < values[0]:
            expanded = [c + 2 * (c - w) for c, w in zip(centroid, worst)]
            fe = g(expanded)
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            contracted = [c + 0.5 * (w - c) for c, w in zip(centroid, worst)]
            fc = g(contracted)
            if fc < values[-1]:
                simplex[-1], values[-1] = contracted, fc
            else:
                best = simplex[0]
                simplex = [best] + [[b + 0.5 * (s - b) for b, s in zip(best, s_)] for s_ in simplex[1:]]
                values = [values[0]] + [g(s) for s in simplex[1:]]
    i = min(range(n + 1), key=values.__getitem__)
    return [math.exp(v) for v in simplex[i]]


def fit(points: list[MeasuredPoint], allreduce: list[AllReducePoint], start: Calibration) -> Calibration:
    """The three-pass least-squares fit described in the module docstring."""
    cal = start

    def nocomm_loss(vec: list[float]) -> float:
        trial = _with_compute(cal, vec)
        total = 0.0
        for p in points:
            if p.measured_nocomm_ms is None:
                continue
            st = predict(p, trial)
            total += math.log((st.seconds - st.comm_seconds) * 1e3 / p.measured_nocomm_ms) ** 2
        return total

    c = cal.compute
    cal = _with_compute(cal, nelder_mead(nocomm_loss, [getattr(c, k) for k in _COMPUTE_KEYS]))

    nv0, pc0 = _link_vector(cal.links["nvlink"]), _link_vector(cal.links["pcie"])
    split = len(nv0)

    def comm_loss(vec: list[float]) -> float:
        trial = _with_links(cal, vec[:split], vec[split:])
        total = 0.0
        for p in points:
            if p.tensor_parallel == 1 or p.measured_nocomm_ms is None:
                continue
            st = predict(p, trial)
            measured = p.measured_ms - p.measured_nocomm_ms
            if measured > 0:
                total += math.log(st.comm_seconds * 1e3 / measured) ** 2
        for a in allreduce:
            total += 0.25 * math.log(predict_allreduce_us(a, trial) / a.measured_us) ** 2
        return total

    links = nelder_mead(comm_loss, nv0 + pc0)
    cal = _with_links(cal, links[:split], links[split:])

    def total_loss(vec: list[float]) -> float:
        n_c = len(_COMPUTE_KEYS)
        trial = _with_links(_with_compute(cal, vec[:n_c]), vec[n_c : n_c + split], vec[n_c + split :])
        total = 0.0
        for p in points:
            st = predict(p, trial)
            err = math.log(st.seconds * 1e3 / p.measured_ms)
            # Least squares, plus a steep penalty past 12 %: the acceptance bar is 15 % at every point.
            total += err**2 + 100.0 * max(0.0, abs(err) - 0.12) ** 2
            if p.measured_comm_share is not None and p.tensor_parallel > 1:
                total += (st.comm_fraction - p.measured_comm_share) ** 2
        return total

    c = cal.compute
    vec = nelder_mead(
        total_loss,
        [getattr(c, k) for k in _COMPUTE_KEYS] + _link_vector(cal.links["nvlink"]) + _link_vector(cal.links["pcie"]),
        step=0.05,
        iterations=6000,
    )
    n_c = len(_COMPUTE_KEYS)
    return _with_links(_with_compute(cal, vec[:n_c]), vec[n_c : n_c + split], vec[n_c + split :])


def _rounded(cal: Calibration) -> dict[str, Any]:
    def r(obj: Any) -> Any:
        if isinstance(obj, float):
            return float(f"{obj:.4g}")
        if isinstance(obj, dict):
            return {k: r(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [r(v) for v in obj]
        return obj

    return r(calibration_to_json(cal))


def comparison_rows(points: list[MeasuredPoint], cal: Calibration) -> list[dict[str, Any]]:
    """One row per point: measured and simulated ms, relative error, measured and simulated comm share."""
    rows = []
    for p in points:
        st = predict(p, cal)
        sim_ms = st.seconds * 1e3
        rows.append(
            {
                "point": p.label,
                "source": p.source,
                "measured_ms": p.measured_ms,
                "simulated_ms": sim_ms,
                "error": sim_ms / p.measured_ms - 1.0,
                "measured_comm_share": p.measured_comm_share,
                "simulated_comm_share": st.comm_fraction if p.tensor_parallel > 1 else None,
            }
        )
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of :func:`comparison_rows`."""
    lines = ["| point | source | measured ms | simulated ms | error | comm share measured / simulated |", "|---|---|---|---|---|---|"]
    for r in rows:
        share = "–"
        if r["simulated_comm_share"] is not None:
            m = r["measured_comm_share"]
            share = f"{m:.0%} / {r['simulated_comm_share']:.0%}" if m is not None else f"– / {r['simulated_comm_share']:.0%}"
        lines.append(f"| {r['point']} | {r['source']} | {r['measured_ms']:.2f} | {r['simulated_ms']:.2f} | {r['error']:+.1%} | {share} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir", type=Path, help="the H200 measurement directory (tests/data/h200)")
    parser.add_argument("--write", action="store_true", help="refit and rewrite the shipped calibration file")
    args = parser.parse_args(argv)
    points = load_points(args.data_dir)
    allreduce = load_allreduce_points(args.data_dir)
    cal = load_calibration()
    if args.write:
        cal = replace(fit(points, allreduce, cal), eager=eager_constants(args.data_dir))
        target = Path(str(resources.files("kneepoint.data").joinpath(CALIBRATION_FILE)))
        doc = json.loads(target.read_text())
        doc.update(_rounded(cal))
        target.write_text(json.dumps(doc, indent=2) + "\n")
        cal = calibration_from_json(doc)
    rows = comparison_rows(points, cal)
    print(format_table(rows))
    worst = max(rows, key=lambda r: abs(r["error"]))
    print(f"\n{len(rows)} points; worst error {worst['error']:+.1%} ({worst['point']}, {worst['source']})")
    for a in allreduce:
        print(
            f"all-reduce {a.interconnect} x{a.ranks} {a.message_bytes:>8d} B: measured {a.measured_us:6.1f} us, "
            f"simulated {predict_allreduce_us(a, cal):6.1f} us"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
