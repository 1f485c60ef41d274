"""Decision cost: GPU-minutes and wall time of kneepoint's ladder against an exhaustive sweep.

For each scenario (model x fleet x workload) and seed it runs, in-process and on virtual
time:

- **the ladder**: the operator's pure state machine (``kneepoint.core.ladder.reconcile_step``)
  driven pass by pass against a virtual cluster. Each ``EnsureEngine`` starts an engine the
  way ``kneepoint sim`` sizes it from the operator's own vLLM flags
  (``kube.manifests.vllm_args``), so a tier that does not fit fails out of memory at start;
  each ``EnsureLoadTest`` runs the experiment's workload against it with
  ``kneepoint.simulator.virtual_tier`` (the simulator's scheduler and roofline model with
  its step-time noise, the load generator's summary); Prometheus' window is the same run's
  KV-cache peak and communication share. The ladder plans, skips, waits, records and decides
  exactly as in the operator;
- **the exhaustive sweep**: every tier deployed (infeasible ones fail out of memory and
  cost their load time), every tier load-tested with every repeat, then the same
  ``decide()``. It is an independent run: its engines use other noise seeds.

"Same decision" is the same decided tier. GPU-minutes = tier GPUs x (model load + load
test) per deployed tier. Model load is not measured anywhere in this repository, so it is
an assumption, stated and printed: fetch the weights to the node (``--fetch-gbps``), copy
each GPU's shard (``--h2d-gbps``, the simulator's own default) and initialise the engine
(``--engine-init-s``: profiling run, KV-cache allocation, CUDA-graph capture).

Levers, each on its own (``variants``): estimator skipping, early stop, adaptive
load-test stopping (the experiment's ``spec.load.adaptive`` enabled with its default plan: each
repeat stopped by ``kneepoint loadgen --adaptive``'s own rule, ``kneepoint.loadgen.adaptive``,
as the load-test Job runs it), independent tiers at once on free GPUs
(wall time; a timeline over the measured tier durations), and model-load time shown
apart with what a node-local model cache would save.

    .venv/bin/python benchmarks/decision_cost.py                 # full set (18 scenarios x 5 seeds)
    .venv/bin/python benchmarks/decision_cost.py --seeds 2 --models 8b --fleets h200 --workloads chat
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kneepoint.core import reasons
from kneepoint.core.actions import ConfirmLoad, DeleteAllChildren, DeleteTier, EnsureEngine, EnsureLoadTest
from kneepoint.core.architectures import architecture_from_spec, preset_names
from kneepoint.core.decision import decide
from kneepoint.core.gpus import find_gpu_type
from kneepoint.core.ladder import LadderSettings, current_tier, derive_phase, ladder_tiers, measurement_hash
from kneepoint.core.memory_estimate import estimate_memory
from kneepoint.core.observations import (
    START_OUT_OF_MEMORY,
    DomainCapacity,
    EngineState,
    FleetView,
    LoadTestState,
    MetricWindow,
    Observations,
)
from kneepoint.core.prediction import LadderPrediction
from kneepoint.core.spec import AdaptiveLoadSpec, ExperimentSpec, StopRulesSpec, parse_spec
from kneepoint.core.status import TIER_PENDING, TIER_SKIPPED, ExperimentStatus, set_condition
from kneepoint.core.tiers import Tier
from kneepoint.kube.manifests import vllm_args
from kneepoint.loadgen.expectation import ExpectedFigure
from kneepoint.simulator.ladder_prediction import adaptive_plan_of, predict_ladder, workload_of
from kneepoint.simulator.virtual_tier import EngineStart, TierMeasurement, run_load_test, start_engine

# The ladder's passes are run by the same driver as its unit tests (tests/unit/core/ladder_driver.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit" / "core"))
from ladder_driver import T0 as EPOCH
from ladder_driver import Driver

GB = 1e9

# Stop rules that never fire: the sweep (and "no early stop") measures every tier, then the
# experiment's real rules decide.
NEVER_STOP = StopRulesSpec(memory_headroom=-1e9, min_throughput_gain=-1e9, max_p99_degradation=1e9, max_comm_fraction=1e9)


# --------------------------------------------------------------------------------------------
# Scenarios


@dataclass(frozen=True)
class Fleet:
    name: str
    label: str
    gpu_product: str
    nodes: int
    gpus_per_node: int
    interconnect: str
    nvlink_domain_size: int


@dataclass(frozen=True)
class Model:
    name: str
    uri: str


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    label: str
    load: dict[str, Any]
    max_model_len: int


FLEETS = {
    "h200": Fleet("h200", "H200 NVLink (2 nodes x 8)", "NVIDIA-H200", 2, 8, "nvlink", 8),
    "l40s": Fleet("l40s", "L40S PCIe (2 nodes x 8)", "NVIDIA-L40S", 2, 8, "pcie", 1),
}
MODELS = {
    "8b": Model("8b", "hf://meta-llama/Llama-3.1-8B-Instruct"),
    "14b": Model("14b", "hf://Qwen/Qwen2.5-14B-Instruct"),
    "70b": Model("70b", "hf://meta-llama/Llama-3.3-70B-Instruct"),
}
WORKLOADS = {
    "chat": WorkloadSpec(
        "chat",
        "short chat",
        {
            "endpoint": "ChatCompletions",
            "concurrency": 32,
            "numRequests": 400,
            "inputLen": 256,
            "outputLen": 128,
            "warmupRequests": 32,
            "repeats": 2,
        },
        4096,
    ),
    "long": WorkloadSpec(
        "long",
        "long prompt",
        {
            "endpoint": "Completions",
            "concurrency": 16,
            "numRequests": 400,
            "inputLen": 6144,
            "outputLen": 256,
            "warmupRequests": 16,
            "repeats": 2,
        },
        8192,
    ),
    "highconc": WorkloadSpec(
        "highconc",
        "high concurrency",
        {
            "endpoint": "Completions",
            "concurrency": 256,
            "numRequests": 1000,
            "inputLen": 512,
            "outputLen": 256,
            "warmupRequests": 256,
            "repeats": 2,
        },
        4096,
    ),
}


@dataclass(frozen=True)
class Scenario:
    model: Model
    fleet: Fleet
    workload: WorkloadSpec
    name: str = ""
    """A variant of the base scenario (near-threshold ones): added to the key."""
    stop_rules: tuple[tuple[str, float], ...] = ()
    """spec.stopRules overrides (camelCase key, value)."""
    engine_interconnect: str | None = None
    """The link the engines really use when it is not the fleet's label (a node labelled nvlink whose GPUs have no P2P)."""

    @property
    def key(self) -> str:
        base = f"{self.model.name}/{self.fleet.name}/{self.workload.name}"
        return f"{base}:{self.name}" if self.name else base

    @property
    def interconnect(self) -> str:
        return self.engine_interconnect or self.fleet.interconnect

    def spec_dict(self, mode: str = "Measure", load: dict[str, Any] | None = None) -> dict[str, Any]:
        """The experiment's spec as a user writes it (``load`` overrides fields of the workload)."""
        return {
            "model": {"uri": self.model.uri, "maxModelLen": self.workload.max_model_len},
            "mode": mode,
            "tiers": {"tensorParallel": [1, 2, 4, 8]},
            "load": dict(self.workload.load, seed=1234, **(load or {})),
            "placement": {"gpuProduct": self.fleet.gpu_product},
            "simulation": {"noiseFraction": 0.02},
            **({"stopRules": dict(self.stop_rules)} if self.stop_rules else {}),
        }

    def spec(self, mode: str = "Measure", load: dict[str, Any] | None = None) -> ExperimentSpec:
        return parse_spec(self.spec_dict(mode, load))


