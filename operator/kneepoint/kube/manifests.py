"""Pure builders for every object the operator creates: plain dicts, no API calls.

Keeping these pure (like KubeSpawner's ``objects.py``) makes them testable against exact
expected YAML and keeps the Kubernetes client confined to ``child_writer``. The owner
reference is passed in explicitly so that every child is garbage-collected with its
experiment.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from typing import Any

from kneepoint.core import node_labels
from kneepoint.core.actions import ConfirmLoad, SearchLoad
from kneepoint.core.apifields import to_json
from kneepoint.core.gpus import find_gpu_type
from kneepoint.core.memory_estimate import weight_bytes_per_gpu
from kneepoint.core.spec import ExperimentSpec
from kneepoint.core.tiers import Tier
from kneepoint.kube import naming

ENGINE_CONTAINER = "engine"
ENGINE_PORT_NAME = "http"
LOADGEN_CONTAINER = "loadgen"
MODELS_MOUNT = "/models"
TRACE_CONTAINER = "trace"
TRACE_PORT = 9464
PROFILES_VOLUME = "profiles"
PROFILES_DIR = "/var/run/kneepoint/profiles"
PROFILE_MAX_ITERATIONS = 64
"""Engine steps one profiled slice records at most: vLLM stalls while writing them (docs/trace.md)."""
PROFILE_SECONDS = 10.0
"""Upper bound of the profiled slice (loadgen --profile-seconds); the engine stops by itself after
PROFILE_MAX_ITERATIONS steps, which is what normally ends it. A slice of a few seconds catches only
the prefill burst at the start of a closed-loop wave (7 steps of 261 ms for the PCIe example)."""


@dataclass(frozen=True)
class Owner:
    """The experiment that owns a child (for ownerReferences and labels)."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        return {
            "apiVersion": naming.API_VERSION,
            "kind": naming.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


@dataclass(frozen=True)
class BuildContext:
    """Operator-wide settings the builders need (images, defaults)."""

    operator_image: str = "ghcr.io/kneepoint/kneepoint:0.1.0"
    """Image with the kneepoint package: runs load tests and the simulator."""
    architecture_json: str | None = None
    """The resolved model architecture (preset name or JSON), passed to simulators."""
    gpu_product: str | None = None
    """GPU product label the experiment runs on (node selector, and the simulator's --gpu)."""
    gpu_product_label: tuple[str, str] | None = None
    """The node label (key, value) the capacity check matched gpu_product by; default (nvidia.com/gpu.product, gpu_product)."""
    require_nvlink: bool = True
    """Whether TP groups must sit inside one NVLink domain (False on PCIe-only fleets)."""
    architecture: Any = None
    """The resolved ModelArchitecture (sizes the engine's memory and ephemeral-storage requests); None: not known."""


def model_reference(spec: ExperimentSpec) -> str:
    """What vLLM's --model receives: an org/name hub id, or a path under the PVC mount."""
    uri = spec.model.uri
    if uri.startswith("hf://"):
        return uri[len("hf://") :]
    if uri.startswith("pvc://"):
        _claim, _, path = uri[len("pvc://") :].partition("/")
        return f"{MODELS_MOUNT}/{path}".rstrip("/")
    return uri[len("sim://") :] if uri.startswith("sim://") else uri


def vllm_args(spec: ExperimentSpec, tier: Tier, max_num_seqs: int | None = None) -> list[str]:
    """``vllm serve``'s arguments: the model as its positional argument (``--model`` is deprecated), then the
    flags; only TP/PP differ between tiers. Every flag is one vLLM 0.33's parser accepts
    (tests/data/vllm/vllm-0.33.0-serve-flags.json)."""
    args = [
        model_reference(spec),
        "--served-model-name",
        spec.served_model_name,
        "--tensor-parallel-size",
        str(tier.tensor_parallel),
        "--pipeline-parallel-size",
        str(tier.pipeline_parallel),
        "--max-num-seqs",
        str(max_num_seqs or spec.max_num_seqs),
        "--max-model-len",
        str(spec.model.max_model_len),
        "--gpu-memory-utilization",
        f"{spec.engine.gpu_memory_utilization:g}",
        "--host",
        "0.0.0.0",
        "--port",
        str(spec.engine.port),
    ]
    dtype = spec.model.dtype
    if dtype in ("bfloat16", "float16", "float32"):
        args += ["--dtype", dtype]
    elif dtype == "fp8":
        args += ["--quantization", "fp8"]
    # int8/int4: a pre-quantized checkpoint carries its own quantization config.
    if spec.model.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", spec.model.kv_cache_dtype]
    if spec.engine.enforce_eager:
        args.append("--enforce-eager")
    args += list(spec.engine.extra_args)
    return args


