"""The load generator watching itself: its process's CPU and its event loop's lag.

A client that saturates its core timestamps chunks late and issues requests late, so the
server looks slower than it is. Two probes run beside the load in every worker process:
- CPU: this process's CPU time (``time.process_time``, the kernel's per-process clock, so a
  window shorter than the kernel's 10 ms tick still reads what it used) over the wall time,
  every ``cpu_interval`` seconds, in cores;
- lag: a task sleeps ``lag_interval`` seconds and records how much later it woke up; a
  busy loop wakes it late, exactly as it delivers response chunks late.
``summary.judge_client_load`` turns the samples into the ``clientLimited`` verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import time


class SelfMonitor:
    """Samples CPU (cores) and loop lag (ms) of the current process while the loop runs."""

    def __init__(self, cpu_interval: float = 0.5, lag_interval: float = 0.05) -> None:
        self._cpu_interval = cpu_interval
        self._lag_interval = lag_interval
        self._mark = (time.perf_counter(), time.process_time())
        self._cpu: list[float] = []
        self._lag_ms: list[float] = []
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start both probes in the running loop."""
        self._mark = (time.perf_counter(), time.process_time())
        self._tasks = [asyncio.create_task(self._sample_cpu()), asyncio.create_task(self._sample_lag())]

    def reset(self) -> None:
        """Begin a new window (a phase)."""
        self._mark = (time.perf_counter(), time.process_time())
        self._cpu = []
        self._lag_ms = []

    def take(self) -> tuple[list[float], list[float]]:
        """(CPU samples in cores, lag samples in ms) since the last reset.

        A window shorter than one CPU interval gets one sample covering the whole window.
        """
        cpu = list(self._cpu)
        if not cpu:
            cpu.append(self._cores_since_mark())
        return cpu, list(self._lag_ms)

    async def stop(self) -> None:
        """Cancel the probes."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    def _cores_since_mark(self) -> float:
        """CPU used since the last mark, in cores (process CPU seconds per wall second); moves the mark."""
        wall, cpu = time.perf_counter(), time.process_time()
        last_wall, last_cpu = self._mark
        self._mark = (wall, cpu)
        return (cpu - last_cpu) / (wall - last_wall) if wall > last_wall else 0.0

    async def _sample_cpu(self) -> None:
        while True:
            await asyncio.sleep(self._cpu_interval)
            self._cpu.append(self._cores_since_mark())

    async def _sample_lag(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(self._lag_interval)
            self._lag_ms.append(max(0.0, (time.perf_counter() - before - self._lag_interval) * 1000.0))
