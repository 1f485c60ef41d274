"""The NVML recordings under tests/data/nvml/ and the labels each one must produce.

One synthetic recording per topology named in the issue, plus the real 2 x H200 run recorded
on the device machine (kind nvidia-h200-x2) with
``PYTHONPATH=operator python3 -m kneepoint.nodeprobe.nvml_reader --out h200x2-real.json``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parents[2] / "data" / "nvml"
H200_ENV_TOPO = Path(__file__).resolve().parents[2] / "data" / "h200" / "env_topo.json"

FIXTURES = {
    "nvswitch-8gpu": DATA / "nvswitch-8gpu-synthetic.json",
    "bridged-2x2": DATA / "bridged-2x2-synthetic.json",
    "pcie-4gpu": DATA / "pcie-4gpu-synthetic.json",
    "h200x2-real": DATA / "h200x2-real.json",
}

NODE = "gpu-node-a"

# Labels for node NODE, per fixture: what docs/nodeprobe.md shows.
EXPECTED_LABELS: dict[str, dict[str, str]] = {
    "nvswitch-8gpu": {
        "kneepoint.io/gpu-product": "NVIDIA-H100-80GB-HBM3",
        "kneepoint.io/gpu-count": "8",
        "kneepoint.io/gpu-memory-mib": "81559",
        "kneepoint.io/nvlink-domain": "gpu-node-a-nvl0",
        "kneepoint.io/nvlink-domain-size": "8",
        "kneepoint.io/nvlink-domains": "1",
        "kneepoint.io/interconnect": "nvlink",
    },
    "bridged-2x2": {
        "kneepoint.io/gpu-product": "NVIDIA-A100-80GB-PCIe",
        "kneepoint.io/gpu-count": "4",
        "kneepoint.io/gpu-memory-mib": "81920",
        "kneepoint.io/nvlink-domain": "gpu-node-a-nvl0",
        "kneepoint.io/nvlink-domain-size": "2",
        "kneepoint.io/nvlink-domains": "2",
        "kneepoint.io/interconnect": "mixed",
    },
    "pcie-4gpu": {
        "kneepoint.io/gpu-product": "NVIDIA-L40S",
        "kneepoint.io/gpu-count": "4",
        "kneepoint.io/gpu-memory-mib": "46068",
        "kneepoint.io/nvlink-domain": "gpu-node-a-nvl0",
        "kneepoint.io/nvlink-domain-size": "1",
        "kneepoint.io/nvlink-domains": "4",
        "kneepoint.io/interconnect": "pcie",
    },
    "h200x2-real": {
        "kneepoint.io/gpu-product": "NVIDIA-H200",
        "kneepoint.io/gpu-count": "2",
        "kneepoint.io/gpu-memory-mib": "143771",
        "kneepoint.io/nvlink-domain": "gpu-node-a-nvl0",
        "kneepoint.io/nvlink-domain-size": "2",
        "kneepoint.io/nvlink-domains": "1",
        "kneepoint.io/interconnect": "nvlink",
    },
}

EXPECTED_DOMAINS: dict[str, list[tuple[int, ...]]] = {
    "nvswitch-8gpu": [(0, 1, 2, 3, 4, 5, 6, 7)],
    "bridged-2x2": [(0, 1), (2, 3)],
    "pcie-4gpu": [(0,), (1,), (2,), (3,)],
    "h200x2-real": [(0, 1)],
}

# Fields of a recording that describe the reading rather than NVML's answers.
META_FIELDS = ("recordedAt", "library", "source", "note")


def load(name: str) -> dict[str, Any]:
    """A fresh (deep) copy of a fixture recording, safe to modify."""
    return copy.deepcopy(json.loads(FIXTURES[name].read_text(encoding="utf-8")))


def answers(recording: dict[str, Any]) -> dict[str, Any]:
    """The recording without its META_FIELDS: what a replay must reproduce."""
    return {key: value for key, value in recording.items() if key not in META_FIELDS}
