"""The profiled slice: vLLM's torch profiler started and stopped under the same load, unmeasured.

With ``--profile-seconds S`` the load generator runs one more phase after the measured
repeats, at the same concurrency and request shape (``--profile-requests`` requests), and
calls the engine's ``POST /start_profile`` once the phase's first request has finished (the
closed loop is turning), then ``POST /stop_profile`` after S seconds or when the phase
ends. The engine writes one trace per rank; the engine pod's trace sidecar reads them
(docs/trace.md).

Why after the measured repeats, not inside them: real vLLM stops serving while it writes
the traces at ``/stop_profile`` (32 s for a 3 s slice of 316 steps on vLLM 0.24, TP1 8B;
``8b-tp1-serve-with-profiler.log``), which no measured window could absorb.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from kneepoint.loadgen.http_client import make_session

START_PATH = "/start_profile"
STOP_PATH = "/stop_profile"


@dataclass
class SliceOutcome:
    started: bool = False
    stopped: bool = False
    seconds: float = 0.0
    """Seconds between the start's answer and the stop's request."""
    stop_seconds: float = 0.0
    """How long /stop_profile took to answer (the engine writing its traces)."""
    error: str | None = None


async def _post(endpoint: str, path: str, rules: Mapping[tuple[str, int], str], timeout_s: float) -> None:
    async with make_session(1, rules, timeout_s) as session, session.post(endpoint.rstrip("/") + path) as response:
        if response.status != 200:
            body = (await response.text())[:120]
            raise RuntimeError(f"POST {path}: HTTP {response.status} {' '.join(body.split())}".strip())
        await response.read()


async def profile_during(
    phase: Awaitable[object],
    finished: Callable[[], int],
    endpoint: str,
    rules: Mapping[tuple[str, int], str],
    seconds: float,
    timeout_s: float,
    poll_s: float = 0.05,
) -> tuple[object, SliceOutcome]:
    """Run ``phase`` and profile a slice of it; returns (the phase's result, what happened)."""
    task = asyncio.ensure_future(phase)
    outcome = SliceOutcome()
    try:
        while not task.done() and finished() < 1:
            await asyncio.sleep(poll_s)
        if not task.done():
            await _post(endpoint, START_PATH, rules, timeout_s)
            outcome.started = True
            began = time.perf_counter()
            deadline = began + seconds
            while not task.done() and time.perf_counter() < deadline:
                await asyncio.sleep(min(poll_s, max(0.0, deadline - time.perf_counter())))
            outcome.seconds = time.perf_counter() - began
            stop_began = time.perf_counter()
            await _post(endpoint, STOP_PATH, rules, timeout_s)
            outcome.stop_seconds = time.perf_counter() - stop_began
            outcome.stopped = True
        else:
            outcome.error = "the profile phase ended before its first request finished"
    except Exception as error:  # noqa: BLE001 - the engine has no profiler, or it failed: the measured figures stand
        outcome.error = " ".join(str(error).split())[:300] or type(error).__name__
    result = await task
    return result, outcome
