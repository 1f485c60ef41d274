"""benchmarks/sim_vs_real_vllm.py's floor: how many figures any simulator misses, because real vLLM's own captures of
one workload lie further apart than the tolerance allows on both sides of one value."""

from __future__ import annotations

import pytest
from benchmark_scripts import load_benchmark
from hypothesis import given
from hypothesis import strategies as st


@pytest.fixture(scope="module")
def svr():
    return load_benchmark("sim_vs_real_vllm")


def _misses(svr, sim: float, values: list[float], tolerance: float) -> int:
    return sum(not svr.holds(sim, r, tolerance) for r in values)


reals = st.lists(st.floats(min_value=0.5, max_value=5000.0, allow_nan=False), min_size=1, max_size=8)
tolerances = st.sampled_from([0.05, 0.10, 0.25])


@given(values=reals, tolerance=tolerances, at=st.floats(min_value=0.1, max_value=10000.0, allow_nan=False))
def test_no_value_misses_fewer_than_the_floor(svr, values, tolerance, at) -> None:
    assert _misses(svr, at, values, tolerance) >= svr.fewest_misses(values, tolerance)


@given(values=reals, tolerance=tolerances)
def test_the_floor_is_met_by_some_value(svr, values, tolerance) -> None:
    # Every end of every interval a value holds a real in, and the points between them: the floor is the least of
    # these, reached by one of them.
    ends = sorted({e for r in values for e in ((1 - tolerance) * r, (1 + tolerance) * r)})
    tried = ends + [(a + b) / 2 for a, b in zip(ends, ends[1:], strict=False)]
    assert min(_misses(svr, v, values, tolerance) for v in tried) == svr.fewest_misses(values, tolerance)


def test_takes_within_the_tolerance_of_one_value_leave_no_floor(svr) -> None:
    # 17.0 holds both 16.0 and 18.2 within 10 %.
    assert svr.fewest_misses([16.0, 18.2], 0.10) == 0
    assert svr.fewest_misses([], 0.10) == 0


def _workload(svr, key: str) -> dict[str, dict]:
    caps = svr.captures(None, tuple(svr.MODELS))
    return {name: cap for name, cap in caps.items() if svr.workload_key(cap) == key}


def test_the_1bs_lone_128_token_prompts_decode_too_far_apart_for_one_value(svr) -> None:
    # Nine takes of one load on runs 6, 13 and 15's hosts: TPOT 1.51-2.16 ms. A value within 10 % of 1.51 is at most
    # 1.66, which is more than 10 % under 1.95, 2.09 and 2.16: whatever the simulator gives, 3 miss.
    caps = _workload(svr, "1b-tp1 completions c1 128/512")
    tpots = sorted(float(cap["summary"]["tpotMeanMs"]) for cap in caps.values())
    assert len(tpots) == 9
    assert tpots[0] == pytest.approx(1.51, abs=0.01) and tpots[-1] == pytest.approx(2.16, abs=0.01)
    assert svr.fewest_misses(tpots, 0.10) == 3


def test_the_8bs_bistable_c128_waves_put_half_their_ttft_medians_out_of_reach(svr) -> None:
    # Six takes of the 8B's c128 1,024/256 load: TTFT P50 762-797 ms in two, 1,213-1,256 in three, 1,680 in one.
    caps = _workload(svr, "8b-tp1 completions c128 1024/256")
    assert len(caps) == 6
    assert svr.fewest_misses([float(cap["summary"]["ttftP50Ms"]) for cap in caps.values()], 0.10) == 3
    # With the E2E P99 of 6,015 ms (the take whose waves stayed together) against 7,048-8,292 in the rest, 4 of the 36.
    assert svr.unavoidable_misses(caps, 0.10) == {"8b-tp1": (36, 4)}
    assert "at least 4 of the 36 figures miss 10% whatever the simulator gives" in svr.floor_line(caps, 0.10)


