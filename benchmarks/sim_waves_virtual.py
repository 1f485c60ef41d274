"""Every real capture's workload on a virtual clock: the simulator's scheduler, step model,
API-server intake and output path under the load generator's closed loop, without HTTP; and real vLLM's bursts.

`benchmarks/sim_vs_real_vllm.py` runs `kneepoint sim` in real time over HTTP, so on a busy
machine its figures carry the simulator process's own turnaround (and at 128 in flight, a
starved process's lost throughput); this replays the same model with none of that, so a change
of the model can be judged on a loaded machine. Figures as the load generator computes them
(percentiles: its numpy-linear rule), medians over --seeds step-noise seeds, beside real vLLM's;
a miss that also lies outside the tolerance of every real capture of its workload (real vLLM's own
spread between repeats, as `sim_vs_real_vllm.py` counts it) is marked `*` and counted in the summary, which
ends with the floor no simulator can meet on the captures replayed (`sim_vs_real_vllm.floor_line`).

    .venv/bin/python benchmarks/sim_waves_virtual.py [--no-async] [--model 1b-tp1] [--only r3-c64,c128] [--seeds 4]
        [--intake-us-per-request 9000] [--intake-gate-us-per-request 1000] [--intake-serial-us-per-request 1000] [--intake-us 1] [--intake-serial-us 0]
        [--delay-ms 0] [--output-us-per-output 17.7] [--output-us-per-write 58.6] [--bursts | --stage-loads]

`--no-async` plans each step when the previous one ends instead of as vLLM 0.24's asynchronous
scheduling does (`SchedulerConfig.async_scheduling`, on in `kneepoint sim`); the `--intake-*`
flags replace the API-server intake's constants (`serving.apiUsPerRequest`,
`apiGateUsPerRequest`, `apiSerialUsPerRequest`, `apiUsPerPromptToken`, `apiSerialUsPerPromptToken`; `simulator.intake`);
`--delay-ms` adds a fixed delay between a finish and the next request's arrival at the API
server. `--output-us-per-output` and `--output-us-per-write` replace the output path's costs
(`serving.apiUsPerOutput`, `apiUsPerWrite`; `simulator.output_loop`; 0 and 0: every token reaches its
client as its step ends, the simulator before run 24). `--bursts` replays instead real vLLM's isolated bursts (run 4's 1,024-token bursts of
the 8B, run 8's 128- and 1,024-token bursts and c1 loads of the 8B and 1B: N requests sent at
once, 16-token replies) and prints the mean TTFT and the first request's. Each request's times
count from its send; prompts count one token more than the captures' words (the simulator's
count: the BOS token), outputs as the capture's. `--stage-loads` replays instead the stamped closed loops
(`tests/data/vllm/README.md`): runs 19-21's 1B, 8B and 14B on an H200, runs 25-27's 1B on three H100 machines'
hosts (the same loads on three hosts of one machine kind: how far the 1B's figures move with the host), at vLLM's
defaults, and runs 28-29's closed loops of 128-token prompts on the 8B and the 8B fp8 on an H100, each with the
simulator on its GPU; then, per load, the two halves of the time to the first token that the
stamps split: the send to the engine, and the engine to the end of the step that made the first token.
"""

from __future__ import annotations

import argparse
import gzip
import heapq
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim_vs_real_vllm import (
    DATA,
    FIGURES,
    MODELS,
    capture_engine_args,
    captures,
    engine_args,
    floor_line,
    holds,
    real_spread,
    swings_line,
    workload_key,
)

from kneepoint.loadgen.statistics import percentile_sorted
from kneepoint.simulator.engine import SimulatorSettings, scheduler_config
from kneepoint.simulator.intake import Intake
from kneepoint.simulator.output_loop import OutputLoop
from kneepoint.simulator.scheduler import Scheduler
from kneepoint.simulator.virtual_tier import start_engine

BOS = 1  # the simulator counts a prompt of n words as n + 1 tokens


def replay_settings(engine_flags: list[str]) -> SimulatorSettings:
    """The simulator `kneepoint sim` would run with these engine flags, with no DCGM endpoint and no model-load wait."""
    settings = start_engine([*engine_flags, "--dcgm-port", "0", "--model-load-seconds", "0"]).settings
    assert settings is not None
    return settings


