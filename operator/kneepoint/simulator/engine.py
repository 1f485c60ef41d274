"""The simulator's engine: its settings, the per-request streams and the step loop (no HTTP).

The engine loop plans a step with the scheduler, sleeps the step's modelled duration and
hands every new token to its request's stream. Sleeping is paced on an ideal timeline (a
late wake-up shortens the next sleep), so timer jitter does not slow the simulated GPU; only
when the process falls more than ``MAX_LAG_SECONDS`` behind (CPU-bound) is the lag accepted
and counted in ``kneepoint_sim_engine_lag_seconds_total``. The HTTP side (``server``) drives
it through :class:`RequestHandle`.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import IO

from kneepoint.core.gpus import GpuType
from kneepoint.simulator.intake import Intake
from kneepoint.simulator.output_loop import OutputLoop
from kneepoint.simulator.perf_model import PerfModel
from kneepoint.simulator.profiler import ProfilerConfig, SimProfiler
from kneepoint.simulator.scheduler import Scheduler, SchedulerConfig, SimRequest, StepOutcome
from kneepoint.simulator.startup import StartupFigures
from kneepoint.simulator.telemetry import Telemetry
from kneepoint.simulator.tokens import output_word
from kneepoint.simulator.vllm_metrics import VllmMetrics

MAX_LAG_SECONDS = 0.05
NATURAL_LENGTH_RANGE = (16, 512)
"""Reply length, in tokens, of a chat request that sets no token limit (a seeded 'end of sequence')."""


@dataclass(frozen=True)
class SimulatorSettings:
    """Everything the server needs, resolved and validated by the command."""

    model: str
    served_model_names: tuple[str, ...]
    host: str
    port: int
    dcgm_port: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    num_gpu_blocks: int
    block_size: int
    gpus: int
    gpu: GpuType
    interconnect: str
    memory_used_bytes_per_gpu: float
    """What the engine holds once loaded (gpu-memory-utilization x memory): DCGM's FB_USED."""
    weights_bytes_per_gpu: float
    cache_config: dict[str, str]
    perf: PerfModel
    noise: float = 0.02
    seed: int = 0
    model_load_seconds: float = 0.0
    truth_log: str | None = None
    hostname: str = "localhost"
    pod: str | None = None
    namespace: str | None = None
    container: str | None = None
    fail_fraction: float = 0.0
    """Share of completion requests answered with HTTP 500 (fault injection; 0 = none)."""
    startup: StartupFigures | None = None
    """The numbers of vLLM's start-up lines (``startup``); None prints none."""
    profiler: ProfilerConfig | None = None
    """--profiler-config: /start_profile and /stop_profile exist and write traces (simulator/profiler.py)."""
    async_scheduling: bool = True
    """--async-scheduling (vLLM 0.24's default): a request reaching a busy engine joins the step after next."""

    @property
    def model_name(self) -> str:
        """The metrics label and the first name clients may ask for."""
        return self.served_model_names[0]


def scheduler_config(settings: SimulatorSettings) -> SchedulerConfig:
    """The scheduler's limits from the engine's flags (the HTTP engine and the virtual tier alike)."""
    return SchedulerConfig(
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        num_gpu_blocks=settings.num_gpu_blocks,
        max_model_len=settings.max_model_len,
        block_size=settings.block_size,
        async_scheduling=settings.async_scheduling,
    )


# --------------------------------------------------------------------------------------------
# Per-request streams


