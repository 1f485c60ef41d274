"""The API-server intake (simulator/intake.py) against real vLLM 0.24's per-request records (run 3).

In every burst of the c4, c8 and c16 records (the measured phase's first send, and each cohort of
replacements sent as a cohort finishes) real vLLM prefills the first request alone and the next
ones together in the step after: they reached the engine before the first one's prefill ended.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from kneepoint.simulator.calibration import load_calibration
from kneepoint.simulator.calibration_vllm import llama8b_h200_tp1
from kneepoint.simulator.intake import Intake
from kneepoint.simulator.perf_model import prefill_work

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm"
CAL = load_calibration()
MODEL = llama8b_h200_tp1(CAL)
PROMPT = 1025  # the simulator's count of the captures' 1,024 words
TOTAL_US = CAL.serving.api_us_per_prompt_token
SERIAL_US = CAL.serving.api_serial_us_per_prompt_token


def _groups(times: list[float], gap: float) -> list[list[float]]:
    out: list[list[float]] = []
    for t in sorted(times):
        if out and t - out[-1][-1] < gap:
            out[-1].append(t)
        else:
            out.append([t])
    return out


def bursts(load: str) -> list[tuple[list[float], int, int]]:
    """Per burst of the records: (send offsets from its first send in s, requests whose first token
    came in the first step, those in the next step)."""
    with gzip.open(DATA / f"8b-tp1-loadgen-r3-{load}-requests.json.gz") as f:
        records = json.load(f)["requests"]
    out = []
    # A cohort's sends lie within ~20 ms (its requests end within a few decode steps); cohorts are ~1.5 s apart.
    for sends in _groups([r["start"] for r in records], 0.05):
        cohort = [r for r in records if sends[0] <= r["start"] <= sends[-1]]
        first_tokens = _groups([r["start"] + r["ttftMs"] / 1e3 for r in cohort], 0.003)  # one step's tokens arrive together
        out.append(([s - sends[0] for s in sends], len(first_tokens[0]), len(first_tokens[1])))
    return out


def prefill_seconds() -> float:
    work = prefill_work(PROMPT)
    return MODEL.gpu_step_time(work).seconds + MODEL.host_seconds(work)


def largest_serial_share_of(bursts: list[tuple[list[float], int]]) -> float:
    """The largest serial share (µs per prompt token) with which every burst (send offsets, requests
    prefilled in its first two steps) reaches the engine as the records show: those requests before
    the first one's prefill ends (the step after it is planned then, synchronously or not)."""
    low, high = 0.0, TOTAL_US
    for _ in range(40):
        mid = (low + high) / 2
        ok = True
        for sends, together in bursts:
            intake = Intake(TOTAL_US, mid)
            arrivals = [intake.arrival(s, PROMPT) for s in sends]
            ok &= max(arrivals[:together]) <= arrivals[0] + prefill_seconds()
        low, high = (mid, high) if ok else (low, mid)
    return low


def largest_serial_share(load: str) -> float:
    """The bound from every burst of run 3's ``load``."""
    return largest_serial_share_of([(sends, first + second) for sends, first, second in bursts(load)])


def test_a_lone_request_takes_the_whole_cost_whatever_the_serial_share() -> None:
    """TTFT at concurrency 1 is calibrated on the whole cost (test_sim_calibration_vllm)."""
    for serial in (0.0, SERIAL_US, TOTAL_US):
        intake = Intake(TOTAL_US, serial)
        assert intake.arrival(5.0, PROMPT) == pytest.approx(5.0 + TOTAL_US * PROMPT * 1e-6)
        assert intake.arrival(9.0, PROMPT) == pytest.approx(9.0 + TOTAL_US * PROMPT * 1e-6)  # after the previous one left


