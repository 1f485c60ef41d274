"""The operator's own Prometheus metrics (served on ``--metrics-port``, default 8080).

What a platform team watches: experiments by phase, tiers measured, GPU-minutes spent,
reconcile passes, errors and durations (whole, and by part of a pass), and Kubernetes API
requests by client method (the figure that shows the operator does not poll the API in a
loop) with their round-trip times by HTTP verb (what tells a slow API server from a slow
operator).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

PHASES = ("Pending", "Planning", "Profiling", "Decided", "Failed")
# Finer between 0.5 and 5 s, where a pass that writes to a busy API server lands: histogram_quantile
# interpolates inside a bucket, and 2.5-5 s alone read a longest pass of 3.0 s as a p99 of 3.9 s.
PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 2.5, 3, 4, 5, 10)
API_BUCKETS = (*PASS_BUCKETS, 30, 60)  # to the API server's 60 s request timeout


class OperatorMetrics:
    """One registry per operator process (tests create their own)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.experiments = Gauge(
            "kneepoint_experiments", "Experiments known to this operator, by phase.", ["phase"], registry=self.registry
        )
        self.tiers_measured = Counter("kneepoint_tiers_measured_total", "Tiers that reached Measured.", ["mode"], registry=self.registry)
        self.tiers_failed = Counter("kneepoint_tiers_failed_total", "Tiers that ended Failed.", ["mode"], registry=self.registry)
        self.gpu_minutes = Counter(
            "kneepoint_gpu_minutes_total", "GPU-minutes held by engine tiers (Measure mode).", registry=self.registry
        )
        self.passes = Counter("kneepoint_reconcile_passes_total", "Reconcile passes.", registry=self.registry)
        self.errors = Counter("kneepoint_reconcile_errors_total", "Reconcile passes that raised.", registry=self.registry)
        self.duration = Histogram(
            "kneepoint_reconcile_duration_seconds",
            "Duration of one reconcile pass (observe, step, apply, write).",
            buckets=PASS_BUCKETS,
            registry=self.registry,
        )
        self.pass_parts = Histogram(
            "kneepoint_reconcile_part_seconds",
            "Where a reconcile pass spent its time, by part: fleet_read (waiting for the shared node and pod read), "
            "capacity_lock (waiting for another experiment's capacity check), observe_and_decide (reads, mostly from "
            "the cache, and the ladder's step), writes (creates, deletes and the status patch, awaited).",
            ["part"],
            buckets=PASS_BUCKETS,
            registry=self.registry,
        )
        self.queue_wait = Histogram(
            "kneepoint_reconcile_queue_seconds",
            "How long a reconcile pass waited for one of the operator's pass slots (KNEEPOINT_MAX_CONCURRENT_PASSES) "
            "before it started; not part of kneepoint_reconcile_duration_seconds (as controller-runtime's "
            "workqueue_queue_duration_seconds beside its reconcile_time_seconds).",
            buckets=API_BUCKETS,
            registry=self.registry,
        )
        self.api_requests = Counter(
            "kneepoint_api_requests_total",
            "Kubernetes API requests made by the reconciler, by client method (read_namespaced_job, ...).",
            ["method"],
            registry=self.registry,
        )
        self.api_latency = Histogram(
            "kneepoint_api_request_duration_seconds",
            "Kubernetes API round trips of the reconciler, client side (in its worker thread, failed ones too), by HTTP verb.",
            ["verb"],
            buckets=API_BUCKETS,
            registry=self.registry,
        )
        self.leader = Gauge(
            "kneepoint_operator_leader", "1 while this process holds the leader-election Lease, 0 as a standby.", registry=self.registry
        )
        self.decisions = Counter("kneepoint_decisions_total", "Decisions made, by rule.", ["rule"], registry=self.registry)
        self._phases: dict[str, str] = {}
        for phase in PHASES:
            self.experiments.labels(phase).set(0)

    def set_phase(self, uid: str, phase: str | None) -> None:
        """Record an experiment's phase (None when it is gone) and refresh the gauge."""
        if phase is None:
            self._phases.pop(uid, None)
        else:
            self._phases[uid] = phase
        for p in PHASES:
            self.experiments.labels(p).set(sum(1 for v in self._phases.values() if v == p))

    def serve(self, port: int, address: str = "127.0.0.1") -> None:
        """Serve /metrics on address:port in a background thread (port 0 disables)."""
        if port:
            start_http_server(port, addr=address, registry=self.registry)