def _engine_env(spec: ExperimentSpec, ctx: BuildContext) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "CONTAINER_NAME", "value": ENGINE_CONTAINER},
    ]
    if ctx.architecture_json:
        env.append({"name": "KNEEPOINT_SIM_ARCHITECTURE", "value": ctx.architecture_json})
    secret = spec.model.hub_token_secret_ref
    if secret is not None:
        # The token reaches the engine by reference only; the operator never reads it.
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": secret.name, "key": secret.key}}})
    env += [{"name": e.name, "value": e.value} for e in spec.engine.env]
    return env


# -- The engine pod as vLLM needs it: a model cache, resource requests, a start-up allowance.

MODEL_CACHE_VOLUME = "model-cache"
MODEL_CACHE_MOUNT = "/model-cache"
HF_HOME_PATH = f"{MODEL_CACHE_MOUNT}/huggingface"
"""HF_HOME: the hub's download cache (weights, tokenizer, config)."""
VLLM_CACHE_PATH = f"{MODEL_CACHE_MOUNT}/vllm"
"""VLLM_CACHE_ROOT: vLLM's torch.compile cache (the 8B capture: 29 s of compiling that a restart skips)."""
GIB = 1024**3
PROCESS_MEMORY_BYTES = 4 * GIB
"""Host memory of vLLM's API server and engine core outside the weights: an allowance, not a measurement."""
PER_GPU_MEMORY_BYTES = 2 * GIB
"""Host memory of each GPU worker's CUDA/torch runtime: an allowance, not a measurement."""
SCRATCH_STORAGE_BYTES = 10 * GIB
"""Ephemeral storage besides downloaded weights: compile cache, logs (an allowance)."""
STARTUP_PROBE_PERIOD_SECONDS = 10
STARTUP_MARGIN_SECONDS = 60
"""The default allowance outlasts the operator's own deadline (budget.tierTimeoutSeconds) by this much, so the
kubelet never restarts a start the operator still waits for; the operator fails the tier first."""


def model_cache(spec: ExperimentSpec) -> tuple[dict[str, Any], dict[str, Any], list[dict[str, Any]]]:
    """(volume, mount, env) of the engine's model cache: a PVC when engine.modelCache.claimName is set, else an emptyDir
    (it survives container restarts, so a restarted engine neither downloads nor compiles again)."""
    cache = spec.engine.model_cache
    if cache.claim_name:
        volume: dict[str, Any] = {"name": MODEL_CACHE_VOLUME, "persistentVolumeClaim": {"claimName": cache.claim_name}}
    else:
        volume = {"name": MODEL_CACHE_VOLUME, "emptyDir": {"sizeLimit": cache.size_limit} if cache.size_limit else {}}
    mount = {"name": MODEL_CACHE_VOLUME, "mountPath": MODEL_CACHE_MOUNT}
    env = [{"name": "HF_HOME", "value": HF_HOME_PATH}, {"name": "VLLM_CACHE_ROOT", "value": VLLM_CACHE_PATH}]
    return volume, mount, env


def _gib_quantity(value: int) -> str:
    return f"{max(1, math.ceil(value / GIB))}Gi"


