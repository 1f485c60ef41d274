"""Predict-first's error bands: the in-process prediction (``kneepoint.simulator.ladder_prediction``) against real vLLM.

The prediction runs the simulator's engine under the load generator's workload on a virtual
clock, without noise (``virtual_tier``). This replays every real-vLLM 0.24 capture of the 8B
(bf16 and online fp8) and the 70B fp8 in tests/data/vllm (the profiled ones aside; the same sets
as ``benchmarks/sim_vs_real_vllm.py``) that way, with the operator's engine flags at TP1 and the
capture's own workload, and prints each figure's error. The largest throughput and P99 errors are
the bands the adapter ships (``TP1_THROUGHPUT_BAND``, ``FP8_TP1_THROUGHPUT_BAND`` for fp8 engines,
``TP1_P99_BAND``); exit status 1 when a capture falls outside its band.

    .venv/bin/python benchmarks/predict_bands.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_vs_real_vllm import MODELS, captures, engine_args, example_spec

from kneepoint.simulator import ladder_prediction as lp
from kneepoint.simulator.virtual_tier import Workload, run_load_test, start_engine


def predicted(config: dict, model: str = "8b-tp1") -> dict:
    """One capture's workload on the in-process simulator, as the prediction runs it."""
    preset = example_spec(model).model.architecture.preset
    start = start_engine(engine_args(MODELS[model][2], model) + lp.simulator_flags("NVIDIA-H200", "nvlink", preset))
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


def errors(models: tuple[str, ...] = ("8b-tp1",)) -> list[tuple[str, float, float, float, float]]:
    """(capture, real tok/s, throughput error, real P99 ms, P99 error) per capture of ``models``."""
    out = []
    for name, capture in captures(None, models).items():
        real, sim = capture["summary"], predicted(capture["config"], capture["model"])
        t_err = sim["outputTokensPerSecond"] / real["outputTokensPerSecond"] - 1
        p_err = sim["latencyP99Ms"] / real["latencyP99Ms"] - 1
        out.append((name, real["outputTokensPerSecond"], t_err, real["latencyP99Ms"], p_err))
    return out


def main() -> int:
    ok = True
    # The 1B's captures are left out: CPU-bound on the device's host (docs/simulator.md, "Other model sizes"),
    # such a model stops at TP1 by memory before any throughput comparison.
    for label, models, band in (
        ("bf16", ("8b-tp1", "14b-tp1"), lp.TP1_THROUGHPUT_BAND),
        ("online fp8", ("8b-fp8-tp1", "70b-fp8-tp1"), lp.FP8_TP1_THROUGHPUT_BAND),
    ):
        rows = errors(models)
        print(f"{'capture':<22} {'real tok/s':>10} {'error':>7} {'real P99 ms':>11} {'error':>7}")
        for name, t, te, p, pe in rows:
            print(f"{name:<22} {t:>10,.0f} {te:>+7.1%} {p:>11,.0f} {pe:>+7.1%}")
        worst_t = max(abs(r[2]) for r in rows)
        worst_p = max(abs(r[4]) for r in rows)
        print(f"{label}, largest: throughput {worst_t:.1%} (band {band:.1%}), P99 {worst_p:.1%} (band {lp.TP1_P99_BAND:.0%})\n")
        ok = ok and worst_t <= band and worst_p <= lp.TP1_P99_BAND
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
