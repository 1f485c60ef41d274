"""Needed memory from vLLM's own KV pool (vllm:cache_config_info), on a real vLLM 0.24 capture.

The capture (tests/data/vllm, README there): Llama-3.1-8B shapes at TP1 on one H200 under
--gpu-memory-utilization 0.9. vLLM logged weights 15.0 GiB and a KV pool of 109.49 GiB =
896,912 tokens; the estimator says 14.96 and 108.2 GiB.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from kneepoint.core.architectures import get_preset
from kneepoint.core.gpus import GIB, get_gpu_type
from kneepoint.core.ladder import needed_memory_fields
from kneepoint.core.memory_estimate import estimate_memory
from kneepoint.core.observations import MetricWindow
from kneepoint.core.status import PEAK_MEMORY_FROM_ESTIMATE, PEAK_MEMORY_FROM_VLLM
from kneepoint.core.tiers import Tier
from kneepoint.metrics import promql
from kneepoint.metrics.prometheus_reader import PrometheusReader

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm"


def real_cache_config_labels(capture: str = "8b-tp1-metrics-after-load.txt") -> dict[str, str]:
    text = (DATA / capture).read_text(encoding="utf-8")
    for family in text_string_to_metric_families(text):
        if family.name == promql.CACHE_CONFIG_INFO:
            [sample] = family.samples
            return dict(sample.labels)
    raise AssertionError("no vllm:cache_config_info in the capture")


def real_log_figures(capture: str = "8b-tp1-serve.log") -> tuple[float, float, int]:
    """(weights GiB, KV pool GiB, pool tokens) as vLLM logged them at start-up."""
    log = (DATA / capture).read_text(encoding="utf-8")
    weights = float(re.search(r"Model loading took ([\d.]+) GiB", log).group(1))
    pool = float(re.search(r"Available KV cache memory: ([\d.]+) GiB", log).group(1))
    tokens = int(re.search(r"GPU KV cache size: ([\d,]+) tokens", log).group(1).replace(",", ""))
    return weights, pool, tokens


def real_peak_kv_usage() -> float:
    values = [
        float(line.split()[-1])
        for line in (DATA / "8b-tp1-scrape-samples.txt").read_text(encoding="utf-8").splitlines()
        if " vllm:kv_cache_usage_perc{" in line
    ]
    return max(values)


def capture_estimate():
    # The capture's workload: deploy/examples/experiment.yaml (32 x (1024 + 256) tokens, maxModelLen 4096).
    return estimate_memory(
        get_preset("llama-3-8b"),
        get_gpu_type("h200"),
        Tier(1, 1),
        max_model_len=4096,
        concurrency=32,
        context_len=1280,
        gpu_memory_utilization=0.9,
    )


def test_the_pool_is_read_from_the_real_cache_config_info_labels():
    labels = real_cache_config_labels()
    assert promql.pool_tokens(labels) == 896_912 == real_log_figures()[2]
    # Without kv_cache_size_tokens (older engines, the simulator): blocks x block size, the same pool.
    older = {k: v for k, v in labels.items() if k != promql.POOL_TOKENS_LABEL}
    assert promql.pool_tokens(older) == 56_057 * 16 == 896_912
    assert promql.pool_tokens({"num_gpu_blocks": "None", "block_size": "16"}) is None
    assert promql.pool_tokens({}) is None


def test_the_estimator_against_vllm_on_the_real_numbers():
    est = capture_estimate()
    weights, pool, tokens = real_log_figures()
    assert (weights, pool, tokens) == (15.0, 109.49, 896_912)
    assert est.weights_bytes_per_gpu / GIB == pytest.approx(14.96, abs=0.005)
    assert est.weights_bytes_per_gpu / GIB == pytest.approx(weights, rel=0.005)
    assert est.kv_pool_bytes_per_gpu / GIB == pytest.approx(108.2, abs=0.05)
    assert est.kv_pool_bytes_per_gpu / GIB == pytest.approx(pool, rel=0.015)
    # vLLM's tokens x 128 KiB per token (32 layers x 8 KV heads x 128 x K and V x 2 bytes) = its logged pool.
    assert est.kv_bytes_per_token_per_gpu == 131_072
    assert est.pool_bytes_for_tokens(tokens) / GIB == pytest.approx(pool, abs=0.005)


def test_needed_memory_uses_the_engines_pool_and_keeps_the_estimate_beside_it():
    est = capture_estimate()
    usage = real_peak_kv_usage()
    assert usage == pytest.approx(0.0648, abs=1e-4)
    fields = needed_memory_fields(est, MetricWindow(peak_kv_cache_usage=usage, kv_cache_pool_tokens=896_912))
    assert fields["peak_memory_source"] == PEAK_MEMORY_FROM_VLLM
    assert fields["kv_cache_pool_tokens"] == 896_912
    assert fields["kv_cache_pool_gi_b"] == 109.49 and fields["estimated_kv_cache_pool_gi_b"] == 108.21
    expected = (est.weights_bytes_per_gpu + usage * 896_912 * 131_072 + est.non_kv_overhead_bytes_per_gpu) / GIB
    assert fields["peak_memory_gi_b"] == pytest.approx(expected, abs=0.01)
    assert 24.5 < fields["peak_memory_gi_b"] < 25.0  # 14.96 + 0.0648 x 109.49 + 2.66 GiB
    # No cache_config_info series: the estimator's pool, said so.
    fallback = needed_memory_fields(est, MetricWindow(peak_kv_cache_usage=usage))
    assert fallback["peak_memory_source"] == PEAK_MEMORY_FROM_ESTIMATE and "kv_cache_pool_tokens" not in fallback
    assert fallback["kv_cache_pool_gi_b"] == 108.21
    assert fallback["peak_memory_gi_b"] < fields["peak_memory_gi_b"]


def test_the_reader_passes_the_pool_from_the_query_result_into_the_window():
    labels = real_cache_config_labels()
    by = (promql.POOL_TOKENS_LABEL, promql.POOL_BLOCKS_LABEL, promql.BLOCK_SIZE_LABEL)
    asked: list[str] = []

    def query(expr: str, at: float) -> list[dict]:
        asked.append(expr)
        if promql.CACHE_CONFIG_INFO in expr:
            # What `max by (...)` returns: the by-labels only.
            return [{"metric": {k: labels[k] for k in by}, "value": [at, "1"]}]
        return [{"metric": {}, "value": [at, "0.5"]}]

    reader = PrometheusReader("http://prometheus.invalid:9090")
    reader._query = query  # type: ignore[method-assign]
    window = asyncio.run(reader.window("team-a", "exp-tp1-pp1", 1000.0, 1100.0))
    assert window.kv_cache_pool_tokens == 896_912
    [pool_expr] = [e for e in asked if promql.CACHE_CONFIG_INFO in e]
    assert pool_expr.startswith("max by (kv_cache_size_tokens, num_gpu_blocks, block_size) (")
    assert 'namespace="team-a"' in pool_expr and "last_over_time(vllm:cache_config_info{" in pool_expr
    # An engine that exports no such series: no pool, and nothing reported missing for it.
    reader._query = lambda expr, at: [] if promql.CACHE_CONFIG_INFO in expr else [{"metric": {}, "value": [at, "1"]}]  # type: ignore[method-assign]
    window = asyncio.run(reader.window("team-a", "exp-tp1-pp1", 1000.0, 1100.0))
    assert window.kv_cache_pool_tokens is None and promql.CACHE_CONFIG_INFO not in window.missing


def test_the_estimator_against_vllm_on_a_held_out_architecture():
    # Run 18: Qwen2.5-14B's shape (Qwen2: 48 layers, 8 KV heads of 128, biased QKV, 152,064-token vocabulary),
    # bf16 on one H200 with the operator's flags; none of the estimator was fitted to it.
    weights, pool, tokens = real_log_figures("14b-tp1-serve-run18-cold.log")
    assert (weights, pool, tokens) == (27.57, 96.13, 524_960)
    assert promql.pool_tokens(real_cache_config_labels("14b-tp1-cache-config-info.txt")) == tokens
    est = estimate_memory(
        get_preset("qwen2.5-14b"),
        get_gpu_type("h200"),
        Tier(1, 1),
        max_model_len=4096,
        concurrency=32,
        context_len=1280,
        gpu_memory_utilization=0.9,
    )
    assert est.weights_bytes_per_gpu / GIB == pytest.approx(weights, rel=0.005)  # 27.51
    assert est.kv_pool_bytes_per_gpu / GIB == pytest.approx(pool, rel=0.01)  # 95.65
    assert est.kv_bytes_per_token_per_gpu == 48 * 8 * 128 * 2 * 2
    # Whole blocks of 16 tokens: the pool's tokens take 96.123 GiB of the 96.13 vLLM logged.
    assert est.pool_bytes_for_tokens(tokens) / GIB == pytest.approx(pool, abs=0.01)