def scenarios(models: Sequence[str], fleets: Sequence[str], workloads: Sequence[str]) -> list[Scenario]:
    return [Scenario(MODELS[m], FLEETS[f], WORKLOADS[w]) for m in models for f in fleets for w in workloads]


NEAR_MARGIN = 0.03
"""Near-threshold scenarios put a threshold this far from the predicted figure: inside the prediction's band (so
predict-first must measure), outside the 2 % step noise (so the sweep's decision does not flip between seeds)."""


def _predicted(measurements: Measurements, scenario: Scenario) -> dict[str, Any]:
    pred = measurements.prediction(scenario, scenario.spec())
    return {f.tier.label: f for f in pred.tiers}


def near_threshold_scenarios(measurements: Measurements) -> list[Scenario]:
    """Scenarios whose thresholds sit near the predicted figures (placed from the prediction itself), and one where the
    prediction is wrong: the fleet is labelled NVLink but its engines talk over PCIe (no peer-to-peer)."""
    out = []
    base = Scenario(MODELS["8b"], FLEETS["h200"], WORKLOADS["chat"])
    f = _predicted(measurements, base)
    gain12 = f["TP2"].output_tokens_per_second / f["TP1"].output_tokens_per_second - 1
    # TP1 -> TP2 just above minThroughputGain: the comparison is within the band, so TP1 and TP2 are measured.
    out.append(
        dataclasses.replace(
            base, name="near-gain", stop_rules=(("memoryHeadroom", 0.10), ("minThroughputGain", round(gain12 - NEAR_MARGIN, 3)))
        )
    )
    # TP4's communication share just under maxCommFraction.
    out.append(
        dataclasses.replace(
            base,
            name="near-comm",
            stop_rules=(
                ("memoryHeadroom", 0.10),
                ("minThroughputGain", 0.05),
                ("maxCommFraction", round(f["TP4"].comm_fraction + NEAR_MARGIN, 3)),
            ),
        )
    )
    # The 1-GPU tier's memory share just above memoryHeadroom (one GPU is, narrowly, too full).
    mem = Scenario(MODELS["14b"], FLEETS["h200"], WORKLOADS["highconc"])
    run = run_ladder(mem, Variant("probe", skip=True, early_stop=True, adaptive=False, stream="probe"), measurements, LoadModel(), 0)
    tp1 = run.status.tier("tp1-pp1") if run.status is not None else None
    share = (tp1.peak_memory_gi_b or 0.0) / (tp1.gpu_memory_gi_b or 1.0) if tp1 is not None else 0.5
    out.append(dataclasses.replace(mem, name="near-memory", stop_rules=(("memoryHeadroom", round(share * (1 - NEAR_MARGIN), 3)),)))
    # 70B: TP4 -> TP8 just above minThroughputGain (TP8 wins narrowly).
    big = Scenario(MODELS["70b"], FLEETS["h200"], WORKLOADS["chat"])
    g = _predicted(measurements, big)
    gain48 = g["TP8"].output_tokens_per_second / g["TP4"].output_tokens_per_second - 1
    out.append(dataclasses.replace(big, name="near-gain", stop_rules=(("minThroughputGain", round(gain48 - NEAR_MARGIN, 3)),)))
    # The prediction is wrong: NVLink-labelled nodes whose engines run over PCIe. Measurements fall outside the band.
    out.append(dataclasses.replace(big, name="mislabelled-link", engine_interconnect="pcie"))
    return out


# Real vLLM 0.24 start-up of Llama-3.1-8B on one H200 (tests/data/vllm/README.md): healthy after 129 s cold
# (8b-tp1-serve-run1.log: torch.compile 27.0 s, engine init 53.1 s) and 89 s with VLLM_CACHE_ROOT kept
# (8b-tp1-serve-cached-restart.log: torch.compile 6.1 s, init 32.5 s); the first capture took 136 s. Those engines
# loaded dummy weights (1.9 s and 2.3 s of "Model loading took"), so weights are counted apart (fetch + shard).
MEASURED_START_COLD_S = 129.0 - 1.9
MEASURED_START_CACHED_S = 89.0 - 2.3


@dataclass(frozen=True)
class LoadModel:
    """Model-load time: fetch the weights, copy each shard to its GPU, then vLLM's measured start-up."""

    fetch_gbps: float = 1.25
    """GB/s from remote storage or the hub to the node (10 Gbit/s), the whole model per engine (an assumption)."""
    h2d_gbps: float = 2.0
    """GB/s into each GPU for its shard (``kneepoint sim``'s default, contract C)."""
    engine_init_s: float = MEASURED_START_COLD_S
    """Seconds of engine start-up besides the weights: real vLLM's measured 8B start, cold compile cache."""

    def fetch_seconds(self, weights_total: float) -> float:
        return weights_total / (self.fetch_gbps * GB)

    def seconds(self, weights_total: float, weights_per_gpu: float) -> float:
        return self.fetch_seconds(weights_total) + weights_per_gpu / (self.h2d_gbps * GB) + self.engine_init_s

    def oom_seconds(self, weights_total: float, weights_per_gpu: float, gpu_bytes: float) -> float:
        """An engine that does not fit fails once it has fetched and filled its GPU (no init)."""
        return self.fetch_seconds(weights_total) + min(weights_per_gpu, gpu_bytes) / (self.h2d_gbps * GB)


# --------------------------------------------------------------------------------------------
# Measurements (cached: variants of one run share their engines' noise seeds)


def seed_for(*parts: Any) -> int:
    return zlib.crc32("/".join(str(p) for p in parts).encode()) & 0x7FFFFFFF