def engine_resource_requests(spec: ExperimentSpec, tier: Tier, ctx: BuildContext, gpus_in_pod: int) -> dict[str, str]:
    """cpu, memory and ephemeral-storage requests of one engine pod (not the GPUs): engine.resources, else derived.

    cpu: 2 + GPUs (vLLM's docs/configuration/optimization.md: one API server, one engine core and one worker per
    GPU need at least 2 + N physical cores). memory: the weights the pod's GPUs hold, which vLLM loads through host
    memory, plus the process allowances. ephemeral-storage: the whole checkpoint when it is downloaded into the
    default emptyDir cache (every pod downloads all of it), plus scratch.
    """
    wanted = spec.engine.resources
    arch = ctx.architecture
    pod_weights = weight_bytes_per_gpu(arch, tier, spec.model.dtype) * gpus_in_pod if arch is not None else 0
    checkpoint = weight_bytes_per_gpu(arch, Tier(1, 1), spec.model.dtype) if arch is not None else 0
    downloads = spec.model.uri.startswith("hf://") and not spec.engine.model_cache.claim_name
    derived = engine_host_resources(gpus_in_pod, pod_weights, checkpoint if downloads else 0)
    return {
        "cpu": wanted.cpu or derived["cpu"],
        "memory": wanted.memory or derived["memory"],
        "ephemeral-storage": wanted.ephemeral_storage or derived["ephemeral-storage"],
    }


def engine_host_resources(gpus_in_pod: int, pod_weight_bytes: int, downloaded_bytes: int) -> dict[str, str]:
    """The one sizing of an engine pod's host resources, for the operator's engines and the KServe export alike.

    cpu 2 + GPUs; memory = the weights the pod loads (through host memory) + the process allowances; ephemeral
    storage = what is downloaded into the pod + scratch.
    """
    return {
        "cpu": str(2 + gpus_in_pod),
        "memory": _gib_quantity(pod_weight_bytes + PROCESS_MEMORY_BYTES + PER_GPU_MEMORY_BYTES * gpus_in_pod),
        "ephemeral-storage": _gib_quantity(downloaded_bytes + SCRATCH_STORAGE_BYTES),
    }


def engine_startup_probe(spec: ExperimentSpec) -> dict[str, Any]:
    """The start-up allowance: /health polled every 10 s for engine.startupTimeoutSeconds (default the tier timeout
    + 60 s) before the kubelet restarts the container. No liveness probe follows: a restart in the middle of a load
    test would spoil the measurement, and a dead vLLM engine exits by itself."""
    seconds = spec.engine.startup_timeout_seconds or spec.budget.tier_timeout_seconds + STARTUP_MARGIN_SECONDS
    return {
        "httpGet": {"path": "/health", "port": ENGINE_PORT_NAME},
        "periodSeconds": STARTUP_PROBE_PERIOD_SECONDS,
        "failureThreshold": max(1, math.ceil(seconds / STARTUP_PROBE_PERIOD_SECONDS)),
        "timeoutSeconds": 5,
    }


def _with_model_cache(spec: ExperimentSpec, container: dict[str, Any], volumes: list[dict[str, Any]]) -> None:
    """Mount the model cache into a Measure-mode engine container and point HF_HOME / VLLM_CACHE_ROOT at it."""
    volume, mount, env = model_cache(spec)
    volumes.append(volume)
    container["volumeMounts"].append(mount)
    taken = {e["name"] for e in container["env"]}
    container["env"] = [e for e in env if e["name"] not in taken] + container["env"]  # engine.env wins


def _with_resource_requests(spec: ExperimentSpec, tier: Tier, ctx: BuildContext, container: dict[str, Any], gpus_in_pod: int) -> None:
    """Add cpu, memory and ephemeral-storage requests for ``gpus_in_pod`` GPUs to the container's (GPU) resources."""
    container.setdefault("resources", {}).setdefault("requests", {}).update(engine_resource_requests(spec, tier, ctx, gpus_in_pod))


def _node_affinity(tier: Tier, ctx: BuildContext, preferred_node: str | None) -> dict[str, Any] | None:
    required = []
    if ctx.require_nvlink and tier.tensor_parallel > 1:
        # The TP group must sit inside one NVLink domain at least TP GPUs large.
        required.append({"key": node_labels.NODE_NVLINK_DOMAIN_SIZE, "operator": "Gt", "values": [str(tier.tensor_parallel - 1)]})
    affinity: dict[str, Any] = {}
    if required:
        affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": [{"matchExpressions": required}]}
    if preferred_node:
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [
            {
                "weight": 100,
                "preference": {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [preferred_node]}]},
            }
        ]
    return {"nodeAffinity": affinity} if affinity else None


