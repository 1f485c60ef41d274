"""Spec changes: a measurement-defining change restarts the ladder; a rule or capacity change re-decides."""

from __future__ import annotations

from dataclasses import replace

from kneepoint.core import reasons, stop_rules
from kneepoint.core.actions import PublishRecommendation
from kneepoint.core.decision import decide
from kneepoint.core.ladder_state import ACTIVE_TIER_PHASES, Pass, tier_of
from kneepoint.core.predict_first import reopen_for_rule_change
from kneepoint.core.status import SEARCH_FINISHED, ExperimentStatus
from kneepoint.core.tiers import Tier
from kneepoint.core.timestamps import parse_rfc3339


def restart_for_spec_change(p: Pass, spec_hash: str, after_failure: bool = False) -> Pass:
    p.delete_all_children()
    p.event(
        reasons.SPEC_CHANGED,
        "The spec changed after the experiment failed: starting the ladder again"
        if after_failure
        else "Measurement-defining fields of the spec changed (model, engine, tiers, load, placement or mode): "
        "discarding measured tiers and restarting the ladder",
        warning=not after_failure,
    )
    # GPUs held by the tier in progress until now were spent too.
    in_progress = 0.0
    for t in p.status.tiers:
        started = parse_rfc3339(t.started_at)
        if t.phase in ACTIVE_TIER_PHASES and started is not None:
            in_progress += max(0.0, p.obs.now - started) / 60.0 * tier_of(t).gpus
    search = p.status.concurrency_search
    searched = p.status.tier(search.tier) if search is not None and search.phase != SEARCH_FINISHED else None
    search_started = parse_rfc3339(search.started_at) if search is not None else None
    if searched is not None and search_started is not None:
        in_progress += max(0.0, p.obs.now - search_started) / 60.0 * tier_of(searched).gpus
    p.status = ExperimentStatus(
        conditions=tuple(c for c in p.status.conditions if c.type == reasons.ACCEPTED),
        gpu_minutes_total=round((p.status.gpu_minutes_total or 0.0) + in_progress, 3),
        message="spec changed: restarting the ladder",
    )
    p.condition(reasons.PLANNED, "Unknown", reasons.SPEC_CHANGED, "Re-planning after a spec change.")
    p.progressed = True
    p.requeue(0.0)
    return p


def redecide_after_rule_change(p: Pass) -> None:
    """Stop rules or capacity changed after the decision: decide again from the same measurements."""
    if reopen_for_rule_change(p):  # predict-first: the new rules need a predicted tier measured
        return
    old = p.status.decision
    # A ladder the budget ended stays ended: re-deciding must not turn it into last-tier.
    outcome = decide(p.spec, p.status.tiers, budget_stopped=bool(old and old.rule == stop_rules.BUDGET), search=p.status.concurrency_search)
    if outcome.decision is None:
        return
    decision = replace(outcome.decision, simulated=True) if p.spec.mode == "Simulate" else outcome.decision
    p.status = replace(
        p.status,
        tiers=tuple(outcome.tiers),
        decision=decision,
        decided_tier=Tier(decision.tensor_parallel, decision.pipeline_parallel).label,
    )
    p.condition(reasons.DECIDED, "True", reasons.DECISION_UPDATED, decision.reason[:1000])
    p.actions.append(PublishRecommendation(decision))
    if old != decision:
        p.event(
            reasons.DECISION_UPDATED,
            f"Re-decided from the measured tiers after a spec change: {Tier(decision.tensor_parallel, decision.pipeline_parallel).label}, "
            f"{decision.replicas} replica(s), rule {decision.rule}",
        )
    p.progressed = True