def run(
    settings: SimulatorSettings,
    config: dict,
    delay: float,
    seed: int,
    async_scheduling: bool,
    intake: Intake,
    output: OutputLoop | None = None,
    record: list[tuple[float, float]] | None = None,
) -> dict[str, float]:
    """The load generator's figures of one capture's first measured phase (after its warm-up); ``record``, when
    given, receives each measured request's (send time in s, TTFT in ms) in the order they were sent."""
    concurrency, measured, warmup, output_len = config["concurrency"], config["numRequests"], config["warmupRequests"], config["outputLen"]
    prompt = config["inputLen"] + BOS
    now = [0.0]
    sched_config = replace(scheduler_config(settings), async_scheduling=async_scheduling)
    sched = Scheduler(sched_config, settings.perf.step_time, clock=lambda: now[0], noise=settings.noise, seed=seed)
    delayed: list[tuple[float, int]] = []  # (reaches the API server, index): --delay-ms
    starts: dict[int, float] = {}
    tokens: dict[int, list[float]] = {}
    done: list[int] = []
    reached: dict[int, float] = {}  # when each request reached the engine
    first_step: dict[int, float] = {}  # when the step that made its first token ended
    sent, limit = 0, warmup  # the phase's last index + 1
    engine_done: set[int] = set()  # finished in the engine; the client has its end once its last token is written

    def send(t: float) -> None:
        nonlocal sent
        if sent >= limit:
            return
        index, sent = sent, sent + 1
        starts[index], tokens[index] = t, []
        heapq.heappush(delayed, (t + delay, index))

    def write(until: float) -> None:
        assert output is not None
        for at, key, n in output.written(until):
            index = int(key)
            tokens[index] += [at] * n
            if index in engine_done and len(tokens[index]) == output_len:
                done.append(index)
                send(at)

    def drain(phase_end: int) -> None:
        while len(done) < phase_end:
            if output is not None:
                write(now[0])
            if len(done) >= phase_end:
                break
            while delayed and delayed[0][0] <= now[0]:
                at, index = heapq.heappop(delayed)
                intake.receive(at, index, prompt)
            for at, index in intake.reached(now[0]):
                reached[int(index)] = at
                sched.add_request(str(index), prompt, output_len, arrival_time=at)
            step = sched.schedule(now[0])
            if step is None:
                waits = (intake.next_event(), delayed[0][0] if delayed else None, output.next_event() if output else None)
                now[0] = max(min(t for t in waits if t is not None), now[0])
                continue
            end = now[0] + step.duration
            outcome = sched.complete(step, end)
            now[0] = end
            for req in outcome.tokens:
                first_step.setdefault(int(req.request_id), end)
            if output is not None:
                engine_done.update(int(req.request_id) for req in outcome.finished)
                output.push(end, [req.request_id for req in outcome.tokens])
                continue
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
    if record is not None:
        record += [(starts[i], (tokens[i][0] - starts[i]) * 1e3) for i in kept]
    ttft = sorted((tokens[i][0] - starts[i]) * 1e3 for i in kept)
    e2e = sorted((tokens[i][-1] - starts[i]) * 1e3 for i in kept)
    tpot = [(tokens[i][-1] - tokens[i][0]) * 1e3 / (len(tokens[i]) - 1) for i in kept]
    duration = max(tokens[i][-1] for i in kept) - min(starts[i] for i in kept)
    return {
        "outputTokensPerSecond": sum(len(tokens[i]) for i in kept) / duration,
        "ttftP50Ms": percentile_sorted(ttft, 50),
        "ttftP99Ms": percentile_sorted(ttft, 99),
        "ttftMeanMs": statistics.fmean(ttft),
        "ttftFirstMs": ttft[0],
        "tpotMeanMs": statistics.fmean(tpot),
        "latencyP50Ms": percentile_sorted(e2e, 50),
        "latencyP99Ms": percentile_sorted(e2e, 99),
        # Inside: the median send -> the engine has the request, and -> the step that made its first token ended.
        "toEngineP50Ms": statistics.median((reached[i] - starts[i]) * 1e3 for i in kept),
        "engineToFirstP50Ms": statistics.median((first_step[i] - reached[i]) * 1e3 for i in kept),
    }


BURST_FILES = {
    "8b-tp1": ("8b-tp1-intake-bursts.json.gz", "8b-tp1-r8-bursts-and-ttft.json.gz"),
    "1b-tp1": ("1b-tp1-r8-bursts-and-ttft.json.gz",),
}


