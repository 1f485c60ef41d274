"""Adaptive stop of one repeat: send no more once throughput and the P99 are known well enough.

Pure (stdlib only). ``--adaptive`` (and the Job's ``spec.load.adaptive``) turns a repeat of
``--num-requests`` into "at most ``--num-requests``": after every closed-loop cycle of
``concurrency`` completed requests, once ``min_requests`` have completed, the repeat stops
sending when both
- output **throughput** is known to +-``relative_precision`` at ``confidence``: batch means
  over completed requests in completion order (batches of whole cycles of ``concurrency``
  completions, at most ``MAX_BATCHES`` of them, at least ``MIN_BATCHES``), the ratio estimator
  sum(tokens) / sum(spans) with its standard error over the batches and a Student-t
  quantile with batches - 1 degrees of freedom;
- the **P99 of end-to-end latency** is known to +-``relative_precision`` at ``confidence``:
  the distribution-free order-statistic interval [X(l), X(u)] (the count of samples below the
  true P99 is Binomial(n, 0.99); each tail gets (1 - confidence) / 2); the larger distance from
  the reported P99 to either end, over the P99, must be at most the precision. At 95 % the
  interval exists only from 368 completed requests on (``min_samples_for_quantile``).
The requests already in flight finish and are measured (none is cancelled), so a stopped
repeat is an ordinary repeat of fewer requests: every figure keeps its definition (and its
agreement with ``vllm bench serve``). It never sends more than the fixed plan. docs/loadgen.md
(Adaptive stop) gives the method and its assumptions.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kneepoint.core.spec import ADAPTIVE_CONFIDENCE, ADAPTIVE_MIN_REQUESTS, ADAPTIVE_RELATIVE_PRECISION
from kneepoint.loadgen.records import RequestRecord
from kneepoint.loadgen.statistics import percentile_sorted

# The defaults are spec.load.adaptive's (core/spec.py says why).
DEFAULT_RELATIVE_PRECISION = ADAPTIVE_RELATIVE_PRECISION
DEFAULT_CONFIDENCE = ADAPTIVE_CONFIDENCE
DEFAULT_MIN_REQUESTS = ADAPTIVE_MIN_REQUESTS
MIN_BATCHES = 5
"""Fewer batch means give a Student-t quantile so wide (t(0.975, 3) = 3.18) that the interval says little."""
MAX_BATCHES = 20
"""Batches grow (in whole cycles) past this count (batch means' usual 10 to 30), so each stays long next to the
correlation between cycles."""
QUANTILE = 0.99

Completion = tuple[float, int, float]
"""One successful request: (end, output tokens, E2E latency in ms)."""


@dataclass(frozen=True)
class AdaptivePlan:
    """The adaptive-stop settings (flags --adaptive-precision, --adaptive-confidence, --adaptive-min-requests)."""

    relative_precision: float = DEFAULT_RELATIVE_PRECISION
    confidence: float = DEFAULT_CONFIDENCE
    min_requests: int = DEFAULT_MIN_REQUESTS

    def __post_init__(self) -> None:
        if not 0.0 < self.relative_precision < 1.0:
            raise ValueError(f"--adaptive-precision must be within (0, 1), got {self.relative_precision}")
        if not 0.5 <= self.confidence < 1.0:
            raise ValueError(f"--adaptive-confidence must be within [0.5, 1), got {self.confidence}")
        if self.min_requests < 1:
            raise ValueError(f"--adaptive-min-requests must be an integer >= 1, got {self.min_requests}")

    def to_json(self) -> dict[str, Any]:
        return {"relativePrecision": self.relative_precision, "confidence": self.confidence, "minRequests": self.min_requests}


# --------------------------------------------------------------------------------------------
# Distributions (exact, stdlib only)


def t_two_sided_coverage(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer ``df`` >= 1 (Abramowitz & Stegun 26.7.3-4, exact)."""
    if df < 1:
        raise ValueError(f"degrees of freedom must be >= 1, got {df}")
    if t <= 0:
        return 0.0
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2 == 0:
        term, total = 1.0, 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        return min(1.0, s * total)
    if df == 1:
        return 2.0 * theta / math.pi
    term, total = 1.0, 1.0
    for k in range(1, (df - 1) // 2):
        term *= c2 * (2 * k) / (2 * k + 1)
        total += term
    return min(1.0, 2.0 / math.pi * (theta + s * math.cos(theta) * total))


def t_quantile_two_sided(confidence: float, df: int) -> float:
    """t with P(|T| <= t) = ``confidence`` (bisection on the exact coverage; 1e-9 relative)."""
    low, high = 0.0, 1.0
    while t_two_sided_coverage(high, df) < confidence:
        high *= 2.0
    for _ in range(200):
        middle = (low + high) / 2.0
        if t_two_sided_coverage(middle, df) < confidence:
            low = middle
        else:
            high = middle
        if high - low <= 1e-9 * high:
            break
    return high


def _log_pmf(n: int, k: int, p: float) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(p) + (n - k) * math.log1p(-p)


def quantile_ranks(n: int, q: float, confidence: float) -> tuple[int, int] | None:
    """1-based ranks (l, u) with P(X(l) <= true q-quantile <= X(u)) >= ``confidence``; None with too few samples.

    B, the count of samples below the true quantile, is Binomial(n, q) for any continuous
    distribution; X(l) <= quantile iff B >= l and X(u) >= quantile iff B <= u - 1. l is the
    largest rank with P(B <= l - 1) <= alpha, u the smallest with P(B >= u) <= alpha,
    alpha = (1 - confidence) / 2. Terms further than 12 sigma from nq (mass < 1e-30) are skipped.
    """
    if n < 1 or not 0.0 < q < 1.0:
        return None
    alpha = (1.0 - confidence) / 2.0
    sigma = math.sqrt(n * q * (1.0 - q))
    reach = 12.0 * sigma + 10.0
    head, lower = 0.0, None
    for k in range(max(0, math.floor(n * q - reach)), n + 1):
        mass = math.exp(_log_pmf(n, k, q))
        if head + mass > alpha:
            lower = k  # P(B <= k - 1) = head <= alpha
            break
        head += mass
    tail, upper = 0.0, None
    for k in range(min(n, math.ceil(n * q + reach)), -1, -1):
        mass = math.exp(_log_pmf(n, k, q))
        if tail + mass > alpha:
            upper = k + 1  # P(B >= k + 1) = tail <= alpha
            break
        tail += mass
    if lower is None or upper is None or lower < 1 or upper > n:
        return None
    return lower, upper


def min_samples_for_quantile(q: float, confidence: float) -> int:
    """The fewest samples for which ``quantile_ranks`` gives an interval (368 for P99 at 95 %)."""
    # The upper rank is the binding one for q > 0.5: it exists once P(B = n) = q**n <= alpha.
    n = max(1, math.ceil(math.log((1.0 - confidence) / 2.0) / math.log(q)) - 2)
    while quantile_ranks(n, q, confidence) is None:
        n += 1
    return n


# --------------------------------------------------------------------------------------------
# The intervals


@dataclass(frozen=True)
class Interval:
    """An estimate and its interval at the plan's confidence; ``relative`` = the larger distance to an end / estimate."""

    estimate: float
    low: float
    high: float

    @property
    def relative(self) -> float:
        if self.estimate <= 0:
            return math.inf
        return max(self.estimate - self.low, self.high - self.estimate) / self.estimate

    def to_json(self, digits: int) -> list[float]:
        return [round(self.low, digits), round(self.high, digits)]


def throughput_interval(completions: Sequence[Completion], concurrency: int, confidence: float) -> Interval | None:
    """The closed loop's steady output tokens/s from ``(end, output tokens, ...)`` of completed requests in end order.

    The first cycle of ``concurrency`` completions is the ramp (every slot started at once,
    all prefills together) and is left out, as batch means leave out an initial transient:
    batches start at its last end. Batch b holds ``size`` consecutive completions (a whole
    number of cycles: in a closed loop each slot is refreshed about once per cycle) and spans
    from the previous batch's last end to its own; completions after the last whole batch
    (mid-repeat: the next batch under way; at the end: the drain) are left out too. The
    estimate is the ratio sum(tokens) / sum(spans); its standard error the ratio estimator's,
    sqrt(sum((y_b - R x_b)^2) / (k (k - 1))) / mean(x), with a Student-t quantile of k - 1
    degrees of freedom. None before ``MIN_BATCHES`` batches.
    """
    cycle = max(1, concurrency)
    if len(completions) < cycle * (MIN_BATCHES + 1):
        return None
    previous = completions[cycle - 1][0]
    rest = completions[cycle:]
    size = cycle * max(1, (len(rest) // cycle) // MAX_BATCHES)
    count = len(rest) // size
    tokens, spans = [], []
    for b in range(count):
        batch = rest[b * size : (b + 1) * size]
        end = batch[-1][0]
        tokens.append(float(sum(c[1] for c in batch)))
        spans.append(max(0.0, end - previous))
        previous = end
    elapsed = math.fsum(spans)
    if elapsed <= 0:
        return None
    ratio = math.fsum(tokens) / elapsed
    mean_span = elapsed / count
    residuals = math.fsum((y - ratio * x) ** 2 for y, x in zip(tokens, spans))
    error = math.sqrt(residuals / (count * (count - 1))) / mean_span
    half = t_quantile_two_sided(confidence, count - 1) * error
    return Interval(ratio, ratio - half, ratio + half)


def quantile_interval(ordered: Sequence[float], confidence: float, q: float = QUANTILE) -> Interval | None:
    """The q-quantile of ascending samples (numpy's linear method, as reported) and its order-statistic interval."""
    ranks = quantile_ranks(len(ordered), q, confidence)
    if ranks is None:
        return None
    return Interval(percentile_sorted(ordered, q * 100.0), ordered[ranks[0] - 1], ordered[ranks[1] - 1])


# --------------------------------------------------------------------------------------------
# The rule, fed one completed request at a time


@dataclass(frozen=True)
class Assessment:
    """Where a repeat stands against the plan: precise enough or not, why, and the intervals."""

    precise: bool
    completed: int
    reason: str
    throughput: Interval | None
    latency_p99_ms: Interval | None
    ramp_shift: float | None = None
    """(P99 - the whole plan's projected P99) / P99: what stopping here does to the reported P99 (``planned_p99``)."""


class AdaptiveStop:
    """The stop rule of one repeat. ``add`` each finished request; True once the repeat should send no more.

    Checked after every ``concurrency`` successful completions from ``plan.min_requests`` on;
    once True it stays True (the decision and its intervals are kept in ``decision``).
    """

    def __init__(self, plan: AdaptivePlan, concurrency: int, planned: int) -> None:
        self.plan = plan
        self.concurrency = max(1, concurrency)
        self.planned = planned
        self.completions: list[Completion] = []
        self.latencies_ms: list[float] = []
        self.decision: Assessment | None = None
        self.last: Assessment | None = None
        """The latest check's verdict (why it has not stopped yet)."""

    @property
    def stopped(self) -> bool:
        return self.decision is not None

    def add(self, record: RequestRecord) -> bool:
        """Take one finished request (failed ones count as sent, not as samples); whether to stop sending."""
        if self.decision is not None:
            return True
        if not record.ok or record.end is None or record.latency is None:
            return False
        bisect.insort(self.completions, (record.end, record.output_tokens or 0, record.latency * 1000.0))
        bisect.insort(self.latencies_ms, record.latency * 1000.0)
        done = len(self.completions)
        if done < self.plan.min_requests or done % self.concurrency:
            return False
        verdict = self.last = assess_samples(self.completions, self.latencies_ms, self.concurrency, self.plan, self.planned)
        if verdict.precise:
            self.decision = verdict
        return verdict.precise


def assess_samples(
    completions: Sequence[Completion],
    ordered_latencies_ms: Sequence[float],
    concurrency: int,
    plan: AdaptivePlan,
    planned: int | None = None,
) -> Assessment:
    """Both intervals over these samples and whether both are within the plan's precision.

    The P99 must also not depend on where the repeat stops: the first cycle's requests (the
    ramp: all prefills queued together) sit in the latency tail, and while they are more than
    about 1 % of the samples the P99 lies among them, so a shorter repeat reports a higher P99
    than a longer one. ``planned_p99`` projects the P99 the whole plan would report (the ramp's
    samples once, the others weighted up to the plan's count); stopping may not move the P99
    from it by more than the precision.
    """
    n = len(completions)
    cycle = max(1, concurrency)
    throughput = throughput_interval(completions, concurrency, plan.confidence)
    p99 = quantile_interval(ordered_latencies_ms, plan.confidence)
    target = plan.relative_precision
    missing = []
    ramp_shift = None
    if p99 is None:
        need = min_samples_for_quantile(QUANTILE, plan.confidence)
        missing.append(f"the P99 interval needs {need} completed requests at {plan.confidence:.0%} confidence")
    else:
        if p99.relative > target:
            missing.append(f"P99 +-{p99.relative:.1%} > {target:.1%}")
        if planned is not None and planned > n > cycle and p99.estimate > 0:
            ramp_shift = (p99.estimate - planned_p99(completions, cycle, planned)) / p99.estimate
            if abs(ramp_shift) > target:
                missing.append(f"stopping now moves the P99 by {ramp_shift:+.1%} from the whole plan's (the ramp's share)")
    if throughput is None:
        missing.append(f"the throughput interval needs {MIN_BATCHES + 1} cycles of {concurrency} completions")
    elif throughput.relative > target:
        missing.append(f"throughput +-{throughput.relative:.1%} > {target:.1%}")
    if n < plan.min_requests:
        missing.append(f"{n} < --adaptive-min-requests {plan.min_requests}")
    if missing:
        return Assessment(False, n, "; ".join(missing), throughput, p99, ramp_shift)
    assert throughput is not None and p99 is not None
    reason = (
        f"throughput +-{throughput.relative:.1%} and P99 +-{p99.relative:.1%} <= {target:.1%} at {plan.confidence:.0%} "
        f"confidence; {ramp_shift or 0.0:+.1%} from the whole plan's P99"
    )
    return Assessment(True, n, reason, throughput, p99, ramp_shift)


def planned_p99(completions: Sequence[Completion], cycle: int, planned: int) -> float:
    """The P99 a repeat of ``planned`` requests would report, projected from these completions (in end order).

    The first ``cycle`` completions (the ramp) occur once in any repeat; the others stand for
    the ``planned - cycle`` steady requests of the whole plan, each weighted (planned - cycle) /
    (n - cycle). The weighted empirical quantile: the smallest latency whose cumulative weight
    reaches 99 % of the total.
    """
    n = len(completions)
    weight = (planned - cycle) / (n - cycle)
    samples = sorted([(c[2], 1.0) for c in completions[:cycle]] + [(c[2], weight) for c in completions[cycle:]])
    target = QUANTILE * float(planned)
    total = 0.0
    for latency, w in samples:
        total += w
        if total >= target:
            return latency
    return samples[-1][0]


def assess_records(records: Iterable[RequestRecord], concurrency: int, plan: AdaptivePlan, planned: int | None = None) -> Assessment:
    """The intervals over a repeat's records (successful ones), as the summary reports them."""
    records = list(records)
    done = [r for r in records if r.ok and r.end is not None and r.latency is not None]
    completions = sorted((r.end or 0.0, r.output_tokens or 0, (r.latency or 0.0) * 1000.0) for r in done)
    latencies = sorted((r.latency or 0.0) * 1000.0 for r in done)
    return assess_samples(completions, latencies, concurrency, plan, planned)


def replay_requests_sent(records: Sequence[RequestRecord], concurrency: int, planned: int, plan: AdaptivePlan) -> tuple[int, float | None]:
    """Requests the adaptive rule would have sent in this fixed-plan repeat, and when it would have stopped.

    Feeds ``records`` to ``AdaptiveStop`` in end order; at the completion that stops it, every
    request already started is in flight and is measured: they are the requests sent. In a
    closed loop the requests up to that moment are the same with or without the rule, so the
    count is exact. Returns (``planned`` or the records' count, None) when it never stops.
    """
    rule = AdaptiveStop(plan, concurrency, planned)
    by_end = sorted(records, key=lambda r: (r.end if r.end is not None else math.inf, r.index))
    for record in by_end:
        if rule.add(record):
            stop_at = record.end if record.end is not None else math.inf
            return sum(1 for r in records if r.start <= stop_at), stop_at
    return min(planned, len(records)), None


def adaptive_json(
    plan: AdaptivePlan, planned: int, sent: int, stopped: Assessment | None, final: Assessment, last: Assessment | None = None
) -> dict[str, Any]:
    """The summary's ``adaptive`` object: the setting, whether and why the repeat stopped early, requests sent, intervals.

    The intervals are the ones that stopped the repeat (over the completions up to the stop;
    the requests still in flight then finish afterwards and count in the repeat's figures),
    else the ones over the whole repeat, its drain included. Without a stop, ``reason`` is the
    last check's (``last``: why it went on), else the whole repeat's.
    """
    shown = stopped or final
    return {
        "stoppedEarly": stopped is not None,
        "reason": shown.reason if stopped is not None or last is None else f"ran the whole plan; at the last check: {last.reason}",
        "requestsPlanned": planned,
        "requestsSent": sent,
        "completedAtStop": None if stopped is None else stopped.completed,
        "relativePrecision": plan.relative_precision,
        "confidence": plan.confidence,
        "minRequests": plan.min_requests,
        "outputTokensPerSecondInterval": None if shown.throughput is None else shown.throughput.to_json(3),
        "latencyP99MsInterval": None if shown.latency_p99_ms is None else shown.latency_p99_ms.to_json(3),
        "latencyP99FromPlan": None if shown.ramp_shift is None else round(shown.ramp_shift, 4),
    }
