"""The stop rules: one function per rule, each returning a :class:`RuleVerdict` with its numbers.

A rule never guesses. When a figure it needs is missing (real vLLM exports no
communication share; a CSV row may lack P99) its verdict is ``fired=None`` ("not
evaluated") and the decision lists it in ``unevaluatedRules``. Comparisons are strict, so
a value exactly at its threshold does not fire; "exactly" allows ``TIE_TOLERANCE`` so that
binary floating point (100 -> 120 tok/s gives ΔT = 0.19999999999999996) cannot turn a tie
into a stop. docs/decision.md states every rule with its boundary cases.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kneepoint.core.rule_names import (
    BUDGET as BUDGET,  # re-exported: the rules' readers name them from here
)
from kneepoint.core.rule_names import (
    COMM_FRACTION,
    MEMORY_HEADROOM,
    P99_DEGRADATION,
    THROUGHPUT_GAIN,
)
from kneepoint.core.rule_names import (
    LAST_TIER as LAST_TIER,  # re-exported: the rules' readers name them from here
)
from kneepoint.core.rule_names import (
    ONLY_TIER as ONLY_TIER,  # re-exported: the rules' readers name them from here
)
from kneepoint.core.spec import StopRulesSpec
from kneepoint.core.status import TierResult
from kneepoint.core.tiers import Tier

# Step rules in evaluation order; the first that fires names the decision.
STEP_RULES = (THROUGHPUT_GAIN, P99_DEGRADATION, COMM_FRACTION)

# The column of the comparison line each rule reads (named in the conclusion line).
RULE_COLUMNS = {MEMORY_HEADROOM: "M", THROUGHPUT_GAIN: "ΔT", P99_DEGRADATION: "ΔP", COMM_FRACTION: "C"}

TIE_TOLERANCE = 1e-9
"""Two fractions closer than this are equal (a tie continues the ladder)."""


@dataclass(frozen=True)
class RuleVerdict:
    """One rule applied once: fired True/False, or None when a needed figure is missing."""

    rule: str
    fired: bool | None
    numbers: Mapping[str, float | None]
    explanation: str
    step: str = ""
    """What the rule looked at: ``TP1`` (memory headroom) or ``TP2 -> TP4`` (a step)."""


@dataclass(frozen=True)
class StepEvaluation:
    """The three step rules applied to one step between consecutive measured tiers."""

    previous: TierResult
    current: TierResult
    throughput_gain: float | None
    p99_change: float | None
    verdicts: tuple[RuleVerdict, ...] = field(default=())

    @property
    def label(self) -> str:
        return f"{tier_label(self.previous)} -> {tier_label(self.current)}"

    @property
    def fired(self) -> tuple[str, ...]:
        """Rules that fired, in evaluation order."""
        return tuple(v.rule for v in self.verdicts if v.fired)

    @property
    def unevaluated(self) -> tuple[str, ...]:
        return tuple(v.rule for v in self.verdicts if v.fired is None)


def tier_label(tier: TierResult) -> str:
    """``TP2`` / ``TP8xPP2`` for a tier result (the label of :class:`Tier`)."""
    return Tier(tier.tensor_parallel, tier.pipeline_parallel).label


def relative_change(new: float | None, old: float | None) -> float | None:
    """(new - old) / old, or None when either is missing or old is not positive."""
    if new is None or old is None or old <= 0:
        return None
    return (new - old) / old


def is_below(value: float, threshold: float) -> bool:
    """value < threshold, with values within TIE_TOLERANCE counted as equal (not below)."""
    return value < threshold - TIE_TOLERANCE


def is_above(value: float, threshold: float) -> bool:
    """value > threshold, with values within TIE_TOLERANCE counted as equal (not above)."""
    return value > threshold + TIE_TOLERANCE


def format_fraction(value: float, near: float | None = None, signed: bool = True) -> str:
    """A fraction with two decimals, or more when two would print it equal to ``near`` although it is not."""
    sign = "+" if signed else ""
    text = f"{value:{sign}.2f}"
    if near is None or abs(value - near) <= TIE_TOLERANCE:
        return text
    for digits in (2, 3, 4, 6):
        text = f"{value:{sign}.{digits}f}"
        if f"{value:.{digits}f}" != f"{near:.{digits}f}":
            return text
    return text


def check_memory_headroom(tier: TierResult, threshold: float, gpu_memory_gib: float | None = None) -> RuleVerdict:
    """memory-headroom: on the measured 1-GPU tier, needed peak / GPU memory <= memoryHeadroom.

    ``gpu_memory_gib`` is used when the tier itself does not carry ``gpuMemoryGiB``.
    Only the *needed* figure counts: vLLM pre-allocates its KV pool, so the allocated
    figure is near gpuMemoryUtilization on every tier and says nothing about need.
    """
    label = tier_label(tier)
    capacity = tier.gpu_memory_gi_b if tier.gpu_memory_gi_b is not None else gpu_memory_gib
    needed = tier.peak_memory_gi_b
    numbers: dict[str, float | None] = {"neededGiB": needed, "gpuMemoryGiB": capacity, "memoryHeadroom": threshold}
    if tier.gpus != 1:
        return RuleVerdict(
            MEMORY_HEADROOM, None, numbers, f"not evaluated: {label} has {tier.gpus} GPUs; the rule reads the 1-GPU tier", label
        )
    if needed is None or capacity is None or capacity <= 0:
        missing = "peakMemoryGiB (needed memory)" if needed is None else "gpuMemoryGiB"
        return RuleVerdict(MEMORY_HEADROOM, None, numbers, f"not evaluated: {label} has no {missing}", label)
    share = needed / capacity
    numbers["share"] = share
    fired = not is_above(share, threshold)
    relation = "<=" if fired else ">"
    text = (
        f"M1={needed:.1f} GiB of {capacity:.1f} GiB = {format_fraction(share, threshold, signed=False)} "
        f"{relation} memoryHeadroom {threshold:.2f}"
    )
    text += ": one GPU holds the load with headroom" if fired else ": one GPU is too full to stop here"
    return RuleVerdict(MEMORY_HEADROOM, fired, numbers, text, label)


def check_throughput_gain(previous: TierResult, current: TierResult, threshold: float) -> RuleVerdict:
    """throughput-gain: fires when ΔT < minThroughputGain (ΔT equal to the threshold continues)."""
    step = f"{tier_label(previous)} -> {tier_label(current)}"
    delta = relative_change(current.output_tokens_per_second, previous.output_tokens_per_second)
    numbers = {
        "previousTokensPerSecond": previous.output_tokens_per_second,
        "currentTokensPerSecond": current.output_tokens_per_second,
        "throughputGain": delta,
        "minThroughputGain": threshold,
    }
    if delta is None:
        who = tier_label(previous) if not (previous.output_tokens_per_second or 0) > 0 else tier_label(current)
        return RuleVerdict(THROUGHPUT_GAIN, None, numbers, f"not evaluated: {who} has no positive outputTokensPerSecond", step)
    fired = is_below(delta, threshold)
    shown = format_fraction(delta, threshold)
    if fired:
        text = f"ΔT={shown} < minThroughputGain {threshold:.2f}: {tier_label(current)} does not add enough output tokens/s"
    else:
        text = f"ΔT={shown} >= minThroughputGain {threshold:.2f}"
    return RuleVerdict(THROUGHPUT_GAIN, fired, numbers, text, step)


def check_p99_degradation(previous: TierResult, current: TierResult, threshold: float) -> RuleVerdict:
    """p99-degradation: fires when ΔP > maxP99Degradation and ΔP > ΔT (P99 worsens more than throughput gains)."""
    step = f"{tier_label(previous)} -> {tier_label(current)}"
    delta_p = relative_change(current.latency_p99_ms, previous.latency_p99_ms)
    delta_t = relative_change(current.output_tokens_per_second, previous.output_tokens_per_second)
    numbers = {
        "previousLatencyP99Ms": previous.latency_p99_ms,
        "currentLatencyP99Ms": current.latency_p99_ms,
        "p99Change": delta_p,
        "throughputGain": delta_t,
        "maxP99Degradation": threshold,
    }
    if delta_p is None:
        who = tier_label(previous) if not (previous.latency_p99_ms or 0) > 0 else tier_label(current)
        return RuleVerdict(P99_DEGRADATION, None, numbers, f"not evaluated: {who} has no positive latencyP99Ms", step)
    if delta_t is None:
        return RuleVerdict(P99_DEGRADATION, None, numbers, "not evaluated: ΔT is unknown (outputTokensPerSecond missing)", step)
    over_limit = is_above(delta_p, threshold)
    over_gain = is_above(delta_p, delta_t)
    fired = over_limit and over_gain
    shown = format_fraction(delta_p, threshold)
    if fired:
        text = (
            f"ΔP={shown} > maxP99Degradation {threshold:.2f} and > ΔT={format_fraction(delta_t, delta_p)}: "
            "P99 worsens more than throughput improves"
        )
    elif not over_limit:
        text = f"ΔP={shown} <= maxP99Degradation {threshold:.2f}"
    else:
        text = f"ΔP={shown} > maxP99Degradation {threshold:.2f} but <= ΔT={format_fraction(delta_t, delta_p)}"
    return RuleVerdict(P99_DEGRADATION, fired, numbers, text, step)


def check_comm_fraction(previous: TierResult, current: TierResult, threshold: float) -> RuleVerdict:
    """comm-fraction: fires when the larger tier's share of step time in collectives exceeds maxCommFraction."""
    step = f"{tier_label(previous)} -> {tier_label(current)}"
    share = current.comm_fraction
    numbers = {"previousCommFraction": previous.comm_fraction, "commFraction": share, "maxCommFraction": threshold}
    if share is None:
        return RuleVerdict(
            COMM_FRACTION,
            None,
            numbers,
            f"not evaluated: {tier_label(current)} has no commFraction (no profiled slice was read; never guessed)",
            step,
        )
    fired = is_above(share, threshold)
    shown = format_fraction(share, threshold, signed=False)
    relation = ">" if fired else "<="
    text = f"C{current.gpus}={shown} {relation} maxCommFraction {threshold:.2f}"
    if fired:
        text += f": {tier_label(current)} spends too much of each step in collectives"
    return RuleVerdict(COMM_FRACTION, fired, numbers, text, step)


def evaluate_step(previous: TierResult, current: TierResult, rules: StopRulesSpec) -> StepEvaluation:
    """Apply the step rules, in order, to ``previous -> current``; every verdict is kept."""
    verdicts = (
        check_throughput_gain(previous, current, rules.min_throughput_gain),
        check_p99_degradation(previous, current, rules.max_p99_degradation),
        check_comm_fraction(previous, current, rules.max_comm_fraction),
    )
    return StepEvaluation(
        previous=previous,
        current=current,
        throughput_gain=relative_change(current.output_tokens_per_second, previous.output_tokens_per_second),
        p99_change=relative_change(current.latency_p99_ms, previous.latency_p99_ms),
        verdicts=verdicts,
    )
