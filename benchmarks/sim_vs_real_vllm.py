"""The simulator against real vLLM serving: every capture's workload replayed on `kneepoint sim`.

For each load-generator capture of real vLLM 0.24.0 on one H200 in tests/data/vllm (README
there), this starts `kneepoint sim` with the operator's own engine flags (the manifest
builder's, for deploy/examples/experiment.yaml at TP1, with the capture engine's
--max-num-seqs; for the other model sizes of run 5 the same builder on the example the
capture's engine was built from: MODELS), runs the project's `kneepoint loadgen` against it
with the capture's own flags, and prints the simulator's figures beside real vLLM's with the
error. Then the per-composition step times, simulator model against the real traces.

    .venv/bin/python benchmarks/sim_vs_real_vllm.py [--only c32-operator,1b-c1] [--models 8b-tp1,1b-tp1] [--port 18400]

Exit status 0 when every figure is within --tolerance (default 10 %), 1 otherwise. The summary
counts the misses that also lie outside the tolerance of every real capture of their workload, and
ends with the floor: how many figures any simulator misses, because real vLLM's own captures of a
workload lie too far apart for one value to be within the tolerance of them all. Takes about
as long as the captures themselves took (the simulator runs in real time): about 40 minutes for all.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

from kneepoint.loadgen.statistics import percentile, percentile_sorted

if TYPE_CHECKING:
    from kneepoint.core.spec import ExperimentSpec

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "vllm"
CAPTURE_MAX_NUM_SEQS = 128
"""The captures' engine ran with --max-num-seqs 128 (so one engine served the whole sweep); the
operator's own flag is the load's concurrency. Below 128 concurrent requests both schedule alike."""
PROFILED = ("-prof",)  # captures with a profiled slice measure the profiler, not serving
FIGURES = (
    ("out tok/s", "outputTokensPerSecond"),
    ("TTFT P50", "ttftP50Ms"),
    ("TTFT P99", "ttftP99Ms"),
    ("TPOT mean", "tpotMeanMs"),
    ("E2E P50", "latencyP50Ms"),
    ("E2E P99", "latencyP99Ms"),
)


MODELS: dict[str, tuple[str, dict, int]] = {
    # capture prefix: (example the capture engine's flags were built from, spec.model changes, its --max-num-seqs)
    "8b-tp1": ("experiment.yaml", {}, CAPTURE_MAX_NUM_SEQS),
    "8b-h100-tp1": ("experiment.yaml", {}, CAPTURE_MAX_NUM_SEQS),
    "1b-tp1": (
        "experiment.yaml",
        {"uri": "hf://meta-llama/Llama-3.2-1B-Instruct", "architecture": {"preset": "llama-3.2-1b"}},
        CAPTURE_MAX_NUM_SEQS,
    ),
    "70b-fp8-tp1": ("large-model.yaml", {"dtype": "fp8"}, 64),
    "8b-fp8-tp1": ("experiment.yaml", {"dtype": "fp8"}, CAPTURE_MAX_NUM_SEQS),
    "8b-fp8-h100-tp1": ("experiment.yaml", {"dtype": "fp8"}, CAPTURE_MAX_NUM_SEQS),
    "14b-tp1": (
        "experiment.yaml",
        {"uri": "hf://Qwen/Qwen2.5-14B-Instruct", "architecture": {"preset": "qwen2.5-14b"}},
        CAPTURE_MAX_NUM_SEQS,
    ),
    "14b-fp8-h100-tp1": (
        "experiment.yaml",
        {"uri": "hf://Qwen/Qwen2.5-14B-Instruct", "architecture": {"preset": "qwen2.5-14b"}, "dtype": "fp8"},
        CAPTURE_MAX_NUM_SEQS,
    ),
}
"""Real vLLM captures by model (tests/data/vllm/README.md: runs 1-4 the 8B, run 5 the 1B and 70B fp8 shapes,
run 12 the 8B with online fp8, run 18 Qwen2.5-14B's shape, an architecture none of the fits saw, run 24 the 8B on an
H100, a GPU none of the fits saw, run 28 the 8B and the 8B fp8 on an H100 with run 6, 9 and 12's short prompts, run 31
the 14B's shape with online fp8 on an H100: a model, dtype and GPU together that no fit saw)."""
GPUS = {"8b-h100-tp1": "h100-sxm", "8b-fp8-h100-tp1": "h100-sxm", "14b-fp8-h100-tp1": "h100-sxm"}
"""The simulator's GPU (``kneepoint sim --gpu``) for captures taken on another GPU than the H200."""


@functools.cache
def example_spec(model: str = "8b-tp1") -> ExperimentSpec:
    """The example experiment the capture's engine was built from, with the model's changes."""
    import yaml

    from kneepoint.core.spec import parse_spec

    example, changes, _ = MODELS[model]
    doc = yaml.safe_load((ROOT / "deploy" / "examples" / example).read_text())["spec"]
    doc["model"].update(changes)
    return parse_spec(doc)


def engine_args(max_num_seqs: int, model: str = "8b-tp1") -> list[str]:
    """The operator's vLLM flags for the capture's example experiment at TP1 (kube/manifests.py)."""
    from kneepoint.core.tiers import Tier
    from kneepoint.kube.manifests import vllm_args

    args = vllm_args(example_spec(model), Tier(1, 1))
    args[args.index("--max-num-seqs") + 1] = str(max_num_seqs)
    return [*args, "--gpu", GPUS[model]] if model in GPUS else args


def capture_engine_args(capture: dict) -> list[str]:
    """The replay's engine flags: the model's (engine_args), with the flags the capture's own engine changed
    (``engineFlags``: run 23's engines were the operator's for each workload's own experiment)."""
    args = engine_args(MODELS[capture["model"]][2], capture["model"])
    for flag, value in (capture.get("engineFlags") or {}).items():
        args[args.index(flag) + 1] = str(value)
    return args


def loadgen_args(config: dict, endpoint: str) -> list[str]:
    """The capture's own load-generator flags, pointed at the simulator."""
    args = [
        "--endpoint",
        endpoint,
        "--model",
        config["model"],
        "--api",
        config["api"],
        "--concurrency",
        str(config["concurrency"]),
        "--num-requests",
        str(config["numRequests"]),
        "--input-len",
        str(config["inputLen"]),
        "--output-len",
        str(config["outputLen"]),
        "--seed",
        str(config["seed"]),
        "--warmup-requests",
        str(config["warmupRequests"]),
        "--repeats",
        str(config["repeats"]),
        "--max-error-fraction",
        "1.0",
        "--no-progress",
    ]
    return args


def wait_healthy(port: int, proc: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"kneepoint sim exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    raise RuntimeError("kneepoint sim did not become healthy")


def run_capture(name: str, capture: dict, port: int, exe: Path) -> dict:
    sim_cmd = [str(exe), "sim", *capture_engine_args(capture), "--dcgm-port", "0", "--model-load-seconds", "0"]
    sim_cmd[sim_cmd.index("--port") + 1] = str(port)
    sim_cmd[sim_cmd.index("--host") + 1] = "127.0.0.1"
    with tempfile.TemporaryDirectory() as tmp:
        log = open(Path(tmp) / "sim.log", "w")  # noqa: SIM115 - the simulator writes it until the end; the tmp dir removes it
        proc = subprocess.Popen(sim_cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_healthy(port, proc)
            out = Path(tmp) / "lg.json"
            cmd = [str(exe), "loadgen", *loadgen_args(capture["config"], f"http://127.0.0.1:{port}"), "--save-json", str(out)]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
            return json.loads(out.read_text())["summary"]
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
            log.close()


def captures(only: set[str] | None, models: tuple[str, ...] = ("8b-tp1",)) -> dict[str, dict]:
    """The captures of ``models`` by name: the 8B's as their file names say (c32-operator), the
    other models' with the model before (1b-c32, 70b-fp8-c16). Each carries its ``model``."""
    found = {}
    for model in models:
        for path in sorted(DATA.glob(f"{model}-loadgen-*.json")):
            name = path.name[len(f"{model}-loadgen-") : -len(".json")]
            if model != "8b-tp1":
                name = f"{model.removesuffix('-tp1')}-{name}"
            if any(p in name for p in PROFILED) or (only and name not in only):
                continue
            doc = json.loads(path.read_text())
            if "config" in doc and "summary" in doc:
                found[name] = {**doc, "model": model, "path": str(path)}
    return found


def workload_key(cap: dict) -> str:
    """What makes two captures the same load for the spread column: the engine (the capture's model prefix:
    the 8B and the 8B fp8 serve under one name), API, concurrency, lengths (not the seed or the request count)."""
    c = cap["config"]
    return f"{cap['model']} {c['api']} c{c['concurrency']} {c['inputLen']}/{c['outputLen']}"


def by_workload(caps: dict[str, dict]) -> dict[str, list[dict]]:
    """The captures grouped by ``workload_key``: real vLLM's takes of one load."""
    groups: dict[str, list[dict]] = {}
    for cap in caps.values():
        groups.setdefault(workload_key(cap), []).append(cap)
    return groups


def holds(sim: float, real: float, tolerance: float) -> bool:
    """Whether a simulated figure is within ``tolerance`` of a real one (|sim / real - 1| <= tolerance)."""
    return (1 - tolerance) * real <= sim <= (1 + tolerance) * real


def fewest_misses(values: list[float], tolerance: float) -> int:
    """The fewest of ``values`` (one figure of one workload's real captures) that any one simulated value misses.

    A value holds the real r when it lies in [(1 - tolerance) r, (1 + tolerance) r]; the most of these intervals that
    share a point share the lower end of one of them, so those ends are the only values worth trying."""
    if not values:
        return 0
    return len(values) - max(sum(holds((1 - tolerance) * v, r, tolerance) for r in values) for v in values)


def unavoidable_misses(caps: dict[str, dict], tolerance: float) -> dict[str, tuple[int, int]]:
    """Per engine (the capture's model): (figures, the fewest of them that any simulator misses). The simulator gives
    one workload one value a figure (as a model, whatever its noise seed), so where real vLLM's own captures of a
    workload lie further apart than the tolerance allows on both sides, some of them are missed whatever it gives."""
    floor: dict[str, tuple[int, int]] = {}
    for group in by_workload(caps).values():
        model = group[0]["model"]
        n, missed = floor.get(model, (0, 0))
        for _, fig in FIGURES:
            n, missed = n + len(group), missed + fewest_misses([float(c["summary"][fig]) for c in group], tolerance)
        floor[model] = (n, missed)
    return floor


def floor_line(caps: dict[str, dict], tolerance: float) -> str:
    """The summary's line on what no simulator can meet in ``caps``."""
    floor = unavoidable_misses(caps, tolerance)
    total = sum(n for n, _ in floor.values())
    least = sum(m for _, m in floor.values())
    engines = ", ".join(f"{model} {m} of {n}" for model, (n, m) in floor.items() if m)
    return (
        f"at least {least} of the {total} figures miss {tolerance:.0%} whatever the simulator gives: real vLLM's own captures "
        f"of their workload lie too far apart for one value to hold them all" + (f" ({engines})" if engines else "")
    )


PERCENTILES = {
    "ttftP50Ms": ("ttftMs", 50.0),
    "ttftP99Ms": ("ttftMs", 99.0),
    "latencyP50Ms": ("latencyMs", 50.0),
    "latencyP99Ms": ("latencyMs", 99.0),
}
"""The percentile figures, by the per-request field and percentile they are taken from."""


@functools.cache
def _repeats(capture_path: str) -> tuple[list[dict], ...]:
    """A capture's answered requests by repeat, from its ``-requests.json.gz`` (read once: a summary asks for each
    missed figure of a capture); empty where it kept none."""
    path = Path(capture_path).with_name(Path(capture_path).stem + "-requests.json.gz")
    if not path.is_file():
        return ()
    doc = json.loads(gzip.decompress(path.read_bytes()))
    repeats: dict[int, list[dict]] = {}
    for r in doc["requests"] if isinstance(doc, dict) else doc:
        if not r.get("error") and r.get("ttftMs") is not None:
            repeats.setdefault(int(r.get("repeat") or 0), []).append(r)
    return tuple(repeats.values())


def measured_requests(cap: dict) -> list[dict] | None:
    """The requests behind a capture's summary (its ``-requests.json.gz`` beside it: the repeat whose TTFT P50 is the
    summary's), or None where the capture kept none."""
    repeats = _repeats(cap["path"]) if cap.get("path") else ()
    target = float(cap["summary"]["ttftP50Ms"])
    return min(repeats, key=lambda rs: abs(percentile([r["ttftMs"] for r in rs], 50.0) - target), default=None)


def one_request_swing(cap: dict, key: str) -> float | None:
    """How far one request of real vLLM's own sample moves a percentile figure: the larger relative change when one
    request below the percentile ends up above it, or one above below it. Where a closed loop's waves get their first
    tokens in a few prefill steps, TTFT P50 can lie between two of them (run 3's c16: 49 of 96 requests in the waves'
    first two steps), and which step one request joins moves it by a step; None for a figure that is not a
    percentile or a capture without its requests."""
    if key not in PERCENTILES:
        return None
    rows = measured_requests(cap)
    if not rows or len(rows) < 2:
        return None
    field, p = PERCENTILES[key]
    ordered = sorted(float(r[field]) for r in rows)
    value = percentile_sorted(ordered, p)
    up = percentile_sorted([*ordered[1:], ordered[-1]], p)  # the lowest request moved past the top
    down = percentile_sorted([ordered[0], *ordered[:-1]], p)  # the highest moved below the bottom
    return max(abs(up - value), abs(down - value)) / value


def swings_line(misses: list[tuple[dict, str]], tolerance: float) -> str:
    """The summary's line on the misses whose real figure one request of real vLLM's sample moves beyond the tolerance."""
    swung = sum(1 for cap, key in misses if (one_request_swing(cap, key) or 0.0) > tolerance)
    return (
        f"{swung} of the {len(misses)} misses are percentiles that one request of real vLLM's own sample moves by more than "
        f"{tolerance:.0%} (which prefill step one request joins decides them)"
    )


def real_spread(caps: dict[str, dict]) -> dict[str, dict[str, tuple[float, float, int]]]:
    """Per workload and figure: (lowest, highest, number of captures) over real vLLM's own captures.
    Real vLLM repeats some figures poorly (the waves at c128 are bistable; tests/data/vllm/README.md,
    run 3): a figure whose own captures differ by more than the tolerance cannot be held to it."""
    spread = {}
    for key, group in by_workload(caps).items():
        summaries = [cap["summary"] for cap in group]
        spread[key] = {
            fig: (min(float(s[fig]) for s in summaries), max(float(s[fig]) for s in summaries), len(summaries)) for _, fig in FIGURES
        }
    return spread


def step_table() -> tuple[list[str], float, str]:
    from kneepoint.simulator.calibration import load_calibration
    from kneepoint.simulator.calibration_vllm import (
        comparison_rows,
        llama70b_fp8_h200_tp1,
        load_compositions,
        load_fp8_compositions,
        load_held_out_14b_compositions,
        qwen14b_h200_tp1,
    )
    from kneepoint.simulator.command import CALIBRATION_ENV

    cal = load_calibration(os.environ.get(CALIBRATION_ENV))  # what the simulator it starts reads too
    rows = comparison_rows(load_compositions(DATA), cal)
    rows += [
        {**r, "composition": f"70B fp8: {r['composition']}"}
        for r in comparison_rows(load_fp8_compositions(DATA), cal, llama70b_fp8_h200_tp1(cal))
    ]
    rows += [
        {**r, "composition": f"14B (held out): {r['composition']}"}
        for r in comparison_rows(load_held_out_14b_compositions(DATA), cal, qwen14b_h200_tp1(cal))
    ]
    lines = ["| step composition | steps traced | real vLLM ms | simulator ms | error |", "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['composition']} | {r['steps']} | {r['real_ms']:.2f} | {r['sim_ms']:.2f} | {r['error']:+.1%} |")
    worst = max(abs(r["error"]) for r in rows if r["fitted"] and "decode" in r["composition"] and "prefill" not in r["composition"])
    # Unprofiled: the decode steps' launch-to-launch times that runs 19-22 stamped inside vLLM (no profiler).
    from vllm_request_stages import unprofiled_decode_rows

    lines += ["", "| decode step, unprofiled (runs 19-22) | steps | real vLLM ms | simulator ms | error |", "|---|---|---|---|---|"]
    unprofiled = unprofiled_decode_rows()
    for r in unprofiled:
        lines.append(
            f"| {r['run'].upper()} ({r['label']}), {r['seqs']} sequences | {r['steps']} | {r['real_ms']:.2f} | {r['sim_ms']:.2f} | {r['error']:+.1%} |"
        )
    gpu_bound = max(abs(r["error"]) for r in unprofiled if r["run"] != "1b")
    within = sum(abs(r["error"]) <= 0.05 for r in unprofiled if r["run"] != "1b")
    cpu_bound = sorted(r["error"] for r in unprofiled if r["run"] == "1b")
    summary = (
        f"unprofiled decode steps: the GPU-bound engines' (8B, 14B, 70B fp8) within {gpu_bound:.1%}, {within} of "
        f"{sum(r['run'] != '1b' for r in unprofiled)} within 5%; the 1B's, vLLM's CPU time, {cpu_bound[0]:+.1%} to "
        f"{cpu_bound[-1]:+.1%} on run 19's host (the floor is fitted to the median host speed)"
    )
    return lines, worst, summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated capture names (e.g. c32-operator,c1)")
    parser.add_argument("--models", default=",".join(MODELS), help=f"capture prefixes, comma-separated (default: all, {', '.join(MODELS)})")
    parser.add_argument("--port", type=int, default=18400)
    parser.add_argument("--tolerance", type=float, default=0.10)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    exe = Path(sys.executable).with_name("kneepoint")
    only = {s for s in args.only.split(",") if s} or None
    models = tuple(m for m in args.models.split(",") if m)
    caps = captures(only, models)
    for model in models:
        print(f"engine flags ({model}): kneepoint sim {' '.join(engine_args(MODELS[model][2], model))}")
    for name, cap in caps.items():
        if cap.get("engineFlags"):
            print(f"  {name}: its engine's own {' '.join(f'{k} {v}' for k, v in cap['engineFlags'].items())}")
    spread = real_spread(captures(None, models))
    lines = [
        "| capture | workload | figure | real vLLM | simulator | error | real vLLM, every capture of the workload |",
        "|---|---|---|---|---|---|---|",
    ]
    results, worst, misses, beyond_spread = {}, 0.0, [], 0
    missed: list[tuple[dict, str]] = []
    for name, cap in caps.items():
        c = cap["config"]
        sim = run_capture(name, cap, args.port, exe)
        real = cap["summary"]
        workload = f"{c['api']} c{c['concurrency']} {c['inputLen']}/{c['outputLen']} x{c['numRequests']}"
        results[name] = {"workload": workload, "real": {}, "sim": {}}
        for label, key in FIGURES:
            r, s = float(real[key]), float(sim[key])
            err = s / r - 1.0
            worst = max(worst, abs(err))
            results[name]["real"][key], results[name]["sim"][key] = r, s
            fmt = "{:,.0f}" if key == "outputTokensPerSecond" else "{:,.1f}" if r >= 100 else "{:.2f}"
            low, high, n = spread[workload_key(cap)][key]
            among = f"{fmt.format(low)} to {fmt.format(high)} ({n}, {high / low - 1:.0%} apart)" if n > 1 else ""
            lines.append(f"| {name} | {workload} | {label} | {fmt.format(r)} | {fmt.format(s)} | {err:+.1%} | {among} |")
            if not holds(s, r, args.tolerance):
                own = f"; real vLLM's {n} captures of this workload differ by {high / low - 1:.0%}" if n > 1 else ""
                misses.append(f"{name} {label}: {err:+.1%}{own}")
                missed.append((cap, key))
                if not low * (1 - args.tolerance) <= s <= high * (1 + args.tolerance):
                    beyond_spread += 1
        print(lines[-len(FIGURES)], flush=True)
    print("\n" + "\n".join(lines))
    steps, worst_step, unprofiled = step_table()
    print("\n" + "\n".join(steps))
    print(f"\n{len(misses)} of {len(FIGURES) * len(caps)} figures outside {args.tolerance:.0%}:")
    for m in misses:
        print(f"  {m}")
    print(
        f"{beyond_spread} of them also outside {args.tolerance:.0%} of every real capture of their workload "
        f"(the rest lie within real vLLM's own spread between repeats of the same load)"
    )
    print(floor_line(caps, args.tolerance))
    print(swings_line(missed, args.tolerance))
    print(f"\nworst end-to-end error {worst:.1%} (goal {args.tolerance:.0%}); worst traced decode step error {worst_step:.1%} (goal 5%)")
    print(unprofiled)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0 if worst <= args.tolerance and worst_step <= 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
