"""aiohttp side of the load generator: the session, ``--resolve``, and sending one request.

``send_request`` never raises for a bad server: every failure (no connection, HTTP error,
timeout, broken stream, early close, short output) ends up as an error kind on the
request's record, so the run continues and the summary counts failures per kind.

Timing follows vLLM bench: the clock starts just before the POST (time.perf_counter);
TTFT is taken when the first chunk carrying output text arrives; each later output chunk
adds one inter-token gap; latency ends at the last output chunk.

"Arrives" means when the connection's protocol received the bytes, not when the request's
coroutine got round to reading them. At high concurrency many streams get a token in the
same engine step; the event loop hands all their bytes to the protocols first and only then
resumes the coroutines one by one, so a coroutine-side clock would add the parsing of every
stream ahead in the queue to each TTFT (about 8 ms at 256 streams on the development
machine). ``ArrivalStampingHandler`` notes, per connection, when unread response-body bytes
first came in, and ``_read_stream`` uses that time for the chunk it reads.
"""

from __future__ import annotations

import functools
import json
import socket
import time
from collections.abc import Mapping
from typing import Any, cast

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.client_proto import ResponseHandler

from kneepoint.loadgen import records as kinds
from kneepoint.loadgen.records import RequestRecord
from kneepoint.loadgen.sse import (
    CompletionStream,
    MalformedBody,
    MalformedStream,
    SSEDecoder,
    StreamErrorPayload,
    parse_completion_body,
    usage_tokens,
)

_JSON_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream, application/json"}


class ResolveRulesResolver(AbstractResolver):
    """curl-like ``--resolve``: (host, port) pairs answer with a fixed address; others use DNS."""

    def __init__(self, rules: Mapping[tuple[str, int], str], fallback: AbstractResolver | None = None) -> None:
        self._rules = dict(rules)
        self._fallback = fallback if fallback is not None else aiohttp.ThreadedResolver()

    async def resolve(self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        address = self._rules.get((host.lower(), port))
        if address is None:
            return await self._fallback.resolve(host, port, family)
        address_family = socket.AF_INET6 if ":" in address else socket.AF_INET
        return [
            {
                "hostname": host,
                "host": address,
                "port": port,
                "family": address_family,
                "proto": 0,
                "flags": socket.AI_NUMERICHOST,
            }
        ]

    async def close(self) -> None:
        await self._fallback.close()


class Clock:
    """perf_counter anchored once to wall time, so processes share one time base."""

    def __init__(self) -> None:
        self._wall = time.time()
        self._perf = time.perf_counter()

    def wall(self, perf: float) -> float:
        """Wall time (epoch seconds) of a perf_counter reading."""
        return self._wall + (perf - self._perf)


class ArrivalStampingHandler(ResponseHandler):
    """aiohttp's connection protocol, noting when unread body bytes first arrived.

    ``arrival`` is (the response's body reader, perf_counter time) of the first
    ``data_received`` that added body bytes since the reader last took it; the reader
    clears it after each read. It relies on ``ResponseHandler._payload`` (aiohttp is pinned);
    without it no stamp is made and reads are timed as they happen, as before.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.arrival: tuple[object, float] | None = None

    def data_received(self, data: bytes) -> None:
        if not data:  # aiohttp resuming its parser after each chunk it hands out: nothing arrived
            super().data_received(data)
            return
        now = time.perf_counter()
        before = getattr(self, "_payload", None)
        count = before.total_bytes if before is not None else 0
        super().data_received(data)
        after = getattr(self, "_payload", None)
        if after is None or (after.total_bytes == count and after is before) or not after.total_bytes:
            return  # no body bytes came in (headers only, or nothing parsed)
        if self.arrival is None or self.arrival[0] is not after:
            self.arrival = (after, now)


class StampingConnector(aiohttp.TCPConnector):
    """TCPConnector whose connections use :class:`ArrivalStampingHandler`."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # A partial that makes ResponseHandlers (of our subclass): what aiohttp's attribute holds.
        self._factory = cast("functools.partial[ResponseHandler]", functools.partial(ArrivalStampingHandler, loop=self._loop))


def make_session(connections: int, rules: Mapping[tuple[str, int], str], timeout_s: float) -> aiohttp.ClientSession:
    """A session for one process: keep-alive connections, ``--resolve`` rules, total timeout per request."""
    connector = StampingConnector(
        limit=max(1, connections),
        limit_per_host=max(1, connections),
        resolver=ResolveRulesResolver(rules),
        ttl_dns_cache=300,
        keepalive_timeout=60,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=timeout_s),
        # The server's own headers are not ours to police; big ones are still bounded.
        read_bufsize=2**16,
    )


