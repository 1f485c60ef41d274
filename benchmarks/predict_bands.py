"""Predict-first's error bands: the in-process prediction (``kneepoint.simulator.ladder_prediction``) against real vLLM.

The prediction runs the simulator's engine under the load generator's workload on a virtual
clock, without noise (``virtual_tier``). This replays every real-vLLM 0.24 capture of the 8B
(bf16 and online fp8) and the 70B fp8 in tests/data/vllm (the profiled ones aside; the same sets
as ``benchmarks/sim_vs_real_vllm.py``) that way, with the operator's engine flags at TP1 and the
capture's own workload (and its engine's own --max-num-seqs and --max-model-len where it ran with others:
run 23), and prints each figure's error. The largest throughput and P99 errors are the bands the
adapter ships (``TP1_THROUGHPUT_BAND``, ``FP8_TP1_THROUGHPUT_BAND`` for fp8 engines, both up to 128
requests in flight, ``HIGH_CONCURRENCY_THROUGHPUT_BAND`` above, ``TP1_P99_BAND``); exit status 1
when a capture falls outside its band.

    .venv/bin/python benchmarks/predict_bands.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_vs_real_vllm import capture_engine_args, captures, example_spec

from kneepoint.simulator import ladder_prediction as lp
from kneepoint.simulator.virtual_tier import Workload, run_load_test, start_engine


def predicted(capture: dict) -> dict:
    """One capture's workload on the in-process simulator, as the prediction runs it."""
    config = capture["config"]
    preset = example_spec(capture["model"]).model.architecture.preset
    start = start_engine(capture_engine_args(capture) + lp.simulator_flags("NVIDIA-H200", "nvlink", preset))
    assert start.settings is not None, start.message
    workload = Workload(
        concurrency=config["concurrency"],
        num_requests=config["numRequests"],
        input_len=config["inputLen"],
        output_len=config["outputLen"],
        api=config["api"],
        seed=config["seed"],
        warmup_requests=config["warmupRequests"],
        repeats=config["repeats"],
    )
    return run_load_test(start.settings, workload).summary


def errors(models: tuple[str, ...] = ("8b-tp1",)) -> list[tuple[str, float, float, float, float, int]]:
    """(capture, real tok/s, throughput error, real P99 ms, P99 error, concurrency) per capture of ``models``."""
    out = []
    for name, capture in captures(None, models).items():
        real, sim = capture["summary"], predicted(capture)
        t_err = sim["outputTokensPerSecond"] / real["outputTokensPerSecond"] - 1
        p_err = sim["latencyP99Ms"] / real["latencyP99Ms"] - 1
        out.append((name, real["outputTokensPerSecond"], t_err, real["latencyP99Ms"], p_err, int(capture["config"]["concurrency"])))
    return out


def main() -> int:
    ok = True
    # The 1B's captures are left out: CPU-bound on the device's host (docs/simulator.md, "Other model sizes"),
    # such a model stops at TP1 by memory before any throughput comparison.
    for label, models, fp8 in (("bf16", ("8b-tp1", "14b-tp1"), False), ("online fp8", ("8b-fp8-tp1", "70b-fp8-tp1"), True)):
        rows = errors(models)
        print(f"{'capture':<22} {'in flight':>9} {'real tok/s':>10} {'error':>7} {'band':>5} {'real P99 ms':>11} {'error':>7}")
        for name, t, te, p, pe, c in rows:
            band = lp.tp1_throughput_band(fp8, c)
            print(f"{name:<22} {c:>9} {t:>10,.0f} {te:>+7.1%} {band:>5.0%} {p:>11,.0f} {pe:>+7.1%}")
            ok = ok and abs(te) <= band and abs(pe) <= lp.TP1_P99_BAND
        for title, part in (
            (f"up to {lp.MEASURED_CONCURRENCY} in flight", [r for r in rows if r[5] <= lp.MEASURED_CONCURRENCY]),
            (f"above {lp.MEASURED_CONCURRENCY}", [r for r in rows if r[5] > lp.MEASURED_CONCURRENCY]),
        ):
            if part:
                band = lp.tp1_throughput_band(fp8, part[0][5])
                worst_t, worst_p = max(abs(r[2]) for r in part), max(abs(r[4]) for r in part)
                print(
                    f"{label}, {title}, largest: throughput {worst_t:.1%} (band {band:.1%}), P99 {worst_p:.1%} (band {lp.TP1_P99_BAND:.0%})"
                )
        print()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
