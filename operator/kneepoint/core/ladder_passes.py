"""Tier transitions: one function per tier phase (Pending/Waiting, Deploying, LoadTesting, Collecting).

Each moves the current tier by at most one phase from what the pass observed; what each
phase reads is said by :func:`kneepoint.core.needs.needs` (kept beside these, table-tested).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kneepoint.core import placement, reasons
from kneepoint.core.actions import EnsureEngine, EnsureLoadTest
from kneepoint.core.gpus import GIB, find_gpu_type
from kneepoint.core.ladder_finish import close_tier, decide_or_continue, fail_tier, finish, skip_remaining
from kneepoint.core.ladder_state import Pass, estimate, group_size, tier_gpu, tier_of
from kneepoint.core.memory_estimate import MemoryEstimate, needed_memory_bytes
from kneepoint.core.metric_names import WINDOW_METRICS
from kneepoint.core.observations import (
    START_CONFIG_ERROR,
    START_CRASH_LOOP,
    START_IMAGE_PULL,
    START_OUT_OF_MEMORY,
    START_UNSCHEDULABLE,
)
from kneepoint.core.predict_first import confirm_load
from kneepoint.core.rank_balance import rank_balance
from kneepoint.core.status import (
    PEAK_MEMORY_FROM_ESTIMATE,
    PEAK_MEMORY_FROM_VLLM,
    TIER_COLLECTING,
    TIER_DEPLOYING,
    TIER_LOAD_TESTING,
    TIER_MEASURED,
    TIER_WAITING,
    TierResult,
    get_condition,
)
from kneepoint.core.tiers import Tier
from kneepoint.core.timestamps import parse_rfc3339

# Summary keys (CONTRACTS A) copied into TierResult as they are.
SUMMARY_FIELDS = {
    "outputTokensPerSecond": "output_tokens_per_second",
    "totalTokensPerSecond": "total_tokens_per_second",
    "requestsPerSecond": "requests_per_second",
    "ttftP50Ms": "ttft_p50_ms",
    "ttftP95Ms": "ttft_p95_ms",
    "ttftP99Ms": "ttft_p99_ms",
    "tpotMeanMs": "tpot_mean_ms",
    "latencyP50Ms": "latency_p50_ms",
    "latencyP95Ms": "latency_p95_ms",
    "latencyP99Ms": "latency_p99_ms",
    "errorFraction": "error_fraction",
    "completed": "completed_requests",
    "repeats": "repeats_measured",
    "clientLimited": "client_limited",
}


def _elapsed_since(p: Pass, stamp: str | None) -> float:
    t = parse_rfc3339(stamp)
    return 0.0 if t is None else max(0.0, p.obs.now - t)


def _predicted_gpu_minutes(p: Pass, tier: Tier) -> float | None:
    """GPU-minutes the next tier will likely cost: the last measured tier's wall time at this tier's GPU count."""
    measured = [t for t in p.status.tiers if t.phase == TIER_MEASURED and t.gpu_minutes]
    if not measured:
        return None
    last = measured[-1]
    wall_minutes = (last.gpu_minutes or 0.0) / max(1, last.gpus)
    return wall_minutes * tier.gpus


def tier_pending(p: Pass, current: TierResult) -> None:
    tier = tier_of(current)
    budget = p.spec.budget.max_gpu_hours
    if budget is not None:
        spent = p.status.gpu_minutes_total or 0.0
        predicted = _predicted_gpu_minutes(p, tier)
        if spent >= budget * 60 or (predicted is not None and spent + predicted > budget * 60):
            why = (
                f"budget: {spent:.1f} GPU-min spent"
                + (f" + {predicted:.1f} predicted for {tier.label}" if predicted is not None else "")
                + f" exceeds the cap of {budget * 60:.1f} GPU-min"
            )
            p.event(reasons.BUDGET_EXHAUSTED, f"Stopping the ladder before {tier.label}: {why}", warning=True)
            skip_remaining(p, why)
            finish(p, budget_stopped=True)
            return

    simulate = p.spec.mode == "Simulate"
    fleet = p.obs.fleet
    domain = None
    pods = group_size(p.spec, current)
    group: tuple[Any, ...] = ()
    if pods > 1 and p.obs.leader_worker_set_api is False:
        fail_tier(
            p,
            current,
            reasons.TIER_START_FAILED,
            f"{tier.label} needs {pods} nodes and runs as a LeaderWorkerSet, but this cluster does not serve "
            "leaderworkerset.x-k8s.io/v1: install LWS (sigs.k8s.io/lws) or leave out pipelineParallel sizes that need "
            "more than one node",
        )
        return
    if not simulate:
        if fleet is None:
            p.requeue(p.settings.waiting_poll_seconds)
            return
        require_nvlink = p.obs.require_nvlink
        if pods > 1:
            topology_key = p.spec.placement.multi_node_topology_key
            group = placement.free_group(fleet, tier.tensor_parallel, pods, require_nvlink, topology_key) or ()
            domain = group[0] if group else None
        else:
            domain = placement.free_now(fleet, tier.gpus, require_nvlink)
        first_in_queue = p.obs.queue_position in (None, 1)
        if domain is None or not first_in_queue:
            free = max((d.gpus_free for d in fleet.domains), default=0)
            waiting = (
                f"{tier.gpus} free {'NVLink-connected ' if require_nvlink and tier.gpus > 1 else ''}GPU(s) of "
                f"{'/'.join(fleet.products()) or 'the requested product'} on one node (most free on one node now: {free})"
            )
            if pods > 1:
                key = p.spec.placement.multi_node_topology_key
                fit_now = sum(d.gpus_free // tier.tensor_parallel for d in fleet.domains)
                waiting = (
                    f"{pods} nodes with {tier.tensor_parallel} free {'NVLink-connected ' if require_nvlink else ''}GPU(s) "
                    f"of {'/'.join(fleet.products()) or 'the requested product'} each"
                    + (f" in one {key} domain" if key else "")
                    + f" (one replica across nodes; pods that would fit now: {fit_now})"
                )
            if domain is not None and not first_in_queue:
                waiting = f"its turn: position {p.obs.queue_position} among experiments waiting for GPUs"
            if current.phase != TIER_WAITING:
                p.put_tier(replace(current, phase=TIER_WAITING, reason=f"waiting for {waiting}"))
                p.event(reasons.WAITING_FOR_GPUS, f"{tier.label} waits for {waiting}")
            p.status = replace(
                p.status, waiting_for=waiting, queue_position=p.obs.queue_position, waiting_since=p.status.waiting_since or p.now
            )
            p.message(f"{tier.label}: waiting for {waiting}")
            p.requeue(p.settings.waiting_poll_seconds)
            return

    p.actions.append(
        EnsureEngine(
            tier,
            node_name=domain.node_name if domain else None,
            interconnect=domain.interconnect if domain else None,
            group_size=pods,
            node_names=tuple(d.node_name for d in group),
        )
    )
    p.put_tier(_placed(p, current, domain))
    p.status = replace(p.status, waiting_for=None, queue_position=None, waiting_since=None)
    where = f" on {domain.node_name}" if domain else ""
    if group:
        where = (
            f" as a LeaderWorkerSet of {pods} pods ({tier.tensor_parallel} GPUs each) on {', '.join(sorted({d.node_name for d in group}))}"
        )
    p.event(reasons.TIER_DEPLOYING, f"Deploying {tier.label} ({tier.gpus} GPU(s)){where}")
    p.message(f"{tier.label}: deploying the engine{where}")
    p.requeue(p.settings.poll_seconds)


def _placed(p: Pass, current: TierResult, domain: Any) -> TierResult:
    """The tier as deployed: its node and GPU product recorded, so every later pass knows its GPU type."""
    product = domain.gpu_product if domain is not None else None
    if not product:
        # Simulate mode (no node is picked): the product the simulator is told to model.
        product = p.spec.placement.gpu_product or (p.obs.gpu.product_labels[0] if p.obs.gpu is not None else None)
    gpu = find_gpu_type(product) if product else None
    return replace(
        current,
        phase=TIER_DEPLOYING,
        reason=None,
        started_at=p.now,
        node_name=domain.node_name if domain else None,
        gpu_product=product,
        gpu_memory_gi_b=round(gpu.memory_bytes / GIB, 2) if gpu is not None else current.gpu_memory_gi_b,
    )


def tier_deploying(p: Pass, current: TierResult) -> None:
    tier = tier_of(current)
    engine = p.obs.engine
    elapsed = _elapsed_since(p, current.started_at)
    pods = group_size(p.spec, current)
    if engine is None or not engine.exists:
        # Created by the previous pass but not visible yet, or deleted by someone: ensure again.
        p.actions.append(EnsureEngine(tier, node_name=current.node_name, group_size=pods))
        if elapsed > p.spec.budget.tier_timeout_seconds:
            kind = "LeaderWorkerSet" if pods > 1 else "Deployment"
            fail_tier(p, current, "TierStartFailed", f"the engine {kind} did not appear within {p.spec.budget.tier_timeout_seconds} s")
            return
        p.requeue(p.settings.poll_seconds)
        return
    if engine.ready:
        attempt = 1
        p.actions.append(EnsureLoadTest(tier, attempt, confirm=confirm_load(p, current)))
        p.put_tier(
            replace(
                current,
                phase=TIER_LOAD_TESTING,
                model_load_seconds=round(elapsed, 1),
                attempts=attempt,
                node_name=engine.node_name or current.node_name,
                node_names=engine.node_names or None if pods > 1 else current.node_names,
                load_test_started_at=p.now,
            )
        )
        p.event(reasons.TIER_READY, f"{tier.label} engine Ready after {elapsed:.0f} s (model load)")
        p.event(reasons.LOAD_TEST_STARTED, f"Load test of {tier.label} started (attempt {attempt})")
        p.message(f"{tier.label}: load test running")
        p.requeue(p.settings.poll_seconds)
        return

    kind, message = engine.start_failure or "", engine.failure_message or ""
    if kind == START_OUT_OF_MEMORY:
        fail_tier(p, current, reasons.TIER_OUT_OF_MEMORY, f"out of memory at start: {message}".strip(), does_not_fit=True)
        return
    if kind == START_CRASH_LOOP and engine.restarts >= p.settings.crash_loop_restarts:
        fail_tier(p, current, reasons.TIER_START_FAILED, f"CrashLoopBackOff after {engine.restarts} restarts: {message}".strip())
        return
    if kind == START_CONFIG_ERROR:
        fail_tier(p, current, reasons.TIER_START_FAILED, f"CreateContainerConfigError: {message}".strip())
        return
    if elapsed > p.spec.budget.tier_timeout_seconds:
        label = {
            START_UNSCHEDULABLE: reasons.TIER_UNSCHEDULABLE,
            START_IMAGE_PULL: reasons.TIER_START_FAILED,
            START_CRASH_LOOP: reasons.TIER_START_FAILED,
        }.get(kind or "", reasons.TIER_START_FAILED)
        detail = f"{kind}: {message}" if kind else "never became Ready"
        if engine.pods_total is not None:
            # A group partly scheduled (leader running, workers Pending) says how far it got.
            current = replace(current, pods_placed=engine.pods_placed, node_names=engine.node_names or None)
            if not kind:
                detail = f"never became Ready: {engine.pods_placed} of {engine.pods_total} pods placed"
        fail_tier(p, current, label, f"not Ready within {p.spec.budget.tier_timeout_seconds} s ({detail})".strip())
        return
    if kind:
        p.message(f"{tier.label}: not Ready yet ({kind}: {message})"[:300])
    p.requeue(p.settings.poll_seconds)


def _scrape_check(p: Pass, tier: Tier) -> None:
    """The first tier's load test: say now, not after the metrics deadline, that Prometheus sees no engine series."""
    cond = get_condition(p.status.conditions, reasons.METRICS_AVAILABLE)
    if p.obs.engine_not_scraped:
        message = (
            f"{tier.label}: {p.obs.engine_not_scraped}. Check that a PodMonitor or scrape job selects the engine pods "
            "(chart: monitoring.engines.podMonitor.enabled; plain Prometheus: deploy/prometheus/scrape-config.yaml), that "
            "its labels match what the Prometheus selects (kube-prometheus-stack: release=<its Helm release name>; "
            "chart: monitoring.labels.release), and that spec.metrics.prometheusUrl (or the operator's --prometheus-url) "
            "is that Prometheus. Without these series the rules that need metrics are not evaluated."
        )
        if cond is None or cond.reason != reasons.ENGINE_NOT_SCRAPED:
            p.condition(reasons.METRICS_AVAILABLE, "False", reasons.ENGINE_NOT_SCRAPED, message[:1000])
            p.event(reasons.ENGINE_NOT_SCRAPED, message[:1000], warning=True)
            p.message(f"{tier.label}: load-testing; Prometheus has no series of the engine's pods (see condition MetricsAvailable)")
    elif cond is not None and cond.reason == reasons.ENGINE_NOT_SCRAPED:
        p.condition(reasons.METRICS_AVAILABLE, "Unknown", reasons.ENGINE_SCRAPED, f"{tier.label}: Prometheus now has the engine's series.")


