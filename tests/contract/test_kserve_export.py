"""The KServe export against KServe's own files: its CRD schema, its webhook's rules, its container merge.

KServe's files are vendored in tests/data/kserve (SOURCE.md names the commit). The webhook
rules and the merge are re-stated here from KServe's Go code, function by function (names
in the docstrings), for the fields the export sets; each re-statement is shown to reject
the shape it exists for (the old export's mistakes).
"""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from crd_validation import schema_errors

from kneepoint.core.architectures import get_preset
from kneepoint.core.spec import parse_spec
from kneepoint.core.status import Decision
from kneepoint.kube import kserve
from kneepoint.kube.manifests import BuildContext, Owner

DATA = Path(__file__).resolve().parents[1] / "data" / "kserve"
SCHEMA = json.loads((DATA / "inferenceservice-v1beta1.schema.json").read_text())
RUNTIME = yaml.safe_load((DATA / "kserve-huggingfaceserver.yaml").read_text())
MULTINODE_RUNTIME = yaml.safe_load((DATA / "kserve-huggingfaceserver-multinode.yaml").read_text())
PROMETHEUS = "http://prometheus-operated.monitoring.svc:9090"
OWNER = Owner("llama", "team-a", "uid-1")
GIB = 1024**3


# --------------------------------------------------------------------------------------
# KServe's rules, re-stated


def webhook_errors(isvc: dict[str, Any]) -> list[str]:
    """pkg/apis/serving/v1beta1/inference_service_validation.go, the checks that touch what the export sets."""
    errors: list[str] = []
    name = isvc["metadata"]["name"]
    annotations = isvc["metadata"].get("annotations", {})
    predictor = isvc["spec"]["predictor"]
    # validateInferenceServiceName
    if not re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name):
        errors.append(f"name {name!r} does not match [a-z]([-a-z0-9]*[a-z0-9])?")
    # validateInferenceServiceAutoscaler
    autoscaler = annotations.get(kserve.AUTOSCALER_CLASS)
    if autoscaler is not None and autoscaler not in ("hpa", "external", "keda", "none"):
        errors.append(f"[{autoscaler}] is not a supported autoscaler class type")
    # validateMultiNodeVariables
    gpu_types = ["nvidia.com/gpu", "amd.com/gpu", "intel.com/gpu", "habana.ai/gaudi"] + json.loads(
        annotations.get(kserve.GPU_RESOURCE_TYPES, "[]")
    )
    basic = {"cpu", "memory", "storage", "ephemeral-storage"}

    def unknown_gpu(resources: dict[str, Any]) -> bool:
        names = set(resources.get("limits", {})) | set(resources.get("requests", {}))
        return any(n not in basic and n not in gpu_types for n in names)

    worker = predictor.get("workerSpec")
    if worker is not None:
        if len(worker.get("containers", [])) > 1:
            errors.append("workerSpec: more than one container")
        model = predictor.get("model")
        if model is not None:
            env = {e["name"] for e in model.get("env", [])}
            if {"PIPELINE_PARALLEL_SIZE", "TENSOR_PARALLEL_SIZE"} & env:
                errors.append("model.env: TENSOR_PARALLEL_SIZE/PIPELINE_PARALLEL_SIZE are set from workerSpec")
            if unknown_gpu(model.get("resources", {})):
                errors.append("model.resources: unknown GPU resource type")
            uri = model.get("storageUri")
            if uri is None:
                errors.append("multi-node needs storageUri")
            elif uri.split("://")[0] not in ("pvc", "oci"):
                errors.append(f"Multinode only supports 'pvc' and 'oci' Storage Protocol({uri.split('://')[0]})")
            if annotations.get(kserve.AUTOSCALER_CLASS) != "none":
                errors.append(f"Multinode only supports 'none' autoscaler({annotations.get(kserve.AUTOSCALER_CLASS)})")
        for size in ("pipelineParallelSize", "tensorParallelSize"):
            if size in worker and worker[size] < 1:
                errors.append(f"workerSpec.{size} < 1")
        for container in worker.get("containers", []):
            if unknown_gpu(container.get("resources", {})):
                errors.append("workerSpec container: unknown GPU resource type")
    # component.go: validateContainerConcurrency, validateReplicas
    if predictor.get("containerConcurrency", 0) < 0:
        errors.append("containerConcurrency < 0")
    lo, hi = predictor.get("minReplicas", 1), predictor.get("maxReplicas", 0)
    if lo < 0 or hi < 0 or (lo > hi and hi != 0):
        errors.append(f"minReplicas {lo} / maxReplicas {hi}")
    # validateAutoScalingCompExtension: the annotation is compared as written ("Standard", not "RawDeployment").
    mode = annotations.get(kserve.DEPLOYMENT_MODE)
    if mode == "Standard":
        if autoscaler == "hpa":
            if predictor.get("scaleMetric", "cpu") not in ("cpu", "memory"):
                errors.append(f"[{predictor['scaleMetric']}] is not a supported metric")
            for metric in (predictor.get("autoScaling") or {}).get("metrics", []):
                if metric["type"] != "Resource":
                    errors.append(f"invalid HPA metric source type with value [{metric['type']}]")
        elif autoscaler == "keda":
            if "scaleMetric" in predictor:
                errors.append("ScaleMetric is not supported for KEDA")
            for metric in (predictor.get("autoScaling") or {}).get("metrics", []):
                if metric["type"] == "External":
                    external = metric.get("external")
                    if external is None:
                        errors.append("metricSpec.External is not set for external metric source type")
                        continue
                    if not external["metric"].get("query"):
                        errors.append("the query should not be empty")
                    if external.get("target", {}).get("value") is None:
                        errors.append("the target threshold value should not be empty")
                elif metric["type"] not in ("Resource", "PodMetric"):
                    errors.append(f"unknown KEDA metric type with value [{metric['type']}]")
    else:
        # validateScalingKPACompExtension (Knative, and any mode not literally "Standard")
        if "deploymentStrategy" in predictor:
            errors.append("customizing deploymentStrategy is only supported for raw deployment mode")
        metric = predictor.get("scaleMetric", "concurrency")
        if metric not in ("concurrency", "rps"):
            errors.append(f"[{metric}] is not a supported metric")
        if metric == "rps" and predictor.get("scaleTarget", 1) < 1:
            errors.append("the target for rps should be greater than 1")
    return errors