class Measurements:
    """Engine starts and load tests, computed once per (scenario, load spec with its adaptive plan, noise stream, tier)."""

    def __init__(self, fixed_seed: int | None = None) -> None:
        self.fixed_seed = fixed_seed
        """Every engine gets this noise seed (as the operator's Simulate mode passes none: seed 0), not one per tier."""
        self._starts: dict[tuple[Any, ...], EngineStart] = {}
        self._tests: dict[tuple[Any, ...], TierMeasurement] = {}
        self._predictions: dict[tuple[Any, ...], LadderPrediction] = {}
        self.cpu_seconds = 0.0
        self.predict_cpu_seconds = 0.0

    def engine(self, scenario: Scenario, spec: ExperimentSpec, tier: Tier, interconnect: str, stream: str) -> EngineStart:
        key = (scenario.key, spec.load, spec.stop_rules, tier, interconnect)
        base = self._starts.get(key)
        if base is None:
            arch = architecture_from_spec(spec.model.architecture, None, model_name=spec.model.uri)
            args = vllm_args(spec, tier) + [
                "--gpu",
                scenario.fleet.gpu_product,
                "--interconnect",
                interconnect,
                "--noise",
                f"{spec.simulation.noise_fraction:g}",
                "--seed",
                "0",
                "--dcgm-port",
                "0",
            ]
            if arch.name in preset_names():
                args += ["--architecture", arch.name]
            base = self._starts[key] = start_engine(args)
        if not base.ok:
            return base
        assert base.settings is not None
        seed = self.fixed_seed if self.fixed_seed is not None else seed_for(stream, tier.name)
        return dataclasses.replace(base, settings=dataclasses.replace(base.settings, seed=seed))

    def prediction(self, scenario: Scenario, spec: ExperimentSpec) -> LadderPrediction:
        """Predict-first's observation: the whole ladder on the simulator without noise, as the reconciler computes it
        (the fleet's interconnect label, the operator's vLLM flags)."""
        key = (scenario.model.name, scenario.fleet.name, spec.load, spec.model)
        found = self._predictions.get(key)
        if found is None:
            began = time.process_time()
            arch = architecture_from_spec(spec.model.architecture, None, model_name=spec.model.uri)
            args = {tier: vllm_args(spec, tier) for tier in ladder_tiers(spec)}
            preset = arch.name if arch.name in preset_names() else None
            found = predict_ladder(spec, args, scenario.fleet.gpu_product, scenario.fleet.interconnect, preset)
            self.predict_cpu_seconds += time.process_time() - began
            self._predictions[key] = found
        return found

    def load_test(
        self, scenario: Scenario, spec: ExperimentSpec, start: EngineStart, stream: str, tier: Tier, confirm: ConfirmLoad | None = None
    ) -> TierMeasurement:
        """The Job's load test: the spec's workload, each repeat stopped by spec.load.adaptive's plan when enabled, no more
        repeats after one that confirms predict-first's figures (the Job's --expect) when the ladder asks for it."""
        key = (scenario.key, spec.load, stream, tier, confirm)
        found = self._tests.get(key)
        if found is None:
            assert start.settings is not None
            began = time.process_time()
            expect = [ExpectedFigure(*f) for f in confirm.figures()] if confirm is not None else []
            found = run_load_test(start.settings, workload_of(spec), adaptive_plan_of(spec), expect)
            self.cpu_seconds += time.process_time() - began
            self._tests[key] = found
        return found


# --------------------------------------------------------------------------------------------
# The virtual cluster


@dataclass
class _Engine:
    tier: Tier
    node: str
    created: float
    start: EngineStart
    load_seconds: float
    fetch_seconds: float
    deleted: float | None = None
    test_seconds: float = 0.0

    @property
    def event_at(self) -> float:
        return self.created + self.load_seconds


@dataclass
class _Job:
    tier: Tier
    attempt: int
    created: float
    measurement: TierMeasurement
    deleted: float | None = None

    @property
    def finish_at(self) -> float:
        return self.created + self.measurement.seconds


@dataclass
class TierCost:
    """One deployed tier in a run: what it held and for how long."""

    tier: Tier
    node: str
    out_of_memory: bool
    load_seconds: float
    fetch_seconds: float
    test_seconds: float
    started: float
    ended: float
    requests_sent: int = 0

    @property
    def gpu_minutes(self) -> float:
        return self.tier.gpus * (self.load_seconds + self.test_seconds) / 60.0

    @property
    def load_gpu_minutes(self) -> float:
        return self.tier.gpus * self.load_seconds / 60.0


