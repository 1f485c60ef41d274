"""Predict first, then verify: measure only the tiers whose measurement could change the decision (pure).

At the plan (:func:`apply_prediction`) every runnable tier gets the simulator's figures and
their error bands (``Observations.prediction``), and the whole ladder is decided on them.
Measured are: the predicted winner, the tier that proves its stop (the winner's neighbour
in the deciding comparison), and both tiers of any comparison before it whose rule could
turn within the bands (interval arithmetic over each figure's band, :func:`ambiguous`), and
the 1-GPU tier when its memory share is within its band of ``memoryHeadroom``. The rest
become ``Predicted``: never deployed, compared by their predicted figures. A tier the
simulated engine cannot start is measured (it fails at start, cheaply; vLLM's own check
decides fit).

After every measurement (:func:`verify`, before the decision): a figure outside its band
puts every Predicted tier back to Pending (the full ladder from there, recorded in
``status.prediction.fallback``); otherwise the required set is computed again over the
measured-and-predicted view and any Predicted tier it now names is put back to Pending
(a tier only ever goes from Predicted to measured, so this ends).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kneepoint.core import reasons
from kneepoint.core.actions import ConfirmLoad
from kneepoint.core.decision import decide
from kneepoint.core.gpus import GIB
from kneepoint.core.ladder_state import Pass, estimate, tier_of
from kneepoint.core.memory_estimate import needed_memory_bytes
from kneepoint.core.prediction import LadderPrediction, band_error, decision_view, within_band
from kneepoint.core.rule_names import COMM_FRACTION, MEMORY_HEADROOM, P99_DEGRADATION, THROUGHPUT_GAIN
from kneepoint.core.spec import StopRulesSpec
from kneepoint.core.status import (
    TIER_MEASURED,
    TIER_PENDING,
    TIER_PREDICTED,
    TIER_SKIPPED,
    PredictionStatus,
    TierPrediction,
    TierResult,
)
from kneepoint.core.stop_rules import StepEvaluation, tier_label

STEP_RULES = (THROUGHPUT_GAIN, P99_DEGRADATION, COMM_FRACTION)


@dataclass(frozen=True)
class _Range:
    lo: float
    hi: float


def _band(tier: TierResult, attr: str, other: TierResult | None = None) -> float:
    """A measured figure is taken as it is (as the full ladder takes it); a predicted one may be off by its band.
    Throughput compared with another predicted tier: only the TP-scaling error counts (every tier's throughput is
    the simulator's 1-GPU figure times its modelled scaling, so the 1-GPU calibration error cancels in the ratio).
    P99 keeps its whole band: its 1-GPU error comes from how requests queue, which need not cancel."""
    if _was_measured(tier):
        return 0.0
    pred = tier.prediction
    if pred is None:
        return 0.0
    if attr == "throughput_band" and other is not None and not _was_measured(other) and other.prediction is not None:
        return pred.scaling_band
    return float(getattr(pred, attr))


def _was_measured(tier: TierResult) -> bool:
    # In the view a predicted tier reads as Measured too; its load test never ran.
    return tier.load_test_finished_at is not None


def _ratio_range(new: float, new_band: float, old: float, old_band: float) -> _Range:
    """(new - old) / old when each side may be off by its relative band."""
    return _Range(new * (1 - new_band) / (old * (1 + old_band)) - 1, new * (1 + new_band) / (old * max(1e-9, 1 - old_band)) - 1)


def ambiguous(step: StepEvaluation, rules: StopRulesSpec) -> list[str]:
    """The step rules whose verdict could differ somewhere within the figures' bands (empty: the comparison is sure)."""
    a, b = step.previous, step.current
    out: list[str] = []
    ta, tb = a.output_tokens_per_second, b.output_tokens_per_second
    if not (ta and tb and ta > 0):
        return out
    dt = _ratio_range(tb, _band(b, "throughput_band", a), ta, _band(a, "throughput_band", b))
    g = rules.min_throughput_gain
    if dt.lo < g <= dt.hi:
        out.append(THROUGHPUT_GAIN)
    pa, pb = a.latency_p99_ms, b.latency_p99_ms
    if pa and pb and pa > 0:
        dp = _ratio_range(pb, _band(b, "p99_band", a), pa, _band(a, "p99_band", b))
        m = rules.max_p99_degradation
        could_fire = dp.hi > m and dp.hi > dt.lo
        could_hold = dp.lo <= m or dp.lo <= dt.hi
        if could_fire and could_hold:
            out.append(P99_DEGRADATION)
    cb = b.comm_fraction
    if cb is not None:
        band = _band(b, "comm_band")
        if cb - band <= rules.max_comm_fraction < cb + band:
            out.append(COMM_FRACTION)
    return out


def _memory_ambiguous(tier: TierResult, rules: StopRulesSpec) -> bool:
    needed, capacity = tier.peak_memory_gi_b, tier.gpu_memory_gi_b
    if needed is None or not capacity:
        return False
    band = _band(tier, "memory_band")
    return needed * (1 - band) / capacity <= rules.memory_headroom < needed * (1 + band) / capacity


@dataclass(frozen=True)
class Required:
    """What the decision on the measured-and-predicted view needs measured."""

    need: dict[str, str]
    """Tier name -> why it is measured."""
    winner: str | None
    """The view's decided tier (None: the view decides nothing: measure everything)."""
    rule: str | None
    settle: frozenset[str]
    """Tiers measured to settle a comparison (or the memory share) within the bands: these run every repeat. The rest
    of ``need`` is measured only to confirm the prediction."""


def required(p: Pass, tiers: tuple[TierResult, ...]) -> Required:
    """Tiers whose measurement could change the decision on the measured-and-predicted view, and why."""
    view = decision_view(tiers, include_pending=True)
    outcome = decide(p.spec, view)
    decision = outcome.decision
    if decision is None:
        return Required({}, None, None, frozenset())
    rules = p.spec.stop_rules
    winner = next(t for t in view if t.tensor_parallel == decision.tensor_parallel and t.pipeline_parallel == decision.pipeline_parallel)
    need: dict[str, str] = {winner.name or "": f"the predicted winner ({decision.rule})"}
    settle: set[str] = set()
    for t in tiers:
        if t.phase == TIER_PENDING and t.prediction is not None and t.prediction.start_failure:
            need.setdefault(t.name or "", "the simulated engine does not start; vLLM's own start check decides fit")
    for step in outcome.steps:
        deciding = step.previous.name == winner.name and decision.rule in STEP_RULES
        if step.current.gpus > winner.gpus and not deciding:
            break
        near = ambiguous(step, rules)
        if near:
            # The measured figures decide this comparison: they must be as precise as the full plan makes them.
            settle.update((step.previous.name or "", step.current.name or ""))
        if deciding:
            need.setdefault(step.current.name or "", f"proves the stop at {tier_label(winner)} ({decision.rule})")
            break
        if near:
            why = f"{step.label} is within the prediction's band of {', '.join(near)}"
            need.setdefault(step.previous.name or "", why)
            need.setdefault(step.current.name or "", why)
    first = next((t for t in view if t.phase == TIER_MEASURED), None)
    if first is not None and first.gpus == 1 and decision.rule != MEMORY_HEADROOM and _memory_ambiguous(first, rules):
        need.setdefault(first.name or "", f"{tier_label(first)}'s memory share is within the band of memoryHeadroom")
        settle.add(first.name or "")
    return Required(need, tier_label(winner), decision.rule, frozenset(settle))


def _confirm_only(req: Required, name: str | None) -> bool | None:
    return True if (name or "") in req.need and (name or "") not in req.settle else None


def confirm_load(p: Pass, tier: TierResult) -> ConfirmLoad | None:
    """The figures a tier's load test may stop repeating on (plan.stopRepeatsWhenConfirmed), or None: every repeat."""
    pred = tier.prediction
    if (
        pred is None
        or not pred.confirm_only
        or not p.spec.plan.stop_repeats_when_confirmed
        or p.spec.load.repeats < 2
        or p.status.prediction is None
        or p.status.prediction.fallback is not None
        or not pred.output_tokens_per_second
    ):
        return None
    return ConfirmLoad(pred.output_tokens_per_second, pred.throughput_band, pred.latency_p99_ms, pred.p99_band)


def _tier_prediction(p: Pass, tier: TierResult, prediction: LadderPrediction) -> TierPrediction | None:
    forecast = prediction.forecast(tier_of(tier))
    if forecast is None:
        return None
    if forecast.start_failure:
        return TierPrediction(start_failure=forecast.start_failure[:300])
    peak = None
    if p.obs.architecture is not None and p.obs.gpu is not None and forecast.peak_kv_cache_usage is not None:
        est = estimate(p.spec, p.obs, tier_of(tier))
        usage = min(1.0, max(0.0, forecast.peak_kv_cache_usage))
        peak = round(
            needed_memory_bytes(est.weights_bytes_per_gpu, est.kv_pool_bytes_per_gpu, usage, est.non_kv_overhead_bytes_per_gpu) / GIB, 2
        )
    failure = None
    timeout = p.spec.budget.load_test_timeout_seconds
    if forecast.load_test_seconds is not None and forecast.load_test_seconds * (1 - forecast.throughput_band) > timeout:
        failure = (
            f"its load test would take {forecast.load_test_seconds:.0f} s (±{forecast.throughput_band:.0%}), over "
            f"budget.loadTestTimeoutSeconds {timeout}"
        )
    return TierPrediction(
        output_tokens_per_second=round(forecast.output_tokens_per_second, 3) if forecast.output_tokens_per_second is not None else None,
        latency_p99_ms=round(forecast.latency_p99_ms, 3) if forecast.latency_p99_ms is not None else None,
        comm_fraction=round(forecast.comm_fraction, 4) if forecast.comm_fraction is not None else None,
        peak_memory_gi_b=peak,
        load_test_seconds=round(forecast.load_test_seconds, 1) if forecast.load_test_seconds is not None else None,
        failure=failure,
        throughput_band=forecast.throughput_band,
        p99_band=forecast.p99_band,
        scaling_band=forecast.scaling_band,
        comm_band=forecast.comm_band,
        memory_band=forecast.memory_band,
    )


def apply_prediction(p: Pass) -> None:
    """At the plan: attach each runnable tier's prediction and leave Predicted those that cannot change the decision."""
    prediction = p.obs.prediction
    if prediction is None or not p.spec.plan.predict_first or p.spec.mode != "Measure":
        return
    tiers = tuple(replace(t, prediction=_tier_prediction(p, t, prediction)) if t.phase == TIER_PENDING else t for t in p.status.tiers)
    req = required(p, tiers)
    need, winner, rule = req.need, req.winner, req.rule
    if winner is None:
        p.status = replace(p.status, tiers=tiers)
        return
    out = []
    for t in tiers:
        if t.phase == TIER_PENDING and t.prediction is not None:
            t = replace(t, prediction=replace(t.prediction, confirm_only=_confirm_only(req, t.name)))
        if t.phase == TIER_PENDING and t.prediction is not None and t.name not in need:
            why = (
                f"predicted to fail: {t.prediction.failure}"
                if t.prediction.failure
                else f"its measurement cannot change the predicted decision {winner} ({rule})"
            )
            t = replace(t, phase=TIER_PREDICTED, reason=f"predicted, not measured: {why}")
        elif t.phase == TIER_PENDING and t.name in need:
            t = replace(t, reason=f"to measure: {need[t.name or '']}")
        out.append(t)
    status = PredictionStatus(
        predicted_tier=winner,
        predicted_rule=rule,
        measure=tuple(tier_label(t) for t in out if t.phase == TIER_PENDING),
        predicted=tuple(tier_label(t) for t in out if t.phase == TIER_PREDICTED),
        band_source=prediction.band_source,
    )
    p.status = replace(p.status, tiers=tuple(out), prediction=status)
    p.event(
        reasons.PREDICTION_MADE,
        f"Predicted on the simulator: {winner} ({rule}); measuring {', '.join(status.measure) or 'nothing'}"
        + (f"; predicted only: {', '.join(status.predicted)}" if status.predicted else ""),
    )


def outside_band(tier: TierResult) -> str | None:
    """Which measured figure of ``tier`` fell outside its predicted band (None: all within, or nothing to compare)."""
    pred = tier.prediction
    if pred is None or tier.phase != TIER_MEASURED:
        return None
    if pred.start_failure:
        return f"started and was measured, but the simulated engine did not start ({pred.start_failure})"
    checks = (
        ("outputTokensPerSecond", tier.output_tokens_per_second, pred.output_tokens_per_second, pred.throughput_band, True),
        ("latencyP99Ms", tier.latency_p99_ms, pred.latency_p99_ms, pred.p99_band, True),
        ("commFraction", tier.comm_fraction, pred.comm_fraction, pred.comm_band, False),
        ("peakMemoryGiB", tier.peak_memory_gi_b, pred.peak_memory_gi_b, pred.memory_band, True),
    )
    for name, measured, predicted, band, relative in checks:
        if measured is None or predicted is None:
            continue
        off = band_error(measured, predicted, relative)
        if not within_band(off, band):
            shown = f"{off:+.1%} (band ±{band:.0%})" if relative else f"{off:+.3f} (band ±{band:.2f})"
            return f"{name} {measured:g} against predicted {predicted:g}: {shown}"
    return None


def verify(p: Pass) -> None:
    """After a tier closed: fall back on a figure outside its band, else measure what the decision now needs."""
    if p.status.prediction is None:
        return
    tiers = p.status.tiers
    for t in tiers:
        why = outside_band(t)
        if why is None or p.status.prediction.fallback is not None:
            continue
        left = [o for o in tiers if o.phase == TIER_PREDICTED]
        text = f"{tier_label(t)} measured outside its predicted band ({why}): " + (
            "every predicted tier is measured" if left else "the ladder goes on as the full ladder (no tier was left predicted)"
        )
        for other in tiers:
            if other.phase == TIER_PREDICTED:
                p.put_tier(replace(other, phase=TIER_PENDING, reason="to measure: fallback to the full ladder"))
            elif other.phase == TIER_PENDING and other.prediction is not None and other.prediction.confirm_only:
                # The full ladder from here: every tier still to measure runs every repeat.
                p.put_tier(replace(other, prediction=replace(other.prediction, confirm_only=None)))
        assert t.prediction is not None
        p.put_tier(replace(p.status.tier(t.name or "") or t, prediction=replace(t.prediction, outside_band=why)))
        p.status = replace(p.status, prediction=replace(p.status.prediction, fallback=text))
        p.event(reasons.PREDICTION_MISSED, text, warning=True)
        _update_lists(p)
        return
    confirming = any(t.phase == TIER_PENDING and t.prediction is not None and t.prediction.confirm_only for t in tiers)
    if not confirming and not any(t.phase == TIER_PREDICTED for t in tiers):
        return
    req = required(p, tiers)
    need = req.need
    for t in tiers:
        if t.phase == TIER_PREDICTED and t.name in need:
            prediction = replace(t.prediction, confirm_only=_confirm_only(req, t.name)) if t.prediction is not None else None
            p.put_tier(replace(t, phase=TIER_PENDING, reason=f"to measure: {need[t.name or '']}", prediction=prediction))
            p.event(reasons.PREDICTION_MADE, f"{tier_label(t)} is measured after all: {need[t.name or '']}")
        elif t.phase == TIER_PENDING and t.prediction is not None and t.prediction.confirm_only and t.name in req.settle:
            # A measurement moved a comparison of this tier within the bands: it now runs every repeat.
            p.put_tier(replace(t, reason=f"to measure: {need[t.name or '']}", prediction=replace(t.prediction, confirm_only=None)))
    _update_lists(p)


def _update_lists(p: Pass) -> None:
    """status.prediction's lists as the tiers now stand (measure: every tier that is or will be measured)."""
    if p.status.prediction is None:
        return
    predicted = tuple(tier_label(t) for t in p.status.tiers if t.phase == TIER_PREDICTED)
    measure = tuple(
        tier_label(t) for t in p.status.tiers if t.phase != TIER_PREDICTED and t.prediction is not None and t.phase != TIER_SKIPPED
    )
    p.status = replace(p.status, prediction=replace(p.status.prediction, measure=measure, predicted=predicted))


def reopen_for_rule_change(p: Pass) -> bool:
    """Stop rules changed after a decision: when the new thresholds need a Predicted tier measured, put it back to
    Pending and reopen the ladder (a decision never rests on a comparison the new rules put within a band)."""
    if p.status.prediction is None or not any(t.phase == TIER_PREDICTED for t in p.status.tiers):
        return False
    req = required(p, p.status.tiers)
    need = req.need
    wanted = [t for t in p.status.tiers if t.phase == TIER_PREDICTED and t.name in need]
    if not wanted:
        return False
    for t in wanted:
        prediction = replace(t.prediction, confirm_only=_confirm_only(req, t.name)) if t.prediction is not None else None
        p.put_tier(
            replace(t, phase=TIER_PENDING, reason=f"to measure after a stop-rule change: {need[t.name or '']}", prediction=prediction)
        )
    p.status = replace(p.status, decision=None, decided_tier=None, finished_at=None)
    labels = ", ".join(tier_label(t) for t in wanted)
    p.condition(reasons.DECIDED, "False", reasons.SPEC_CHANGED, f"Stop rules changed: measuring {labels} before deciding again.")
    p.condition(reasons.PROFILING, "True", reasons.LADDER_RUNNING, f"Profiling {labels} after a stop-rule change.")
    p.event(reasons.PREDICTION_MADE, f"Stop rules changed: {labels} is measured after all ({need[wanted[0].name or '']})")
    _update_lists(p)
    p.progressed = True
    p.requeue(0.0)
    return True
