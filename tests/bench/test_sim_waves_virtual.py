"""benchmarks/sim_waves_virtual.py's model under trial (``StreamingIntake``: the API server's loop streaming every
token holds the intake; docs/simulator.md, "Tried on the virtual clock, not shipped"), and that with it off the
benchmark replays the shipped model."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from kneepoint.simulator.intake import Intake

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def swv():
    spec = importlib.util.spec_from_file_location("sim_waves_virtual", ROOT / "benchmarks" / "sim_waves_virtual.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["sim_waves_virtual"] = module
    spec.loader.exec_module(module)
    return module


def _through(intake: Intake, until: float) -> list[tuple[float, str]]:
    reached = []
    t = 0.0
    while t < until:
        nxt = intake.next_event()
        if nxt is None:
            break
        t = min(max(nxt, t), until)
        reached += intake.reached(t)
        if nxt > until:
            break
    return reached


def test_a_request_waits_for_the_loop_to_stream_a_step_then_takes_its_gate_work(swv) -> None:
    # 1 ms of gate work, nothing else: alone it reaches the engine 1 ms after it was sent.
    plain = Intake(0.0, 0.0, us_per_request=1000.0, gate_us_per_request=1000.0)
    plain.receive(0.0, "a", 16)
    assert _through(plain, 1.0) == [(pytest.approx(0.001), "a")]

    # The loop takes 256 tokens x 50 µs = 12.8 ms from t=0: the gate starts then.
    held = swv.StreamingIntake(Intake(0.0, 0.0, us_per_request=1000.0, gate_us_per_request=1000.0), 50.0, holds_tokens=False)
    assert held.stream(0.0, 256) == pytest.approx(0.0128)
    held.receive(0.0, "a", 16)
    assert _through(held, 1.0) == [(pytest.approx(0.0138), "a")]


def test_with_the_loop_off_the_benchmark_replays_the_shipped_intake(swv) -> None:
    settings = swv.start_engine(
        [*swv.engine_args(swv.MODELS["8b-tp1"][2], "8b-tp1"), "--dcgm-port", "0", "--model-load-seconds", "0"]
    ).settings
    serving = settings.perf.calibration.serving
    config = {"concurrency": 16, "numRequests": 48, "warmupRequests": 16, "outputLen": 64, "inputLen": 512}
    shipped = swv.run(settings, config, 0.0, 0, True, Intake.of(serving))
    off = swv.run(settings, config, 0.0, 0, True, swv.StreamingIntake(Intake.of(serving), 0.0, holds_tokens=False))
    assert off == shipped
    # A loop that takes 1 ms a token and holds each token until it has handled it delivers at most 1,000 a second,
    # whatever the engine makes.
    held = swv.run(settings, config, 0.0, 0, True, swv.StreamingIntake(Intake.of(serving), 1000.0, holds_tokens=True))
    assert shipped["outputTokensPerSecond"] > 1500
    assert held["outputTokensPerSecond"] <= 1000 * 1.001