def profiler_config() -> str:
    """vLLM's --profiler-config for the profiled slice (vllm/config/profiler.py fields).

    No Python stacks and no front-end profiling (both only add overhead); at most
    PROFILE_MAX_ITERATIONS steps, which bounds the trace size and the stall at stop.
    """
    return json.dumps(
        {
            "profiler": "torch",
            "torch_profiler_dir": PROFILES_DIR,
            "torch_profiler_with_stack": False,
            "ignore_frontend": True,
            "max_iterations": PROFILE_MAX_ITERATIONS,
        },
        separators=(",", ":"),
    )


def profiles_volume() -> dict[str, Any]:
    # Traces of one slice are a few MB per rank; the sidecar deletes what it has read.
    return {"name": PROFILES_VOLUME, "emptyDir": {"sizeLimit": "2Gi"}}


def add_profiler(engine: dict[str, Any]) -> None:
    """The engine writes its traces into the shared emptyDir (vLLM and the simulator alike)."""
    engine["args"] = [*engine["args"], "--profiler-config", profiler_config()]
    engine["volumeMounts"].append({"name": PROFILES_VOLUME, "mountPath": PROFILES_DIR})


def trace_sidecar(ctx: BuildContext) -> dict[str, Any]:
    """The trace reader next to the engine: reads each slice's traces, serves the gauges (docs/trace.md)."""
    return {
        "name": TRACE_CONTAINER,
        "image": ctx.operator_image,
        "command": ["kneepoint", "trace"],
        "args": ["--watch", PROFILES_DIR, "--serve-metrics", f"$(POD_IP):{TRACE_PORT}"],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "ports": [{"name": naming.TRACE_PORT_NAME, "containerPort": TRACE_PORT, "protocol": "TCP"}],
        "volumeMounts": [{"name": PROFILES_VOLUME, "mountPath": PROFILES_DIR}],
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "512Mi"}},
        "securityContext": _restricted_security_context(),
    }


def without_profiler(pod_spec: dict[str, Any]) -> None:
    """A multi-node group is not profiled: the sidecar would see only its own pod's ranks."""
    pod_spec["containers"] = [c for c in pod_spec["containers"] if c["name"] != TRACE_CONTAINER]
    pod_spec["volumes"] = [v for v in pod_spec["volumes"] if v["name"] != PROFILES_VOLUME]
    for c in pod_spec["containers"]:
        c["volumeMounts"] = [m for m in c.get("volumeMounts", []) if m["name"] != PROFILES_VOLUME]