# strategicpatch merge keys of corev1.Container's lists (k8s.io/api/core/v1 types.go patchMergeKey).
MERGE_KEYS = {
    "env": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "volumeDevices": "devicePath",
    "resizePolicy": "resourceName",
}


def _strategic_merge(base: Any, patch: Any, key: str | None = None) -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            if v is None:
                out.pop(k, None)
            else:
                out[k] = _strategic_merge(base[k], v, k) if k in base else copy.deepcopy(v)
        return out
    if isinstance(base, list) and isinstance(patch, list) and key in MERGE_KEYS:
        merge_key = MERGE_KEYS[key]
        out = [copy.deepcopy(item) for item in base]
        for item in patch:
            index = next((i for i, b in enumerate(out) if b.get(merge_key) == item.get(merge_key)), None)
            if index is None:
                out.append(copy.deepcopy(item))
            else:
                out[index] = _strategic_merge(out[index], item)
        return out
    return copy.deepcopy(patch)


def merge_runtime_container(runtime: dict[str, Any], isvc: dict[str, Any]) -> dict[str, Any]:
    """MergeRuntimeContainers: strategic merge patch of the InferenceService's container onto the runtime's, then args concatenated."""
    merged = _strategic_merge(runtime, isvc)
    merged["args"] = list(runtime.get("args", [])) + list(isvc.get("args", []))
    return merged


def _runtime_container(runtime: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in runtime["spec"]["containers"] if c["name"] == name)


def _model_container(isvc: dict[str, Any]) -> dict[str, Any]:
    # The model's fields other than the Container ones are not part of the merge.
    model = isvc["spec"]["predictor"]["model"]
    return {k: v for k, v in model.items() if k not in ("modelFormat", "storageUri", "runtime", "protocolVersion")}


