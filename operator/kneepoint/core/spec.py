"""ParallelismExperiment spec: the typed desired state and its parser.

``parse_spec(dict)`` turns the ``spec`` of a ParallelismExperiment (as the API server or
a YAML file gives it) into frozen dataclasses with defaults applied, or raises
:class:`SpecError` listing every problem with its JSON path (``spec.load.inputLen``) and
the allowed values. The same constraints are generated into the CRD's OpenAPI schema
from the field metadata (see ``apifields``), so the API server rejects what this parser
rejects; this parser also serves files that never meet an API server (``kneepoint decide``).
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kneepoint.core import node_labels
from kneepoint.core.apifields import api_field, json_name, type_hints, unwrap_optional

DTYPES = ("bfloat16", "float16", "float32", "fp8", "int8", "int4")
KV_CACHE_DTYPES = ("auto", "fp8")
MODES = ("Measure", "Simulate")
ENDPOINTS = ("Completions", "ChatCompletions")
WINNER_POLICIES = ("Delete", "Keep")
INTERCONNECTS = ("auto", "nvlink", "pcie")
# KServe's names since v0.16 first, then the names KServe <= 0.15 knows (which later versions still parse).
KSERVE_DEPLOYMENT_MODES = ("Standard", "Knative", "RawDeployment", "Serverless")
TP_SIZES = (1, 2, 4, 8, 16, 32, 64)
CHAT_TEMPLATE_ALLOWANCE_TOKENS = 64
"""Room a ChatCompletions load leaves in maxModelLen for the model's chat template, which vLLM adds to the prompt:
Llama-3.1-Instruct's adds about 35 tokens (issue 13); 64 leaves room for other instruct templates. Without it a
prompt near maxModelLen gets its max_tokens clamped by vLLM, and the tier measures a shorter output."""
MODEL_URI_PATTERN = r"^(hf://[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*|pvc://[a-z0-9]([-a-z0-9]*[a-z0-9])?/.*|sim://.+)$"


@dataclass(frozen=True)
class ConfigMapKeyRef:
    """A key in a ConfigMap of the experiment's namespace."""

    name: str = api_field("Name of the ConfigMap.", required=True, max_length=253)
    key: str = api_field("Key holding the document.", default="config.json")


@dataclass(frozen=True)
class SecretKeyRef:
    """A key in a Secret of the experiment's namespace (read by the engine pod only, never by the operator)."""

    name: str = api_field("Name of the Secret.", required=True, max_length=253)
    key: str = api_field("Key inside the Secret.", default="token")


@dataclass(frozen=True)
class ArchitectureSpec:
    """The model's shape, for the memory estimate. One of: a preset, a config.json ConfigMap, or explicit numbers."""

    preset: str | None = api_field(
        "Named architecture preset (for example llama-3-8b, llama-3-70b, llama-3.1-405b, qwen2.5-72b, mixtral-8x7b, deepseek-v3). "
        "See `kneepoint estimate --list-presets`.",
        default=None,
    )
    config_map_ref: ConfigMapKeyRef | None = api_field(
        "A ConfigMap holding the model's Hugging Face config.json (dense Llama/Qwen/Mistral-style or MoE).", default=None
    )
    num_layers: int | None = api_field("Transformer layers (num_hidden_layers).", default=None, minimum=1)
    hidden_size: int | None = api_field("Hidden size.", default=None, minimum=1)
    num_attention_heads: int | None = api_field("Attention heads.", default=None, minimum=1)
    num_key_value_heads: int | None = api_field("Key/value heads (GQA); equals attention heads without GQA.", default=None, minimum=1)
    head_dim: int | None = api_field("Per-head dimension; default hiddenSize / numAttentionHeads.", default=None, minimum=1)
    intermediate_size: int | None = api_field("MLP intermediate size (dense layers).", default=None, minimum=1)
    vocab_size: int | None = api_field("Vocabulary size.", default=None, minimum=1)
    num_experts: int | None = api_field("Routed experts per MoE layer (MoE models only).", default=None, minimum=1)
    num_experts_per_token: int | None = api_field("Experts each token is routed to (MoE only).", default=None, minimum=1)
    moe_intermediate_size: int | None = api_field("Intermediate size of one expert (MoE only).", default=None, minimum=1)
    num_parameters: int | None = api_field(
        "Total parameter count; when given it overrides the count derived from the shape.", default=None, minimum=1
    )


