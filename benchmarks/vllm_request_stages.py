"""Where real vLLM's time to first token goes, request by request (runs 19-22), beside the simulator's model.

Runs 19 (the 1B), 20 (the 8B), 21 (the held-out 14B) and 22 (the 70B in fp8; decode loads only) stamped every
request inside real vLLM 0.24 on an H200, with the operator's flags
(`tests/data/vllm/kit-scripts/stage_trace/sitecustomize.py`; tests/data/vllm/README.md, "Runs 19-22"): in the API
server when the handler starts, when the prompt is rendered (tokenized), when it is handed to the EngineCore; in
the EngineCore when its input thread gets the request, when the busy loop takes it, when it is scheduled and
when its first token comes out of a step; back in the API server when that output arrives. The client's own
send and first-token times (same clock) close the chain. This prints, per load:

1. the stages' medians (and P90s with --p90): the time to first token split into the API server's intake, the
   wait for the engine's next step boundary, the queue, the step(s) to the first token and the output path;
2. the EngineCore's step launches: the time from one step's scheduling to the next's, by the step's CUDA-graph
   mode (vLLM 0.24: a decode-only step replays a full graph; a step with a prefill up to
   `max_cudagraph_capture_size` tokens, 256 at the operator's flags, replays piecewise graphs with attention
   outside them; a larger step has no graph), which with asynchronous scheduling is vLLM's CPU time for the step
   whenever the GPU's part is shorter, beside the simulator's CPU floor for the same step;
3. what requests arriving at the EngineCore cost its loop: a lone prompt's step, launch to launch, against how
   many arrived meanwhile;
4. when the busy EngineCore plans a step: how soon after the result of a step it plans the next (vLLM's batch queue of
   two: step k+2 once step k's result is processed), and how many plans came on a launch alone;
5. the API server at a closed loop's wave boundary: how long the first request of a wave waits to be rendered,
   how far apart the next ones are, and how many were rendered before the wave's last handler started.

`--run 1b-render` prints run 26 instead: each load's renders split at their hops (the handler, the loop's turns
before the prompt reaches the renderer's one worker thread, that thread's queue, the tokenizing, the way back).
`--run 1b-h100` prints run 25 instead (the 1B on an H100's host, the API server's interpreter switch interval
set between loads): per load, the switch interval, the client's TTFT P50 and the wave-boundary columns above.
`--run 1b-loop` prints run 27 instead: per load, where the collector was off, the TTFT P50, each process's
collections, what the sampler saw the API server's loop thread in, and how long the renderer's idle worker thread
took to start a submitted prompt. `--decode-by-context` prints only the decode steps of 128 sequences in the c128
loads of ``DECODE_BY_CONTEXT`` (H100), every 32 steps by their context, beside the model's. `--decode-steps`
prints, per stamped run but the 1B's, the model's error over every load's decode-only steps of 8 or more sequences,
32 steps at a time (the step times by composition that issue 13 holds within 5 %).

    .venv/bin/python benchmarks/vllm_request_stages.py [--run 1b|8b|14b|1b-h100|1b-render|1b-loop|all] [--p90] [--decode-by-context | --decode-steps]
"""

from __future__ import annotations

import argparse
import bisect
import functools
import gzip
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kneepoint.loadgen.statistics import percentile_sorted

