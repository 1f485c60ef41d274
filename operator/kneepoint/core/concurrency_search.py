"""The concurrency search on the decided tier: the largest per-replica concurrency at the SLO (pure).

The ladder compares tiers at one fixed concurrency (``load.concurrency``, also their
``--max-num-seqs``), so its figures are comparable. The replica count needs something else:
how many requests one replica of the decided tier serves within the SLO. After the ladder
has decided, this phase starts the decided tier's engine again with a larger
``--max-num-seqs`` (the KV-pool bound: vLLM's ``kv_cache_size_tokens`` / (inputLen +
outputLen), at most 1024 or ``capacity.concurrencySearch.maxConcurrency``) and load-tests
it with the same workload at other concurrencies:

* with an SLO: exponential steps from the load-test concurrency (doubling while it is met,
  halving while it is missed), then bisection between the largest concurrency that met
  every objective and the smallest that missed one, until they differ by at most
  ``tolerance`` x the former (and at least 1);
* without an SLO: doubling until throughput gains less than ``kneeGain`` per doubling
  (the knee; bracketed within one doubling).

The ladder's own load test of the tier is the first point. Every point lives in
``status.concurrencySearch`` (an operator restart resumes with the point in progress, its
Job named by an attempt number, and repeats none), the search's GPU-minutes count in the
tier and the budget, and it stops early, saying so, when the next point would pass the
budget. :func:`next_concurrency` and :func:`search_result` decide from the points alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace

from kneepoint.core import placement, reasons
from kneepoint.core.actions import DeleteTier, EnsureEngine, EnsureLoadTest, SearchLoad
from kneepoint.core.ladder_state import Pass, estimate, tier_gpu, tier_of
from kneepoint.core.observations import START_CONFIG_ERROR, START_CRASH_LOOP, START_OUT_OF_MEMORY
from kneepoint.core.replicas_cost import (
    SOURCE_SEARCHED,
    CapacityPlan,
    check_slo,
    check_slo_figures,
    cost_per_million_tokens,
    per_replica_concurrency,
    replicas_needed,
    sized_plan,
)
from kneepoint.core.spec import ExperimentSpec
from kneepoint.core.status import (
    SEARCH_DEPLOYING,
    SEARCH_FINISHED,
    SEARCH_LOAD_TESTING,
    SEARCH_PENDING,
    TIER_MEASURED,
    ConcurrencyPoint,
    ConcurrencySearch,
    RankedAlternative,
    TierResult,
)
from kneepoint.core.stop_rules import tier_label
from kneepoint.core.tiers import Tier
from kneepoint.core.timestamps import parse_rfc3339

OBJECTIVE_SLO = "slo"
OBJECTIVE_KNEE = "knee"
POINT_LADDER = "ladder"
POINT_SEARCH = "search"

MAX_SEARCH_CONCURRENCY = 1024
"""The highest --max-num-seqs the search starts an engine with when the spec sets none: vLLM's default
--max-num-batched-tokens on H100/H200 is 8192, and vLLM refuses more sequences than batched tokens."""
SEARCH_ATTEMPT_BASE = 100
"""The search's load-test Jobs are attempts 101, 102, ... of the tier (...-load101), apart from the ladder's."""
MAX_POINTS = 16
"""A bound on load tests per search (doubling from 1 to 1024 and bisecting at 10 % takes at most 15)."""
REQUESTS_PER_SEQUENCE = 3
MIN_REQUESTS = 100
"""A point's requests: max(3 x concurrency, 100): every slot cycles three times, and P99 has 100 samples at least."""


# ---------------------------------------------------------------------------------- pure search


def search_requests(concurrency: int) -> int:
    return max(REQUESTS_PER_SEQUENCE * concurrency, MIN_REQUESTS)


def objective_of(spec: ExperimentSpec) -> str:
    slo = spec.capacity.slo
    return OBJECTIVE_SLO if (slo.ttft_p95_ms is not None or slo.latency_p99_ms is not None) else OBJECTIVE_KNEE


