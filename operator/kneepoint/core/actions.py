"""What the ladder asks the adapters to do. Every action is idempotent by construction.

Child names are deterministic (tier + attempt), so re-applying an action after a crash finds
the object already there instead of creating a second one.
"""

from __future__ import annotations

from dataclasses import dataclass

from kneepoint.core.status import Decision
from kneepoint.core.tiers import Tier


@dataclass(frozen=True)
class EnsureEngine:
    """Create the tier's engine Deployment and Service if they do not exist."""

    tier: Tier
    node_name: str | None = None
    """Node chosen by the capacity check (used as a preferred placement hint only)."""
    interconnect: str | None = None
    """Interconnect of the chosen domain (for Simulate mode's simulator flags)."""
    group_size: int = 1
    """Pods of one replica: above 1 the engine is a LeaderWorkerSet group (PP across nodes), not a Deployment."""
    node_names: tuple[str, ...] = ()
    """Nodes the capacity check found for a group's pods (GPU reservations until the pods are bound)."""
    max_num_seqs: int | None = None
    """--max-num-seqs other than the spec's: the concurrency search's engine, so it can go above load.concurrency."""


@dataclass(frozen=True)
class SearchLoad:
    """One point of the concurrency search: the same workload at another concurrency, one repeat, no profiled slice."""

    concurrency: int
    num_requests: int


@dataclass(frozen=True)
class ConfirmLoad:
    """Predict-first's figures for a tier measured only to confirm them: the load test runs no more repeats after
    the first whose throughput and P99 lie within their bands (``kneepoint loadgen --expect``)."""

    output_tokens_per_second: float
    throughput_band: float
    latency_p99_ms: float | None
    p99_band: float

    def figures(self) -> tuple[tuple[str, float, float], ...]:
        """(load-generator summary key, expected value, relative band) of each figure to confirm."""
        out = [("outputTokensPerSecond", self.output_tokens_per_second, self.throughput_band)]
        if self.latency_p99_ms:
            out.append(("latencyP99Ms", self.latency_p99_ms, self.p99_band))
        return tuple(out)


@dataclass(frozen=True)
class EnsureLoadTest:
    """Create the load-test Job for one attempt if it does not exist."""

    tier: Tier
    attempt: int
    search: SearchLoad | None = None
    """A short load test of the concurrency search instead of the ladder's."""
    confirm: ConfirmLoad | None = None
    """Predict-first: stop repeating once a repeat confirms these figures (plan.stopRepeatsWhenConfirmed)."""


@dataclass(frozen=True)
class DeleteTier:
    """Delete the tier's children (engine Deployment, Service, load-test Jobs)."""

    tier: Tier
    keep_engine: bool = False


@dataclass(frozen=True)
class DeleteAllChildren:
    """Delete every child of the experiment (spec changed, or the experiment failed)."""

    keep_tier: Tier | None = None


@dataclass(frozen=True)
class PublishRecommendation:
    """Write the KServe InferenceService for the decision into the recommendation ConfigMap."""

    decision: Decision


@dataclass(frozen=True)
class EventRecord:
    """An Event on the experiment."""

    reason: str
    message: str
    type: str = "Normal"


Action = EnsureEngine | EnsureLoadTest | DeleteTier | DeleteAllChildren | PublishRecommendation