def ray_nodes_and_gpus(head: dict[str, Any], worker: dict[str, Any], tp: int, pp: int) -> tuple[int, int, int]:
    """predictor.go computeRayNodeAndGPUs: (nodes, worker GPUs, head GPUs), raising as KServe does when they do not add up."""
    total = tp * pp
    head_gpus = int(head["resources"].get("requests", {}).get("nvidia.com/gpu", 0))
    worker_gpus = int(worker["resources"].get("requests", {}).get("nvidia.com/gpu", 0))
    nodes = math.ceil(total / worker_gpus) if worker_gpus else 1
    if worker_gpus:
        new_head = total - worker_gpus * (nodes - 1)
        head_gpus = head_gpus or new_head
    if total > head_gpus + worker_gpus * (nodes - 1):
        raise ValueError(
            f"the total required number of GPUs({total}) is less than head({head_gpus}) + workers({worker_gpus * (nodes - 1)})"
        )
    return nodes, worker_gpus, head_gpus


# --------------------------------------------------------------------------------------
# The exports under test


def _spec(uri: str, preset: str, mode: str = "Standard", **model: Any) -> Any:
    return parse_spec(
        {
            "model": {"uri": uri, "architecture": {"preset": preset}, **model},
            "load": {"concurrency": 32},
            "capacity": {"peakConcurrency": 500},
            "placement": {"gpuProduct": "NVIDIA-H200"},
            "export": {"kserve": {"deploymentMode": mode}},
        }
    )


def _export(spec: Any, decision: Decision, preset: str) -> dict[str, Any]:
    return kserve.build_inference_service(
        spec, OWNER.name, OWNER.namespace, decision, kserve.checkpoint_bytes(spec, get_preset(preset)), prometheus_url=PROMETHEUS
    )


SINGLE = Decision(
    tensor_parallel=4, pipeline_parallel=1, gpus_per_replica=4, replicas=11, rule="throughput-gain", per_replica_concurrency=32
)
MULTI = Decision(
    tensor_parallel=8,
    pipeline_parallel=2,
    gpus_per_replica=16,
    replicas=3,
    rule="last-tier",
    per_replica_concurrency=16,
    multi_node=True,
    nodes=2,
)

