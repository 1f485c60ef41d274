"""Print the memory estimator's figures next to the real H200 measurements (tests/data/h200).

Run: ``.venv/bin/python benchmarks/estimator_vs_h200.py`` from the repository root. Prints
markdown tables (used in docs/estimator.md): per decode/prefill point, the allocator's peak
against weights + KV (+ activations for prefill), and NVML-minus-allocator against the
estimator's runtime overhead plus NVML's reserve outside CUDA's total. Call 1 of multi-run
files is used, as in the unit tests.
"""

from __future__ import annotations

import json
from pathlib import Path

from kneepoint.core.architectures import get_preset
from kneepoint.core.gpus import GIB, get_gpu_type
from kneepoint.core.memory_estimate import (
    activation_bytes_per_gpu,
    estimate_memory,
    kv_bytes_per_token_per_gpu,
    overhead_parts,
    weight_bytes_per_gpu,
)
from kneepoint.core.tiers import Tier

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "h200"
PRESET_OF = {"8b": "llama-3-8b", "70b": "llama-3-70b"}


def _run(path: Path) -> dict:
    data = json.loads(path.read_text())
    return data["calls"]["call1"] if "calls" in data else data


def main() -> None:
    print(
        "| run | point | measured peak alloc GiB | est. weights+KV(+act) GiB | error | NVML-alloc GiB | est. overhead+reserve GiB | diff GiB |"
    )
    print("|---|---|---|---|---|---|---|---|")
    worst_peak = worst_overhead = 0.0
    for path in sorted(DATA.glob("llama*_tp*.json")):
        run = _run(path)
        rank = run["ranks"][0]  # every rank of a run reads the same (checked by the unit tests)
        arch, tier = get_preset(PRESET_OF[rank["model"]]), Tier(rank["tp"])
        weights = weight_bytes_per_gpu(arch, tier, "bfloat16")
        kv_token = kv_bytes_per_token_per_gpu(arch, tier, "bfloat16")
        context, nccl, _ = overhead_parts(tier, "pcie" if "nop2p" in path.name else "nvlink", enforce_eager=True)
        for kind in ("decode", "prefill"):
            for rec in rank.get(kind, []):
                mem = rec.get("mem")
                if kind == "decode":
                    label, tokens = f"decode B={rec['batch']}", rec["batch"] * (rec["ctx"] + 1)
                else:
                    label, tokens = f"prefill {rec['tokens']}", rec["tokens"]
                if not mem:
                    print(f"| {path.stem} | {label} | out of memory | | | | | |")
                    continue
                estimate = weights + kv_token * tokens
                if kind == "prefill":
                    estimate += activation_bytes_per_gpu(arch, tier, "bfloat16", max_num_batched_tokens=rec["tokens"], max_num_seqs=1)
                peak = mem["torch_max_allocated"]
                error = estimate / peak - 1
                overhead_measured = mem["nvml_used"] - peak
                overhead_estimated = (mem["nvml_total"] - mem["cuda_total"]) + context + nccl
                worst_peak = max(worst_peak, abs(error))
                worst_overhead = max(worst_overhead, abs(overhead_measured - overhead_estimated) / GIB)
                print(
                    f"| {path.stem} | {label} | {peak / GIB:.2f} | {estimate / GIB:.2f} | {error:+.1%} | {overhead_measured / GIB:.2f} | "
                    f"{overhead_estimated / GIB:.2f} | {(overhead_measured - overhead_estimated) / GIB:+.2f} |"
                )
    print()
    print(f"largest peak error {worst_peak:.1%}; largest overhead difference {worst_overhead:.2f} GiB")
    print()
    h200 = get_gpu_type("h200")
    arch = get_preset("llama-3-70b")
    print("70B at TP=1 on one H200, 1025 tokens per sequence, whole GPU (utilization 1.0):")
    for tokens, why in (
        (1024, "profile = the runs' largest forward pass (1024-token prefill)"),
        (None, "vLLM's default profile for the H200"),
    ):
        for batch in (16, 32):
            e = estimate_memory(
                arch,
                h200,
                Tier(1),
                max_model_len=1025,
                concurrency=batch,
                context_len=1025,
                gpu_memory_utilization=1.0,
                max_num_batched_tokens=tokens,
            )
            print(f"  batch {batch}, {why}: fits_target={e.fits_target}, max sequences {e.max_concurrent_sequences}; {e.reason}")
    e = estimate_memory(arch, h200, Tier(1), max_model_len=1025, concurrency=1, context_len=1025, gpu_memory_utilization=0.90)
    print(f"  at gpu-memory-utilization 0.90: fits={e.fits}; {e.reason}")


if __name__ == "__main__":
    main()
