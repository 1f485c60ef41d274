"""What the adapters report to the ladder: children, fleet capacity, load-test summaries, metrics.

These are plain values. The reconciler reads Kubernetes and Prometheus, fills them in and
hands them to :func:`kneepoint.core.ladder.reconcile_step`, which never does I/O itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kneepoint.core.prediction import LadderPrediction

# Why an engine could not start, as read from pods and events.
START_UNSCHEDULABLE = "Unschedulable"
START_OUT_OF_MEMORY = "OutOfMemory"
START_CRASH_LOOP = "CrashLoopBackOff"
START_IMAGE_PULL = "ImagePullBackOff"
START_CONFIG_ERROR = "CreateContainerConfigError"


@dataclass(frozen=True)
class DomainCapacity:
    """GPUs of one node's largest NVLink domain (or the whole node on PCIe fleets)."""

    node_name: str
    gpu_product: str
    gpus_total: int
    """GPUs on the node (allocatable)."""
    gpus_free: int
    """Allocatable minus what non-terminated pods request."""
    nvlink_domain: str | None
    nvlink_domain_size: int
    interconnect: str
    """nvlink, pcie or mixed (node label kneepoint.io/interconnect)."""
    topology_domain: str | None = None
    """Value of the spec's multi-node topology label on this node (None: no key asked, or the node lacks it)."""


@dataclass(frozen=True)
class FleetView:
    """The GPU nodes that match the experiment's placement (where a tier fits: :mod:`kneepoint.core.placement`)."""

    domains: tuple[DomainCapacity, ...] = ()

    def products(self) -> tuple[str, ...]:
        return tuple(sorted({d.gpu_product for d in self.domains}))

    def max_gpus_per_node(self) -> int:
        return max((d.gpus_total for d in self.domains), default=0)

    def has_nvlink(self) -> bool:
        return any(d.nvlink_domain_size > 1 for d in self.domains)


@dataclass(frozen=True)
class EngineState:
    """The tier's engine Deployment and its pod, as read from the API."""

    exists: bool = False
    ready: bool = False
    node_name: str | None = None
    start_failure: str | None = None
    """One of the START_* constants when the pod tells why it cannot start."""
    failure_message: str | None = None
    restarts: int = 0
    pods_total: int | None = None
    """Pods of a multi-node group (LeaderWorkerSet size); None for a Deployment's single pod."""
    pods_placed: int | None = None
    """Pods of the group bound to a node so far."""
    node_names: tuple[str, ...] = ()
    """Nodes of the group's pods, leader first."""


@dataclass(frozen=True)
class LoadTestState:
    """The tier's load-test Job for one attempt."""

    attempt: int
    exists: bool = False
    succeeded: bool = False
    failed: bool = False
    summary: dict[str, Any] | None = None
    """The load generator's summary (CONTRACTS A) from the pod's termination message."""
    message: str | None = None
    """Why the Job failed, from the pod's termination message or the Job's condition."""


@dataclass(frozen=True)
class MetricWindow:
    """What Prometheus returned for the tier's load-test window."""

    peak_fb_used_gib: float | None = None
    """Max over the tier's GPUs of DCGM_FI_DEV_FB_USED, GiB."""
    peak_kv_cache_usage: float | None = None
    """Max of vllm:kv_cache_usage_perc (0-1)."""
    kv_cache_pool_tokens: int | None = None
    """Tokens of vLLM's KV-cache pool from vllm:cache_config_info (None when the engine exports no such series)."""
    preemptions: int | None = None
    gpu_utilization: float | None = None
    """Mean DCGM GPU utilisation, 0-1."""
    nvlink_bytes_per_second: float | None = None
    comm_fraction: float | None = None
    """commFraction of the profiled slice (the trace sidecar's gauge, docs/trace.md)."""
    rank_skew_fraction: float | None = None
    """rankSkewFraction of the same slice."""
    fb_used_gib_by_gpu: tuple[float, ...] = ()
    """Peak DCGM_FI_DEV_FB_USED of each of the tier's GPUs, GiB (ordered by dcgm-exporter's gpu label)."""
    gpu_utilization_by_gpu: tuple[float, ...] = ()
    """Mean DCGM_FI_DEV_GPU_UTIL of each GPU, 0-1."""
    pcie_bytes_per_second: float | None = None
    """Mean PCIe TX + RX per GPU, bytes/s (DCGM_FI_PROF_PCIE_TX_BYTES / RX_BYTES)."""
    missing: tuple[str, ...] = ()
    """Metric names that returned no series."""
    error: str | None = None
    """Set when Prometheus could not be queried at all."""


@dataclass(frozen=True)
class Observations:
    """Everything the ladder may look at in one pass."""

    now: float
    """Seconds since the epoch (UTC)."""
    generation: int
    fleet: FleetView | None = None
    queue_position: int | None = None
    """1 when this experiment is first among those waiting for GPUs of its product."""
    engine: EngineState | None = None
    load_test: LoadTestState | None = None
    metrics: MetricWindow | None = None
    leader_worker_set_api: bool | None = None
    """Whether the cluster serves leaderworkerset.x-k8s.io/v1 (checked only before a multi-node tier deploys)."""
    plan_error: str | None = None
    """Set when the plan cannot be made (for example the config.json ConfigMap is missing)."""
    engine_not_scraped: str | None = None
    """Set during the first tier's load test when Prometheus has no series of the engine's pods
    (what was asked where, e.g. "Prometheus http://... has no vllm:num_requests_running for pods ns/x-*")."""
    missing_objects: tuple[str, ...] = ()
    """Objects the engine needs that do not exist yet (the model's PVC, the hub-token Secret or its key),
    each naming the spec field; the plan fails and is re-checked until they appear."""
    architecture: Any = None
    """The resolved ModelArchitecture (preset, ConfigMap or explicit numbers)."""
    gpu: Any = None
    """The GpuType of the experiment's GPU product (spec.placement.gpuProduct, else the product recorded at a tier's
    placement, else the first product of the matching fleet)."""
    gpu_product: str | None = None
    """The GPU product the experiment runs on (spec, recorded at a placement, or the matching fleet's first)."""
    architecture_json: str | None = None
    """The resolved architecture as the simulator reads it (a preset name or config.json text)."""
    product_selectors: tuple[tuple[str, tuple[str, str]], ...] = ()
    """(node, (label key, value)) pairs: which label each node matched the product by (GFD's, -SHARED included, or the
    probe's); an engine selects on that one, so a tier that looked schedulable is."""
    placement_problem: str | None = None
    """Why no node can ever hold the experiment (naming the spec field), read where the fleet view is empty."""
    prediction: LadderPrediction | None = None
    """Predict-first: the whole ladder run on the engine simulator, asked for by the plan (needs.prediction)."""

    @property
    def require_nvlink(self) -> bool:
        """Multi-GPU tiers need NVLink-connected GPUs where the fleet has NVLink at all."""
        return bool(self.fleet and self.fleet.has_nvlink())