CASES = {
    "single-Standard": (_spec("hf://meta-llama/Llama-3.1-70B-Instruct", "llama-3-70b", "Standard"), SINGLE, "llama-3-70b"),
    "single-Knative": (_spec("hf://meta-llama/Llama-3.1-70B-Instruct", "llama-3-70b", "Knative"), SINGLE, "llama-3-70b"),
    "single-RawDeployment": (_spec("hf://meta-llama/Llama-3.1-70B-Instruct", "llama-3-70b", "RawDeployment"), SINGLE, "llama-3-70b"),
    "single-Serverless": (_spec("hf://meta-llama/Llama-3.1-70B-Instruct", "llama-3-70b", "Serverless"), SINGLE, "llama-3-70b"),
    "multi-Standard": (_spec("pvc://models/llama-3.1-405b", "llama-3.1-405b", "Standard"), MULTI, "llama-3.1-405b"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_passes_the_crd_schema_and_the_webhook(case: str) -> None:
    spec, decision, preset = CASES[case]
    isvc = _export(spec, decision, preset)
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1" and isvc["kind"] == "InferenceService"
    assert schema_errors(SCHEMA, {k: v for k, v in isvc.items() if k != "metadata"}) == []
    assert webhook_errors(isvc) == []


@pytest.mark.parametrize("case", sorted(c for c in CASES if c.startswith("single")))
def test_resources_after_the_runtime_merge_are_the_exports(case: str) -> None:
    spec, decision, preset = CASES[case]
    isvc = _export(spec, decision, preset)
    merged = merge_runtime_container(_runtime_container(RUNTIME, kserve.PREDICTOR_CONTAINER), _model_container(isvc))
    weights = kserve.checkpoint_bytes(spec, get_preset(preset))
    assert 130 * GIB < weights < 145 * GIB  # 70B parameters in bfloat16
    memory = f"{math.ceil((weights + 4 * 2 * GIB + 4 * GIB) / GIB)}Gi"
    disk = f"{math.ceil((10 * GIB + weights) / GIB)}Gi"  # the whole checkpoint is downloaded into the pod
    assert merged["resources"] == {
        "requests": {"cpu": "6", "memory": memory, "ephemeral-storage": disk, "nvidia.com/gpu": "4"},
        "limits": {"cpu": "12", "memory": memory, "ephemeral-storage": disk, "nvidia.com/gpu": "4"},
    }
    # The runtime's flag first, then the export's (the later --model_name wins in argparse).
    assert merged["args"][0] == "--model_name={{.Name}}" and "--tensor-parallel-size=4" in merged["args"]
    assert merged["volumeMounts"] == [{"name": "devshm", "mountPath": "/dev/shm"}]


def test_the_merge_keeps_the_runtimes_2gi_when_only_gpus_are_set() -> None:
    # The old export set only nvidia.com/gpu: the runtime's 2Gi memory limit survived the merge.
    gpu_only = {"resources": {"requests": {"nvidia.com/gpu": "4"}, "limits": {"nvidia.com/gpu": "4"}}}
    merged = merge_runtime_container(_runtime_container(RUNTIME, kserve.PREDICTOR_CONTAINER), gpu_only)
    assert merged["resources"]["limits"] == {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "4"}


def test_multi_node_workers_get_tp_gpus_and_the_ray_split_adds_up() -> None:
    spec, decision, preset = CASES["multi-Standard"]
    isvc = _export(spec, decision, preset)
    predictor = isvc["spec"]["predictor"]
    head = merge_runtime_container(_runtime_container(MULTINODE_RUNTIME, kserve.PREDICTOR_CONTAINER), _model_container(isvc))
    runtime_worker = next(c for c in MULTINODE_RUNTIME["spec"]["workerSpec"]["containers"] if c["name"] == kserve.WORKER_CONTAINER)
    (worker_patch,) = predictor["workerSpec"]["containers"]
    worker = merge_runtime_container(runtime_worker, worker_patch)
    # Each pod holds half the layers (PP2): its memory covers half the checkpoint, not the runtime's 12Gi.
    weights = kserve.checkpoint_bytes(spec, get_preset(preset))
    memory = f"{math.ceil((math.ceil(weights / 2) + 8 * 2 * GIB + 4 * GIB) / GIB)}Gi"
    for pod in (head, worker):
        assert pod["resources"]["limits"]["nvidia.com/gpu"] == "8" and pod["resources"]["requests"]["nvidia.com/gpu"] == "8"
        assert pod["resources"]["limits"]["memory"] == memory == pod["resources"]["requests"]["memory"]
        assert pod["resources"]["limits"]["cpu"] == "20"
    assert ray_nodes_and_gpus(head, worker, 8, 2) == (2, 8, 8)
    # TP/PP come from workerSpec (KServe sets TENSOR_PARALLEL_SIZE for the runtime's command), not from args.
    assert not [a for a in head["args"] if a.startswith(("--tensor-parallel-size", "--pipeline-parallel-size"))]
    assert (predictor["workerSpec"]["tensorParallelSize"], predictor["workerSpec"]["pipelineParallelSize"]) == (8, 2)
    assert predictor["minReplicas"] == predictor["maxReplicas"] == 3
    # Without the worker's GPU count each worker would get none here, and the Ray split would not add up.
    with pytest.raises(ValueError):
        ray_nodes_and_gpus(head, merge_runtime_container(runtime_worker, {}), 8, 2)


def test_standard_mode_scales_through_keda_on_running_requests() -> None:
    spec, decision, preset = CASES["single-Standard"]
    isvc = _export(spec, decision, preset)
    assert isvc["metadata"]["annotations"][kserve.AUTOSCALER_CLASS] == "keda"
    (metric,) = isvc["spec"]["predictor"]["autoScaling"]["metrics"]
    # KServe hands target.value to KEDA as threshold; KEDA's default AverageValue divides the
    # summed query by it: replicas = ceil(running requests of all pods / 32).
    assert metric == {
        "type": "External",
        "external": {
            "metric": {
                "backend": "prometheus",
                "serverAddress": PROMETHEUS,
                "query": 'sum(vllm:num_requests_running{namespace="team-a",pod=~"llama-3-1-70b-instruct-predictor-.*"})',
            },
            "target": {"type": "Value", "value": "32"},
        },
    }
    assert (
        kserve.autoscaling_of(isvc) == kserve.planned_scaling(spec, decision) == kserve.Autoscaling(1, 11, "vllm:num_requests_running", 32)
    )


def test_knative_mode_starts_scaling_at_the_measured_concurrency() -> None:
    spec, decision, preset = CASES["single-Knative"]
    isvc = _export(spec, decision, preset)
    predictor = isvc["spec"]["predictor"]
    assert (predictor["scaleMetric"], predictor["scaleTarget"]) == ("concurrency", 32)
    # KPA aims at target x utilisation (70 % by default): 100 makes it scale out at 32, not at 22.4.
    assert isvc["metadata"]["annotations"][kserve.KNATIVE_TARGET_UTILIZATION] == "100"
    assert kserve.autoscaling_of(isvc) == kserve.planned_scaling(spec, decision) == kserve.Autoscaling(1, 11, "concurrency", 32)


def test_the_webhook_restatement_rejects_what_kserve_rejects() -> None:
    spec, decision, preset = CASES["multi-Standard"]
    isvc = _export(spec, decision, preset)
    hub = copy.deepcopy(isvc)
    hub["spec"]["predictor"]["model"]["storageUri"] = "hf://meta-llama/Llama-3.1-405B"
    assert webhook_errors(hub) == ["Multinode only supports 'pvc' and 'oci' Storage Protocol(hf)"]
    scaled = copy.deepcopy(isvc)
    scaled["metadata"]["annotations"][kserve.AUTOSCALER_CLASS] = "keda"
    assert webhook_errors(scaled) == ["Multinode only supports 'none' autoscaler(keda)"]
    keda_with_metric = _export(*CASES["single-Standard"][:2], "llama-3-70b")
    keda_with_metric["spec"]["predictor"]["scaleMetric"] = "concurrency"
    assert webhook_errors(keda_with_metric) == ["ScaleMetric is not supported for KEDA"]
    bad_name = copy.deepcopy(keda_with_metric)
    bad_name["spec"]["predictor"].pop("scaleMetric")
    bad_name["metadata"]["name"] = "Llama-3.1-8B"
    assert webhook_errors(bad_name) == ["name 'Llama-3.1-8B' does not match [a-z]([-a-z0-9]*[a-z0-9])?"]
    unknown_field = copy.deepcopy(isvc)
    unknown_field["spec"]["predictor"]["scaleMetrics"] = "concurrency"
    assert schema_errors(SCHEMA, {k: v for k, v in unknown_field.items() if k != "metadata"})


@pytest.mark.parametrize(
    ("uri", "mode", "reason"),
    [
        ("hf://meta-llama/Llama-3.1-405B", "Standard", "accepts only pvc:// or oci:// storage"),
        ("pvc://models/llama-3.1-405b", "Knative", "Standard mode only"),
        ("pvc://models/llama-3.1-405b", "Serverless", "Standard mode only"),
    ],
)
def test_multi_node_that_kserve_would_refuse_is_not_exported_and_the_lws_is(uri: str, mode: str, reason: str) -> None:
    spec = _spec(uri, "llama-3.1-405b", mode)
    with pytest.raises(kserve.NotExportable, match=reason):
        _export(spec, MULTI, "llama-3.1-405b")
    export = kserve.build_export(
        spec, OWNER, MULTI, get_preset("llama-3.1-405b"), BuildContext(gpu_product="NVIDIA-H200"), prometheus_url=PROMETHEUS
    )
    assert export.isvc_yaml is None and reason in (export.not_exportable or "") and "--lws" in (export.not_exportable or "")
    lws = yaml.safe_load(export.lws_yaml or "")
    assert lws["kind"] == "LeaderWorkerSet" and lws["spec"]["replicas"] == 3 and lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    data = kserve.build_recommendation_configmap(OWNER, MULTI, export)["data"]
    assert set(data) == {"decision.json", "leaderworkerset.yaml"}


def test_hub_token_reaches_the_server_and_the_storage_initializer_through_the_service_account() -> None:
    spec = parse_spec(
        {
            "model": {
                "uri": "hf://meta-llama/Llama-3.1-8B-Instruct",
                "architecture": {"preset": "llama-3-8b"},
                "hubTokenSecretRef": {"name": "hf", "key": "HF_TOKEN"},
            },
            "export": {"kserve": {"serviceAccountName": "hf-reader"}},
        }
    )
    d = Decision(tensor_parallel=1, pipeline_parallel=1, gpus_per_replica=1, replicas=2, per_replica_concurrency=64)
    isvc = _export(spec, d, "llama-3-8b")
    predictor = isvc["spec"]["predictor"]
    assert predictor["serviceAccountName"] == "hf-reader"
    assert predictor["model"]["env"] == [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "HF_TOKEN"}}}]
    assert schema_errors(SCHEMA, {k: v for k, v in isvc.items() if k != "metadata"}) == [] and webhook_errors(isvc) == []
    merged = merge_runtime_container(_runtime_container(RUNTIME, kserve.PREDICTOR_CONTAINER), _model_container(isvc))
    assert [e["name"] for e in merged["env"]] == ["LMCACHE_USE_EXPERIMENTAL", "HF_TOKEN"]


