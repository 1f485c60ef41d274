"""The simulator's HTTP side: vLLM's OpenAI-compatible API, /metrics and the DCGM endpoint.

One asyncio loop runs everything (aiohttp; measured to stream well over 20,000 tokens/s
on one core, see docs/simulator.md): these handlers and the engine loop of
:class:`~kneepoint.simulator.engine.Engine`, which plans the steps and hands the tokens
to each request's :class:`~kneepoint.simulator.engine.RequestHandle`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import time
from dataclasses import replace
from typing import Any

from aiohttp import web

from kneepoint.simulator.dcgm_metrics import DcgmMetrics
from kneepoint.simulator.engine import Engine, RequestHandle, SimulatorSettings
from kneepoint.simulator.profiler import routes as profiler_routes
from kneepoint.simulator.startup import run_startup
from kneepoint.simulator.tokens import (
    BOS_TOKENS,
    PromptError,
    count_chat_prompt,
    count_completion_prompt,
    output_text,
    token_ids,
)

log = logging.getLogger("kneepoint.sim")

VLLM_VERSION = "0.33.0"
"""The vLLM release whose API, flags and metrics the simulator follows."""


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
