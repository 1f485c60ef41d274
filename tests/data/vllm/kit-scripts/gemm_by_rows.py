"""Time vLLM's own linear-layer kernels by the number of rows (tokens) in a step, on one GPU.

Run 12 (issue 13). A decode step's GEMMs multiply a few rows of activations by a layer's whole
weight matrix; vLLM picks a kernel configuration by that row count M (for fp8 on SM90:
``cutlass_gemm_sm90_fp8_dispatch``, M in [1, 16], (16, 64], (64, 128], above), and the 70B fp8
decode step at 32 sequences took 28.1 ms against 21.5 ms at 16 (run 11). This measures, for the
Llama-3.1 70B linear shapes at TP 1, 2 and 4 (each GPU's shard) and the 8B's at TP 1, the time of one GEMM:

- fp8: ``vllm._custom_ops.cutlass_scaled_mm`` (what ``--quantization fp8`` runs: e4m3 weights
  column-major, per-tensor scales, bf16 out), the kernel the run-10 trace shows;
- bf16: ``torch.nn.functional.linear`` (vLLM's unquantized linear; cuBLAS).

Each figure is a CUDA graph of 24 GEMMs over weight copies that together exceed the L2 cache
(each read streams from HBM, as in a step over 80 layers), replayed until at least 20 ms, the
median of 5 timings. Prints JSON lines; writes them to argv[1].
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

import torch

SHAPES = {
    # name: (hidden, intermediate, q heads, kv heads, head dim)
    "8b": (4096, 14336, 32, 8, 128),
    "70b": (8192, 28672, 64, 8, 128),
    "14b": (5120, 13824, 40, 8, 128),  # Qwen2.5-14B (run 31)
}
ROWS = [1, 8, 16, 17, 32, 48, 64, 65, 96, 128, 129, 256, 512, 1024, 2048, 4096, 8192]
# Run 12b: KP_ROWS="8,16,24,..." KP_SHAPES="70b:1,8b:1" (the batch sizes vLLM's CUDA graphs pad a step to).
if os.environ.get("KP_ROWS"):
    ROWS = [int(m) for m in os.environ["KP_ROWS"].split(",")]
SHAPE_PLAN = [("70b", (1, 2, 4)), ("8b", (1,))]
if os.environ.get("KP_SHAPES"):
    SHAPE_PLAN = [(part.split(":")[0], tuple(int(t) for t in part.split(":")[1:])) for part in os.environ["KP_SHAPES"].split(",")]
L2_BYTES = 50 * 2**20
GRAPH_GEMMS = 24


def linears(model: str, tp: int) -> dict[str, tuple[int, int]]:
    """(K, N) of each linear layer of one decoder layer on one GPU of a TP group."""
    h, inter, q, kv, d = SHAPES[model]
    return {
        "qkv": (h, (q + 2 * kv) * d // tp),
        "o": (q * d // tp, h),
        "gate_up": (h, 2 * inter // tp),
        "down": (inter // tp, h),
    }


def timed(fn, reps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000.0 / reps


def measure(kind: str, k: int, n: int, m: int, ops) -> dict:
    dev = torch.device("cuda")
    wbytes = k * n * (1 if kind == "fp8" else 2)
    copies = max(2, -(-4 * L2_BYTES // wbytes))
    if kind == "fp8":
        ws = [torch.randn(n, k, device=dev).to(torch.float8_e4m3fn).t() for _ in range(copies)]  # column-major (K, N)
        x = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
        sa = torch.ones(1, 1, device=dev, dtype=torch.float32)
        sb = torch.ones(1, 1, device=dev, dtype=torch.float32)

        def one(i: int):
            return ops.cutlass_scaled_mm(x, ws[i % copies], sa, sb, torch.bfloat16)
    else:
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)

        def one(i: int):
            return torch.nn.functional.linear(x, ws[i % copies])

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(3):
            one(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(GRAPH_GEMMS):
            one(i)
    graph.replay()
    torch.cuda.synchronize()
    first = timed(graph.replay, 1)
    reps = max(1, int(0.02 / max(first, 1e-6)))
    runs = [timed(graph.replay, reps) / GRAPH_GEMMS for _ in range(5)]
    sec = statistics.median(runs)
    del graph, ws
    return {
        "kind": kind,
        "k": k,
        "n": n,
        "m": m,
        "us": round(sec * 1e6, 3),
        "spread": round((max(runs) - min(runs)) / sec, 4),
        "weight_gbps": round(wbytes / sec / 1e9, 1),
        "tflops": round(2.0 * m * k * n / sec / 1e12, 2),
        "copies": copies,
    }


def main() -> None:
    out = open(sys.argv[1], "w") if len(sys.argv) > 1 else sys.stdout
    try:
        from vllm import _custom_ops as ops
    except Exception as exc:  # the bf16 half still runs
        print(json.dumps({"error": f"vllm._custom_ops: {exc!r}"}), file=out, flush=True)
        ops = None
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": ROWS}), file=out, flush=True)
    began = time.time()
    done = set()
    for model, tps in SHAPE_PLAN:
        for tp in tps:
            for layer, (k, n) in linears(model, tp).items():
                for kind in ("fp8", "bf16"):
                    if kind == "fp8" and ops is None:
                        continue
                    for m in ROWS:
                        if (kind, k, n, m) in done:
                            continue
                        done.add((kind, k, n, m))
                        try:
                            row = measure(kind, k, n, m, ops)
                        except Exception as exc:
                            row = {"kind": kind, "k": k, "n": n, "m": m, "error": repr(exc)[:300]}
                        row.update(model=model, tp=tp, layer=layer)
                        print(json.dumps(row), file=out, flush=True)
                        torch.cuda.empty_cache()
    print(json.dumps({"seconds": round(time.time() - began, 1)}), file=out, flush=True)


if __name__ == "__main__":
    main()
