"""The ladder's pass scratchpad, settings and the small pure helpers every transition uses.

:class:`Pass` collects one reconcile pass's status edits, actions, events and requeue
time; :func:`kneepoint.core.ladder.reconcile_step` creates one and returns its :class:`Step`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from typing import Any

from kneepoint.core import reasons
from kneepoint.core.actions import Action, DeleteAllChildren, DeleteTier, EventRecord
from kneepoint.core.apifields import to_json
from kneepoint.core.gpus import find_gpu_type
from kneepoint.core.memory_estimate import MemoryEstimate, estimate_tier
from kneepoint.core.observations import Observations
from kneepoint.core.spec import ExperimentSpec
from kneepoint.core.status import (
    TIER_COLLECTING,
    TIER_DEPLOYING,
    TIER_FAILED,
    TIER_LOAD_TESTING,
    TIER_MEASURED,
    TIER_PREDICTED,
    TIER_SKIPPED,
    TIER_WAITING,
    ExperimentStatus,
    TierResult,
    get_condition,
    set_condition,
)
from kneepoint.core.tiers import Tier, build_ladder
from kneepoint.core.timestamps import rfc3339

TERMINAL_TIER_PHASES = (TIER_MEASURED, TIER_SKIPPED, TIER_FAILED, TIER_PREDICTED)
ACTIVE_TIER_PHASES = (TIER_DEPLOYING, TIER_LOAD_TESTING, TIER_COLLECTING)


@dataclass(frozen=True)
class LadderSettings:
    """Timing knobs of the ladder; operator settings fill them (see ``kneepoint.settings``)."""

    poll_seconds: float = 5.0
    """How soon to look again while a child is in progress (child events also wake the operator)."""
    waiting_poll_seconds: float = 10.0
    """How soon to look again while waiting for free GPUs."""
    metrics_settle_seconds: float = 10.0
    """Wait this long after a load test before querying, so the last scrape covers its end."""
    metrics_deadline_seconds: float = 180.0
    """Retry Prometheus (unreachable, or series missing) until this long after the load test; then go on without."""
    crash_loop_restarts: int = 3
    """An engine restarting this many times is recorded as failed without waiting for the tier timeout."""


@dataclass(frozen=True)
class Step:
    """What one reconcile pass decided."""

    status: ExperimentStatus
    actions: list[Action] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)
    requeue_after: float | None = None
    """Seconds until the next pass; None when nothing is in progress (terminal or idle)."""
    progressed: bool = False
    """True when the status moved; the reconciler then runs another pass at once."""


# --------------------------------------------------------------------------------------
# Small pure helpers


def measurement_hash(spec: ExperimentSpec) -> str:
    """Hash of the spec parts that define a measurement (not the stop rules or capacity).

    A change here invalidates measured tiers; a change elsewhere only re-decides.
    """
    engine = to_json(spec.engine)
    for later in ("modelCache", "resources"):
        # Fields added after experiments existed: left unset, they keep those experiments' hash (an operator
        # upgrade must not restart their ladders).
        if not engine.get(later):
            engine.pop(later, None)
    parts = {
        "model": to_json(spec.model),
        "mode": spec.mode,
        "engine": engine,
        "tiers": to_json(spec.tiers),
        "load": to_json(spec.load),
        "placement": to_json(spec.placement),
        "simulation": to_json(spec.simulation),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def current_tier(status: ExperimentStatus) -> TierResult | None:
    """The tier the ladder is at: the first not yet Measured, Skipped or Failed (None: the ladder is over or unplanned)."""
    return next((t for t in status.tiers if t.phase not in TERMINAL_TIER_PHASES), None)


def recorded_gpu_product(status: ExperimentStatus) -> str | None:
    """The GPU product recorded at the current tier's placement, else at any tier's."""
    current = current_tier(status)
    return (current.gpu_product if current is not None else None) or next((t.gpu_product for t in status.tiers if t.gpu_product), None)


def is_waiting_for_gpus(status: ExperimentStatus) -> bool:
    """Whether a tier waits for free GPUs (the experiment then holds a place in its product's queue)."""
    return any(t.phase == TIER_WAITING for t in status.tiers)


def is_settled(status: ExperimentStatus) -> bool:
    """Decided or Failed: nothing changes until the spec does (no periodic re-reads)."""
    return status.phase in ("Decided", "Failed")


def ladder_tiers(spec: ExperimentSpec) -> list[Tier]:
    return build_ladder(spec.tiers.tensor_parallel, spec.tiers.pipeline_parallel)


def tier_of(result: TierResult) -> Tier:
    return Tier(result.tensor_parallel, result.pipeline_parallel)


def is_multi_node(tier: Tier, max_node_gpus: int) -> bool:
    """Whether one replica of ``tier`` needs more GPUs than one node has, so PP must cross nodes.

    Such a tier runs as a LeaderWorkerSet group of PP pods, each holding TP GPUs (KServe's
    workerSpec reads the same way: tensorParallelSize per node, pipelineParallelSize nodes).
    """
    return tier.pipeline_parallel > 1 and tier.gpus > max_node_gpus


def group_size(spec: ExperimentSpec, result: TierResult) -> int:
    """Pods of one replica as deployed: PP for a multi-node tier in Measure mode, else 1.

    Simulate mode runs one simulator for the whole tier (it needs no GPUs, hence no group).
    """
    if result.multi_node and spec.mode != "Simulate":
        return result.nodes or result.pipeline_parallel
    return 1


def tier_gpu(obs: Observations, result: TierResult | None) -> Any:
    """The GPU type a tier runs on: the product recorded at its placement, else the experiment's (``obs.gpu``).

    The product is recorded in the tier's status when the capacity check places it, so a later
    pass that reads no fleet (load test, metrics) still knows it, whether the experiment names
    the product (placement.gpuProduct) or only selects nodes (placement.nodeSelector).
    """
    if result is not None and result.gpu_product:
        recorded = find_gpu_type(result.gpu_product)
        if recorded is not None:
            return recorded
    return obs.gpu


def estimate(spec: ExperimentSpec, obs: Observations, tier: Tier, gpu: Any = None) -> MemoryEstimate:
    """The one estimate (memory_estimate.estimate_tier) on the tier's GPU type, else the experiment's."""
    return estimate_tier(spec, obs.architecture, gpu if gpu is not None else obs.gpu, tier)


def derive_phase(conditions: Any) -> str:
    """The one-word phase for printer columns, derived from the conditions (never read back)."""

    def is_true(type_: str) -> bool:
        c = get_condition(conditions, type_)
        return c is not None and c.status == "True"

    if is_true(reasons.FAILED):
        return "Failed"
    if is_true(reasons.DECIDED):
        return "Decided"
    if is_true(reasons.PROFILING):
        return "Profiling"
    if is_true(reasons.ACCEPTED):
        return "Planning"
    return "Pending"


class Pass:
    """Mutable scratchpad for one reconcile pass; produces a :class:`Step` (the transitions edit it)."""

    def __init__(self, spec: ExperimentSpec, status: ExperimentStatus, obs: Observations, settings: LadderSettings):
        self.spec = spec
        self.status = status
        self.obs = obs
        self.settings = settings
        self.now = rfc3339(obs.now)
        self.actions: list[Action] = []
        self.events: list[EventRecord] = []
        self.requeue_after: float | None = None
        self.progressed = False

    # -- status editing
    def condition(self, type_: str, status: str, reason: str, message: str) -> None:
        self.status = replace(
            self.status,
            conditions=set_condition(self.status.conditions, type_, status, reason, message, self.now, self.obs.generation),
        )

    def put_tier(self, result: TierResult) -> None:
        self.status = self.status.with_tier(result)
        self.progressed = True

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.append(EventRecord(reason, message, "Warning" if warning else "Normal"))

    def message(self, text: str) -> None:
        self.status = replace(self.status, message=text)

    def requeue(self, seconds: float) -> None:
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)

    # -- actions
    def delete_all_children(self, keep_tier: Tier | None = None) -> None:
        """Delete every child (but ``keep_tier``'s engine); a teardown of another tier asked for earlier in this
        pass is covered by it and dropped (the same requests twice, one round of them after the other)."""
        self.actions = [a for a in self.actions if not (isinstance(a, DeleteTier) and a.tier != keep_tier)]
        self.actions.append(DeleteAllChildren(keep_tier=keep_tier))

    def step(self) -> Step:
        # Every pass judges the whole status against the current spec, so every condition
        # is current for this generation, not only the ones whose status flipped.
        gen = self.obs.generation
        conditions = tuple(c if c.observed_generation == gen else replace(c, observed_generation=gen) for c in self.status.conditions)
        self.status = replace(self.status, conditions=conditions, phase=derive_phase(conditions), observed_generation=gen)
        return Step(self.status, self.actions, self.events, self.requeue_after, self.progressed)
