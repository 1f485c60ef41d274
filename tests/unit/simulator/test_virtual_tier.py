"""The virtual tier: the simulator's engine under the load generator's workload on simulated time."""

from __future__ import annotations

import pytest

from kneepoint.loadgen.adaptive import AdaptivePlan, min_samples_for_quantile
from kneepoint.loadgen.expectation import ExpectedFigure
from kneepoint.simulator.intake import Intake
from kneepoint.simulator.perf_model import prefill_work
from kneepoint.simulator.virtual_tier import Workload, run_load_test, start_engine

CONTRACT_A_KEYS = {
    "v",
    "ok",
    "outputTokensPerSecond",
    "totalTokensPerSecond",
    "requestsPerSecond",
    "ttftP50Ms",
    "ttftP90Ms",
    "ttftP95Ms",
    "ttftP99Ms",
    "ttftMeanMs",
    "tpotMeanMs",
    "tpotP99Ms",
    "itlP99Ms",
    "latencyP50Ms",
    "latencyP90Ms",
    "latencyP95Ms",
    "latencyP99Ms",
    "latencyMeanMs",
    "completed",
    "failed",
    "errorFraction",
    "errors",
    "inputTokensAsked",
    "inputTokensServed",
    "outputTokensAsked",
    "outputTokensServed",
    "concurrency",
    "repeats",
    "keptRepeat",
    "repeatOutputTokensPerSecond",
    "clientLimited",
    "clientCpuPeak",
    "loopLagP99Ms",
    "startedAt",
    "finishedAt",
    "durationSeconds",
}


def engine(tp: int = 1, seed: int = 1, model: str = "meta-llama/Llama-3.2-1B-Instruct", noise: float = 0.02, **extra: str):
    args = [
        "--model",
        model,
        "--tensor-parallel-size",
        str(tp),
        "--max-num-seqs",
        "16",
        "--max-model-len",
        "2048",
        "--gpu",
        "NVIDIA-H200",
        "--noise",
        str(noise),
        "--seed",
        str(seed),
        "--dcgm-port",
        "0",
    ]
    for flag, value in extra.items():
        args += [f"--{flag.replace('_', '-')}", value]
    return start_engine(args)


SMALL = Workload(concurrency=8, num_requests=40, input_len=64, output_len=16, warmup_requests=8, repeats=2)


def test_engine_that_does_not_fit_refuses_like_vllm():
    start = engine(model="meta-llama/Llama-3.3-70B-Instruct")
    assert not start.ok and start.exit_code == 1 and start.out_of_memory
    assert "No available memory for the cache blocks" in start.message or "CUDA out of memory" in start.message


def test_bad_simulator_flag_is_a_value_error():
    with pytest.raises(ValueError, match="--interconnect"):
        engine(interconnect="infiniband")


def test_load_test_gives_the_load_generators_summary():
    start = engine()
    m = run_load_test(start.settings, SMALL)
    s = m.summary
    assert set(s) >= CONTRACT_A_KEYS
    assert s["ok"] and s["completed"] == 40 and s["failed"] == 0 and s["repeats"] == 2
    assert s["inputTokensServed"] == 65  # 64 words + BOS, as the simulator counts completions prompts
    assert s["outputTokensServed"] == 16
    assert 0 < s["ttftP50Ms"] <= s["latencyP50Ms"] <= s["latencyP99Ms"]
    assert m.requests_sent == 8 + 2 * 40
    assert 0 < m.kept_started < m.kept_finished <= m.seconds
    assert 0 < m.peak_kv_cache_usage <= 1 and m.comm_fraction == 0.0 and 0 < m.gpu_utilization <= 1
    assert s["startedAt"].startswith("1970-01-01T00:00:") and m.summary_at(1_800_000_000.0)["startedAt"].startswith("2027-")


def test_same_seed_same_numbers_other_seed_other_noise():
    a = run_load_test(engine(seed=3).settings, SMALL).summary
    b = run_load_test(engine(seed=3).settings, SMALL).summary
    c = run_load_test(engine(seed=4).settings, SMALL).summary
    assert a == b
    assert a["outputTokensPerSecond"] != c["outputTokensPerSecond"]
    assert c["outputTokensPerSecond"] == pytest.approx(a["outputTokensPerSecond"], rel=0.05)


def test_more_gpus_at_tp2_reports_collective_share():
    m = run_load_test(engine(tp=2).settings, SMALL)
    assert 0 < m.comm_fraction < 1


def test_prompt_beyond_the_context_fails_each_request_with_400():
    w = Workload(concurrency=4, num_requests=10, input_len=4000, output_len=16)
    s = run_load_test(engine().settings, w).summary
    assert s["completed"] == 0 and s["failed"] == 10 and s["errors"] == {"http_4xx": 10} and not s["ok"]


# spec.load.adaptive's defaults: what a user gets with adaptive: {enabled: true}.
PLAN = AdaptivePlan()
LONG = Workload(concurrency=16, num_requests=1000, input_len=64, output_len=16, warmup_requests=16, repeats=2)


