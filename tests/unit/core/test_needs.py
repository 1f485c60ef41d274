"""needs(spec, status): what each tier phase's pass reads; one table test per phase.

The reconciler fetches exactly what needs() names (tests/unit/operator/test_reconciler_phase_free.py
checks it knows no tier phase), so each table here is the read side of that phase's
transition in kneepoint.core.ladder.
"""

from dataclasses import replace

import pytest
from ladder_driver import T0, make_spec

from kneepoint.core.ladder import LadderSettings, rfc3339
from kneepoint.core.needs import CapacityNeed, EngineNeed, LoadTestNeed, MetricsNeed, Needs, PredictionNeed, ScrapeCheckNeed, needs
from kneepoint.core.status import ExperimentStatus, TierResult
from kneepoint.core.tiers import Tier

TP1, TP2PP2 = Tier(1, 1), Tier(2, 2)
SETTINGS = LadderSettings(metrics_settle_seconds=10)


def tier(t=TP1, phase="Pending", **over):
    return TierResult(
        tensor_parallel=t.tensor_parallel, pipeline_parallel=t.pipeline_parallel, gpus=t.gpus, name=t.name, phase=phase, **over
    )


def spec(mode="Measure", product="NVIDIA-H200"):
    s = make_spec("llama-3-8b", mode=mode)
    return s if product else replace(s, placement=replace(s.placement, gpu_product=None, node_selector={"zone": "a"}))


def status(*tiers):
    return ExperimentStatus(tiers=tuple(tiers))


def test_needs_planning():
    # (mode, product) -> needs of the pass that plans; predict-first (the default) asks for the simulator's ladder
    ladder = PredictionNeed((Tier(1), Tier(2), Tier(4), Tier(8)))
    table = [
        (
            "Measure",
            "NVIDIA-H200",
            Needs(architecture=True, missing_objects=True, fleet=True, gpu_product="NVIDIA-H200", prediction=ladder),
        ),
        ("Measure", None, Needs(architecture=True, missing_objects=True, fleet=True, prediction=ladder)),
        # Simulate mode: the measurement is the simulator itself, nothing to predict.
        ("Simulate", "NVIDIA-H200", Needs(architecture=True, missing_objects=True, gpu_product="NVIDIA-H200")),
    ]
    for mode, product, expected in table:
        assert needs(spec(mode, product), ExperimentStatus()) == expected, (mode, product)


def test_needs_planning_without_predict_first():
    s = spec()
    s = replace(s, plan=replace(s.plan, predict_first=False))
    assert needs(s, ExperimentStatus()).prediction is None
    # Only the plan asks: once planned, no pass predicts again.
    assert needs(spec(), status(tier())).prediction is None


@pytest.mark.parametrize("phase", ["Pending", "Waiting"])
def test_needs_pending_and_waiting(phase):
    waiting = phase == "Waiting"
    multi = dict(multi_node=True, nodes=2)
    table = [
        (
            "Measure",
            tier(TP1, phase),
            Needs(architecture=True, fleet=True, gpu_product="NVIDIA-H200", capacity=CapacityNeed(TP1, join_queue=waiting)),
        ),
        (
            "Measure",
            tier(TP2PP2, phase, **multi),
            Needs(
                architecture=True,
                fleet=True,
                gpu_product="NVIDIA-H200",
                capacity=CapacityNeed(TP2PP2, join_queue=waiting),
                leader_worker_set_api=True,
            ),
        ),
        # Simulate mode places no engine on GPUs: no fleet, no capacity check, no group.
        ("Simulate", tier(TP2PP2, phase, **multi), Needs(architecture=True, gpu_product="NVIDIA-H200")),
    ]
    for mode, current, expected in table:
        assert needs(spec(mode), status(current)) == expected, (mode, current.name)


def test_needs_deploying():
    table = [
        ("Measure", tier(TP1, "Deploying"), Needs(architecture=True, fleet=True, gpu_product="NVIDIA-H200", engine=EngineNeed(TP1, False))),
        (
            "Measure",
            tier(TP2PP2, "Deploying", multi_node=True, nodes=2),
            Needs(architecture=True, fleet=True, gpu_product="NVIDIA-H200", engine=EngineNeed(TP2PP2, True)),
        ),
        ("Simulate", tier(TP1, "Deploying"), Needs(architecture=True, gpu_product="NVIDIA-H200", engine=EngineNeed(TP1, False))),
    ]
    for mode, current, expected in table:
        assert needs(spec(mode), status(current)) == expected, (mode, current.name)


def test_needs_load_testing():
    started = rfc3339(T0)
    running = tier(TP1, "LoadTesting", attempts=2, load_test_started_at=started)
    measured = replace(tier(Tier(2, 1), "Measured"))
    table = [
        # The first tier's load test also asks whether Prometheus scrapes the engine.
        (
            status(running),
            Needs(
                gpu_product="NVIDIA-H200",
                engine=EngineNeed(TP1, False),
                load_test=LoadTestNeed(TP1, 2),
                scrape_check=ScrapeCheckNeed(TP1, T0),
            ),
        ),
        (status(measured, running), Needs(gpu_product="NVIDIA-H200", engine=EngineNeed(TP1, False), load_test=LoadTestNeed(TP1, 2))),
        (
            status(replace(running, attempts=None, load_test_started_at=None)),
            Needs(gpu_product="NVIDIA-H200", engine=EngineNeed(TP1, False), load_test=LoadTestNeed(TP1, 1)),
        ),
    ]
    for st, expected in table:
        assert needs(spec(), st) == expected, st


def test_needs_collecting():
    window = dict(load_test_started_at=rfc3339(T0), load_test_finished_at=rfc3339(T0 + 60))
    table = [
        (
            tier(TP1, "Collecting", **window),
            Needs(architecture=True, gpu_product="NVIDIA-H200", metrics=MetricsNeed(TP1, T0, T0 + 60, T0 + 70, traced=True)),
        ),
        # A multi-node tier runs no trace sidecar: its trace figures are not required.
        (
            tier(TP2PP2, "Collecting", multi_node=True, nodes=2, **window),
            Needs(architecture=True, gpu_product="NVIDIA-H200", metrics=MetricsNeed(TP2PP2, T0, T0 + 60, T0 + 70, traced=False)),
        ),
        (tier(TP1, "Collecting"), Needs(architecture=True, gpu_product="NVIDIA-H200")),
    ]
    for current, expected in table:
        assert needs(spec(), status(current), SETTINGS) == expected, current


def test_needs_when_the_ladder_is_over():
    table = [
        (status(tier(TP1, "Measured"), tier(Tier(2, 1), "Skipped")), Needs(gpu_product="NVIDIA-H200")),
        (status(tier(TP1, "Failed")), Needs(gpu_product="NVIDIA-H200")),
    ]
    for st, expected in table:
        assert needs(spec(), st) == expected


def test_needs_names_the_product_recorded_at_placement_when_the_spec_names_none():
    placed = tier(TP1, "Collecting", gpu_product="NVIDIA-H100-80GB-HBM3")
    assert needs(spec(product=None), status(placed)).gpu_product == "NVIDIA-H100-80GB-HBM3"
    assert (
        needs(spec(product=None), status(tier(TP1, "Measured", gpu_product="NVIDIA-H200"), tier(Tier(2, 1)))).gpu_product == "NVIDIA-H200"
    )