def test_run_29_repeats_run_28s_decode_figures_closely_and_its_first_tokens_loosely(svr) -> None:
    # The same 15 short-prompt loads on an H100 twice (tests/data/vllm/README.md, runs 28 and 29): throughput, TPOT and
    # E2E repeat within 7 %, the waves' TTFT by up to 30 % (the 8B fp8's c40 TTFT P50: 88 and 114 ms).
    caps = svr.captures(None, ("8b-h100-tp1", "8b-fp8-h100-tp1"))
    pairs = [(caps[name], caps[name.replace("-r28-", "-r29-")]) for name in caps if "-r28-" in name]
    assert len(pairs) == 15
    worst = {key: max(abs(b["summary"][key] / a["summary"][key] - 1) for a, b in pairs) for _, key in svr.FIGURES}
    assert max(worst[k] for k in ("outputTokensPerSecond", "tpotMeanMs", "latencyP50Ms", "latencyP99Ms")) < 0.07
    assert 0.25 < worst["ttftP50Ms"] < 0.35
    # run 24's two loads and run 33's lone one have a take each: no floor of their own. Run 37's measured phases add a
    # third take of the 8B fp8's c24 and c48 loads, whose c24 TTFT P99s (106.9, 96.1, 74.6 ms) no value holds, and the
    # 8B's first 128/256 loads (c24, c48). Run 40's load generator adds a third take of the 128/128 c128 load in each
    # dtype (the 8B's TTFT P50 302, 330 and 346 ms), held by one value; run 41's a fourth of the 8B fp8's (its TTFT P50
    # 238.5 ms beside run 40's 262.8), held by one value too.
    assert svr.unavoidable_misses(caps, 0.10) == {"8b-h100-tp1": (102, 1), "8b-fp8-h100-tp1": (138, 2)}


def test_run_3s_c16_ttft_median_lies_between_two_prefill_steps_of_its_waves(svr) -> None:
    # The 8B's 1,024/256 load at c16: each wave of 16 is prefilled in three steps, the first prompt alone (TTFT about
    # 100 ms), then 7 (about 240 ms), then 8 (about 390 ms). 49 of the 96 requests got their first token in a wave's
    # first two steps, so the median (261 ms) is one request away from the third step's: one request that joined a
    # step later moves it 23.5 %.
    cap = svr.captures({"r3-c16"})["r3-c16"]
    rows = svr.measured_requests(cap)
    assert rows is not None and len(rows) == 96
    ttfts = sorted(r["ttftMs"] for r in rows)
    assert sum(t < 300 for t in ttfts) == 49 and all(not 300 <= t < 350 for t in ttfts)
    assert svr.percentile_sorted(ttfts, 50.0) == pytest.approx(cap["summary"]["ttftP50Ms"], abs=0.001)
    assert svr.one_request_swing(cap, "ttftP50Ms") == pytest.approx(0.235, abs=0.005)
    # The throughput is not a percentile; E2E P50 moves by one decode step, not a prefill step.
    assert svr.one_request_swing(cap, "outputTokensPerSecond") is None
    assert svr.one_request_swing(cap, "latencyP50Ms") < 0.02


def test_the_70b_fp8s_c16_ttft_medians_move_a_quarter_with_one_request(svr) -> None:
    # Four takes of the 70B fp8's 1,024/256 c16 load on runs 5, 6 and 10 (TTFT P50 1,591-1,659 ms, the shipped
    # simulator 1,172 ms: -26 to -29 %, beyond real vLLM's spread): in every take one request moves the median by
    # 25-27 %, a whole prefill step of its waves.
    caps = _workload(svr, "70b-fp8-tp1 completions c16 1024/256")
    assert len(caps) == 4
    swings = sorted(svr.one_request_swing(cap, "ttftP50Ms") for cap in caps.values())
    assert swings[0] > 0.25 and swings[-1] < 0.28
    # A capture that kept no requests has no sample to tell.
    assert svr.one_request_swing({**next(iter(caps.values())), "path": "/nonexistent/x.json"}, "ttftP50Ms") is None
    assert svr.one_request_swing({"summary": {"ttftP50Ms": 1.0}}, "ttftP50Ms") is None


def test_the_swings_line_counts_the_misses_one_request_decides(svr) -> None:
    caps = svr.captures({"r3-c16", "70b-fp8-c16"}, ("8b-tp1", "70b-fp8-tp1"))
    missed = [(caps["r3-c16"], "ttftP50Ms"), (caps["70b-fp8-c16"], "ttftP50Ms"), (caps["r3-c16"], "tpotMeanMs")]
    assert svr.swings_line(missed, 0.10).startswith("2 of the 3 misses are percentiles that one request")