def build_engine_deployment(
    spec: ExperimentSpec,
    owner: Owner,
    tier: Tier,
    ctx: BuildContext,
    preferred_node: str | None = None,
    interconnect: str | None = None,
    max_num_seqs: int | None = None,
) -> dict[str, Any]:
    """The tier's engine: vLLM on TP x PP GPUs of one node (Measure) or the simulator on CPU (Simulate).

    ``max_num_seqs``: the concurrency search's engine (above load.concurrency); else the spec's."""
    name = naming.engine_name(owner.name, tier)
    labels = naming.child_labels(owner.name, tier, naming.ROLE_ENGINE)
    simulate = spec.mode == "Simulate"
    gpus = tier.gpus
    container: dict[str, Any] = {
        "name": ENGINE_CONTAINER,
        "ports": [{"name": ENGINE_PORT_NAME, "containerPort": spec.engine.port, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": "/health", "port": ENGINE_PORT_NAME},
            "periodSeconds": 5,
            "failureThreshold": 3,
            "timeoutSeconds": 3,
        },
        "startupProbe": engine_startup_probe(spec),
        "env": _engine_env(spec, ctx),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
        # vLLM writes no termination message: on a failed exit the kubelet then puts the log
        # tail there, which is how an out-of-memory start (the kernel's OOM killer is not
        # involved: reason Error) or a crash loop's cause reaches the tier's reason.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}, profiles_volume()]
    if simulate:
        sim_args = vllm_args(spec, tier, max_num_seqs) + ["--noise", f"{spec.simulation.noise_fraction:g}"]
        if ctx.gpu_product:
            sim_args += ["--gpu", ctx.gpu_product]
        chosen = spec.simulation.interconnect if spec.simulation.interconnect != "auto" else interconnect
        if chosen is None and ctx.gpu_product:
            # A simulated tier holds no GPU and may run on any node, whose labels must not
            # decide what is simulated: "auto" is then the product's own link (catalogue).
            gpu_type = find_gpu_type(ctx.gpu_product)
            chosen = gpu_type.interconnect if gpu_type else None
        if chosen in ("nvlink", "pcie"):
            sim_args += ["--interconnect", chosen]
        container.update(
            {
                "image": spec.simulation.image or ctx.operator_image,
                "command": ["kneepoint", "sim"],
                "args": sim_args,
                "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}, "limits": {"memory": "1Gi"}},
                "securityContext": _restricted_security_context(),
            }
        )
    else:
        container.update(
            {
                "image": spec.engine.image,
                "args": vllm_args(spec, tier, max_num_seqs),
                "resources": {
                    "requests": {spec.placement.gpu_resource: str(gpus)},
                    "limits": {spec.placement.gpu_resource: str(gpus)},
                },
            }
        )
    add_profiler(container)
    if spec.model.uri.startswith("pvc://"):
        claim = spec.model.uri[len("pvc://") :].partition("/")[0]
        volumes.append({"name": "models", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}})
        container["volumeMounts"].append({"name": "models", "mountPath": MODELS_MOUNT, "readOnly": True})
    if not simulate:
        _with_model_cache(spec, container, volumes)
        _with_resource_requests(spec, tier, ctx, container, gpus)

    pod_spec: dict[str, Any] = {
        "containers": [container, trace_sidecar(ctx)],
        "volumes": volumes,
        "terminationGracePeriodSeconds": 30,
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
    }
    if not simulate:
        selector = dict(spec.placement.node_selector)
        if ctx.gpu_product_label:
            selector.setdefault(*ctx.gpu_product_label)
        elif ctx.gpu_product:
            selector.setdefault(node_labels.NODE_GPU_PRODUCT, ctx.gpu_product)
        if selector:
            pod_spec["nodeSelector"] = selector
        affinity = _node_affinity(tier, ctx, preferred_node)
        if affinity:
            pod_spec["affinity"] = affinity
    tolerations = [to_json(t) for t in spec.placement.tolerations]
    if tolerations:
        pod_spec["tolerations"] = tolerations

    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": owner.namespace,
            "labels": labels,
            "ownerReferences": [owner.reference()],
            "annotations": {"kneepoint.io/mode": spec.mode},
        },
        "spec": {
            "replicas": 1,
            # Recreate: never two engines of one tier at once (they would share GPUs and metrics).
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(spec.engine.port),
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": pod_spec,
            },
        },
    }


# vLLM's multi-node launch with its multiprocessing backend: one `vllm serve` per node, the
# same flags on every node plus --nnodes/--node-rank/--master-addr; the other nodes run
# --headless (no API server). It needs no Ray cluster and no shell script.
MULTI_NODE_MASTER_PORT = 29500


def multi_node_args(tier: Tier, node_rank: str, headless: bool) -> list[str]:
    """The flags that make one ``vllm serve`` a rank of a PP-across-nodes replica.

    ``node_rank`` is ``0`` on the leader and ``$(LWS_WORKER_INDEX)`` on workers; the kubelet
    expands ``$(LWS_LEADER_ADDRESS)`` and ``$(LWS_WORKER_INDEX)``, which the LeaderWorkerSet
    webhook puts first in every container's env.
    """
    args = [
        "--distributed-executor-backend",
        "mp",
        "--nnodes",
        str(tier.pipeline_parallel),
        "--node-rank",
        node_rank,
        "--master-addr",
        "$(LWS_LEADER_ADDRESS)",
        "--master-port",
        str(MULTI_NODE_MASTER_PORT),
    ]
    if headless:
        args.append("--headless")
    return args


