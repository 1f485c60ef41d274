"""The GPU catalogue: memory, HBM bandwidth, peak dense FLOPs and default interconnect per GPU type.

Figures live in ``kneepoint/data/gpus.json`` so that adding a GPU is a data change. The
estimator uses ``memory_bytes``; the simulator's roofline model uses the bandwidths and FLOPs.
Lookups accept the catalogue name (``h200``), any GFD product label (``NVIDIA-H200``) or a
loose spelling (``H200``, ``nvidia h200``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kneepoint.core.catalog_files import load_data_file

GIB = 1024**3


@dataclass(frozen=True)
class GpuType:
    """One GPU model as the estimator and the simulator see it."""

    name: str
    display_name: str
    product_labels: tuple[str, ...]
    memory_bytes: int
    """Total device memory as the CUDA driver reports it (what gpu-memory-utilization multiplies)."""
    gfd_memory_mib: int
    """Value NVIDIA GPU Feature Discovery writes in ``nvidia.com/gpu.memory``."""
    hbm_bandwidth_gbps: float
    """Peak device-memory bandwidth, GB/s (10^9 bytes)."""
    bf16_tflops: float
    """Peak dense bf16/fp16 tensor throughput, TFLOP/s."""
    fp8_tflops: float
    bf16_supported: bool
    fp8_supported: bool
    interconnect: str
    """Default intra-node link between GPUs of this type: ``nvlink`` or ``pcie``."""
    link_bandwidth_gbps: float
    """Per-GPU one-direction bandwidth of that default link, GB/s."""
    pcie_bandwidth_gbps: float
    max_gpus_per_node: int
    power_watts: float

    @property
    def memory_gib(self) -> float:
        return self.memory_bytes / GIB


def _normalise(text: str) -> str:
    return "".join(ch for ch in text.lower() if ch.isalnum())


def all_gpu_types() -> tuple[GpuType, ...]:
    """Every GPU in the catalogue, in catalogue order."""
    rows = load_data_file("gpus.json")["gpus"]
    return tuple(
        GpuType(
            name=row["name"],
            display_name=row["displayName"],
            product_labels=tuple(row["productLabels"]),
            memory_bytes=int(row["memoryBytes"]),
            gfd_memory_mib=int(row["gfdMemoryMiB"]),
            hbm_bandwidth_gbps=float(row["hbmBandwidthGBps"]),
            bf16_tflops=float(row["bf16Tflops"]),
            fp8_tflops=float(row["fp8Tflops"]),
            bf16_supported=bool(row["bf16Supported"]),
            fp8_supported=bool(row["fp8Supported"]),
            interconnect=row["interconnect"],
            link_bandwidth_gbps=float(row["linkBandwidthGBps"]),
            pcie_bandwidth_gbps=float(row["pcieBandwidthGBps"]),
            max_gpus_per_node=int(row["maxGpusPerNode"]),
            power_watts=float(row["powerWatts"]),
        )
        for row in rows
    )


def gpu_names() -> tuple[str, ...]:
    """Catalogue names, for error messages and CLI choices."""
    return tuple(gpu.name for gpu in all_gpu_types())


def find_gpu_type(name_or_label: str) -> GpuType | None:
    """Return the GPU for a catalogue name, a GFD product label or a loose spelling, else None."""
    wanted = _normalise(name_or_label)
    if not wanted:
        return None
    for gpu in all_gpu_types():
        if wanted == _normalise(gpu.name) or any(wanted == _normalise(label) for label in gpu.product_labels):
            return gpu
    # Loose: "H200" or "nvidia h200" -> h200. Only accept a unique match, and never let a
    # shorter model number match a longer one ("H20" is another GPU, not the H200).
    loose = [gpu for gpu in all_gpu_types() if _loosely_names(wanted, _normalise(gpu.name))]
    return loose[0] if len(loose) == 1 else None


def _loosely_names(wanted: str, name: str) -> bool:
    """True when one normalised name contains the other and the match does not cut a number short."""
    for short, long in ((name, wanted), (wanted, name)):
        at = long.find(short)
        if at >= 0:
            after = long[at + len(short) : at + len(short) + 1]
            before = long[at - 1 : at] if at else ""
            if not (after.isdigit() and short[-1:].isdigit()) and not (before.isdigit() and short[:1].isdigit()):
                return True
    return False


def get_gpu_type(name_or_label: str) -> GpuType:
    """Like :func:`find_gpu_type` but raises ``KeyError`` naming the allowed values."""
    gpu = find_gpu_type(name_or_label)
    if gpu is None:
        raise KeyError(f"unknown GPU type {name_or_label!r}; known: {', '.join(gpu_names())}")
    return gpu