def tier_load_testing(p: Pass, current: TierResult) -> None:
    tier = tier_of(current)
    attempt = current.attempts or 1
    job = p.obs.load_test
    elapsed = _elapsed_since(p, current.load_test_started_at)
    engine = p.obs.engine
    _scrape_check(p, tier)
    if engine is not None and engine.start_failure == START_OUT_OF_MEMORY:
        fail_tier(
            p,
            current,
            reasons.TIER_OUT_OF_MEMORY,
            f"engine ran out of memory under load: {engine.failure_message or ''}".strip(),
            does_not_fit=True,
        )
        return

    failure: str | None = None
    if job is None or not job.exists:
        p.actions.append(EnsureLoadTest(tier, attempt, confirm=confirm_load(p, current)))
        if elapsed > p.spec.budget.load_test_timeout_seconds:
            failure = f"the load-test Job did not appear within {p.spec.budget.load_test_timeout_seconds} s"
        else:
            p.requeue(p.settings.poll_seconds)
            return
    elif job.succeeded:
        summary = job.summary or {}
        if not summary:
            failure = "the load-test pod left no summary in its termination message"
        elif not summary.get("ok", True):
            failure = f"load generator: {summary.get('error', 'failed')}"
        elif (summary.get("errorFraction") or 0.0) > p.spec.load.max_error_fraction:
            failure = (
                f"error fraction {summary.get('errorFraction'):.3f} above load.maxErrorFraction "
                f"{p.spec.load.max_error_fraction} (errors: {summary.get('errors', {})})"
            )
        else:
            _record_load_test(p, current, summary)
            return
    elif job.failed:
        failure = job.message or "the load-test Job failed"
    elif elapsed > p.spec.budget.load_test_timeout_seconds:
        failure = f"load test did not finish within {p.spec.budget.load_test_timeout_seconds} s"
    else:
        p.requeue(p.settings.poll_seconds)
        return

    if attempt < p.spec.load.max_attempts:
        p.actions.append(EnsureLoadTest(tier, attempt + 1, confirm=confirm_load(p, current)))
        p.put_tier(replace(current, attempts=attempt + 1, load_test_started_at=p.now, reason=f"attempt {attempt} failed: {failure}"))
        p.event(reasons.LOAD_TEST_RETRIED, f"Load test of {tier.label} attempt {attempt} failed ({failure}); retrying", warning=True)
        p.requeue(p.settings.poll_seconds)
        return
    fail_tier(p, current, reasons.LOAD_TEST_FAILED, f"load test failed after {attempt} attempt(s): {failure}")