@dataclass(frozen=True)
class ModelSpec:
    """The model under test. Fixed for every tier: same weights, same precision, same context limit."""

    uri: str = api_field(
        "Where the weights come from: hf://org/name (Hugging Face hub) or pvc://claim/path (a PersistentVolumeClaim). "
        "sim://name runs without weights in Simulate mode.",
        required=True,
        pattern=MODEL_URI_PATTERN,
        max_length=512,
    )
    served_name: str | None = api_field(
        "Name the engine serves the model under (vLLM --served-model-name); default: the last segment of uri.", default=None
    )
    dtype: str = api_field(
        "Weight precision, the same on every tier. bfloat16/float16/float32 map to vLLM --dtype; fp8 to --quantization fp8; "
        "int8/int4 expect a pre-quantized checkpoint.",
        default="bfloat16",
        enum=DTYPES,
    )
    kv_cache_dtype: str = api_field("KV-cache precision (vLLM --kv-cache-dtype).", default="auto", enum=KV_CACHE_DTYPES)
    max_model_len: int = api_field("Context limit in tokens (vLLM --max-model-len), the same on every tier.", default=4096, minimum=1)
    architecture: ArchitectureSpec = api_field(
        "The model's shape for the memory estimate (a preset, a config.json ConfigMap or explicit numbers).",
        default_factory=ArchitectureSpec,
    )
    hub_token_secret_ref: SecretKeyRef | None = api_field(
        "Secret with a model-hub token, passed to the engine as HF_TOKEN by secretKeyRef; never copied into status, events or logs.",
        default=None,
    )


