"""Runs the tier-window queries against Prometheus (prometheus-api-client) -> MetricWindow."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, cast

import requests
from prometheus_api_client import PrometheusConnect
from requests.adapters import HTTPAdapter
from urllib3.util.retry import Retry

from kneepoint.core.observations import MetricWindow
from kneepoint.metrics import promql

log = logging.getLogger("kneepoint.metrics")
MIB = 1024**2
GIB = 1024**3
CONNECTIONS = 32
"""Connections kept to one Prometheus: as many as the operator's API threads, which run the queries."""


def _scalar(result: list[dict[str, Any]]) -> float | None:
    """First sample value of an instant-vector result, or None when there is no series."""
    for series in result:
        value = series.get("value")
        if value and len(value) == 2:
            try:
                return float(value[1])
            except (TypeError, ValueError):
                return None
    return None


def _sum_present(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def _vector(result: list[dict[str, Any]]) -> tuple[float, ...]:
    """Every series' value of an instant-vector result, ordered by the series' gpu label."""
    values = []
    for series in result:
        value: Any = series.get("value")  # [time, "number"]; anything else is skipped below
        try:
            values.append((str((series.get("metric") or {}).get("gpu", "")), float(value[1])))
        except (TypeError, ValueError, IndexError):
            continue
    return tuple(v for _, v in sorted(values))


CLIENT_MARGIN_SECONDS = 5.0
"""How much longer than the query's own timeout the client waits for an answer before it gives up."""


class PrometheusReader:
    """One reader per Prometheus URL."""

    def __init__(self, url: str, timeout_seconds: float = 10.0, scrape_interval_seconds: float = 15.0, clock=time.time):
        self.url = url
        self.timeout = timeout_seconds
        self.scrape_interval = scrape_interval_seconds
        self._clock = clock
        # No client-side retries: the ladder retries on its own schedule (and says so in a
        # condition); the client's default 3 retries with back-off cost ~6 s per refused pass.
        retry = Retry(total=0, connect=0, read=0, status=0)
        session = requests.Session()
        self._prom = PrometheusConnect(url=url, disable_ssl=True, retry=retry, session=session)
        session.verify = False  # as disable_ssl does for a session of the client's own
        # A window's queries run at once, several experiments' too: requests' 10 pooled connections
        # would be opened and discarded ("Connection pool is full") past that.
        session.mount(self._prom.url, HTTPAdapter(max_retries=retry, pool_connections=1, pool_maxsize=CONNECTIONS))

    def _query(self, expr: str, at: float) -> list[dict[str, Any]]:
        # The client's own limit too (its default is none): a Prometheus that drops packets would otherwise hold the
        # pass, and one of the operator's pass slots (KNEEPOINT_MAX_CONCURRENT_PASSES), for the OS's connect timeout.
        return self._prom.custom_query(
            query=expr, params={"time": f"{at:.3f}", "timeout": f"{self.timeout:.0f}s"}, timeout=self.timeout + CLIENT_MARGIN_SECONDS
        )

    async def window(self, namespace: str, pod_prefix: str, start: float, end: float, traced: bool = True) -> MetricWindow:
        """Query every tier metric over [start, end]; never raises (errors land in ``error``).

        ``traced``: the engine pod profiles a slice and runs the trace sidecar (single-node
        tiers); without it the trace figures are optional (absent, never waited for).
        """
        seconds = promql.range_seconds(start, end, self.scrape_interval)
        queries = promql.window_queries(namespace, pod_prefix, seconds)
        # The trace sidecar publishes after the profiled slice at the test's end: read it now,
        # over a range back to the test's start.
        now = max(end, self._clock())
        trace_queries = promql.trace_queries(namespace, pod_prefix, promql.range_seconds(start, now, self.scrape_interval))
        per_gpu_queries = promql.per_gpu_queries(namespace, pod_prefix, seconds)
        asked = [
            (promql.cache_config_query(namespace, pod_prefix, seconds), end),
            *((q, end) for q in queries),
            *((q, now) for q in trace_queries),
            *((q, end) for q in per_gpu_queries),
        ]
        # All at once: a window is a dozen instant queries, and one after another they cost a dozen round trips
        # (seconds of a pass against a busy or distant Prometheus).
        answers = await asyncio.gather(*(asyncio.to_thread(self._query, q.expr, at) for q, at in asked), return_exceptions=True)
        failed = next((a for a in answers if isinstance(a, BaseException)), None)
        if failed is not None:  # connection refused, timeouts, HTTP errors: all mean "not now"
            log.warning("Prometheus at %s failed: %s", self.url, failed)
            return MetricWindow(error=f"{type(failed).__name__}: {failed}"[:300])
        pool_series, *rest = cast(list[list[dict[str, Any]]], answers)  # none failed
        results = {q.name: r for (q, _), r in zip(asked[1:], rest, strict=True)}
        values: dict[str, float | None] = {q.name: _scalar(results[q.name]) for q in (*queries, *trace_queries)}
        per_gpu: dict[str, tuple[float, ...]] = {}
        for q in per_gpu_queries:
            if q.name in (promql.PCIE_TX, promql.PCIE_RX):
                values[q.name] = _scalar(results[q.name])
            else:
                per_gpu[q.name] = _vector(results[q.name])
        # NVLink byte counters are not in dcgm-exporter's default CSV: their absence is
        # reported per tier but never delays the ladder. The trace figures are required: the
        # ladder waits for them up to its metrics deadline (the sidecar publishes after the
        # load test's profiled slice), then records the tier without them.
        optional: tuple[str, ...] = promql.OPTIONAL_METRICS
        if not traced:
            optional += promql.TRACE_METRICS
        required = [n for n in values if n not in optional]
        missing = tuple(n for n in required if values[n] is None)
        fb = values[promql.FB_USED]
        util = values[promql.GPU_UTIL]
        pre = values[promql.PREEMPTIONS]
        # The pool vLLM sized itself (absent: the needed-memory figure falls back to the estimator's pool).
        # Several series (engines of one tier) take the largest pool: the needed figure errs high.
        pools = [t for t in (promql.pool_tokens(s.get("metric") or {}) for s in pool_series) if t is not None]
        return MetricWindow(
            peak_fb_used_gib=fb * MIB / GIB if fb is not None else None,
            peak_kv_cache_usage=values[promql.KV_USAGE],
            kv_cache_pool_tokens=max(pools) if pools else None,
            preemptions=round(pre) if pre is not None else None,
            gpu_utilization=util / 100.0 if util is not None else None,
            nvlink_bytes_per_second=values[promql.NVLINK_TX],
            comm_fraction=values[promql.COMM_FRACTION],
            rank_skew_fraction=values[promql.RANK_SKEW_FRACTION],
            fb_used_gib_by_gpu=tuple(v * MIB / GIB for v in per_gpu.get(promql.FB_USED_BY_GPU, ())),
            gpu_utilization_by_gpu=tuple(v / 100.0 for v in per_gpu.get(promql.GPU_UTIL_BY_GPU, ())),
            pcie_bytes_per_second=_sum_present(values[promql.PCIE_TX], values[promql.PCIE_RX]),
            missing=missing,
        )

    async def engine_scraped(self, namespace: str, pod_prefix: str, at: float) -> bool | None:
        """Whether Prometheus has a series of the engine's pods now; None when it cannot be asked."""
        try:
            return bool(_scalar(await asyncio.to_thread(self._query, promql.engine_series_query(namespace, pod_prefix), at)))
        except Exception as exc:  # noqa: BLE001 - the tier's own metric reads report Prometheus errors; here "unknown"
            log.debug("Prometheus at %s failed: %s", self.url, exc)
            return None
