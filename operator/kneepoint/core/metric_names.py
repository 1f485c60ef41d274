"""Names of the Prometheus series a tier's measurement reads (defined once: core and metrics use them).

In core because the ladder names the metrics a tier lacks (status ``missingMetrics``) and
core imports no other kneepoint package; ``kneepoint.metrics.promql`` builds its queries
from these. The simulator exports the same names.
"""

from __future__ import annotations

FB_USED = "DCGM_FI_DEV_FB_USED"  # MiB
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"  # percent
NVLINK_TX = "DCGM_FI_PROF_NVLINK_TX_BYTES"  # bytes/s (a profiling field dcgm-exporter ships commented out)
PCIE_TX = "DCGM_FI_PROF_PCIE_TX_BYTES"  # bytes/s, in dcgm-exporter's default counters
PCIE_RX = "DCGM_FI_PROF_PCIE_RX_BYTES"  # bytes/s
KV_USAGE = "vllm:kv_cache_usage_perc"  # fraction 0-1
CACHE_CONFIG_INFO = "vllm:cache_config_info"  # gauge = 1; the engine's KV pool is in its labels
PREEMPTIONS = "vllm:num_preemptions_total"  # counter
# Exported by the engine pod's trace sidecar (`kneepoint trace --watch`, docs/trace.md) from
# the profiled slice's torch-profiler traces: vLLM and the simulator alike.
COMM_FRACTION = "kneepoint_comm_fraction"  # gauge 0-1: median smallest-rank collective time / step time
RANK_SKEW_FRACTION = "kneepoint_rank_skew_fraction"  # gauge 0-1: median (largest - smallest) / step time
TRACE_STEPS = "kneepoint_trace_steps"  # gauge: steps in the last analysed slice
TRACE_SLICES = "kneepoint_trace_slices"  # counter (exposed with _total): slices analysed

WINDOW_METRICS = (FB_USED, KV_USAGE, PREEMPTIONS, GPU_UTIL, NVLINK_TX, PCIE_TX, PCIE_RX, COMM_FRACTION, RANK_SKEW_FRACTION)
"""Every figure one tier's window reads: what the tier lacks when Prometheus never answered."""
OPTIONAL_METRICS = (NVLINK_TX, PCIE_TX, PCIE_RX)
"""Not in dcgm-exporter's default CSV (NVLink) or not on every GPU: reported missing, never waited for."""
TRACE_METRICS = (COMM_FRACTION, RANK_SKEW_FRACTION)
"""The trace sidecar's figures: required where the engine pod traces (single-node tiers), else optional."""

RUNNING_REQUESTS = "vllm:num_requests_running"  # gauge every vLLM serves: requests running now
"""What KEDA scales an exported InferenceService on, and the series that shows Prometheus scrapes an engine."""
