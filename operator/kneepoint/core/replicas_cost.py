"""Capacity and cost: per-replica concurrency, the replica count and cost per million tokens.

The decided tier was load-tested at one concurrency C (``spec.load.concurrency``). If it
met the SLO there, one replica serves C. If it missed, one replica is assumed to serve C
scaled down by the worst slo/measured ratio: latency grows roughly in proportion to the
batch once the GPU is busy, so this is an estimate and is labelled one. The replica count
is ``ceil(ceil(peak / perReplica) x redundancy)``, with a small tolerance so that a
product like 10 x 1.3 = 13.000000000000002 does not become 14.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kneepoint.core.spec import CapacitySpec, SloSpec
from kneepoint.core.status import TierResult

SOURCE_MEASURED = "measured"
SOURCE_ESTIMATED = "estimated"
SOURCE_UNCHECKED = "unchecked"
SOURCE_SEARCHED = "searched"

ROUNDING_TOLERANCE = 1e-9
"""Products within this of an integer are that integer before rounding up or down."""


@dataclass(frozen=True)
class SloObjective:
    """One latency objective compared with the tier's measurement."""

    name: str  # the TierResult JSON key it reads: ttftP95Ms or latencyP99Ms
    limit_ms: float
    measured_ms: float | None

    @property
    def met(self) -> bool | None:
        if self.measured_ms is None:
            return None
        return self.measured_ms <= self.limit_ms


@dataclass(frozen=True)
class SloCheck:
    """Every objective set in the SLO, checked against one tier at the load-test concurrency."""

    objectives: tuple[SloObjective, ...]

    @property
    def missed(self) -> tuple[SloObjective, ...]:
        return tuple(o for o in self.objectives if o.met is False)

    @property
    def unchecked(self) -> tuple[SloObjective, ...]:
        return tuple(o for o in self.objectives if o.met is None)

    @property
    def met(self) -> bool | None:
        """True when every objective is met (or none is set); False when one is missed; None when unknown."""
        if self.missed:
            return False
        if self.unchecked:
            return None
        return True


@dataclass(frozen=True)
class CapacityPlan:
    """What the decided tier means at peak load."""

    per_replica_concurrency: int
    source: str  # measured | estimated | unchecked | searched
    slo_met: bool | None  # None when no SLO is set or a set objective could not be checked
    slo_missed: bool  # True only when a set objective was measured above its limit
    replicas: int
    total_gpus: int
    cost_per_million_tokens: float | None
    explanation: str


def check_slo(tier: TierResult, slo: SloSpec) -> SloCheck:
    """Compare the tier's TTFT P95 and latency P99 with the objectives that are set."""
    return check_slo_figures(tier.ttft_p95_ms, tier.latency_p99_ms, slo)


def check_slo_figures(ttft_p95_ms: float | None, latency_p99_ms: float | None, slo: SloSpec) -> SloCheck:
    """The same check on bare figures (a point of the concurrency search)."""
    objectives = []
    if slo.ttft_p95_ms is not None:
        objectives.append(SloObjective("ttftP95Ms", float(slo.ttft_p95_ms), ttft_p95_ms))
    if slo.latency_p99_ms is not None:
        objectives.append(SloObjective("latencyP99Ms", float(slo.latency_p99_ms), latency_p99_ms))
    return SloCheck(tuple(objectives))