def build_engine_leader_worker_set(
    spec: ExperimentSpec,
    owner: Owner,
    tier: Tier,
    ctx: BuildContext,
    topology_key: str | None = None,
) -> dict[str, Any]:
    """A multi-node tier's engine: a LeaderWorkerSet of one group of PP pods, TP GPUs each.

    TP stays inside each pod's node (its NVLink domain), PP crosses the pods: the leader
    (node rank 0) serves the OpenAI API and metrics; the workers run ``--headless``. The
    pods are the Deployment's pod, GPUs per pod = TP. LWS creates the group and restarts it
    as a whole (RecreateGroupOnPodRestart). A headless Service per group
    (``subdomainPolicy: UniquePerReplica``) keeps ``LWS_LEADER_ADDRESS`` resolvable without
    clashing with the client Service, which has the LeaderWorkerSet's own name. With
    ``topology_key`` every pod of the group lands in one domain of that node label
    (LWS's exclusive-topology annotation, one group per domain).
    """
    if spec.mode == "Simulate":
        raise ValueError("a LeaderWorkerSet is built for Measure mode only; Simulate runs one simulator per tier")
    deployment = build_engine_deployment(spec, owner, tier, ctx)
    labels = naming.child_labels(owner.name, tier, naming.ROLE_ENGINE)
    template = deployment["spec"]["template"]
    without_profiler(template["spec"])
    gpus = str(tier.tensor_parallel)
    template["spec"]["containers"][0]["resources"] = {
        "requests": {spec.placement.gpu_resource: gpus},
        "limits": {spec.placement.gpu_resource: gpus},
    }
    base_args = vllm_args(spec, tier)
    # cpu, memory and ephemeral storage for one pod of the group: TP GPUs and their weights.
    _with_resource_requests(spec, tier, ctx, template["spec"]["containers"][0], tier.tensor_parallel)

    leader = copy.deepcopy(template)
    leader["metadata"]["labels"] = {**labels, naming.LABEL_GROUP_ROLE: naming.GROUP_LEADER}
    leader["spec"]["containers"][0]["args"] = base_args + multi_node_args(tier, "0", headless=False)

    worker = copy.deepcopy(template)
    worker["metadata"] = {"labels": {**labels, naming.LABEL_GROUP_ROLE: naming.GROUP_WORKER}}
    container = worker["spec"]["containers"][0]
    container["args"] = base_args + multi_node_args(tier, "$(LWS_WORKER_INDEX)", headless=True)
    # A headless rank serves neither the API nor /metrics: no port, no readiness or start-up probe.
    container.pop("ports", None)
    container.pop("readinessProbe", None)
    container.pop("startupProbe", None)

    annotations = {"kneepoint.io/mode": spec.mode}
    if topology_key:
        annotations[naming.LWS_EXCLUSIVE_TOPOLOGY] = topology_key
    return {
        "apiVersion": naming.LWS_API_VERSION,
        "kind": naming.LWS_KIND,
        "metadata": {
            "name": naming.engine_name(owner.name, tier),
            "namespace": owner.namespace,
            "labels": labels,
            "ownerReferences": [owner.reference()],
            "annotations": annotations,
        },
        "spec": {
            "replicas": 1,
            "startupPolicy": "LeaderCreated",
            "networkConfig": {"subdomainPolicy": "UniquePerReplica"},
            "leaderWorkerTemplate": {
                "size": tier.pipeline_parallel,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader,
                "workerTemplate": worker,
            },
        },
    }


def build_engine_service(spec: ExperimentSpec, owner: Owner, tier: Tier, leader_only: bool = False) -> dict[str, Any]:
    """Headless Service in front of the tier's engine pod; the load generator targets its DNS name.

    Headless (``clusterIP: None``): the name resolves to the Ready engine pod itself, which is all
    a load test needs, and no cluster IP is allocated, nor a kube-proxy rule written on every node,
    for an engine that lives minutes. Allocating cluster IPs was the slowest write of a burst of
    experiments (benchmarks/operator_scale.py: 5.6 s per Service create on average against 0.14 s
    per Deployment, 100 experiments at once; docs/performance.md). The engine listens on the
    Service's port (``containerPort`` = ``spec.engine.port``), so the URL is the same.

    ``leader_only`` (multi-node tiers): select the group's leader, the only pod that serves.
    """
    labels = naming.child_labels(owner.name, tier, naming.ROLE_ENGINE)
    selector = {**labels, naming.LABEL_GROUP_ROLE: naming.GROUP_LEADER} if leader_only else labels
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": naming.engine_name(owner.name, tier),
            "namespace": owner.namespace,
            "labels": labels,
            "ownerReferences": [owner.reference()],
        },
        "spec": {
            "type": "ClusterIP",
            "clusterIP": "None",
            "selector": selector,
            "ports": [{"name": ENGINE_PORT_NAME, "port": spec.engine.port, "targetPort": ENGINE_PORT_NAME, "protocol": "TCP"}],
        },
    }


