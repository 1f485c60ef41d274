"""The decision: walk the ladder's results, apply the stop rules, size the fleet.

``decide(spec, tiers)`` is pure and idempotent. The operator calls it after every tier;
it answers either a :class:`~kneepoint.core.status.Decision` or "continue" (``decision``
is None and ``state == "continue"``) while no rule has fired and tiers remain to be
measured. ``kneepoint decide`` calls it on a saved experiment. The rules, their order and
every boundary case are in docs/decision.md; in short:

* tiers are read in ladder order; only ``Measured`` tiers are compared; a tier Skipped or
  Failed with ``doesNotFit`` does not fit; other Failed/Skipped tiers are passed over, so
  the next measured tier is compared with the last measured one;
* memory-headroom is checked on the measured 1-GPU tier and, when it fires, decides it;
* each step between consecutive measured tiers applies throughput-gain, p99-degradation
  and comm-fraction in that order; the first that fires decides the smaller tier;
* otherwise the last measured tier is decided (last-tier, only-tier, or budget when the
  operator stopped the ladder for its GPU-hour budget).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kneepoint.core import concurrency_search
from kneepoint.core.gpus import find_gpu_type
from kneepoint.core.prediction import decision_basis, decision_view
from kneepoint.core.record_table import format_comparison_line, format_go_on, format_memory_line, format_stay, format_tier_line
from kneepoint.core.replicas_cost import SOURCE_MEASURED, CapacityPlan, cost_per_million_tokens, plan_capacity
from kneepoint.core.rule_names import BUDGET, LAST_TIER, MEMORY_HEADROOM, ONLY_TIER, RULES
from kneepoint.core.spec import ExperimentSpec
from kneepoint.core.status import (
    TIER_COLLECTING,
    TIER_DEPLOYING,
    TIER_FAILED,
    TIER_LOAD_TESTING,
    TIER_MEASURED,
    TIER_PENDING,
    TIER_PREDICTED,
    TIER_SKIPPED,
    TIER_WAITING,
    ConcurrencySearch,
    Decision,
    TierResult,
)
from kneepoint.core.stop_rules import (
    RuleVerdict,
    StepEvaluation,
    check_memory_headroom,
    evaluate_step,
    relative_change,
    tier_label,
)

STATE_DECIDED = "decided"
STATE_CONTINUE = "continue"
STATE_UNDECIDABLE = "undecidable"

# Phases of a tier that has not finished yet: while one of these comes before any fired
# rule, the ladder must go on.
REMAINING_PHASES = (TIER_PENDING, TIER_WAITING, TIER_DEPLOYING, TIER_LOAD_TESTING, TIER_COLLECTING)

SINGLE_GPU_ENOUGH = "single-gpu-enough"
DOES_NOT_FIT = "does-not-fit"
CANNOT_KEEP_UP = "cannot-keep-up"


@dataclass(frozen=True)
class DecisionOutcome:
    """Everything one call of :func:`decide` found."""

    decision: Decision | None
    """The decision, or None (see ``state``)."""
    tiers: tuple[TierResult, ...]
    """The input tiers with throughputGain, p99Change and costPerMillionTokens filled on measured ones."""
    comparisons: list[str]
    """One block per evaluated step (and the 1-GPU memory check): the comparison line and its conclusion."""
    verdicts: tuple[RuleVerdict, ...]
    """Every rule verdict, in evaluation order, including steps after the deciding one."""
    state: str = STATE_DECIDED
    """decided | continue (measure the next tier) | undecidable (nothing measured and nothing left)."""
    message: str = ""
    """One line: what was decided, what comes next, or why nothing can be decided."""
    steps: tuple[StepEvaluation, ...] = ()
    capacity: CapacityPlan | None = None


def tier_does_not_fit(tier: TierResult) -> bool:
    """Skipped by the estimate or failed out of memory."""
    return tier.phase in (TIER_SKIPPED, TIER_FAILED) and bool(tier.does_not_fit)


def _check_ladder_order(tiers: Sequence[TierResult]) -> None:
    # GPUs grow strictly along any ladder build_ladder makes, so this catches a shuffled list.
    for a, b in zip(tiers, tiers[1:]):
        if b.gpus <= a.gpus:
            raise ValueError(
                f"tiers must be in ladder order (GPUs strictly increasing): {tier_label(a)} ({a.gpus} GPUs) "
                f"comes before {tier_label(b)} ({b.gpus} GPUs)"
            )


def _rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def fill_tier_figures(spec: ExperimentSpec, tiers: Sequence[TierResult]) -> tuple[TierResult, ...]:
    """Set throughputGain and p99Change (against the previous measured tier) and costPerMillionTokens on measured tiers."""
    out = []
    previous: TierResult | None = None
    for tier in tiers:
        if tier.phase != TIER_MEASURED:
            out.append(tier)
            continue
        # Rounded for status only: the rules recompute from the raw figures.
        tier = replace(
            tier,
            throughput_gain=_rounded(
                relative_change(tier.output_tokens_per_second, previous.output_tokens_per_second if previous else None)
            ),
            p99_change=_rounded(relative_change(tier.latency_p99_ms, previous.latency_p99_ms if previous else None)),
            cost_per_million_tokens=_rounded(
                cost_per_million_tokens(spec.capacity.gpu_hourly_cost, tier.gpus, tier.output_tokens_per_second)
            ),
        )
        out.append(tier)
        previous = tier
    return tuple(out)


def classify(tiers: Sequence[TierResult], decided: TierResult, plan: CapacityPlan) -> str:
    """does-not-fit, single-gpu-enough or cannot-keep-up (docs/decision.md, "Classification")."""
    one_gpu = [t for t in tiers if t.gpus == 1]
    if one_gpu and all(tier_does_not_fit(t) for t in one_gpu):
        return DOES_NOT_FIT
    if decided.gpus == 1 and not plan.slo_missed:
        return SINGLE_GPU_ENOUGH
    return CANNOT_KEEP_UP


def _catalogue_gpu_memory_gib(spec: ExperimentSpec) -> float | None:
    product = spec.placement.gpu_product
    gpu = find_gpu_type(product) if product else None
    return gpu.memory_gib if gpu else None


def _unique_in_rule_order(names: Sequence[str]) -> tuple[str, ...]:
    seen = set(names)
    return tuple(r for r in RULES if r in seen)


def decide(
    spec: ExperimentSpec, tiers: Sequence[TierResult], *, budget_stopped: bool = False, search: ConcurrencySearch | None = None
) -> DecisionOutcome:
    """Decide the tier (or "continue") from the ladder's results.

    ``tiers`` holds one entry per ladder tier in ladder order, as ``status.tiers`` does
    (a tier the list lacks is unknown here). ``budget_stopped`` says the operator ended
    the ladder for its budget: then, if no stop rule fired, the last measured tier is
    decided with rule ``budget`` instead of waiting for the rest. ``search``: the
    concurrency search (status.concurrencySearch); once Finished on the decided tier, its
    result is the per-replica concurrency (source searched). Raises ValueError when the
    tiers are not in ladder order.
    """
    tiers = tuple(tiers)
    _check_ladder_order(tiers)
    rules = spec.stop_rules
    # Predict-first: a Predicted tier is compared by its predicted figures (core/prediction.py).
    filled = fill_tier_figures(spec, decision_view(tiers))

    verdicts: list[RuleVerdict] = []
    considered: list[RuleVerdict] = []  # verdicts up to and including the deciding one
    comparisons: list[str] = []
    steps: list[StepEvaluation] = []
    considered_steps: list[StepEvaluation] = []  # steps up to and including the deciding one
    memory_tier: TierResult | None = None  # the tier the memory rule read
    decided: TierResult | None = None
    rule = ""
    fired: tuple[str, ...] = ()
    reason_lines: list[str] = []
    blocked: TierResult | None = None  # first unfinished tier before any decision
    previous: TierResult | None = None
    last_line = ""  # the latest comparison (or single-tier) line, for last-tier/only-tier/budget

    for index, tier in enumerate(filled):
        if tier.phase in REMAINING_PHASES:
            if decided is None:
                blocked = tier
                break
            continue
        if tier.phase != TIER_MEASURED:
            continue
        if previous is None:
            last_line = format_tier_line(tier)
            if tier.gpus == 1:
                verdict = check_memory_headroom(tier, rules.memory_headroom, _catalogue_gpu_memory_gib(spec))
                memory_tier = tier
                verdicts.append(verdict)
                considered.append(verdict)
                last_line = format_memory_line(
                    tier, verdict.numbers.get("gpuMemoryGiB"), verdict.numbers.get("share"), rules.memory_headroom
                )
                if verdict.fired:
                    conclusion = format_stay(tier_label(tier), MEMORY_HEADROOM)
                    decided, rule, fired = tier, MEMORY_HEADROOM, (MEMORY_HEADROOM,)
                    reason_lines = [last_line, conclusion]
                else:
                    following = filled[index + 1] if index + 1 < len(filled) else None
                    conclusion = format_go_on(tier_label(following)) if following else "conclusion: no further tier"
                block = [last_line, conclusion]
                if verdict.fired is None:
                    block.append(f"note: memory-headroom {verdict.explanation}")
                comparisons.append("\n".join(block))
        else:
            step = evaluate_step(previous, tier, rules)
            steps.append(step)
            verdicts.extend(step.verdicts)
            line = format_comparison_line(
                previous, tier, step.throughput_gain, step.p99_change, rules.min_throughput_gain, rules.max_p99_degradation
            )
            conclusion = format_stay(tier_label(previous), step.fired[0], step.fired[1:]) if step.fired else format_go_on(tier_label(tier))
            block = [line, conclusion]
            if decided is None:
                considered.extend(step.verdicts)
                considered_steps.append(step)
                last_line = line
                if step.fired:
                    decided, rule, fired = previous, step.fired[0], step.fired
                    reason_lines = [line, conclusion]
            else:
                block.append(f"note: after the decision at {tier_label(decided)}; recorded, not used")
            for v in step.verdicts:
                if v.fired is None:
                    block.append(f"note: {v.rule} {v.explanation}")
            comparisons.append("\n".join(block))
        previous = tier

    # The tiers as given (a Predicted tier stays Predicted in status), with the figures filled on measured ones.
    filled = tuple(t if t.phase == TIER_PREDICTED else f for t, f in zip(tiers, filled))
    measured_before_block = previous  # the last measured tier the scan reached
    if decided is None:
        if blocked is not None and not budget_stopped:
            msg = f"continue: no stop rule fired yet; {tier_label(blocked)} is {blocked.phase}" + (
                f" (last measured: {tier_label(measured_before_block)})" if measured_before_block else ""
            )
            return DecisionOutcome(None, filled, comparisons, tuple(verdicts), STATE_CONTINUE, msg, tuple(steps))
        if measured_before_block is None:
            notes = "; ".join(
                f"{tier_label(t)} {'does not fit' if tier_does_not_fit(t) else t.phase.lower()}" + (f" ({t.reason})" if t.reason else "")
                for t in filled
            )
            msg = "undecidable: no tier was measured" + (f": {notes}" if notes else "")
            return DecisionOutcome(None, filled, comparisons, tuple(verdicts), STATE_UNDECIDABLE, msg, tuple(steps))
        decided = measured_before_block
        measured_count = sum(1 for t in filled if t.phase == TIER_MEASURED)
        if budget_stopped:
            rule = BUDGET
        elif measured_count == 1:
            rule = ONLY_TIER
        else:
            rule = LAST_TIER
        fired = ()
        reason_lines = [last_line, format_stay(tier_label(decided), rule)]

    searched = concurrency_search.searched_plan(spec, decided, search) if search is not None else None
    plan = searched or plan_capacity(decided, spec.capacity, spec.load.concurrency, spec.peak_concurrency)
    if plan.source != SOURCE_MEASURED:
        reason_lines.append(plan.explanation)
    curve = concurrency_search.curve(spec, search, decided)
    at_plan = next((pt for pt in curve or () if pt.concurrency == plan.per_replica_concurrency), None) if searched else None
    tokens = at_plan.output_tokens_per_second if at_plan is not None else decided.output_tokens_per_second
    alternatives = concurrency_search.ranked_alternatives(spec, filled, decided, plan, tokens)
    unevaluated = _unique_in_rule_order([v.rule for v in considered if v.fired is None])
    simulated = any(t.simulated for t in filled if t.phase == TIER_MEASURED)
    decision = Decision(
        tensor_parallel=decided.tensor_parallel,
        pipeline_parallel=decided.pipeline_parallel,
        gpus_per_replica=decided.gpus,
        replicas=plan.replicas,
        rule=rule,
        rules_fired=fired or None,
        reason="\n".join(reason_lines),
        classification=classify(filled, decided, plan),
        per_replica_concurrency=plan.per_replica_concurrency,
        per_replica_concurrency_source=plan.source,
        concurrency_curve=curve,
        alternatives=alternatives or None,
        slo_met=plan.slo_met,
        cost_per_million_tokens=_rounded(plan.cost_per_million_tokens),
        total_gpus=plan.total_gpus,
        unevaluated_rules=unevaluated or None,
        simulated=True if simulated else None,
        multi_node=decided.multi_node,
        nodes=decided.nodes if decided.multi_node else None,
        basis=decision_basis(tiers, considered_steps, memory_tier),
    )
    msg = f"decided: {tier_label(decided)} x {plan.replicas} replica(s) (rule {rule}, {decision.classification})"
    return DecisionOutcome(decision, filled, comparisons, tuple(verdicts), STATE_DECIDED, msg, tuple(steps), plan)
