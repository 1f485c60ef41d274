"""The simulator's fault knob (``--fail-fraction`` / ``KNEEPOINT_SIM_FAIL_FRACTION``), over real HTTP.

The fault-injection suite (tests/integration/test_faults_*.py) uses it to make load tests
fail wholly or partly; these tests pin what it does: a seeded share of completion requests
gets vLLM's 500 error body, everything else (health, models, metrics) is untouched.
"""

from __future__ import annotations

import aiohttp
import pytest
from click.testing import CliRunner
from test_sim_http import MODEL, make_settings  # same directory

from kneepoint.simulator.command import command
from kneepoint.simulator.server import start, stop


async def _statuses(fraction: str, n: int) -> list[int]:
    settings = make_settings("--fail-fraction", fraction)
    engine, runners, task = await start(settings)
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{settings.port}") as session:
            out = []
            for _ in range(n):
                body = {"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 2}
                async with session.post("/v1/completions", json=body) as resp:
                    out.append(resp.status)
                    if resp.status == 500:
                        error = (await resp.json())["error"]
                        assert error["code"] == 500
                        assert error["type"] == "InternalServerError"
                        assert "fail-fraction" in error["message"]
            async with session.get("/health") as resp:
                assert resp.status == 200
            async with session.get("/v1/models") as resp:
                assert resp.status == 200
            return out
    finally:
        await stop(engine, runners, task)


async def test_fail_fraction_one_fails_every_completion() -> None:
    assert set(await _statuses("1", 5)) == {500}


async def test_fail_fraction_zero_is_the_default_and_fails_nothing() -> None:
    assert make_settings().fail_fraction == 0.0
    assert set(await _statuses("0", 5)) == {200}


async def test_partial_fail_fraction_is_a_seeded_share() -> None:
    first = await _statuses("0.3", 60)
    again = await _statuses("0.3", 60)
    assert first == again  # seeded: the same requests fail on every run
    failed = first.count(500) / len(first)
    assert 0.15 <= failed <= 0.45, failed
    assert set(first) == {200, 500}


def test_fail_fraction_reads_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KNEEPOINT_SIM_FAIL_FRACTION", "0.25")
    assert make_settings().fail_fraction == 0.25


@pytest.mark.parametrize("value", ["-0.1", "1.5"])
def test_fail_fraction_outside_zero_one_is_refused_naming_the_flag(value: str) -> None:
    result = CliRunner().invoke(command, ["--model", MODEL, "--fail-fraction", value])
    assert result.exit_code == 2
    assert "--fail-fraction: must be in [0, 1]" in result.output


def test_sigterm_during_the_model_load_ends_the_process_at_once() -> None:
    """A pod deleted while its engine loads: the process must not live on until the load is over."""
    import signal
    import subprocess
    import sys
    import time
    import urllib.error
    import urllib.request

    from test_sim_http import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kneepoint", "sim", "--model", MODEL, "--max-model-len", "2048", "--port", str(port),
         "--dcgm-port", "0", "--model-load-seconds", "60"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip # argv: each flag beside its value
    try:
        deadline = time.monotonic() + 30
        loading = False
        while time.monotonic() < deadline and not loading:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
            except urllib.error.HTTPError as exc:
                loading = exc.code == 503
            except OSError:
                time.sleep(0.1)
        assert loading, "the simulator never answered 503 while loading"
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - began < 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
