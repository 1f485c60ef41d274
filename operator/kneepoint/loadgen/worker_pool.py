"""Several worker processes, each running a share of the concurrency in its own event loop.

One asyncio loop uses at most one core; past that the client, not the server, sets the
pace. The pool starts ``workers`` processes (spawn: a clean interpreter, no inherited event
loop or sockets) that keep their HTTP sessions across phases. For each phase the parent
asks every worker to build the phase's request bodies, then sends one wall-clock start time
to all; the workers take request indices from one shared counter (so the closed loop stays
global), and send back their raw records and self-monitoring samples, which the parent
merges. Progress comes from shared finished/failed counters.
"""

from __future__ import annotations

import asyncio
import dataclasses
import multiprocessing
import multiprocessing.connection
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.sharedctypes import Synchronized
from typing import Any

from kneepoint.loadgen.adaptive import AdaptiveStop
from kneepoint.loadgen.http_client import Clock, make_session
from kneepoint.loadgen.records import RequestRecord
from kneepoint.loadgen.runner import PhaseOutcome, RunSettings, drive_phase, prepare_phase
from kneepoint.loadgen.selfmonitor import SelfMonitor

# Seconds between the last worker reporting "prepared" and the common start.
_START_MARGIN = 0.2
# Seconds a worker may take to start (import aiohttp, load a tokenizer).
_STARTUP_TIMEOUT = 120.0


class WorkerError(RuntimeError):
    """A worker process failed; the message is one line."""


class _SharedIndices:
    def __init__(self, value: Synchronized[int], limit: Synchronized[int]) -> None:
        self._value = value
        self._limit = limit

    def take(self) -> int | None:
        with self._value.get_lock():
            index = self._value.value
            if index >= self._limit.value:
                return None
            self._value.value = index + 1
            return index


def _worker_entry(
    worker: int,
    conn: multiprocessing.connection.Connection,
    settings: RunSettings,
    slots: int,
    next_index: Synchronized[int],
    limit: Synchronized[int],
    done: Synchronized[int],
    failed: Synchronized[int],
) -> None:
    """Child process main: serve phases until told to stop."""
    try:
        asyncio.run(_worker_loop(worker, conn, settings, slots, next_index, limit, done, failed))
    except BaseException as error:  # noqa: BLE001 - a worker process reports any failure as one line, then exits
        line = " ".join(f"{type(error).__name__}: {error}".split())
        try:
            conn.send(("error", f"worker {worker}: {line}", traceback.format_exc(limit=5)))
        except OSError:
            pass


async def _worker_loop(
    worker: int,
    conn: multiprocessing.connection.Connection,
    settings: RunSettings,
    slots: int,
    next_index: Synchronized[int],
    limit: Synchronized[int],
    done: Synchronized[int],
    failed: Synchronized[int],
) -> None:
    loop = asyncio.get_running_loop()
    tokenizer = None
    if settings.tokenizer_path:
        from kneepoint.loadgen.tokenizer_files import load_tokenizer

        tokenizer = load_tokenizer(settings.tokenizer_path)
    session = make_session(slots, settings.resolve_rules, settings.timeout_s)
    monitor = SelfMonitor()
    monitor.start()
    clock = Clock()
    indices = _SharedIndices(next_index, limit)

    def on_finished(ok: bool) -> None:
        with done.get_lock():
            done.value += 1
        if not ok:
            with failed.get_lock():
                failed.value += 1

    conn.send(("ready",))
    try:
        while True:
            message = await loop.run_in_executor(None, conn.recv)
            if message[0] == "stop":
                break
            _, phase, count, offsets, stream_records = message
            bodies, local = prepare_phase(settings, tokenizer, phase, count)
            conn.send(("prepared", local if worker == 0 else None))
            go = await loop.run_in_executor(None, conn.recv)
            if go[0] == "stop":
                break
            start_at = go[1]
            monitor.reset()

            def send_record(record: RequestRecord) -> None:
                # The parent's adaptive stop judges every finished request; the ITL list stays here.
                conn.send(("record", dataclasses.replace(record, itl=[])))

            records = await drive_phase(
                session,
                settings,
                bodies,
                slots,
                indices.take,
                offsets,
                start_at,
                clock,
                on_finished,
                worker,
                on_record=send_record if stream_records else None,
            )
            cpu, lag = monitor.take()
            conn.send(("done", records, cpu, lag))
    finally:
        await monitor.stop()
        await session.close()


