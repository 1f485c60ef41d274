"""Predict-first (core/predict_first.py): which tiers are measured, which predicted, the fallback, decision.basis.

The prediction is handed in as an observation (what the simulator adapter computes); these
tests build it by hand so each case puts a comparison exactly where it wants it.
"""

from __future__ import annotations

from dataclasses import replace

from ladder_driver import Driver, make_spec, summary

from kneepoint.core.actions import ConfirmLoad, EnsureEngine, EnsureLoadTest
from kneepoint.core.decision import decide
from kneepoint.core.needs import needs
from kneepoint.core.observations import EngineState, LoadTestState, Observations
from kneepoint.core.prediction import LadderPrediction, TierForecast
from kneepoint.core.tiers import Tier

# Shaped like the adapter's (simulator/ladder_prediction.py), narrower P99 so that each case puts one rule near.
BANDS = {"throughput_band": 0.03, "p99_band": 0.10, "comm_band": 0.16, "memory_band": 0.10}
TP_BANDS = {"throughput_band": 0.163, "p99_band": 0.233, "scaling_band": 0.133, "comm_band": 0.16, "memory_band": 0.10}
# No memory stop at TP1 (its needed share is far above 0.05), so the step rules decide.
STEP_RULES = {"memoryHeadroom": 0.05, "minThroughputGain": 0.20, "maxP99Degradation": 0.10, "maxCommFraction": 0.40}


def forecast(tp, tok_s, p99, comm=None, kv=0.05, seconds=80.0, **over):
    bands = BANDS if tp == 1 else TP_BANDS
    return TierForecast(Tier(tp), tok_s, p99, comm, kv, seconds, **{**bands, **over})


def ladder(*tiers):
    return LadderPrediction(tuple(tiers), "test bands")


def plan(driver, prediction):
    """The planning pass with the prediction as its observation (needs() asks for it)."""
    assert needs(driver.spec, driver.status).prediction is not None
    driver.step(prediction=prediction)
    return {t.name[:3].upper(): t.phase for t in driver.status.tiers}


# A knee at TP2: TP1 -> TP2 gains 60 % (far from 20 %), TP2 -> TP4 gains 5 % (far under).
KNEE_AT_TP2 = ladder(forecast(1, 1000, 3000), forecast(2, 1600, 2000, 0.15), forecast(4, 1680, 1900, 0.25), forecast(8, 1700, 1900, 0.5))


def test_memory_headroom_predicted_measures_only_tp1():
    d = Driver(make_spec())
    phases = plan(d, KNEE_AT_TP2)
    assert phases == {"TP1": "Pending", "TP2": "Predicted", "TP4": "Predicted", "TP8": "Predicted"}
    assert d.status.prediction.predicted_tier == "TP1" and d.status.prediction.predicted_rule == "memory-headroom"
    assert "cannot change the predicted decision TP1" in d.tier("tp2-pp1").reason
    d.measure("tp1-pp1", 1010, 2950)
    assert d.status.phase == "Decided" and d.status.decided_tier == "TP1"
    basis = d.status.decision.basis
    assert basis.measured == ("TP1 memory",) and basis.measured_tiers == ("TP1",)
    assert basis.predicted_tiers == ("TP2", "TP4", "TP8")
    # The predicted tiers stay Predicted with their figures in tier.prediction, never deployed.
    assert d.tier("tp4-pp1").phase == "Predicted" and d.tier("tp4-pp1").prediction.output_tokens_per_second == 1680


def test_winner_and_the_tier_that_proves_the_stop_are_measured_a_sure_lower_step_is_predicted():
    d = Driver(make_spec(stopRules=STEP_RULES))
    phases = plan(d, KNEE_AT_TP2)
    assert phases == {"TP1": "Predicted", "TP2": "Pending", "TP4": "Pending", "TP8": "Predicted"}
    assert d.tier("tp2-pp1").reason == "to measure: the predicted winner (throughput-gain)"
    assert d.tier("tp4-pp1").reason.startswith("to measure: proves the stop at TP2")
    d.measure("tp2-pp1", 1580, 2020, comm=0.16)
    d.measure("tp4-pp1", 1650, 1910, comm=0.26)
    assert d.status.decided_tier == "TP2" and d.status.decision.rule == "throughput-gain"
    basis = d.status.decision.basis
    assert basis.measured == ("TP2 -> TP4",)
    assert len(basis.predicted) == 2
    assert basis.predicted[0].startswith("TP1 memory (predicted: ") and basis.predicted[0].endswith("GiB needed ±10%)")
    assert basis.predicted[1] == "TP1 -> TP2 (predicted: TP1 predicted 1000 tok/s ±3%)"
    assert basis.predicted_tiers == ("TP1", "TP8") and basis.measured_tiers == ("TP2", "TP4")
    assert d.status.prediction.fallback is None


