"""Predict-first through the reconciler: the plan pass asks for the prediction (needs), the reconciler has the
simulator adapter compute it, and the core leaves Predicted the tiers that cannot change the decision."""

from __future__ import annotations

import asyncio
from typing import Any

from fake_cluster import FakeApi, node

from kneepoint.core.status import ExperimentStatus
from kneepoint.reconciler import Reconciler
from kneepoint.settings import OperatorSettings


def experiment(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "kneepoint.io/v1alpha1",
        "kind": "ParallelismExperiment",
        "metadata": {"name": "x", "namespace": "ns", "uid": "uid-x", "generation": 1},
        "spec": {
            "model": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct", "architecture": {"preset": "llama-3-8b"}},
            "tiers": {"tensorParallel": [1, 2, 4, 8]},
            "load": {"concurrency": 32, "numRequests": 100, "inputLen": 1024, "outputLen": 256},
            "placement": {"gpuProduct": "NVIDIA-H200"},
            **spec,
        },
    }


def plan(body: dict[str, Any]) -> tuple[ExperimentStatus, FakeApi]:
    api = FakeApi([node("h200-0")])
    api.objects["x"] = body
    r = Reconciler(api, api, OperatorSettings(), clock=lambda: 1_800_000_000.0)  # type: ignore[arg-type]
    api.ledger_lock = r.ledger.lock
    asyncio.run(r.reconcile("x", "ns"))
    return ExperimentStatus.from_dict(api.objects["x"].get("status")), api


def test_the_plan_predicts_the_ladder_and_deploys_only_what_can_change_the_decision() -> None:
    status, api = plan(experiment())
    # The 8B model at concurrency 32 holds one H200 with headroom: the simulator predicts TP1 by memory-headroom.
    assert status.prediction is not None and status.prediction.predicted_tier == "TP1"
    assert status.prediction.predicted_rule == "memory-headroom"
    assert [t.phase for t in status.tiers][1:] == ["Predicted", "Predicted", "Predicted"]
    assert "benchmarks/predict_bands.py" in status.prediction.band_source
    tp2 = status.tiers[1].prediction
    assert tp2 is not None and tp2.output_tokens_per_second and tp2.throughput_band > status.tiers[0].prediction.throughput_band
    deployments = [b for b in api.created if b["kind"] == "Deployment"]
    assert len(deployments) == 1 and deployments[0]["metadata"]["name"].endswith("tp1-pp1")


def test_predict_first_false_plans_every_tier() -> None:
    status, _ = plan(experiment(plan={"predictFirst": False}))
    assert status.prediction is None
    assert all(t.prediction is None for t in status.tiers)
    assert "Predicted" not in [t.phase for t in status.tiers]


def test_like_experiments_planned_at_once_share_one_prediction(monkeypatch: Any) -> None:
    # A GitOps apply of many like experiments: each plan pass needs the same prediction; one computes it.
    from kneepoint.simulator import ladder_prediction

    real, calls = ladder_prediction.predict_ladder, []

    def counted(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(ladder_prediction, "predict_ladder", counted)
    monkeypatch.setattr(ladder_prediction, "_cache", type(ladder_prediction._cache)())  # nothing predicted before
    api = FakeApi([node("h200-0"), node("h200-1")])
    names = [f"x{i}" for i in range(5)]
    for n in names:
        body = experiment()
        body["metadata"].update(name=n, uid=f"uid-{n}")
        api.objects[n] = body
    r = Reconciler(api, api, OperatorSettings(), clock=lambda: 1_800_000_000.0)  # type: ignore[arg-type]
    api.ledger_lock = r.ledger.lock

    async def all_at_once() -> None:
        await asyncio.gather(*(r.reconcile(n, "ns") for n in names))

    asyncio.run(all_at_once())
    assert len(calls) == 1
    for n in names:
        status = ExperimentStatus.from_dict(api.objects[n].get("status"))
        assert status.prediction is not None and status.prediction.predicted_tier == "TP1"
    assert not r._predicting  # nothing left in flight


def woken_reconciler(api: FakeApi, on_ready: Any) -> Reconciler:
    """A reconciler as the operator's daemons have it: told how to wake an experiment."""
    r = Reconciler(api, api, OperatorSettings(), clock=lambda: 1_800_000_000.0, on_ready=on_ready)  # type: ignore[arg-type]
    api.ledger_lock = r.ledger.lock
    return r


def test_with_a_daemon_to_wake_the_plan_pass_does_not_wait_for_the_prediction(monkeypatch: Any) -> None:
    # The operator's daemons: a plan pass whose prediction is not made yet ends at once (no status written), the
    # computation's end wakes the experiment, and the next pass plans with it.
    from kneepoint.simulator import ladder_prediction

    monkeypatch.setattr(ladder_prediction, "_cache", type(ladder_prediction._cache)())
    api = FakeApi([node("h200-0")])
    api.objects["x"] = experiment()
    woken: list[tuple[str, str]] = []

    async def run() -> tuple[float | None, float | None]:
        event = asyncio.Event()

        def wake(ns: str, name: str) -> None:
            woken.append((ns, name))
            event.set()

        r = woken_reconciler(api, wake)
        first = await r.reconcile("x", "ns")
        assert "status" not in api.objects["x"] and r._predicting  # nothing written; the prediction is computing
        await asyncio.wait_for(event.wait(), 60)
        second = await r.reconcile("x", "ns")
        return first, second

    first, _ = asyncio.run(run())
    assert first is None and woken == [("ns", "x")]
    status = ExperimentStatus.from_dict(api.objects["x"].get("status"))
    assert status.prediction is not None and status.prediction.predicted_tier == "TP1"
    assert [t.phase for t in status.tiers][1:] == ["Predicted", "Predicted", "Predicted"]


def test_a_failed_prediction_wakes_its_waiters_and_fails_their_next_pass_once(monkeypatch: Any) -> None:
    from kneepoint.simulator import ladder_prediction

    monkeypatch.setattr(ladder_prediction, "_cache", type(ladder_prediction._cache)())
    attempts: list[int] = []

    def broken(*_: Any) -> Any:
        attempts.append(1)
        raise ValueError("the simulator cannot start this engine")

    monkeypatch.setattr(ladder_prediction, "predict_ladder", broken)
    api = FakeApi([node("h200-0")])
    api.objects["x"] = experiment()

    async def run() -> None:
        event = asyncio.Event()
        r = woken_reconciler(api, lambda ns, name: event.set())
        assert await r.reconcile("x", "ns") is None
        await asyncio.wait_for(event.wait(), 60)
        try:
            await r.reconcile("x", "ns")
        except ValueError as exc:
            assert "cannot start" in str(exc)  # the daemon logs it and backs off, as for any failed pass
        else:
            raise AssertionError("the failed prediction was not raised")
        event.clear()
        assert await r.reconcile("x", "ns") is None  # after the back-off: a new computation
        await asyncio.wait_for(event.wait(), 60)

    asyncio.run(run())
    assert len(attempts) == 2
