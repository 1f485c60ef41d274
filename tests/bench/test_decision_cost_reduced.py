"""The decision-cost benchmark in its reduced CI form: a few scenarios, 2 seeds.

Prints the per-scenario table (decisions, GPU-minutes, wall time of the sweep, the full
ladder and predict-first); fails when the full ladder or predict-first decides another tier
than the sweep, or when the mislabelled-link scenario (engines over PCIe on NVLink-labelled
nodes: the prediction is wrong) does not fall back to the full ladder. The full benchmark
and its figures: benchmarks/decision_cost.py, docs/performance.md.
"""

from __future__ import annotations

import pytest
from benchmark_scripts import load_benchmark

SCENARIOS = (("8b", "h200", "chat"), ("8b", "l40s", "highconc"), ("70b", "h200", "chat"), ("70b", "l40s", "chat"))
SEEDS = (1, 2)
NEAR = ("8b/h200/chat:near-gain", "70b/h200/chat:mislabelled-link")


def _benchmark():
    return load_benchmark("decision_cost")


@pytest.fixture(scope="module")
def results():
    dc = _benchmark()
    measurements = dc.Measurements()
    load_model = dc.LoadModel()
    ladder = tuple(v for v in dc.VARIANTS if v.name in ("ladder", dc.PREDICT_FIRST))
    out = []
    for model, fleet, workload in SCENARIOS:
        scenario = dc.Scenario(dc.MODELS[model], dc.FLEETS[fleet], dc.WORKLOADS[workload])
        for seed in SEEDS:
            out.append(dc.run_scenario_seed(scenario, seed, measurements, load_model, variants=ladder))
    near = [s for s in dc.near_threshold_scenarios(measurements) if s.key in NEAR]
    for scenario in near:
        for seed in SEEDS:
            out.append(dc.run_scenario_seed(scenario, seed, measurements, load_model, variants=ladder))
    return dc, out


def test_ladder_decides_as_the_exhaustive_sweep(results, capsys):
    dc, runs = results
    with capsys.disabled():
        print()
        print(f"decision cost, reduced ({len(SCENARIOS)} scenarios x {len(SEEDS)} seeds; full run: benchmarks/decision_cost.py)")
        print(dc.scenario_table(runs))
        print(dc.agreement_line("ladder vs sweep", runs, "ladder"))
        print(dc.agreement_line("predict first vs sweep", runs, dc.PREDICT_FIRST))
    differ = [
        f"{r.scenario.key} seed {r.seed}: {name} {r.variants[name].decision}, sweep {r.reference.decision}"
        for r in runs
        for name in ("ladder", dc.PREDICT_FIRST)
        if r.variants[name].decision != r.reference.decision
    ]
    assert not differ, "; ".join(differ)


def test_a_wrong_prediction_falls_back_to_the_full_ladder(results):
    _, runs = results
    wrong = [r for r in runs if r.scenario.name == "mislabelled-link"]
    assert wrong and all(r.variants["predict first"].fallback for r in wrong)
    # The near-threshold step is measured on both sides, not predicted.
    near = [r for r in runs if r.scenario.key == "8b/h200/chat:near-gain"]
    for r in near:
        tiers = {t.name: t.phase for t in r.variants["predict first"].status.tiers}
        assert tiers["tp1-pp1"] == tiers["tp2-pp1"] == "Measured", tiers


def test_variant_names_with_a_comma_can_be_chosen() -> None:
    # "ladder, 1 attempt" holds the list's own separator: the longest known name wins at each place.
    dc = _benchmark()
    names = [v.name for v in dc.VARIANTS]
    assert dc.split_variants("all levers,ladder, 1 attempt,ladder, skip KV-short tiers", names) == [
        "all levers",
        "ladder, 1 attempt",
        "ladder, skip KV-short tiers",
    ]
    assert dc.split_variants("ladder,predict first", names) == ["ladder", "predict first"]
    assert dc.split_variants("nonsense,ladder", names) == ["nonsense", "ladder"]
