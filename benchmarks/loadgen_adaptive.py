"""What the load generator's adaptive stop saves, on the engine simulator: requests, time, and the figures' drift.

Each case is one repeat of a closed loop (kneepoint loadgen's workload) on the in-process
virtual tier (``kneepoint.simulator.virtual_tier``: ``kneepoint sim``'s engine and scheduler on
a simulated clock), run twice with the same engine seed: once with the fixed plan
(``--num-requests N``) and once with ``--adaptive`` (``kneepoint.loadgen.adaptive.AdaptiveStop``,
the rule ``kneepoint loadgen`` runs). It prints, per case, the requests sent and the repeat's
simulated seconds with and without, and how far the adaptive repeat's output tok/s and E2E
P99 land from the fixed plan's. Engines are sized from the operator's own vLLM flags
(``kube.manifests.vllm_args``) with the simulator's noise (2 %, the default of
spec.simulation.noiseFraction).

    .venv/bin/python benchmarks/loadgen_adaptive.py                # the table in docs/performance.md
    .venv/bin/python benchmarks/loadgen_adaptive.py --seeds 1 --plans 1000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, replace

from kneepoint.core.spec import parse_spec
from kneepoint.core.tiers import Tier
from kneepoint.kube.manifests import vllm_args
from kneepoint.loadgen.adaptive import AdaptivePlan, AdaptiveStop, assess_records
from kneepoint.loadgen.records import RequestRecord
from kneepoint.loadgen.summary import RepeatSummary, summarize_repeat
from kneepoint.simulator.virtual_tier import _NO_CLIENT_LOAD, SimulatorSettings, Workload, _Phase, _VirtualRun, start_engine


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    preset: str
    tensor_parallel: int
    concurrency: int
    input_len: int
    output_len: int


CASES = (
    Case("8B TP1 c32 1024/256", "hf://meta-llama/Llama-3.1-8B-Instruct", "llama-3-8b", 1, 32, 1024, 256),
    Case("8B TP2 c64 1024/256", "hf://meta-llama/Llama-3.1-8B-Instruct", "llama-3-8b", 2, 64, 1024, 256),
    Case("8B TP1 c128 256/128", "hf://meta-llama/Llama-3.1-8B-Instruct", "llama-3-8b", 1, 128, 256, 128),
    Case("70B TP4 c32 1024/256", "hf://meta-llama/Llama-3.3-70B-Instruct", "llama-3-70b", 4, 32, 1024, 256),
)


def engine(case: Case, seed: int) -> SimulatorSettings:
    spec = parse_spec(
        {
            "model": {"uri": case.model, "dtype": "bfloat16", "maxModelLen": 4096, "architecture": {"preset": case.preset}},
            "load": {"concurrency": case.concurrency, "inputLen": case.input_len, "outputLen": case.output_len},
            "placement": {"gpuProduct": "NVIDIA-H200"},
        }
    )
    args = vllm_args(spec, Tier(case.tensor_parallel, 1))
    args += ["--gpu", "NVIDIA-H200", "--noise", "0.02", "--seed", str(seed), "--dcgm-port", "0", "--architecture", case.preset]
    start = start_engine(args)
    if start.settings is None:
        raise SystemExit(f"loadgen_adaptive: {case.name}: the engine did not start: {start.message}")
    return start.settings


def one_repeat(
    settings: SimulatorSettings, case: Case, planned: int, plan: AdaptivePlan | None
) -> tuple[RepeatSummary, float, AdaptiveStop | None, list[RequestRecord]]:
    """The measured repeat after a warm-up of one cycle: summary, simulated seconds, the rule, the records."""
    workload = Workload(case.concurrency, planned, case.input_len, case.output_len, seed=1234, warmup_requests=case.concurrency)
    run = _VirtualRun(settings, workload)
    run.run_phase(_Phase("warmup", case.concurrency))
    began = run.now
    phase = _Phase("repeat-1", planned)
    rule = None if plan is None else AdaptiveStop(plan, case.concurrency, planned)

    def stop(records: list[RequestRecord]) -> bool:
        assert rule is not None
        return rule.add(records[-1])

    run.run_phase(phase, stop if rule is not None else None)
    summary = summarize_repeat(phase.name, phase.records, _NO_CLIENT_LOAD, case.input_len, case.output_len)
    return summary, run.now - began, rule, phase.records


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=3, help="engine noise seeds per case (default 3)")
    p.add_argument("--plans", default="500,1000,2000", help="fixed plans (--num-requests), comma-separated")
    p.add_argument("--precision", type=float, default=AdaptivePlan().relative_precision)
    p.add_argument("--confidence", type=float, default=AdaptivePlan().confidence)
    p.add_argument("--min-requests", type=int, default=AdaptivePlan().min_requests)
    args = p.parse_args(argv)
    try:
        plans = [int(x) for x in args.plans.split(",") if x.strip()]
        plan = AdaptivePlan(args.precision, args.confidence, args.min_requests)
    except ValueError as error:
        print(f"loadgen_adaptive: {error}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    print(
        f"adaptive stop: +-{plan.relative_precision:.0%} at {plan.confidence:.0%} confidence, min {plan.min_requests} requests; "
        f"{args.seeds} seed(s) per case, noise 0.02, one repeat after a one-cycle warm-up; simulated seconds"
    )
    header = f"{'case':<22}{'plan':>6}{'sent':>12}{'stopped':>9}{'fixed s':>9}{'adapt s':>9}{'time':>7}{'ΔT out tok/s':>14}{'ΔP99':>14}"
    print(header)
    print("-" * len(header))
    totals = {"fixed_requests": 0, "adaptive_requests": 0, "fixed_s": 0.0, "adaptive_s": 0.0}
    drifts_t, drifts_p = [], []
    for case in CASES:
        for planned in plans:
            sent, stopped, fixed_s, adaptive_s, dts, dps, why = [], 0, [], [], [], [], ""
            for seed in range(1, args.seeds + 1):
                settings = engine(case, seed)
                fixed, f_seconds, _, _ = one_repeat(settings, case, planned, None)
                adaptive, a_seconds, rule, records = one_repeat(replace(settings), case, planned, plan)
                assert rule is not None and adaptive.requests <= planned
                sent.append(adaptive.requests)
                stopped += rule.stopped
                if not rule.stopped and not why:
                    # why the whole plan ran: the last check's verdict (the first such seed)
                    last = rule.last or assess_records(records, case.concurrency, plan, planned)
                    why = f"at {last.completed} completed: {last.reason}"
                fixed_s.append(f_seconds)
                adaptive_s.append(a_seconds)
                dts.append(adaptive.output_tokens_per_second / fixed.output_tokens_per_second - 1.0)
                assert fixed.latency_ms is not None and adaptive.latency_ms is not None
                dps.append(adaptive.latency_ms.p(99.0) / fixed.latency_ms.p(99.0) - 1.0)
                totals["fixed_requests"] += planned
                totals["adaptive_requests"] += adaptive.requests
                totals["fixed_s"] += f_seconds
                totals["adaptive_s"] += a_seconds
            drifts_t += dts
            drifts_p += dps
            span = f"{min(sent)}-{max(sent)}" if min(sent) != max(sent) else str(sent[0])
            print(
                f"{case.name:<22}{planned:>6}{span:>12}{stopped:>6}/{args.seeds:<2}{statistics.mean(fixed_s):>9.1f}"
                f"{statistics.mean(adaptive_s):>9.1f}{sum(adaptive_s) / sum(fixed_s):>7.0%}"
                f"{_signed_range(dts):>14}{_signed_range(dps):>14}"
            )
            if why:
                print(f"{'':<6}full plan: {why}")
    print("-" * len(header))
    print(
        f"all cases: {totals['adaptive_requests']} of {totals['fixed_requests']} requests "
        f"({totals['adaptive_requests'] / totals['fixed_requests']:.0%}), simulated load-test time "
        f"{totals['adaptive_s'] / totals['fixed_s']:.0%} of the fixed plans'; adaptive vs fixed: output tok/s "
        f"{_signed_range(drifts_t)} (median {statistics.median(drifts_t):+.1%}), E2E P99 {_signed_range(drifts_p)} "
        f"(median {statistics.median(drifts_p):+.1%}); benchmark wall {time.perf_counter() - started:.0f} s"
    )
    return 0


def _signed_range(values: list[float]) -> str:
    low, high = min(values), max(values)
    if abs(high - low) < 5e-4:
        return f"{low:+.1%}"
    return f"{low:+.1%}..{high:+.1%}"


if __name__ == "__main__":
    sys.exit(main())
