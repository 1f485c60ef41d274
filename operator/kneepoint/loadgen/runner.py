"""One process's share of the load: build a phase's requests, then keep N streams busy.

A phase (warm-up or one repeat) is ``count`` requests. Each of this process's ``slots``
coroutines takes the next request index from a shared source, waits for its Poisson send
time when ``--request-rate`` is set, sends it and records it; with no rate it sends at once,
which keeps exactly ``slots`` requests in flight (closed loop, vLLM bench's
``--max-concurrency`` with rate inf). Taking indices from one source shared by every worker
process keeps the closed loop global: a process whose streams finish early takes more.

``LocalRunner`` runs all of the concurrency in this process; ``worker_pool.WorkerPool``
runs shares of it in child processes with the same ``drive_phase``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import aiohttp

from kneepoint.loadgen.adaptive import AdaptiveStop
from kneepoint.loadgen.http_client import Clock, encode_body, make_session, send_request
from kneepoint.loadgen.records import RequestRecord
from kneepoint.loadgen.selfmonitor import SelfMonitor
from kneepoint.loadgen.workload import Tokenizer, build_prompt, build_request_body


@dataclass(frozen=True)
class RunSettings:
    """Everything a process needs to build and send the requests of any phase."""

    url: str
    api: str
    model: str
    stream: bool
    input_len: int
    output_len: int
    seed: int
    timeout_s: float
    resolve_rules: Mapping[tuple[str, int], str] = field(default_factory=dict)
    tokenizer_path: str | None = None


@dataclass
class PhaseOutcome:
    """Raw results of one phase from all processes."""

    records: list[RequestRecord]
    cpu_samples: list[list[float]]
    """One list per worker process, in cores."""
    lag_samples_ms: list[float]
    prompt_tokens_local: list[int | None]
    """Local-tokenizer length of each prompt (None without a tokenizer)."""


class Counters:
    """Finished and failed requests of the running phase (for the progress line)."""

    def __init__(self) -> None:
        self.done = 0
        self.failed = 0

    def add(self, ok: bool) -> None:
        self.done += 1
        if not ok:
            self.failed += 1

    def reset(self) -> None:
        self.done = self.failed = 0

    def read(self) -> tuple[int, int]:
        return self.done, self.failed


class LocalIndices:
    """Request indices 0..count-1 handed out in order within one process."""

    def __init__(self, count: int) -> None:
        self._next = 0
        self._count = count

    def take(self) -> int | None:
        if self._next >= self._count:
            return None
        self._next += 1
        return self._next - 1

    def close(self) -> None:
        """Hand out no more indices (the adaptive stop); requests already sent finish."""
        self._count = min(self._count, self._next)


def prepare_phase(settings: RunSettings, tokenizer: Tokenizer | None, phase: str, count: int) -> tuple[list[bytes], list[int | None]]:
    """Request bodies of a phase (JSON bytes) and each prompt's local token count."""
    bodies, local = [], []
    for index in range(count):
        prompt = build_prompt(settings.seed, phase, index, settings.input_len, tokenizer)
        body = build_request_body(settings.api, settings.model, prompt.text, settings.output_len, settings.stream)
        bodies.append(encode_body(body))
        local.append(prompt.tokens_local)
    return bodies, local


async def drive_phase(
    session: aiohttp.ClientSession,
    settings: RunSettings,
    bodies: list[bytes],
    slots: int,
    take_index: Callable[[], int | None],
    offsets: list[float] | None,
    start_at: float | None,
    clock: Clock,
    on_finished: Callable[[bool], None],
    worker: int = 0,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> list[RequestRecord]:
    """Send this process's share of a phase; returns its records.

    ``start_at`` (wall time) lines several processes up on one start; Poisson offsets are
    measured from it. Without it the phase starts now. ``on_record`` sees each finished
    request (the adaptive stop), before its slot takes the next index.
    """
    delay = 0.0 if start_at is None else max(0.0, start_at - time.time())
    if delay:
        await asyncio.sleep(delay)
    phase_start = time.perf_counter()
    records: list[RequestRecord] = []

    async def stream_slot() -> None:
        while (index := take_index()) is not None:
            if offsets is not None:
                wait = phase_start + offsets[index] - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
            record = RequestRecord(
                index=index,
                start=0.0,
                input_tokens_asked=settings.input_len,
                output_tokens_asked=settings.output_len,
                worker=worker,
            )
            await send_request(session, settings.url, bodies[index], record, settings.stream, clock)
            records.append(record)
            on_finished(record.ok)
            if on_record is not None:
                on_record(record)

    await asyncio.gather(*(stream_slot() for _ in range(slots)))
    return records


class LocalRunner:
    """All of the concurrency in the current process and event loop."""

    def __init__(self, settings: RunSettings, concurrency: int, tokenizer: Tokenizer | None) -> None:
        self.settings = settings
        self.concurrency = concurrency
        self.workers = 1
        self._tokenizer = tokenizer
        self._counters = Counters()
        self._clock = Clock()
        self._monitor = SelfMonitor()
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Open the HTTP session and start self-monitoring."""
        self._session = make_session(self.concurrency, self.settings.resolve_rules, self.settings.timeout_s)
        self._monitor.start()

    async def close(self) -> None:
        """Stop monitoring and close the session."""
        await self._monitor.stop()
        if self._session is not None:
            await self._session.close()

    def progress(self) -> tuple[int, int]:
        """(finished, failed) requests of the running phase."""
        return self._counters.read()

    async def run_phase(self, phase: str, count: int, offsets: list[float] | None, stop: AdaptiveStop | None = None) -> PhaseOutcome:
        """Build and run one phase of at most ``count`` requests (fewer when ``stop`` says so)."""
        assert self._session is not None, "start() first"
        bodies, local = prepare_phase(self.settings, self._tokenizer, phase, count)
        self._counters.reset()
        self._monitor.reset()
        indices = LocalIndices(count)

        def judge(record: RequestRecord) -> None:
            if stop is not None and stop.add(record):
                indices.close()

        records = await drive_phase(
            self._session,
            self.settings,
            bodies,
            min(self.concurrency, count) if count else 0,
            indices.take,
            offsets,
            None,
            self._clock,
            self._counters.add,
            on_record=judge if stop is not None else None,
        )
        cpu, lag = self._monitor.take()
        return PhaseOutcome(records, [cpu], lag, local)
