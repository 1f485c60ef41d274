"""The concurrency search's cost: its GPU-minutes against the ladder's, on virtual time.

Runs the operator's pure passes (``core.needs`` says what a pass reads, ``core.ladder.reconcile_step``
moves it) for an example experiment against a virtual cluster of one 8-GPU node: every
``EnsureEngine`` sizes an engine as ``kneepoint sim`` does from the operator's own vLLM flags
(``kube.manifests.vllm_args``, the search's larger ``--max-num-seqs`` included), every
``EnsureLoadTest`` runs its workload (the ladder's, or the search point's concurrency and
request count, one repeat) with ``kneepoint.simulator.virtual_tier`` on a virtual clock, and
Prometheus' window is that run's (the KV pool from the engine's own block count, as
vllm:cache_config_info gives it). GPU-minutes are the operator's own figures from status:
``tiers[].gpuMinutes`` (the searched tier's includes the search) and
``concurrencySearch.gpuMinutes``.

Model load is not measured here: it is an assumption (``--model-load-s``, default 60 s, the
simulator's order for an 8B model; real vLLM 0.24 took 136 s for Llama-3.1-8B on one H200,
docs/simulator.md), paid by every engine the ladder or the search starts.

    .venv/bin/python benchmarks/concurrency_search_cost.py
    .venv/bin/python benchmarks/concurrency_search_cost.py --slo-p99-ms 2000     # misses at the load concurrency
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kneepoint.core.actions import DeleteAllChildren, DeleteTier, EnsureEngine, EnsureLoadTest
from kneepoint.core.architectures import architecture_from_spec, preset_names
from kneepoint.core.gpus import find_gpu_type
from kneepoint.core.ladder import LadderSettings, reconcile_step
from kneepoint.core.needs import needs
from kneepoint.core.observations import DomainCapacity, EngineState, FleetView, LoadTestState, MetricWindow, Observations
from kneepoint.core.spec import ExperimentSpec, parse_spec
from kneepoint.core.status import ExperimentStatus
from kneepoint.core.tiers import Tier
from kneepoint.kube.manifests import vllm_args
from kneepoint.simulator.virtual_tier import EngineStart, TierMeasurement, Workload, run_load_test, start_engine

ROOT = Path(__file__).resolve().parents[1]
T0 = 1_800_000_000.0
SETTINGS = LadderSettings(poll_seconds=5, waiting_poll_seconds=10, metrics_settle_seconds=10, metrics_deadline_seconds=100)


@dataclass
class _Engine:
    start: EngineStart
    ready_at: float


@dataclass
class _Job:
    measurement: TierMeasurement
    created: float

    @property
    def finish_at(self) -> float:
        return self.created + self.measurement.seconds


class VirtualCluster:
    """Engines and Jobs by name, on a virtual clock; answers exactly the reads ``core.needs`` names."""

    def __init__(self, spec: ExperimentSpec, model_load_s: float) -> None:
        self.spec = spec
        self.model_load_s = model_load_s
        self.arch = architecture_from_spec(spec.model.architecture, None, model_name=spec.model.uri)
        self.gpu = find_gpu_type(spec.placement.gpu_product or "NVIDIA-H200")
        self.engines: dict[Tier, _Engine] = {}
        self.jobs: dict[tuple[Tier, int], _Job] = {}
        self.engine_starts = 0
        self.load_tests = 0

    def observe(self, now: float, status: ExperimentStatus) -> Observations:
        need = needs(self.spec, status, SETTINGS)
        engine = job = metrics = None
        if need.engine is not None:
            e = self.engines.get(need.engine.tier)
            engine = EngineState(exists=e is not None, ready=e is not None and e.start.ok and now >= e.ready_at, node_name="h200-0")
        if need.load_test is not None:
            j = self.jobs.get((need.load_test.tier, need.load_test.attempt))
            if j is None:
                job = LoadTestState(need.load_test.attempt, False)
            elif now >= j.finish_at:
                job = LoadTestState(need.load_test.attempt, True, True, False, j.measurement.summary_at(j.created))
            else:
                job = LoadTestState(need.load_test.attempt, True)
        if need.metrics is not None:
            tier = need.metrics.tier
            j = max((j for (t, _), j in self.jobs.items() if t == tier), key=lambda j: j.created)
            settings = self.engines[tier].start.settings
            pool = settings.num_gpu_blocks * settings.block_size if settings is not None else None
            mm = j.measurement
            metrics = MetricWindow(
                peak_fb_used_gib=mm.memory_used_gib,
                peak_kv_cache_usage=mm.peak_kv_cache_usage,
                kv_cache_pool_tokens=pool,
                preemptions=mm.preemptions,
                gpu_utilization=mm.gpu_utilization,
                comm_fraction=mm.comm_fraction,
            )
        busy = sum(t.gpus for t in self.engines)
        fleet = FleetView((DomainCapacity("h200-0", "NVIDIA-H200", 8, 8 - busy, "h200-0-nvl0", 8, "nvlink"),))
        return Observations(
            now=now, generation=1, fleet=fleet, engine=engine, load_test=job, metrics=metrics, architecture=self.arch, gpu=self.gpu
        )

    def apply(self, actions: Sequence[Any], now: float) -> None:
        for action in actions:
            if isinstance(action, EnsureEngine) and action.tier not in self.engines:
                args = vllm_args(self.spec, action.tier, action.max_num_seqs) + ["--gpu", "NVIDIA-H200", "--noise", "0", "--seed", "0"]
                args += ["--dcgm-port", "0"]
                if self.arch.name in preset_names():
                    args += ["--architecture", self.arch.name]
                self.engines[action.tier] = _Engine(start_engine(args), now + self.model_load_s)
                self.engine_starts += 1
            elif isinstance(action, EnsureLoadTest) and (action.tier, action.attempt) not in self.jobs:
                load = self.spec.load
                search = action.search
                workload = Workload(
                    concurrency=search.concurrency if search else load.concurrency,
                    num_requests=search.num_requests if search else load.num_requests,
                    input_len=load.input_len,
                    output_len=load.output_len,
                    seed=load.seed,
                    warmup_requests=load.warmup_requests,
                    repeats=1 if search else load.repeats,
                )
                settings = self.engines[action.tier].start.settings
                assert settings is not None
                self.jobs[(action.tier, action.attempt)] = _Job(run_load_test(settings, workload), now)
                self.load_tests += 1
            elif isinstance(action, DeleteTier):
                self.engines.pop(action.tier, None)
                self.jobs = {k: v for k, v in self.jobs.items() if k[0] != action.tier}
            elif isinstance(action, DeleteAllChildren):
                self.engines = {t: e for t, e in self.engines.items() if t == action.keep_tier}
                self.jobs = {}

    def next_event(self, now: float) -> float | None:
        times = [e.ready_at for e in self.engines.values() if e.ready_at > now]
        times += [j.finish_at for j in self.jobs.values() if j.finish_at > now]
        return min(times) if times else None


def run(spec: ExperimentSpec, model_load_s: float) -> tuple[ExperimentStatus, VirtualCluster, float]:
    cluster = VirtualCluster(spec, model_load_s)
    status, now = ExperimentStatus(), T0
    for _ in range(10_000):
        step = reconcile_step(spec, status, cluster.observe(now, status), SETTINGS)
        status = step.status
        cluster.apply(step.actions, now)
        if status.phase in ("Decided", "Failed"):
            return status, cluster, now - T0
        if step.progressed:
            continue
        wait = step.requeue_after if step.requeue_after is not None else SETTINGS.poll_seconds
        nxt = cluster.next_event(now)
        now = min(now + max(wait, 0.5), nxt) if nxt is not None and nxt > now else now + max(wait, 0.5)
    raise RuntimeError("the experiment did not finish")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--example", default=str(ROOT / "deploy" / "examples" / "experiment.yaml"))
    parser.add_argument("--slo-p99-ms", type=int, default=None, help="Override capacity.slo.latencyP99Ms (a miss case).")
    parser.add_argument("--model-load-s", type=float, default=60.0, help="Assumed seconds from engine creation to Ready.")
    args = parser.parse_args(argv)
    doc = yaml.safe_load(Path(args.example).read_text())["spec"]
    if args.slo_p99_ms is not None:
        doc.setdefault("capacity", {}).setdefault("slo", {})["latencyP99Ms"] = args.slo_p99_ms
    spec = parse_spec(doc)
    status, cluster, wall = run(spec, args.model_load_s)
    search = status.concurrency_search
    decision = status.decision
    search_minutes = search.gpu_minutes if search is not None and search.gpu_minutes is not None else 0.0
    ladder_minutes = (status.gpu_minutes_total or 0.0) - search_minutes
    print(f"example: {args.example}  slo: {spec.capacity.slo}  model load (assumed): {args.model_load_s:g} s")
    print(f"engines started: {cluster.engine_starts}, load tests: {cluster.load_tests}, virtual wall time: {wall / 60:.1f} min")
    if decision is None:
        print(f"no decision: {status.message}")
        return 1
    print(
        f"decision: TP{decision.tensor_parallel} x {decision.replicas} replicas, per-replica concurrency "
        f"{decision.per_replica_concurrency} ({decision.per_replica_concurrency_source})"
    )
    for p in decision.concurrency_curve or ():
        print(
            f"  c={p.concurrency:>4}  {p.output_tokens_per_second or 0:>7.0f} tok/s  TTFT P95 {p.ttft_p95_ms or 0:>6.0f} ms  "
            f"P99 {p.latency_p99_ms or 0:>6.0f} ms  {'-' if p.slo_met is None else ('met' if p.slo_met else 'missed')} ({p.source})"
        )
    share = search_minutes / ladder_minutes if ladder_minutes > 0 else float("nan")
    print(
        f"GPU-minutes: ladder {ladder_minutes:.2f}, search {search_minutes:.2f} ({share:.0%} of the ladder's), total {status.gpu_minutes_total:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
