"""PrometheusReader.window against canned Prometheus answers: trace figures read at query time, GPUs one by one."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kneepoint.metrics import promql
from kneepoint.metrics.prometheus_reader import PrometheusReader


def answers(expr: str) -> list[dict[str, Any]]:
    if promql.CACHE_CONFIG_INFO in expr:  # vLLM 0.24's labels on the real 8B/H200 engine
        return [{"metric": {"kv_cache_size_tokens": "896912", "num_gpu_blocks": "56057", "block_size": "16"}, "value": [0, "1"]}]
    if expr.startswith("max by (gpu, UUID)"):
        return [{"metric": {"gpu": "1"}, "value": [0, "61440"]}, {"metric": {"gpu": "0"}, "value": [0, "62464"]}]
    if expr.startswith("avg by (gpu, UUID)"):
        return [{"metric": {"gpu": "0"}, "value": [0, "92"]}, {"metric": {"gpu": "1"}, "value": [0, "60"]}]
    for name, value in (
        (promql.COMM_FRACTION, "0.19"),
        (promql.RANK_SKEW_FRACTION, "0.006"),
        (promql.PCIE_TX, "1e9"),
        (promql.PCIE_RX, "5e8"),
        (promql.NVLINK_TX, None),
        (promql.FB_USED, "62464"),
        (promql.KV_USAGE, "0.3"),
        (promql.PREEMPTIONS, "0"),
        (promql.GPU_UTIL, "76"),
    ):
        if name in expr:
            return [] if value is None else [{"metric": {}, "value": [0, value]}]
    raise AssertionError(expr)


async def test_trace_figures_are_read_at_query_time_and_gpus_one_by_one() -> None:
    reader = PrometheusReader("http://prom:9090", scrape_interval_seconds=2.0, clock=lambda: 1300.0)
    calls: list[tuple[str, float]] = []

    def query(expr: str, at: float) -> list[dict[str, Any]]:
        calls.append((expr, at))
        return answers(expr)

    reader._query = query  # type: ignore[method-assign]
    w = await reader.window("ns", "exp-tp2-pp1", 1000.0, 1200.0)
    assert w.error is None and w.missing == () and w.nvlink_bytes_per_second is None  # NVLink bytes: optional
    assert (w.comm_fraction, w.rank_skew_fraction) == (0.19, 0.006)
    trace_calls = [(e, at) for e, at in calls if "kneepoint_" in e]
    assert len(trace_calls) == 2 and all(at == 1300.0 and "[300s]" in e for e, at in trace_calls)  # since the test's start
    assert w.gpu_utilization_by_gpu == (0.92, 0.60) and w.fb_used_gib_by_gpu == (61.0, 60.0)  # ordered by gpu label
    assert w.pcie_bytes_per_second == 1.5e9
    assert w.kv_cache_pool_tokens == 896912


async def test_untraced_tiers_do_not_wait_for_the_trace_figures() -> None:
    reader = PrometheusReader("http://prom:9090", clock=lambda: 1300.0)
    reader._query = lambda expr, at: [] if "kneepoint_" in expr else answers(expr)  # type: ignore[method-assign]
    assert (await reader.window("ns", "exp-tp8-pp2", 1000.0, 1200.0)).missing != ()
    w = await reader.window("ns", "exp-tp8-pp2", 1000.0, 1200.0, traced=False)
    assert promql.COMM_FRACTION not in w.missing and w.comm_fraction is None


async def test_a_windows_queries_are_in_flight_together_and_one_failure_is_the_windows_error() -> None:
    # Every query waits until all twelve have been asked: one after another they would never finish. The
    # operator's loop runs them on its 32 API threads (handlers.experiment.configure); the test gives it 16.
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=16))
    reader = PrometheusReader("http://prom:9090", clock=lambda: 1300.0)
    expected = 1 + len(promql.window_queries("ns", "p", 60)) + len(promql.trace_queries("ns", "p", 60))
    expected += len(promql.per_gpu_queries("ns", "p", 60))
    arrived = threading.Barrier(expected, timeout=10)

    def query(expr: str, at: float) -> list[dict[str, Any]]:
        arrived.wait()
        return answers(expr)

    reader._query = query  # type: ignore[method-assign]
    w = await reader.window("ns", "exp-tp2-pp1", 1000.0, 1200.0)
    assert w.error is None and w.comm_fraction == 0.19 and w.gpu_utilization_by_gpu == (0.92, 0.60)

    def refused(expr: str, at: float) -> list[dict[str, Any]]:
        if promql.KV_USAGE in expr:
            raise ConnectionError("connection refused")
        return answers(expr)

    reader._query = refused  # type: ignore[method-assign]
    w = await reader.window("ns", "exp-tp2-pp1", 1000.0, 1200.0)
    assert w.error == "ConnectionError: connection refused"


async def test_a_prometheus_that_never_answers_is_given_up_on_by_the_client(monkeypatch) -> None:
    # A listener that accepts and never answers (as a Prometheus behind a dropped route): the query's own timeout
    # parameter is Prometheus's, so only the client's limit ends the wait. Without it the pass, and its slot, hang.
    import socket
    import time

    from kneepoint.metrics import prometheus_reader

    monkeypatch.setattr(prometheus_reader, "CLIENT_MARGIN_SECONDS", 0.3)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        reader = PrometheusReader(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout_seconds=0.2, clock=lambda: 1300.0)
        began = time.monotonic()
        w = await reader.window("ns", "exp-tp1-pp1", 1000.0, 1200.0)
        assert w.error is not None  # requests reports the read timeout as a ConnectionError (no retries)
        assert time.monotonic() - began < 5.0  # the limit (0.5 s) and the threads' start, not a hang