def bursts(model: str) -> dict[str, dict]:
    """Real vLLM's isolated bursts and c1 loads of ``model`` by name (run 4's with "r4-" before)."""
    found = {}
    for name in BURST_FILES.get(model, ()):
        with gzip.open(DATA / name, "rt") as f:
            doc = json.load(f)
        loads = doc.get("loads", doc)
        for tag, load in loads.items():
            if tag.startswith(("burst-", "c1-")):
                found[tag if "r8" in name else f"r4-{tag}"] = load
    return found


def real_burst(load: dict) -> tuple[float, float]:
    """(mean TTFT, the earliest request's TTFT) of a real load's measured requests, in ms."""
    reqs = [r for r in load["requests"] if r.get("ttftMs") is not None]
    skip = load["config"]["warmupRequests"]
    reqs = sorted(reqs, key=lambda r: r["index"])[skip:] if skip else reqs
    return statistics.fmean(r["ttftMs"] for r in reqs), min(r["ttftMs"] for r in reqs)


# The stamped closed loops (tests/data/vllm/README.md): runs 19-21 on an H200 (the 1B, 8B and 14B), runs 25-27 the
# 1B on three H100 machines' hosts, at vLLM's defaults (run 25's switch interval 5,000 µs, run 27's collector on).
# Run: (the simulator's model, its --gpu). The stage client's warm-up is drained before its measured loop, as the
# load generator's is.
STAGE_RUNS = {
    "1b": ("1b-tp1", None),
    "8b": ("8b-tp1", None),
    "14b": ("14b-tp1", None),
    "1b-h100": ("1b-tp1", "h100-sxm"),
    "1b-render": ("1b-tp1", "h100-sxm"),
    "1b-loop": ("1b-tp1", "h100-sxm"),
    # Runs 28-29's stamped closed loops of 128-token prompts on an H100 (the 8B's and the 8B fp8's models name the GPU).
    "8b-waves": ("8b-h100-tp1", None),
    "8b-waves-2": ("8b-h100-tp1", None),
    "8b-fp8-waves": ("8b-fp8-h100-tp1", None),
    "8b-fp8-waves-2": ("8b-fp8-h100-tp1", None),
    # Run 37: the same engines' closed loops of 128/256 at c24 and c40 (kit-scripts/exp-wave-profile.sh).
    "8b-fp8-waves-3": ("8b-fp8-h100-tp1", None),
    "8b-waves-3": ("8b-h100-tp1", None),
    # Run 38: the 1B, the 8B fp8 and the 14B fp8 on one H100 machine (kit-scripts/exp-lone-waves.sh).
    "1b-one-host": ("1b-tp1", "h100-sxm"),
    "8b-fp8-one-host": ("8b-fp8-h100-tp1", None),
    "14b-fp8-one-host": ("14b-fp8-h100-tp1", None),
    # Run 39: the same script on another H100 machine, the 8B bf16 in the 14B fp8's place (kit-scripts/exp-launch.sh).
    "1b-one-host-2": ("1b-tp1", "h100-sxm"),
    "8b-one-host-2": ("8b-h100-tp1", None),
    "8b-fp8-one-host-2": ("8b-fp8-h100-tp1", None),
    # Run 40: run 9's 128/128 c128 load, one wave of 128/512 and 128/128 at c64, on an H100 (kit-scripts/exp-c128-short.sh).
    "8b-short-c128": ("8b-h100-tp1", None),
    "8b-fp8-short-c128": ("8b-fp8-h100-tp1", None),
    # Run 41: the same script on an H100 again, the 8B fp8 (a second take) and the 14B fp8 (held out at these loads).
    "8b-fp8-short-c128-2": ("8b-fp8-h100-tp1", None),
    "14b-fp8-short-c128": ("14b-fp8-h100-tp1", None),
}
STAGE_HOST_RUNS = ("1b-h100", "1b-render", "1b-loop")  # runs 25-27: the 1B's loads on three H100 machines' hosts
# Runs 28-29 and 37's closed loops of 128-token prompts, by their output length (kit-scripts/exp-retakes.sh: the 8B's
# 512, the 8B fp8's 256; exp-wave-profile.sh: 256 for both).
STAGE_WAVE_OUTPUT = {
    "8b-waves": 512,
    "8b-waves-2": 512,
    "8b-fp8-waves": 256,
    "8b-fp8-waves-2": 256,
    "8b-fp8-waves-3": 256,
    "8b-waves-3": 256,
}
STAGE_WAVE_RUNS = tuple(STAGE_WAVE_OUTPUT)
# Runs 38 and 39 (kit-scripts/exp-lone-waves.sh, each engine on one host).
STAGE_ONE_HOST_RUNS = ("1b-one-host", "8b-fp8-one-host", "14b-fp8-one-host", "1b-one-host-2", "8b-one-host-2", "8b-fp8-one-host-2")
# Runs 40-41's loads (kit-scripts/exp-c128-short.sh): (prompt words, output tokens) by label.
STAGE_SHORT_LOADS = {"c128-p128": (128, 128), "c128-d": (128, 512), "c64-p128": (128, 128)}
STAGE_SHORT_RUNS = ("8b-short-c128", "8b-fp8-short-c128", "8b-fp8-short-c128-2", "14b-fp8-short-c128")


