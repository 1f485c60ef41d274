"""The simulator's HTTP side: vLLM's OpenAI-compatible API, /metrics, the DCGM endpoint, the engine loop.

One asyncio loop runs everything (aiohttp; measured to stream well over 20,000 tokens/s
on one core, see docs/simulator.md). The engine loop plans a step with the scheduler,
sleeps the step's modelled duration and hands every new token to its request's stream.
Sleeping is paced on an ideal timeline (a late wake-up shortens the next sleep), so timer
jitter does not slow the simulated GPU; only when the process falls more than
``MAX_LAG_SECONDS`` behind (CPU-bound) is the lag accepted and counted in
``kneepoint_sim_engine_lag_seconds_total``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import time
from dataclasses import dataclass, field, replace
from typing import IO, Any

from aiohttp import web

from kneepoint.core.gpus import GpuType
from kneepoint.simulator.dcgm_metrics import DcgmMetrics
from kneepoint.simulator.perf_model import PerfModel
from kneepoint.simulator.profiler import ProfilerConfig, SimProfiler
from kneepoint.simulator.profiler import routes as profiler_routes
from kneepoint.simulator.scheduler import Scheduler, SchedulerConfig, SimRequest, StepOutcome
from kneepoint.simulator.startup import StartupFigures, run_startup
from kneepoint.simulator.telemetry import Telemetry
from kneepoint.simulator.tokens import (
    BOS_TOKENS,
    PromptError,
    count_chat_prompt,
    count_completion_prompt,
    output_text,
    output_word,
    token_ids,
)
from kneepoint.simulator.vllm_metrics import VllmMetrics

log = logging.getLogger("kneepoint.sim")

MAX_LAG_SECONDS = 0.05
NATURAL_LENGTH_RANGE = (16, 512)
"""Reply length, in tokens, of a chat request that sets no token limit (a seeded 'end of sequence')."""
VLLM_VERSION = "0.33.0"
"""The vLLM release whose API, flags and metrics the simulator follows."""


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


# --------------------------------------------------------------------------------------------
# The engine


class Engine:
    """Scheduler + performance model + metrics, driven by real time."""

    def __init__(self, settings: SimulatorSettings) -> None:
        self.settings = settings
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._intake_free_at = 0.0
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
        """Hold a request for vLLM's API-server intake. One process takes requests one after another
        (parsing, tokenisation, hand-over to the engine core), so a burst of long prompts reaches the
        engine spread out and late: in the real c32 capture, requests sent together started their
        prefill some 70 ms after a wave's last token, while the others' decode steps ran on.

        The cost runs from ``received_at`` (the handler's start) when given, so the simulator's own
        parsing and response set-up count toward it instead of adding to it. Returns the modelled
        time the request reaches the engine."""
        now = self._loop.time()
        start = now if received_at is None else min(received_at, now)
        cost = self.settings.perf.calibration.serving.api_us_per_prompt_token * prompt_tokens * 1e-6
        if cost <= 0:
            return start
        self._intake_free_at = max(self._intake_free_at, start) + cost
        if self._intake_free_at > now:
            await asyncio.sleep(self._intake_free_at - now)
        return self._intake_free_at

    def submit(self, handle: RequestHandle, finish_reason: str, arrival: float | None = None) -> None:
        """Queue a request; ``arrival`` is its modelled arrival (from :meth:`intake`): an idle engine's
        first step is paced from there, not from when this process got round to waking the loop."""
        if arrival is not None and not self.scheduler.has_work:
            self._idle_arrival = arrival
        if handle.request_id in self.handles:
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
            finished = self._deliver(outcome)
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

    def _deliver(self, outcome: StepOutcome) -> dict[str, RequestHandle]:
        """Hand each request its token; returns the handles of the requests that finished."""
        handles = self.handles
        finished = {}
        for req in outcome.tokens:
            handle = handles.get(req.request_id)
            if handle is None:
                continue
            last = req.finish_time is not None
            handle.on_token(last)
            if last:
                finished[req.request_id] = handles.pop(req.request_id)
        return finished

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


# --------------------------------------------------------------------------------------------
# HTTP handlers


def _error(status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> web.Response:
    # vLLM 0.24's shape: {"error": {...}} with the HTTP status as code (tests/data/vllm/8b-tp1-api-probes.txt).
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return web.json_response(body, status=status)


def _validation(message: str, param: str, value: Any) -> str:
    """vLLM's wording of a request-validation error: the message, then the parameter and its value."""
    return f"{message} (parameter={param}, value={value})"


class Api:
    """The OpenAI-compatible routes over one :class:`Engine`."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.settings = engine.settings

    def routes(self) -> list[web.RouteDef]:
        return [
            web.get("/health", self.health),
            web.get("/ping", self.health),
            web.post("/ping", self.health),
            web.get("/version", self.version),
            web.get("/load", self.load),
            web.get("/metrics", self.metrics),
            web.get("/v1/models", self.models),
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat_completions),
            web.post("/tokenize", self.tokenize),
        ]

    async def health(self, request: web.Request) -> web.Response:
        if not self.engine.ready:
            return web.Response(status=503, text="model loading")
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": VLLM_VERSION, "simulator": "kneepoint sim"})

    async def load(self, request: web.Request) -> web.Response:
        return web.json_response({"server_load": len(self.engine.handles)})

    async def metrics(self, request: web.Request) -> web.Response:
        body = self.engine.metrics.render()
        lag = (
            f"# HELP kneepoint_sim_engine_lag_seconds_total Simulator only: time the engine loop fell behind "
            f"the modelled step times (CPU-bound).\n# TYPE kneepoint_sim_engine_lag_seconds_total counter\n"
            f'kneepoint_sim_engine_lag_seconds_total{{engine="0",model_name={json.dumps(self.settings.model_name)}}} '
            f"{self.engine.lag_seconds_total}\n"
        ).encode()
        return web.Response(body=body + lag, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    async def models(self, request: web.Request) -> web.Response:
        created = int(time.time())
        data = [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": self.settings.model,
                "parent": None,
                "max_model_len": self.settings.max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{i}",
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
            for i, name in enumerate(self.settings.served_model_names)
        ]
        return web.json_response({"object": "list", "data": data})

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's POST /tokenize: a completions ``prompt`` or chat ``messages`` to its token count."""
        s = self.settings
        try:
            body = await request.json(loads=json.loads)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "request body is not valid JSON")
        if not isinstance(body, dict):
            return _error(400, "request body must be a JSON object")
        model = body.get("model")
        if model is not None and model not in s.served_model_names:
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        try:
            if "messages" in body:
                count = count_chat_prompt(body["messages"], bool(body.get("add_generation_prompt", True)))
                source: Any = body["messages"]
            else:
                source = body.get("prompt")
                count = count_completion_prompt(source)
                if body.get("add_special_tokens", True) is False and isinstance(source, str):
                    count -= BOS_TOKENS
        except PromptError as exc:
            return _error(400, str(exc), param="messages" if "messages" in body else "prompt")
        return web.json_response({"count": count, "max_model_len": s.max_model_len, "tokens": token_ids(source, count), "token_strs": None})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    # -- the shared request path ---------------------------------------------------------------
    def _parse(self, body: Any, chat: bool) -> tuple[dict[str, Any], web.Response | None]:
        s = self.settings
        if not isinstance(body, dict):
            return {}, _error(400, "request body must be a JSON object")
        model = body.get("model")
        if model is not None and model not in s.served_model_names:
            return {}, _error(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
        if body.get("n", 1) != 1:
            return {}, _error(400, "n: the simulator serves one choice per request (n=1)", param="n")
        stream = bool(body.get("stream", False))
        options = body.get("stream_options")
        if options is not None and not stream:
            return {}, _error(400, "Stream options can only be defined when `stream=True`.", param="stream_options")
        options = options or {}
        try:
            prompt = count_chat_prompt(body.get("messages")) if chat else count_completion_prompt(body.get("prompt"))
        except PromptError as exc:
            return {}, _error(400, str(exc), param="messages" if chat else "prompt")
        if chat:
            limit = body.get("max_completion_tokens", body.get("max_tokens"))
        else:
            limit = body.get("max_tokens", 16)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            return {}, _error(400, _validation(f"max_tokens must be at least 1, got {limit}.", "max_tokens", limit), param="max_tokens")
        problem = self._context_error(prompt, limit, chat)
        if problem is not None:
            return {}, problem
        return {
            "stream": stream,
            "prompt": prompt,
            "limit": limit,
            "include_usage": bool(options.get("include_usage", False)),
            "continuous_usage": bool(options.get("include_usage", False) and options.get("continuous_usage_stats", False)),
            "model": model or s.model_name,
        }, None

    def _context_error(self, prompt: int, limit: int | None, chat: bool) -> web.Response | None:
        """vLLM 0.24's answer when prompt + max_tokens exceed max_model_len: a 400, never a shortened
        reply (measured: 4,000 prompt tokens + 256 asked at max_model_len 4096 is refused)."""
        length = self.settings.max_model_len
        if limit is not None and limit > length:
            return _error(
                400,
                _validation(
                    f"max_tokens={limit} cannot be greater than max_model_len=max_total_tokens="
                    f"{length}. Please request fewer output tokens.",
                    "max_tokens",
                    limit,
                ),
                param="max_tokens",
            )
        asked = limit if limit is not None else (0 if chat else 16)
        if prompt + max(asked, 1) <= length:
            return None
        if chat:
            # vLLM tokenizes a chat prompt only up to what could fit, so it knows a lower bound.
            seen = min(prompt, length - asked + 1)
            contains, total = f"at least {seen}", f"at least {seen + asked}"
        else:
            seen, contains, total = prompt, str(prompt), str(prompt + asked)
        return _error(
            400,
            _validation(
                f"This model's maximum context length is {length} tokens. However, you requested {asked} output tokens "
                f"and your prompt contains {contains} input tokens, for a total of {total} tokens. Please reduce the "
                f"length of the input prompt or the number of requested output tokens.",
                "input_tokens",
                seen,
            ),
            param="input_tokens",
        )

    async def _generate(self, request: web.Request, chat: bool) -> web.StreamResponse:
        engine = self.engine
        received = asyncio.get_running_loop().time()
        if not engine.ready:
            return _error(503, "the model is still loading", "ServiceUnavailableError")
        try:
            body = await request.json(loads=json.loads)
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "request body is not valid JSON")
        parsed, problem = self._parse(body, chat)
        if problem is not None:
            return problem
        if engine.injected_failure():
            # As vLLM answers an engine error: 500 with its JSON error body, before any token.
            return _error(500, "injected failure (kneepoint sim --fail-fraction)", "InternalServerError")
        request_id, seed = engine.new_request_id(chat, request.headers.get("X-Request-Id"))
        limit = parsed["limit"]
        if limit is None:
            max_tokens = engine.natural_length(self.settings.max_model_len - parsed["prompt"])
            finish_reason = "stop"
        else:
            max_tokens, finish_reason = limit, "length"
        handle = RequestHandle(
            request_id=request_id,
            seed=seed,
            chat=chat,
            stream=parsed["stream"],
            prompt_tokens=parsed["prompt"],
            max_tokens=max_tokens,
            created=int(time.time()),
            model=parsed["model"],
            include_usage=parsed["include_usage"],
            continuous_usage=parsed["continuous_usage"],
            received_at=received,
        )
        if not handle.stream:
            return await self._respond_whole(request, handle, finish_reason)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"})
        await response.prepare(request)
        arrival = await engine.intake(handle.prompt_tokens, handle.received_at)
        engine.submit(handle, finish_reason, arrival)
        try:
            while True:
                chunks = await handle.next_chunks()
                if chunks:
                    if handle.first_write_at is None and handle.output_tokens:
                        handle.first_write_at = engine.loop_time()
                    await response.write(b"".join(chunks))
                if handle.finished and not handle.pending:
                    break
                if handle.aborted:
                    return response
            await response.write_eof()
        except (ConnectionResetError, asyncio.CancelledError):
            engine.abort(handle)
            raise
        return response

    async def _respond_whole(self, request: web.Request, handle: RequestHandle, finish_reason: str) -> web.Response:
        engine = self.engine
        arrival = await engine.intake(handle.prompt_tokens, handle.received_at)
        engine.submit(handle, finish_reason, arrival)
        try:
            while not handle.finished:
                await handle.next_chunks()
                if handle.aborted:
                    return _error(500, "request aborted", "InternalServerError")
        except asyncio.CancelledError:
            engine.abort(handle)
            raise
        text = output_text(handle.seed, handle.output_tokens)
        common = {"id": handle.request_id, "created": handle.created, "model": handle.model}
        if handle.chat:
            body = {
                **common,
                "object": "chat.completion",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text, "tool_calls": []},
                        "logprobs": None,
                        "finish_reason": finish_reason,
                        "stop_reason": None,
                    }
                ],
                "usage": handle.usage(),
            }
        else:
            body = {
                **common,
                "object": "text_completion",
                "choices": [
                    {
                        "index": 0,
                        "text": text,
                        "logprobs": None,
                        "finish_reason": finish_reason,
                        "stop_reason": None,
                        "prompt_logprobs": None,
                    }
                ],
                "usage": handle.usage(),
            }
        return web.json_response(body)


