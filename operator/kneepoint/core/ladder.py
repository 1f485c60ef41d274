"""The ladder state machine: ``(spec, status, observations) -> (new status, actions, events)``.

One call moves the experiment by at most one transition of its current tier. It does no
I/O: the reconciler reads Kubernetes and Prometheus into :class:`Observations`, calls
:func:`reconcile_step`, applies the returned actions (all idempotent) and writes the
returned status. Because every fact the ladder needs lives in status, an operator killed
between any two steps resumes where it stopped: a tier that reached ``Measured`` is never
measured again, and children have deterministic names, so re-applying an action never
creates a duplicate.

Tier lifecycle::

    Pending -> (Waiting) -> Deploying -> LoadTesting -> Collecting -> Measured
        \\-> Skipped (estimate: does not fit; ladder stopped; budget)   \\-> Failed
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from kneepoint.core import reasons
from kneepoint.core.actions import (
    Action,
    DeleteAllChildren,
    DeleteTier,
    EnsureEngine,
    EnsureLoadTest,
    EventRecord,
    PublishRecommendation,
)
from kneepoint.core.apifields import to_json
from kneepoint.core.decision import decide
from kneepoint.core.gpus import find_gpu_type
from kneepoint.core.memory_estimate import MemoryEstimate, estimate_memory, needed_memory_bytes
from kneepoint.core.observations import (
    START_CONFIG_ERROR,
    START_CRASH_LOOP,
    START_IMAGE_PULL,
    START_OUT_OF_MEMORY,
    START_UNSCHEDULABLE,
    Observations,
)
from kneepoint.core.rank_balance import rank_balance
from kneepoint.core.spec import ExperimentSpec
from kneepoint.core.status import (
    PEAK_MEMORY_FROM_ESTIMATE,
    PEAK_MEMORY_FROM_VLLM,
    TIER_COLLECTING,
    TIER_DEPLOYING,
    TIER_FAILED,
    TIER_LOAD_TESTING,
    TIER_MEASURED,
    TIER_PENDING,
    TIER_SKIPPED,
    TIER_WAITING,
    ExperimentStatus,
    TierResult,
    get_condition,
    set_condition,
)
from kneepoint.core.tiers import Tier, build_ladder

GIB = 1024**3
TERMINAL_TIER_PHASES = (TIER_MEASURED, TIER_SKIPPED, TIER_FAILED)
ACTIVE_TIER_PHASES = (TIER_DEPLOYING, TIER_LOAD_TESTING, TIER_COLLECTING)

# Summary keys (CONTRACTS A) copied into TierResult as they are.
_SUMMARY_FIELDS = {
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
    "clientLimited": "client_limited",
}


@dataclass(frozen=True)
class LadderSettings:
    """Timing knobs of the ladder; operator settings fill them (see ``kneepoint.settings``)."""

    poll_seconds: float = 5.0
    """How soon to look again while a child is in progress (child events also wake the operator)."""
    waiting_poll_seconds: float = 10.0
    """How soon to look again while waiting for free GPUs."""
    metrics_settle_seconds: float = 10.0
    """Wait this long after a load test before querying, so the last scrape covers its end."""
    metrics_deadline_seconds: float = 180.0
    """Retry Prometheus (unreachable, or series missing) until this long after the load test; then go on without."""
    crash_loop_restarts: int = 3
    """An engine restarting this many times is recorded as failed without waiting for the tier timeout."""


@dataclass(frozen=True)
class Step:
    """What one reconcile pass decided."""

    status: ExperimentStatus
    actions: list[Action] = field(default_factory=list)
    events: list[EventRecord] = field(default_factory=list)
    requeue_after: float | None = None
    """Seconds until the next pass; None when nothing is in progress (terminal or idle)."""
    progressed: bool = False
    """True when the status moved; the reconciler then runs another pass at once."""


# --------------------------------------------------------------------------------------
# Small pure helpers


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


# How often a plan that failed for a missing PVC or Secret looks again (no watch on either).
MISSING_OBJECT_RECHECK_SECONDS = 30.0


def measurement_hash(spec: ExperimentSpec) -> str:
    """Hash of the spec parts that define a measurement (not the stop rules or capacity).

    A change here invalidates measured tiers; a change elsewhere only re-decides.
    """
    engine = to_json(spec.engine)
    for later in ("modelCache", "resources"):
        # Fields added after experiments existed: left unset, they keep those experiments' hash (an operator
        # upgrade must not restart their ladders).
        if not engine.get(later):
            engine.pop(later, None)
    parts = {
        "model": to_json(spec.model),
        "mode": spec.mode,
        "engine": engine,
        "tiers": to_json(spec.tiers),
        "load": to_json(spec.load),
        "placement": to_json(spec.placement),
        "simulation": to_json(spec.simulation),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def ladder_tiers(spec: ExperimentSpec) -> list[Tier]:
    return build_ladder(spec.tiers.tensor_parallel, spec.tiers.pipeline_parallel)


def tier_of(result: TierResult) -> Tier:
    return Tier(result.tensor_parallel, result.pipeline_parallel)


def is_multi_node(tier: Tier, max_node_gpus: int) -> bool:
    """Whether one replica of ``tier`` needs more GPUs than one node has, so PP must cross nodes.

    Such a tier runs as a LeaderWorkerSet group of PP pods, each holding TP GPUs (KServe's
    workerSpec reads the same way: tensorParallelSize per node, pipelineParallelSize nodes).
    """
    return tier.pipeline_parallel > 1 and tier.gpus > max_node_gpus


def group_size(spec: ExperimentSpec, result: TierResult) -> int:
    """Pods of one replica as deployed: PP for a multi-node tier in Measure mode, else 1.

    Simulate mode runs one simulator for the whole tier (it needs no GPUs, hence no group).
    """
    if result.multi_node and spec.mode != "Simulate":
        return result.nodes or result.pipeline_parallel
    return 1


def tier_gpu(obs: Observations, result: TierResult | None) -> Any:
    """The GPU type a tier runs on: the product recorded at its placement, else the experiment's (``obs.gpu``).

    The product is recorded in the tier's status when the capacity check places it, so a later
    pass that reads no fleet (load test, metrics) still knows it, whether the experiment names
    the product (placement.gpuProduct) or only selects nodes (placement.nodeSelector).
    """
    if result is not None and result.gpu_product:
        recorded = find_gpu_type(result.gpu_product)
        if recorded is not None:
            return recorded
    return obs.gpu


def _estimate(spec: ExperimentSpec, obs: Observations, tier: Tier, gpu: Any = None) -> MemoryEstimate:
    return estimate_memory(
        obs.architecture,
        gpu if gpu is not None else obs.gpu,
        tier,
        dtype=spec.model.dtype,
        kv_cache_dtype=spec.model.kv_cache_dtype,
        max_model_len=spec.model.max_model_len,
        concurrency=spec.load.concurrency,
        context_len=spec.load.input_len + spec.load.output_len,
        gpu_memory_utilization=spec.engine.gpu_memory_utilization,
        enforce_eager=spec.engine.enforce_eager,
    )


def derive_phase(conditions: Any) -> str:
    """The one-word phase for printer columns, derived from the conditions (never read back)."""

    def is_true(type_: str) -> bool:
        c = get_condition(conditions, type_)
        return c is not None and c.status == "True"

    if is_true(reasons.FAILED):
        return "Failed"
    if is_true(reasons.DECIDED):
        return "Decided"
    if is_true(reasons.PROFILING):
        return "Profiling"
    if is_true(reasons.ACCEPTED):
        return "Planning"
    return "Pending"


class _Pass:
    """Mutable scratchpad for one reconcile pass; produces a :class:`Step`."""

    def __init__(self, spec: ExperimentSpec, status: ExperimentStatus, obs: Observations, settings: LadderSettings):
        self.spec = spec
        self.status = status
        self.obs = obs
        self.settings = settings
        self.now = rfc3339(obs.now)
        self.actions: list[Action] = []
        self.events: list[EventRecord] = []
        self.requeue_after: float | None = None
        self.progressed = False

    # -- status editing
    def condition(self, type_: str, status: str, reason: str, message: str) -> None:
        self.status = replace(
            self.status,
            conditions=set_condition(self.status.conditions, type_, status, reason, message, self.now, self.obs.generation),
        )

    def put_tier(self, result: TierResult) -> None:
        self.status = self.status.with_tier(result)
        self.progressed = True

    def event(self, reason: str, message: str, warning: bool = False) -> None:
        self.events.append(EventRecord(reason, message, "Warning" if warning else "Normal"))

    def message(self, text: str) -> None:
        self.status = replace(self.status, message=text)

    def requeue(self, seconds: float) -> None:
        self.requeue_after = seconds if self.requeue_after is None else min(self.requeue_after, seconds)

    def step(self) -> Step:
        # Every pass judges the whole status against the current spec, so every condition
        # is current for this generation, not only the ones whose status flipped.
        gen = self.obs.generation
        conditions = tuple(c if c.observed_generation == gen else replace(c, observed_generation=gen) for c in self.status.conditions)
        self.status = replace(self.status, conditions=conditions, phase=derive_phase(conditions), observed_generation=gen)
        return Step(self.status, self.actions, self.events, self.requeue_after, self.progressed)


# --------------------------------------------------------------------------------------
# The entry point


def reconcile_step(
    spec: ExperimentSpec,
    status: ExperimentStatus,
    obs: Observations,
    settings: LadderSettings | None = None,
    spec_hash: str | None = None,
) -> Step:
    """Advance the experiment by one transition. Pure: same inputs, same outputs."""
    p = _Pass(spec, status, obs, settings or LadderSettings())
    spec_hash = spec_hash or measurement_hash(spec)

    accepted = get_condition(p.status.conditions, reasons.ACCEPTED)
    if accepted is None or accepted.status != "True":
        p.condition(reasons.ACCEPTED, "True", reasons.SPEC_VALID, "The spec is valid.")
        p.progressed = True

    # A spec change after profiling started: measurement-defining fields restart the ladder,
    # anything else (stop rules, capacity, cleanup) only re-decides from the measurements.
    if p.status.tiers and p.status.measured_spec_hash and p.status.measured_spec_hash != spec_hash:
        return _restart_for_spec_change(p, spec_hash).step()

    # A Failed experiment whose spec was edited (an invalid spec fixed, a missing ConfigMap
    # named correctly) gets a fresh ladder: the user changed the desired state.
    if derive_phase(p.status.conditions) == "Failed" and p.status.observed_generation not in (None, obs.generation):
        return _restart_for_spec_change(p, spec_hash, after_failure=True).step()

    # Failed only for want of an object the engine needs (a PVC, a Secret): look again.
    failed = get_condition(p.status.conditions, reasons.FAILED)
    if not p.status.tiers and failed is not None and failed.status == "True" and failed.reason == reasons.MISSING_OBJECT:
        _plan(p, spec_hash)
        return p.step()

    if derive_phase(p.status.conditions) in ("Decided", "Failed"):
        if p.status.observed_generation != obs.generation and derive_phase(p.status.conditions) == "Decided":
            _redecide_after_rule_change(p)
        return p.step()

    if not p.status.tiers:
        _plan(p, spec_hash)
        return p.step()

    current = next((t for t in p.status.tiers if t.phase not in TERMINAL_TIER_PHASES), None)
    if current is None:
        _finish(p, budget_stopped=False)
        return p.step()

    p.status = replace(p.status, current_tier=current.name)
    handler = {
        TIER_PENDING: _tier_pending,
        TIER_WAITING: _tier_pending,
        TIER_DEPLOYING: _tier_deploying,
        TIER_LOAD_TESTING: _tier_load_testing,
        TIER_COLLECTING: _tier_collecting,
    }[current.phase]
    handler(p, current)
    return p.step()


# --------------------------------------------------------------------------------------
# Plan


def _plan(p: _Pass, spec_hash: str) -> None:
    spec, obs = p.spec, p.obs
    if obs.missing_objects:
        why = "; ".join(obs.missing_objects)
        failed = get_condition(p.status.conditions, reasons.FAILED)
        if failed is None or failed.status != "True" or failed.message != f"Cannot deploy any tier: {why}":
            p.condition(reasons.PLANNED, "False", reasons.MISSING_OBJECT, why)
            p.condition(reasons.FAILED, "True", reasons.MISSING_OBJECT, f"Cannot deploy any tier: {why}")
            p.event(reasons.MISSING_OBJECT, f"Cannot deploy any tier: {why} (checked again every {MISSING_OBJECT_RECHECK_SECONDS:g} s)", warning=True)
            p.message(f"Cannot deploy any tier: {why}")
            p.progressed = True
        p.requeue(MISSING_OBJECT_RECHECK_SECONDS)
        return
    failed = get_condition(p.status.conditions, reasons.FAILED)
    if failed is not None and failed.status == "True" and failed.reason == reasons.MISSING_OBJECT:
        p.condition(reasons.FAILED, "False", reasons.PLAN_READY, "The objects the engine needs exist.")
    if obs.plan_error or obs.architecture is None or obs.gpu is None:
        why = obs.plan_error or ("no GPU type could be determined" if obs.gpu is None else "no model architecture")
        p.condition(reasons.PLANNED, "False", reasons.PLAN_FAILED, why)
        p.condition(reasons.FAILED, "True", reasons.PLAN_FAILED, f"Cannot plan the ladder: {why}")
        p.event(reasons.PLAN_FAILED, f"Cannot plan the ladder: {why}", warning=True)
        p.status = replace(p.status, finished_at=p.now)
        p.progressed = True
        return

    fleet = obs.fleet
    simulate = spec.mode == "Simulate"
    require_nvlink = bool(fleet and fleet.has_nvlink())
    ladder = ladder_tiers(spec)
    estimates = {tier: _estimate(spec, obs, tier) for tier in ladder}
    min_pp = min(t.pipeline_parallel for t in ladder)
    max_node_gpus = fleet.max_gpus_per_node() if (fleet and fleet.domains) else obs.gpu.max_gpus_per_node
    # "TP alone holds the model" counts only TP tiers that fit one node: a TP16 tier on
    # 8-GPU nodes is skipped anyway, so it cannot make PP unnecessary.
    tp_only_fits = any(estimates[t].fits for t in ladder if t.pipeline_parallel == min_pp and t.gpus <= max_node_gpus)
    topology_key = spec.placement.multi_node_topology_key

    results = []
    lines = []
    for tier in ladder:
        est = estimates[tier]
        multi = is_multi_node(tier, max_node_gpus)
        base = TierResult(
            tensor_parallel=tier.tensor_parallel,
            pipeline_parallel=tier.pipeline_parallel,
            gpus=tier.gpus,
            name=tier.name,
            estimated_memory_gi_b=round(est.needed_bytes_per_gpu / GIB, 2),
            gpu_memory_gi_b=round(obs.gpu.memory_bytes / GIB, 2),
            simulated=True if simulate else None,
            # False (not None) on single-node PP tiers: consumers then know PP stays on one node.
            multi_node=True if multi else (False if tier.pipeline_parallel > 1 else None),
            nodes=tier.pipeline_parallel if multi else None,
        )
        if not est.fits:
            result = replace(base, phase=TIER_SKIPPED, does_not_fit=True, reason=f"does not fit (estimate): {est.reason}", finished_at=p.now)
        elif tier.pipeline_parallel > min_pp and tp_only_fits:
            result = replace(
                base, phase=TIER_SKIPPED, reason="pipeline parallelism not needed: tensor parallelism alone holds the model", finished_at=p.now
            )
        elif multi and tier.tensor_parallel > max_node_gpus:
            # TP all-reduces every layer: across nodes it would run over the network. TP stays
            # inside one node's NVLink domain; only PP may cross nodes.
            result = replace(
                base,
                phase=TIER_SKIPPED,
                reason=(
                    f"refused: tensor parallelism would span nodes (TP{tier.tensor_parallel} needs {tier.tensor_parallel} GPUs "
                    f"in one NVLink domain; the largest matching node has {max_node_gpus}); TP stays inside a node, PP goes "
                    f"across nodes: list tensorParallel sizes up to {max_node_gpus}"
                ),
                finished_at=p.now,
            )
        elif (
            multi
            and not simulate
            and fleet is not None
            and not fleet.can_ever_hold_group(tier.tensor_parallel, tier.pipeline_parallel, require_nvlink, topology_key)
        ):
            where = f" in one {topology_key} domain" if topology_key else ""
            result = replace(
                base,
                phase=TIER_SKIPPED,
                reason=(
                    f"needs {tier.pipeline_parallel} pods of {tier.tensor_parallel} GPUs in one NVLink domain each{where} "
                    f"(one replica across nodes); the fleet holds "
                    f"{fleet.group_nodes_possible(tier.tensor_parallel, require_nvlink)} such pod(s) in all"
                ),
                finished_at=p.now,
            )
        elif tier.pipeline_parallel == 1 and tier.gpus > max_node_gpus:
            result = replace(
                base,
                phase=TIER_SKIPPED,
                reason=f"spec.tiers.tensorParallel {tier.tensor_parallel} needs {tier.gpus} GPUs on one node; the largest matching node has {max_node_gpus}",
                finished_at=p.now,
            )
        elif (
            not simulate
            and fleet is not None
            and tier.pipeline_parallel == 1
            and not fleet.can_ever_hold(tier.gpus, require_nvlink)
        ):
            result = replace(
                base,
                phase=TIER_SKIPPED,
                reason=f"no node has {tier.gpus} GPUs in one NVLink domain",
                finished_at=p.now,
            )
        else:
            result = replace(base, phase=TIER_PENDING, reason=f"estimate: {est.reason}")
        results.append(result)
        lines.append(f"{tier.label}: {result.phase}" + (f" ({result.reason})" if result.phase == TIER_SKIPPED else ""))
        if result.phase == TIER_SKIPPED:
            p.event(reasons.TIER_SKIPPED, f"{tier.label} skipped without deploying: {result.reason}")

    p.status = replace(
        p.status,
        tiers=tuple(results),
        measured_spec_hash=spec_hash,
        started_at=p.status.started_at or p.now,
        simulated=True if simulate else None,
        gpu_minutes_total=p.status.gpu_minutes_total or 0.0,
    )
    p.progressed = True
    runnable = [r for r in results if r.phase == TIER_PENDING]
    summary = "; ".join(lines)
    p.condition(reasons.PLANNED, "True", reasons.PLAN_READY, f"Ladder planned: {summary}.")
    p.event(reasons.PLAN_READY, f"Ladder planned: {summary}")
    if not runnable:
        _finish(p, budget_stopped=False)
        return
    p.condition(reasons.PROFILING, "True", reasons.LADDER_RUNNING, f"Profiling {len(runnable)} tier(s).")
    p.message(f"planned {len(results)} tier(s), {len(runnable)} to measure")


# --------------------------------------------------------------------------------------
# Tier transitions


def _elapsed_since(p: _Pass, stamp: str | None) -> float:
    t = parse_rfc3339(stamp)
    return 0.0 if t is None else max(0.0, p.obs.now - t)


def _predicted_gpu_minutes(p: _Pass, tier: Tier) -> float | None:
    """GPU-minutes the next tier will likely cost: the last measured tier's wall time at this tier's GPU count."""
    measured = [t for t in p.status.tiers if t.phase == TIER_MEASURED and t.gpu_minutes]
    if not measured:
        return None
    last = measured[-1]
    wall_minutes = (last.gpu_minutes or 0.0) / max(1, last.gpus)
    return wall_minutes * tier.gpus


def _tier_pending(p: _Pass, current: TierResult) -> None:
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
            _skip_remaining(p, why)
            _finish(p, budget_stopped=True)
            return

    simulate = p.spec.mode == "Simulate"
    fleet = p.obs.fleet
    domain = None
    pods = group_size(p.spec, current)
    group: tuple[Any, ...] = ()
    if pods > 1 and p.obs.leader_worker_set_api is False:
        _fail_tier(
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
        require_nvlink = fleet.has_nvlink()
        if pods > 1:
            topology_key = p.spec.placement.multi_node_topology_key
            group = fleet.free_group(tier.tensor_parallel, pods, require_nvlink, topology_key) or ()
            domain = group[0] if group else None
        else:
            domain = fleet.free_now(tier.gpus, require_nvlink)
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
        where = f" as a LeaderWorkerSet of {pods} pods ({tier.tensor_parallel} GPUs each) on {', '.join(sorted({d.node_name for d in group}))}"
    p.event(reasons.TIER_DEPLOYING, f"Deploying {tier.label} ({tier.gpus} GPU(s)){where}")
    p.message(f"{tier.label}: deploying the engine{where}")
    p.requeue(p.settings.poll_seconds)


def _placed(p: _Pass, current: TierResult, domain: Any) -> TierResult:
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


def _tier_deploying(p: _Pass, current: TierResult) -> None:
    tier = tier_of(current)
    engine = p.obs.engine
    elapsed = _elapsed_since(p, current.started_at)
    pods = group_size(p.spec, current)
    if engine is None or not engine.exists:
        # Created by the previous pass but not visible yet, or deleted by someone: ensure again.
        p.actions.append(EnsureEngine(tier, node_name=current.node_name, group_size=pods))
        if elapsed > p.spec.budget.tier_timeout_seconds:
            kind = "LeaderWorkerSet" if pods > 1 else "Deployment"
            _fail_tier(p, current, "TierStartFailed", f"the engine {kind} did not appear within {p.spec.budget.tier_timeout_seconds} s")
            return
        p.requeue(p.settings.poll_seconds)
        return
    if engine.ready:
        attempt = 1
        p.actions.append(EnsureLoadTest(tier, attempt))
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
        _fail_tier(p, current, reasons.TIER_OUT_OF_MEMORY, f"out of memory at start: {message}".strip(), does_not_fit=True)
        return
    if kind == START_CRASH_LOOP and engine.restarts >= p.settings.crash_loop_restarts:
        _fail_tier(p, current, reasons.TIER_START_FAILED, f"CrashLoopBackOff after {engine.restarts} restarts: {message}".strip())
        return
    if kind == START_CONFIG_ERROR:
        _fail_tier(p, current, reasons.TIER_START_FAILED, f"CreateContainerConfigError: {message}".strip())
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
        _fail_tier(p, current, label, f"not Ready within {p.spec.budget.tier_timeout_seconds} s ({detail})".strip())
        return
    if kind:
        p.message(f"{tier.label}: not Ready yet ({kind}: {message})"[:300])
    p.requeue(p.settings.poll_seconds)


def _scrape_check(p: _Pass, tier: Tier) -> None:
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


def _tier_load_testing(p: _Pass, current: TierResult) -> None:
    tier = tier_of(current)
    attempt = current.attempts or 1
    job = p.obs.load_test
    elapsed = _elapsed_since(p, current.load_test_started_at)
    engine = p.obs.engine
    _scrape_check(p, tier)
    if engine is not None and engine.start_failure == START_OUT_OF_MEMORY:
        _fail_tier(p, current, reasons.TIER_OUT_OF_MEMORY, f"engine ran out of memory under load: {engine.failure_message or ''}".strip(), does_not_fit=True)
        return

    failure: str | None = None
    if job is None or not job.exists:
        p.actions.append(EnsureLoadTest(tier, attempt))
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
        p.actions.append(EnsureLoadTest(tier, attempt + 1))
        p.put_tier(replace(current, attempts=attempt + 1, load_test_started_at=p.now, reason=f"attempt {attempt} failed: {failure}"))
        p.event(reasons.LOAD_TEST_RETRIED, f"Load test of {tier.label} attempt {attempt} failed ({failure}); retrying", warning=True)
        p.requeue(p.settings.poll_seconds)
        return
    _fail_tier(p, current, reasons.LOAD_TEST_FAILED, f"load test failed after {attempt} attempt(s): {failure}")


def _record_load_test(p: _Pass, current: TierResult, summary: dict[str, Any]) -> None:
    tier = tier_of(current)
    values: dict[str, Any] = {}
    for key, attr in _SUMMARY_FIELDS.items():
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


def _tier_collecting(p: _Pass, current: TierResult) -> None:
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

    all_metrics = ("DCGM_FI_DEV_FB_USED", "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total", "DCGM_FI_DEV_GPU_UTIL", "kneepoint_comm_fraction",
                   "kneepoint_rank_skew_fraction")
    missing = tuple(all_metrics) if (window is None or window.error) else window.missing
    gpu = tier_gpu(p.obs, current)
    est = _estimate(p.spec, p.obs, tier, gpu) if (p.obs.architecture is not None and gpu is not None) else None
    ok_window = window if (window is not None and not window.error) else None
    balance = rank_balance(ok_window.gpu_utilization_by_gpu, ok_window.fb_used_gib_by_gpu, ok_window.rank_skew_fraction) if ok_window else None
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
        p.event(reasons.PROMETHEUS_UNREACHABLE, f"{tier.label}: Prometheus unreachable ({why}); no values for {', '.join(missing)}"[:1000], warning=True)
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
    _close_tier(p, measured, teardown=True)
    if balance is not None and balance.finding:
        p.event(reasons.SPLIT_NOT_EFFECTIVE, f"{tier.label}: {balance.finding}", warning=True)
    p.event(
        reasons.TIER_MEASURED,
        f"{tier.label} measured: {measured.output_tokens_per_second or 0:.0f} tok/s, P99 {measured.latency_p99_ms or 0:.0f} ms, "
        f"needed {measured.peak_memory_gi_b if measured.peak_memory_gi_b is not None else '?'} GiB/GPU, "
        f"comm {measured.comm_fraction if measured.comm_fraction is not None else 'n/a'}, "
        f"rank skew {measured.rank_skew_fraction if measured.rank_skew_fraction is not None else 'n/a'}",
    )
    _decide_or_continue(p)


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


def _close_tier(p: _Pass, result: TierResult, teardown: bool) -> None:
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


def _fail_tier(p: _Pass, current: TierResult, reason: str, message: str, does_not_fit: bool = False) -> None:
    tier = tier_of(current)
    failed = replace(current, phase=TIER_FAILED, reason=message[:1000], does_not_fit=True if does_not_fit else None)
    _close_tier(p, failed, teardown=True)
    p.event(reason, f"{tier.label} failed: {message}"[:1000], warning=True)
    p.message(f"{tier.label}: failed ({message})"[:300])
    _decide_or_continue(p)


def _skip_remaining(p: _Pass, why: str) -> None:
    for t in p.status.tiers:
        if t.phase not in TERMINAL_TIER_PHASES:
            if t.phase in ACTIVE_TIER_PHASES:
                p.actions.append(DeleteTier(tier_of(t)))
            p.put_tier(replace(t, phase=TIER_SKIPPED, reason=why, finished_at=p.now))
            p.event(reasons.TIER_SKIPPED, f"{tier_of(t).label} skipped: {why}")


def _decide_or_continue(p: _Pass) -> None:
    outcome = decide(p.spec, p.status.tiers)
    p.status = replace(p.status, tiers=tuple(outcome.tiers))
    if outcome.decision is None:
        nxt = next((t for t in p.status.tiers if t.phase not in TERMINAL_TIER_PHASES), None)
        if nxt is None:
            _finish(p, budget_stopped=False)
            return
        if nxt is not None:
            p.status = replace(p.status, current_tier=nxt.name)
            p.message(f"going on to {tier_of(nxt).label}")
        p.requeue(0.0)
        return
    winner = Tier(outcome.decision.tensor_parallel, outcome.decision.pipeline_parallel)
    _skip_remaining(p, f"not needed: the ladder stopped at {winner.label} (rule {outcome.decision.rule})")
    _finish(p, budget_stopped=False)


def _finish(p: _Pass, budget_stopped: bool) -> None:
    """The ladder is over (remaining tiers already Skipped): write the decision or why there is none."""
    outcome = decide(p.spec, p.status.tiers, budget_stopped=budget_stopped)
    p.status = replace(p.status, tiers=tuple(outcome.tiers), current_tier=None, waiting_for=None, queue_position=None)
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
        p.actions.append(DeleteAllChildren())
        return
    if p.spec.mode == "Simulate":
        decision = replace(decision, simulated=True)
    p.status = replace(p.status, decision=decision, decided_tier=Tier(decision.tensor_parallel, decision.pipeline_parallel).label, finished_at=p.now)
    p.condition(reasons.PROFILING, "False", reasons.LADDER_FINISHED, "The ladder finished.")
    p.condition(reasons.DECIDED, "True", reasons.DECISION_MADE, decision.reason[:1000])
    p.condition(reasons.FAILED, "False", reasons.DECISION_MADE, "Decided.")
    keep = p.spec.cleanup.winner == "Keep"
    winner = Tier(decision.tensor_parallel, decision.pipeline_parallel)
    if keep:
        winner_result = p.status.tier(winner.name)
        p.actions.append(EnsureEngine(winner, group_size=group_size(p.spec, winner_result) if winner_result else 1))
        p.actions.append(DeleteAllChildren(keep_tier=winner))
    else:
        p.actions.append(DeleteAllChildren())
    p.actions.append(PublishRecommendation(decision))
    sim = " (simulated)" if p.spec.mode == "Simulate" else ""
    p.event(
        reasons.DECISION_MADE,
        f"Decided{sim}: {winner.label}, {decision.replicas} replica(s) of {decision.gpus_per_replica} GPU(s), "
        f"rule {decision.rule}, {decision.classification}. {decision.reason}"[:1000],
    )
    p.message(f"decided{sim}: {winner.label} x {decision.replicas} replicas (rule {decision.rule})")


def _restart_for_spec_change(p: _Pass, spec_hash: str, after_failure: bool = False) -> _Pass:
    p.actions.append(DeleteAllChildren())
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
    p.status = ExperimentStatus(
        conditions=tuple(c for c in p.status.conditions if c.type == reasons.ACCEPTED),
        gpu_minutes_total=round((p.status.gpu_minutes_total or 0.0) + in_progress, 3),
        message="spec changed: restarting the ladder",
    )
    p.condition(reasons.PLANNED, "Unknown", reasons.SPEC_CHANGED, "Re-planning after a spec change.")
    p.progressed = True
    p.requeue(0.0)
    return p


def _redecide_after_rule_change(p: _Pass) -> None:
    """Stop rules or capacity changed after the decision: decide again from the same measurements."""
    old = p.status.decision
    # A ladder the budget ended stays ended: re-deciding must not turn it into last-tier.
    outcome = decide(p.spec, p.status.tiers, budget_stopped=bool(old and old.rule == "budget"))
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