NAME_TABLE = [
    ("Llama-3.1-8B-Instruct", "llama-3-1-8b-instruct"),
    ("Qwen2.5-72B-Instruct", "qwen2-5-72b-instruct"),
    ("Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b-instruct-v0-1"),
    ("gpt_oss_120b", "gpt-oss-120b"),
    ("3b-model", "model-3b-model"),
    ("DeepSeek-V3", "deepseek-v3"),
    ("llama", "llama"),
    ("...", "model"),
    ("Meta-Llama-3.1-405B-Instruct-FP8-dynamic-with-a-long-suffix", None),
    ("Meta-Llama-3.1-405B-Instruct-FP8-dynamic-with-another-suffix", None),
]


@pytest.mark.parametrize(("model_name", "expected"), NAME_TABLE)
def test_names_are_valid_for_every_uri(model_name: str, expected: str | None) -> None:
    name = kserve.isvc_name(model_name)
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and len(name) <= kserve.NAME_MAX_LENGTH
    # The longest object KServe derives from it, Knative's revision private Service, is a DNS-1035 label.
    assert len(f"{name}-predictor-00001-private") <= 63
    if expected is not None:
        assert name == expected
    else:
        assert len(name) == kserve.NAME_MAX_LENGTH


def test_long_names_that_share_a_prefix_stay_distinct() -> None:
    long_names = [m for m, e in NAME_TABLE if e is None]
    assert len({kserve.isvc_name(m) for m in long_names}) == len(long_names)