@dataclass(eq=False)
class RequestHandle:
    """The bridge between the engine (tokens arrive) and one HTTP response (writes them)."""

    request_id: str
    seed: int
    chat: bool
    stream: bool
    prompt_tokens: int
    max_tokens: int
    created: int
    model: str
    include_usage: bool = False
    continuous_usage: bool = False
    pending: list[bytes] = field(default_factory=list)
    finished: bool = False
    aborted: bool = False
    output_tokens: int = 0
    received_at: float | None = None
    """Loop time the HTTP handler started (the request's headers were in)."""
    first_write_at: float | None = None
    """Loop time the first token's bytes were handed to the connection (streaming)."""
    _waiter: asyncio.Future[None] | None = None
    _prefix: bytes = b""
    _suffix: bytes = b""
    _last_suffix: bytes = b""

    def prepare(self, finish_reason: str) -> None:
        """Pre-build the bytes around each token's text (one concatenation per token later)."""
        rid, model = json.dumps(self.request_id), json.dumps(self.model)
        if self.chat:
            head = (
                f'data: {{"id":{rid},"object":"chat.completion.chunk","created":{self.created},"model":{model},'
                f'"choices":[{{"index":0,"delta":{{"content":"'
            )
            tail = '"}},"logprobs":null,"finish_reason":{reason}}}]'
        else:
            head = f'data: {{"id":{rid},"object":"text_completion","created":{self.created},"model":{model},"choices":[{{"index":0,"text":"'
            tail = '","logprobs":null,"finish_reason":{reason},"stop_reason":null}}]'
        self._prefix = head.encode()
        self._suffix = (tail.format(reason="null") + "}\n\n").encode()
        self._last_suffix = (tail.format(reason=json.dumps(finish_reason)) + "}\n\n").encode()

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + self.output_tokens,
            "completion_tokens": self.output_tokens,
        }

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_token(self, last: bool) -> None:
        """Called by the engine loop when this request gets its next token."""
        index = self.output_tokens
        self.output_tokens += 1
        if self.stream:
            if index == 0 and self.chat:
                # vLLM sends the assistant role in its own chunk, with the first engine output.
                role = {
                    "id": self.request_id,
                    "object": "chat.completion.chunk",
                    "created": self.created,
                    "model": self.model,
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}],
                }
                self.pending.append(b"data: " + json.dumps(role, separators=(",", ":")).encode() + b"\n\n")
            if self.continuous_usage:
                suffix = (
                    (self._last_suffix if last else self._suffix)[:-3]
                    + b',"usage":'
                    + json.dumps(self.usage(), separators=(",", ":")).encode()
                    + b"}\n\n"
                )
            else:
                suffix = self._last_suffix if last else self._suffix
            self.pending.append(self._prefix + output_word(self.seed, index) + suffix)
        if last:
            self.finished = True
            if self.stream:
                if self.include_usage:
                    obj = "chat.completion.chunk" if self.chat else "text_completion"
                    usage = {
                        "id": self.request_id,
                        "object": obj,
                        "created": self.created,
                        "model": self.model,
                        "choices": [],
                        "usage": self.usage(),
                    }
                    self.pending.append(b"data: " + json.dumps(usage, separators=(",", ":")).encode() + b"\n\n")
                self.pending.append(b"data: [DONE]\n\n")
        self._wake()

    def abort(self) -> None:
        self.aborted = True
        self._wake()

    async def next_chunks(self) -> list[bytes]:
        """Wait for tokens (or the end) and take what is pending."""
        while not self.pending and not self.finished and not self.aborted:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        chunks, self.pending = self.pending, []
        return chunks


@dataclass
class _Unwritten:
    """A response's tokens between the engine and the output path's write (``simulator.output_loop``)."""

    handle: RequestHandle
    tokens: int = 0
    """Made by the engine, not written yet."""
    finished: bool = False
    """The engine made the request's last token."""


# --------------------------------------------------------------------------------------------
# The engine


