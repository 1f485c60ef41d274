"""TTFT under closed-loop waves on a virtual clock: the simulator's scheduler, step model and
API-server intake, without HTTP, and a chosen delay between a finish and the next send.

docs/simulator.md ("c32 to c128") uses it to separate the model from the simulator's own
HTTP turnaround on a busy machine: at 64 and 128 in flight the time to first token depends
on whether a finishing cohort is done before its replacements reach the engine.

    .venv/bin/python benchmarks/sim_waves_virtual.py [--delay-ms 0.5 2 50] [--seeds 8]

Each request's TTFT counts from its send (the delay before the send is the client's); the
engine is `kneepoint sim`'s with the benchmark's flags (sim_vs_real_vllm.engine_args); the
prompts are 1025 tokens (the simulator's count of the captures' 1024 words), 256 out.
"""

from __future__ import annotations

import argparse
import heapq
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim_vs_real_vllm import engine_args

from kneepoint.simulator.scheduler import Scheduler, SchedulerConfig
from kneepoint.simulator.virtual_tier import start_engine

LOADS = ((128, 512, 64), (64, 256, 32), (32, 200, 10))  # concurrency, measured requests, warm-up (the captures')
PROMPT, OUTPUT = 1025, 256


def run(concurrency: int, measured: int, warmup: int, delay: float, seed: int) -> tuple[float, float]:
    """(TTFT P50 ms, TPOT mean ms) of the measured requests."""
    settings = start_engine([*engine_args(128), "--dcgm-port", "0", "--model-load-seconds", "0"]).settings
    assert settings is not None
    now = [0.0]
    config = SchedulerConfig(
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        num_gpu_blocks=settings.num_gpu_blocks,
        max_model_len=settings.max_model_len,
    )
    sched = Scheduler(config, settings.perf.step_time, clock=lambda: now[0], noise=settings.noise, seed=seed)
    intake_cost = settings.perf.calibration.serving.api_us_per_prompt_token * PROMPT * 1e-6
    intake_free = 0.0
    arrivals: list[tuple[float, int]] = []  # (reaches the engine, index): the engine.Engine.intake queue
    starts: dict[int, float] = {}
    tokens: dict[int, list[float]] = {}
    done: list[int] = []
    sent = 0

    def send(t: float) -> None:
        nonlocal sent, intake_free
        if sent >= warmup + measured:
            return
        index, sent = sent, sent + 1
        starts[index], tokens[index] = t + delay, []
        intake_free = max(intake_free, t + delay) + intake_cost
        heapq.heappush(arrivals, (intake_free, index))

    for _ in range(concurrency):
        send(0.0)
    while tokens.keys() - set(done):
        while arrivals and arrivals[0][0] <= now[0]:
            sched.add_request(str(heapq.heappop(arrivals)[1]), PROMPT, OUTPUT)
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
    kept = [i for i in done if i >= warmup]
    ttft = statistics.median(tokens[i][0] - starts[i] for i in kept)
    tpot = statistics.mean((tokens[i][-1] - tokens[i][0]) / (len(tokens[i]) - 1) for i in kept)
    return ttft * 1e3, tpot * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay-ms", type=float, nargs="+", default=[0.5, 2.0, 50.0])
    parser.add_argument("--seeds", type=int, default=8)
    args = parser.parse_args()
    print("| in flight | delay ms | TTFT P50 ms (min-max over seeds) | TPOT mean ms |")
    print("|---|---|---|---|")
    for concurrency, measured, warmup in LOADS:
        for delay in args.delay_ms:
            runs = [run(concurrency, measured, warmup, delay / 1e3, seed) for seed in range(args.seeds)]
            ttfts = [r[0] for r in runs]
            print(
                f"| {concurrency} | {delay:g} | {statistics.median(ttfts):,.0f} ({min(ttfts):,.0f}-{max(ttfts):,.0f}) | "
                f"{statistics.median(r[1] for r in runs):.1f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
