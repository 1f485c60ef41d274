"""The end of a tier and of the ladder: close, fail or skip a tier, decide or go on, finish."""

from __future__ import annotations

from dataclasses import replace

from kneepoint.core import concurrency_search, reasons
from kneepoint.core.actions import DeleteTier, EnsureEngine, PublishRecommendation
from kneepoint.core.decision import decide
from kneepoint.core.ladder_state import (
    ACTIVE_TIER_PHASES,
    TERMINAL_TIER_PHASES,
    Pass,
    current_tier,
    group_size,
    tier_of,
)
from kneepoint.core.predict_first import verify
from kneepoint.core.status import TIER_FAILED, TIER_SKIPPED, TierResult
from kneepoint.core.tiers import Tier
from kneepoint.core.timestamps import parse_rfc3339


def close_tier(p: Pass, result: TierResult, teardown: bool) -> None:
    """Mark a tier finished: GPU-minutes, teardown of its children."""
    tier = tier_of(result)
    started = parse_rfc3339(result.started_at)
    gpu_minutes = None
    if started is not None:
        wall_minutes = max(0.0, p.obs.now - started) / 60.0
        gpu_minutes = round(wall_minutes * tier.gpus, 3)
    result = replace(result, finished_at=p.now, gpu_minutes=gpu_minutes)
    p.put_tier(result)
    # Added, not summed over status.tiers: minutes of tiers a spec change discarded stay spent.
    total = (p.status.gpu_minutes_total or 0.0) + (gpu_minutes or 0.0)
    p.status = replace(p.status, gpu_minutes_total=round(total, 3))
    if teardown:
        p.actions.append(DeleteTier(tier))


def fail_tier(p: Pass, current: TierResult, reason: str, message: str, does_not_fit: bool = False) -> None:
    tier = tier_of(current)
    failed = replace(current, phase=TIER_FAILED, reason=message[:1000], does_not_fit=True if does_not_fit else None)
    close_tier(p, failed, teardown=True)
    p.event(reason, f"{tier.label} failed: {message}"[:1000], warning=True)
    p.message(f"{tier.label}: failed ({message})"[:300])
    decide_or_continue(p)


def skip_remaining(p: Pass, why: str) -> None:
    for t in p.status.tiers:
        if t.phase not in TERMINAL_TIER_PHASES:
            if t.phase in ACTIVE_TIER_PHASES:
                p.actions.append(DeleteTier(tier_of(t)))
            p.put_tier(replace(t, phase=TIER_SKIPPED, reason=why, finished_at=p.now))
            p.event(reasons.TIER_SKIPPED_EVENT, f"{tier_of(t).label} skipped: {why}")


def decide_or_continue(p: Pass) -> None:
    # Predict-first: a measurement outside its band, or one that moved the decision, puts predicted tiers back.
    verify(p)
    outcome = decide(p.spec, p.status.tiers)
    p.status = replace(p.status, tiers=tuple(outcome.tiers))
    if outcome.decision is None:
        nxt = current_tier(p.status)
        if nxt is None:
            finish(p, budget_stopped=False)
            return
        if nxt is not None:
            p.status = replace(p.status, current_tier=nxt.name)
            p.message(f"going on to {tier_of(nxt).label}")
        p.requeue(0.0)
        return
    winner = Tier(outcome.decision.tensor_parallel, outcome.decision.pipeline_parallel)
    skip_remaining(p, f"not needed: the ladder stopped at {winner.label} (rule {outcome.decision.rule})")
    finish(p, budget_stopped=False)


def finish(p: Pass, budget_stopped: bool) -> None:
    """The ladder is over (remaining tiers already Skipped): write the decision or why there is none.

    With spec.capacity.concurrencySearch on, the first call opens the search on the decided tier
    (kneepoint.core.concurrency_search) and the decision is written when the search calls back."""
    outcome = decide(p.spec, p.status.tiers, budget_stopped=budget_stopped, search=p.status.concurrency_search)
    p.status = replace(p.status, tiers=tuple(outcome.tiers), current_tier=None, waiting_for=None, queue_position=None)
    decision = outcome.decision
    if decision is not None and p.status.concurrency_search is None:
        decided = p.status.tier(Tier(decision.tensor_parallel, decision.pipeline_parallel).name)
        if concurrency_search.wants_search(p.spec, decided) and decided is not None:
            concurrency_search.start_search(p, decided, budget_stopped)
            if concurrency_search.is_searching(p.status.concurrency_search):
                return
            outcome = decide(p.spec, p.status.tiers, budget_stopped=budget_stopped, search=p.status.concurrency_search)
            decision = outcome.decision
    p.progressed = True
    if decision is None:
        why = outcome.message or "no tier could be measured"
        no_fit = all(t.does_not_fit for t in p.status.tiers)
        reason = reasons.NO_TIER_FITS if no_fit else reasons.NO_DECISION
        p.condition(reasons.PROFILING, "False", reasons.LADDER_FINISHED, "The ladder finished without a measured tier.")
        p.condition(reasons.DECIDED, "False", reason, why[:1000])
        p.condition(reasons.FAILED, "True", reason, why[:1000])
        p.event(reason, why[:1000], warning=True)
        p.status = replace(p.status, finished_at=p.now, message=why[:300])
        p.delete_all_children()
        return
    if p.spec.mode == "Simulate":
        decision = replace(decision, simulated=True)
    p.status = replace(
        p.status, decision=decision, decided_tier=Tier(decision.tensor_parallel, decision.pipeline_parallel).label, finished_at=p.now
    )
    p.condition(reasons.PROFILING, "False", reasons.LADDER_FINISHED, "The ladder finished.")
    p.condition(reasons.DECIDED, "True", reasons.DECISION_MADE, decision.reason[:1000])
    p.condition(reasons.FAILED, "False", reasons.DECISION_MADE, "Decided.")
    keep = p.spec.cleanup.winner == "Keep"
    winner = Tier(decision.tensor_parallel, decision.pipeline_parallel)
    if keep:
        winner_result = p.status.tier(winner.name)
        p.actions.append(EnsureEngine(winner, group_size=group_size(p.spec, winner_result) if winner_result else 1))
        p.delete_all_children(keep_tier=winner)
    else:
        p.delete_all_children()
    p.actions.append(PublishRecommendation(decision))
    sim = " (simulated)" if p.spec.mode == "Simulate" else ""
    p.event(
        reasons.DECISION_MADE,
        f"Decided{sim}: {winner.label}, {decision.replicas} replica(s) of {decision.gpus_per_replica} GPU(s), "
        f"rule {decision.rule}, {decision.classification}. {decision.reason}"[:1000],
    )
    p.message(f"decided{sim}: {winner.label} x {decision.replicas} replicas (rule {decision.rule})")
