"""PromQL for one tier's load-test window (pure text; no client import).

Selectors match the engine pod both by the target labels Prometheus' Kubernetes service
discovery attaches (``namespace``, ``pod``) and by the labels dcgm-exporter writes itself,
which a ServiceMonitor with ``honorLabels: false`` renames to ``exported_namespace`` /
``exported_pod`` (REFERENCE.md section 4). Each query is an instant query evaluated at the
window's end over a range equal to the window, so ``max_over_time`` sees the whole test.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

# Metric names are defined once in core (the ladder names missing ones); re-exported (``X as X``) for promql's readers.
from kneepoint.core.metric_names import (
    CACHE_CONFIG_INFO,
    FB_USED,
    GPU_UTIL,
    KV_USAGE,
    NVLINK_TX,
    PCIE_RX,
    PCIE_TX,
    PREEMPTIONS,
    RUNNING_REQUESTS,
    TRACE_METRICS,
)
from kneepoint.core.metric_names import (
    COMM_FRACTION as COMM_FRACTION,
)
from kneepoint.core.metric_names import (
    OPTIONAL_METRICS as OPTIONAL_METRICS,
)
from kneepoint.core.metric_names import (
    RANK_SKEW_FRACTION as RANK_SKEW_FRACTION,
)
from kneepoint.core.metric_names import (
    TRACE_SLICES as TRACE_SLICES,
)
from kneepoint.core.metric_names import (
    TRACE_STEPS as TRACE_STEPS,
)

# Labels of CACHE_CONFIG_INFO that size the pool. vLLM 0.24/0.33 write kv_cache_size_tokens
# (= num_gpu_blocks x block_size, from the engine handshake; a real scrape:
# tests/data/vllm/8b-tp1-metrics-after-load.txt); engines without it give blocks and block size.
POOL_TOKENS_LABEL = "kv_cache_size_tokens"
POOL_BLOCKS_LABEL = "num_gpu_blocks"
BLOCK_SIZE_LABEL = "block_size"


@dataclass(frozen=True)
class WindowQuery:
    name: str
    """Metric the query is about (reported as missing when it returns no series)."""
    expr: str


def range_seconds(start: float, end: float, scrape_interval: float) -> int:
    """Window length for range selectors: at least two scrape intervals so short tests see samples."""
    return int(max(math.ceil(end - start), math.ceil(2 * scrape_interval), 1))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def pod_selectors(namespace: str, pod_prefix: str) -> tuple[str, str]:
    """Label matchers for the engine's pods: (service-discovery labels, dcgm-exporter labels)."""
    ns = _escape(namespace)
    pod = _escape(re.escape(pod_prefix)) + "-.*"
    return f'namespace="{ns}",pod=~"{pod}"', f'exported_namespace="{ns}",exported_pod=~"{pod}"'


def _both(metric: str, inner: str, sel: tuple[str, str]) -> str:
    a, b = sel
    return f"({inner.format(m=f'{metric}{{{a}}}')}) or ({inner.format(m=f'{metric}{{{b}}}')})"


def cache_config_query(namespace: str, pod_prefix: str, seconds: int) -> WindowQuery:
    """The engine's cache_config_info labels that size its KV pool (one series per distinct pool)."""
    sel = pod_selectors(namespace, pod_prefix)
    by = ", ".join((POOL_TOKENS_LABEL, POOL_BLOCKS_LABEL, BLOCK_SIZE_LABEL))
    return WindowQuery(CACHE_CONFIG_INFO, f"max by ({by}) ({_both(CACHE_CONFIG_INFO, 'last_over_time({m}[' + str(seconds) + 's])', sel)})")