DATA = Path(__file__).resolve().parents[1] / "tests" / "data" / "vllm"
RUNS = {
    "1b": ("1b-tp1-r19-stages.json.gz", "1b-tp1", "run 19"),
    "8b": ("8b-tp1-r20-stages.json.gz", "8b-tp1", "run 20"),
    "14b": ("14b-tp1-r21-stages.json.gz", "14b-tp1", "run 21"),
    "70b-fp8": ("70b-fp8-tp1-r22-stages.json.gz", "70b-fp8-tp1", "run 22"),
    "8b-h100": ("8b-h100-tp1-r24-stages.json.gz", "8b-h100-tp1", "run 24"),
    "1b-h100": ("1b-h100-tp1-r25-stages.json.gz", "1b-tp1", "run 25"),
    "1b-render": ("1b-h100-tp1-r26-stages.json.gz", "1b-tp1", "run 26"),
    "1b-loop": ("1b-h100-tp1-r27-loop.json.gz", "1b-tp1", "run 27"),
    "8b-waves": ("8b-h100-tp1-r28-stages.json.gz", "8b-h100-tp1", "run 28"),
    "8b-fp8-waves": ("8b-fp8-h100-tp1-r28b-stages.json.gz", "8b-fp8-h100-tp1", "run 28"),
    "8b-waves-2": ("8b-h100-tp1-r29-stages.json.gz", "8b-h100-tp1", "run 29"),
    "8b-fp8-waves-2": ("8b-fp8-h100-tp1-r29b-stages.json.gz", "8b-fp8-h100-tp1", "run 29"),
    "8b-fp8-waves-3": ("8b-fp8-h100-tp1-r37-stages.json.gz", "8b-fp8-h100-tp1", "run 37"),
    "8b-waves-3": ("8b-h100-tp1-r37b-stages.json.gz", "8b-h100-tp1", "run 37"),
    "1b-one-host": ("1b-h100-tp1-r38-stages.json.gz", "1b-tp1", "run 38"),
    "8b-fp8-one-host": ("8b-fp8-h100-tp1-r38b-stages.json.gz", "8b-fp8-h100-tp1", "run 38"),
    "14b-fp8-one-host": ("14b-fp8-h100-tp1-r38c-stages.json.gz", "14b-fp8-h100-tp1", "run 38"),
    "1b-one-host-2": ("1b-h100-tp1-r39-stages.json.gz", "1b-tp1", "run 39"),
    "8b-one-host-2": ("8b-h100-tp1-r39b-stages.json.gz", "8b-h100-tp1", "run 39"),
    "8b-fp8-one-host-2": ("8b-fp8-h100-tp1-r39c-stages.json.gz", "8b-fp8-h100-tp1", "run 39"),
    "8b-short-c128": ("8b-h100-tp1-r40-stages.json.gz", "8b-h100-tp1", "run 40"),
    "8b-fp8-short-c128": ("8b-fp8-h100-tp1-r40b-stages.json.gz", "8b-fp8-h100-tp1", "run 40"),
    "8b-fp8-short-c128-2": ("8b-fp8-h100-tp1-r41-stages.json.gz", "8b-fp8-h100-tp1", "run 41"),
    "14b-fp8-short-c128": ("14b-fp8-h100-tp1-r41b-stages.json.gz", "14b-fp8-h100-tp1", "run 41"),
    "14b-fp8": ("14b-fp8-h100-tp1-r32-stages.json.gz", "14b-fp8-h100-tp1", "run 32"),
    "8b-fp8-lone": ("8b-fp8-h100-tp1-r33-stages.json.gz", "8b-fp8-h100-tp1", "run 33"),
}
STAGE_RUNS = ("1b", "8b", "14b")  # the runs with every load; run 22 has its decode steps' loads only
# The closed loops whose full batches give the decode steps, and a decoding request's mean context in them: 1,024-
# token prompts with 256-token replies, the 70B fp8's with 64 (its --max-num-seqs is 64).
DECODE_LOADS = dict.fromkeys(STAGE_RUNS, (("c1", 1), ("c8", 8), ("c32", 32), ("c128", 128)))
DECODE_LOADS["70b-fp8"] = (("c1", 1), ("c8", 8), ("c32", 32), ("c64", 64))
DECODE_LOADS["8b-h100"] = (("c128", 128), ("c256", 256))  # run 24: 512-token prompts, 256 out, on an H100
DECODE_CONTEXT = {"70b-fp8": 1024 + 32, "8b-h100": 512 + 128}

# (name, from stamp, to stamp, what the span is)
STAGES = (
    ("http", "start", "http", "client send -> the completions handler starts (HTTP, parsing, validation)"),
    ("render", "http", "rendered", "-> the prompt rendered (the renderer's one worker thread: tokenizing)"),
    ("handover", "rendered", "send", "-> ready to send to the EngineCore (input processing)"),
    ("core input", "send", "core_in", "-> the EngineCore's input thread has decoded it (the ZMQ send, msgpack)"),
    ("step boundary", "core_in", "core_add", "-> the busy loop takes it (between two steps)"),
    ("queue", "core_add", "sched", "-> scheduled"),
    ("to first token", "sched", "update", "-> its first token comes out of a step"),
    ("output", "update", "first", "-> the client has it (the API server's output path, the stream)"),
    ("TTFT", "start", "first", "client send -> first token at the client"),
)
INTAKE = ("start", "sched")  # the simulator's intake spans the client's send to the engine's admission


@functools.cache
def load(run: str) -> dict[str, Any]:
    """One run's archive (`kit-scripts/pack_stages.py`)."""
    with gzip.open(DATA / RUNS[run][0], "rt") as f:
        return dict(json.load(f))


def _window(run: str, label: str) -> tuple[float, float]:
    """When one load ran: its first send and its last end (wall-clock seconds)."""
    reqs = load(run)["clients"][label]["requests"]
    return min(r["start"] for r in reqs), max(r["end"] for r in reqs)


def loads_in_order(run: str) -> list[str]:
    """One run's measured loads (the warm-up and run 19's unstamped twins left out), in the order they ran."""
    labels = (k for k in load(run)["clients"] if k != "warm" and not k.startswith("off-"))
    return sorted(labels, key=lambda k: _window(run, k)[0])


def _header_id(request_id: str) -> str:
    """The client's X-Request-Id in vLLM's ids: ``cmpl-<id>-0`` outside the engine, ``cmpl-<id>-0-<8 random>`` inside."""
    rid = request_id[len("cmpl-") :]
    parts = rid.split("-")
    if len(parts[-1]) == 8 and parts[-2] == "0":
        parts = parts[:-1]
    return "-".join(parts[:-1])


