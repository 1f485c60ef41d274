"""benchmarks/sim_waves_virtual.py with the API server's output path (``simulator.output_loop``): a slow loop bounds
what reaches the clients, and at 256 in flight the shipped costs hold the closed loop's waves together."""

from __future__ import annotations

import pytest
from benchmark_scripts import load_benchmark

from kneepoint.simulator.intake import Intake
from kneepoint.simulator.output_loop import OutputLoop


@pytest.fixture(scope="module")
def swv():
    return load_benchmark("sim_waves_virtual")


def _engine(swv, max_num_seqs: int):
    return swv.replay_settings(swv.engine_args(max_num_seqs, "8b-tp1"))


def test_a_loop_that_takes_a_millisecond_an_output_delivers_at_most_a_thousand_tokens_a_second(swv) -> None:
    settings = _engine(swv, 128)
    serving = settings.perf.calibration.serving
    config = {"concurrency": 16, "numRequests": 48, "warmupRequests": 16, "outputLen": 64, "inputLen": 512}
    engine_side = swv.run(settings, config, 0.0, 0, True, Intake.of(serving), None)
    slow = swv.run(settings, config, 0.0, 0, True, Intake.of(serving), OutputLoop(1000.0, 0.0))
    assert engine_side["outputTokensPerSecond"] > 1500
    assert slow["outputTokensPerSecond"] <= 1000 * 1.001


def test_at_256_in_flight_the_shipped_output_path_holds_the_waves_together(swv) -> None:
    # Run 23b's workload (512/256 at 256 in flight, --max-num-seqs 256): real vLLM's TTFT P50 1,702-1,737 ms. With
    # the tokens written as their steps end the waves spread and the simulator gave 767 ms.
    settings = _engine(swv, 256)
    serving = settings.perf.calibration.serving
    config = {"concurrency": 256, "numRequests": 1000, "warmupRequests": 256, "outputLen": 256, "inputLen": 512}
    engine_side = swv.run(settings, config, 0.0, 0, True, Intake.of(serving), None)
    shipped = swv.run(settings, config, 0.0, 0, True, Intake.of(serving), OutputLoop(serving.api_us_per_output, serving.api_us_per_write))
    assert engine_side["ttftP50Ms"] < 1000 < 1400 < shipped["ttftP50Ms"] < 1900