def _record_load_test(p: Pass, current: TierResult, summary: dict[str, Any]) -> None:
    tier = tier_of(current)
    values: dict[str, Any] = {}
    for key, attr in SUMMARY_FIELDS.items():
        if summary.get(key) is not None:
            value = summary[key]
            values[attr] = round(value, 3) if isinstance(value, float) else value
    updated = replace(
        current,
        phase=TIER_COLLECTING,
        reason=None,
        load_test_started_at=summary.get("startedAt") or current.load_test_started_at,
        load_test_finished_at=summary.get("finishedAt") or p.now,
        load_test_seconds=summary.get("durationSeconds"),
        **values,
    )
    p.put_tier(updated)
    p.event(
        reasons.LOAD_TEST_FINISHED,
        f"Load test of {tier.label} finished: {updated.output_tokens_per_second or 0:.0f} output tok/s, "
        f"P99 {updated.latency_p99_ms or 0:.0f} ms, TTFT P95 {updated.ttft_p95_ms or 0:.0f} ms",
    )
    p.message(f"{tier.label}: reading metrics from Prometheus")
    p.requeue(p.settings.metrics_settle_seconds)


def tier_collecting(p: Pass, current: TierResult) -> None:
    tier = tier_of(current)
    since_end = _elapsed_since(p, current.load_test_finished_at)
    if since_end < p.settings.metrics_settle_seconds:
        p.requeue(p.settings.metrics_settle_seconds - since_end)
        return
    window = p.obs.metrics
    deadline_passed = since_end >= p.settings.metrics_deadline_seconds
    if window is None or window.error:
        why = (window.error if window else None) or "Prometheus was not queried"
        if not deadline_passed:
            p.condition(reasons.METRICS_AVAILABLE, "False", reasons.PROMETHEUS_UNREACHABLE, f"Prometheus query failed: {why}; retrying.")
            p.message(f"{tier.label}: Prometheus unavailable ({why}); retrying")
            p.requeue(min(30.0, max(p.settings.poll_seconds, since_end / 4)))
            return
    elif window.missing and not deadline_passed:
        p.condition(
            reasons.METRICS_AVAILABLE,
            "False",
            reasons.METRICS_MISSING,
            f"No series yet for {', '.join(window.missing)}; retrying until {p.settings.metrics_deadline_seconds:.0f} s after the load test.",
        )
        p.requeue(min(30.0, max(p.settings.poll_seconds, since_end / 4)))
        return

    missing = WINDOW_METRICS if (window is None or window.error) else window.missing
    gpu = tier_gpu(p.obs, current)
    est = estimate(p.spec, p.obs, tier, gpu) if (p.obs.architecture is not None and gpu is not None) else None
    ok_window = window if (window is not None and not window.error) else None
    balance = (
        rank_balance(ok_window.gpu_utilization_by_gpu, ok_window.fb_used_gib_by_gpu, ok_window.rank_skew_fraction) if ok_window else None
    )
    measured = replace(
        current,
        phase=TIER_MEASURED,
        **needed_memory_fields(est, ok_window),
        allocated_memory_gi_b=round(ok_window.peak_fb_used_gib, 2) if ok_window and ok_window.peak_fb_used_gib is not None else None,
        kv_cache_usage_peak=round(ok_window.peak_kv_cache_usage, 4) if ok_window and ok_window.peak_kv_cache_usage is not None else None,
        preemptions=ok_window.preemptions if ok_window else None,
        gpu_utilization=round(ok_window.gpu_utilization, 3) if ok_window and ok_window.gpu_utilization is not None else None,
        nvlink_bytes_per_second=ok_window.nvlink_bytes_per_second if ok_window else None,
        comm_fraction=round(ok_window.comm_fraction, 4) if ok_window and ok_window.comm_fraction is not None else None,
        rank_skew_fraction=round(ok_window.rank_skew_fraction, 4) if ok_window and ok_window.rank_skew_fraction is not None else None,
        pcie_bytes_per_second=ok_window.pcie_bytes_per_second if ok_window else None,
        gpu_utilization_spread=balance.utilization_spread if balance else None,
        memory_spread_gi_b=balance.memory_spread_gib if balance else None,
        findings=(balance.finding,) if balance and balance.finding else None,
        missing_metrics=missing or None,
    )
    if missing and ok_window is None:
        # Prometheus never answered: say so, not "no series" (the series may well exist).
        why = (window.error if window else None) or "Prometheus was not queried"
        p.condition(
            reasons.METRICS_AVAILABLE,
            "False",
            reasons.PROMETHEUS_UNREACHABLE,
            f"{tier.label}: Prometheus could not be queried until the deadline ({why}); no values for "
            f"{', '.join(missing)}; rules that need them are not evaluated."[:1000],
        )
        p.event(
            reasons.PROMETHEUS_UNREACHABLE,
            f"{tier.label}: Prometheus unreachable ({why}); no values for {', '.join(missing)}"[:1000],
            warning=True,
        )
    elif missing:
        p.condition(
            reasons.METRICS_AVAILABLE,
            "False",
            reasons.METRICS_MISSING,
            f"{tier.label}: no series for {', '.join(missing)}; rules that need them are not evaluated.",
        )
        p.event(reasons.METRICS_MISSING, f"{tier.label}: Prometheus returned no series for {', '.join(missing)}", warning=True)
    else:
        p.condition(reasons.METRICS_AVAILABLE, "True", reasons.METRICS_COLLECTED, f"{tier.label}: all metrics collected.")
    close_tier(p, measured, teardown=True)
    if balance is not None and balance.finding:
        p.event(reasons.SPLIT_NOT_EFFECTIVE, f"{tier.label}: {balance.finding}", warning=True)
    p.event(
        reasons.TIER_MEASURED,
        f"{tier.label} measured: {measured.output_tokens_per_second or 0:.0f} tok/s, P99 {measured.latency_p99_ms or 0:.0f} ms, "
        f"needed {measured.peak_memory_gi_b if measured.peak_memory_gi_b is not None else '?'} GiB/GPU, "
        f"comm {measured.comm_fraction if measured.comm_fraction is not None else 'n/a'}, "
        f"rank skew {measured.rank_skew_fraction if measured.rank_skew_fraction is not None else 'n/a'}",
    )
    decide_or_continue(p)