@functools.cache
def _stamps_by_request(run: str) -> dict[str, dict[str, float]]:
    """Each request's first stamp of each kind (wall-clock seconds), by the client's request id: one pass over the run."""
    stamps: dict[str, dict[str, float]] = {}
    for _who, kind, wall, _mono, *rest in load(run)["stamps"]:
        if kind in ("http", "rendered", "rcmpl", "tok_submit") and rest[0]:  # the handler's X-Request-Id (run 26: a render's hops)
            stamps.setdefault(rest[0], {}).setdefault(kind, wall)
        elif kind in ("send", "sent", "core_in", "core_add"):
            stamps.setdefault(_header_id(rest[0]), {}).setdefault(kind, wall)
        elif kind == "sched":
            for rid in rest[2]:
                stamps.setdefault(_header_id(rid), {}).setdefault("sched", wall)
        elif kind == "update":
            for rid in rest[0]:
                stamps.setdefault(_header_id(rid), {}).setdefault("update", wall)
    return stamps


def requests(run: str, label: str, extra: dict[str, dict[str, float]] | None = None) -> list[dict[str, float]]:
    """Every measured request of one load with its stamps (wall-clock seconds), in send order; ``extra`` adds
    stamps joined some other way, by the client's request id."""
    stamps = _stamps_by_request(run)
    out = []
    for c in load(run)["clients"][label]["requests"]:
        row = {**stamps.get(c["id"], {}), **(extra or {}).get(c["id"], {})}
        row.update(start=c["start"], end=c["end"])
        if c["first"] is not None:
            row["first"] = c["first"]
        out.append(row)
    return sorted(out, key=lambda r: r["start"])


def span_ms(rows: list[dict[str, float]], a: str, b: str) -> list[float]:
    return sorted((r[b] - r[a]) * 1e3 for r in rows if a in r and b in r)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


@dataclass(frozen=True)
class Launch:
    """One EngineCore step: when it was scheduled, what it held, and how long until the next was scheduled."""

    at: float
    tokens: int
    seqs: int
    new: int
    interval_ms: float
    graph_max_tokens: int = 0
    """The engine's largest CUDA graph (`max_cudagraph_capture_size`), as the simulator derives it from the flags."""

    @property
    def mode(self) -> str:
        if self.tokens == self.seqs:
            return "full graph (decode only)"
        return "piecewise graph" if self.tokens <= self.graph_max_tokens else "no graph"


def launches(run: str, label: str) -> list[Launch]:
    """The steps scheduled while one load ran (the last one has no interval and is left out)."""
    rows = requests(run, label)
    lo, hi = min(r["start"] for r in rows), max(r["end"] for r in rows)
    sched = [s for s in _scheds(run) if lo <= s[2] <= hi]
    graph = model(run)[0].deployment.cuda_graph_max_tokens
    out = []
    for s, nxt in zip(sched, sched[1:], strict=False):
        tokens, seqs, new = s[4], s[5], len(s[6])
        if tokens:
            out.append(Launch(s[2], tokens, seqs, new, (nxt[2] - s[2]) * 1e3, graph))
    return out


@functools.cache
def _core_steps(run: str) -> list[list[Any]]:
    """The run's EngineCore step stamps (Scheduler.schedule, update_from_output), in time order."""
    return [s for s in load(run)["stamps"] if s[1] in ("sched", "update")]


@functools.cache
def _scheds(run: str) -> list[list[Any]]:
    """The run's Scheduler.schedule stamps, in time order."""
    return [s for s in _core_steps(run) if s[1] == "sched"]


def lone_launches_and_arrivals(run: str) -> list[tuple[int, float]]:
    """(requests that reached the EngineCore's input thread while it was launched, launch-to-launch ms) of every
    step that prefilled one 1,024-token prompt alone, over the whole run: what arriving requests cost the
    EngineCore's loop (each is decoded, hashed and added between two steps, under the process's one lock)."""
    core_in = sorted(s[2] for s in load(run)["stamps"] if s[1] == "core_in")
    sched = [s for s in _scheds(run) if s[4]]
    out = []
    for a, b in zip(sched, sched[1:], strict=False):
        if a[5] == 1 and len(a[6]) == 1 and 1000 < a[4] < 1100:
            arrived = bisect.bisect_left(core_in, b[2]) - bisect.bisect_left(core_in, a[2])
            out.append((arrived, (b[2] - a[2]) * 1e3))
    return out


def plans_after_results(run: str, label: str) -> tuple[list[float], int]:
    """When a busy EngineCore plans, over one load: the ms from each step's result being processed (the `update` stamp)
    to the next plan that schedules tokens, and how many such plans came right after another plan with no result
    between. vLLM 0.24's `step_with_batch_queue` (a batch queue of two) plans step k+1, launches it, blocks on step k's
    result and updates, then the busy loop drains its input queue and plans step k+2: requests that reach it during a
    step's GPU work wait for that step's end. Only an engine that was idle plans its second step on the first's launch."""
    lo, hi = _window(run, label)
    core = [s for s in _core_steps(run) if lo <= s[2] <= hi]
    gaps, on_launch = [], 0
    for a, b in zip(core, core[1:], strict=False):
        if b[1] != "sched" or not b[4]:
            continue
        if a[1] == "update":
            gaps.append((b[2] - a[2]) * 1e3)
        else:
            on_launch += 1
    return gaps, on_launch