def test_a_lower_step_within_the_band_of_its_threshold_is_measured():
    # TP1 -> TP2 gains 24 %: within the band of minThroughputGain 0.20, so both sides are measured.
    near = ladder(forecast(1, 1000, 3000), forecast(2, 1240, 2400, 0.15), forecast(4, 1280, 2300, 0.25), forecast(8, 1300, 2300, 0.5))
    d = Driver(make_spec(stopRules=STEP_RULES))
    phases = plan(d, near)
    assert phases == {"TP1": "Pending", "TP2": "Pending", "TP4": "Pending", "TP8": "Predicted"}
    assert "TP1 -> TP2 is within the prediction's band of throughput-gain" in d.tier("tp1-pp1").reason


def test_a_measurement_outside_its_band_falls_back_to_every_tier():
    d = Driver(make_spec(stopRules=STEP_RULES))
    plan(d, KNEE_AT_TP2)
    # TP2 measures 40 % under its prediction (band 16.3 %): every predicted tier is measured after all.
    r = d.measure("tp2-pp1", 960, 2900, comm=0.16)
    assert d.tier("tp1-pp1").phase == "Pending" and d.tier("tp8-pp1").phase == "Pending"
    assert d.tier("tp1-pp1").reason == "to measure: fallback to the full ladder"
    assert "TP2 measured outside its predicted band (outputTokensPerSecond 960" in d.status.prediction.fallback
    assert d.tier("tp2-pp1").prediction.outside_band.startswith("outputTokensPerSecond 960")
    assert any(e.reason == "PredictionMissed" and e.type == "Warning" for e in r.events)
    # The full ladder from there: TP1 is next; measured, TP1 -> TP2 gains nothing and the ladder stops.
    d.measure("tp1-pp1", 1000, 3000)
    assert d.status.decided_tier == "TP1" and d.status.decision.rule == "throughput-gain"
    assert d.tier("tp8-pp1").phase == "Skipped"
    assert d.status.decision.basis.measured == ("TP1 memory", "TP1 -> TP2") and d.status.decision.basis.predicted_tiers == ()


def test_a_measurement_that_moves_the_decision_measures_the_new_neighbours():
    d = Driver(make_spec(stopRules=STEP_RULES))
    plan(d, KNEE_AT_TP2)
    d.measure("tp2-pp1", 1600, 2000, comm=0.15)
    # TP4 gains 15 % more than predicted (within its band) and so no longer stops the ladder at TP2: TP8 is needed.
    d.measure("tp4-pp1", 1930, 1800, comm=0.25)
    assert d.tier("tp8-pp1").phase == "Pending" and d.status.phase == "Profiling"
    assert d.tier("tp8-pp1").reason.startswith("to measure:")


def test_a_tier_predicted_to_time_out_is_not_deployed_and_one_that_cannot_start_is():
    spec = make_spec(stopRules=STEP_RULES, budget={"loadTestTimeoutSeconds": 600})
    prediction = ladder(
        TierForecast(Tier(1), start_failure="ValueError: No available memory for the cache blocks", **BANDS),
        forecast(2, 500, 9000, 0.1, seconds=5000),
        forecast(4, 1600, 2000, 0.2),
        forecast(8, 1700, 1900, 0.3),
    )
    d = Driver(spec)
    phases = plan(d, prediction)
    # Measured all the same: it fails at start, cheaply, and vLLM's own check is what decides fit.
    assert phases["TP1"] == "Pending" and d.tier("tp1-pp1").prediction.start_failure.startswith("ValueError")
    assert d.tier("tp1-pp1").reason.startswith("to measure: the simulated engine does not start")
    assert phases["TP2"] == "Predicted"
    assert d.tier("tp2-pp1").reason.startswith("predicted, not measured: predicted to fail: its load test would take 5000 s")


