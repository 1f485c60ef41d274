"""Predict-first's values: what an adapter predicts for the ladder, and the decision's view of predicted tiers (pure).

The prediction is computed outside the core (the engine simulator, :mod:`kneepoint.simulator.ladder_prediction`)
and handed in as :attr:`Observations.prediction <kneepoint.core.observations.Observations>`. A tier left
``Predicted`` is never deployed; :func:`decision_view` lets :func:`kneepoint.core.decision.decide` compare it
by its predicted figures, so the rules stay one implementation. Which tiers are measured and when the
ladder falls back: :mod:`kneepoint.core.predict_first`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kneepoint.core.status import TIER_FAILED, TIER_MEASURED, TIER_PENDING, TIER_PREDICTED, DecisionBasis, TierResult
from kneepoint.core.stop_rules import StepEvaluation, tier_label
from kneepoint.core.tiers import Tier


def band_error(measured: float, predicted: float, relative: bool = True) -> float:
    """How far a measured figure is from its prediction: relative (``(measured - predicted) / predicted``) or absolute."""
    return (measured - predicted) / predicted if relative and predicted else measured - predicted


def within_band(error: float, band: float) -> bool:
    """A figure whose ``band_error`` is this is within its band (up to float noise)."""
    return abs(error) <= band + 1e-9


@dataclass(frozen=True)
class TierForecast:
    """One tier as the simulator ran it with the experiment's engine flags and workload."""

    tier: Tier
    output_tokens_per_second: float | None = None
    latency_p99_ms: float | None = None
    comm_fraction: float | None = None
    peak_kv_cache_usage: float | None = None
    load_test_seconds: float | None = None
    start_failure: str | None = None
    """Set when the simulated engine refused to start (vLLM's line); such a tier is measured, never predicted."""
    throughput_band: float = 0.0
    p99_band: float = 0.0
    scaling_band: float = 0.0
    """Error of this tier's figures over the 1-GPU tier's (0 at one GPU)."""
    comm_band: float = 0.0
    memory_band: float = 0.0


@dataclass(frozen=True)
class LadderPrediction:
    """Every tier of the ladder predicted, with where the error bands come from."""

    tiers: tuple[TierForecast, ...] = ()
    band_source: str = ""

    def forecast(self, tier: Tier) -> TierForecast | None:
        return next((f for f in self.tiers if f.tier == tier), None)


def as_measured(tier: TierResult) -> TierResult:
    """A tier carrying a prediction, as the rules should read it: Measured with the predicted figures (Failed when
    the prediction says its load test would not finish)."""
    pred = tier.prediction
    if pred is None:
        return tier
    if pred.start_failure:
        return replace(tier, phase=TIER_FAILED, reason=pred.start_failure, does_not_fit=True)
    if pred.failure:
        return replace(tier, phase=TIER_FAILED, reason=pred.failure)
    return replace(
        tier,
        phase=TIER_MEASURED,
        output_tokens_per_second=pred.output_tokens_per_second,
        latency_p99_ms=pred.latency_p99_ms,
        comm_fraction=pred.comm_fraction,
        peak_memory_gi_b=pred.peak_memory_gi_b,
    )


def decision_view(tiers: Sequence[TierResult], include_pending: bool = False) -> tuple[TierResult, ...]:
    """The tiers with every Predicted one (and, with ``include_pending``, every Pending one that has a prediction:
    the what-if of the plan) read as measured by its prediction."""
    phases = (TIER_PREDICTED, TIER_PENDING) if include_pending else (TIER_PREDICTED,)
    return tuple(as_measured(t) if (t.phase in phases and t.prediction is not None) else t for t in tiers)


def _step_text(step: StepEvaluation, predicted: set[str]) -> str:
    ends = [t for t in (step.previous, step.current) if t.name in predicted]
    if not ends:
        return step.label
    figures = []
    for t in ends:
        pred = t.prediction
        if pred is None:
            continue
        if pred.failure:
            figures.append(f"{tier_label(t)} predicted to fail: {pred.failure}")
            continue
        tput = f"{pred.output_tokens_per_second:.0f}" if pred.output_tokens_per_second is not None else "?"
        figures.append(f"{tier_label(t)} predicted {tput} tok/s ±{pred.throughput_band:.0%}")
    return f"{step.label} (predicted: {'; '.join(figures)})"


def decision_basis(tiers: Sequence[TierResult], steps: Sequence[StepEvaluation], memory_tier: TierResult | None) -> DecisionBasis | None:
    """Which comparisons the decision read were measured and which used a predicted tier (None without predictions)."""
    if not any(t.prediction is not None for t in tiers):
        return None
    predicted = {t.name or "" for t in tiers if t.phase == TIER_PREDICTED}
    measured_cmp: list[str] = []
    predicted_cmp: list[str] = []
    if memory_tier is not None:
        label = f"{tier_label(memory_tier)} memory"
        pred = memory_tier.prediction
        if memory_tier.name in predicted and pred is not None:
            needed = f"{pred.peak_memory_gi_b:.1f} GiB" if pred.peak_memory_gi_b is not None else "?"
            predicted_cmp.append(f"{label} (predicted: {needed} needed ±{pred.memory_band:.0%})")
        else:
            measured_cmp.append(label)
    for step in steps:
        text = _step_text(step, predicted)
        (predicted_cmp if text != step.label else measured_cmp).append(text)
    return DecisionBasis(
        measured=tuple(measured_cmp),
        predicted=tuple(predicted_cmp),
        measured_tiers=tuple(tier_label(t) for t in tiers if t.phase == TIER_MEASURED),
        predicted_tiers=tuple(tier_label(t) for t in tiers if t.phase == TIER_PREDICTED),
    )
