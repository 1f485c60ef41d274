"""Deterministic names, labels and annotation keys for the children of an experiment.

Names depend only on the experiment's name, the tier and the attempt, so a reconcile that
runs twice (after a crash, a retry, a restart) computes the same name and finds the child it
created before instead of creating another. Names stay valid DNS labels (63 characters):
long experiment names are shortened with a stable hash suffix.
"""

from __future__ import annotations

import hashlib
import re

from kneepoint.core.tiers import Tier

GROUP = "kneepoint.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ParallelismExperiment"
PLURAL = "parallelismexperiments"

LABEL_EXPERIMENT = "kneepoint.io/experiment"
LABEL_TIER = "kneepoint.io/tier"
LABEL_ROLE = "kneepoint.io/role"
LABEL_ATTEMPT = "kneepoint.io/attempt"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_PART_OF = "app.kubernetes.io/part-of"
ROLE_ENGINE = "engine"
TRACE_PORT_NAME = "trace-metrics"
"""Container port of the engine pod's trace sidecar (scraped by the PodMonitor / sandbox Prometheus)."""
ROLE_LOADTEST = "loadtest"
ROLE_RECOMMENDATION = "recommendation"
MANAGED_BY = "kneepoint"

# Multi-node engines (one replica over several nodes) run as a LeaderWorkerSet group.
LWS_GROUP = "leaderworkerset.x-k8s.io"
LWS_VERSION = "v1"
LWS_API_VERSION = f"{LWS_GROUP}/{LWS_VERSION}"
LWS_KIND = "LeaderWorkerSet"
LWS_PLURAL = "leaderworkersets"
LWS_EXCLUSIVE_TOPOLOGY = "leaderworkerset.sigs.k8s.io/exclusive-topology"
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
# Which pod of a group a pod is (the Service selects the leader: workers serve no API).
LABEL_GROUP_ROLE = "kneepoint.io/group-role"
GROUP_LEADER = "leader"
GROUP_WORKER = "worker"

# Node label keys live in kneepoint.core.node_labels (the probe and the sandbox use them too).

_MAX_LABEL = 63


def _dns_label(text: str) -> str:
    text = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return text or "x"


def _fit(prefix: str, suffix: str, limit: int = _MAX_LABEL) -> str:
    """``prefix-suffix`` within ``limit`` characters; shorten the prefix with a hash when needed."""
    full = f"{prefix}-{suffix}"
    if len(full) <= limit:
        return full
    digest = hashlib.sha256(prefix.encode()).hexdigest()[:6]
    room = limit - len(suffix) - len(digest) - 2
    return f"{prefix[:room].rstrip('-')}-{digest}-{suffix}"


def engine_name(experiment: str, tier: Tier) -> str:
    """Name of the tier's engine Deployment and Service."""
    return _fit(_dns_label(experiment), tier.name)


def load_test_name(experiment: str, tier: Tier, attempt: int) -> str:
    """Name of the tier's load-test Job for one attempt."""
    return _fit(_dns_label(experiment), f"{tier.name}-load{attempt}")


def recommendation_name(experiment: str) -> str:
    """Name of the ConfigMap holding the KServe recommendation."""
    return _fit(_dns_label(experiment), "kserve")


def experiment_label_value(experiment: str) -> str:
    """Label values are limited to 63 characters too."""
    return experiment if len(experiment) <= _MAX_LABEL else _fit(experiment[:40], "x")


def child_labels(experiment: str, tier: Tier | None, role: str) -> dict[str, str]:
    labels = {
        LABEL_EXPERIMENT: experiment_label_value(experiment),
        LABEL_ROLE: role,
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_PART_OF: "kneepoint",
    }
    if tier is not None:
        labels[LABEL_TIER] = tier.name
    return labels


def service_host(experiment: str, tier: Tier, namespace: str) -> str:
    """Cluster DNS name of the tier's engine Service."""
    return f"{engine_name(experiment, tier)}.{namespace}.svc.cluster.local"