class VirtualCluster:
    """Nodes, engines and load-test Jobs on virtual time, answering the ladder's observations."""

    def __init__(self, scenario: Scenario, spec: ExperimentSpec, measurements: Measurements, stream: str, load_model: LoadModel) -> None:
        self.scenario, self.spec, self.m = scenario, spec, measurements
        self.stream, self.load_model = stream, load_model
        fleet = scenario.fleet
        self.gpu = find_gpu_type(fleet.gpu_product)
        self.arch = architecture_from_spec(spec.model.architecture, None, model_name=spec.model.uri)
        self.nodes = [f"{fleet.name}-{i}" for i in range(fleet.nodes)]
        self.engines: dict[Tier, _Engine] = {}
        self.jobs: dict[tuple[Tier, int], _Job] = {}
        self.costs: list[TierCost] = []

    # -- what the API would show
    def fleet_view(self) -> FleetView:
        f = self.scenario.fleet
        used = dict.fromkeys(self.nodes, 0)
        for e in self.engines.values():
            used[e.node] += e.tier.gpus
        return FleetView(
            tuple(
                DomainCapacity(
                    node_name=n,
                    gpu_product=f.gpu_product,
                    gpus_total=f.gpus_per_node,
                    gpus_free=f.gpus_per_node - used[n],
                    nvlink_domain=f"{n}-nvl0",
                    nvlink_domain_size=f.nvlink_domain_size,
                    interconnect=f.interconnect,
                )
                for n in self.nodes
            )
        )

    def observe(self, now: float, status: ExperimentStatus) -> Observations:
        current = current_tier(status)
        engine = job = metrics = None
        if current is not None:
            tier = Tier(current.tensor_parallel, current.pipeline_parallel)
            e = self.engines.get(tier)
            if e is not None:
                if now < e.event_at:
                    engine = EngineState(exists=True, ready=False, node_name=e.node)
                elif e.start.ok:
                    engine = EngineState(exists=True, ready=True, node_name=e.node)
                else:
                    engine = EngineState(
                        exists=True,
                        ready=False,
                        node_name=e.node,
                        start_failure=START_OUT_OF_MEMORY if e.start.out_of_memory else "CrashLoopBackOff",
                        failure_message=e.start.message,
                        restarts=9,
                    )
            if current.phase == "LoadTesting":
                attempt = current.attempts or 1
                j = self.jobs.get((tier, attempt))
                if j is None:
                    job = LoadTestState(attempt=attempt, exists=False)
                elif now >= j.finish_at:
                    job = LoadTestState(attempt, True, True, False, j.measurement.summary_at(j.created))
                else:
                    job = LoadTestState(attempt, True)
            if current.phase == "Collecting":
                j = max((j for (t, _), j in self.jobs.items() if t == tier), key=lambda j: j.attempt)
                mm = j.measurement
                metrics = MetricWindow(
                    peak_fb_used_gib=mm.memory_used_gib,
                    peak_kv_cache_usage=mm.peak_kv_cache_usage,
                    preemptions=mm.preemptions,
                    gpu_utilization=mm.gpu_utilization,
                    comm_fraction=mm.comm_fraction,
                )
        # The reconciler reads the fleet only in Measure mode (Simulate needs no GPUs).
        fleet = self.fleet_view() if self.spec.mode == "Measure" else None
        return Observations(
            now=now, generation=1, fleet=fleet, engine=engine, load_test=job, metrics=metrics, architecture=self.arch, gpu=self.gpu
        )

    def next_event(self, now: float) -> float | None:
        times = [e.event_at for e in self.engines.values() if e.event_at > now]
        times += [j.finish_at for j in self.jobs.values() if j.deleted is None and j.finish_at > now]
        return min(times) if times else None

    # -- applying the ladder's actions
    def _weights(self, tier: Tier) -> tuple[float, float]:
        est = estimate_memory(
            self.arch,
            self.gpu,
            tier,
            dtype=self.spec.model.dtype,
            max_model_len=self.spec.model.max_model_len,
            concurrency=self.spec.load.concurrency,
            context_len=self.spec.load.input_len + self.spec.load.output_len,
            gpu_memory_utilization=self.spec.engine.gpu_memory_utilization,
        )
        return float(est.weights_bytes_per_gpu * tier.gpus), float(est.weights_bytes_per_gpu)

    def ensure_engine(self, tier: Tier, node: str | None, now: float) -> None:
        if tier in self.engines:
            return
        node = node or self.nodes[0]
        start = self.m.engine(self.scenario, self.spec, tier, self.scenario.interconnect, self.stream)
        total, per_gpu = self._weights(tier)
        lm = self.load_model
        seconds = lm.seconds(total, per_gpu) if start.ok else lm.oom_seconds(total, per_gpu, self.gpu.memory_bytes)
        self.engines[tier] = _Engine(tier, node, now, start, seconds, lm.fetch_seconds(total))

    def ensure_load_test(self, tier: Tier, attempt: int, now: float, confirm: ConfirmLoad | None = None) -> None:
        if (tier, attempt) in self.jobs:
            return
        e = self.engines[tier]
        measurement = self.m.load_test(self.scenario, self.spec, e.start, self.stream, tier, confirm)
        self.jobs[(tier, attempt)] = _Job(tier, attempt, now, measurement)

    def delete_tier(self, tier: Tier, now: float) -> None:
        e = self.engines.pop(tier, None)
        tests = [j for (t, _), j in self.jobs.items() if t == tier and j.deleted is None]
        test_seconds = 0.0
        sent = 0
        for j in tests:
            j.deleted = now
            ran = min(now, j.finish_at) - j.created
            test_seconds += ran
            sent += j.measurement.requests_sent if now >= j.finish_at else 0
        if e is not None:
            ended = min(now, e.event_at) if not e.start.ok else now
            load = min(e.load_seconds, now - e.created)
            self.costs.append(TierCost(tier, e.node, not e.start.ok, load, e.fetch_seconds, test_seconds, e.created, ended, sent))

    def apply(self, actions: Sequence[Any], now: float) -> None:
        for action in actions:
            if isinstance(action, EnsureEngine):
                self.ensure_engine(action.tier, action.node_name, now)
            elif isinstance(action, EnsureLoadTest):
                self.ensure_load_test(action.tier, action.attempt, now, action.confirm)
            elif isinstance(action, DeleteTier):
                self.delete_tier(action.tier, now)
            elif isinstance(action, DeleteAllChildren):
                for tier in list(self.engines):
                    if action.keep_tier is None or tier != action.keep_tier:
                        self.delete_tier(tier, now)


# --------------------------------------------------------------------------------------------
# One run of the ladder


@dataclass(frozen=True)
class Variant:
    name: str
    skip: bool
    early_stop: bool
    adaptive: bool
    """spec.load.adaptive enabled with the spec's default plan (what ``adaptive: {enabled: true}`` gives)."""
    stream: str = "ladder"
    description: str = ""
    max_attempts: int | None = None
    """Override spec.load.maxAttempts (what-if: no second attempt after a failed or timed-out load test)."""
    skip_short_kv: bool = False
    """What-if (not in the operator): also skip tiers whose estimated KV pool cannot hold the load's concurrency."""
    predict_first: bool = False
    """spec.plan.predictFirst: the plan gets the simulator's prediction of the whole ladder (core/predict_first.py)."""
    every_repeat: bool = False
    """spec.plan.stopRepeatsWhenConfirmed false: a tier measured only to confirm the prediction runs every repeat too."""


REFERENCE = Variant(
    "exhaustive",
    skip=False,
    early_stop=False,
    adaptive=False,
    stream="exhaustive",
    description="every tier, every repeat (independent noise)",
)
PREDICT_FIRST = "predict first"
VARIANTS = (
    Variant(
        "ladder",
        skip=True,
        early_stop=True,
        adaptive=False,
        description="the full ladder (predictFirst false): estimator skip + early stop",
    ),
    Variant(
        PREDICT_FIRST,
        skip=True,
        early_stop=True,
        adaptive=False,
        predict_first=True,
        description="kneepoint's default: predict the ladder on the simulator, measure what can change the decision",
    ),
    Variant(
        "predict first (every repeat)",
        skip=True,
        early_stop=True,
        adaptive=False,
        predict_first=True,
        every_repeat=True,
        description="lever off: plan.stopRepeatsWhenConfirmed false (a tier measured to confirm runs every repeat too)",
    ),
    Variant(
        "predict first + adaptive",
        skip=True,
        early_stop=True,
        adaptive=True,
        predict_first=True,
        description="predict first with adaptive load-test stopping",
    ),
    Variant("skip only", skip=True, early_stop=False, adaptive=False, description="lever: skip tiers the estimator rules out"),
    Variant("early stop only", skip=False, early_stop=True, adaptive=False, description="lever: stop as soon as a rule fires"),
    Variant("adaptive only", skip=False, early_stop=False, adaptive=True, description="lever: stop a load test at the stated confidence"),
    Variant("ladder + adaptive", skip=True, early_stop=True, adaptive=True, description="all three"),
    Variant(
        "ladder, 1 attempt",
        skip=True,
        early_stop=True,
        adaptive=False,
        max_attempts=1,
        description="what-if: load.maxAttempts 1 (no retry of a timed-out test)",
    ),
    Variant(
        "ladder, skip KV-short tiers",
        skip=True,
        early_stop=True,
        adaptive=False,
        skip_short_kv=True,
        description="what-if: also skip tiers whose KV pool cannot hold the concurrency",
    ),
    Variant(
        "all levers",
        skip=True,
        early_stop=True,
        adaptive=True,
        max_attempts=1,
        skip_short_kv=True,
        description="what-if: ladder + adaptive + 1 attempt + skip KV-short tiers",
    ),
)


