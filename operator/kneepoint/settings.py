"""Operator-wide settings, read once at start from flags and environment variables.

Grouped like kopf's own configuration: each field documents its unit, default and reason.
Experiments override the per-experiment ones in their spec (for example
``spec.metrics.prometheusUrl``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from kneepoint.core.ladder import LadderSettings


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw not in (None, "") else default


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, not {raw!r}") from None


@dataclass(frozen=True)
class OperatorSettings:
    """Settings of one operator process."""

    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    """Default Prometheus base URL when an experiment does not name one (KNEEPOINT_PROMETHEUS_URL)."""
    prometheus_scrape_interval_seconds: float = 15.0
    """Scrape interval of that Prometheus; range queries span at least two of them (KNEEPOINT_SCRAPE_INTERVAL)."""
    operator_image: str = "ghcr.io/kneepoint/kneepoint:0.1.0"
    """Image with the kneepoint package: load-test Jobs and Simulate-mode engines run it (KNEEPOINT_IMAGE)."""
    namespaces: tuple[str, ...] = ()
    """Namespaces to watch; empty = all namespaces (the chart can restrict it)."""
    ladder: LadderSettings = field(default_factory=LadderSettings)
    """Timing of the ladder (poll intervals, Prometheus settle time and deadline)."""
    max_passes_per_wakeup: int = 20
    """Transitions one wake-up may chain (plan -> deploy ...) before yielding to other experiments."""
    idle_poll_seconds: float = 30.0
    """How often an idle experiment is looked at again. Decided and Failed ones are not: only an event (a spec
    change, a child changing) wakes them."""
    api_threads: int = 32
    """Kubernetes API calls run in worker threads (the client is synchronous); this many at once, with as many
    pooled connections (KNEEPOINT_API_THREADS). Python's default, cores + 4, queues calls once a few dozen
    experiments are active."""
    max_concurrent_passes: int = 4
    """Reconcile passes that run at once, over all experiments (KNEEPOINT_MAX_CONCURRENT_PASSES; 0: no limit), as
    controller-runtime's MaxConcurrentReconciles. A pass waits for a slot before it reads its experiment, and the wait
    is kept apart from the pass (kneepoint_reconcile_queue_seconds). A burst of experiments (a GitOps apply of a
    hundred) otherwise sends every pass's writes to the API server at once, and each round trip waits behind all the
    others: bounded, the same writes leave in turn and each pass takes what its own round trips take."""
    fleet_cache_seconds: float = 5.0
    """Nodes and GPU-holding pods are listed at most once per this many seconds, shared by every experiment's
    capacity check (KNEEPOINT_FLEET_CACHE_SECONDS; 0 lists them on every check)."""
    json_logs: bool = False
    """Log one JSON object per line (KNEEPOINT_LOG_FORMAT=json)."""
    metrics_port: int = 8080
    """Port of the operator's own /metrics (0 disables)."""
    metrics_address: str = "127.0.0.1"
    """Address /metrics listens on (KNEEPOINT_METRICS_ADDRESS); the chart sets the pod IP from the downward API."""

    @classmethod
    def from_env(cls, **overrides: object) -> OperatorSettings:
        ladder = LadderSettings(
            poll_seconds=_env_float("KNEEPOINT_POLL_SECONDS", LadderSettings.poll_seconds),
            waiting_poll_seconds=_env_float("KNEEPOINT_WAITING_POLL_SECONDS", LadderSettings.waiting_poll_seconds),
            metrics_settle_seconds=_env_float("KNEEPOINT_METRICS_SETTLE_SECONDS", LadderSettings.metrics_settle_seconds),
            metrics_deadline_seconds=_env_float("KNEEPOINT_METRICS_DEADLINE_SECONDS", LadderSettings.metrics_deadline_seconds),
        )
        ns = tuple(n for n in os.environ.get("KNEEPOINT_NAMESPACES", "").split(",") if n)
        values: dict[str, Any] = {
            "prometheus_url": os.environ.get("KNEEPOINT_PROMETHEUS_URL", cls.prometheus_url),
            "prometheus_scrape_interval_seconds": _env_float("KNEEPOINT_SCRAPE_INTERVAL", cls.prometheus_scrape_interval_seconds),
            "operator_image": os.environ.get("KNEEPOINT_IMAGE", cls.operator_image),
            "namespaces": ns,
            "ladder": ladder,
            "json_logs": os.environ.get("KNEEPOINT_LOG_FORMAT", "") == "json",
            "metrics_port": _env_int("KNEEPOINT_METRICS_PORT", cls.metrics_port),
            "metrics_address": os.environ.get("KNEEPOINT_METRICS_ADDRESS", cls.metrics_address),
            "fleet_cache_seconds": _env_float("KNEEPOINT_FLEET_CACHE_SECONDS", cls.fleet_cache_seconds),
            "api_threads": _env_int("KNEEPOINT_API_THREADS", cls.api_threads),
            "max_concurrent_passes": _env_int("KNEEPOINT_MAX_CONCURRENT_PASSES", cls.max_concurrent_passes),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def __post_init__(self) -> None:
        if self.max_concurrent_passes < 0:
            raise ValueError(
                f"KNEEPOINT_MAX_CONCURRENT_PASSES must be 0 (no limit) or a positive number of passes, not {self.max_concurrent_passes}"
            )
        if self.api_threads < 1:
            raise ValueError(f"KNEEPOINT_API_THREADS must be at least 1, not {self.api_threads}")
