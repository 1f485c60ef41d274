"""The first tier's scrape check asks Prometheus for the engine pods' series, two scrape intervals into the load test."""

from __future__ import annotations

import asyncio

from fake_cluster import FakeApi, node

from kneepoint.core.tiers import Tier
from kneepoint.metrics import promql
from kneepoint.reconciler import Reconciler
from kneepoint.settings import OperatorSettings

NOW = 1_800_000_000.0


class FakePrometheus:
    def __init__(self, url: str, scraped: bool | None):
        self.url, self.scraped, self.asked = url, scraped, []

    async def engine_scraped(self, namespace: str, pod_prefix: str, at: float) -> bool | None:
        self.asked.append((namespace, pod_prefix, at))
        return self.scraped


def _reconciler(scraped: bool | None) -> tuple[Reconciler, list[FakePrometheus]]:
    made: list[FakePrometheus] = []

    def factory(url: str, interval: float) -> FakePrometheus:
        made.append(FakePrometheus(url, scraped))
        return made[-1]

    api = FakeApi([node("h200-0")], [])
    return Reconciler(api, api, OperatorSettings(), clock=lambda: NOW, prometheus_factory=factory), made  # type: ignore[arg-type]


def _current(started_ago: float) -> float:
    """When the load test started (needs() passes the start, parsed from the tier's status)."""
    return NOW - started_ago


def test_no_engine_series_is_reported_with_the_url_and_the_pods() -> None:
    from kneepoint.core.spec import parse_spec

    spec = parse_spec({"model": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct"}, "metrics": {"prometheusUrl": "http://prom.example:9090"}})
    r, made = _reconciler(False)
    why = asyncio.run(r._scrape_check(spec, "x", "ns", Tier(1, 1), _current(40), NOW))
    assert why == f"Prometheus http://prom.example:9090 has no {promql.ENGINE_SERIES} series for the engine's pods ns/x-tp1-pp1-*"
    assert made[0].asked == [("ns", "x-tp1-pp1", NOW)]


def test_not_asked_before_two_scrape_intervals_and_silent_when_scraped_or_unknown() -> None:
    from kneepoint.core.spec import parse_spec

    spec = parse_spec({"model": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct"}})
    r, made = _reconciler(False)
    assert asyncio.run(r._scrape_check(spec, "x", "ns", Tier(1, 1), _current(10), NOW)) is None and not made
    for scraped in (True, None):
        r, _ = _reconciler(scraped)
        assert asyncio.run(r._scrape_check(spec, "x", "ns", Tier(1, 1), _current(40), NOW)) is None


def test_engine_series_query_selects_the_engine_pods() -> None:
    assert promql.engine_series_query("ns", "x-tp1-pp1") == 'count(vllm:num_requests_running{namespace="ns",pod=~"x\\\\-tp1\\\\-pp1-.*"})'