class DcgmEndpoint:
    """GET /metrics in dcgm-exporter's format for the replica's simulated GPUs."""

    def __init__(self, engine: Engine) -> None:
        s = engine.settings
        self.engine = engine
        self.render = DcgmMetrics(
            s.gpu,
            s.gpus,
            interconnect=s.interconnect,
            hostname=s.hostname,
            power=s.perf.calibration.power,
            pod=s.pod,
            namespace=s.namespace,
            container=s.container,
        ).render

    async def metrics(self, request: web.Request) -> web.Response:
        engine = self.engine
        now = asyncio.get_running_loop().time()
        body = self.render(
            used_bytes_per_gpu=engine.memory_used_bytes(),
            rates=engine.telemetry.rates(now),
            link_bytes_total=engine.telemetry.link_bytes_total,
        )
        return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


# --------------------------------------------------------------------------------------------
# Running it


async def start(settings: SimulatorSettings) -> tuple[Engine, list[web.AppRunner], asyncio.Task[None]]:
    """Start the engine loop and both HTTP servers; returns what :func:`stop` needs."""
    engine = Engine(settings)
    task = asyncio.create_task(engine.run())
    app = web.Application(client_max_size=64 * 1024**2)
    app.add_routes(Api(engine).routes())
    if engine.profiler is not None:
        app.add_routes(profiler_routes(engine.profiler))
    runners = []
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, settings.host, settings.port, reuse_address=True).start()
    runners.append(runner)
    if settings.dcgm_port:
        dcgm_app = web.Application()
        dcgm_app.add_routes([web.get("/metrics", DcgmEndpoint(engine).metrics)])
        dcgm_runner = web.AppRunner(dcgm_app, access_log=None, handle_signals=False)
        await dcgm_runner.setup()
        await web.TCPSite(dcgm_runner, settings.host, settings.dcgm_port, reuse_address=True).start()
        runners.append(dcgm_runner)
    return engine, runners, task


async def stop(engine: Engine, runners: list[web.AppRunner], task: asyncio.Task[None]) -> None:
    """Stop serving, then the engine loop."""
    for runner in runners:
        await runner.cleanup()
    engine.stop()
    await task


async def serve_forever(settings: SimulatorSettings) -> None:
    """Run until SIGINT or SIGTERM."""
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, done.set)
    engine, runners, task = await start(settings)
    log.info("Starting vLLM API server (kneepoint sim) on http://%s:%d", settings.host, settings.port)
    if settings.dcgm_port:
        log.info("DCGM-style metrics on http://%s:%d/metrics", settings.host, settings.dcgm_port)
    # A signal during the load ends the process at once, as it ends vLLM's: waiting out the load
    # would keep a deleted pod's engine (and its GPUs) alive that long.
    if settings.startup is not None:
        loaded = await run_startup(replace(settings.startup, load_seconds=settings.model_load_seconds), done)
    else:
        try:
            await asyncio.wait_for(done.wait(), settings.model_load_seconds)
        except TimeoutError:
            pass
        loaded = not done.is_set()
    if loaded:
        await done.wait()
    log.info("Shutting down (pid %d)", os.getpid())
    await stop(engine, runners, task)