def bracket_width(lo: int, tolerance: float) -> int:
    """How far apart the largest met and the smallest missed concurrency may be when the search stops."""
    return max(1, math.floor(tolerance * lo + 1e-9))


def _by_concurrency(points: Sequence[ConcurrencyPoint]) -> dict[int, ConcurrencyPoint]:
    out: dict[int, ConcurrencyPoint] = {}
    for point in points:
        out[point.concurrency] = point  # a point measured again (never, by construction) keeps its latest figures
    return out


def slo_bracket(points: Sequence[ConcurrencyPoint]) -> tuple[int | None, int | None]:
    """(largest concurrency that met every objective below the smallest that missed one, that smallest).

    A point whose figure could not be checked counts as missed: the search never claims what it did not see.
    """
    by_c = _by_concurrency(points)
    missed = [c for c, p in by_c.items() if p.slo_met is not True]
    hi = min(missed) if missed else None
    met = [c for c, p in by_c.items() if p.slo_met is True and (hi is None or c < hi)]
    return (max(met) if met else None), hi


def knee(points: Sequence[ConcurrencyPoint], knee_gain: float) -> int | None:
    """The first concurrency whose next measured (doubled) point gains less than ``knee_gain`` of throughput."""
    ordered = sorted(_by_concurrency(points).values(), key=lambda p: p.concurrency)
    for a, b in zip(ordered, ordered[1:]):
        ta, tb = a.output_tokens_per_second or 0.0, b.output_tokens_per_second or 0.0
        if ta <= 0 or tb < (1.0 + knee_gain) * ta:
            return a.concurrency
    return None