class WorkerPool:
    """``workers`` child processes sharing one phase's requests (same API as LocalRunner)."""

    def __init__(self, settings: RunSettings, shares: list[int]) -> None:
        self.settings = settings
        self.concurrency = sum(shares)
        self.workers = len(shares)
        self._shares = shares
        context = multiprocessing.get_context("spawn")
        self._next = context.Value("q", 0)
        self._limit = context.Value("q", 0)
        self._done = context.Value("q", 0)
        self._failed = context.Value("q", 0)
        self._connections: list[multiprocessing.connection.Connection] = []
        self._processes: list[Any] = []
        self._context = context

    async def start(self) -> None:
        """Start the processes and wait until each has its session open."""
        for worker, slots in enumerate(self._shares):
            parent, child = self._context.Pipe()
            process = self._context.Process(
                target=_worker_entry,
                args=(worker, child, self.settings, slots, self._next, self._limit, self._done, self._failed),
                name=f"kneepoint-loadgen-worker-{worker}",
                daemon=True,
            )
            process.start()
            child.close()
            self._connections.append(parent)
            self._processes.append(process)
        await self._gather("ready", timeout=_STARTUP_TIMEOUT)

    async def close(self) -> None:
        """Ask the workers to stop; end any that do not within a few seconds."""
        for conn in self._connections:
            try:
                conn.send(("stop",))
            except OSError:
                pass
        deadline = time.monotonic() + 5.0
        for process in self._processes:
            await asyncio.get_running_loop().run_in_executor(None, process.join, max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.terminate()
                process.join(2.0)
        for conn in self._connections:
            conn.close()

    def progress(self) -> tuple[int, int]:
        """(finished, failed) requests of the running phase, over all workers."""
        return self._done.value, self._failed.value

    async def run_phase(self, phase: str, count: int, offsets: list[float] | None, stop: AdaptiveStop | None = None) -> PhaseOutcome:
        """Run one phase across all workers and merge their records (fewer than ``count`` when ``stop`` says so)."""
        with self._next.get_lock():
            self._next.value = 0
        self._limit.value = count
        self._done.value = 0
        self._failed.value = 0
        for conn in self._connections:
            conn.send(("phase", phase, count, offsets, stop is not None))
        prepared = await self._gather("prepared", timeout=None)
        start_at = time.time() + _START_MARGIN
        for conn in self._connections:
            conn.send(("go", start_at))
        lock = threading.Lock()

        def judge(record: RequestRecord) -> None:
            assert stop is not None
            with lock:
                if not stop.add(record):
                    return
            # No worker takes an index past the limit (checked under the same lock).
            with self._next.get_lock():
                self._limit.value = min(self._limit.value, self._next.value)

        results = await self._gather("done", timeout=None, on_record=judge)
        records = [record for result in results for record in result[1]]
        records.sort(key=lambda r: r.index)
        return PhaseOutcome(
            records=records,
            cpu_samples=[result[2] for result in results],
            lag_samples_ms=[lag for result in results for lag in result[3]],
            prompt_tokens_local=prepared[0][1],
        )

    async def _gather(
        self, expected: str, timeout: float | None, on_record: Callable[[RequestRecord], None] | None = None
    ) -> list[tuple[Any, ...]]:
        loop = asyncio.get_running_loop()

        def receive(conn: multiprocessing.connection.Connection) -> tuple[Any, ...]:
            while True:
                if timeout is not None and not conn.poll(timeout):
                    raise WorkerError(f"a worker did not answer {expected!r} within {timeout:.0f} s")
                try:
                    reply = conn.recv()
                except EOFError:
                    raise WorkerError("a worker process exited unexpectedly") from None
                if reply[0] == "record" and on_record is not None:
                    on_record(reply[1])
                    continue
                return reply

        replies = await asyncio.gather(*(loop.run_in_executor(None, receive, conn) for conn in self._connections))
        for reply in replies:
            if reply[0] == "error":
                raise WorkerError(reply[1])
            if reply[0] != expected:
                raise WorkerError(f"a worker answered {reply[0]!r} instead of {expected!r}")
        return list(replies)
