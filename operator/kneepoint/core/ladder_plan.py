"""The plan: every tier of the ladder estimated, and each either Pending or Skipped with why."""

from __future__ import annotations

from dataclasses import replace

from kneepoint.core import placement, reasons
from kneepoint.core.gpus import GIB
from kneepoint.core.ladder_finish import finish
from kneepoint.core.ladder_state import Pass, estimate, is_multi_node, ladder_tiers
from kneepoint.core.observations import Observations
from kneepoint.core.predict_first import apply_prediction
from kneepoint.core.status import TIER_PENDING, TIER_SKIPPED, TierResult, get_condition

# How often a plan that failed for a missing PVC or Secret looks again (no watch on either).
MISSING_OBJECT_RECHECK_SECONDS = 30.0


def plan_problem(obs: Observations) -> str | None:
    """Why the ladder cannot be planned, in the order a user would fix it; None when it can."""
    if obs.plan_error:
        return obs.plan_error
    if obs.fleet is not None and not obs.fleet.domains and obs.placement_problem:
        # No node can ever hold this experiment: fail the plan naming the field to fix,
        # instead of skipping every tier for want of GPUs.
        return obs.placement_problem
    if obs.gpu is None:
        if obs.gpu_product:
            return f"spec.placement.gpuProduct {obs.gpu_product!r} is not in the GPU catalogue"
        return "no GPU node found and spec.placement.gpuProduct not set (allowed: a GFD product label such as NVIDIA-H200)"
    if obs.architecture is None:
        return "no model architecture"
    return None


def plan(p: Pass, spec_hash: str) -> None:
    spec, obs = p.spec, p.obs
    if obs.missing_objects:
        why = "; ".join(obs.missing_objects)
        failed = get_condition(p.status.conditions, reasons.FAILED)
        if failed is None or failed.status != "True" or failed.message != f"Cannot deploy any tier: {why}":
            p.condition(reasons.PLANNED, "False", reasons.MISSING_OBJECT, why)
            p.condition(reasons.FAILED, "True", reasons.MISSING_OBJECT, f"Cannot deploy any tier: {why}")
            p.event(
                reasons.MISSING_OBJECT,
                f"Cannot deploy any tier: {why} (checked again every {MISSING_OBJECT_RECHECK_SECONDS:g} s)",
                warning=True,
            )
            p.message(f"Cannot deploy any tier: {why}")
            p.progressed = True
        p.requeue(MISSING_OBJECT_RECHECK_SECONDS)
        return
    failed = get_condition(p.status.conditions, reasons.FAILED)
    if failed is not None and failed.status == "True" and failed.reason == reasons.MISSING_OBJECT:
        p.condition(reasons.FAILED, "False", reasons.PLAN_READY, "The objects the engine needs exist.")
    problem = plan_problem(obs)
    if problem is not None:
        p.condition(reasons.PLANNED, "False", reasons.PLAN_FAILED, problem)
        p.condition(reasons.FAILED, "True", reasons.PLAN_FAILED, f"Cannot plan the ladder: {problem}")
        p.event(reasons.PLAN_FAILED, f"Cannot plan the ladder: {problem}", warning=True)
        p.status = replace(p.status, finished_at=p.now)
        p.progressed = True
        return

    fleet = obs.fleet
    simulate = spec.mode == "Simulate"
    require_nvlink = obs.require_nvlink
    ladder = ladder_tiers(spec)
    estimates = {tier: estimate(spec, obs, tier) for tier in ladder}
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
            result = replace(
                base, phase=TIER_SKIPPED, does_not_fit=True, reason=f"does not fit (estimate): {est.reason}", finished_at=p.now
            )
        elif tier.pipeline_parallel > min_pp and tp_only_fits:
            result = replace(
                base,
                phase=TIER_SKIPPED,
                reason="pipeline parallelism not needed: tensor parallelism alone holds the model",
                finished_at=p.now,
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
            and not placement.can_ever_hold_group(fleet, tier.tensor_parallel, tier.pipeline_parallel, require_nvlink, topology_key)
        ):
            where = f" in one {topology_key} domain" if topology_key else ""
            result = replace(
                base,
                phase=TIER_SKIPPED,
                reason=(
                    f"needs {tier.pipeline_parallel} pods of {tier.tensor_parallel} GPUs in one NVLink domain each{where} "
                    f"(one replica across nodes); the fleet holds "
                    f"{placement.group_nodes_possible(fleet, tier.tensor_parallel, require_nvlink)} such pod(s) in all"
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
            and not placement.can_ever_hold(fleet, tier.gpus, require_nvlink)
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
            p.event(reasons.TIER_SKIPPED_EVENT, f"{tier.label} skipped without deploying: {result.reason}")

    p.status = replace(
        p.status,
        tiers=tuple(results),
        measured_spec_hash=spec_hash,
        started_at=p.status.started_at or p.now,
        simulated=True if simulate else None,
        gpu_minutes_total=p.status.gpu_minutes_total or 0.0,
    )
    p.progressed = True
    apply_prediction(p)  # predict-first: tiers that cannot change the decision become Predicted
    runnable = [r for r in p.status.tiers if r.phase == TIER_PENDING]
    summary = "; ".join(lines)
    p.condition(reasons.PLANNED, "True", reasons.PLAN_READY, f"Ladder planned: {summary}.")
    p.event(reasons.PLAN_READY, f"Ladder planned: {summary}")
    if not runnable:
        finish(p, budget_stopped=False)
        return
    p.condition(reasons.PROFILING, "True", reasons.LADDER_RUNNING, f"Profiling {len(runnable)} tier(s).")
    p.message(f"planned {len(results)} tier(s), {len(runnable)} to measure")
