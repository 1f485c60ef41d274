"""The decision-cost benchmark in its reduced CI form: a few scenarios, 2 seeds.

Prints the per-scenario table (decisions, GPU-minutes, wall time of the ladder and the
exhaustive sweep); fails only when the ladder decides another tier than the sweep. The
full benchmark and its figures: benchmarks/decision_cost.py, docs/performance.md.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = (("8b", "h200", "chat"), ("8b", "l40s", "highconc"), ("70b", "h200", "chat"), ("70b", "l40s", "chat"))
SEEDS = (1, 2)


def _benchmark():
    spec = importlib.util.spec_from_file_location("decision_cost", ROOT / "benchmarks" / "decision_cost.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["decision_cost"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def results():
    dc = _benchmark()
    measurements = dc.Measurements(dc.AdaptiveStop())
    load_model = dc.LoadModel()
    ladder = tuple(v for v in dc.VARIANTS if v.name == "ladder")
    out = []
    for model, fleet, workload in SCENARIOS:
        scenario = dc.Scenario(dc.MODELS[model], dc.FLEETS[fleet], dc.WORKLOADS[workload])
        for seed in SEEDS:
            out.append(dc.run_scenario_seed(scenario, seed, measurements, load_model, variants=ladder))
    return dc, out


def test_ladder_decides_as_the_exhaustive_sweep(results, capsys):
    dc, runs = results
    with capsys.disabled():
        print()
        print(f"decision cost, reduced ({len(SCENARIOS)} scenarios x {len(SEEDS)} seeds; full run: benchmarks/decision_cost.py)")
        print(dc.scenario_table(runs))
        total_ref = sum(r.reference.gpu_minutes for r in runs)
        total_ladder = sum(r.variants["ladder"].gpu_minutes for r in runs)
        print(f"ladder GPU-minutes {total_ladder:.0f} of the sweep's {total_ref:.0f} ({total_ladder / total_ref:.0%})")
    differ = [
        f"{r.scenario.key} seed {r.seed}: ladder {r.variants['ladder'].decision}, sweep {r.reference.decision}"
        for r in runs
        if r.variants["ladder"].decision != r.reference.decision
    ]
    assert not differ, "; ".join(differ)