def test_predict_first_false_ignores_a_prediction():
    d = Driver(make_spec(plan={"predictFirst": False}))
    assert needs(d.spec, d.status).prediction is None
    d.step(prediction=KNEE_AT_TP2)
    assert all(t.phase == "Pending" and t.prediction is None for t in d.status.tiers)
    assert d.status.prediction is None


def test_decide_keeps_predicted_tiers_predicted():
    d = Driver(make_spec(stopRules=STEP_RULES))
    plan(d, KNEE_AT_TP2)
    outcome = decide(d.spec, d.status.tiers)
    assert outcome.state == "continue"  # TP2 and TP4 are still to be measured
    assert [t.phase for t in outcome.tiers] == ["Predicted", "Pending", "Pending", "Predicted"]


def test_the_plan_without_a_prediction_is_the_full_ladder():
    d = Driver(make_spec())
    d.run_pass(Observations(now=d.now, generation=1, fleet=d.fleet, architecture=d.arch, gpu=d.gpu))
    assert all(t.phase == "Pending" for t in d.status.tiers) and d.status.prediction is None
    assert replace(d.spec.plan).predict_first is True


def test_a_stop_rule_change_that_needs_a_predicted_tier_reopens_the_ladder():
    d = Driver(make_spec(stopRules=STEP_RULES))
    plan(d, KNEE_AT_TP2)
    d.measure("tp2-pp1", 1580, 2020, comm=0.16)
    d.measure("tp4-pp1", 1650, 1910, comm=0.26)
    assert d.status.decided_tier == "TP2" and d.tier("tp1-pp1").phase == "Predicted"
    # minThroughputGain 0.6: TP1 -> TP2 (predicted TP1 against measured TP2: +58 %) is now within the band.
    d.spec = make_spec(stopRules={**STEP_RULES, "minThroughputGain": 0.6})
    r = d.step(generation=2)
    assert d.status.phase == "Profiling" and d.status.decision is None
    assert d.tier("tp1-pp1").phase == "Pending" and d.tier("tp1-pp1").reason.startswith("to measure after a stop-rule change")
    assert any(e.reason == "PredictionMade" for e in r.events)
    d.measure("tp1-pp1", 1000, 3000)
    assert d.status.phase == "Decided" and d.status.decided_tier == "TP1"  # +58 % < 0.6 now stops at TP1
    assert d.status.decision.basis.predicted == ()


# -- Confirming with one repeat (plan.stopRepeatsWhenConfirmed)

# TP1 -> TP2 gains 60 % and TP2 -> TP4 under 1 %, both sure within the bands (narrow TP bands, P99 flat, comm far
# from 0.40): TP2 wins, TP4 proves the stop, and neither comparison needs more precision than one repeat gives.
NARROW = {"throughput_band": 0.08, "p99_band": 0.02, "scaling_band": 0.05}
SURE_KNEE_AT_TP2 = ladder(
    forecast(1, 1000, 3000),
    forecast(2, 1600, 2000, 0.15, **NARROW),
    forecast(4, 1610, 2000, 0.15, **NARROW),
    forecast(8, 1620, 2000, 0.2, **NARROW),
)


def _load_test_action(d, name):
    """Step the current tier (``name``) from Pending to its load test; the EnsureLoadTest the pass asked for."""
    r = d.step()
    assert any(isinstance(a, EnsureEngine) and a.tier.name == name for a in r.actions), r.actions
    d.now += 30
    r = d.step(engine=EngineState(exists=True, ready=True, node_name="h200-0"))
    return next(a for a in r.actions if isinstance(a, EnsureLoadTest))


def test_a_tier_measured_only_to_confirm_stops_repeating_once_a_repeat_confirms_it():
    d = Driver(make_spec(stopRules=STEP_RULES))
    assert plan(d, SURE_KNEE_AT_TP2) == {"TP1": "Predicted", "TP2": "Pending", "TP4": "Pending", "TP8": "Predicted"}
    assert d.tier("tp2-pp1").prediction.confirm_only is True and d.tier("tp4-pp1").prediction.confirm_only is True
    assert d.tier("tp1-pp1").prediction.confirm_only is None
    action = _load_test_action(d, "tp2-pp1")
    # The Job gets the predicted figures with their bands (kneepoint loadgen --expect).
    assert action.confirm == ConfirmLoad(1600, 0.08, 2000, 0.02)
    assert action.confirm.figures() == (("outputTokensPerSecond", 1600, 0.08), ("latencyP99Ms", 2000, 0.02))