class Engine:
    """Scheduler + performance model + metrics, driven by real time."""

    def __init__(self, settings: SimulatorSettings) -> None:
        self.settings = settings
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._intake = Intake.of(settings.perf.calibration.serving)
        self._intake_timer: asyncio.TimerHandle | None = None
        serving = settings.perf.calibration.serving
        self._output: OutputLoop[str] = OutputLoop(serving.api_us_per_output, serving.api_us_per_write)
        self._output_timer: asyncio.TimerHandle | None = None
        self._unwritten: dict[str, _Unwritten] = {}  # by request id: tokens the engine made that the output path has not written
        self._idle_arrival: float | None = None  # modelled arrival of the request that woke an idle engine
        config = scheduler_config(settings)
        self.scheduler = Scheduler(config, settings.perf.step_time, clock=loop.time, noise=settings.noise, seed=settings.seed)
        self.telemetry = Telemetry()
        self.metrics = VllmMetrics(
            settings.model_name, max_model_len=settings.max_model_len, cache_config=settings.cache_config, gauges=self._gauges
        )
        self.handles: dict[str, RequestHandle] = {}
        self.started_at = loop.time()
        self.ready_at = self.started_at + settings.model_load_seconds
        self.lag_seconds_total = 0.0
        self._wake = asyncio.Event()
        self._counter = 0
        self._id_salt = random.Random(settings.seed).getrandbits(32)
        self._length_rng = random.Random(settings.seed + 1)
        self._fault_rng = random.Random(settings.seed + 2)
        self._wall_offset = time.time() - loop.time()
        # Open for the engine loop's life; the loop closes it when it ends.
        self._truth: IO[str] | None = open(settings.truth_log, "a", encoding="utf-8") if settings.truth_log else None  # noqa: SIM115
        self._stopping = False
        self.profiler = _profiler(settings)

    # -- state ---------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._loop.time() >= self.ready_at

    def _gauges(self) -> dict[str, float]:
        return {
            "running": self.scheduler.num_running,
            "waiting": self.scheduler.num_waiting,
            "kv_cache_usage": self.scheduler.kv_cache_usage,
        }

    def memory_used_bytes(self) -> float:
        """Framebuffer held per GPU: weights arrive during the load, then the whole budget is taken."""
        s = self.settings
        if self.ready:
            return s.memory_used_bytes_per_gpu
        elapsed = self._loop.time() - self.started_at
        share = elapsed / s.model_load_seconds if s.model_load_seconds > 0 else 1.0
        return min(1.0, share) * s.weights_bytes_per_gpu

    # -- requests ------------------------------------------------------------------------------
    def new_request_id(self, chat: bool, client_id: str | None = None) -> tuple[str, int]:
        """(response id, seed). As vLLM, a client's ``X-Request-Id`` names the request
        (``cmpl-<id>``/``chatcmpl-<id>``), so clients and the truth log can be joined; see
        :meth:`submit` for an id already in flight."""
        self._counter += 1
        prefix = "chatcmpl" if chat else "cmpl"
        if client_id:
            return f"{prefix}-{client_id}", self._counter
        return self._generated_id(prefix, self._counter), self._counter

    def _generated_id(self, prefix: str, counter: int) -> str:
        return f"{prefix}-{self._id_salt:08x}{counter:08x}"

    def injected_failure(self) -> bool:
        """True for the seeded share ``fail_fraction`` of requests (``--fail-fraction``)."""
        return self.settings.fail_fraction > 0 and self._fault_rng.random() < self.settings.fail_fraction

    def natural_length(self, limit: int) -> int:
        low, high = NATURAL_LENGTH_RANGE
        return max(1, min(limit, self._length_rng.randint(low, high)))

    def loop_time(self) -> float:
        return self._loop.time()

    async def intake(self, prompt_tokens: int, received_at: float | None = None) -> float:
        """Hold a request for vLLM's API-server intake (``simulator.intake``): a lone request for the
        intake's whole cost, a burst until the API server's process, shared between them, has done
        them all, so a burst reaches the engine late and together.

        The cost runs from ``received_at`` (the handler's start) when given, so the simulator's own
        parsing and response set-up count toward it instead of adding to it. Returns the modelled
        time the request reaches the engine."""
        now = self._loop.time()
        start = now if received_at is None else min(received_at, now)
        if self._intake.free:
            return start
        reached: asyncio.Future[float] = self._loop.create_future()
        self._intake.receive(start, reached, prompt_tokens)
        self._pump_intake()
        return await reached

    def _pump_intake(self, due: float = 0.0) -> None:
        """Hand over what the intake has done by now (or by ``due``, the event a timer was set for:
        the loop may run it a clock tick early) and wake again at its next event."""
        if self._intake_timer is not None:
            self._intake_timer.cancel()
            self._intake_timer = None
        for at, reached in self._intake.reached(max(self._loop.time(), due)):
            assert isinstance(reached, asyncio.Future)
            if not reached.done():  # a client that went away leaves its request's work behind
                reached.set_result(at)
        wake = self._intake.next_event()
        if wake is not None:
            self._intake_timer = self._loop.call_at(wake, self._pump_intake, wake)

    def submit(self, handle: RequestHandle, finish_reason: str, arrival: float | None = None) -> None:
        """Queue a request; ``arrival`` is its modelled arrival (from :meth:`intake`): an idle engine's
        first step is paced from there, not from when this process got round to waking the loop."""
        if arrival is not None and not self.scheduler.has_work:
            self._idle_arrival = arrival
        if handle.request_id in self.handles or handle.request_id in self._unwritten:
            # A client reused an X-Request-Id still in flight: the scheduler needs unique ids.
            handle.request_id = self._generated_id(handle.request_id.split("-", 1)[0], handle.seed)
        handle.prepare(finish_reason)
        self.scheduler.add_request(handle.request_id, handle.prompt_tokens, handle.max_tokens, finish_reason=finish_reason)
        self.handles[handle.request_id] = handle
        self._wake.set()

    def abort(self, handle: RequestHandle) -> None:
        if self.handles.pop(handle.request_id, None) is not None:
            self.scheduler.abort_request(handle.request_id)
            self.metrics.record_abort()
        handle.abort()

    # -- the loop ------------------------------------------------------------------------------
    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    async def run(self) -> None:
        loop = self._loop
        ideal: float | None = None  # the pacing timeline; None while idle
        last_flush = loop.time()
        while not self._stopping:
            if self.profiler is not None and await self.profiler.engine_turn():
                ideal = None  # the profiler held the engine (writing traces): not lag
            if not self.scheduler.has_work:
                ideal = None
                self._wake.clear()
                await self._wake.wait()
                continue
            now = loop.time()
            step = self.scheduler.schedule(now)
            if step is None:  # nothing schedulable (cannot happen with a pool that holds one max-length request)
                ideal = None
                self._wake.clear()
                await self._wake.wait()
                continue
            if ideal is None:
                # From idle: the step starts at the modelled arrival (within the lag bound), so the
                # loop's own wake-up and the intake's timer slack are not added to the request's TTFT.
                arrival, self._idle_arrival = self._idle_arrival, None
                ideal = now if arrival is None else max(min(now, arrival), now - MAX_LAG_SECONDS)
            elif ideal < now - MAX_LAG_SECONDS:
                self.lag_seconds_total += now - MAX_LAG_SECONDS - ideal
                ideal = now - MAX_LAG_SECONDS
            ideal += step.duration
            delay = ideal - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            end = loop.time()
            outcome = self.scheduler.complete(step, end)
            st = step.step_time
            scale = step.duration / st.seconds if st.seconds > 0 else 1.0
            self.telemetry.record(
                end, step.duration, st.comm_seconds * scale, st.link_bytes_per_gpu, step.num_tokens, step.work.sampled_seqs
            )
            if self.profiler is not None:
                w = step.work
                self.profiler.record_step(
                    step.start, step.duration, st.comm_seconds * scale, w.prefill_seqs, w.prefill_tokens, w.decode_seqs
                )
            finished = self._deliver(outcome, end)
            # Let the woken responses write their tokens before the next step is scheduled:
            # vLLM's API server streams outputs while the engine core computes the next
            # step, so a token's delivery does not wait for the next step's bookkeeping.
            await asyncio.sleep(0)
            self.metrics.record_step(step, outcome)
            if self._truth is not None:
                for req in outcome.finished:
                    self._write_truth(req, finished.get(req.request_id))
            if self._truth is not None and end - last_flush > 1.0:
                self._truth.flush()
                last_flush = end
        if self._truth is not None:
            self._truth.close()

    def _deliver(self, outcome: StepOutcome, end: float) -> dict[str, RequestHandle]:
        """Hand each request its token, through the API server's output path (``simulator.output_loop``) when it
        costs anything; returns the handles of the requests that finished in the engine."""
        handles = self.handles
        finished = {}
        made = []
        for req in outcome.tokens:
            handle = handles.get(req.request_id)
            if handle is None:
                continue
            last = req.finish_time is not None
            if last:
                finished[req.request_id] = handles.pop(req.request_id)
            if self._output.free:
                handle.on_token(last)
                continue
            entry = self._unwritten.setdefault(req.request_id, _Unwritten(handle))
            entry.tokens += 1
            entry.finished = last
            made.append(req.request_id)
        if made:
            self._output.push(end, made)
            self._pump_output()
        return finished

    def _pump_output(self, due: float = 0.0) -> None:
        """Write what the output path has done by now (or by ``due``, the event a timer was set for) and wake
        again at its next write."""
        if self._output_timer is not None:
            self._output_timer.cancel()
            self._output_timer = None
        for _, request_id, tokens in self._output.written(max(self._loop.time(), due)):
            entry = self._unwritten[request_id]
            entry.tokens -= tokens
            done = entry.finished and entry.tokens == 0
            if done:
                del self._unwritten[request_id]
            for i in range(tokens):
                entry.handle.on_token(done and i == tokens - 1)
        wake = self._output.next_event()
        if wake is not None:
            self._output_timer = self._loop.call_at(wake, self._pump_output, wake)

    def _write_truth(self, req: SimRequest, handle: RequestHandle | None) -> None:
        w = self._wall_offset
        first, end, sched = req.first_token_time, req.finish_time, req.first_scheduled_time
        assert first is not None and end is not None and sched is not None and self._truth is not None
        n = req.output_tokens
        record = {
            "id": req.request_id,
            "arrival": round(req.arrival_time + w, 6),
            "firstScheduled": round(sched + w, 6),
            "firstToken": round(first + w, 6),
            "finish": round(end + w, 6),
            "queueSeconds": round(sched - req.arrival_time, 6),
            "ttftSeconds": round(first - req.arrival_time, 6),
            "e2eSeconds": round(end - req.arrival_time, 6),
            "tpotSeconds": round((end - first) / (n - 1), 6) if n > 1 else None,
            "itlMaxSeconds": round(req.itl_max, 6),
            "promptTokens": req.prompt_tokens,
            "outputTokens": n,
            "maxTokens": req.max_tokens,
            "preemptions": req.num_preemptions,
            "finishReason": req.finish_reason,
        }
        # The HTTP side: when the handler started and when the first token's bytes went to the
        # connection. firstWrite - received is the TTFT at the server's socket, which a client
        # can be held to; ttftSeconds is the modelled engine's.
        received = handle.received_at if handle is not None else None
        written = handle.first_write_at if handle is not None else None
        record["received"] = None if received is None else round(received + w, 6)
        record["firstWrite"] = None if written is None else round(written + w, 6)
        record["socketTtftSeconds"] = None if received is None or written is None else round(written - received, 6)
        self._truth.write(json.dumps(record, separators=(",", ":")) + "\n")


def _profiler(settings: SimulatorSettings) -> SimProfiler | None:
    if settings.profiler is None or settings.profiler.profiler is None:
        return None
    d = settings.perf.deployment
    return SimProfiler(
        settings.profiler,
        d.tensor_parallel,
        d.pipeline_parallel,
        settings.perf.shape.num_layers,
        settings.interconnect,
        settings.gpu.display_name,
        int(settings.gpu.memory_bytes),
        settings.seed,
    )
