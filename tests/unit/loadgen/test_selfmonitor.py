"""The load generator's CPU probe reads short windows: a warm-up of a few requests can end before
the kernel's 10 ms tick has charged the process anything, and a reading of 0 there would hide a
saturated client (the warm-up's worker escalation reads exactly such a window)."""

from __future__ import annotations

import asyncio
import time

from kneepoint.loadgen.selfmonitor import SelfMonitor


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_a_window_shorter_than_a_tick_reads_the_cpu_it_used() -> None:
    async def main() -> list[float]:
        monitor = SelfMonitor(cpu_interval=10.0)
        monitor.start()
        monitor.reset()
        _spin(0.004)  # under one 10 ms tick
        cpu, _ = monitor.take()
        await monitor.stop()
        return cpu

    cpu = asyncio.run(main())
    assert len(cpu) == 1
    # CPU time over wall time: spinning is CPU-bound (at most one core; a busy machine may give it less)
    assert 0.0 < cpu[0] <= 1.05


def test_an_idle_window_reads_less_than_a_busy_one() -> None:
    async def window(busy: bool) -> float:
        monitor = SelfMonitor(cpu_interval=10.0)
        monitor.start()
        monitor.reset()
        if busy:
            _spin(0.05)
        else:
            await asyncio.sleep(0.05)
        cpu, _ = monitor.take()
        await monitor.stop()
        return cpu[0]

    idle, busy = asyncio.run(window(False)), asyncio.run(window(True))
    assert idle < busy


def test_samples_every_interval_while_the_loop_runs() -> None:
    async def main() -> list[float]:
        monitor = SelfMonitor(cpu_interval=0.02, lag_interval=0.01)
        monitor.start()
        monitor.reset()
        await asyncio.sleep(0.15)
        cpu, lag = monitor.take()
        await monitor.stop()
        assert lag
        return cpu

    cpu = asyncio.run(main())
    assert len(cpu) >= 2 and all(0.0 <= c <= 1.05 for c in cpu)