@dataclass
class RunResult:
    variant: Variant
    decision: str | None
    rule: str | None
    costs: list[TierCost]
    wall_seconds: float
    passes: int
    tiers_measured: int
    status: ExperimentStatus | None = None
    fallback: str | None = None
    """Predict-first: why the run fell back to the full ladder (a measurement outside its band)."""

    @property
    def gpu_minutes(self) -> float:
        return sum(c.gpu_minutes for c in self.costs)

    @property
    def load_gpu_minutes(self) -> float:
        return sum(c.load_gpu_minutes for c in self.costs)

    def cached_load_gpu_minutes(self) -> float:
        """Load GPU-minutes if each node kept the weights on local disk after its first fetch."""
        seen: set[str] = set()
        total = 0.0
        for c in sorted(self.costs, key=lambda c: c.started):
            saved = c.fetch_seconds if c.node in seen else 0.0
            seen.add(c.node)
            total += c.tier.gpus * max(0.0, min(c.load_seconds, c.load_seconds - saved)) / 60.0
        return total


def _skip_short_kv(spec: ExperimentSpec, status: ExperimentStatus, cluster: VirtualCluster, now: float) -> ExperimentStatus:
    """What-if: Skip planned tiers whose estimated KV pool holds fewer than ``load.concurrency`` sequences."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    tiers = []
    for t in status.tiers:
        if t.phase == TIER_PENDING:
            est = estimate_memory(
                cluster.arch,
                cluster.gpu,
                Tier(t.tensor_parallel, t.pipeline_parallel),
                dtype=spec.model.dtype,
                max_model_len=spec.model.max_model_len,
                concurrency=spec.load.concurrency,
                context_len=spec.load.input_len + spec.load.output_len,
                gpu_memory_utilization=spec.engine.gpu_memory_utilization,
            )
            if not est.fits_target:
                t = dataclasses.replace(
                    t,
                    phase=TIER_SKIPPED,
                    finished_at=stamp,
                    reason=f"what-if: KV pool holds {est.max_concurrent_sequences} of {spec.load.concurrency} sequences",
                )
        tiers.append(t)
    if all(t.phase != TIER_PENDING for t in tiers):
        return status  # nothing left to run: keep the plan as the operator made it
    return dataclasses.replace(status, tiers=tuple(tiers))


def _unskip(status: ExperimentStatus, now: float) -> ExperimentStatus:
    """The plan with every tier the estimate skipped put back to Pending (deploy it anyway)."""
    tiers = tuple(
        dataclasses.replace(t, phase=TIER_PENDING, reason=None, does_not_fit=None, finished_at=None)
        if t.phase == TIER_SKIPPED and t.does_not_fit
        else t
        for t in status.tiers
    )
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    conditions = tuple(c for c in status.conditions if c.type not in (reasons.DECIDED, reasons.FAILED))
    conditions = set_condition(conditions, reasons.PROFILING, "True", reasons.LADDER_RUNNING, "Profiling every tier.", stamp, 1)
    out = dataclasses.replace(
        status, tiers=tiers, conditions=conditions, decision=None, decided_tier=None, finished_at=None, current_tier=None
    )
    return dataclasses.replace(out, phase=derive_phase(out.conditions))


def run_ladder(
    scenario: Scenario,
    variant: Variant,
    measurements: Measurements,
    load_model: LoadModel,
    seed: int,
    settings: LadderSettings | None = None,
    max_passes: int = 10_000,
    spec: ExperimentSpec | None = None,
) -> RunResult:
    """Drive reconcile_step against a virtual cluster until the experiment is Decided or Failed (and return
    the final status's tiers in ``RunResult.status``)."""
    spec = spec or scenario.spec()
    load = spec.load
    if variant.max_attempts is not None:
        load = dataclasses.replace(load, max_attempts=variant.max_attempts)
    if variant.adaptive:
        load = dataclasses.replace(load, adaptive=dataclasses.replace(load.adaptive, enabled=True))
    plan = dataclasses.replace(spec.plan, predict_first=variant.predict_first, stop_repeats_when_confirmed=not variant.every_repeat)
    spec = dataclasses.replace(spec, load=load, plan=plan)
    ladder_spec = spec if variant.early_stop else dataclasses.replace(spec, stop_rules=NEVER_STOP)
    stream = f"{variant.stream}/{seed}"
    cluster = VirtualCluster(scenario, spec, measurements, stream, load_model)
    driver = Driver(ladder_spec, cluster.fleet_view(), settings=settings or LadderSettings(), spec_hash=measurement_hash(spec))
    status = driver.status
    now = EPOCH
    passes = 0
    while passes < max_passes:
        passes += 1
        obs = cluster.observe(now, driver.status)
        if variant.predict_first and not driver.status.tiers:
            obs = dataclasses.replace(obs, prediction=measurements.prediction(scenario, spec))  # needs(): the plan asks
        step = driver.run_pass(obs)
        if passes == 1 and not variant.skip:
            driver.status = _unskip(driver.status, now)
        if passes == 1 and variant.skip_short_kv and driver.status.phase not in ("Decided", "Failed"):
            driver.status = _skip_short_kv(spec, driver.status, cluster, now)
        status = driver.status
        cluster.apply(step.actions, now)
        if status.phase in ("Decided", "Failed"):
            break
        if step.progressed and not step.requeue_after:
            continue  # the reconciler chains passes while the status moves (Reconciler.reconcile)
        wake = now + (step.requeue_after if step.requeue_after is not None else 30.0)
        event = cluster.next_event(now)
        now = min(wake, event) if event is not None else wake  # child events wake the daemon early
    else:
        raise RuntimeError(f"{scenario.key} {variant.name}: no decision after {max_passes} passes")
    for tier in list(cluster.engines):
        cluster.delete_tier(tier, now)
    outcome = decide(spec, status.tiers)
    decision = outcome.decision
    label = Tier(decision.tensor_parallel, decision.pipeline_parallel).label if decision else None
    measured = sum(1 for t in status.tiers if t.phase == "Measured")
    fallback = status.prediction.fallback if status.prediction is not None else None
    return RunResult(variant, label, decision.rule if decision else None, cluster.costs, now - EPOCH, passes, measured, status, fallback)


@dataclass(frozen=True)
class TimelineTier:
    gpus: int
    seconds: float
    """Wall time the tier held its GPUs in the sequential run (load, test, metrics settle)."""
    busy_seconds: float
    """Load plus load test (what GPU-minutes count)."""
    needed: bool
    """False for a tier started speculatively that the decision turned out not to need."""


def parallel_timeline(tiers: Sequence[TimelineTier], gpus_per_node: int, nodes: int, window: int | None) -> tuple[float, float]:
    """(wall seconds, GPU-minutes) if up to ``window`` tiers (None: any number) ran at once on free GPUs.

    Tiers start in ladder order as soon as a slot and a node with room are free. The decision
    is known when every needed tier has finished; a speculative tier still running then is
    cancelled (its GPU time so far counts), one not started yet costs nothing.
    """
    free = [gpus_per_node] * nodes
    running: list[tuple[float, int, int]] = []  # (end, node, gpus)
    now = 0.0
    starts: list[float] = []
    for t in tiers:
        while True:
            running.sort()
            fits = [i for i in range(nodes) if free[i] >= t.gpus]
            if fits and (window is None or len(running) < window):
                break
            if not running:
                raise ValueError(f"a {t.gpus}-GPU tier never fits on {nodes} x {gpus_per_node} GPUs")
            end, node, gpus = running.pop(0)
            now = max(now, end)
            free[node] += gpus
        node = min(fits, key=lambda i: (free[i], i))
        free[node] -= t.gpus
        running.append((now + t.seconds, node, t.gpus))
        starts.append(now)
    decided = max((s + t.seconds for s, t in zip(starts, tiers) if t.needed), default=0.0)
    gpu_minutes = 0.0
    for s, t in zip(starts, tiers):
        if t.needed:
            gpu_minutes += t.gpus * t.busy_seconds / 60.0
        elif s < decided:
            gpu_minutes += t.gpus * min(t.busy_seconds, decided - s) / 60.0
    return decided, gpu_minutes


def timeline_tiers(result: RunResult, speculative_from: RunResult | None = None) -> list[TimelineTier]:
    """The tiers ``result`` deployed, in order; with ``speculative_from``, plus the next ladder tier it did not
    deploy (taken from that run), which a speculative scheduler would have started early."""
    costs = sorted(result.costs, key=lambda c: c.started)
    out = [TimelineTier(c.tier.gpus, c.ended - c.started, c.load_seconds + c.test_seconds, True) for c in costs]
    if speculative_from is not None and costs:
        last = costs[-1].tier
        later = sorted((c for c in speculative_from.costs if c.tier.gpus > last.gpus and not c.out_of_memory), key=lambda c: c.tier.gpus)
        if later:
            c = later[0]
            out.append(TimelineTier(c.tier.gpus, c.ended - c.started, c.load_seconds + c.test_seconds, False))
    return out


# --------------------------------------------------------------------------------------------
# The benchmark


@dataclass
class ScenarioSeed:
    scenario: Scenario
    seed: int
    reference: RunResult
    variants: dict[str, RunResult] = field(default_factory=dict)


def run_scenario_seed(
    scenario: Scenario, seed: int, measurements: Measurements, load_model: LoadModel, variants: Sequence[Variant] = VARIANTS
) -> ScenarioSeed:
    """The exhaustive sweep and every variant for one scenario and seed."""
    out = ScenarioSeed(scenario, seed, run_ladder(scenario, REFERENCE, measurements, load_model, seed))
    for v in variants:
        out.variants[v.name] = run_ladder(scenario, v, measurements, load_model, seed)
    return out


def _fmt_min(x: float) -> str:
    return f"{x:.1f}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths)), "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def _mode(values: Sequence[Any]) -> str:
    counts: dict[Any, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    best = max(counts.items(), key=lambda kv: kv[1])
    return f"{best[0] or 'none'}" + (f" ({best[1]}/{len(values)})" if len(counts) > 1 else "")


def _measured_names(run: RunResult) -> str:
    tiers = run.status.tiers if run.status is not None else ()
    return ",".join(str(t.tensor_parallel) for t in tiers if t.phase == "Measured") or "-"


def scenario_table(results: Sequence[ScenarioSeed]) -> str:
    """One row per scenario: decisions, GPU-minutes and wall time of the sweep, the full ladder and predict-first
    (means over seeds; "measured": TP sizes measured, seed 1; "fallback": runs that fell back to the full ladder)."""
    by_key: dict[str, list[ScenarioSeed]] = {}
    for r in results:
        by_key.setdefault(r.scenario.key, []).append(r)
    has_pf = all(PREDICT_FIRST in r.variants for r in results)
    rows = []
    for key, rs in by_key.items():
        ref = [r.reference for r in rs]
        lad = [r.variants["ladder"] for r in rs]
        agree = sum(1 for a, b in zip(ref, lad) if a.decision == b.decision)
        ref_gm = statistics.fmean(x.gpu_minutes for x in ref)
        lad_gm = statistics.fmean(x.gpu_minutes for x in lad)
        row = [
            key,
            _mode([x.decision for x in ref]),
            _mode([f"{x.decision} {x.rule}" if x.decision else None for x in lad]),
            f"{agree}/{len(rs)}",
            _fmt_min(ref_gm),
            _fmt_min(lad_gm),
            f"{lad_gm / ref_gm:.0%}" if ref_gm else "-",
            f"{statistics.fmean(x.load_gpu_minutes for x in lad) / lad_gm:.0%}" if lad_gm else "-",
            _fmt_min(statistics.fmean(x.wall_seconds for x in ref) / 60),
            _fmt_min(statistics.fmean(x.wall_seconds for x in lad) / 60),
        ]
        if has_pf:
            pf = [r.variants[PREDICT_FIRST] for r in rs]
            pf_agree = sum(1 for a, b in zip(ref, pf) if a.decision == b.decision)
            pf_gm = statistics.fmean(x.gpu_minutes for x in pf)
            row += [
                _mode([f"{x.decision} {x.rule}" if x.decision else None for x in pf]),
                f"{pf_agree}/{len(rs)}",
                _fmt_min(pf_gm),
                f"{pf_gm / ref_gm:.0%}" if ref_gm else "-",
                _fmt_min(statistics.fmean(x.wall_seconds for x in pf) / 60),
                f"{sum(1 for x in pf if x.fallback)}/{len(pf)}",
                "/".join(_measured_names(x) for x in (ref[0], lad[0], pf[0])),
            ]
        else:
            row.append("/".join(_measured_names(x) for x in (ref[0], lad[0])))
        rows.append(row)
    headers = [
        "scenario (model/fleet/workload)",
        "sweep decides",
        "ladder decides (rule)",
        "same",
        "sweep GPU-min",
        "ladder GPU-min",
        "ratio",
        "load share",
        "sweep wall min",
        "ladder wall min",
    ]
    if has_pf:
        headers += ["predict-first decides (rule)", "same", "GPU-min", "ratio", "wall min", "fallback", "measured TP sweep/ladder/pf"]
    else:
        headers.append("measured TP sweep/ladder")
    return _table(headers, rows)


def agreement_line(name: str, results: Sequence[ScenarioSeed], variant: str) -> str:
    """Same decision, GPU-minutes in total and per scenario-seed (median), wall time: ``variant`` against the sweep."""
    n = len(results)
    runs = [r.variants[variant] for r in results]
    agree = sum(1 for r, x in zip(results, runs) if x.decision == r.reference.decision)
    ratio = sum(x.gpu_minutes for x in runs) / sum(r.reference.gpu_minutes for r in results)
    per = [x.gpu_minutes / r.reference.gpu_minutes for r, x in zip(results, runs) if r.reference.gpu_minutes]
    wall = sum(x.wall_seconds for x in runs) / sum(r.reference.wall_seconds for r in results)
    fallbacks = sum(1 for x in runs if x.fallback)
    return (
        f"{name}: same decision in {agree}/{n} scenario-seeds ({agree / n:.1%}; goal >= 95%), GPU-minutes {ratio:.1%} of the "
        f"sweep in total (goal <= 40%), per scenario-seed median {statistics.median(per):.0%} (goal <= 25%), "
        f"{sum(1 for x in per if x <= 0.40)}/{len(per)} at or under 40%; wall time {wall:.1%} of the sweep"
        + (f"; fell back to the full ladder in {fallbacks}" if variant == PREDICT_FIRST else "")
    )


def lever_rows(results: Sequence[ScenarioSeed], fleets: dict[str, Fleet], variants: Sequence[Variant] = VARIANTS) -> list[list[str]]:
    n = len(results)
    ref_gm = sum(r.reference.gpu_minutes for r in results)
    ref_wall = sum(r.reference.wall_seconds for r in results)
    rows = [["exhaustive sweep", "(reference)", f"{ref_gm:.0f}", "100%", f"{ref_wall / 60:.0f}", "100%", "every tier, every repeat"]]

    def row(name: str, runs: Sequence[RunResult], gm: float, wall: float, note: str) -> list[str]:
        agree = sum(1 for r, x in zip(results, runs) if x.decision == r.reference.decision)
        return [
            name,
            f"{agree}/{n} ({agree / n:.1%})",
            f"{gm:.0f}",
            f"{gm / ref_gm:.1%}",
            f"{wall / 60:.0f}",
            f"{wall / ref_wall:.1%}",
            note,
        ]

    for v in variants:
        runs = [r.variants[v.name] for r in results]
        rows.append(row(v.name, runs, sum(x.gpu_minutes for x in runs), sum(x.wall_seconds for x in runs), v.description))
    # Independent tiers at once (wall time), from the measured tier durations.
    wall_all = gm_all = wall_two = gm_two = 0.0
    for r in results:
        f = fleets[r.scenario.fleet.name]
        w, g = parallel_timeline(timeline_tiers(r.reference), f.gpus_per_node, f.nodes, None)
        wall_all += w
        gm_all += g
        w, g = parallel_timeline(timeline_tiers(r.variants["ladder"], r.reference), f.gpus_per_node, f.nodes, 2)
        wall_two += w
        gm_two += g
    rows.append(
        row(
            "sweep, tiers at once",
            [r.reference for r in results],
            gm_all,
            wall_all,
            "lever: every tier at once where the fleet has room (timeline)",
        )
    )
    rows.append(
        row(
            "ladder, 2 tiers at once",
            [r.variants["ladder"] for r in results],
            gm_two,
            wall_two,
            "lever: next tier deployed while the current one measures (timeline)",
        )
    )
    # Model load apart: what a node-local cache would leave.
    for name, key in (
        ("ladder, node-local model cache", "ladder"),
        ("predict first, node-local model cache", PREDICT_FIRST),
        ("all levers + cache", "all levers"),
    ):
        if not all(key in r.variants for r in results):
            continue
        runs = [r.variants[key] for r in results]
        load = sum(x.load_gpu_minutes for x in runs)
        cached = sum(x.cached_load_gpu_minutes() for x in runs)
        gm = sum(x.gpu_minutes for x in runs)
        rows.append(
            row(
                name,
                runs,
                gm - load + cached,
                sum(x.wall_seconds for x in runs),
                f"lever: model load {load:.0f} of {gm:.0f} GPU-min; {cached:.0f} if each node fetched the weights once",
            )
        )
    return rows


ADAPTIVE_PAIRS = (("ladder + adaptive", "ladder"), ("predict first + adaptive", PREDICT_FIRST), ("adaptive only", REFERENCE.name))


def adaptive_lines(results: Sequence[ScenarioSeed], variants: Sequence[Variant] = VARIANTS) -> list[str]:
    """Per adaptive variant against its fixed-plan counterpart: load-test GPU-minutes (model load left out) and the
    requests sent by the load tests that finished (warm-up included; a timed-out test counts none)."""
    names = {v.name for v in variants} | {REFERENCE.name}
    out = []
    for adaptive, fixed in ADAPTIVE_PAIRS:
        if adaptive not in names or fixed not in names:
            continue
        runs = [r.variants[adaptive] for r in results]
        bases = [r.reference if fixed == REFERENCE.name else r.variants[fixed] for r in results]
        test = sum(x.gpu_minutes - x.load_gpu_minutes for x in runs)
        base_test = sum(x.gpu_minutes - x.load_gpu_minutes for x in bases)
        sent = sum(c.requests_sent for x in runs for c in x.costs)
        base_sent = sum(c.requests_sent for x in bases for c in x.costs)
        out.append(
            f"{adaptive} vs {fixed}: load-test GPU-minutes {test:.0f} of {base_test:.0f} ({test / base_test:.1%}); "
            f"requests sent by finished load tests {sent} of {base_sent} ({sent / base_sent:.1%})"
        )
    return out


def lever_table(results: Sequence[ScenarioSeed], fleets: dict[str, Fleet], variants: Sequence[Variant] = VARIANTS) -> str:
    return _table(
        ["variant", "same decision as the sweep", "GPU-min", "vs sweep", "wall min", "vs sweep", "what"],
        lever_rows(results, fleets, variants),
    )


def _run_scenario(job: tuple[Scenario, int, LoadModel, Sequence[Variant]]) -> tuple[list[ScenarioSeed], float, float]:
    """Every seed of one scenario (a worker's unit with --jobs: its own measurement cache)."""
    scenario, seeds, load_model, variants = job
    began = time.perf_counter()
    m = Measurements()
    out = [run_scenario_seed(scenario, seed, m, load_model, variants) for seed in range(1, seeds + 1)]
    print(f"  {scenario.key}: done ({time.perf_counter() - began:.0f} s)", file=sys.stderr, flush=True)
    return out, m.cpu_seconds, m.predict_cpu_seconds


def split_variants(text: str, names: Iterable[str]) -> list[str]:
    """The comma-separated variant names in ``text``; a name may itself hold a comma ("ladder, 1
    attempt"), so at each place the longest known name wins."""
    parts = [x.strip() for x in text.split(",")]
    known = set(names)
    out: list[str] = []
    i = 0
    while i < len(parts):
        take = next((n for n in range(len(parts) - i, 1, -1) if ", ".join(parts[i : i + n]) in known), 1)
        name = ", ".join(parts[i : i + take])
        if name:
            out.append(name)
        i += take
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(MODELS), help=f"comma-separated: {', '.join(MODELS)}")
    p.add_argument("--fleets", default=",".join(FLEETS), help=f"comma-separated: {', '.join(FLEETS)}")
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated: {', '.join(WORKLOADS)}")
    p.add_argument("--seeds", type=int, default=5, help="seeds per scenario (default 5)")
    p.add_argument("--fetch-gbps", type=float, default=LoadModel.fetch_gbps)
    p.add_argument("--h2d-gbps", type=float, default=LoadModel.h2d_gbps)
    p.add_argument("--engine-init-s", type=float, default=LoadModel.engine_init_s)
    p.add_argument(
        "--variants",
        default="all",
        help=f"comma-separated variants besides the sweep (default all): {', '.join(v.name for v in VARIANTS)}",
    )
    p.add_argument("--no-near", action="store_true", help="leave out the near-threshold scenarios")
    p.add_argument("--jobs", type=int, default=1, help="scenarios run at once in worker processes (default 1)")
    args = p.parse_args(argv)
    if args.variants == "all":
        variants = VARIANTS
    else:
        names = {v.name: v for v in VARIANTS}
        wanted = split_variants(args.variants, names)
        bad = [x for x in wanted if x not in names]
        if bad:
            print(f"decision_cost: --variants: unknown {', '.join(bad)}; allowed: {', '.join(names)}", file=sys.stderr)
            return 2
        variants = tuple(names[x] for x in dict.fromkeys(["ladder", *wanted]))
    chosen: dict[str, list[str]] = {}
    for flag, table in (("models", MODELS), ("fleets", FLEETS), ("workloads", WORKLOADS)):
        names = [x.strip() for x in getattr(args, flag).split(",") if x.strip()]
        bad = [x for x in names if x not in table]
        if bad or not names:
            print(f"decision_cost: --{flag}: unknown {', '.join(bad) or '(empty)'}; allowed: {', '.join(table)}", file=sys.stderr)
            return 2
        chosen[flag] = names
    if args.seeds < 1:
        print("decision_cost: --seeds: must be at least 1", file=sys.stderr)
        return 2
    load_model = LoadModel(args.fetch_gbps, args.h2d_gbps, args.engine_init_s)
    measurements = Measurements()
    started = time.perf_counter()
    base = scenarios(chosen["models"], chosen["fleets"], chosen["workloads"])
    near_list = [] if args.no_near else near_threshold_scenarios(measurements)
    jobs = [(sc, args.seeds, load_model, variants) for sc in base + near_list]
    if args.jobs > 1:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            done = pool.map(_run_scenario, jobs, chunksize=1)
    else:
        done = [_run_scenario(job) for job in jobs]
    results = [r for rs, _, _ in done[: len(base)] for r in rs]
    near = [r for rs, _, _ in done[len(base) :] for r in rs]
    measurements.cpu_seconds += sum(c for _, c, _ in done)
    measurements.predict_cpu_seconds += sum(c for _, _, c in done)
    print(
        f"decision cost: {len(results)} scenario-seeds ({len(results) // args.seeds} scenarios x {args.seeds} seeds), "
        f"noise 0.02, ladder TP 1/2/4/8, default stop rules"
    )
    print(
        f"model load: fetch {load_model.fetch_gbps:g} GB/s per engine (assumed) + shard {load_model.h2d_gbps:g} GB/s per GPU "
        f"+ {load_model.engine_init_s:g} s engine start (real vLLM 0.24, 8B on an H200, cold compile cache: tests/data/vllm); "
        "out-of-memory tiers fail after fetch + shard"
    )
    if any(v.adaptive for v in variants):
        plan = AdaptiveLoadSpec()
        print(
            f"adaptive variants: spec.load.adaptive {{enabled: true}} (defaults: +-{plan.relative_precision:.0%} at {plan.confidence:.0%} "
            f"confidence, min {plan.min_requests} requests): each repeat stopped by kneepoint loadgen --adaptive's rule, "
            "at most numRequests"
        )
    print()
    print(scenario_table(results))
    print()
    print(lever_table(results, FLEETS, variants))
    print()
    print(agreement_line(f"ladder vs sweep ({len(results)} scenario-seeds)", results, "ladder"))
    if any(v.name == PREDICT_FIRST for v in variants):
        print(agreement_line(f"predict first vs sweep ({len(results)} scenario-seeds)", results, PREDICT_FIRST))
    for line in adaptive_lines(results, variants):
        print(line)
    if near:
        print()
        print(
            f"near-threshold scenarios (thresholds {NEAR_MARGIN:g} from the predicted figure; mislabelled-link: engines over PCIe on NVLink-labelled nodes):"
        )
        print(scenario_table(near))
        print()
        if any(v.name == PREDICT_FIRST for v in variants):
            print(agreement_line(f"predict first vs sweep, near-threshold ({len(near)} scenario-seeds)", near, PREDICT_FIRST))
            both = results + near
            print(agreement_line(f"predict first vs sweep, all ({len(both)} scenario-seeds)", both, PREDICT_FIRST))
    print(f"predictions: {measurements.predict_cpu_seconds:.0f} CPU-s (once per scenario and workload)")
    print(f"simulated load tests: {measurements.cpu_seconds:.0f} CPU-s; benchmark wall {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