def slope(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares (intercept, slope) of y on x."""
    fit = statistics.linear_regression([float(x) for x, _ in points], [y for _, y in points])
    return fit.intercept, fit.slope


def waves(rows: list[dict[str, float]], gap_ms: float = 100.0) -> list[list[dict[str, float]]]:
    """A closed loop's requests grouped by their sends: a new wave after a pause of more than ``gap_ms``."""
    out: list[list[dict[str, float]]] = []
    for r in rows:
        if not out or (r["start"] - out[-1][-1]["start"]) * 1e3 > gap_ms:
            out.append([])
        out[-1].append(r)
    return out


def wave_renders(rows: list[dict[str, float]]) -> tuple[list[float], list[float]]:
    """(first request's wait from the handler to its rendered prompt, per wave of at least 8; the gaps between
    consecutive renders within those waves), in ms."""
    first, gaps = [], []
    for w in waves(rows):
        if len(w) < 8 or not all("rendered" in r and "http" in r for r in w):
            continue
        first.append((w[0]["rendered"] - w[0]["http"]) * 1e3)
        rendered = sorted(r["rendered"] for r in w)
        gaps += [(b - a) * 1e3 for a, b in zip(rendered, rendered[1:], strict=False)]
    return first, gaps


def renders_before_last_handler(rows: list[dict[str, float]]) -> tuple[int, int]:
    """(requests rendered before their wave's last handler started, requests), over the waves of at least 8:
    whether the API server's loop lets a render through while new requests still come in."""
    before = total = 0
    for w in waves(rows):
        if len(w) < 8 or not all("rendered" in r and "http" in r for r in w):
            continue
        last = max(r["http"] for r in w)
        before += sum(1 for r in w if r["rendered"] < last)
        total += len(w)
    return before, total


@dataclass(frozen=True)
class WaveEnd:
    """A closed loop's wave boundary as the engine and the clients saw it (run 24)."""

    idle_ms: float
    """The engine idle between the wave's last step and the next wave's first."""
    ends_while_idle: int
    """Requests whose end reached their client while the engine was idle: finished in the engine before it."""


def wave_ends(run: str, label: str, min_idle_ms: float = 300.0) -> list[WaveEnd]:
    """The engine's idle gaps of at least ``min_idle_ms`` inside one load, and how many clients got their ends in them."""
    rows = requests(run, label)
    lo, hi = min(r["start"] for r in rows), max(r["end"] for r in rows)
    busy = sorted(s[2] for s in _scheds(run) if s[4] and lo <= s[2] <= hi)
    ends = sorted(r["end"] for r in rows)
    out = []
    for a, b in zip(busy, busy[1:], strict=False):
        if (b - a) * 1e3 >= min_idle_ms:
            out.append(WaveEnd((b - a) * 1e3, bisect.bisect_left(ends, b) - bisect.bisect_right(ends, a)))
    return out


def output_rates(run: str, label: str, seqs: int) -> tuple[float, float]:
    """(outputs a second the engine made, outputs a second the API server's ``process_outputs`` handled) while the
    engine decoded ``seqs`` sequences a step, every step: the decode-only stretches of full batches, from the second
    step of a stretch to its last."""
    rows = requests(run, label)
    lo, hi = min(r["start"] for r in rows), max(r["end"] for r in rows)
    sched = [s for s in _scheds(run) if s[4] and lo <= s[2] <= hi]
    procs = sorted((s[2], s[4]) for s in load(run)["stamps"] if s[1] == "proc" and lo <= s[2] <= hi)
    times = [t for t, _ in procs]
    made = handled = span = 0.0
    stretch: list[float] = []
    for s in [*sched, None]:
        if s is not None and s[4] == seqs and s[5] == seqs:
            stretch.append(s[2])
            continue
        if len(stretch) >= 20:
            a, b = stretch[1], stretch[-1]
            made += seqs * (len(stretch) - 2)
            handled += sum(n for _, n in procs[bisect.bisect_left(times, a) : bisect.bisect_left(times, b)])
            span += b - a
        stretch = []
    return made / span, handled / span


@functools.cache
def model(run: str):
    """(PerfModel, Intake): the simulator's engine for the run's flags, started once per run."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from sim_vs_real_vllm import MODELS, engine_args

    from kneepoint.simulator.intake import Intake
    from kneepoint.simulator.virtual_tier import start_engine

    name = RUNS[run][1]
    settings = start_engine([*engine_args(MODELS[name][2], name), "--dcgm-port", "0", "--model-load-seconds", "0"]).settings
    assert settings is not None
    return settings.perf, Intake.of(settings.perf.calibration.serving)


def model_step_ms(run: str, launch: Launch, context: int = 1152) -> tuple[float, float]:
    """The simulator's (CPU floor, GPU + host time) for a step like ``launch``: its decodes at ``context``
    tokens each (a 1,024-token prompt halfway through 256 out), its new requests' prompts prefilled in it."""
    from kneepoint.simulator.perf_model import StepWork

    perf, _ = model(run)
    decodes = launch.seqs - launch.new
    prefill = max(0, launch.tokens - decodes)
    each = prefill / max(1, launch.new)
    work = StepWork(
        decode_seqs=decodes,
        decode_context_tokens=decodes * context,
        prefill_tokens=prefill,
        prefill_attention_pairs=launch.new * each * (each + 1) / 2,
        prefill_seqs=launch.new,
        sampled_seqs=launch.seqs,
    )
    return float(perf.cpu_floor_seconds(work)) * 1e3, float(perf.gpu_step_time(work).seconds + perf.host_seconds(work)) * 1e3


def model_lone_intake_ms(run: str, prompt_tokens: int) -> float:
    _, intake = model(run)
    return float(intake.lone_seconds(prompt_tokens)) * 1e3


LOAD_PROMPTS = {"c1-p128": 128, "c1-p2048": 2048, "c32-p128": 128}  # the rest: 1,024-token prompts
# A decoding request's mean context in each load: its prompt and half its reply (256 tokens; 64 and 128 for the
# lone 128- and 2,048-token prompts).
LOAD_CONTEXT = {"c1-p128": 128 + 32, "c1-p2048": 2048 + 64, "c32-p128": 128 + 128}


def unprofiled_decode_rows() -> list[dict[str, Any]]:
    """Every run's decode-only steps at the closed loops' full batches, unprofiled (launch to launch), beside the
    simulator's step for the same batch and context: GPU + host time, or its CPU floor where that is longer."""
    from kneepoint.simulator.perf_model import decode_work

    rows = []
    for run in (r for r in RUNS if r in DECODE_LOADS):  # run 25 set the switch interval, not the batch
        perf, _ = model(run)
        for label, seqs in DECODE_LOADS[run]:
            xs = [x.interval_ms for x in launches(run, label) if x.mode.startswith("full") and x.seqs == seqs]
            context = DECODE_CONTEXT.get(run, LOAD_CONTEXT.get(label, 1152))
            sim = float(perf.step_time(decode_work(seqs, context)).seconds) * 1e3
            real = median(xs)
            rows.append(
                {
                    "run": run,
                    "label": RUNS[run][2],
                    "seqs": seqs,
                    "steps": len(xs),
                    "real_ms": real,
                    "sim_ms": sim,
                    "error": sim / real - 1.0,
                }
            )
    return rows


SWITCH_RUN = "1b-h100"  # run 25: the API server's interpreter switch interval, set between loads


def switch_intervals_us(run: str = SWITCH_RUN) -> dict[str, float]:
    """Each load of run 25 by label: the API server's switch interval (µs) while it ran (its ``switch`` stamps)."""
    doc = load(run)
    changes = sorted((s[2], s[4] * 1e6) for s in doc["stamps"] if s[1] == "switch")
    out = {}
    for label in doc["clients"]:
        start = _window(run, label)[0]
        before = [us for wall, us in changes if wall <= start]
        out[label] = before[-1] if before else 5000.0  # Python's default until the first change
    return out


def ttft_p50_ms(rows: list[dict[str, float]]) -> float:
    """The client's TTFT P50 of one load, ms (the median: the load generator's linear P50)."""
    return median(span_ms(rows, "start", "first"))


def print_switch_run() -> None:
    doc = load(SWITCH_RUN)
    switch = switch_intervals_us()
    print(f"\n## {RUNS[SWITCH_RUN][2]}: the 1B, the API server's switch interval set between loads ({RUNS[SWITCH_RUN][0]})\n")
    print(
        "| load | switch interval µs | TTFT P50 ms | first request: handler -> rendered, median | renders apart, median | rendered before the wave's last handler |"
    )
    print("|---|---|---|---|---|---|")
    for label in sorted((k for k in doc["clients"] if k != "warm"), key=lambda k: (k.split("-")[0], switch[k], k)):
        rows = requests(SWITCH_RUN, label)
        first, gaps = wave_renders(rows)
        before, total = renders_before_last_handler(rows)
        print(
            f"| {label} | {switch[label]:,.0f} | {ttft_p50_ms(rows):.1f} | {median(first):.1f} | {median(gaps):.2f} | {before} of {total} |"
        )


RENDER_RUN = "1b-render"  # run 26: a render split at its hops
RENDER_HOPS = (
    ("http", "rcmpl", "handler -> the renderer entered"),
    ("rcmpl", "tok_submit", "-> the prompt submitted to the renderer's worker thread (the loop's turns)"),
    ("tok_submit", "enc0", "-> the worker thread starts it (its queue)"),
    ("enc0", "enc1", "-> tokenized (the thread's work)"),
    ("enc1", "rendered", "-> rendered (back on the loop)"),
)


@functools.cache
def render_hops(label: str, run: str = RENDER_RUN) -> list[dict[str, float]]:
    """Each request of one run-26 load with its render's stamps (wall-clock seconds), in send order. The worker
    thread's encode stamps carry no request id (``run_in_executor`` does not carry the context): the renderer has
    one worker (vLLM 0.24's ``renderer_num_workers`` default), so the k-th encode is the k-th submitted prompt's."""
    api = [s for s in load(run)["stamps"] if s[0] == "api" and s[1] in ("tok_submit", "enc0", "enc1")]
    submits = [s[4] for s in api if s[1] == "tok_submit"]
    starts = [s[2] for s in api if s[1] == "enc0"]
    ends = [s[2] for s in api if s[1] == "enc1"]
    encodes: dict[str, dict[str, float]] = {}
    for rid, t0, t1 in zip(submits, starts, ends, strict=True):
        encodes.setdefault(rid, {"enc0": t0, "enc1": t1})
    return requests(run, label, encodes)


def print_render_run() -> None:
    print(f"\n## {RUNS[RENDER_RUN][2]}: the 1B's renders split at their hops ({RUNS[RENDER_RUN][0]}), medians in ms\n")
    print("| load | client send -> handler | " + " | ".join(what for _, _, what in RENDER_HOPS) + " |")
    print("|---|---|" + "---|" * len(RENDER_HOPS))
    for label in loads_in_order(RENDER_RUN):
        rows = render_hops(label)
        cells = [median(span_ms(rows, "start", "http"))] + [median(span_ms(rows, a, b)) for a, b, _ in RENDER_HOPS]
        print(f"| {label} | " + " | ".join(f"{x:.2f}" for x in cells) + " |")


LOOP_RUN = "1b-loop"  # run 27: the collector's pauses, the loop thread sampled, the collector off between loads
# What the API server's loop thread was in when sampled, by its innermost frame (file:function).
LOOP_SAMPLE_KINDS = (
    ("idle", ("runners.py:run",)),  # in the event loop itself (uvloop's C code: waiting, or its own work)
    ("zmq send", ("socket.py:send",)),  # handing a request to the EngineCore
    ("log write", ("system_utils.py:write_with_prefix",)),  # vLLM's log lines (the access log among them)
)


def collector_off(run: str = LOOP_RUN) -> dict[str, tuple[str, ...]]:
    """Each load of run 27 by label: the processes ("api", "core") that ran it with the collector off."""
    doc = load(run)
    changes = sorted((s[2], s[0], s[4]) for s in doc["stamps"] if s[1] == "gcmode")
    out = {}
    for label in doc["clients"]:
        start = _window(run, label)[0]
        enabled = {"api": True, "core": True}
        for wall, who, on in changes:
            if wall <= start:
                enabled[who] = on
        out[label] = tuple(who for who, on in enabled.items() if not on)
    return out


def gc_pauses(run: str, label: str, who: str) -> list[float]:
    """The collector's pauses (ms) in one process (``api`` or ``core``) while one load ran."""
    t0, t1 = _window(run, label)
    return [s[5] * 1e3 for s in load(run)["stamps"] if s[0] == who and s[1] == "gc" and t0 <= s[2] <= t1]


def loop_samples(run: str, label: str) -> dict[str, int]:
    """The API server's loop-thread samples while one load ran, counted by LOOP_SAMPLE_KINDS (the rest: "other")."""
    t0, t1 = _window(run, label)
    stamps = load(run)["stamps"]
    stacks = {s[4]: s[5][0].rsplit(":", 1)[0] for s in stamps if s[1] == "stack"}
    counts = dict.fromkeys([k for k, _ in LOOP_SAMPLE_KINDS] + ["other"], 0)
    for s in stamps:
        if s[1] == "smp" and t0 <= s[2] <= t1:
            inner = stacks[s[4]]
            kind = next((k for k, frames in LOOP_SAMPLE_KINDS if inner in frames), "other")
            counts[kind] += 1
    return counts


def idle_thread_starts_ms(label: str, run: str = LOOP_RUN) -> list[float]:
    """Submit -> the renderer's worker thread starts encoding (ms), for the prompts submitted while that thread had
    nothing to do (the encode before had ended): what the thread waits to run at all."""
    rows = sorted((r for r in render_hops(label, run) if "enc0" in r), key=lambda r: r["enc0"])
    return sorted((b["enc0"] - b["tok_submit"]) * 1e3 for a, b in zip(rows, rows[1:], strict=False) if b["tok_submit"] >= a["enc1"])


def print_loop_run() -> None:
    off = collector_off()
    print(f"\n## {RUNS[LOOP_RUN][2]}: the 1B's API server, its collector and its loop thread ({RUNS[LOOP_RUN][0]})\n")
    print(
        "| load | collector off in | TTFT P50 ms | API server's collections: n, total ms, longest | EngineCore's: n, total ms, "
        "longest | loop-thread samples: idle / zmq send / log write / other | an idle worker thread starts, median ms (n) "
        "| send -> the EngineCore has it, median ms | -> its first token's step processed |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for label in loads_in_order(LOOP_RUN):
        rows = requests(LOOP_RUN, label)
        cells = [", ".join(off[label]) or "-", f"{ttft_p50_ms(rows):.1f}"]
        for who in ("api", "core"):
            p = gc_pauses(LOOP_RUN, label, who)
            cells.append(f"{len(p)}, {sum(p):.1f}, {max(p, default=0.0):.2f}")
        cells.append(" / ".join(str(n) for n in loop_samples(LOOP_RUN, label).values()))
        starts = idle_thread_starts_ms(label)
        cells.append(f"{median(starts):.2f} ({len(starts)})" if starts else "-")
        cells += [f"{median(span_ms(rows, 'start', 'core_in')):.1f}", f"{median(span_ms(rows, 'core_in', 'update')):.1f}"]
        print(f"| {label} | " + " | ".join(cells) + " |")


def decode_bins(steps: list[Launch], prompt: int, seqs: int | None = None) -> list[tuple[int, int, float]]:
    """(sequences, context, median launch-to-launch ms) of each 32 steps of the runs of 24 or more decode-only steps in
    ``steps``, at ``seqs`` sequences (None: each run's most): a wave's requests decode together, so a step's context
    is the prompt and its place in the run."""
    bins, held = [], []
    for x in [*steps, None]:
        if x is not None and x.tokens == x.seqs:
            held.append(x)
            continue
        if len(held) >= 24:
            at = seqs if seqs is not None else max(s.seqs for s in held)
            for i in range(0, len(held) - 7, 32):
                chunk = held[i : i + 32]
                part = [s.interval_ms for s in chunk if s.seqs == at]
                if len(part) >= 8:
                    bins.append((at, prompt + i + len(chunk) // 2, median(part)))
        held = []
    return bins


def decode_by_context(run: str, label: str, seqs: int = 128, prompt: int = 128) -> list[tuple[int, float]]:
    """(context, median launch-to-launch ms) of each 32 steps of one load's runs of decode-only steps at ``seqs``
    sequences (:func:`decode_bins`)."""
    return [(ctx, ms) for _, ctx, ms in decode_bins(launches(run, label), prompt, seqs)]


# Runs 28-29 and 40-41's loads of 128-token prompts at c128 (H100): the decode step of 128 sequences by its context.
DECODE_BY_CONTEXT = (
    ("8b-waves", "c128"),
    ("8b-waves-2", "c128"),
    ("8b-short-c128", "c128-p128"),
    ("8b-short-c128", "c128-d"),
    ("8b-fp8-short-c128", "c128-p128"),
    ("8b-fp8-short-c128", "c128-d"),
    ("8b-fp8-short-c128-2", "c128-p128"),
    ("8b-fp8-short-c128-2", "c128-d"),
    ("14b-fp8-short-c128", "c128-p128"),
    ("14b-fp8-short-c128", "c128-d"),
)


def decode_by_context_runs() -> str:
    """The runs ``DECODE_BY_CONTEXT`` reads, as a heading says them ("runs 28, 29, 40 and 41")."""
    numbers = list(dict.fromkeys(RUNS[run][2].removeprefix("run ") for run, _ in DECODE_BY_CONTEXT))
    return "runs " + ", ".join(numbers[:-1]) + " and " + numbers[-1]


def print_decode_by_context() -> None:
    from kneepoint.simulator.perf_model import decode_work

    print(f"\n## {decode_by_context_runs().capitalize()}: 128 sequences decoding by their context (H100), launch to launch, ms\n")
    print("| run | load | context (tokens) | vLLM, median of 32 steps | the model | error |")
    print("|---|---|---|---|---|---|")
    for run, label in DECODE_BY_CONTEXT:
        perf, _ = model(run)
        for ctx, real in decode_by_context(run, label):
            sim = perf.step_time(decode_work(128, ctx)).seconds * 1e3
            print(f"| {RUNS[run][2]} ({run}) | {label} | {ctx} | {real:.2f} | {sim:.2f} | {sim / real - 1:+.1%} |")


def decode_step_bins(run: str, label: str) -> list[tuple[int, int, float]]:
    """:func:`decode_bins` of one load at each run's most sequences, the context from the load's prompt (its first
    step that took new requests)."""
    steps = launches(run, label)
    first = next((x for x in steps if x.new), None)
    if first is None:
        return []
    return decode_bins(steps, round((first.tokens - (first.seqs - first.new)) / first.new))


DECODE_STEPS_MIN_SEQS = 8  # below, a step is mostly the CPU floor and the host's speed


def decode_step_errors(run: str) -> list[tuple[float, str]]:
    """The model's error on each :func:`decode_step_bins` bin of 8 or more sequences of every load of ``run``, with
    what the bin was ("load seqs, context: real / model")."""
    from kneepoint.simulator.perf_model import decode_work

    perf, _ = model(run)
    errors = []
    for label in loads_in_order(run):
        for seqs, ctx, real in decode_step_bins(run, label):
            if seqs >= DECODE_STEPS_MIN_SEQS:
                sim = perf.step_time(decode_work(seqs, ctx)).seconds * 1e3
                errors.append((sim / real - 1, f"{label} {seqs}, {ctx}: {real:.2f} / {sim:.2f}"))
    return errors


def print_decode_steps() -> None:
    print("\n## Every stamped load's decode-only steps (the 1B's aside: its steps are vLLM's CPU time), 32 at a time, ms\n")
    print("| run | loads | bins | mean error | mean abs error | worst bin (seqs, context: real / model) |")
    print("|---|---|---|---|---|---|")
    errors_all: list[float] = []
    for run in RUNS:
        if RUNS[run][0].startswith("1b"):
            continue
        bins = decode_step_errors(run)
        if not bins:
            continue
        errors = [e for e, _ in bins]
        worst = max(bins, key=lambda b: abs(b[0]))
        errors_all += errors
        print(
            f"| {RUNS[run][2]} ({run}) | {len(loads_in_order(run))} | {len(errors)} | {statistics.fmean(errors):+.1%} | "
            f"{statistics.fmean(abs(e) for e in errors):.2%} | {worst[0]:+.1%} ({worst[1]}) |"
        )
    print(
        f"\n{len(errors_all)} bins: mean abs error {statistics.fmean(abs(e) for e in errors_all):.2%}, mean "
        f"{statistics.fmean(errors_all):+.2%}, worst {max(errors_all, key=abs):+.1%}; within 5 %: "
        f"{sum(abs(e) <= 0.05 for e in errors_all)}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", choices=[*STAGE_RUNS, SWITCH_RUN, RENDER_RUN, LOOP_RUN, "all"], default="all")
    parser.add_argument("--p90", action="store_true", help="P90s beside the medians")
    parser.add_argument("--decode-by-context", action="store_true", help=f"only {decode_by_context_runs()}'s decode steps at 128 sequences")
    parser.add_argument("--decode-steps", action="store_true", help="only every stamped load's decode-only steps against the model's")
    args = parser.parse_args(argv)
    if args.decode_steps:
        print_decode_steps()
        return 0
    if args.decode_by_context:
        print_decode_by_context()
        return 0
    if args.run in (SWITCH_RUN, "all"):
        print_switch_run()
    if args.run in (RENDER_RUN, "all"):
        print_render_run()
    if args.run in (LOOP_RUN, "all"):
        print_loop_run()
    for run in STAGE_RUNS if args.run == "all" else [r for r in [args.run] if r in STAGE_RUNS]:
        labels = loads_in_order(run)
        print(f"\n## {RUNS[run][2]}: the {run.upper()} ({RUNS[run][0]})\n")
        print("Stages, medians in ms" + (" (P90)" if args.p90 else "") + ":\n")
        print("| load | " + " | ".join(s[0] for s in STAGES) + " | intake (send -> scheduled) | model's lone intake |")
        print("|---|" + "---|" * (len(STAGES) + 2))
        for label in labels:
            rows = requests(run, label)
            cells = []
            for _name, a, b, _what in STAGES:
                xs = span_ms(rows, a, b)
                cells.append(f"{median(xs):.1f}" + (f" ({percentile_sorted(xs, 90):.1f})" if args.p90 else "") if xs else "-")
            intake = span_ms(rows, *INTAKE)
            lone = model_lone_intake_ms(run, LOAD_PROMPTS.get(label, 1024) + 1)
            print(f"| {label} (n={len(rows)}) | " + " | ".join(cells) + f" | {median(intake):.1f} | {lone:.1f} |")
        print("\nStep launches (scheduled -> next scheduled), medians in ms, beside the simulator's CPU floor:\n")
        print("| load | mode | tokens | steps | real | model's CPU floor | model's GPU + host |")
        print("|---|---|---|---|---|---|---|")
        for label in labels:
            groups: dict[tuple[str, int], list[Launch]] = {}
            for launch in launches(run, label):
                size = (
                    launch.seqs
                    if launch.tokens == launch.seqs
                    else (-(-launch.tokens // 1024) * 1024 if launch.tokens > 1024 else launch.tokens)
                )
                groups.setdefault((launch.mode, size), []).append(launch)
            for (mode, size), ls in sorted(groups.items()):
                if len(ls) < (20 if mode.startswith("full") else 3):
                    continue
                mid = sorted(ls, key=lambda x: x.interval_ms)[len(ls) // 2]
                cpu, gpu = model_step_ms(run, mid, LOAD_CONTEXT.get(label, 1152))
                what = f"{size} seqs" if mode.startswith("full") else f"<= {size}"
                print(f"| {label} | {mode} | {what} | {len(ls)} | {median([x.interval_ms for x in ls]):.2f} | {cpu:.2f} | {gpu:.2f} |")
        points = lone_launches_and_arrivals(run)
        base, per = slope(points)
        print(
            f"\nA lone 1,024-token prompt's step, launch to launch, against the requests that reached the EngineCore "
            f"meanwhile ({len(points)} steps): {base:.1f} ms + {per:.2f} ms a request"
        )
        print("\nWhen the busy EngineCore plans: after a step's result (ms from the result, median and P90) or on a launch alone:\n")
        print("| load | plans after a result | median | P90 | plans on a launch alone |")
        print("|---|---|---|---|---|")
        for label in labels:
            gaps, on_launch = plans_after_results(run, label)
            if gaps:
                xs = sorted(gaps)
                print(f"| {label} | {len(xs)} | {median(xs):.2f} | {percentile_sorted(xs, 90):.2f} | {on_launch} |")
        print("\nThe API server at a wave boundary (waves of 8 or more requests), ms:\n")
        print(
            "| load | waves | first request: handler -> rendered, median (max) | next renders apart, median "
            "| rendered before the wave's last handler |"
        )
        print("|---|---|---|---|---|")
        for label in labels:
            rows = requests(run, label)
            first, gaps = wave_renders(rows)
            if first:
                before, total = renders_before_last_handler(rows)
                print(f"| {label} | {len(first)} | {median(first):.1f} ({max(first):.1f}) | {median(gaps):.2f} | {before} of {total} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