@pytest.mark.parametrize("uri", ["hf://meta-llama/Llama-3.1-8B-Instruct", "pvc://models/Qwen2.5-7B.Instruct", "hf://org/Model_Name.v2"])
def test_uri_table_gives_exports_the_webhook_accepts(uri: str) -> None:
    spec = parse_spec({"model": {"uri": uri, "architecture": {"preset": "llama-3-8b"}}})
    d = Decision(tensor_parallel=1, pipeline_parallel=1, gpus_per_replica=1, replicas=2, per_replica_concurrency=8)
    assert webhook_errors(_export(spec, d, "llama-3-8b")) == []


def test_a_gpu_resource_kserve_does_not_know_is_declared_for_its_webhook() -> None:
    spec = parse_spec(
        {
            "model": {"uri": "pvc://models/llama-3.1-405b", "architecture": {"preset": "llama-3.1-405b"}},
            "placement": {"gpuResource": "example.com/gpu"},
        }
    )
    isvc = _export(spec, MULTI, "llama-3.1-405b")
    assert isvc["metadata"]["annotations"][kserve.GPU_RESOURCE_TYPES] == '["example.com/gpu"]'
    assert webhook_errors(isvc) == []
    undeclared = copy.deepcopy(isvc)
    del undeclared["metadata"]["annotations"][kserve.GPU_RESOURCE_TYPES]
    assert "model.resources: unknown GPU resource type" in webhook_errors(undeclared)
