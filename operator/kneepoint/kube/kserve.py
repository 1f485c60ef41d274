"""The KServe InferenceService for a decision: a pure builder, held against KServe's own files.

What KServe does with it (kserve/kserve, read at the commit named in tests/data/kserve/SOURCE.md):

- The ``kserve-huggingfaceserver`` runtime's container carries cpu "1" and memory 2Gi as
  requests *and* limits; KServe merges it with the InferenceService's container by strategic
  merge patch (``MergeRuntimeContainers``), so keys are added, not replaced. The export
  therefore sets cpu, memory and ephemeral-storage requests and limits itself, sized from the
  model's weights (:func:`container_resources`).
- Deployment mode: ``Standard`` (KServe's default since v0.16, no Knative needed) or
  ``Knative``; KServe <= 0.15 calls them ``RawDeployment`` and ``Serverless``.
  Standard scales on concurrency through KEDA (``autoscalerClass: keda``, an External
  Prometheus metric); the webhook refuses ``scaleMetric`` with KEDA. KServe gives KEDA the
  query and ``target.value`` as ``threshold`` without a metric type, so KEDA's default
  AverageValue applies: replicas = ceil(query / threshold); the query is the sum over the
  InferenceService's pods and the threshold the per-replica concurrency.
  Knative's KPA aims at 70 % of the target by default (target-utilization-percentage): the
  export sets it to 100 so scaling starts at the per-replica concurrency that was measured.
- Multi-node (``workerSpec``): the webhook accepts only ``pvc://`` and ``oci://`` storage and
  ``autoscalerClass: none``; only the Standard reconciler builds the workers (the Knative path
  ignores ``workerSpec``); the worker container needs its GPU count (else 1 GPU each).
  Anything else raises :class:`NotExportable`, whose message says why and points at the
  LeaderWorkerSet manifest instead.
- Names must match ``[a-z]([-a-z0-9]*[a-z0-9])?`` (:func:`isvc_name`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

import yaml

from kneepoint.core import node_labels
from kneepoint.core.apifields import to_json
from kneepoint.core.architectures import ModelArchitecture
from kneepoint.core.memory_estimate import weight_bytes_per_gpu
from kneepoint.core.metric_names import RUNNING_REQUESTS
from kneepoint.core.recommendation import STANDARD, canonical_mode, is_multi_node, recommendation
from kneepoint.core.spec import ExperimentSpec
from kneepoint.core.status import Decision
from kneepoint.core.tiers import Tier
from kneepoint.kube import naming
from kneepoint.kube.manifests import BuildContext, Owner, build_engine_leader_worker_set, engine_host_resources

API_VERSION = "serving.kserve.io/v1beta1"
KIND = "InferenceService"
DEPLOYMENT_MODE = "serving.kserve.io/deploymentMode"
AUTOSCALER_CLASS = "serving.kserve.io/autoscalerClass"
GPU_RESOURCE_TYPES = "serving.kserve.io/gpu-resource-types"
KNATIVE_TARGET_UTILIZATION = "autoscaling.knative.dev/target-utilization-percentage"
# KServe's DefaultGPUResourceTypeList (pkg/constants/constants.go); others need GPU_RESOURCE_TYPES.
KSERVE_GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "intel.com/gpu", "habana.ai/gaudi")
# The deployment modes, their legacy names and the metric KEDA scales on (vLLM's running-requests gauge)
# are defined with status.recommendation's numbers, in core.
RUNNING_REQUESTS_METRIC = RUNNING_REQUESTS
PREDICTOR_CONTAINER = "kserve-container"
WORKER_CONTAINER = "worker-container"
MULTI_NODE_STORAGE = ("pvc", "oci")
PER_REPLICA_CONCURRENCY = "kneepoint.io/per-replica-concurrency"

NAME_PATTERN = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# Knative names the revision's private Service "<name>-predictor-00001-private", a DNS-1035
# label of at most 63 characters: 63 - len("-predictor-00001-private") = 39.
NAME_MAX_LENGTH = 39


class NotExportable(ValueError):
    """The decided tier cannot be expressed as an InferenceService KServe accepts; the message says why."""


def isvc_name(model_name: str) -> str:
    """A name KServe's webhook accepts: lower case, ``[-a-z0-9]``, starting with a letter, at most 39 characters.

    Dots, underscores, slashes and other characters become ``-``, a leading digit gets
    ``model-`` in front; a name cut to length gets
    a short hash of the original, so two long names that share a prefix stay distinct.
    """
    name = re.sub(r"[^a-z0-9]+", "-", model_name.lower()).strip("-")
    if not name:
        name = "model"
    elif not name[0].isalpha():
        name = f"model-{name}"  # must start with a letter
    if len(name) > NAME_MAX_LENGTH:
        digest = hashlib.sha256(model_name.encode()).hexdigest()[:6]
        name = f"{name[: NAME_MAX_LENGTH - 7].rstrip('-')}-{digest}"
    return name


def checkpoint_bytes(spec: ExperimentSpec, arch: ModelArchitecture) -> int:
    """The whole checkpoint in memory at the spec's dtype (the estimator's weights on one GPU)."""
    return weight_bytes_per_gpu(arch, Tier(1, 1), spec.model.dtype)


@dataclass(frozen=True)
class Sizing:
    """What one pod of the replica holds: its GPUs, the weight bytes they load, and what it downloads."""

    gpus: int
    weight_bytes: int
    downloaded_bytes: int


def container_resources(spec: ExperimentSpec, sizing: Sizing) -> dict[str, Any]:
    """cpu, memory, ephemeral-storage and GPU requests and limits for one engine pod.

    The host figures are the operator's own engine sizing (``manifests.engine_host_resources``), so the
    exported replica gets what the measured one had; memory request = limit (a weight load beyond it is
    an OOM kill), the cpu limit twice the request (no throttling at start-up).
    """
    host = engine_host_resources(sizing.gpus, sizing.weight_bytes, sizing.downloaded_bytes)
    gpu = str(sizing.gpus)
    requests = {**host, spec.placement.gpu_resource: gpu}
    limits = {**host, "cpu": str(2 * int(host["cpu"])), spec.placement.gpu_resource: gpu}
    return {"requests": requests, "limits": limits}


def _model_args(spec: ExperimentSpec, tier: Tier, multi_node: bool) -> list[str]:
    args = [f"--model_name={spec.served_model_name}"]
    if not multi_node:
        # The multi-node runtime passes TP/PP itself, from the env KServe sets from workerSpec.
        args += [f"--tensor-parallel-size={tier.tensor_parallel}", f"--pipeline-parallel-size={tier.pipeline_parallel}"]
    args += [
        f"--max-num-seqs={spec.max_num_seqs}",
        f"--max-model-len={spec.model.max_model_len}",
        f"--gpu-memory-utilization={spec.engine.gpu_memory_utilization:g}",
    ]
    if spec.model.dtype in ("bfloat16", "float16", "float32"):
        args.append(f"--dtype={spec.model.dtype}")
    elif spec.model.dtype == "fp8":
        args.append("--quantization=fp8")
    if spec.model.kv_cache_dtype != "auto":
        args.append(f"--kv-cache-dtype={spec.model.kv_cache_dtype}")
    return args


def _hub_token_env(spec: ExperimentSpec) -> list[dict[str, Any]]:
    ref = spec.model.hub_token_secret_ref
    if ref is None:
        return []
    return [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]


def multi_node_problem(spec: ExperimentSpec, mode: str) -> str | None:
    """Why KServe would refuse this multi-node export, or None."""
    protocol = spec.model.uri.split("://", 1)[0]
    if protocol not in MULTI_NODE_STORAGE:
        return (
            f"KServe's multi-node serving accepts only pvc:// or oci:// storage, and spec.model.uri is {protocol}://; "
            "copy the weights to a PersistentVolumeClaim and use pvc://claim/path"
        )
    if canonical_mode(mode) != STANDARD:
        return f"KServe builds multi-node workers in Standard mode only; spec.export.kserve.deploymentMode is {mode}"
    return None


def check_exportable(spec: ExperimentSpec, decision: Decision, deployment_mode: str | None = None) -> None:
    """Raise :class:`NotExportable` saying why KServe would refuse the decided tier, and what deploys it instead."""
    problem = export_problem(spec, decision, deployment_mode)
    if problem:
        raise NotExportable(
            f"TP{decision.tensor_parallel} x PP{decision.pipeline_parallel} spans {decision.pipeline_parallel} nodes and "
            f"cannot be exported as an InferenceService: {problem}. The LeaderWorkerSet manifest deploys it instead "
            "(kneepoint export NAME --lws)"
        )


def build_inference_service(
    spec: ExperimentSpec,
    owner_name: str,
    namespace: str,
    decision: Decision,
    weight_bytes: int,
    *,
    deployment_mode: str | None = None,
    prometheus_url: str | None = None,
) -> dict[str, Any]:
    """The InferenceService for the decided tier.

    ``weight_bytes``: the whole checkpoint in memory (the estimator's weights at TP1 PP1);
    ``deployment_mode`` overrides spec.export.kserve.deploymentMode; ``prometheus_url`` is
    KEDA's Prometheus when the spec names none. Raises :class:`NotExportable`.
    """
    kserve = spec.export.kserve
    mode = deployment_mode or kserve.deployment_mode
    canonical = canonical_mode(mode)
    tier = Tier(decision.tensor_parallel, decision.pipeline_parallel)
    multi_node = is_multi_node(decision)
    check_exportable(spec, decision, mode)
    name = isvc_name(spec.served_model_name)
    target = decision.per_replica_concurrency or spec.load.concurrency
    gpu_resource = spec.placement.gpu_resource
    pod_gpus = tier.tensor_parallel if multi_node else tier.gpus
    # A multi-node replica splits the layers over its PP pods: each pod loads about 1/PP of the weights.
    pod_weights = math.ceil(weight_bytes / tier.pipeline_parallel) if multi_node else weight_bytes
    # hf://: KServe's storage initializer downloads the whole checkpoint into the pod's emptyDir.
    downloaded = weight_bytes if spec.model.uri.startswith("hf://") else 0
    resources = container_resources(spec, Sizing(pod_gpus, pod_weights, downloaded))

    model: dict[str, Any] = {
        "modelFormat": {"name": "huggingface"},
        "storageUri": spec.model.uri,
        "args": _model_args(spec, tier, multi_node),
        "resources": resources,
    }
    env = _hub_token_env(spec)
    if env:
        model["env"] = env
    predictor: dict[str, Any] = {
        "minReplicas": min(spec.capacity.min_replicas, decision.replicas),
        "maxReplicas": decision.replicas,
    }
    annotations = {DEPLOYMENT_MODE: mode}
    if multi_node:
        # KServe's webhook: multi-node scales by nothing but replicas (autoscalerClass none).
        annotations[AUTOSCALER_CLASS] = "none"
        predictor["minReplicas"] = predictor["maxReplicas"] = decision.replicas
        predictor["workerSpec"] = {
            "tensorParallelSize": tier.tensor_parallel,
            "pipelineParallelSize": tier.pipeline_parallel,
            "containers": [{"name": WORKER_CONTAINER, "resources": resources}],
        }
    elif canonical == STANDARD:
        annotations[AUTOSCALER_CLASS] = "keda"
        server = kserve.prometheus_url or spec.metrics.prometheus_url or prometheus_url
        if not server:
            raise NotExportable("Standard mode scales through KEDA, which needs a Prometheus: set spec.export.kserve.prometheusUrl")
        query = f'sum({RUNNING_REQUESTS_METRIC}{{namespace="{namespace}",pod=~"{name}-predictor-.*"}})'
        predictor["autoScaling"] = {
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {"backend": "prometheus", "serverAddress": server, "query": query},
                        "target": {"type": "Value", "value": str(target)},
                    },
                }
            ]
        }
    else:
        annotations[KNATIVE_TARGET_UTILIZATION] = "100"
        predictor.update({"scaleMetric": "concurrency", "scaleTarget": target, "containerConcurrency": spec.max_num_seqs})
    if gpu_resource not in KSERVE_GPU_RESOURCES:
        annotations[GPU_RESOURCE_TYPES] = f'["{gpu_resource}"]'
    predictor["model"] = model
    if kserve.service_account_name:
        predictor["serviceAccountName"] = kserve.service_account_name
    selector = dict(spec.placement.node_selector)
    if spec.placement.gpu_product:
        selector.setdefault(node_labels.NODE_GPU_PRODUCT, spec.placement.gpu_product)
    if selector:
        predictor["nodeSelector"] = selector
    annotations[PER_REPLICA_CONCURRENCY] = str(target)
    annotations.update({"kneepoint.io/decided-by": f"{namespace}/{owner_name}", "kneepoint.io/rule": decision.rule})
    if decision.simulated:
        annotations["kneepoint.io/simulated"] = "true"
    if multi_node:
        annotations["kneepoint.io/multi-node"] = f"{tier.pipeline_parallel} nodes x {tier.tensor_parallel} GPUs"
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {"predictor": predictor},
    }


@dataclass(frozen=True)
class Autoscaling:
    """The scaling the export sets, for status.recommendation and the report."""

    min_replicas: int
    max_replicas: int
    scale_metric: str
    scale_target: int


def autoscaling_of(isvc: dict[str, Any]) -> Autoscaling:
    """Read back the bounds, the metric and the per-replica target from a built InferenceService."""
    predictor = isvc["spec"]["predictor"]
    target = int(isvc["metadata"]["annotations"][PER_REPLICA_CONCURRENCY])
    if "scaleMetric" in predictor:
        metric = predictor["scaleMetric"]
    elif "autoScaling" in predictor:
        metric = RUNNING_REQUESTS_METRIC
    else:
        metric = "none"  # multi-node: fixed replicas
    return Autoscaling(predictor["minReplicas"], predictor["maxReplicas"], metric, target)


CONFIG_MAP_ISVC_KEY = "inferenceservice.yaml"
CONFIG_MAP_LWS_KEY = "leaderworkerset.yaml"
CONFIG_MAP_DECISION_KEY = "decision.json"


@dataclass(frozen=True)
class Export:
    """What the operator publishes for a decision: the InferenceService, or why there is none (and the LWS instead)."""

    isvc_yaml: str | None
    scaling: Autoscaling
    not_exportable: str | None = None
    lws_yaml: str | None = None


def build_export(
    spec: ExperimentSpec,
    owner: Owner,
    decision: Decision,
    arch: ModelArchitecture | None,
    build: BuildContext,
    *,
    deployment_mode: str | None = None,
    prometheus_url: str | None = None,
) -> Export:
    """The InferenceService for the decision, or the reason it cannot be one plus the LeaderWorkerSet manifest."""
    fixed = Autoscaling(decision.replicas, decision.replicas, "none", decision.per_replica_concurrency or spec.load.concurrency)
    try:
        check_exportable(spec, decision, deployment_mode)
        if arch is None:
            raise NotExportable("the model's architecture is unknown, so the container's memory cannot be sized")
        isvc = build_inference_service(
            spec,
            owner.name,
            owner.namespace,
            decision,
            checkpoint_bytes(spec, arch),
            deployment_mode=deployment_mode,
            prometheus_url=prometheus_url,
        )
    except NotExportable as exc:
        lws = None
        tier = Tier(decision.tensor_parallel, decision.pipeline_parallel)
        if is_multi_node(decision) and spec.mode == "Measure":
            lws_obj = build_engine_leader_worker_set(spec, owner, tier, build, spec.placement.multi_node_topology_key)
            lws_obj["spec"]["replicas"] = max(1, decision.replicas)
            lws = yaml.safe_dump(lws_obj, sort_keys=False)
        return Export(None, fixed, str(exc), lws)
    return Export(yaml.safe_dump(isvc, sort_keys=False), autoscaling_of(isvc))


def build_recommendation_configmap(owner: Owner, decision: Decision, export: Export) -> dict[str, Any]:
    """ConfigMap named in status.recommendation: the InferenceService (or the LeaderWorkerSet) and the decision."""
    data = {CONFIG_MAP_DECISION_KEY: json.dumps(to_json(decision), indent=2, sort_keys=True)}
    if export.isvc_yaml is not None:
        data[CONFIG_MAP_ISVC_KEY] = export.isvc_yaml
    if export.lws_yaml is not None:
        data[CONFIG_MAP_LWS_KEY] = export.lws_yaml
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": naming.recommendation_name(owner.name),
            "namespace": owner.namespace,
            "labels": naming.child_labels(owner.name, None, naming.ROLE_RECOMMENDATION),
            "ownerReferences": [owner.reference()],
        },
        "data": data,
    }


def planned_scaling(spec: ExperimentSpec, decision: Decision, deployment_mode: str | None = None) -> Autoscaling:
    """The scaling :func:`build_inference_service` sets, without building it (the report's summary)."""
    r = recommendation(spec, decision, "", deployment_mode=deployment_mode)
    return Autoscaling(r.min_replicas, r.max_replicas, r.scale_metric, r.scale_target)


def export_problem(spec: ExperimentSpec, decision: Decision, deployment_mode: str | None = None) -> str | None:
    """Why the decision cannot be an InferenceService (multi-node rules), or None."""
    if not is_multi_node(decision):
        return None
    return multi_node_problem(spec, deployment_mode or spec.export.kserve.deployment_mode)
