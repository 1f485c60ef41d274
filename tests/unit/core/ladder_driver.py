"""Plays the reconciler for the ladder state machine, pass by pass, with no cluster.

One driver for the ladder's unit tests (tests/unit/core/test_ladder*.py) and for
benchmarks/decision_cost.py, which drives the same passes against its virtual cluster: the
way a pass is run (observations in, status kept, actions and events out) is written once.
"""

from __future__ import annotations

from typing import Any

from kneepoint.core.actions import EnsureEngine, EnsureLoadTest
from kneepoint.core.architectures import get_preset
from kneepoint.core.gpus import get_gpu_type
from kneepoint.core.ladder import LadderSettings, reconcile_step
from kneepoint.core.observations import DomainCapacity, EngineState, FleetView, LoadTestState, MetricWindow, Observations
from kneepoint.core.spec import parse_spec
from kneepoint.core.status import ExperimentStatus
from kneepoint.core.tiers import Tier
from kneepoint.core.timestamps import rfc3339

H200 = get_gpu_type("h200")
SETTINGS = LadderSettings(poll_seconds=5, waiting_poll_seconds=10, metrics_settle_seconds=10, metrics_deadline_seconds=100)
T0 = 1_800_000_000.0
"""Virtual wall clock at the start of every run (any fixed instant)."""


def h200_fleet(free=(8, 8)):
    return FleetView(tuple(DomainCapacity(f"h200-{i}", "NVIDIA-H200", 8, f, f"h200-{i}-nvl0", 8, "nvlink") for i, f in enumerate(free)))


def make_spec(preset="llama-3-8b", **over):
    doc = {
        "model": {"uri": "hf://org/model", "architecture": {"preset": preset}},
        "tiers": {"tensorParallel": [1, 2, 4, 8]},
        "load": {"concurrency": 32, "numRequests": 200, "inputLen": 1024, "outputLen": 256},
        "placement": {"gpuProduct": "NVIDIA-H200"},
        "capacity": {"peakConcurrency": 320, "redundancyFactor": 1.3},
    }
    for key, value in over.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    return parse_spec(doc)


def summary(tok_s, p99_ms, ttft_p95=200.0, error_fraction=0.0, started=T0, finished=T0 + 60):
    return {
        "v": 1,
        "ok": True,
        "outputTokensPerSecond": tok_s,
        "requestsPerSecond": tok_s / 256,
        "ttftP50Ms": ttft_p95 / 2,
        "ttftP95Ms": ttft_p95,
        "ttftP99Ms": ttft_p95 * 1.2,
        "latencyP50Ms": p99_ms * 0.8,
        "latencyP95Ms": p99_ms * 0.95,
        "latencyP99Ms": p99_ms,
        "errorFraction": error_fraction,
        "completed": 200,
        "startedAt": rfc3339(started),
        "finishedAt": rfc3339(finished),
        "durationSeconds": finished - started,
    }


class Driver:
    """Plays the reconciler: keeps status, time and what the cluster shows."""

    def __init__(
        self, spec, fleet=None, preset=None, gpu=H200, settings: LadderSettings = SETTINGS, spec_hash: str | None = None, now: float = T0
    ):
        self.spec = spec
        self.status = ExperimentStatus()
        self.now = now
        self.fleet = fleet if fleet is not None else h200_fleet()
        self.gpu = gpu
        preset = preset or spec.model.architecture.preset
        self.arch = get_preset(preset) if preset else None
        self.settings = settings
        self.spec_hash = spec_hash
        self.log: list[Any] = []

    def step(self, **obs):
        """One pass with the driver's defaults (now, fleet, architecture, GPU) and ``obs`` over them."""
        base = dict(now=self.now, generation=1, fleet=self.fleet, architecture=self.arch, gpu=self.gpu)
        base.update(obs)
        return self.run_pass(Observations(**base))

    def run_pass(self, observations: Observations):
        """One pass with exactly ``observations``; the status it returns is kept."""
        result = reconcile_step(self.spec, self.status, observations, self.settings, spec_hash=self.spec_hash)
        self.status = result.status
        self.log.append(result)
        return result

    def tier(self, name):
        return self.status.tier(name)

    def measure(self, name, tok_s, p99_ms, kv=0.05, comm=None, fb=125.0, **window):
        """Take the current tier from Pending to Measured."""
        r = self.step()
        assert any(isinstance(a, EnsureEngine) and a.tier.name == name for a in r.actions), r.actions
        self.now += 30
        r = self.step(engine=EngineState(exists=True, ready=True, node_name="h200-0"))
        assert EnsureLoadTest(Tier(int(name[2]), 1), 1) in r.actions or any(isinstance(a, EnsureLoadTest) for a in r.actions)
        self.now += 70
        self.step(
            engine=EngineState(exists=True, ready=True),
            load_test=LoadTestState(1, True, True, False, summary(tok_s, p99_ms, started=self.now - 65, finished=self.now - 5)),
        )
        assert self.tier(name).phase == "Collecting"
        self.now += 20
        return self.step(
            metrics=MetricWindow(
                peak_fb_used_gib=fb, peak_kv_cache_usage=kv, preemptions=0, gpu_utilization=0.9, comm_fraction=comm, **window
            )
        )
