"""What one reconcile pass needs to read: ``needs(spec, status) -> Needs`` (pure).

The state machine says what it will look at; the reconciler fetches exactly that and knows
nothing of tier phases. Adding a phase means editing the core only: its transition in
:mod:`kneepoint.core.ladder` and its reads here (each phase has a table test beside its
transition in tests/unit/core/test_needs.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kneepoint.core.concurrency_search import is_searching
from kneepoint.core.ladder import LadderSettings, current_tier, group_size, ladder_tiers, recorded_gpu_product, tier_of
from kneepoint.core.spec import ExperimentSpec
from kneepoint.core.status import (
    SEARCH_DEPLOYING,
    SEARCH_PENDING,
    TIER_COLLECTING,
    TIER_DEPLOYING,
    TIER_LOAD_TESTING,
    TIER_MEASURED,
    TIER_PENDING,
    TIER_WAITING,
    ExperimentStatus,
)
from kneepoint.core.tiers import Tier
from kneepoint.core.timestamps import parse_rfc3339


@dataclass(frozen=True)
class CapacityNeed:
    """A capacity check for ``tier``: the fleet with this tier's own engine pods counted free, the GPUs
    promised to others taken off, and the wait queue; run under the capacity lock (its promise too)."""

    tier: Tier
    join_queue: bool
    """Hold a place in the queue of its GPU product (the tier already waits); else only peek at it."""


@dataclass(frozen=True)
class EngineNeed:
    tier: Tier
    group: bool
    """A LeaderWorkerSet of pods (a multi-node tier), else a Deployment."""


@dataclass(frozen=True)
class LoadTestNeed:
    tier: Tier
    attempt: int


@dataclass(frozen=True)
class MetricsNeed:
    """Prometheus over the tier's load-test window [start, end], once ``not_before`` has passed
    (the last scrape must cover the end)."""

    tier: Tier
    start: float
    end: float
    not_before: float
    traced: bool
    """The engine pod runs the trace sidecar (single-node tiers): its figures are required."""


@dataclass(frozen=True)
class ScrapeCheckNeed:
    """Whether Prometheus scrapes the engine, asked during the first tier's load test."""

    tier: Tier
    load_test_started: float


@dataclass(frozen=True)
class PredictionNeed:
    """Predict-first: the whole ladder run on the engine simulator before the plan (an adapter computes it)."""

    tiers: tuple[Tier, ...]


@dataclass(frozen=True)
class Needs:
    """The reads of one pass; every one left out is not made."""

    architecture: bool = False
    missing_objects: bool = False
    """Whether the PVC and Secret the engine needs exist (the plan fails, and looks again, while not)."""
    fleet: bool = False
    """Nodes and GPU-holding pods (Measure mode: planning, placing and re-ensuring an engine)."""
    gpu_product: str | None = None
    """The product as the spec names it, else as recorded when a tier was placed (a nodeSelector alone names none)."""
    capacity: CapacityNeed | None = None
    leader_worker_set_api: bool = False
    engine: EngineNeed | None = None
    load_test: LoadTestNeed | None = None
    metrics: MetricsNeed | None = None
    scrape_check: ScrapeCheckNeed | None = None
    prediction: PredictionNeed | None = None


def needs(spec: ExperimentSpec, status: ExperimentStatus, settings: LadderSettings | None = None) -> Needs:
    """What the pass that :func:`kneepoint.core.ladder.reconcile_step` runs next will read."""
    settings = settings or LadderSettings()
    current = current_tier(status)
    planning = not status.tiers
    phase = current.phase if current is not None else None
    measure = spec.mode == "Measure"
    placing = phase in (TIER_PENDING, TIER_WAITING)
    tier = tier_of(current) if current is not None else None
    group = current is not None and group_size(spec, current) > 1

    out = Needs(
        architecture=planning or phase in (TIER_COLLECTING, TIER_PENDING, TIER_WAITING, TIER_DEPLOYING),
        missing_objects=planning,
        fleet=measure and (planning or placing or phase == TIER_DEPLOYING),
        gpu_product=spec.placement.gpu_product or recorded_gpu_product(status),
        # Only a Pending or Waiting tier can be given GPUs (EnsureEngine); planning reads the fleet without the lock.
        capacity=CapacityNeed(tier, join_queue=phase == TIER_WAITING) if (measure and placing and tier is not None) else None,
        leader_worker_set_api=group and placing,
        # Predict-first in Measure mode only: in Simulate mode the measurement is the simulator itself.
        prediction=PredictionNeed(tuple(ladder_tiers(spec))) if (planning and measure and spec.plan.predict_first) else None,
    )
    if current is None and not planning:
        return _search_needs(spec, status, out)
    if current is None or tier is None:
        return out
    engine = EngineNeed(tier, group) if phase in (TIER_DEPLOYING, TIER_LOAD_TESTING) else None
    load_test = scrape = metrics = None
    if phase == TIER_LOAD_TESTING:
        load_test = LoadTestNeed(tier, current.attempts or 1)
        started = parse_rfc3339(current.load_test_started_at)
        if started is not None and not any(t.phase == TIER_MEASURED for t in status.tiers):
            scrape = ScrapeCheckNeed(tier, started)
    if phase == TIER_COLLECTING:
        start, end = parse_rfc3339(current.load_test_started_at), parse_rfc3339(current.load_test_finished_at)
        if start is not None and end is not None:
            metrics = MetricsNeed(tier, start, end, end + settings.metrics_settle_seconds, traced=not current.multi_node)
    return replace(out, engine=engine, load_test=load_test, metrics=metrics, scrape_check=scrape)


def _search_needs(spec: ExperimentSpec, status: ExperimentStatus, out: Needs) -> Needs:
    """The concurrency search on the decided tier (kneepoint.core.concurrency_search): its engine, its GPUs, its point."""
    search = status.concurrency_search
    result = status.tier(search.tier) if search is not None and is_searching(search) else None
    if search is None or result is None:
        return out
    tier = tier_of(result)
    measure = spec.mode == "Measure"
    engine = EngineNeed(tier, group=False)
    if search.phase == SEARCH_PENDING:
        # The ladder's engine of the tier must be gone first; then GPUs, as for any tier placed.
        return replace(out, engine=engine, fleet=measure, capacity=CapacityNeed(tier, join_queue=False) if measure else None)
    if search.phase == SEARCH_DEPLOYING:
        return replace(out, engine=engine)
    return replace(out, engine=engine, load_test=LoadTestNeed(tier, search.attempt or 1))
