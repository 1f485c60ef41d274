"""Every real capture's workload on a virtual clock: the simulator's scheduler, step model and
API-server intake under the load generator's closed loop, without HTTP.

`benchmarks/sim_vs_real_vllm.py` runs `kneepoint sim` in real time over HTTP, so on a busy
machine its figures carry the simulator process's own turnaround (and at 128 in flight, a
starved process's lost throughput); this replays the same model with none of that, so a change
of the model can be judged on a loaded machine. Figures as the load generator computes them
(percentiles: its numpy-linear rule), medians over --seeds step-noise seeds, beside real vLLM's.

    .venv/bin/python benchmarks/sim_waves_virtual.py [--no-async] [--intake-serial-us 2.1] [--delay-ms 0] [--seeds 4] [--only r3-c64,c128] [--model 1b-tp1]

`--no-async` plans each step when the previous one ends instead of as vLLM 0.24's asynchronous
scheduling does (`SchedulerConfig.async_scheduling`, on in `kneepoint sim`); `--intake-serial-us` sets the serial part of the API-server intake per prompt
token (`serving.apiSerialUsPerPromptToken`; the rest overlaps, `simulator.intake`); `--delay-ms` adds a fixed delay between a finish and the next
request's arrival at the API server. Each request's times count from its send; prompts are
1025 tokens (the simulator's count of the captures' 1024 words), outputs as the capture's.
"""

from __future__ import annotations

import argparse
import heapq
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim_vs_real_vllm import FIGURES, MODELS, captures, engine_args

from kneepoint.loadgen.statistics import percentile_sorted
from kneepoint.simulator.engine import SimulatorSettings, scheduler_config
from kneepoint.simulator.intake import Intake
from kneepoint.simulator.scheduler import Scheduler
from kneepoint.simulator.virtual_tier import start_engine

PROMPT = 1025


def run(settings: SimulatorSettings, config: dict, delay: float, seed: int, async_scheduling: bool, serial_us: float) -> dict[str, float]:
    """The load generator's figures of one capture's first measured phase (after its warm-up)."""
    concurrency, measured, warmup, output = config["concurrency"], config["numRequests"], config["warmupRequests"], config["outputLen"]
    now = [0.0]
    sched_config = replace(scheduler_config(settings), async_scheduling=async_scheduling)
    sched = Scheduler(sched_config, settings.perf.step_time, clock=lambda: now[0], noise=settings.noise, seed=seed)
    intake = Intake(settings.perf.calibration.serving.api_us_per_prompt_token, serial_us)
    arrivals: list[tuple[float, int]] = []  # (reaches the engine, index): the engine.Engine.intake queue
    starts: dict[int, float] = {}
    tokens: dict[int, list[float]] = {}
    done: list[int] = []
    sent, limit = 0, warmup  # the phase's last index + 1

    def send(t: float) -> None:
        nonlocal sent
        if sent >= limit:
            return
        index, sent = sent, sent + 1
        starts[index], tokens[index] = t, []
        heapq.heappush(arrivals, (intake.arrival(t + delay, PROMPT), index))

    def drain(phase_end: int) -> None:
        while len(done) < phase_end:
            while arrivals and arrivals[0][0] <= now[0]:
                at, index = heapq.heappop(arrivals)
                sched.add_request(str(index), PROMPT, output, arrival_time=at)
            step = sched.schedule(now[0])
            if step is None:
                now[0] = arrivals[0][0]
                continue
            end = now[0] + step.duration
            outcome = sched.complete(step, end)
            now[0] = end
            for req in outcome.tokens:
                tokens[int(req.request_id)].append(end)
            for req in outcome.finished:
                done.append(int(req.request_id))
                send(end)

    # The load generator's phases: the warm-up drained, then the measured phase from a full closed loop.
    for _ in range(min(concurrency, warmup)):
        send(0.0)
    if warmup:
        drain(warmup)
    limit = warmup + measured
    for _ in range(concurrency):
        send(now[0])
    drain(warmup + measured)
    kept = range(warmup, warmup + measured)
    ttft = sorted((tokens[i][0] - starts[i]) * 1e3 for i in kept)
    e2e = sorted((tokens[i][-1] - starts[i]) * 1e3 for i in kept)
    tpot = [(tokens[i][-1] - tokens[i][0]) * 1e3 / (len(tokens[i]) - 1) for i in kept]
    duration = max(tokens[i][-1] for i in kept) - min(starts[i] for i in kept)
    return {
        "outputTokensPerSecond": sum(len(tokens[i]) for i in kept) / duration,
        "ttftP50Ms": percentile_sorted(ttft, 50),
        "ttftP99Ms": percentile_sorted(ttft, 99),
        "tpotMeanMs": statistics.fmean(tpot),
        "latencyP50Ms": percentile_sorted(e2e, 50),
        "latencyP99Ms": percentile_sorted(e2e, 99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--async",
        dest="async_",
        action=argparse.BooleanOptionalAction,
        default=SimulatorSettings.async_scheduling,
        help="vLLM 0.24's asynchronous scheduling",
    )
    parser.add_argument("--intake-serial-us", type=float, default=None, help="default: the shipped calibration's")
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--only", default="")
    parser.add_argument(
        "--model", default="8b-tp1", choices=sorted(MODELS), help="whose captures (tests/data/vllm: run 5 has the 1B and 70B fp8 shapes)"
    )
    parser.add_argument("--tolerance", type=float, default=0.10)
    args = parser.parse_args()
    settings = start_engine([*engine_args(MODELS[args.model][2], args.model), "--dcgm-port", "0", "--model-load-seconds", "0"]).settings
    assert settings is not None
    serial_us = settings.perf.calibration.serving.api_serial_us_per_prompt_token if args.intake_serial_us is None else args.intake_serial_us
    only = {s for s in args.only.split(",") if s} or None
    print(
        f"virtual clock, {'asynchronous' if args.async_ else 'synchronous'} scheduling, intake serial {serial_us:g} µs/token, delay {args.delay_ms:g} ms, {args.seeds} seeds"
    )
    print("| capture | workload | figure | real vLLM | simulator (virtual) | error |")
    print("|---|---|---|---|---|---|")
    worst, outside = 0.0, 0
    for name, cap in captures(only, (args.model,)).items():
        c = cap["config"]
        if c["api"] != "completions" or c["inputLen"] != 1024:
            continue  # the replay's prompts are the 1024-word completions of the sweep
        runs = [run(settings, c, args.delay_ms / 1e3, seed, args.async_, serial_us) for seed in range(args.seeds)]
        for label, key in FIGURES:
            real, sim = float(cap["summary"][key]), statistics.median(r[key] for r in runs)
            err = sim / real - 1.0
            worst, outside = max(worst, abs(err)), outside + (abs(err) > args.tolerance)
            fmt = "{:,.0f}" if key == "outputTokensPerSecond" else "{:,.1f}" if real >= 100 else "{:.2f}"
            workload = f"c{c['concurrency']} x{c['numRequests']}"
            print(f"| {name} | {workload} | {label} | {fmt.format(real)} | {fmt.format(sim)} | {err:+.1%} |", flush=True)
    print(f"\n{outside} figures outside {args.tolerance:.0%}; worst {worst:.1%}")


if __name__ == "__main__":
    main()