def needed_memory_fields(est: MemoryEstimate | None, window: Any) -> dict[str, Any]:
    """peakMemoryGiB (what the memory rule reads) and the KV pool it was computed with, for the measured tier.

    needed = weights + peak KV usage x pool + overhead. The pool is vLLM's own (its
    vllm:cache_config_info) where the engine exported it, else the estimator's; the estimator's
    pool is kept beside it either way.
    """
    if est is None:
        return {}
    out: dict[str, Any] = {"estimated_kv_cache_pool_gi_b": round(est.kv_pool_bytes_per_gpu / GIB, 2)}
    tokens = window.kv_cache_pool_tokens if window is not None else None
    if tokens:
        pool, source = est.pool_bytes_for_tokens(tokens), PEAK_MEMORY_FROM_VLLM
        out["kv_cache_pool_tokens"] = tokens
    else:
        pool, source = est.kv_pool_bytes_per_gpu, PEAK_MEMORY_FROM_ESTIMATE
    if window is not None and window.peak_kv_cache_usage is not None:
        usage = min(1.0, max(0.0, window.peak_kv_cache_usage))
        needed = needed_memory_bytes(est.weights_bytes_per_gpu, pool, usage, est.non_kv_overhead_bytes_per_gpu)
        out["peak_memory_gi_b"] = round(needed / GIB, 2)
        out["kv_cache_pool_gi_b"] = round(pool / GIB, 2)
        out["peak_memory_source"] = source
    return out