def encode_body(body: Mapping[str, Any]) -> bytes:
    """JSON bytes of a request body (done before the phase, off the measured path)."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


async def send_request(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    record: RequestRecord,
    stream: bool,
    clock: Clock,
) -> RequestRecord:
    """POST ``body`` to ``url`` and fill ``record`` with timings, tokens or an error kind."""
    started = time.perf_counter()
    record.start = clock.wall(started)
    try:
        async with session.post(url, data=body, headers=_JSON_HEADERS) as response:
            if response.status >= 400:
                text = (await response.content.read(300)).decode("utf-8", "replace")
                kind = kinds.HTTP_5XX if response.status >= 500 else kinds.HTTP_4XX
                _fail(record, kind, f"HTTP {response.status} {response.reason or ''}: {text}")
            elif response.status >= 300:
                _fail(record, kinds.OTHER, f"HTTP {response.status} {response.reason or ''}")
            elif stream:
                await _read_stream(response, record, started)
            else:
                await _read_body(response, record, started)
    except TimeoutError:
        _fail(record, kinds.TIMEOUT, f"no complete response within the --timeout ({_elapsed(started):.1f} s)")
    except aiohttp.ClientConnectorError as error:
        _fail(record, kinds.CONNECT, str(error))
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError, ConnectionResetError) as error:
        _fail(record, kinds.EARLY_CLOSE, f"{type(error).__name__}: {error}")
    except aiohttp.ClientError as error:
        _fail(record, kinds.OTHER, f"{type(error).__name__}: {error}")
    except OSError as error:
        _fail(record, kinds.CONNECT, f"{type(error).__name__}: {error}")
    record.end = clock.wall(time.perf_counter())
    return record


async def _read_stream(response: aiohttp.ClientResponse, record: RequestRecord, started: float) -> None:
    decoder = SSEDecoder()
    state = CompletionStream()
    content = response.content
    connection = response.connection
    stamps = connection.protocol if connection is not None else None
    if not isinstance(stamps, ArrivalStampingHandler):
        stamps = None
    try:
        while True:
            chunk = await content.readany()
            now = time.perf_counter()
            if not chunk:  # end of body
                for event in decoder.close():
                    state.on_event(event, now)
                break
            if stamps is not None:
                arrival, stamps.arrival = stamps.arrival, None
                if arrival is not None and arrival[0] is content:
                    now = min(now, arrival[1])
            for event in decoder.feed(chunk):
                state.on_event(event, now)
            if state.done:
                break
    except MalformedStream as error:
        _fail(record, kinds.MALFORMED_SSE, str(error))
        return
    except StreamErrorPayload as error:
        _fail(record, kinds.STREAM_ERROR, str(error))
        return
    if state.first_output_at is not None and state.last_output_at is not None:
        record.ttft = state.first_output_at - started
        record.latency = state.last_output_at - started
        record.itl = state.gaps
    else:
        record.latency = time.perf_counter() - started
    record.response_id = state.response_id
    prompt_tokens, completion_tokens = usage_tokens(state.usage)
    record.input_tokens = prompt_tokens
    if completion_tokens is None:
        record.output_tokens = state.output_chunks
        record.output_tokens_from_usage = False
    else:
        record.output_tokens = completion_tokens
    if not state.done:
        _fail(record, kinds.EARLY_CLOSE, f"stream ended without data: [DONE] after {state.output_chunks} output chunks")
    else:
        _check_length(record)


async def _read_body(response: aiohttp.ClientResponse, record: RequestRecord, started: float) -> None:
    body = await response.read()
    record.latency = time.perf_counter() - started
    try:
        _, usage = parse_completion_body(body)
    except MalformedBody as error:
        _fail(record, kinds.MALFORMED_RESPONSE, str(error))
        return
    prompt_tokens, completion_tokens = usage_tokens(usage)
    record.input_tokens = prompt_tokens
    if completion_tokens is None:
        _fail(record, kinds.MALFORMED_RESPONSE, "a non-streaming response without usage.completion_tokens")
        return
    record.output_tokens = completion_tokens
    _check_length(record)


def _check_length(record: RequestRecord) -> None:
    if record.output_tokens is not None and record.output_tokens < record.output_tokens_asked:
        _fail(
            record,
            kinds.SHORT_OUTPUT,
            f"{record.output_tokens} of {record.output_tokens_asked} output tokens (ignore_eos not honoured, or the context is full)",
        )


def _fail(record: RequestRecord, kind: str, message: str) -> None:
    record.error = kind
    record.message = " ".join(message.split())[:300]


def _elapsed(started: float) -> float:
    return time.perf_counter() - started


async def first_model(session: aiohttp.ClientSession, endpoint: str) -> str:
    """The first model id listed by ``GET <endpoint>/v1/models`` (vLLM bench's default --model)."""
    url = endpoint.rstrip("/")
    url = (url if url.endswith("/v1") else url + "/v1") + "/models"
    async with session.get(url) as response:
        if response.status != 200:
            raise RuntimeError(f"GET {url} answered HTTP {response.status}")
        data = await response.json(content_type=None)
    try:
        return str(data["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        raise RuntimeError(f"GET {url} listed no model") from None