def test_a_burst_is_spread_by_the_serial_share_only() -> None:
    intake = Intake(8.0, 2.0)
    arrivals = [intake.arrival(0.0, 1000) for _ in range(4)]
    assert arrivals == pytest.approx([0.008, 0.010, 0.012, 0.014])
    # The whole cost serial is the model before: one request after another.
    serial = Intake(8.0, 8.0)
    assert [serial.arrival(0.0, 1000) for _ in range(3)] == pytest.approx([0.008, 0.016, 0.024])
    # A serial share above the whole cost is the whole cost.
    assert Intake(8.0, 20.0).serial_us_per_prompt_token == 8.0
    with pytest.raises(ValueError):
        Intake(-1.0, 0.0)


@pytest.mark.parametrize("load", ["c4", "c8", "c16"])
def test_real_vllm_prefills_a_burst_in_two_steps(load: str) -> None:
    """What the records show: every burst's first request(s) alone, then up to 7 together (the
    8,192-token budget holds seven 1,025-token prompts beside the first one's decode)."""
    rows = bursts(load)
    assert len(rows) >= 6
    concurrency = int(load[1:])
    for sends, first, second in rows:
        assert len(sends) == concurrency and sends[-1] < 0.02
        assert first <= 2 and second == min(7, concurrency - first)


@pytest.mark.parametrize(("load", "bound_us"), [("c4", 7.87), ("c8", 2.93), ("c16", 2.68)])
def test_the_records_bound_the_serial_share(load: str, bound_us: float) -> None:
    """With more than ~2.7 µs per prompt token taken serially, c16's bursts (and above ~2.9, c8's)
    would reach the engine over more steps than real vLLM's did; the whole cost serial (8 µs, the
    model before) is outside for both."""
    assert largest_serial_share(load) == pytest.approx(bound_us, abs=0.01)


def test_the_shipped_serial_share_is_within_the_records_bound() -> None:
    """0 < serial share <= c16's bound; within it the value is the virtual-clock replay's best fit of
    TTFT P50 at c4-c64 (docs/simulator.md, "The intake")."""
    assert 0 < SERIAL_US <= min(largest_serial_share(load) for load in ("c4", "c8", "c16"))


def run4_burst(name: str) -> tuple[list[float], list[int]]:
    """Run 4's isolated bursts (tests/data/vllm/README.md): send offsets from the first send (s) and
    the number of first tokens per engine step, in order."""
    with gzip.open(DATA / "8b-tp1-intake-bursts.json.gz", "rt") as f:
        records = json.load(f)[name]["requests"]
    first = min(r["start"] for r in records)
    steps = _groups([r["start"] + r["ttftMs"] / 1e3 for r in records], 0.003)
    return sorted(r["start"] - first for r in records), [len(s) for s in steps]


def largest_serial_share_run4(name: str) -> float:
    sends, steps = run4_burst(name)
    return largest_serial_share_of([(sends, sum(steps[:2]))])


RUN4_BURSTS = [f"burst-1024-n{n}{k}" for n in (8, 16, 32, 64) for k in "ab"]


@pytest.mark.parametrize("name", RUN4_BURSTS)
def test_run4_bursts_reach_the_engine_together(name: str) -> None:
    """Isolated bursts of 8 to 64 requests sent within 15 ms (run 4): the first one or two are prefilled
    alone, the next seven in the following step, then eight a step (the 8,192-token budget), as the
    replacements' cohorts of run 3 were."""
    sends, steps = run4_burst(name)
    assert sends[-1] < 0.015
    assert steps[0] <= 2 and steps[1] == 7
    assert all(n in (7, 8) for n in steps[2:-1])


@pytest.mark.parametrize("name", RUN4_BURSTS)
def test_the_shipped_serial_share_is_within_run4s_bound(name: str) -> None:
    """Each run-4 burst bounds the serial share at 2.9-3.4 µs per prompt token; the shipped one is inside."""
    bound = largest_serial_share_run4(name)
    assert SERIAL_US <= bound < TOTAL_US  # the whole cost serial (the model before) is outside
