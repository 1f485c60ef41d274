"""The profiled slice: /start_profile after the phase's first request, /stop_profile after S s or at the phase's end."""

from __future__ import annotations

import asyncio
import socket

from aiohttp import web

from kneepoint.loadgen.profile_slice import profile_during


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def serve(status: int = 200, state=lambda: None) -> tuple[web.AppRunner, str, list]:
    calls: list = []

    async def handler(request: web.Request) -> web.Response:
        calls.append((request.path, state()))
        return web.Response(status=status)

    app = web.Application()
    app.add_routes([web.post("/start_profile", handler), web.post("/stop_profile", handler)])
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}", calls


async def test_start_waits_for_the_first_finished_request_and_stop_comes_before_the_phase_ends() -> None:
    done = {"n": 0}
    runner, url, calls = await serve(state=lambda: done["n"])

    async def phase() -> str:
        await asyncio.sleep(0.1)
        done["n"] = 1
        await asyncio.sleep(0.6)
        return "records"

    try:
        result, outcome = await profile_during(phase(), lambda: done["n"], url, {}, seconds=0.2, timeout_s=5)
    finally:
        await runner.cleanup()
    assert result == "records" and outcome.error is None and outcome.started and outcome.stopped
    assert calls == [("/start_profile", 1), ("/stop_profile", 1)]  # started once the first request had finished
    assert 0.15 < outcome.seconds < 0.5


async def test_an_engine_without_profiler_is_reported_and_the_phase_still_finishes() -> None:
    runner, url, calls = await serve(status=404)
    done = {"n": 1}

    async def phase() -> str:
        await asyncio.sleep(0.05)
        return "records"

    try:
        result, outcome = await profile_during(phase(), lambda: done["n"], url, {}, seconds=0.1, timeout_s=5)
    finally:
        await runner.cleanup()
    assert result == "records" and not outcome.started and outcome.error == "POST /start_profile: HTTP 404"