def stage_load_shape(run: str, label: str) -> tuple[int, int]:
    """(prompt words, output tokens) of one stamped load, as its experiment script sent it (kit-scripts/exp-stages.sh,
    exp-switch.sh, exp-render.sh, exp-loop.sh, exp-c128-short.sh)."""
    if run in STAGE_SHORT_RUNS:
        return STAGE_SHORT_LOADS[label]
    if run in STAGE_ONE_HOST_RUNS:  # kit-scripts/exp-lone-waves.sh
        return (128, 64) if label == "c1-p128" else (128, 256)
    if run in STAGE_HOST_RUNS:
        return (128, 256) if label.startswith("p128") else (1024, 64) if label == "c1" else (1024, 256)
    if run in STAGE_WAVE_OUTPUT:
        return 128, STAGE_WAVE_OUTPUT[run]
    return {"c1-p128": (128, 64), "c1-p2048": (2048, 128), "c32-p128": (128, 256)}.get(label, (1024, 256))


def stage_loads() -> dict[str, dict]:
    """The stamped runs' streamed loads at vLLM's defaults by "<run>/<label>", each shaped as a capture (``model``: the
    simulator's model, with its GPU when it is not the H200, so that `real_spread` keeps the hosts of one GPU
    together; ``config``; ``summary``: the figures as the load generator computes them from the client's records,
    with two medians from the stamps inside vLLM) and the replay's ``engineFlags``."""
    from vllm_request_stages import collector_off, load, loads_in_order, median, requests, span_ms, switch_intervals_us

    switch, off = switch_intervals_us(), collector_off()
    found = {}
    for run, (model, gpu) in STAGE_RUNS.items():
        for label in loads_in_order(run):  # the warm-up and run 19's unstamped twins left out
            client = load(run)["clients"][label]
            if not client["summary"]["stream"] or (run == "1b-h100" and switch[label] != 5000.0) or (run == "1b-loop" and off[label]):
                continue
            c = client["summary"]["concurrency"]
            prompt, out_len = stage_load_shape(run, label)
            config = {
                "api": "completions",
                "concurrency": c,
                "numRequests": client["summary"]["n"],
                "warmupRequests": c,
                "inputLen": prompt,
                "outputLen": out_len,
            }
            reqs = client["requests"]
            ttft = sorted((r["first"] - r["start"]) * 1e3 for r in reqs)
            e2e = sorted((r["end"] - r["start"]) * 1e3 for r in reqs)
            rows = requests(run, label)
            figures = {
                "outputTokensPerSecond": out_len * len(reqs) / (max(r["end"] for r in reqs) - min(r["start"] for r in reqs)),
                "ttftP50Ms": percentile_sorted(ttft, 50),
                "ttftP99Ms": percentile_sorted(ttft, 99),
                "tpotMeanMs": statistics.fmean((r["end"] - r["first"]) * 1e3 / (out_len - 1) for r in reqs),
                "latencyP50Ms": percentile_sorted(e2e, 50),
                "latencyP99Ms": percentile_sorted(e2e, 99),
                # Inside vLLM: send -> its EngineCore's input thread has it, -> the step that made its first token processed.
                "toEngineP50Ms": median(span_ms(rows, "start", "core_in")),
                "engineToFirstP50Ms": median(span_ms(rows, "core_in", "update")),
            }
            found[f"{run}/{label}"] = {
                "model": f"{model} on {gpu}" if gpu else model,
                "engineFlags": [*engine_args(MODELS[model][2], model), *(["--gpu", gpu] if gpu else [])],
                "config": config,
                "summary": figures,
            }
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--async",
        dest="async_",
        action=argparse.BooleanOptionalAction,
        default=SimulatorSettings.async_scheduling,
        help="vLLM 0.24's asynchronous scheduling",
    )
    parser.add_argument("--intake-us-per-request", type=float, default=None, help="default: the shipped calibration's")
    parser.add_argument("--intake-serial-us-per-request", type=float, default=None, help="default: the shipped calibration's")
    parser.add_argument("--intake-gate-us-per-request", type=float, default=None, help="default: the shipped calibration's")
    parser.add_argument("--intake-us", type=float, default=None, help="per prompt token; default: the shipped calibration's")
    parser.add_argument("--intake-serial-us", type=float, default=None, help="per prompt token; default: the shipped calibration's")
    parser.add_argument("--bursts", action="store_true", help="replay real vLLM's isolated bursts instead of the closed-loop captures")
    parser.add_argument(
        "--stage-loads",
        action="store_true",
        help="replay instead the stamped closed loops of runs 19-21 (H200), 25-27 (the 1B, H100), 28-29 and 37-41 (H100)",
    )
    parser.add_argument("--delay-ms", type=float, default=0.0)
    parser.add_argument("--output-us-per-output", type=float, default=None, help="default: the shipped calibration's")
    parser.add_argument("--output-us-per-write", type=float, default=None, help="default: the shipped calibration's")
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--only", default="")
    parser.add_argument(
        "--model", default="8b-tp1", choices=sorted(MODELS), help="whose captures (tests/data/vllm: run 5 has the 1B and 70B fp8 shapes)"
    )
    parser.add_argument("--tolerance", type=float, default=0.10)
    args = parser.parse_args()
    settings = replay_settings(engine_args(MODELS[args.model][2], args.model))
    serving = settings.perf.calibration.serving
    serving = replace(
        serving,
        api_us_per_request=serving.api_us_per_request if args.intake_us_per_request is None else args.intake_us_per_request,
        api_gate_us_per_request=(
            serving.api_gate_us_per_request if args.intake_gate_us_per_request is None else args.intake_gate_us_per_request
        ),
        api_serial_us_per_request=(
            serving.api_serial_us_per_request if args.intake_serial_us_per_request is None else args.intake_serial_us_per_request
        ),
        api_us_per_prompt_token=serving.api_us_per_prompt_token if args.intake_us is None else args.intake_us,
        api_serial_us_per_prompt_token=serving.api_serial_us_per_prompt_token if args.intake_serial_us is None else args.intake_serial_us,
    )
    only = {s for s in args.only.split(",") if s} or None
    per_output = serving.api_us_per_output if args.output_us_per_output is None else args.output_us_per_output
    per_write = serving.api_us_per_write if args.output_us_per_write is None else args.output_us_per_write

    def intake() -> Intake:
        return Intake.of(serving)

    def output() -> OutputLoop | None:
        loop = OutputLoop(per_output, per_write)
        return None if loop.free else loop

    print(
        f"virtual clock, {'asynchronous' if args.async_ else 'synchronous'} scheduling, intake {serving.api_us_per_request:g} µs/request "
        f"({serving.api_gate_us_per_request:g} gate, {serving.api_serial_us_per_request:g} serial) + {serving.api_us_per_prompt_token:g} µs/token "
        f"({serving.api_serial_us_per_prompt_token:g} serial), output loop {per_output:g} µs/output + {per_write:g} µs/write, "
        f"delay {args.delay_ms:g} ms, {args.seeds} seeds"
    )
    worst, outside, beyond = 0.0, 0, 0
    missed: list[tuple[dict, str]] = []  # (capture, figure) of the misses on load-generator captures
    replayed: dict[str, dict] = {}  # the captures (or stamped loads) replayed, for the floor no simulator can meet

    def row(
        name: str,
        workload: str,
        label: str,
        real: float,
        sim: float,
        among: tuple[float, float, int] | None = None,
        figure: tuple[dict, str] | None = None,
    ) -> None:
        nonlocal worst, outside, beyond
        err = sim / real - 1.0
        miss = not holds(sim, real, args.tolerance)
        worst, outside = max(worst, abs(err)), outside + miss
        if miss and figure is not None:
            missed.append(figure)
        mark = ""
        if miss and among is not None:
            low, high, _ = among
            if not low * (1 - args.tolerance) <= sim <= high * (1 + args.tolerance):
                beyond, mark = beyond + 1, " *"  # as sim_vs_real_vllm.py's note tables mark them
        fmt = "{:,.0f}" if label == "out tok/s" else "{:,.1f}" if real >= 100 else "{:.2f}"
        print(f"| {name} | {workload} | {label} | {fmt.format(real)} | {fmt.format(sim)} | {err:+.1%}{mark} |", flush=True)

    print("| capture | workload | figure | real vLLM | simulator (virtual) | error |")
    print("|---|---|---|---|---|---|")
    if args.stage_loads:
        loads = stage_loads()
        spread = real_spread(loads)
        engines: dict[str, SimulatorSettings] = {}
        inside = []
        for name, cap in loads.items():
            if only and name.split("/")[1] not in only:
                continue
            if cap["model"] not in engines:
                engines[cap["model"]] = replay_settings(cap["engineFlags"])
            c, figures = cap["config"], cap["summary"]
            runs = [run(engines[cap["model"]], c, args.delay_ms / 1e3, seed, args.async_, intake(), output()) for seed in range(args.seeds)]
            replayed[name] = cap
            workload = f"{c['inputLen']}/{c['outputLen']} c{c['concurrency']} x{c['numRequests']}"
            for label, k in FIGURES:
                row(name, workload, label, figures[k], statistics.median(r[k] for r in runs), spread[workload_key(cap)][k])
            sim = [statistics.median(r[k] for r in runs) for k in ("toEngineP50Ms", "engineToFirstP50Ms")]
            inside.append(
                f"| {name} | {workload} | {figures['toEngineP50Ms']:.1f} | {sim[0]:.1f} | {figures['engineToFirstP50Ms']:.1f} | {sim[1]:.1f} |"
            )
        print("\nInside (medians, ms; not counted above): send -> the engine has the request; -> the step that made its first token ended")
        print("(vLLM: its EngineCore's input thread decoded it; its first token's step processed, the `update` stamp)\n")
        print("| load | workload | to the engine, vLLM | simulator | engine -> first token's step, vLLM | simulator |")
        print("|---|---|---|---|---|---|")
        print("\n".join(inside))
    elif args.bursts:
        for name, load in bursts(args.model).items():
            c = load["config"]
            if only and name not in only:
                continue
            runs = [run(settings, c, args.delay_ms / 1e3, seed, args.async_, intake(), output()) for seed in range(args.seeds)]
            mean, first = real_burst(load)
            workload = f"{c['inputLen']}/{c['outputLen']} c{c['concurrency']} x{c['numRequests']}"
            row(name, workload, "TTFT mean", mean, statistics.median(r["ttftMeanMs"] for r in runs))
            row(name, workload, "TTFT first", first, statistics.median(r["ttftFirstMs"] for r in runs))
    else:
        spread = real_spread(captures(None, (args.model,)))
        for name, cap in captures(only, (args.model,)).items():
            c = cap["config"]
            if c["api"] != "completions":
                continue  # a chat prompt's token count is the chat template's
            engine = settings
            if cap.get("engineFlags"):  # run 23: the capture's engine ran with its own --max-num-seqs / --max-model-len
                engine = replay_settings(capture_engine_args(cap))
            runs = [run(engine, c, args.delay_ms / 1e3, seed, args.async_, intake(), output()) for seed in range(args.seeds)]
            replayed[name] = cap
            workload = f"{c['inputLen']}/{c['outputLen']} c{c['concurrency']} x{c['numRequests']}"
            for label, key in FIGURES:
                real = float(cap["summary"][key])
                row(name, workload, label, real, statistics.median(r[key] for r in runs), spread[workload_key(cap)][key], (cap, key))
    print(
        f"\n{outside} figures outside {args.tolerance:.0%} ({beyond} of them also outside {args.tolerance:.0%} of every real capture "
        f"of their workload); worst {worst:.1%}" + (f"; {floor_line(replayed, args.tolerance)}" if replayed else "")
    )
    if missed:
        print(swings_line(missed, args.tolerance))


if __name__ == "__main__":
    main()
