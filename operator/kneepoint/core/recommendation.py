"""The numbers of status.recommendation: the replica bounds and the scaling the KServe export sets.

Computed here from the spec and the decision, not read back from the built manifest;
``kneepoint.kube.kserve`` builds the InferenceService with the same numbers (a contract test
compares the two).
"""

from __future__ import annotations

from kneepoint.core.metric_names import RUNNING_REQUESTS
from kneepoint.core.spec import ExperimentSpec
from kneepoint.core.status import Decision, Recommendation

STANDARD = "Standard"
KNATIVE = "Knative"
LEGACY_MODES = {"RawDeployment": STANDARD, "Serverless": KNATIVE}
"""KServe <= 0.15 names -> the names since v0.16 (KServe's ParseDeploymentMode)."""
CONCURRENCY = "concurrency"  # Knative KPA's scale metric
FIXED = "none"  # fixed replicas: a multi-node tier, or no InferenceService at all


def canonical_mode(mode: str) -> str:
    """Standard or Knative, whichever name (new or KServe <= 0.15) was given."""
    return LEGACY_MODES.get(mode, mode)


def is_multi_node(decision: Decision) -> bool:
    # multiNode is unset on decisions recorded before it existed: PP > 1 meant multi-node then.
    return decision.multi_node if decision.multi_node is not None else decision.pipeline_parallel > 1


def recommendation(
    spec: ExperimentSpec,
    decision: Decision,
    config_map_name: str,
    not_exportable: str | None = None,
    deployment_mode: str | None = None,
) -> Recommendation:
    """What the export scales on, between which bounds, aiming at what per-replica concurrency.

    A multi-node tier scales by replicas only (KServe's webhook: autoscalerClass none), and a
    decision that is not exportable keeps the decided replicas fixed.
    """
    target = decision.per_replica_concurrency or spec.load.concurrency
    if not_exportable is not None or is_multi_node(decision):
        return Recommendation(config_map_name, decision.replicas, decision.replicas, FIXED, target, not_exportable)
    mode = canonical_mode(deployment_mode or spec.export.kserve.deployment_mode)
    metric = RUNNING_REQUESTS if mode == STANDARD else CONCURRENCY
    return Recommendation(config_map_name, min(spec.capacity.min_replicas, decision.replicas), decision.replicas, metric, target)
