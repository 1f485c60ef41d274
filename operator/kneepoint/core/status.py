"""ParallelismExperiment status: observed results, conditions and the decision.

Status is the only place progress lives: a restarted operator rebuilds everything from it.
Dataclasses here serialise to the CRD's camelCase status schema with ``to_json`` and back
with ``from_json`` (``apifields``); ``None`` fields are omitted from the JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kneepoint.core.apifields import api_field, from_json, to_json
from kneepoint.core.rule_names import LAST_TIER, RULES

# Tier phases, in the order a tier normally moves through them.
TIER_PENDING = "Pending"
TIER_SKIPPED = "Skipped"  # not deployed: the estimate says it cannot fit, or the ladder stopped before it
TIER_WAITING = "Waiting"  # waiting for free GPUs in one NVLink domain
TIER_DEPLOYING = "Deploying"
TIER_LOAD_TESTING = "LoadTesting"
TIER_COLLECTING = "Collecting"  # reading Prometheus over the load test's window
TIER_MEASURED = "Measured"
TIER_FAILED = "Failed"
TIER_PREDICTED = "Predicted"  # predict-first: not deployed; the simulator's figures stand in (core/predict_first.py)
TIER_PHASES = (
    TIER_PENDING,
    TIER_SKIPPED,
    TIER_WAITING,
    TIER_DEPLOYING,
    TIER_LOAD_TESTING,
    TIER_COLLECTING,
    TIER_MEASURED,
    TIER_FAILED,
    TIER_PREDICTED,
)

PHASES = ("Pending", "Planning", "Profiling", "Decided", "Failed")

# Where a tier's needed-memory figure takes its KV pool from.
PEAK_MEMORY_FROM_VLLM = "vllm-cache-config"
PEAK_MEMORY_FROM_ESTIMATE = "estimate"
PEAK_MEMORY_SOURCES = (PEAK_MEMORY_FROM_VLLM, PEAK_MEMORY_FROM_ESTIMATE)
CLASSIFICATIONS = ("single-gpu-enough", "does-not-fit", "cannot-keep-up")

# Where decision.perReplicaConcurrency comes from (replicas_cost names the same values).
CONCURRENCY_SOURCES = ("measured", "estimated", "unchecked", "searched")
# Phases of the concurrency search on the decided tier.
SEARCH_PENDING = "Pending"  # waiting for the tier's GPUs (Measure mode)
SEARCH_DEPLOYING = "Deploying"
SEARCH_LOAD_TESTING = "LoadTesting"
SEARCH_FINISHED = "Finished"
SEARCH_PHASES = (SEARCH_PENDING, SEARCH_DEPLOYING, SEARCH_LOAD_TESTING, SEARCH_FINISHED)


@dataclass(frozen=True)
class Condition:
    """A Kubernetes condition (type/status/reason/message/lastTransitionTime/observedGeneration)."""

    type: str = api_field("Condition type: Accepted, Planned, Profiling, Decided, Failed, MetricsAvailable.")
    status: str = api_field("True, False or Unknown.", enum=("True", "False", "Unknown"))
    reason: str = api_field("One CamelCase word.")
    message: str = api_field("A human-readable sentence.")
    last_transition_time: str = api_field("RFC 3339 time the status last changed.")
    observed_generation: int | None = api_field("metadata.generation this condition was computed from.", default=None)


@dataclass(frozen=True)
class TierPrediction:
    """Predict-first: what the simulator predicted for this tier before anything was deployed, with its error band."""

    output_tokens_per_second: float | None = api_field("Predicted output tokens per second.", default=None)
    latency_p99_ms: float | None = api_field("Predicted end-to-end latency P99, ms.", default=None)
    comm_fraction: float | None = api_field("Predicted share of step time in collectives, 0-1.", default=None)
    peak_memory_gi_b: float | None = api_field(
        "Predicted needed peak memory per GPU, GiB (weights + predicted peak KV usage x pool + overhead).",
        default=None,
        json_name="peakMemoryGiB",
    )
    load_test_seconds: float | None = api_field("Predicted seconds of the load test (warm-up and every repeat).", default=None)
    failure: str | None = api_field(
        "Why the tier is predicted to fail without a measurement (its load test would outlast budget.loadTestTimeoutSeconds).",
        default=None,
    )
    start_failure: str | None = api_field(
        "The simulated engine did not start (vLLM's line): such a tier is still deployed, as vLLM's own start check decides fit.",
        default=None,
    )
    throughput_band: float = api_field("Relative error band of the throughput figure (0.05 = +-5 %).", default=0.0)
    p99_band: float = api_field("Relative error band of the P99 figure.", default=0.0)
    scaling_band: float = api_field(
        "Relative error band of this tier's figures over the 1-GPU tier's (the simulator's TP-scaling error; 0 at one "
        "GPU): what a comparison between two predicted tiers can be off by, the 1-GPU calibration cancelling.",
        default=0.0,
    )
    comm_band: float = api_field("Absolute error band of the communication share (0.2 = +-20 points).", default=0.0)
    memory_band: float = api_field("Relative error band of the needed-memory figure.", default=0.0)
    outside_band: str | None = api_field(
        "Set once the tier was measured and a figure fell outside its band (the ladder then fell back to every tier).", default=None
    )
    confirm_only: bool | None = api_field(
        "True when the tier is measured only to confirm the prediction (the predicted winner, or the tier that proves its "
        "stop, with no comparison of it within the bands): with plan.stopRepeatsWhenConfirmed its load test runs no more "
        "repeats after the first whose throughput and P99 lie within their bands. A tier measured to settle a comparison "
        "within the bands runs every repeat.",
        default=None,
    )


@dataclass(frozen=True)
class TierResult:
    """What one tier measured (or why it was not measured). Units are in the field names."""

    tensor_parallel: int = api_field("Tensor-parallel size.")
    pipeline_parallel: int = api_field("Pipeline-parallel size.", default=1)
    gpus: int = api_field("GPUs per replica (tensorParallel x pipelineParallel).", default=1)
    name: str | None = api_field("Tier name, tpN-ppM.", default=None)
    phase: str = api_field(
        "Pending, Skipped, Waiting, Deploying, LoadTesting, Collecting, Measured, Failed or Predicted (predict-first: "
        "not deployed, its measurement could not change the decision; see prediction).",
        default=TIER_PENDING,
    )
    reason: str | None = api_field("Why the tier is in this phase (does-not-fit numbers, failure reason).", default=None)
    does_not_fit: bool | None = api_field("True when the tier was skipped or failed because the model does not fit.", default=None)
    simulated: bool | None = api_field("True when the numbers come from the engine simulator, not GPUs.", default=None)
    output_tokens_per_second: float | None = api_field("Output tokens per second (client side).", default=None)
    total_tokens_per_second: float | None = api_field("Input plus output tokens per second.", default=None)
    requests_per_second: float | None = api_field("Completed requests per second.", default=None)
    ttft_p50_ms: float | None = api_field("Time to first token P50, ms.", default=None)
    ttft_p95_ms: float | None = api_field("Time to first token P95, ms.", default=None)
    ttft_p99_ms: float | None = api_field("Time to first token P99, ms.", default=None)
    tpot_mean_ms: float | None = api_field("Mean time per output token after the first, ms.", default=None)
    latency_p50_ms: float | None = api_field("End-to-end latency P50, ms.", default=None)
    latency_p95_ms: float | None = api_field("End-to-end latency P95, ms.", default=None)
    latency_p99_ms: float | None = api_field("End-to-end latency P99, ms.", default=None)
    error_fraction: float | None = api_field("Failed requests / all requests of the kept repeat.", default=None)
    completed_requests: int | None = api_field("Requests completed in the kept repeat.", default=None)
    repeats_measured: int | None = api_field(
        "Measured repeats the load test ran: load.repeats, or fewer when its first repeat confirmed the prediction "
        "(prediction.confirmOnly).",
        default=None,
    )
    peak_memory_gi_b: float | None = api_field(
        "Needed peak memory per GPU, GiB: weights + KV cache actually used at peak + runtime overhead. The memory rule uses this.",
        default=None,
        json_name="peakMemoryGiB",
    )
    allocated_memory_gi_b: float | None = api_field(
        "Framebuffer used per GPU at peak (DCGM FB_USED), GiB; near gpuMemoryUtilization on every tier because vLLM pre-allocates its KV pool.",
        default=None,
        json_name="allocatedMemoryGiB",
    )
    estimated_memory_gi_b: float | None = api_field(
        "Estimated needed memory per GPU before deploying, GiB.", default=None, json_name="estimatedMemoryGiB"
    )
    gpu_memory_gi_b: float | None = api_field("Memory of one GPU, GiB.", default=None, json_name="gpuMemoryGiB")
    kv_cache_usage_peak: float | None = api_field("Peak vLLM KV-cache usage, fraction 0-1.", default=None)
    kv_cache_pool_tokens: int | None = api_field(
        "Tokens vLLM's KV-cache pool holds, as the engine reported it (vllm:cache_config_info label kv_cache_size_tokens, "
        "else num_gpu_blocks x block_size).",
        default=None,
    )
    kv_cache_pool_gi_b: float | None = api_field(
        "KV-cache pool per GPU, GiB, that peakMemoryGiB is computed with: vLLM's reported pool (kvCachePoolTokens x KV "
        "bytes per token per GPU) when peakMemorySource is vllm-cache-config, else the estimator's.",
        default=None,
        json_name="kvCachePoolGiB",
    )
    estimated_kv_cache_pool_gi_b: float | None = api_field(
        "The estimator's KV-cache pool per GPU, GiB (what vLLM is expected to pre-allocate), beside vLLM's own figure.",
        default=None,
        json_name="estimatedKvCachePoolGiB",
    )
    peak_memory_source: str | None = api_field(
        "Where peakMemoryGiB's KV pool comes from: vllm-cache-config (the engine's vllm:cache_config_info) or estimate "
        "(the memory estimator, when the engine exported no pool size).",
        default=None,
        enum=PEAK_MEMORY_SOURCES,
    )
    preemptions: int | None = api_field("vLLM preemptions during the load test.", default=None)
    gpu_utilization: float | None = api_field("Mean GPU utilisation during the load test, fraction 0-1.", default=None)
    nvlink_bytes_per_second: float | None = api_field("Mean NVLink traffic per GPU, bytes/s.", default=None)
    comm_fraction: float | None = api_field(
        "Share of step time spent in collectives, 0-1: median over the profiled slice's steps of the smallest rank's "
        "collective-kernel time / step time (torch-profiler traces, docs/trace.md).",
        default=None,
    )
    rank_skew_fraction: float | None = api_field(
        "Share of step time ranks spent waiting for each other in collectives, 0-1: median over steps of "
        "(largest - smallest rank's collective time) / step time, from the same traces.",
        default=None,
    )
    pcie_bytes_per_second: float | None = api_field(
        "Mean PCIe traffic per GPU (transmitted + received), bytes/s, from DCGM_FI_PROF_PCIE_TX_BYTES / RX_BYTES.", default=None
    )
    gpu_utilization_spread: float | None = api_field(
        "Largest minus smallest mean GPU utilisation over the tier's GPUs, 0-1 (DCGM per GPU).", default=None
    )
    memory_spread_gi_b: float | None = api_field(
        "Largest minus smallest peak framebuffer use over the tier's GPUs, GiB (DCGM per GPU).",
        default=None,
        json_name="memorySpreadGiB",
    )
    findings: tuple[str, ...] | None = api_field(
        "What the measurements say beyond the stop rules, e.g. that the parallel split is not effective "
        "(the TP group's GPUs differ in utilisation or memory beyond the limit).",
        default=None,
    )
    throughput_gain: float | None = api_field("ΔT against the previous measured tier.", default=None)
    p99_change: float | None = api_field("ΔP (P99 latency) against the previous measured tier.", default=None)
    cost_per_million_tokens: float | None = api_field("GPU cost per million output tokens.", default=None)
    gpu_minutes: float | None = api_field("GPU-minutes this tier held (GPUs x wall minutes from deploy to teardown).", default=None)
    model_load_seconds: float | None = api_field("Seconds from Deployment creation to Ready (model load).", default=None)
    load_test_seconds: float | None = api_field("Seconds the load test ran.", default=None)
    attempts: int | None = api_field("Load-test attempts made.", default=None)
    started_at: str | None = api_field("When the tier was deployed.", default=None)
    load_test_started_at: str | None = api_field("Start of the measured window.", default=None)
    load_test_finished_at: str | None = api_field("End of the measured window.", default=None)
    finished_at: str | None = api_field("When the tier reached Measured, Failed or Skipped.", default=None)
    node_name: str | None = api_field(
        "Node the engine ran on (the leader's node for a multi-node tier), recorded when the capacity check placed it.",
        default=None,
    )
    gpu_product: str | None = api_field(
        "GPU product (node label nvidia.com/gpu.product) of the node the tier was placed on (in Simulate mode: the product "
        "simulated), recorded at placement. Later "
        "passes take the tier's GPU type from it (needed memory, the memory rule), also when the experiment picks its "
        "nodes with placement.nodeSelector instead of placement.gpuProduct.",
        default=None,
    )
    multi_node: bool | None = api_field(
        "True when one replica of this tier spans several nodes: it runs as a LeaderWorkerSet group (TP inside each "
        "pod's node, PP across the group's pods) instead of a Deployment. False for a pipeline-parallel tier that fits "
        "one node.",
        default=None,
    )
    nodes: int | None = api_field(
        "Pods (nodes) of one multi-node replica: the LeaderWorkerSet group size, = pipelineParallel.", default=None
    )
    node_names: tuple[str, ...] | None = api_field("Nodes the multi-node group's pods ran on, leader first.", default=None)
    pods_placed: int | None = api_field(
        "Pods of the multi-node group the scheduler had placed when the tier failed to start (partial scheduling).", default=None
    )
    missing_metrics: tuple[str, ...] | None = api_field("Metrics Prometheus did not return for this tier.", default=None)
    client_limited: bool | None = api_field("True when the load generator, not the server, limited the run.", default=None)
    prediction: TierPrediction | None = api_field(
        "Predict-first (spec.plan.predictFirst): the simulator's figures for this tier and their error bands; a Predicted "
        "tier's comparisons use them.",
        default=None,
    )


@dataclass(frozen=True)
class DecisionBasis:
    """Predict-first: which comparisons of the decision were measured on both sides and which used a predicted tier."""

    measured: tuple[str, ...] = api_field("Comparisons between measured tiers (TP4 -> TP8; TP1 memory), in ladder order.", default=())
    predicted: tuple[str, ...] = api_field(
        "Comparisons that read a predicted tier, with the predicted figure and its band, in ladder order.", default=()
    )
    measured_tiers: tuple[str, ...] = api_field("Tiers measured.", default=())
    predicted_tiers: tuple[str, ...] = api_field("Tiers predicted, not measured.", default=())


@dataclass(frozen=True)
class ConcurrencyPoint:
    """One load test of the concurrency search (or the ladder's own, at the load-test concurrency)."""

    concurrency: int = api_field("Requests in flight at once.")
    output_tokens_per_second: float | None = api_field("Output tokens per second (client side).", default=None)
    ttft_p95_ms: float | None = api_field("Time to first token P95, ms.", default=None)
    latency_p99_ms: float | None = api_field("End-to-end latency P99, ms.", default=None)
    slo_met: bool | None = api_field("Whether every SLO objective set was met (unset when no SLO is set).", default=None)
    source: str = api_field(
        "ladder (the tier's load test at load.concurrency) or search (a short load test of the search).",
        default="search",
        enum=("ladder", "search"),
    )


@dataclass(frozen=True)
class ConcurrencySearch:
    """The concurrency search on the decided tier's engine: where it is, and every point it measured."""

    tier: str = api_field("The tier searched (tpN-ppM).")
    phase: str = api_field("Pending, Deploying, LoadTesting or Finished.", default=SEARCH_PENDING, enum=SEARCH_PHASES)
    objective: str = api_field(
        "slo (the largest concurrency meeting every objective) or knee (no SLO: the throughput knee).",
        default="slo",
        enum=("slo", "knee"),
    )
    max_num_seqs: int = api_field("--max-num-seqs of the search's engine: the highest concurrency searched.", default=1)
    kv_cache_bound: int | None = api_field(
        "Sequences vLLM's KV pool holds at once: kvCachePoolTokens / (inputLen + outputLen).", default=None
    )
    concurrency: int | None = api_field("Concurrency of the load test in progress.", default=None)
    attempt: int | None = api_field("Load-test Job number of the point in progress (the Job is named ...-load<attempt>).", default=None)
    attempts_at_point: int | None = api_field("Attempts made at the point in progress.", default=None)
    points: tuple[ConcurrencyPoint, ...] = api_field("Every point measured, in the order measured.", default=())
    started_at: str | None = api_field("When the search's engine was deployed.", default=None)
    point_started_at: str | None = api_field("When the load test in progress started.", default=None)
    gpu_minutes: float | None = api_field("GPU-minutes the search held (GPUs x wall minutes from deploy to teardown).", default=None)
    result: int | None = api_field(
        "The concurrency found: the largest that met every SLO objective (or the knee); unset when none met.", default=None
    )
    stopped: str | None = api_field("Why the search stopped before its bracket closed (budget, a failure).", default=None)
    explanation: str | None = api_field("How the result was found, with numbers.", default=None)
    ladder_budget_stopped: bool | None = api_field("The ladder itself was ended by the budget (decision rule budget).", default=None)


@dataclass(frozen=True)
class RankedAlternative:
    """One measured tier, sized for the peak at its own per-replica concurrency at the SLO."""

    rank: int = api_field("1 = fewest GPUs for the peak (then cheapest per million output tokens).")
    tier: str = api_field("The tier as a short label (TP2, TP8xPP2).")
    gpus_per_replica: int = api_field("GPUs per replica.")
    per_replica_concurrency: int = api_field("Concurrency one replica serves at the SLO.")
    per_replica_concurrency_source: str = api_field(
        "searched (the concurrency search), measured (met the SLO at the load-test concurrency: a lower bound), "
        "estimated (missed it: scaled down linearly) or unchecked.",
        enum=CONCURRENCY_SOURCES,
    )
    replicas: int = api_field("Replicas for the peak, redundancy included.")
    total_gpus: int = api_field("replicas x gpusPerReplica.")
    output_tokens_per_second: float | None = api_field(
        "Output tokens per second of one replica at that concurrency (measured at the load-test concurrency for tiers not searched).",
        default=None,
    )
    cost_per_million_tokens: float | None = api_field("GPU cost per million output tokens at that throughput.", default=None)
    decided: bool | None = api_field("True for the decided tier.", default=None)


@dataclass(frozen=True)
class Decision:
    """The decided tier, why, and what it means for capacity and cost."""

    tensor_parallel: int = api_field("Decided tensor-parallel size.")
    pipeline_parallel: int = api_field("Decided pipeline-parallel size.", default=1)
    gpus_per_replica: int = api_field("GPUs per replica.", default=1)
    replicas: int = api_field("Replicas for peak concurrency, redundancy included.", default=1)
    rule: str = api_field("The stop rule that decided.", default=LAST_TIER, enum=RULES)
    rules_fired: tuple[str, ...] | None = api_field("Every rule that fired at the deciding step.", default=None)
    reason: str = api_field("The comparison line and conclusion, with numbers.", default="")
    classification: str = api_field("single-gpu-enough, does-not-fit or cannot-keep-up.", default="single-gpu-enough", enum=CLASSIFICATIONS)
    per_replica_concurrency: int | None = api_field("Concurrency one replica serves within the SLO.", default=None)
    per_replica_concurrency_source: str | None = api_field(
        "searched (the concurrency search on the decided tier: the largest concurrency that met every SLO objective, or "
        "the throughput knee without an SLO), measured (the tier met the SLO at the load-test concurrency, or no SLO is "
        "set), estimated (it missed: scaled down by the worst slo/measured ratio) or unchecked (an objective is set but "
        "the tier lacks its figure).",
        default=None,
        enum=CONCURRENCY_SOURCES,
    )
    concurrency_curve: tuple[ConcurrencyPoint, ...] | None = api_field(
        "The decided tier's points of the concurrency search, by concurrency.", default=None
    )
    alternatives: tuple[RankedAlternative, ...] | None = api_field(
        "Every measured tier sized for the peak at its own per-replica concurrency, ranked by total GPUs for the peak (then cost per million tokens).",
        default=None,
    )
    slo_met: bool | None = api_field("Whether the decided tier met the SLO at the load-test concurrency.", default=None)
    cost_per_million_tokens: float | None = api_field("GPU cost per million output tokens at the decided tier.", default=None)
    total_gpus: int | None = api_field("replicas x gpusPerReplica.", default=None)
    unevaluated_rules: tuple[str, ...] | None = api_field("Rules that could not be evaluated (missing metrics).", default=None)
    simulated: bool | None = api_field("True when decided from simulated measurements.", default=None)
    multi_node: bool | None = api_field(
        "True when one replica of the decided tier spans several nodes (LeaderWorkerSet; KServe workerSpec); false for a "
        "pipeline-parallel tier that stays on one node.",
        default=None,
    )
    nodes: int | None = api_field("Nodes one replica of the decided tier spans, when multiNode.", default=None)
    basis: DecisionBasis | None = api_field(
        "Predict-first: the measured comparisons and the neighbouring comparisons that were predicted.", default=None
    )


@dataclass(frozen=True)
class PredictionStatus:
    """Predict-first: the decision the simulator predicted before anything was deployed, and what was measured because of it."""

    predicted_tier: str | None = api_field("The tier the whole ladder on the simulator decided (TP4).", default=None)
    predicted_rule: str | None = api_field("The rule that decided it there.", default=None)
    measure: tuple[str, ...] = api_field("Tiers chosen to be measured, in ladder order.", default=())
    predicted: tuple[str, ...] = api_field("Tiers left predicted (not deployed).", default=())
    band_source: str = api_field("Where the error bands come from.", default="")
    fallback: str | None = api_field(
        "Set when a measurement fell outside its predicted band: every predicted tier was put back to be measured.", default=None
    )


@dataclass(frozen=True)
class Recommendation:
    """Where the KServe recommendation for the decided tier is stored."""

    config_map_name: str = api_field(
        "ConfigMap (same namespace) holding inferenceservice.yaml (or, when the tier cannot be an InferenceService, "
        "leaderworkerset.yaml) and decision.json."
    )
    min_replicas: int = api_field("KServe minReplicas.")
    max_replicas: int = api_field("KServe maxReplicas.")
    scale_metric: str = api_field(
        "What the replicas scale on: concurrency (Knative KPA), vllm:num_requests_running (KEDA, Standard mode) or none "
        "(fixed replicas: multi-node).",
        default="concurrency",
    )
    scale_target: int = api_field("Per-replica concurrency the scaling aims at.", default=1)
    not_exportable: str | None = api_field(
        "Why the decided tier cannot be exported as a KServe InferenceService (unset when it can).", default=None
    )


@dataclass(frozen=True)
class ExperimentStatus:
    """Observed state of a ParallelismExperiment."""

    observed_generation: int | None = api_field("metadata.generation the status reflects.", default=None)
    phase: str = api_field("One-word summary derived from the conditions (for printer columns).", default="Pending", enum=PHASES)
    current_tier: str | None = api_field("Tier being worked on (tpN-ppM).", default=None)
    decided_tier: str | None = api_field("The decided tier as a short label (TP2, TP8xPP2), once Decided.", default=None)
    measured_spec_hash: str | None = api_field(
        "Hash of the measurement-defining spec fields the tiers were measured with; a change restarts the ladder.", default=None
    )
    waiting_for: str | None = api_field("What the experiment waits for (free GPUs, Prometheus), when it waits.", default=None)
    queue_position: int | None = api_field("Position among experiments waiting for GPUs, 1 = next.", default=None)
    waiting_since: str | None = api_field(
        "When the experiment started waiting for GPUs (keeps its queue place across operator restarts).", default=None
    )
    tiers: tuple[TierResult, ...] = api_field("One entry per ladder tier, in ladder order.", default=())
    decision: Decision | None = api_field("The decision, once Decided.", default=None)
    recommendation: Recommendation | None = api_field("The KServe recommendation, once Decided.", default=None)
    concurrency_search: ConcurrencySearch | None = api_field(
        "The concurrency search on the decided tier (spec.capacity.concurrencySearch), while it runs and after.", default=None
    )
    gpu_minutes_total: float | None = api_field("GPU-minutes spent by all tiers and the concurrency search.", default=None)
    simulated: bool | None = api_field("True when mode is Simulate.", default=None)
    prediction: PredictionStatus | None = api_field(
        "Predict-first (spec.plan.predictFirst): the predicted decision, the tiers measured because of it, any fallback.",
        default=None,
    )
    started_at: str | None = api_field("When profiling started.", default=None)
    finished_at: str | None = api_field("When the experiment was Decided or Failed.", default=None)
    message: str | None = api_field("Latest progress line.", default=None)
    conditions: tuple[Condition, ...] = api_field("Latest observations; the source of truth for phase.", default=())

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = to_json(self)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ExperimentStatus:
        status: ExperimentStatus | None = from_json(cls, data or {})
        return status or cls()

    def tier(self, name: str) -> TierResult | None:
        for t in self.tiers:
            if t.name == name:
                return t
        return None

    def with_tier(self, result: TierResult) -> ExperimentStatus:
        """Replace the tier with the same name (or append it)."""
        tiers = list(self.tiers)
        for i, t in enumerate(tiers):
            if t.name == result.name:
                tiers[i] = result
                break
        else:
            tiers.append(result)
        return replace(self, tiers=tuple(tiers))


def set_condition(
    conditions: tuple[Condition, ...],
    type_: str,
    status: str,
    reason: str,
    message: str,
    now: str,
    observed_generation: int | None,
) -> tuple[Condition, ...]:
    """Set one condition, keeping ``lastTransitionTime`` unless its status flips."""
    out = []
    found = False
    for c in conditions:
        if c.type == type_:
            found = True
            ltt = c.last_transition_time if c.status == status else now
            out.append(Condition(type_, status, reason, message, ltt, observed_generation))
        else:
            out.append(c)
    if not found:
        out.append(Condition(type_, status, reason, message, now, observed_generation))
    return tuple(out)


def get_condition(conditions: tuple[Condition, ...], type_: str) -> Condition | None:
    for c in conditions:
        if c.type == type_:
            return c
    return None
