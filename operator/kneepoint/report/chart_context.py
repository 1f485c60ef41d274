"""What the knee chart's title and reference lines say about the experiment.

Apart from knee_chart.py so that the report (text, markdown, JSON) imports no matplotlib:
only ``kneepoint report --png`` needs it (the `report` extra).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ChartContext:
    """What the title and reference lines say about the experiment."""

    model: str | None = None
    gpu_product: str | None = None
    workload: str | None = None
    """e.g. ``concurrency 32, 1024 in / 256 out tokens``."""
    slo_latency_p99_ms: float | None = None
    simulated: bool = False
    slo_ttft_p95_ms: float | None = None
    """The TTFT objective, drawn on the concurrency-search panel beside the P99 one."""
