"""The ladder state machine: ``(spec, status, observations) -> (new status, actions, events)``.

One call moves the experiment by at most one transition of its current tier. It does no
I/O: the reconciler reads Kubernetes and Prometheus into :class:`Observations`, calls
:func:`reconcile_step`, applies the returned actions (all idempotent) and writes the
returned status. Because every fact the ladder needs lives in status, an operator killed
between any two steps resumes where it stopped: a tier that reached ``Measured`` is never
measured again, and children have deterministic names, so re-applying an action never
creates a duplicate.

The machine is split by concern: :mod:`ladder_state` (the pass scratchpad, settings,
helpers), :mod:`ladder_plan` (the plan), :mod:`ladder_passes` (one transition per tier
phase), :mod:`ladder_finish` (closing tiers, deciding), :mod:`ladder_spec_change` (spec
edits); :mod:`kneepoint.core.needs` says what each phase reads. This module is the entry.

Tier lifecycle::

    Pending -> (Waiting) -> Deploying -> LoadTesting -> Collecting -> Measured
        \\-> Skipped (estimate: does not fit; ladder stopped; budget)   \\-> Failed

With spec.capacity.concurrencySearch on, the decision waits for the concurrency search on the
decided tier (:mod:`kneepoint.core.concurrency_search`), which runs once no tier is current.
"""

from __future__ import annotations

from dataclasses import replace

from kneepoint.core import reasons
from kneepoint.core.actions import EventRecord
from kneepoint.core.concurrency_search import is_searching, search_step
from kneepoint.core.gpus import GIB
from kneepoint.core.ladder_finish import finish
from kneepoint.core.ladder_passes import needed_memory_fields, tier_collecting, tier_deploying, tier_load_testing, tier_pending
from kneepoint.core.ladder_plan import MISSING_OBJECT_RECHECK_SECONDS, plan
from kneepoint.core.ladder_spec_change import redecide_after_rule_change, restart_for_spec_change
from kneepoint.core.ladder_state import (
    ACTIVE_TIER_PHASES,
    TERMINAL_TIER_PHASES,
    LadderSettings,
    Pass,
    Step,
    current_tier,
    derive_phase,
    group_size,
    is_multi_node,
    is_settled,
    is_waiting_for_gpus,
    ladder_tiers,
    measurement_hash,
    recorded_gpu_product,
    tier_gpu,
    tier_of,
)
from kneepoint.core.observations import Observations
from kneepoint.core.spec import ExperimentSpec
from kneepoint.core.status import (
    TIER_COLLECTING,
    TIER_DEPLOYING,
    TIER_LOAD_TESTING,
    TIER_PENDING,
    TIER_WAITING,
    ExperimentStatus,
    get_condition,
    set_condition,
)
from kneepoint.core.timestamps import parse_rfc3339, rfc3339

__all__ = [
    "ACTIVE_TIER_PHASES",
    "GIB",
    "MISSING_OBJECT_RECHECK_SECONDS",
    "TERMINAL_TIER_PHASES",
    "LadderSettings",
    "Step",
    "current_tier",
    "derive_phase",
    "group_size",
    "is_multi_node",
    "is_settled",
    "is_waiting_for_gpus",
    "ladder_tiers",
    "measurement_hash",
    "needed_memory_fields",
    "parse_rfc3339",
    "reconcile_step",
    "recorded_gpu_product",
    "reject_spec",
    "rfc3339",
    "tier_gpu",
    "tier_of",
]


def reject_spec(status: ExperimentStatus, errors: list[str], now: float, generation: int) -> Step:
    """A spec that does not parse: Accepted False and Failed True, naming each field (an event when this is news)."""
    message = "Invalid spec: " + "; ".join(errors)
    stamp = rfc3339(now)
    conds = set_condition(status.conditions, reasons.ACCEPTED, "False", reasons.SPEC_INVALID, message[:1000], stamp, generation)
    conds = set_condition(conds, reasons.FAILED, "True", reasons.SPEC_INVALID, message[:1000], stamp, generation)
    new = replace(status, conditions=conds, observed_generation=generation, message=message[:300])
    new = replace(new, phase=derive_phase(new.conditions))
    events = [EventRecord(reasons.SPEC_INVALID, message, "Warning")] if new != status else []
    return Step(new, events=events)


def reconcile_step(
    spec: ExperimentSpec,
    status: ExperimentStatus,
    obs: Observations,
    settings: LadderSettings | None = None,
    spec_hash: str | None = None,
) -> Step:
    """Advance the experiment by one transition. Pure: same inputs, same outputs."""
    p = Pass(spec, status, obs, settings or LadderSettings())
    spec_hash = spec_hash or measurement_hash(spec)

    accepted = get_condition(p.status.conditions, reasons.ACCEPTED)
    if accepted is None or accepted.status != "True":
        p.condition(reasons.ACCEPTED, "True", reasons.SPEC_VALID, "The spec is valid.")
        p.progressed = True

    # A spec change after profiling started: measurement-defining fields restart the ladder,
    # anything else (stop rules, capacity, cleanup) only re-decides from the measurements.
    if p.status.tiers and p.status.measured_spec_hash and p.status.measured_spec_hash != spec_hash:
        return restart_for_spec_change(p, spec_hash).step()

    # A Failed experiment whose spec was edited (an invalid spec fixed, a missing ConfigMap
    # named correctly) gets a fresh ladder: the user changed the desired state.
    if derive_phase(p.status.conditions) == "Failed" and p.status.observed_generation not in (None, obs.generation):
        return restart_for_spec_change(p, spec_hash, after_failure=True).step()

    # Failed only for want of an object the engine needs (a PVC, a Secret): look again.
    failed = get_condition(p.status.conditions, reasons.FAILED)
    if not p.status.tiers and failed is not None and failed.status == "True" and failed.reason == reasons.MISSING_OBJECT:
        plan(p, spec_hash)
        return p.step()

    if derive_phase(p.status.conditions) in ("Decided", "Failed"):
        if p.status.observed_generation != obs.generation and derive_phase(p.status.conditions) == "Decided":
            redecide_after_rule_change(p)
        return p.step()

    if not p.status.tiers:
        plan(p, spec_hash)
        return p.step()

    current = current_tier(p.status)
    if current is None:
        if is_searching(p.status.concurrency_search):
            search_step(p, lambda q, budget_stopped: finish(q, budget_stopped=budget_stopped))
        else:
            finish(p, budget_stopped=False)
        return p.step()

    p.status = replace(p.status, current_tier=current.name)
    handler = {
        TIER_PENDING: tier_pending,
        TIER_WAITING: tier_pending,
        TIER_DEPLOYING: tier_deploying,
        TIER_LOAD_TESTING: tier_load_testing,
        TIER_COLLECTING: tier_collecting,
    }[current.phase]
    handler(p, current)
    return p.step()