def test_adaptive_plan_stops_each_repeat_as_the_loadgen_job_does():
    # kneepoint loadgen --adaptive: a rule per repeat of num_requests, checked every cycle of 16 completions
    # from the P99 interval's 368 on; the requests in flight at the stop finish and count.
    m = run_load_test(engine().settings, LONG, PLAN)
    assert m.adaptive is not None and len(m.adaptive) == 2
    for repeat in m.adaptive:
        assert repeat["stoppedEarly"] is True, repeat["reason"]
        assert repeat["requestsPlanned"] == 1000
        stop = repeat["completedAtStop"]
        assert stop % 16 == 0 and stop >= min_samples_for_quantile(0.99, PLAN.confidence)
        assert stop <= repeat["requestsSent"] < stop + 16 and repeat["requestsSent"] < 1000
        assert abs(repeat["latencyP99FromPlan"]) <= PLAN.relative_precision
    s = m.summary
    assert s["repeats"] == 2 and m.requests_sent == 16 + sum(r["requestsSent"] for r in m.adaptive)
    kept = m.adaptive[s["keptRepeat"]]  # 0-based, as the summary counts it
    assert s["adaptive"] == kept and s["completed"] == kept["requestsSent"]


def test_adaptive_plan_never_sends_more_than_the_fixed_plan_and_changes_nothing_when_it_cannot_stop():
    # 300 requests cannot give a 95 % P99 interval (368 samples): every repeat runs its whole plan, as without the rule.
    w = Workload(concurrency=16, num_requests=300, input_len=64, output_len=16, warmup_requests=16, repeats=2)
    fixed = run_load_test(engine().settings, w)
    adaptive = run_load_test(engine().settings, w, PLAN)
    assert fixed.adaptive is None and "adaptive" not in fixed.summary
    assert adaptive.adaptive is not None and [r["requestsSent"] for r in adaptive.adaptive] == [300, 300]
    assert not any(r["stoppedEarly"] for r in adaptive.adaptive)
    assert all(r["reason"].startswith("ran the whole plan") for r in adaptive.adaptive)
    assert adaptive.requests_sent == fixed.requests_sent == 16 + 2 * 300
    assert {k: v for k, v in adaptive.summary.items() if k != "adaptive"} == fixed.summary


def test_adaptive_stop_is_deterministic_for_a_seed_and_shorter_than_the_fixed_plan():
    a = run_load_test(engine(seed=5).settings, LONG, PLAN)
    b = run_load_test(engine(seed=5).settings, LONG, PLAN)
    assert a.summary == b.summary and a.adaptive == b.adaptive and a.seconds == b.seconds
    fixed = run_load_test(engine(seed=5).settings, LONG)
    assert a.requests_sent < fixed.requests_sent and a.seconds < fixed.seconds
    assert a.summary["outputTokensPerSecond"] == pytest.approx(fixed.summary["outputTokensPerSecond"], rel=PLAN.relative_precision)
    assert a.summary["latencyP99Ms"] == pytest.approx(fixed.summary["latencyP99Ms"], rel=PLAN.relative_precision)


def test_a_request_reaches_the_engine_through_the_api_servers_intake():
    # As over HTTP (engine.Engine): a lone request's first token comes after its intake and its prefill
    # step; a burst's requests share the API server's gate, so eight sent together wait longer than a lone one.
    settings = engine(noise=0.0).settings
    prompt = 1025  # 1,024 words + BOS
    intake = Intake.of(settings.perf.calibration.serving)
    lone = run_load_test(settings, Workload(concurrency=1, num_requests=4, input_len=1024, output_len=4)).summary
    prefill_ms = settings.perf.step_time(prefill_work(prompt)).seconds * 1e3
    assert lone["ttftP50Ms"] == pytest.approx(intake.lone_seconds(prompt) * 1e3 + prefill_ms, rel=0.02)
    burst = run_load_test(settings, Workload(concurrency=8, num_requests=8, input_len=1024, output_len=4)).summary
    assert burst["ttftP50Ms"] >= lone["ttftP50Ms"] + 7 * intake.gate_us_per_request * 1e-3


def test_expected_figures_stop_the_repeats_as_the_loadgen_job_does():
    start = engine()
    full = run_load_test(start.settings, SMALL)
    tok_s, p99 = full.summary["outputTokensPerSecond"], full.summary["latencyP99Ms"]
    confirmed = run_load_test(
        start.settings, SMALL, expect=[ExpectedFigure("outputTokensPerSecond", tok_s, 0.05), ExpectedFigure("latencyP99Ms", p99, 0.2)]
    )
    s = confirmed.summary
    assert s["repeats"] == 1 and s["expectation"] == {
        "confirmedAfterRepeat": 1,
        "repeatsPlanned": 2,
        "keys": ["outputTokensPerSecond", "latencyP99Ms"],
    }
    assert confirmed.requests_sent == 8 + 40 and confirmed.seconds < full.seconds
    # Off by more than its band: the second repeat runs, as without --expect.
    missed = run_load_test(start.settings, SMALL, expect=[ExpectedFigure("outputTokensPerSecond", tok_s * 2, 0.05)])
    assert missed.summary["repeats"] == 2 and missed.summary["expectation"]["confirmedAfterRepeat"] is None
    assert missed.requests_sent == full.requests_sent
