"""Runs 23's, 24's, 28's, 29's, 31's, 32's, 33's, 37's, 40's and 41's archives -> tests/data/vllm: each load as ``8b-tp1-loadgen-r23-<load>.json`` (run 24, on an
H100: ``8b-h100-tp1-loadgen-r24-<load>.json``) (the load generator's
summary, config, repeat rule and repeats, plus ``engineFlags``: the engine's flags that differ from the 8B captures'
replay flags, benchmarks/sim_vs_real_vllm.py) and ``...-requests.json.gz`` (every request, without its ITL list, to
keep the tree small enough for the device calls' 64 MiB), and the engine's start-up log.

    python3 tests/data/vllm/kit-scripts/pack_run23.py /tmp/r23x tests/data/vllm r23 r23b r23c
    python3 tests/data/vllm/kit-scripts/pack_run23.py /tmp/r24x tests/data/vllm r24
    python3 tests/data/vllm/kit-scripts/pack_run23.py /tmp/r28x tests/data/vllm r28 r28b
    python3 tests/data/vllm/kit-scripts/pack_run23.py /tmp/r29x tests/data/vllm r29 r29b
    python3 tests/data/vllm/kit-scripts/pack_run23.py /tmp/r31x tests/data/vllm r31
    python3 tests/data/vllm/kit-scripts/pack_run23.py /tmp/r32x tests/data/vllm r32
    python3 tests/data/vllm/kit-scripts/pack_run23.py /tmp/r33x tests/data/vllm r33
    python3 tests/data/vllm/kit-scripts/pack_run23.py /tmp/r37x tests/data/vllm r37 r37b
    python3 tests/data/vllm/kit-scripts/pack_run23.py /tmp/r40x tests/data/vllm r40 r40b
    python3 tests/data/vllm/kit-scripts/pack_run23.py /tmp/r41x tests/data/vllm r41 r41b
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

RUNS = {  # run folder: (its engine's flags, the captures' model prefix)
    "r23": ("run23-engine-args.txt", "8b-tp1"),
    "r23b": ("run23b-engine-args.txt", "8b-tp1"),
    "r23c": ("run23c-engine-args.txt", "8b-tp1"),
    "r24": ("run24-engine-args.txt", "8b-h100-tp1"),
    "r28": ("engine-args-realfit.txt", "8b-tp1"),  # on an H100 (its gpu.txt): 8b-h100-tp1, 8b-fp8-h100-tp1
    "r28b": ("engine-args-8b-fp8.txt", "8b-fp8-tp1"),
    "r29": ("engine-args-realfit.txt", "8b-tp1"),  # run 28's loads again (exp-retakes.sh r29 r29b)
    "r29b": ("engine-args-8b-fp8.txt", "8b-fp8-tp1"),
    "r31": ("engine-args-14b-fp8.txt", "14b-fp8-tp1"),  # Qwen2.5-14B's shape with online fp8 (exp-14b-fp8.sh), on an H100
    "r32": ("engine-args-14b-fp8.txt", "14b-fp8-tp1"),  # run 31's engine again, stamped (exp-14b-fp8-stages.sh)
    "r33": ("engine-args-8b-fp8.txt", "8b-fp8-tp1"),  # the 8B fp8's lone 1,024-token prompts, stamped (exp-8b-fp8-lone.sh)
    # The measured phases before exp-wave-profile.sh's profiled slices (the slice runs after them, unmeasured).
    "r37": ("engine-args-8b-fp8.txt", "8b-fp8-tp1"),
    "r37b": ("engine-args-realfit.txt", "8b-tp1"),
    # Run 9's 128/128 c128 load again after the stamped loops (exp-c128-short.sh), stamps off.
    "r40": ("engine-args-realfit.txt", "8b-tp1"),
    "r40b": ("engine-args-8b-fp8.txt", "8b-fp8-tp1"),
    # The same script with the 8B fp8 again and the 14B fp8 (its tokenizer named: the flags ran as this file holds them).
    "r41": ("engine-args-8b-fp8.txt", "8b-fp8-tp1"),
    "r41b": ("engine-args-14b-fp8-tok.txt", "14b-fp8-tp1"),
}


def engine_flags(engine_args: str) -> dict[str, str]:
    words = engine_args.split()
    return {w: words[i + 1] for i, w in enumerate(words) if w in ("--max-num-seqs", "--max-model-len")}


def main(src: str, dst: str, runs: list[str]) -> None:
    out = Path(dst)
    for run in runs:
        folder = Path(src) / run
        engine_file, prefix = RUNS[run]
        gpu = folder / "gpu.txt"
        if "-h100-" not in prefix and gpu.exists() and "H100" in gpu.read_text():  # the machine lent was an H100
            prefix = prefix.replace("-tp1", "-h100-tp1")
        flags = engine_flags((folder / engine_file).read_text())
        for saved in sorted(folder.glob("lg-*.json")):
            if saved.name.endswith(".termination.json"):
                continue
            load = saved.name[3:-5]
            doc = json.loads(saved.read_text())
            requests = doc.pop("requests")
            for r in requests:
                r.pop("itlMs", None)
            doc["engineFlags"] = flags
            termination = folder / f"lg-{load}.termination.json"  # run 37's loads wrote none
            if termination.exists():
                doc["termination"] = json.loads(termination.read_text())
            base = out / f"{prefix}-loadgen-{run[:3]}-{load}"
            base.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
            with gzip.open(f"{base}-requests.json.gz", "wt", compresslevel=9) as handle:
                json.dump(requests, handle, separators=(",", ":"))
        log = next(iter(folder.glob("serve*.log"))).read_text().splitlines()  # run 24's is serve-8b.log
        end = next((i for i, line in enumerate(log) if "Application startup complete" in line), len(log) - 1)
        (out / f"{prefix}-serve-{run}.log").write_text("\n".join(log[: end + 1]) + "\n")  # the start-up, not the access log


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