def test_a_tier_whose_comparison_is_within_the_bands_runs_every_repeat():
    # KNEE_AT_TP2's bands put TP2 -> TP4 (the deciding comparison) within reach of minThroughputGain: its measured
    # figures decide it, so both tiers run load.repeats.
    d = Driver(make_spec(stopRules=STEP_RULES))
    plan(d, KNEE_AT_TP2)
    assert d.tier("tp2-pp1").prediction.confirm_only is None and d.tier("tp4-pp1").prediction.confirm_only is None
    assert _load_test_action(d, "tp2-pp1").confirm is None


def test_the_winner_alone_is_confirmed_with_one_repeat_and_its_repeats_are_recorded():
    d = Driver(make_spec())
    plan(d, KNEE_AT_TP2)
    assert d.tier("tp1-pp1").prediction.confirm_only is True
    assert _load_test_action(d, "tp1-pp1").confirm == ConfirmLoad(1000, 0.03, 3000, 0.10)
    d.now += 70
    ran = dict(summary(1010, 2950, started=d.now - 65, finished=d.now - 5), repeats=1)
    d.step(engine=EngineState(exists=True, ready=True), load_test=LoadTestState(1, True, True, False, ran))
    assert d.tier("tp1-pp1").repeats_measured == 1


def test_stop_repeats_when_confirmed_false_runs_every_repeat():
    d = Driver(make_spec(plan={"stopRepeatsWhenConfirmed": False}))
    plan(d, KNEE_AT_TP2)
    assert d.tier("tp1-pp1").prediction.confirm_only is True  # what it is measured for is still said
    assert _load_test_action(d, "tp1-pp1").confirm is None


def test_one_repeat_is_not_asked_for_when_load_repeats_is_one_already():
    d = Driver(make_spec(load={"repeats": 1}))
    plan(d, KNEE_AT_TP2)
    assert _load_test_action(d, "tp1-pp1").confirm is None


def test_after_a_fallback_every_tier_left_runs_every_repeat():
    d = Driver(make_spec(stopRules=STEP_RULES))
    plan(d, SURE_KNEE_AT_TP2)
    d.measure("tp2-pp1", 960, 2900, comm=0.16)  # 40 % under its prediction: the full ladder from here
    assert d.status.prediction.fallback is not None
    pending = [t for t in d.status.tiers if t.phase == "Pending"]
    assert pending and all(t.prediction is None or not t.prediction.confirm_only for t in pending)
    assert _load_test_action(d, "tp1-pp1").confirm is None


def test_a_measurement_that_puts_a_confirmed_tiers_comparison_within_the_bands_makes_it_run_every_repeat():
    # At the plan TP2 -> TP4 compares two predicted tiers (the scaling bands alone: sure). TP4's own throughput band is
    # wide, so once TP2 is measured 6 % under its prediction (within its 8 %) the comparison reads TP4's whole band
    # and its gain could reach minThroughputGain: TP4 now settles it and runs every repeat.
    wide_tp4 = ladder(
        forecast(1, 1000, 3000),
        forecast(2, 1600, 2000, 0.15, **NARROW),
        forecast(4, 1610, 2000, 0.15, **{**NARROW, "throughput_band": 0.25}),
        forecast(8, 1620, 2000, 0.2, **NARROW),
    )
    d = Driver(make_spec(stopRules=STEP_RULES))
    plan(d, wide_tp4)
    assert d.tier("tp4-pp1").prediction.confirm_only is True
    d.measure("tp2-pp1", 1500, 2000, comm=0.15)
    assert d.status.prediction.fallback is None
    tp4 = d.tier("tp4-pp1")
    assert tp4.phase == "Pending" and tp4.prediction.confirm_only is None
    assert tp4.reason == "to measure: proves the stop at TP2 (throughput-gain)"  # still why it is measured
    assert _load_test_action(d, "tp4-pp1").confirm is None