def pool_tokens(labels: Mapping[str, str]) -> int | None:
    """Tokens of the KV pool one cache_config_info series describes, or None when its labels do not say.

    ``kv_cache_size_tokens`` where present, else ``num_gpu_blocks x block_size``; vLLM writes
    ``"None"`` for a value not known yet.
    """

    def number(key: str) -> int | None:
        try:
            value = int(str(labels.get(key, "")).strip())
        except ValueError:
            return None
        return value if value > 0 else None

    tokens = number(POOL_TOKENS_LABEL)
    if tokens is not None:
        return tokens
    blocks, size = number(POOL_BLOCKS_LABEL), number(BLOCK_SIZE_LABEL)
    return blocks * size if blocks is not None and size is not None else None


def window_queries(namespace: str, pod_prefix: str, seconds: int) -> list[WindowQuery]:
    """The queries the operator runs for one tier."""
    sel = pod_selectors(namespace, pod_prefix)
    r = f"[{seconds}s]"
    return [
        WindowQuery(FB_USED, f"max({_both(FB_USED, 'max_over_time({m}' + r + ')', sel)})"),
        WindowQuery(KV_USAGE, f"max({_both(KV_USAGE, 'max_over_time({m}' + r + ')', sel)})"),
        # max - min over the window rather than increase(): a short load test may leave one
        # sample in the window, where increase() returns nothing but the answer is 0.
        WindowQuery(PREEMPTIONS, f"sum({_both(PREEMPTIONS, '(max_over_time({m}' + r + ') - min_over_time({m}' + r + '))', sel)})"),
        WindowQuery(GPU_UTIL, f"avg({_both(GPU_UTIL, 'avg_over_time({m}' + r + ')', sel)})"),
        WindowQuery(NVLINK_TX, f"avg({_both(NVLINK_TX, 'avg_over_time({m}' + r + ')', sel)})"),
    ]


# Names of the per-GPU queries (one series per GPU of the tier; not metric names).
FB_USED_BY_GPU = FB_USED + " by gpu"
GPU_UTIL_BY_GPU = GPU_UTIL + " by gpu"


def per_gpu_queries(namespace: str, pod_prefix: str, seconds: int) -> list[WindowQuery]:
    """The tier's GPUs one by one (dcgm-exporter's ``gpu`` and ``UUID`` labels): peak framebuffer
    and mean utilisation per GPU, for the rank-balance check; and PCIe bytes/s per GPU (mean)."""
    sel = pod_selectors(namespace, pod_prefix)
    r = f"[{seconds}s]"
    return [
        WindowQuery(FB_USED_BY_GPU, f"max by (gpu, UUID) ({_both(FB_USED, 'max_over_time({m}' + r + ')', sel)})"),
        WindowQuery(GPU_UTIL_BY_GPU, f"avg by (gpu, UUID) ({_both(GPU_UTIL, 'avg_over_time({m}' + r + ')', sel)})"),
        WindowQuery(PCIE_TX, f"avg({_both(PCIE_TX, 'avg_over_time({m}' + r + ')', sel)})"),
        WindowQuery(PCIE_RX, f"avg({_both(PCIE_RX, 'avg_over_time({m}' + r + ')', sel)})"),
    ]


def trace_queries(namespace: str, pod_prefix: str, seconds: int) -> list[WindowQuery]:
    """The trace sidecar's figures for one tier: the last value published in the window.

    The profiled slice runs at the end of the load test, and the sidecar publishes once the
    traces are written and read, so these are evaluated at query time over a range reaching
    back to the load test's start (``PrometheusReader.window``), not at the test's end.
    """
    sel = pod_selectors(namespace, pod_prefix)[:1]  # the sidecar is scraped like vLLM: pod/namespace target labels
    r = f"[{seconds}s]"
    return [WindowQuery(name, f"max(last_over_time({name}{{{sel[0]}}}{r}))") for name in TRACE_METRICS]


ENGINE_SERIES = RUNNING_REQUESTS


def engine_series_query(namespace: str, pod_prefix: str) -> str:
    """Number of the engine pods' series of a gauge every vLLM serves (0 / empty: Prometheus does not scrape them)."""
    sel, _ = pod_selectors(namespace, pod_prefix)
    return f"count({ENGINE_SERIES}{{{sel}}})"
