"""DCGM-exporter-style GPU metrics for the simulated GPUs of one replica.

One series per GPU of the tier (TP x PP GPUs), labelled as dcgm-exporter labels them:
``gpu``, ``UUID`` (deterministic fake UUIDs), ``pci_bus_id``, ``device``, ``modelName`` (the
GPU's display name), ``Hostname``, and ``pod``/``namespace``/``container`` when the pod is
known (as the exporter adds with ``-k``). Framebuffer figures are MiB, as DCGM reports them;
FB_USED is what vLLM holds, i.e. its pre-allocated budget (gpu-memory-utilization x memory),
not the KV cache actually in use: the trap DESIGN.md section 7 warns about, reproduced on
purpose. Utilisation and byte rates are averages over the telemetry window.

``DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL`` is a counter whose unit dcgm-exporter does not state;
here it counts bytes sent plus received per GPU (use ``rate()``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from kneepoint.core.gpus import GpuType
from kneepoint.simulator.calibration import PowerCalibration
from kneepoint.simulator.telemetry import WindowRates

MIB = 1024**2

# Typical PCI bus numbers of the eight GPUs of an HGX baseboard.
_PCI_BUSES = (0x19, 0x3B, 0x4C, 0x5D, 0x9B, 0xBB, 0xCB, 0xDB)

_FIELDS = (
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB)."),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and data payloads - in bytes per second.",
    ),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", "Total number of NVLink bandwidth counters for all lanes."),
    (
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "gauge",
        "The rate of data transmitted over NVLink, not including protocol headers, in bytes per second.",
    ),
    (
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "gauge",
        "The rate of data received over NVLink, not including protocol headers, in bytes per second.",
    ),
)


@dataclass(frozen=True)
class GpuIdentity:
    """The labels of one simulated GPU."""

    index: int
    uuid: str
    pci_bus_id: str

    @property
    def device(self) -> str:
        return f"nvidia{self.index}"


def gpu_identities(count: int, *, hostname: str, pod: str | None, namespace: str | None) -> list[GpuIdentity]:
    """``count`` GPUs with UUIDs derived from host, pod and index (stable across restarts)."""
    out = []
    for i in range(count):
        digest = hashlib.sha1(f"{hostname}/{namespace or ''}/{pod or ''}/{i}".encode()).hexdigest()
        uuid = f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
        bus = _PCI_BUSES[i % len(_PCI_BUSES)] + (i // len(_PCI_BUSES))
        out.append(GpuIdentity(i, uuid, f"00000000:{bus:02X}:00.0"))
    return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class DcgmMetrics:
    """Renders the exporter's text for the replica's GPUs from the engine's telemetry."""

    def __init__(
        self,
        gpu: GpuType,
        gpus: int,
        *,
        interconnect: str,
        hostname: str,
        power: PowerCalibration,
        pod: str | None = None,
        namespace: str | None = None,
        container: str | None = None,
    ) -> None:
        self.gpu = gpu
        self.interconnect = interconnect
        self.power = power
        self.identities = gpu_identities(gpus, hostname=hostname, pod=pod, namespace=namespace)
        extra = ""
        for key, value in (("container", container), ("namespace", namespace), ("pod", pod)):
            if value:
                extra += f',{key}="{_escape(value)}"'
        self._labels = [
            f'gpu="{g.index}",UUID="{g.uuid}",pci_bus_id="{g.pci_bus_id}",device="{g.device}",'
            f'modelName="{_escape(gpu.display_name)}",Hostname="{_escape(hostname)}"{extra}'
            for g in self.identities
        ]
        total_mib = gpu.gfd_memory_mib
        self.reserved_mib = max(0, total_mib - gpu.memory_bytes // MIB)
        self.total_mib = total_mib

    def render(self, *, used_bytes_per_gpu: float, rates: WindowRates, link_bytes_total: float) -> bytes:
        """The /metrics body. ``used_bytes_per_gpu``: what the engine holds (its budget once loaded)."""
        used = int(used_bytes_per_gpu // MIB)
        free = max(0, self.total_mib - self.reserved_mib - used)
        busy = rates.busy_fraction
        nvlink = self.interconnect == "nvlink"
        # Without NVLink the collectives cross PCIe (through host memory): both directions.
        pcie_tx = rates.d2h_bytes_per_s + (0.0 if nvlink else rates.link_tx_bytes_per_s)
        pcie_rx = rates.h2d_bytes_per_s + (0.0 if nvlink else rates.link_rx_bytes_per_s)
        watts = self.gpu.power_watts * (self.power.idle_fraction + (self.power.busy_fraction - self.power.idle_fraction) * busy)
        values = {
            "DCGM_FI_DEV_FB_FREE": str(free),
            "DCGM_FI_DEV_FB_USED": str(used),
            "DCGM_FI_DEV_FB_RESERVED": str(self.reserved_mib),
            "DCGM_FI_DEV_GPU_UTIL": str(round(busy * 100)),
            "DCGM_FI_DEV_POWER_USAGE": f"{watts:.6f}",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": f"{busy:.6f}",
            "DCGM_FI_PROF_PCIE_TX_BYTES": str(round(pcie_tx)),
            "DCGM_FI_PROF_PCIE_RX_BYTES": str(round(pcie_rx)),
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": str(round(link_bytes_total) if nvlink else 0),
            "DCGM_FI_PROF_NVLINK_TX_BYTES": str(round(rates.link_tx_bytes_per_s) if nvlink else 0),
            "DCGM_FI_PROF_NVLINK_RX_BYTES": str(round(rates.link_rx_bytes_per_s) if nvlink else 0),
        }
        lines: list[str] = []
        for name, kind, help_text in _FIELDS:
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            value = values[name]
            lines.extend(f"{name}{{{labels}}} {value}" for labels in self._labels)
        return ("\n".join(lines) + "\n").encode()