def per_replica_concurrency(load_concurrency: int, slo_check: SloCheck) -> tuple[int, str, str]:
    """(concurrency one replica serves within the SLO, source, explanation).

    Met (or no SLO): the load-test concurrency, measured. Missed: max(1, floor(C x the
    smallest slo/measured ratio over the missed objectives)), estimated. An objective whose
    figure the tier lacks cannot be checked: C is kept and the source says ``unchecked``.
    """
    c = load_concurrency
    missed = slo_check.missed
    if missed:
        ratio = min(o.limit_ms / o.measured_ms for o in missed if o.measured_ms)
        value = max(1, math.floor(c * ratio + ROUNDING_TOLERANCE))
        worst = min(missed, key=lambda o: o.limit_ms / (o.measured_ms or 1.0))
        text = (
            f"per-replica concurrency {value} estimated: at concurrency {c} the tier missed "
            + ", ".join(f"{o.name} {o.measured_ms:.0f} > {o.limit_ms:.0f} ms" for o in missed)
            # Cut, not rounded, so that 15.95 does not print as 16.0 -> 15.
            + f"; {c} x {worst.limit_ms:.0f}/{worst.measured_ms:.0f} = {math.floor((c * ratio + ROUNDING_TOLERANCE) * 100) / 100:.2f} -> {value}"
        )
        return value, SOURCE_ESTIMATED, text
    if slo_check.unchecked:
        names = ", ".join(o.name for o in slo_check.unchecked)
        return c, SOURCE_UNCHECKED, f"per-replica concurrency {c} unchecked: the SLO sets {names} but the tier has no such figure"
    if slo_check.objectives:
        met = ", ".join(f"{o.name} {o.measured_ms:.0f} <= {o.limit_ms:.0f} ms" for o in slo_check.objectives)
        return c, SOURCE_MEASURED, f"per-replica concurrency {c} measured: the tier met the SLO at concurrency {c} ({met})"
    return c, SOURCE_MEASURED, f"per-replica concurrency {c} measured: no SLO is set, so the load-test concurrency stands"


def replicas_needed(peak_concurrency: int, per_replica: int, redundancy_factor: float) -> int:
    """ceil(ceil(peak / perReplica) x redundancy); never below peak / perReplica."""
    if per_replica < 1 or peak_concurrency < 1:
        raise ValueError("peak and per-replica concurrency must be at least 1")
    base = -(-peak_concurrency // per_replica)
    return max(base, math.ceil(base * redundancy_factor - ROUNDING_TOLERANCE))


def cost_per_million_tokens(gpu_hourly_cost: float, gpus: int, output_tokens_per_second: float | None) -> float | None:
    """gpuHourlyCost x GPUs / (output tokens per hour) x 1e6; None when cost is 0 or throughput unknown."""
    if gpu_hourly_cost <= 0 or not output_tokens_per_second or output_tokens_per_second <= 0:
        return None
    return gpu_hourly_cost * gpus / (output_tokens_per_second * 3600.0) * 1e6


def plan_capacity(tier: TierResult, capacity: CapacitySpec, load_concurrency: int, peak_concurrency: int) -> CapacityPlan:
    """Per-replica concurrency, replicas, total GPUs and cost for the decided tier."""
    check = check_slo(tier, capacity.slo)
    per_replica, source, text = per_replica_concurrency(load_concurrency, check)
    return sized_plan(
        tier.gpus,
        capacity,
        peak_concurrency,
        per_replica,
        source,
        text,
        slo_met=check.met if check.objectives else None,
        slo_missed=bool(check.missed),
        output_tokens_per_second=tier.output_tokens_per_second,
    )


def sized_plan(
    gpus: int,
    capacity: CapacitySpec,
    peak_concurrency: int,
    per_replica: int,
    source: str,
    text: str,
    *,
    slo_met: bool | None,
    slo_missed: bool,
    output_tokens_per_second: float | None,
) -> CapacityPlan:
    """The plan for one per-replica concurrency (however it was found): replicas, GPUs, cost, the formula in words."""
    replicas = replicas_needed(peak_concurrency, per_replica, capacity.redundancy_factor)
    base = -(-peak_concurrency // per_replica)
    text += (
        f"; replicas = ceil(ceil({peak_concurrency} / {per_replica}) x {capacity.redundancy_factor:g}) = "
        f"ceil({base} x {capacity.redundancy_factor:g}) = {replicas}; {replicas} x {gpus} GPU{'s' if gpus != 1 else ''} "
        f"= {replicas * gpus} GPU{'s' if replicas * gpus != 1 else ''}"
    )
    return CapacityPlan(
        per_replica_concurrency=per_replica,
        source=source,
        slo_met=slo_met,
        slo_missed=slo_missed,
        replicas=replicas,
        total_gpus=replicas * gpus,
        cost_per_million_tokens=cost_per_million_tokens(capacity.gpu_hourly_cost, gpus, output_tokens_per_second),
        explanation=text,
    )