@dataclass(frozen=True)
class EnvVar:
    """An environment variable for the engine container (value only; use hubTokenSecretRef for secrets)."""

    name: str = api_field("Variable name.", required=True, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    value: str = api_field("Variable value.", default="")


QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$"


@dataclass(frozen=True)
class ModelCacheSpec:
    """Where the engine keeps downloaded weights (HF_HOME) and vLLM's compile cache (VLLM_CACHE_ROOT), so a restarted
    container neither downloads the weights nor compiles again."""

    claim_name: str | None = api_field(
        "A PersistentVolumeClaim of the experiment's namespace to hold the cache, so it outlives the pod and serves every "
        "tier and experiment after the first download. Multi-node tiers mount it from every pod: it must then be "
        "ReadWriteMany. Default: an emptyDir per pod, which survives container restarts but not the pod.",
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        max_length=253,
    )
    size_limit: str | None = api_field(
        "sizeLimit of the default emptyDir (a Kubernetes quantity, for example 200Gi); the kubelet evicts a pod whose "
        "cache grows past it. Default: none.",
        default=None,
        pattern=QUANTITY_PATTERN,
    )


@dataclass(frozen=True)
class EngineResourcesSpec:
    """CPU, memory and ephemeral-storage requests of each engine pod (the GPUs are requested as placement.gpuResource).
    A field left out is derived from the tier and the model; no limits are set beyond the GPUs."""

    cpu: str | None = api_field(
        "CPU request (a Kubernetes quantity). Default: 2 + the pod's GPUs, vLLM's documented minimum of one core each for "
        "the API server, the engine core and every GPU worker.",
        default=None,
        pattern=QUANTITY_PATTERN,
    )
    memory: str | None = api_field(
        "Memory request. Default: the weights the pod's GPUs hold (vLLM loads them through host memory) + 4 GiB + 2 GiB "
        "per GPU for its processes, rounded up to whole GiB.",
        default=None,
        pattern=QUANTITY_PATTERN,
    )
    ephemeral_storage: str | None = api_field(
        "Ephemeral-storage request. Default: the model's checkpoint size + 10 GiB when the model cache is the default "
        "emptyDir and the weights come from the hub (hf://); 10 GiB otherwise (compile cache and logs).",
        default=None,
        pattern=QUANTITY_PATTERN,
    )


@dataclass(frozen=True)
class EngineSpec:
    """The inference engine (vLLM), fixed for every tier."""

    image: str = api_field("Engine container image.", default="vllm/vllm-openai:v0.33.0")
    gpu_memory_utilization: float = api_field(
        "Fraction of each GPU's memory vLLM may use (--gpu-memory-utilization), in (0, 1].",
        default=0.90,
        minimum=0.0,
        exclusive_minimum=True,
        maximum=1.0,
    )
    max_num_seqs: int | None = api_field(
        "Maximum sequences in one batch (--max-num-seqs); default: load.concurrency, so server and client cap the same concurrency.",
        default=None,
        minimum=1,
    )
    enforce_eager: bool = api_field("Disable CUDA graphs (--enforce-eager).", default=False)
    extra_args: tuple[str, ...] = api_field("Extra vLLM arguments, the same on every tier.", default=())
    env: tuple[EnvVar, ...] = api_field("Extra environment variables for the engine container.", default=())
    port: int = api_field("Port the engine listens on.", default=8000, minimum=1, maximum=65535)
    model_cache: ModelCacheSpec = api_field(
        "The volume for downloaded weights and vLLM's compile cache (HF_HOME, VLLM_CACHE_ROOT).", default_factory=ModelCacheSpec
    )
    resources: EngineResourcesSpec = api_field(
        "CPU, memory and ephemeral-storage requests per engine pod.", default_factory=EngineResourcesSpec
    )
    startup_timeout_seconds: int | None = api_field(
        "How long the engine may take from container start to answering /health (its startupProbe) before the kubelet "
        "restarts the container. Real vLLM 0.24 took 136 s for Llama-3.1-8B on one H200 (29 s of it torch.compile, 57 s "
        "engine init) with weights at hand; a first download of the weights comes on top. Default: "
        "budget.tierTimeoutSeconds + 60, so the kubelet never restarts a start the operator still waits for (the "
        "operator fails the tier at budget.tierTimeoutSeconds). A shorter value restarts a start that hangs (a "
        "restarted container keeps its model cache).",
        default=None,
        minimum=10,
    )


@dataclass(frozen=True)
class TiersSpec:
    """The ladder. Tiers run in order: every tensorParallel size at the smallest pipelineParallel size, then larger
    pipelineParallel sizes at the largest tensorParallel size ("PP where TP stops")."""

    tensor_parallel: tuple[int, ...] = api_field(
        "Tensor-parallel sizes in ladder order; powers of two from 1 to 64, increasing.",
        default=(1, 2, 4, 8),
        min_items=1,
        max_items=7,
        item_enum=TP_SIZES,
    )
    pipeline_parallel: tuple[int, ...] = api_field(
        "Pipeline-parallel sizes, increasing; values above 1 are used only where tensor parallelism alone cannot hold the model.",
        default=(1,),
        min_items=1,
        max_items=8,
        item_minimum=1,
        item_maximum=64,
    )


ADAPTIVE_RELATIVE_PRECISION = 0.05
"""Half of the smallest default stop-rule threshold (maxP99Degradation 0.10): a P99 known to +-5 % tells a 10 %
degradation apart; throughput gets the same bound (minThroughputGain is 0.20). kneepoint loadgen's default too."""
ADAPTIVE_CONFIDENCE = 0.95
ADAPTIVE_MIN_REQUESTS = 100


@dataclass(frozen=True)
class AdaptiveLoadSpec:
    """Adaptive stop of each measured repeat (kneepoint loadgen --adaptive; the method is in docs/loadgen.md)."""

    enabled: bool = api_field(
        "Stop a repeat before numRequests once output throughput and the end-to-end P99 are both known to relativePrecision "
        "at confidence (never more requests than numRequests). Off by default: the distribution-free P99 interval needs "
        "368 completed requests at 95 % confidence, more than the default numRequests of 200.",
        default=False,
    )
    relative_precision: float = api_field(
        "Largest relative half-width of both intervals (throughput: batch means; P99: order statistics).",
        default=ADAPTIVE_RELATIVE_PRECISION,
        minimum=0.0,
        exclusive_minimum=True,
        maximum=0.5,
    )
    confidence: float = api_field("Confidence of both intervals.", default=ADAPTIVE_CONFIDENCE, minimum=0.5, maximum=0.999)
    min_requests: int = api_field("Completed requests a repeat needs before it may stop.", default=ADAPTIVE_MIN_REQUESTS, minimum=1)


@dataclass(frozen=True)
class LoadSpec:
    """The fixed workload every tier is load-tested with (closed loop at fixed concurrency)."""

    concurrency: int = api_field("Requests in flight at once (also the default engine --max-num-seqs).", default=32, minimum=1)
    num_requests: int = api_field("Measured requests per repeat; hundreds are needed for a stable P99.", default=200, minimum=1)
    input_len: int = api_field("Prompt length in tokens.", default=1024, minimum=1)
    output_len: int = api_field("Output length in tokens (forced with max_tokens and ignore_eos).", default=256, minimum=1)
    seed: int = api_field("Seed for the prompts, the same on every tier.", default=1234, minimum=0)
    warmup_requests: int = api_field("Requests sent and discarded before measuring.", default=10, minimum=0)
    repeats: int = api_field("Measured repeats per tier; the most stable one is kept.", default=2, minimum=1, maximum=10)
    endpoint: str = api_field("OpenAI endpoint to load.", default="Completions", enum=ENDPOINTS)
    max_error_fraction: float = api_field(
        "A load test with a larger fraction of failed requests is retried, then the tier fails.", default=0.05, minimum=0.0, maximum=1.0
    )
    max_attempts: int = api_field("Load-test attempts per tier before the tier is Failed.", default=2, minimum=1, maximum=10)
    adaptive: AdaptiveLoadSpec = api_field(
        "Stop each repeat once throughput and P99 are known well enough (at most numRequests).", default_factory=AdaptiveLoadSpec
    )


@dataclass(frozen=True)
class StopRulesSpec:
    """Thresholds of the stop rules (fractions, like vLLM's gpu-memory-utilization)."""

    memory_headroom: float = api_field(
        "TP=1 is enough when one GPU's needed peak memory at the target concurrency is at most this fraction of its capacity.",
        default=0.85,
        minimum=0.0,
        exclusive_minimum=True,
        maximum=1.0,
    )
    min_throughput_gain: float = api_field(
        "Stop adding GPUs when throughput gains less than this fraction from one tier to the next (ΔT).",
        default=0.20,
        minimum=0.0,
        exclusive_minimum=True,
        maximum=1.0,
    )
    max_p99_degradation: float = api_field(
        "Stop when P99 latency worsens by more than this fraction (ΔP) and by more than throughput improved.",
        default=0.10,
        minimum=0.0,
        exclusive_minimum=True,
        maximum=1.0,
    )
    max_comm_fraction: float = api_field(
        "Stop when the share of step time spent in collectives (all-reduce/all-gather) exceeds this fraction.",
        default=0.40,
        minimum=0.0,
        exclusive_minimum=True,
        maximum=1.0,
    )


@dataclass(frozen=True)
class SloSpec:
    """Latency objectives one replica must meet at its per-replica concurrency."""

    ttft_p95_ms: int | None = api_field("Time to first token, 95th percentile, milliseconds.", default=None, minimum=1)
    latency_p99_ms: int | None = api_field("End-to-end request latency, 99th percentile, milliseconds.", default=None, minimum=1)


@dataclass(frozen=True)
class ConcurrencySearchSpec:
    """After the decision: the largest per-replica concurrency the decided tier serves within the SLO, searched."""

    enabled: bool = api_field(
        "Run the concurrency search on the decided tier's engine after the ladder (docs/decision.md, \"Concurrency "
        'search"); off: the per-replica concurrency is the load-test concurrency, or its linear estimate on a miss.',
        default=False,
    )
    tolerance: float = api_field(
        "The search stops when the largest concurrency that met every SLO objective and the smallest that missed one "
        "differ by at most this fraction of the former (and at least 1).",
        default=0.1,
        exclusive_minimum=True,
        minimum=0.0,
        maximum=1.0,
    )
    knee_gain: float = api_field(
        "Without an SLO the search finds the throughput knee: the concurrency past which doubling it gains less than this "
        "fraction of output throughput.",
        default=0.1,
        exclusive_minimum=True,
        minimum=0.0,
        maximum=10.0,
    )
    max_concurrency: int | None = api_field(
        "Highest concurrency the search tries (the search engine's --max-num-seqs); default: vLLM's KV pool / "
        "(inputLen + outputLen), at most 1024.",
        default=None,
        minimum=1,
    )


@dataclass(frozen=True)
class CapacitySpec:
    """How the decided tier turns into a replica count and a cost."""

    peak_concurrency: int | None = api_field(
        "Concurrent requests at peak across all replicas; default: load.concurrency.", default=None, minimum=1
    )
    redundancy_factor: float = api_field(
        "Multiplier for headroom and failures (1.3-1.5 is usual), applied after dividing peak by per-replica concurrency.",
        default=1.3,
        minimum=1.0,
        maximum=10.0,
    )
    slo: SloSpec = api_field("Latency objectives per replica.", default_factory=SloSpec)
    gpu_hourly_cost: float = api_field("Cost of one GPU-hour, in any currency; 0 leaves cost out.", default=0.0, minimum=0.0)
    min_replicas: int = api_field(
        "minReplicas of the KServe recommendation (off-peak floor); maxReplicas is the computed replica count.", default=1, minimum=0
    )
    concurrency_search: ConcurrencySearchSpec = api_field(
        "The per-replica concurrency search on the decided tier.", default_factory=ConcurrencySearchSpec
    )


@dataclass(frozen=True)
class Toleration:
    """A pod toleration (same fields as core/v1 Toleration)."""

    key: str | None = api_field("Taint key.", default=None)
    operator: str | None = api_field("Exists or Equal.", default=None, enum=("Exists", "Equal"))
    value: str | None = api_field("Taint value.", default=None)
    effect: str | None = api_field("Taint effect.", default=None, enum=("NoSchedule", "PreferNoSchedule", "NoExecute"))
    toleration_seconds: int | None = api_field("For NoExecute.", default=None)


@dataclass(frozen=True)
class PlacementSpec:
    """Where engine pods may run."""

    gpu_resource: str = api_field(
        "Extended resource that counts GPUs.", default=node_labels.GPU_RESOURCE, pattern=r"^[a-z0-9.-]+/[a-z0-9.-]+$"
    )
    gpu_product: str | None = api_field(
        "GPU product (GFD label nvidia.com/gpu.product, for example NVIDIA-H200): selects nodes and the GPU for the memory estimate. "
        "Default: the product of the first GPU node found.",
        default=None,
    )
    nvlink_domain_label: str = api_field(
        "Node label whose value names the NVLink domain; a tier's TP group is kept on nodes sharing one value.",
        default=node_labels.NODE_NVLINK_DOMAIN,
    )
    node_selector: dict[str, str] = api_field("Extra node selector for engine pods.", default_factory=dict)
    tolerations: tuple[Toleration, ...] = api_field("Tolerations for engine pods.", default=())
    multi_node_topology_key: str | None = api_field(
        "Node label naming the topology domain (a rack, a network block: for example topology.kubernetes.io/zone) that "
        "holds all pods of one multi-node replica. A tier whose TP x PP exceeds one node runs as a LeaderWorkerSet group "
        "of PP pods; with this key its pods share one value of the label (LWS exclusive-topology annotation) and the "
        "capacity check counts nodes per value. Default: no constraint.",
        default=None,
        pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$",
        max_length=316,
    )


@dataclass(frozen=True)
class MetricsSpec:
    """Where the operator reads DCGM and vLLM metrics."""

    prometheus_url: str | None = api_field(
        "Prometheus base URL; default: the operator's --prometheus-url setting.", default=None, pattern=r"^https?://.+"
    )


@dataclass(frozen=True)
class BudgetSpec:
    """Limits on what the experiment may spend."""

    max_gpu_hours: float | None = api_field(
        "GPU-hour cap for the whole experiment; the ladder stops before a tier that would exceed it.",
        default=None,
        minimum=0.0,
        exclusive_minimum=True,
    )
    tier_timeout_seconds: int = api_field(
        "How long a tier may take to become Ready before it is recorded as failed.", default=1800, minimum=10
    )
    load_test_timeout_seconds: int = api_field("How long one tier's load test may run.", default=3600, minimum=10)


@dataclass(frozen=True)
class CleanupSpec:
    """What happens to engine Deployments after measurement."""

    winner: str = api_field(
        "Delete or Keep the decided tier's Deployment once the experiment is Decided.", default="Delete", enum=WINNER_POLICIES
    )


@dataclass(frozen=True)
class SimulationSpec:
    """Settings for mode Simulate (the engine simulator runs instead of vLLM, CPU only)."""

    image: str | None = api_field("Image with kneepoint (runs `kneepoint sim`); default: the operator's own image.", default=None)
    noise_fraction: float = api_field("Relative noise on simulated step times.", default=0.02, minimum=0.0, maximum=0.5)
    interconnect: str = api_field(
        "Interconnect the simulator models: auto (the GPU product's own link from the catalogue: nvlink for H200, pcie for L40S), nvlink or pcie.",
        default="auto",
        enum=INTERCONNECTS,
    )


@dataclass(frozen=True)
class PlanSpec:
    """How the ladder chooses what to measure."""

    predict_first: bool = api_field(
        "Run the whole ladder on the engine simulator first and measure only the tiers whose measurement could change "
        "the decision (the predicted winner, the tier that proves the stop, a lower tier whose comparison is within the "
        "simulator's error band of a threshold); a measurement outside its band falls back to every tier. Measure mode "
        "only (in Simulate mode the measurement is the simulator). false: measure every tier the ladder reaches.",
        default=True,
    )
    stop_repeats_when_confirmed: bool = api_field(
        "Predict-first: a tier measured only to confirm the prediction (the predicted winner, the tier that proves its "
        "stop) runs no more load-test repeats after the first whose output throughput and P99 lie within the "
        "prediction's bands (the load generator's --expect); a repeat outside a band is followed by the rest, and the "
        "ladder falls back to every tier. A tier whose comparison is within the bands of a threshold always runs "
        "load.repeats. false: every measured tier runs load.repeats.",
        default=True,
    )


@dataclass(frozen=True)
class KServeExportSpec:
    """How the decided tier is exported as a KServe InferenceService."""

    deployment_mode: str = api_field(
        "KServe deployment mode: Standard (plain Deployment; concurrency scaling through KEDA on vllm:num_requests_running) "
        "or Knative (Knative Serving's KPA on concurrency; needs Knative Serving installed). KServe <= 0.15 names them "
        "RawDeployment and Serverless; give those names for such a KServe.",
        default="Standard",
        enum=KSERVE_DEPLOYMENT_MODES,
    )
    service_account_name: str | None = api_field(
        "ServiceAccount of the InferenceService's predictor. KServe's storage initializer reads the hub token from a Secret "
        "listed in this ServiceAccount's secrets, under the key HF_TOKEN; the export also passes model.hubTokenSecretRef "
        "to the server as HF_TOKEN. Default: the namespace's default ServiceAccount.",
        default=None,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        max_length=253,
    )
    prometheus_url: str | None = api_field(
        "Prometheus that KEDA queries in Standard mode; default: metrics.prometheusUrl, then the operator's --prometheus-url.",
        default=None,
        pattern=r"^https?://.+",
    )


@dataclass(frozen=True)
class ExportSpec:
    """What the decision is exported as."""

    kserve: KServeExportSpec = api_field("The KServe InferenceService export.", default_factory=KServeExportSpec)


@dataclass(frozen=True)
class ExperimentSpec:
    """Desired state of a ParallelismExperiment."""

    model: ModelSpec = api_field("The model under test.", required=True)
    mode: str = api_field(
        "Measure deploys vLLM on GPUs; Simulate runs the same ladder with the engine simulator (no GPUs) and marks results simulated.",
        default="Measure",
        enum=MODES,
    )
    engine: EngineSpec = api_field("The engine, fixed for every tier.", default_factory=EngineSpec)
    tiers: TiersSpec = api_field("The TP/PP ladder.", default_factory=TiersSpec)
    load: LoadSpec = api_field("The fixed workload.", default_factory=LoadSpec)
    stop_rules: StopRulesSpec = api_field("Stop-rule thresholds.", default_factory=StopRulesSpec)
    capacity: CapacitySpec = api_field("Replica count and cost.", default_factory=CapacitySpec)
    placement: PlacementSpec = api_field("Node placement.", default_factory=PlacementSpec)
    metrics: MetricsSpec = api_field("Metrics source.", default_factory=MetricsSpec)
    budget: BudgetSpec = api_field("Spending limits.", default_factory=BudgetSpec)
    cleanup: CleanupSpec = api_field("Cleanup policy.", default_factory=CleanupSpec)
    simulation: SimulationSpec = api_field("Simulate-mode settings.", default_factory=SimulationSpec)
    export: ExportSpec = api_field("How the decision is exported (KServe).", default_factory=ExportSpec)
    plan: PlanSpec = api_field("What the ladder measures (predict-first).", default_factory=PlanSpec)

    # Derived values, so callers never re-implement the defaults.
    @property
    def served_model_name(self) -> str:
        if self.model.served_name:
            return self.model.served_name
        return self.model.uri.rstrip("/").rsplit("/", 1)[-1]

    @property
    def max_num_seqs(self) -> int:
        return self.engine.max_num_seqs or self.load.concurrency

    @property
    def peak_concurrency(self) -> int:
        return self.capacity.peak_concurrency or self.load.concurrency


@dataclass(frozen=True)
class FieldError:
    """One problem with the input, located by its JSON path."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


class SpecError(ValueError):
    """The spec is invalid; ``errors`` lists every problem found."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


def _check_scalar(value: Any, tp: Any, path: str, meta: Mapping[str, Any], errors: list[FieldError]) -> Any:
    if tp is bool:
        if not isinstance(value, bool):
            errors.append(FieldError(path, f"must be a boolean (true or false), got {value!r}"))
            return None
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                errors.append(FieldError(path, f"must be an integer, got {value!r}"))
                return None
    elif tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            errors.append(FieldError(path, f"must be a number, got {value!r}"))
            return None
        value = float(value)
    elif tp is str and not isinstance(value, str):
        errors.append(FieldError(path, f"must be a string, got {value!r}"))
        return None
    ok = True
    if meta.get("enum") is not None and value not in meta["enum"]:
        errors.append(FieldError(path, f"must be one of {', '.join(map(str, meta['enum']))}; got {value!r}"))
        ok = False
    if isinstance(value, (int, float)):
        lo, hi = meta.get("minimum"), meta.get("maximum")
        if lo is not None and (value <= lo if meta.get("exclusive_minimum") else value < lo):
            bound = f"greater than {lo}" if meta.get("exclusive_minimum") else f"at least {lo}"
            rng = f" (allowed: {'(' if meta.get('exclusive_minimum') else '['}{lo}, {hi}])" if hi is not None else ""
            errors.append(FieldError(path, f"must be {bound}{rng}; got {value}"))
            ok = False
        elif hi is not None and value > hi:
            errors.append(FieldError(path, f"must be at most {hi}; got {value}"))
            ok = False
    if isinstance(value, str):
        if meta.get("pattern") and not re.match(meta["pattern"], value):
            errors.append(FieldError(path, f"has an invalid format; got {value!r}"))
            ok = False
        if meta.get("max_length") and len(value) > meta["max_length"]:
            errors.append(FieldError(path, f"must be at most {meta['max_length']} characters"))
            ok = False
    return value if ok else None


def _parse(tp: Any, value: Any, path: str, meta: Mapping[str, Any], errors: list[FieldError]) -> Any:
    tp, optional = unwrap_optional(tp)
    if value is None:
        return None
    if dataclasses.is_dataclass(tp):
        return _parse_dataclass(tp, value, path, errors)
    origin = typing.get_origin(tp)
    if origin is tuple:
        item_tp = typing.get_args(tp)[0]
        if not isinstance(value, (list, tuple)):
            errors.append(FieldError(path, f"must be a list, got {value!r}"))
            return None
        if meta.get("min_items") is not None and len(value) < meta["min_items"]:
            errors.append(FieldError(path, f"must have at least {meta['min_items']} item(s)"))
        if meta.get("max_items") is not None and len(value) > meta["max_items"]:
            errors.append(FieldError(path, f"must have at most {meta['max_items']} items"))
        item_meta = {"enum": meta.get("item_enum"), "minimum": meta.get("item_minimum"), "maximum": meta.get("item_maximum")}
        items = [_parse(item_tp, v, f"{path}[{i}]", item_meta, errors) for i, v in enumerate(value)]
        return tuple(items)
    if origin is dict:
        if not isinstance(value, Mapping):
            errors.append(FieldError(path, f"must be a map, got {value!r}"))
            return None
        out = {}
        for k, v in value.items():
            if not isinstance(v, str):
                errors.append(FieldError(f"{path}.{k}", f"must be a string, got {v!r}"))
            else:
                out[str(k)] = v
        return out
    return _check_scalar(value, tp, path, meta, errors)


def _parse_dataclass(cls: Any, data: Any, path: str, errors: list[FieldError]) -> Any:
    if not isinstance(data, Mapping):
        errors.append(FieldError(path, f"must be an object, got {data!r}"))
        return None
    hints = type_hints(cls)
    known = {json_name(f): f for f in dataclasses.fields(cls)}
    for key in data:
        if key not in known:
            errors.append(FieldError(f"{path}.{key}", f"unknown field; allowed: {', '.join(sorted(known))}"))
    kwargs: dict[str, Any] = {}
    for key, f in known.items():
        sub = f"{path}.{key}"
        if key not in data or data[key] is None:
            if f.metadata.get("required"):
                errors.append(FieldError(sub, "is required"))
            continue
        parsed = _parse(hints[f.name], data[key], sub, f.metadata, errors)
        if parsed is not None:
            kwargs[f.name] = parsed
    try:
        return cls(**kwargs)
    except TypeError:
        return None  # a required field was missing; already reported


def _cross_field_checks(spec: ExperimentSpec, errors: list[FieldError]) -> None:
    tp = spec.tiers.tensor_parallel
    if list(tp) != sorted(set(tp)):
        errors.append(FieldError("spec.tiers.tensorParallel", f"must be strictly increasing without repeats; got {list(tp)}"))
    pp = spec.tiers.pipeline_parallel
    if list(pp) != sorted(set(pp)):
        errors.append(FieldError("spec.tiers.pipelineParallel", f"must be strictly increasing without repeats; got {list(pp)}"))
    if spec.load.input_len + spec.load.output_len > spec.model.max_model_len:
        errors.append(
            FieldError(
                "spec.load.inputLen",
                f"load.inputLen + load.outputLen ({spec.load.input_len} + {spec.load.output_len} = "
                f"{spec.load.input_len + spec.load.output_len}) must be at most model.maxModelLen ({spec.model.max_model_len})",
            )
        )
    used = spec.load.input_len + spec.load.output_len
    if spec.load.endpoint == "ChatCompletions" and used <= spec.model.max_model_len < used + CHAT_TEMPLATE_ALLOWANCE_TOKENS:
        errors.append(
            FieldError(
                "spec.load.inputLen",
                f"with load.endpoint ChatCompletions, load.inputLen + load.outputLen ({used}) + {CHAT_TEMPLATE_ALLOWANCE_TOKENS} "
                f"tokens for the chat template must be at most model.maxModelLen ({spec.model.max_model_len}); lower "
                "inputLen or outputLen, or raise maxModelLen",
            )
        )
    arch = spec.model.architecture
    explicit = any(getattr(arch, f.name) is not None for f in dataclasses.fields(arch) if f.name not in ("preset", "config_map_ref"))
    sources = sum([arch.preset is not None, arch.config_map_ref is not None, explicit])
    if sources > 1:
        errors.append(FieldError("spec.model.architecture", "give exactly one of preset, configMapRef or explicit numbers, not several"))
    if explicit and arch.preset is None and arch.config_map_ref is None:
        for name in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size", "intermediate_size"):
            if getattr(arch, name) is None:
                from kneepoint.core.apifields import camel

                errors.append(FieldError(f"spec.model.architecture.{camel(name)}", "is required when the shape is given as numbers"))
    if spec.mode == "Measure" and spec.model.uri.startswith("sim://"):
        errors.append(FieldError("spec.model.uri", "sim:// models exist only in mode Simulate; use hf:// or pvc://"))


def parse_spec(data: Any, path: str = "spec") -> ExperimentSpec:
    """Parse and validate a ParallelismExperiment ``spec``; raise :class:`SpecError` on any problem."""
    errors: list[FieldError] = []
    spec: ExperimentSpec | None = _parse_dataclass(ExperimentSpec, data, path, errors)
    if spec is not None and not errors:
        _cross_field_checks(spec, errors)
    if errors or spec is None:
        raise SpecError(errors or [FieldError(path, "is invalid")])
    return spec
