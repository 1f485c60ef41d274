"""Run 28's loads (second takes of the 8B's and the 8B fp8's short-prompt captures, each of which had one take), written
from the benchmark's own builder (``sim_vs_real_vllm.loadgen_args``: a capture's own load-generator flags) with the
endpoint on the device machine and new seeds (a fresh engine per run, but no two loads of a run share a prompt).

    PYTHONPATH=operator:benchmarks .venv/bin/python tests/data/vllm/kit-scripts/make_run28_loads.py tests/data/vllm/kit-scripts
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from sim_vs_real_vllm import DATA, loadgen_args

ENDPOINT = "http://127.0.0.1:8000"
TAKES = {  # the loads file: (capture prefix, [(the capture taken again, the new load's name)]), first seed
    "run28-loads.txt": (
        "8b-tp1",
        [("r6-d-c1", "d-c1"), ("r6-d-c16", "d-c16"), ("r6-d-c64", "d-c64"), ("r6-d-c128", "d-c128"), ("r9-p128-c128", "p128-c128"), ("r9-p256-c64", "p256-c64")],
        2800,
    ),
    "run28b-loads.txt": ("8b-fp8-tp1", [(f"r12-d-c{c}", f"d-c{c}") for c in (8, 16, 24, 32, 40, 48, 64, 96, 128)], 2850),
}


def main(dst: str) -> None:
    for name, (prefix, takes, seed) in TAKES.items():
        lines = []
        for i, (capture, load) in enumerate(takes):
            config = dict(json.loads((DATA / f"{prefix}-loadgen-{capture}.json").read_text())["config"], seed=seed + i)
            lines.append(f"{load} {' '.join(loadgen_args(config, ENDPOINT))}")
        (Path(dst) / name).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