def _restricted_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def loadgen_args(
    spec: ExperimentSpec, owner: Owner, tier: Tier, search: SearchLoad | None = None, confirm: ConfirmLoad | None = None
) -> list[str]:
    """The load generator's flags: the same workload for every tier (only the endpoint differs).

    ``search``: a point of the concurrency search: its concurrency and request count, one repeat, no profiled slice.
    ``confirm``: predict-first's figures for a tier measured only to confirm them (``--expect``)."""
    args = [
        "--endpoint",
        f"http://{naming.service_host(owner.name, tier, owner.namespace)}:{spec.engine.port}",
        "--model",
        spec.served_model_name,
        "--api",
        "chat" if spec.load.endpoint == "ChatCompletions" else "completions",
        "--concurrency",
        str(search.concurrency if search else spec.load.concurrency),
        "--num-requests",
        str(search.num_requests if search else spec.load.num_requests),
        "--input-len",
        str(spec.load.input_len),
        "--output-len",
        str(spec.load.output_len),
        "--seed",
        str(spec.load.seed),
        "--warmup-requests",
        str(spec.load.warmup_requests),
        "--repeats",
        str(1 if search else spec.load.repeats),
        "--max-error-fraction",
        "1.0",  # the operator judges the error fraction itself (load.maxErrorFraction), with retries
        "--no-progress",
        *adaptive_args(spec),
    ]
    if confirm is not None and not search:
        args += expect_args(confirm)
    return args if search else args + profile_args(tier)


def expect_args(confirm: ConfirmLoad) -> list[str]:
    """``kneepoint loadgen --expect KEY=VALUE:BAND`` (loadgen/expectation.py) for each predicted figure: no more repeats
    after one that confirms them all."""
    out: list[str] = []
    for key, value, band in confirm.figures():
        out += ["--expect", f"{key}={value:g}:{band:g}"]
    return out


def adaptive_args(spec: ExperimentSpec) -> list[str]:
    """spec.load.adaptive as the load generator's flags (none when off: every repeat sends numRequests)."""
    adaptive = spec.load.adaptive
    if not adaptive.enabled:
        return []
    return [
        "--adaptive",
        "--adaptive-precision",
        f"{adaptive.relative_precision:g}",
        "--adaptive-confidence",
        f"{adaptive.confidence:g}",
        "--adaptive-min-requests",
        str(adaptive.min_requests),
    ]


def profile_args(tier: Tier) -> list[str]:
    """The load test's profiled slice, after the measured repeats. A multi-node tier's engine
    (LeaderWorkerSet) has no profiler: its /start_profile answers 404, the load generator says
    so and the measured figures stand."""
    return ["--profile-seconds", f"{PROFILE_SECONDS:g}"]


def build_load_test_job(
    spec: ExperimentSpec,
    owner: Owner,
    tier: Tier,
    attempt: int,
    ctx: BuildContext,
    search: SearchLoad | None = None,
    confirm: ConfirmLoad | None = None,
) -> dict[str, Any]:
    """One load-test attempt: a Job whose pod writes its summary to the termination message."""
    labels = naming.child_labels(owner.name, tier, naming.ROLE_LOADTEST)
    labels[naming.LABEL_ATTEMPT] = str(attempt)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": naming.load_test_name(owner.name, tier, attempt),
            "namespace": owner.namespace,
            "labels": labels,
            "ownerReferences": [owner.reference()],
        },
        "spec": {
            # Retries are the operator's (load.maxAttempts), each a new Job, so each attempt's
            # summary stays readable.
            "backoffLimit": 0,
            "activeDeadlineSeconds": spec.budget.load_test_timeout_seconds,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "containers": [
                        {
                            "name": LOADGEN_CONTAINER,
                            "image": ctx.operator_image,
                            "command": ["kneepoint", "loadgen"],
                            "args": loadgen_args(spec, owner, tier, search, confirm),
                            "terminationMessagePath": "/dev/termination-log",
                            "terminationMessagePolicy": "File",
                            "resources": {"requests": {"cpu": "1", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
                            "securityContext": _restricted_security_context(),
                        }
                    ],
                },
            },
        },
    }
