"""How many worker processes a run uses, and how the concurrency is split among them (pure).

One asyncio process drives HTTP streams on one core. ``--workers auto`` starts one process
per ``CONCURRENCY_PER_WORKER`` concurrent streams, bounded by the cores the container may
use (CPU affinity and the cgroup v2 ``cpu.max`` quota). The threshold is a measurement:
see docs/loadgen.md ("Workers"), where the benchmark that set it is named. When the warm-up
shows a worker's CPU saturated anyway (a faster server than assumed), auto doubles the
processes, within the same bounds, and warms up again (``escalate_workers``).
"""

from __future__ import annotations

import math

# From benchmarks/loadgen_client_capacity.py (docs/loadgen.md, "Workers"): one process
# spends ~43 us of CPU per streamed chunk, so half a core handles ~11,700 chunks/s, i.e.
# ~99 streams at 119 chunks/s each (the fastest per-stream rate in our H200 data at high
# batch). Above this many streams, auto starts another process.
CONCURRENCY_PER_WORKER = 100
MAX_WORKERS = 64


def parse_workers(value: str) -> int | None:
    """``"auto"`` -> None; ``"N"`` -> N (1..MAX_WORKERS). ValueError names the flag."""
    if value.strip().lower() == "auto":
        return None
    try:
        count = int(value)
    except ValueError:
        raise ValueError(f"--workers must be an integer 1-{MAX_WORKERS} or 'auto', got {value!r}") from None
    if not 1 <= count <= MAX_WORKERS:
        raise ValueError(f"--workers must be an integer 1-{MAX_WORKERS} or 'auto', got {value!r}")
    return count


def parse_cgroup_cpu_max(text: str) -> float | None:
    """Cores allowed by a cgroup v2 ``cpu.max`` line (``"200000 100000"`` -> 2.0; ``"max ..."`` -> None)."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def usable_cores(affinity_cores: int, cgroup_cores: float | None) -> int:
    """Whole cores a process tree may keep busy (at least 1)."""
    cores = affinity_cores
    if cgroup_cores is not None:
        cores = min(cores, math.floor(cgroup_cores))
    return max(1, cores)


def plan_workers(requested: int | None, concurrency: int, cores: int) -> int:
    """Worker processes to start: the requested number, or the auto rule (module docstring).

    Never more workers than concurrent streams: a worker without a stream would idle.
    """
    if requested is not None:
        return max(1, min(requested, concurrency))
    needed = math.ceil(concurrency / CONCURRENCY_PER_WORKER)
    return max(1, min(needed, cores, concurrency))


def split_concurrency(concurrency: int, workers: int) -> list[int]:
    """Concurrent streams per worker, as even as possible, largest shares first."""
    base, extra = divmod(concurrency, workers)
    return [base + (1 if i < extra else 0) for i in range(workers)]


def escalate_workers(current: int, cores: int, concurrency: int, cpu_saturated: bool) -> int | None:
    """More workers after a CPU-saturated warm-up (double, within cores and streams), or None."""
    if not cpu_saturated:
        return None
    more = min(current * 2, cores, concurrency)
    return more if more > current else None
