"""Build the three SYNTHETIC NVML recordings in this folder (run: python tests/data/nvml/build_synthetic.py).

No machine produced these: each is written by hand from NVML's documented semantics and, where
the same call was seen on real hardware, shaped like the real answer in h200x2-real.json (links
past the GPU's own count answer InvalidArgument; NVSwitch links report remote device type
SWITCH and remote bus FFFFFFFF:FF:FF.0; the V fabric API on a single-node NVSwitch board says
COMPLETED with an all-zero cluster UUID; P2P index "pci" answers NOT_SUPPORTED there).
Product names and memory sizes are the ones nvidia-smi and GFD show for those products; bus
ids and UUIDs are made up (UUIDs are visibly fake). The recording format is documented in
operator/kneepoint/nodeprobe/nvml_reader.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
MAX_LINKS = 36
INVALID_ARGUMENT = {"nvmlError": 2, "message": "Invalid Argument"}
NOT_SUPPORTED = {"nvmlError": 3, "message": "Not Supported"}
MIB = 1024 * 1024

# nvmlGpuP2PStatus_t
OK, IOH_TOPOLOGY_NOT_SUPPORTED, P2P_NOT_SUPPORTED = 0, 3, 5
# nvmlGpuTopologyLevel_t
PIX, NODE, SYS = 10, 40, 50
# nvmlNvlinkVersion_t: 4 = NVLink 3.0 (A100), 6 = NVLink 4.0 (H100/H200)
NVLINK_3, NVLINK_4 = 4, 6
REMOTE_GPU, REMOTE_SWITCH = 0, 2


def _uuid(n: int) -> str:
    return f"GPU-00000000-0000-4000-8000-{n:012d}"


def _device(index: int, name: str, memory_mib: int, bus: str, links: list[dict[str, Any]], fabric: dict[str, Any]) -> dict[str, Any]:
    return {
        "index": index,
        "name": name,
        "uuid": _uuid(index),
        "pciBusId": bus,
        "memoryTotalBytes": memory_mib * MIB,
        "nvlinks": links,
        "fabric": fabric,
    }


def _links(active: int, version: int, remote_type: int, remote_bus: str) -> list[dict[str, Any]]:
    links: list[dict[str, Any]] = []
    for link in range(MAX_LINKS):
        if link < active:
            links.append({"link": link, "state": 1, "version": version, "remoteDeviceType": remote_type, "remotePciBusId": remote_bus})
        else:
            links.append({"link": link, "state": INVALID_ARGUMENT})
    return links


def _pair(a: int, b: int, level: int, read: int, nvlink: int, atomics: int, pci: int) -> dict[str, Any]:
    return {
        "a": a,
        "b": b,
        "commonAncestor": level,
        "p2p": {"read": read, "write": read, "nvlink": nvlink, "atomics": atomics, "pci": pci},
    }


def _recording(note: str, devices: list[dict[str, Any]], pairs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "kind": "kneepoint.io/nvml-recording",
        "version": 1,
        "source": "synthetic",
        "note": note,
        "recordedAt": None,
        "library": {"nvidiaMlPy": None, "p2pCapsIndexReadConstant": None},
        "system": {"driverVersion": "570.86.15", "nvmlVersion": "12.570.86.15"},
        "deviceCount": len(devices),
        "maxNvLinks": MAX_LINKS,
        "devices": devices,
        "pairs": pairs,
    }


def nvswitch_8() -> dict[str, Any]:
    """8 x H100 SXM on NVSwitch (HGX/DGX H100 layout): every pair NVLink, 18 links per GPU."""
    buses = ["1B", "43", "52", "61", "9D", "C3", "D1", "DF"]
    fabric = {"clusterUuid": "0" * 32, "status": 0, "cliqueId": 0, "state": 3, "healthMask": 0}
    devices = [
        _device(i, "NVIDIA H100 80GB HBM3", 81559, f"00000000:{bus}:00.0", _links(18, NVLINK_4, REMOTE_SWITCH, "FFFFFFFF:FF:FF.0"), fabric)
        for i, bus in enumerate(buses)
    ]
    # GPUs 0-3 hang off socket 0, 4-7 off socket 1: NODE within a socket, SYS across.
    pairs = [
        _pair(a, b, NODE if a // 4 == b // 4 else SYS, OK, OK, OK, P2P_NOT_SUPPORTED)
        for a in range(8)
        for b in range(a + 1, 8)
    ]
    note = "SYNTHETIC: 8 GPUs all NVLink through NVSwitch (HGX H100 8-GPU), hand-built from NVML semantics"
    return _recording(note, devices, pairs)


def bridged_2x2() -> dict[str, Any]:
    """4 x A100 PCIe: GPUs 0+1 and 2+3 joined by NVLink bridges (12 links each), the pairs over PCIe/SYS."""
    buses = ["00000000:17:00.0", "00000000:31:00.0", "00000000:B1:00.0", "00000000:CA:00.0"]
    peer = {0: 1, 1: 0, 2: 3, 3: 2}
    devices = [
        _device(i, "NVIDIA A100 80GB PCIe", 81920, buses[i], _links(12, NVLINK_3, REMOTE_GPU, buses[peer[i]]), NOT_SUPPORTED)
        for i in range(4)
    ]
    pairs = []
    for a in range(4):
        for b in range(a + 1, 4):
            if peer[a] == b:
                pairs.append(_pair(a, b, NODE, OK, OK, OK, OK))
            else:
                pairs.append(_pair(a, b, SYS, IOH_TOPOLOGY_NOT_SUPPORTED, P2P_NOT_SUPPORTED, P2P_NOT_SUPPORTED, IOH_TOPOLOGY_NOT_SUPPORTED))
    note = "SYNTHETIC: 2+2 NVLink-bridged pairs (4 x A100 PCIe) joined over PCIe across sockets, hand-built from NVML semantics"
    return _recording(note, devices, pairs)


def pcie_only_4() -> dict[str, Any]:
    """4 x L40S, no NVLink at all: every link query answers NotSupported; P2P over PCIe behind shared switches."""
    buses = ["00000000:01:00.0", "00000000:02:00.0", "00000000:81:00.0", "00000000:82:00.0"]
    links = [{"link": link, "state": NOT_SUPPORTED} for link in range(MAX_LINKS)]
    devices = [_device(i, "NVIDIA L40S", 46068, buses[i], links, NOT_SUPPORTED) for i in range(4)]
    pairs = []
    for a in range(4):
        for b in range(a + 1, 4):
            if a // 2 == b // 2:  # same PCIe switch
                pairs.append(_pair(a, b, PIX, OK, P2P_NOT_SUPPORTED, P2P_NOT_SUPPORTED, OK))
            else:
                pairs.append(_pair(a, b, SYS, IOH_TOPOLOGY_NOT_SUPPORTED, P2P_NOT_SUPPORTED, P2P_NOT_SUPPORTED, IOH_TOPOLOGY_NOT_SUPPORTED))
    note = "SYNTHETIC: 4 GPUs PCIe only (4 x L40S, two PCIe switches on two sockets), hand-built from NVML semantics"
    return _recording(note, devices, pairs)


FIXTURES = {
    "nvswitch-8gpu-synthetic.json": nvswitch_8,
    "bridged-2x2-synthetic.json": bridged_2x2,
    "pcie-4gpu-synthetic.json": pcie_only_4,
}


def main() -> None:
    """Write every synthetic fixture next to this script."""
    for name, build in FIXTURES.items():
        (HERE / name).write_text(json.dumps(build(), indent=1) + "\n", encoding="utf-8")
        print(f"wrote {HERE / name}")


if __name__ == "__main__":
    main()