def next_concurrency(
    points: Sequence[ConcurrencyPoint], start: int, upper: int, tolerance: float, objective: str, knee_gain: float
) -> int | None:
    """The next concurrency to load-test, or None when the search is done (the result is :func:`search_result`'s)."""
    if len(points) >= MAX_POINTS:
        return None
    if not points:
        return max(1, min(start, upper))
    if objective == OBJECTIVE_KNEE:
        if knee(points, knee_gain) is not None:
            return None
        top = max(p.concurrency for p in points)
        return None if top >= upper else min(2 * top, upper)
    lo, hi = slo_bracket(points)
    if lo is None:
        assert hi is not None
        return None if hi <= 1 else max(1, hi // 2)
    if hi is None:
        return None if lo >= upper else min(2 * lo, upper)
    if hi - lo <= bracket_width(lo, tolerance):
        return None
    return (lo + hi) // 2


def search_result(
    points: Sequence[ConcurrencyPoint], upper: int, tolerance: float, objective: str, knee_gain: float
) -> tuple[int | None, str]:
    """(the concurrency found, how): the largest that met every objective (None: none did), or the knee."""
    tried = ", ".join(
        f"{p.concurrency}{'' if p.slo_met is None else (' met' if p.slo_met else ' missed')}"
        for p in sorted(points, key=lambda p: p.concurrency)
    )
    if objective == OBJECTIVE_KNEE:
        found = knee(points, knee_gain)
        if found is not None:
            return found, (f"throughput knee at concurrency {found}: doubling it gained less than {knee_gain:.0%} (points: {tried})")
        top = max((p.concurrency for p in points), default=None)
        return top, f"no knee up to concurrency {top} (bound {upper}): throughput still grew (points: {tried})"
    lo, hi = slo_bracket(points)
    if lo is None:
        return None, f"no concurrency met the SLO (points: {tried})"
    if hi is None:
        if lo < upper:
            return lo, f"concurrency {lo} met the SLO; no higher concurrency was measured (bound {upper}; points: {tried})"
        return lo, f"concurrency {lo} met the SLO and is the search's bound {upper} (points: {tried})"
    return lo, (
        f"largest concurrency that met the SLO {lo}, smallest that missed {hi} "
        f"(bracket {hi - lo} <= max(1, {tolerance:g} x {lo}) = {bracket_width(lo, tolerance)}; points: {tried})"
    )


def point_from_summary(spec: ExperimentSpec, concurrency: int, summary: dict[str, float], source: str = POINT_SEARCH) -> ConcurrencyPoint:
    def fig(key: str) -> float | None:
        value = summary.get(key)
        return None if value is None else round(float(value), 3)

    ttft, p99 = fig("ttftP95Ms"), fig("latencyP99Ms")
    check = check_slo_figures(ttft, p99, spec.capacity.slo)
    return ConcurrencyPoint(
        concurrency=concurrency,
        output_tokens_per_second=fig("outputTokensPerSecond"),
        ttft_p95_ms=ttft,
        latency_p99_ms=p99,
        slo_met=check.met if check.objectives else None,
        source=source,
    )


def rejudged(spec: ExperimentSpec, points: Sequence[ConcurrencyPoint]) -> tuple[ConcurrencyPoint, ...]:
    """The points judged against the current SLO (a capacity change re-decides without measuring again)."""
    out = []
    for p in points:
        check = check_slo_figures(p.ttft_p95_ms, p.latency_p99_ms, spec.capacity.slo)
        out.append(replace(p, slo_met=check.met if check.objectives else None))
    return tuple(out)


# ---------------------------------------------------------------------------------- capacity from the search


def searched_plan(spec: ExperimentSpec, tier: TierResult, search: ConcurrencySearch) -> CapacityPlan | None:
    """The decided tier's capacity from a finished search; None when it found nothing to size with
    (stopped before any point met the SLO: the linear estimate stands, and says so)."""
    if search.phase != SEARCH_FINISHED or search.tier != tier.name or not any(p.source == POINT_SEARCH for p in search.points):
        # Nothing measured beyond the ladder's own point (stopped at once, e.g. by the budget): the ladder's figure stands.
        return None
    settings = spec.capacity.concurrency_search
    objective = objective_of(spec)
    points = rejudged(spec, search.points)
    found, how = search_result(points, search.max_num_seqs, settings.tolerance, objective, settings.knee_gain)
    stopped = f"; stopped early: {search.stopped}" if search.stopped else ""
    peak = spec.peak_concurrency
    if found is None:
        if search.stopped:
            return None
        # Down to concurrency 1 and missed: one replica cannot keep up at any concurrency.
        at_one = _by_concurrency(points).get(1)
        return sized_plan(
            tier.gpus,
            spec.capacity,
            peak,
            1,
            SOURCE_SEARCHED,
            f"per-replica concurrency searched: {how}; one replica of {tier_label(tier)} cannot meet the SLO at any "
            "concurrency, so the replicas below serve one request each and still miss it",
            slo_met=_met_at_load_concurrency(spec, tier),
            slo_missed=True,
            output_tokens_per_second=at_one.output_tokens_per_second if at_one else None,
        )
    at = _by_concurrency(points)[found]
    return sized_plan(
        tier.gpus,
        spec.capacity,
        peak,
        found,
        SOURCE_SEARCHED,
        f"per-replica concurrency {found} searched on {tier_label(tier)}: {how}{stopped}",
        slo_met=_met_at_load_concurrency(spec, tier),
        slo_missed=False,
        output_tokens_per_second=at.output_tokens_per_second,
    )


def _met_at_load_concurrency(spec: ExperimentSpec, tier: TierResult) -> bool | None:
    """decision.sloMet keeps its meaning: the SLO at the load-test concurrency (the ladder's point)."""
    check = check_slo(tier, spec.capacity.slo)
    return check.met if check.objectives else None


def curve(spec: ExperimentSpec, search: ConcurrencySearch | None, tier: TierResult) -> tuple[ConcurrencyPoint, ...] | None:
    if search is None or search.tier != tier.name or not search.points:
        return None
    return tuple(sorted(rejudged(spec, search.points), key=lambda p: p.concurrency))


def ranked_alternatives(
    spec: ExperimentSpec, tiers: Sequence[TierResult], decided: TierResult, plan: CapacityPlan, decided_tokens_per_second: float | None
) -> tuple[RankedAlternative, ...]:
    """Every measured tier sized for the peak at its own per-replica concurrency at the SLO, fewest GPUs first.

    The decided tier uses the decision's plan (searched when the search ran); every other tier
    the load-test figure (met: the load-test concurrency, a lower bound; missed: the linear
    estimate), marked so.
    """
    rows = []
    for t in tiers:
        if t.phase != TIER_MEASURED:
            continue
        if t.name == decided.name:
            c, source, tokens, replicas = plan.per_replica_concurrency, plan.source, decided_tokens_per_second, plan.replicas
        else:
            c, source, _ = per_replica_concurrency(spec.load.concurrency, check_slo(t, spec.capacity.slo))
            # Missed: throughput scales down with the concurrency (the same linear estimate).
            tokens = t.output_tokens_per_second
            if tokens is not None and c != spec.load.concurrency:
                tokens = tokens * c / spec.load.concurrency
            replicas = replicas_needed(spec.peak_concurrency, c, spec.capacity.redundancy_factor)
        cost = cost_per_million_tokens(spec.capacity.gpu_hourly_cost, t.gpus, tokens)
        rows.append((t, c, source, tokens, replicas, cost))
    # Fewest GPUs for the peak first (the fleet paid for at peak), then cost per million tokens, then the smaller tier.
    rows.sort(key=lambda r: (r[4] * r[0].gpus, r[5] if r[5] is not None else math.inf, r[0].gpus))
    return tuple(
        RankedAlternative(
            rank=i + 1,
            tier=tier_label(t),
            gpus_per_replica=t.gpus,
            per_replica_concurrency=c,
            per_replica_concurrency_source=source,
            replicas=replicas,
            total_gpus=replicas * t.gpus,
            output_tokens_per_second=round(tokens, 1) if tokens is not None else None,
            cost_per_million_tokens=round(cost, 4) if cost is not None else None,
            decided=True if t.name == decided.name else None,
        )
        for i, (t, c, source, tokens, replicas, cost) in enumerate(rows)
    )


# ---------------------------------------------------------------------------------- the phase


def is_searching(status_search: ConcurrencySearch | None) -> bool:
    return status_search is not None and status_search.phase != SEARCH_FINISHED


def wants_search(spec: ExperimentSpec, decided: TierResult | None) -> bool:
    """Search when the spec asks and the decided tier is one pod (a multi-node group is not searched; docs say so)."""
    return spec.capacity.concurrency_search.enabled and decided is not None and not decided.multi_node


def _kv_bound(p: Pass, decided: TierResult) -> int | None:
    per_seq = p.spec.load.input_len + p.spec.load.output_len
    if decided.kv_cache_pool_tokens:
        return max(1, decided.kv_cache_pool_tokens // per_seq)
    gpu = tier_gpu(p.obs, decided)
    if p.obs.architecture is not None and gpu is not None:
        return max(1, estimate(p.spec, p.obs, tier_of(decided), gpu).max_concurrent_sequences)
    return None


def start_search(p: Pass, decided: TierResult, budget_stopped: bool) -> None:
    """Open the search with the ladder's own point; Finished at once when that point leaves nothing to search."""
    settings = p.spec.capacity.concurrency_search
    kv = _kv_bound(p, decided)
    upper = min(settings.max_concurrency or MAX_SEARCH_CONCURRENCY, kv or MAX_SEARCH_CONCURRENCY)
    upper = max(upper, 1)
    ladder_point = point_from_summary(
        p.spec,
        p.spec.load.concurrency,
        {
            k: v
            for k, v in {
                "outputTokensPerSecond": decided.output_tokens_per_second,
                "ttftP95Ms": decided.ttft_p95_ms,
                "latencyP99Ms": decided.latency_p99_ms,
            }.items()
            if v is not None
        },
        source=POINT_LADDER,
    )
    search = ConcurrencySearch(
        tier=decided.name or tier_of(decided).name,
        phase=SEARCH_PENDING,
        objective=objective_of(p.spec),
        max_num_seqs=upper,
        kv_cache_bound=kv,
        points=(ladder_point,) if p.spec.load.concurrency <= upper else (),
        ladder_budget_stopped=True if budget_stopped else None,
    )
    p.status = replace(p.status, concurrency_search=search)
    p.progressed = True
    nxt = _next(p, search)
    label = tier_label(decided)
    if nxt is None:
        _finish_search(p, search, None)
        return
    budget = p.spec.budget.max_gpu_hours
    if budget is not None and (p.status.gpu_minutes_total or 0.0) >= budget * 60:
        _finish_search(p, search, f"the budget of {budget * 60:.1f} GPU-min was spent by the ladder")
        return
    p.condition(reasons.PROFILING, "True", reasons.SEARCHING_CONCURRENCY, f"Searching the per-replica concurrency of {label}.")
    p.event(
        reasons.SEARCHING_CONCURRENCY,
        f"Searching {label}'s per-replica concurrency at the {'SLO' if search.objective == OBJECTIVE_SLO else 'throughput knee'}: "
        f"engine --max-num-seqs {upper} (KV pool bound {kv if kv is not None else 'unknown'}), first point {nxt}",
    )
    p.message(f"{label}: concurrency search, starting the engine with --max-num-seqs {upper}")
    p.requeue(0.0)


def _next(p: Pass, search: ConcurrencySearch) -> int | None:
    s = p.spec.capacity.concurrency_search
    return next_concurrency(
        rejudged(p.spec, search.points), p.spec.load.concurrency, search.max_num_seqs, s.tolerance, search.objective, s.knee_gain
    )


def _search_gpu_minutes(p: Pass, search: ConcurrencySearch, gpus: int) -> float:
    started = parse_rfc3339(search.started_at)
    return 0.0 if started is None else max(0.0, p.obs.now - started) / 60.0 * gpus


def _finish_search(p: Pass, search: ConcurrencySearch, stopped: str | None) -> None:
    """Close the search: its GPU-minutes into the tier and the total, its engine and Jobs deleted."""
    result = p.status.tier(search.tier)
    tier = tier_of(result) if result is not None else None
    gpus = tier.gpus if tier is not None else 1
    minutes = round(_search_gpu_minutes(p, search, gpus), 3)
    s = p.spec.capacity.concurrency_search
    found, how = search_result(rejudged(p.spec, search.points), search.max_num_seqs, s.tolerance, search.objective, s.knee_gain)
    done = replace(
        search,
        phase=SEARCH_FINISHED,
        concurrency=None,
        point_started_at=None,
        gpu_minutes=minutes if search.started_at else None,
        result=found,
        stopped=stopped,
        explanation=how + (f"; stopped early: {stopped}" if stopped else ""),
    )
    p.status = replace(p.status, concurrency_search=done)
    if search.started_at and result is not None and tier is not None:
        p.put_tier(replace(result, gpu_minutes=round((result.gpu_minutes or 0.0) + minutes, 3)))
        p.status = replace(p.status, gpu_minutes_total=round((p.status.gpu_minutes_total or 0.0) + minutes, 3))
        p.actions.append(DeleteTier(tier))
    label = tier.label if tier is not None else search.tier
    if stopped:
        p.event(reasons.SEARCH_STOPPED, f"Concurrency search on {label} stopped early: {stopped}; {how}"[:1000], warning=True)
    else:
        p.event(reasons.SEARCH_FINISHED, f"Concurrency search on {label} finished ({minutes:.2f} GPU-min): {how}"[:1000])
    p.progressed = True


def _begin_point(p: Pass, search: ConcurrencySearch, tier: Tier, concurrency: int) -> None:
    attempt = (search.attempt or SEARCH_ATTEMPT_BASE) + 1
    p.actions.append(EnsureLoadTest(tier, attempt, SearchLoad(concurrency, search_requests(concurrency))))
    p.status = replace(
        p.status,
        concurrency_search=replace(
            search, phase=SEARCH_LOAD_TESTING, concurrency=concurrency, attempt=attempt, attempts_at_point=1, point_started_at=p.now
        ),
    )
    p.progressed = True
    p.message(f"{tier.label}: concurrency search, load test at concurrency {concurrency}")
    p.requeue(p.settings.poll_seconds)


def search_step(p: Pass, finish: Callable[[Pass, bool], None]) -> None:
    """One transition of the search (the ladder is over: no tier is current); ``finish`` decides once it is done."""
    search = p.status.concurrency_search
    assert search is not None
    result = p.status.tier(search.tier)
    if result is None:  # the tier vanished from status (never by the ladder): nothing to search
        _finish_search(p, search, f"tier {search.tier} is not in status")
        finish(p, bool(search.ladder_budget_stopped))
        return
    tier = tier_of(result)
    stop: str | None = None
    if search.phase == SEARCH_PENDING:
        engine = p.obs.engine
        if engine is not None and engine.exists:
            # The ladder's engine of this tier (its --max-num-seqs is load.concurrency) is still being deleted.
            p.message(f"{tier.label}: concurrency search, waiting for the ladder's engine to go")
            p.requeue(p.settings.poll_seconds)
            return
        domain = None
        if p.spec.mode != "Simulate":
            fleet = p.obs.fleet
            domain = placement.free_now(fleet, tier.gpus, p.obs.require_nvlink) if fleet is not None else None
            if domain is None or p.obs.queue_position not in (None, 1):
                p.message(f"{tier.label}: concurrency search, waiting for {tier.gpus} free GPU(s)")
                p.requeue(p.settings.waiting_poll_seconds)
                return
        p.actions.append(
            EnsureEngine(
                tier,
                node_name=domain.node_name if domain else None,
                interconnect=domain.interconnect if domain else None,
                max_num_seqs=search.max_num_seqs,
            )
        )
        p.status = replace(p.status, concurrency_search=replace(search, phase=SEARCH_DEPLOYING, started_at=p.now))
        p.progressed = True
        p.message(f"{tier.label}: concurrency search, deploying the engine with --max-num-seqs {search.max_num_seqs}")
        p.requeue(p.settings.poll_seconds)
        return

    if search.phase == SEARCH_DEPLOYING:
        engine = p.obs.engine
        started = parse_rfc3339(search.started_at)
        elapsed = 0.0 if started is None else max(0.0, p.obs.now - started)
        if engine is not None and engine.exists and engine.ready:
            nxt = _next(p, search)
            if nxt is None:
                stop = None
            else:
                _begin_point(p, search, tier, nxt)
                return
        elif (engine is not None and engine.start_failure in (START_OUT_OF_MEMORY, START_CONFIG_ERROR)) or (
            engine is not None and engine.start_failure == START_CRASH_LOOP and engine.restarts >= p.settings.crash_loop_restarts
        ):
            stop = f"the engine with --max-num-seqs {search.max_num_seqs} did not start ({engine.start_failure}: {engine.failure_message or ''})"
        elif elapsed > p.spec.budget.tier_timeout_seconds:
            stop = f"the engine was not Ready within {p.spec.budget.tier_timeout_seconds} s"
        else:
            if engine is None or not engine.exists:
                p.actions.append(EnsureEngine(tier, node_name=result.node_name, max_num_seqs=search.max_num_seqs))
            p.requeue(p.settings.poll_seconds)
            return
        _finish_search(p, search, stop)
        finish(p, bool(search.ladder_budget_stopped))
        return

    # LoadTesting: the point in progress.
    concurrency = search.concurrency or p.spec.load.concurrency
    attempt = search.attempt or SEARCH_ATTEMPT_BASE + 1
    job = p.obs.load_test
    point_started = parse_rfc3339(search.point_started_at)
    elapsed = 0.0 if point_started is None else max(0.0, p.obs.now - point_started)
    failure: str | None = None
    if job is None or not job.exists:
        p.actions.append(EnsureLoadTest(tier, attempt, SearchLoad(concurrency, search_requests(concurrency))))
        if elapsed <= p.spec.budget.load_test_timeout_seconds:
            p.requeue(p.settings.poll_seconds)
            return
        failure = f"the load-test Job did not appear within {p.spec.budget.load_test_timeout_seconds} s"
    elif job.succeeded:
        summary = job.summary or {}
        if not summary or not summary.get("ok", True):
            failure = f"load generator: {summary.get('error', 'no summary')}"
        elif (summary.get("errorFraction") or 0.0) > p.spec.load.max_error_fraction:
            failure = f"error fraction {summary.get('errorFraction'):.3f} above load.maxErrorFraction {p.spec.load.max_error_fraction}"
        else:
            _record_point(p, search, tier, concurrency, summary, finish)
            return
    elif job.failed:
        failure = job.message or "the load-test Job failed"
    elif elapsed > p.spec.budget.load_test_timeout_seconds:
        failure = f"load test did not finish within {p.spec.budget.load_test_timeout_seconds} s"
    else:
        p.requeue(p.settings.poll_seconds)
        return
    tries = search.attempts_at_point or 1
    if tries < p.spec.load.max_attempts:
        retry = attempt + 1
        p.actions.append(EnsureLoadTest(tier, retry, SearchLoad(concurrency, search_requests(concurrency))))
        p.status = replace(p.status, concurrency_search=replace(search, attempt=retry, attempts_at_point=tries + 1, point_started_at=p.now))
        p.event(
            reasons.LOAD_TEST_RETRIED,
            f"Search load test of {tier.label} at concurrency {concurrency} failed ({failure}); retrying",
            warning=True,
        )
        p.progressed = True
        p.requeue(p.settings.poll_seconds)
        return
    _finish_search(p, search, f"the load test at concurrency {concurrency} failed after {tries} attempt(s): {failure}")
    finish(p, bool(search.ladder_budget_stopped))


def _record_point(
    p: Pass, search: ConcurrencySearch, tier: Tier, concurrency: int, summary: dict[str, float], finish: Callable[[Pass, bool], None]
) -> None:
    point = point_from_summary(p.spec, concurrency, summary)
    label = tier.label
    search = replace(search, points=(*search.points, point), concurrency=None)
    p.status = replace(p.status, concurrency_search=search)
    p.progressed = True
    verdict = "" if point.slo_met is None else (" (SLO met)" if point.slo_met else " (SLO missed)")
    p.event(
        reasons.SEARCH_POINT_MEASURED,
        f"{label} at concurrency {concurrency}: {point.output_tokens_per_second or 0:.0f} output tok/s, "
        f"TTFT P95 {point.ttft_p95_ms or 0:.0f} ms, P99 {point.latency_p99_ms or 0:.0f} ms{verdict}",
    )
    nxt = _next(p, search)
    if nxt is None:
        _finish_search(p, search, None)
        finish(p, bool(search.ladder_budget_stopped))
        return
    budget = p.spec.budget.max_gpu_hours
    if budget is not None:
        gpus = tier.gpus
        point_started = parse_rfc3339(search.point_started_at)
        last_minutes = 0.0 if point_started is None else max(0.0, p.obs.now - point_started) / 60.0 * gpus
        # A point of 3 x c requests lasts about 3 request latencies, and latency grows at most in proportion to c.
        predicted = last_minutes * max(1.0, nxt / concurrency)
        spent = (p.status.gpu_minutes_total or 0.0) + _search_gpu_minutes(p, search, gpus)
        if spent + predicted > budget * 60:
            _finish_search(
                p,
                search,
                f"budget: {spent:.1f} GPU-min spent + {predicted:.1f} predicted for concurrency {nxt} exceeds the cap of "
                f"{budget * 60:.1f} GPU-min",
            )
            finish(p, bool(search.ladder_budget_stopped))
            return
    _begin_point(p, search, tier, nxt)
