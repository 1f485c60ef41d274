"""Server-sent events as OpenAI-compatible servers stream them, parsed incrementally.

Two layers, both pure: ``SSEDecoder`` turns arbitrary byte chunks (a line may be split
anywhere, even inside a CRLF or a UTF-8 character) into events per the WHATWG rules;
``CompletionStream`` reads those events as OpenAI completion/chat chunks and keeps the
times of chunks that carry output, the usage block and whether ``data: [DONE]`` arrived.

Strictness, chosen so a broken server or proxy shows up as ``malformed_sse`` instead of
silently wrong numbers: comment lines (``:...``) and the standard fields ``event``, ``id``
and ``retry`` are accepted and ignored; any other field name, a payload that is not JSON,
or JSON without ``choices``/``usage`` is an error. (The SSE spec would ignore unknown
fields; no OpenAI-compatible server sends them.)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

_IGNORED_FIELDS = frozenset({"event", "id", "retry"})
_DECODER = json.JSONDecoder()
# A line longer than this without a line break is a broken server, not a big chunk.
MAX_LINE_BYTES = 16 * 1024 * 1024


class MalformedStream(ValueError):
    """The byte stream is not OpenAI-style SSE (bad line, non-JSON payload, wrong shape)."""


class StreamErrorPayload(RuntimeError):
    """The server sent ``data: {"error": ...}`` inside the stream."""


class MalformedBody(ValueError):
    """A non-streaming response body is not a completion object."""


class SSEEvent(NamedTuple):
    """One dispatched event: its data lines joined with newlines.

    A NamedTuple rather than a frozen dataclass: one is built per streamed token, and a
    tuple is several times cheaper to create.
    """

    data: str
    event: str | None = None


class SSEDecoder:
    """Incremental SSE decoder: ``feed`` bytes as they arrive, ``close`` at end of stream."""

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._data: list[str] = []
        self._event: str | None = None

    def feed(self, chunk: bytes) -> list[SSEEvent]:
        """Consume ``chunk``; return the events completed by it (possibly none)."""
        self._buffer += chunk
        events: list[SSEEvent] = []
        buffer = self._buffer
        if b"\r" not in buffer:
            # The common case (every OpenAI-compatible server ends lines with LF): split the
            # complete lines at once instead of searching line by line.
            last = buffer.rfind(b"\n")
            if last >= 0:
                lines = buffer[:last].split(b"\n")
                del buffer[: last + 1]
                take = self._take_line
                for raw in lines:
                    take(raw, events)
            if len(buffer) > MAX_LINE_BYTES:
                raise MalformedStream(f"a line longer than {MAX_LINE_BYTES} bytes without a line break")
            return events
        start = 0
        size = len(buffer)
        while start < size:
            newline = buffer.find(b"\n", start)
            carriage = buffer.find(b"\r", start, newline if newline >= 0 else size)
            if carriage >= 0:
                if carriage + 1 == size:
                    break  # a lone CR at the end may be the first half of CRLF
                end, after = carriage, carriage + (2 if buffer[carriage + 1] == 0x0A else 1)
            elif newline >= 0:
                end, after = newline, newline + 1
            else:
                break
            self._take_line(bytes(buffer[start:end]), events)
            start = after
        del buffer[:start]
        if len(buffer) > MAX_LINE_BYTES:
            raise MalformedStream(f"a line longer than {MAX_LINE_BYTES} bytes without a line break")
        return events

    def close(self) -> list[SSEEvent]:
        """End of stream: flush a last unterminated line and a pending event.

        Lenient on purpose: a final ``data: [DONE]`` without the blank line after it
        still counts, so the stream is judged complete or not by its content.
        """
        events: list[SSEEvent] = []
        if self._buffer:
            line = bytes(self._buffer.rstrip(b"\r"))
            self._buffer.clear()
            self._take_line(line, events)
        self._dispatch(events)
        return events

    def _take_line(self, raw: bytes | bytearray, events: list[SSEEvent]) -> None:
        if not raw:
            self._dispatch(events)
            return
        if raw.startswith(b"data: "):  # the line almost every event is made of
            try:
                self._data.append(raw[6:].decode("utf-8"))
            except UnicodeDecodeError as error:
                raise MalformedStream(f"a line that is not UTF-8: {bytes(raw[:60])!r}") from error
            return
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as error:
            raise MalformedStream(f"a line that is not UTF-8: {bytes(raw[:60])!r}") from error
        if line.startswith(":"):
            return  # comment / keep-alive
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name in _IGNORED_FIELDS:
            return
        else:
            raise MalformedStream(f"not an SSE field line: {line[:80]!r}")

    def _dispatch(self, events: list[SSEEvent]) -> None:
        data = self._data
        if data:
            events.append(SSEEvent(data[0] if len(data) == 1 else "\n".join(data), self._event))
            self._data = []
        self._event = None


def chunk_output_text(choice: Any) -> str:
    """Output text carried by one choice of a completion or chat chunk ('' when none).

    Completions put text in ``text``; chat puts it in ``delta.content``; reasoning models
    stream ``delta.reasoning_content`` (or ``reasoning``) before the answer, which is
    output as well (vLLM bench counts it too).
    """
    if not isinstance(choice, dict):
        raise MalformedStream(f"a choice that is not an object: {str(choice)[:80]}")
    text = choice.get("text")
    if isinstance(text, str) and text:
        return text
    delta = choice.get("delta")
    if isinstance(delta, dict):
        for key in ("content", "reasoning_content", "reasoning"):
            value = delta.get(key)
            if isinstance(value, str) and value:
                return value
    message = choice.get("message")
    if isinstance(message, dict):
        value = message.get("content")
        if isinstance(value, str) and value:
            return value
    return ""


@dataclass
class CompletionStream:
    """State of one streamed completion, fed one SSE event at a time with its arrival time."""

    done: bool = False
    first_output_at: float | None = None
    last_output_at: float | None = None
    gaps: list[float] = field(default_factory=list)
    output_chunks: int = 0
    usage: dict[str, Any] | None = None
    response_id: str | None = None
    """``id`` of the first chunk (OpenAI's completion id), for joining with server logs."""

    def on_event(self, event: SSEEvent, now: float) -> None:
        """Apply one event received at ``now`` (perf_counter seconds).

        Raises MalformedStream for a payload that is not a chunk, StreamErrorPayload when
        the server reports an error inside the stream.
        """
        payload = event.data
        if payload == "[DONE]" or payload.strip() == "[DONE]":
            self.done = True
            return
        if self.done:
            return  # nothing after [DONE] counts
        if payload[:1].isspace():
            payload = payload.lstrip()
        try:
            # raw_decode skips json.loads' two whitespace regexes per call; surrounding
            # whitespace is allowed and trailing garbage refused, as json.loads does.
            chunk, end = _DECODER.raw_decode(payload)
            if end != len(payload) and payload[end:].strip():
                raise ValueError("extra data")
        except ValueError as error:
            raise MalformedStream(f"data that is not JSON: {payload[:80]!r}") from error
        if not isinstance(chunk, dict):
            raise MalformedStream(f"data that is not a JSON object: {payload[:80]!r}")
        if "error" in chunk:
            raise StreamErrorPayload(_error_message(chunk["error"]))
        usage = chunk.get("usage")
        choices = chunk.get("choices")
        if choices is None and usage is None:
            raise MalformedStream(f"a chunk with neither choices nor usage: {payload[:80]!r}")
        if isinstance(usage, dict):
            self.usage = usage
        if self.response_id is None:
            rid = chunk.get("id")
            if isinstance(rid, str):
                self.response_id = rid
        if choices:
            if not isinstance(choices, list):
                raise MalformedStream(f"choices that is not a list: {payload[:80]!r}")
            # TTFT waits for output text (a chat stream's role-only first chunk is not output). After it,
            # every chunk with a choice is one engine step's delta, empty text included (vLLM sends those,
            # e.g. a token that decodes to nothing yet, or a finish_reason-only last chunk): it ends a gap
            # and moves E2E, as vLLM bench counts it, so TPOT and ITL agree on the same server.
            if chunk_output_text(choices[0]):
                if self.last_output_at is None:
                    self.first_output_at = now
                else:
                    self.gaps.append(now - self.last_output_at)
                self.last_output_at = now
                self.output_chunks += 1
            elif self.last_output_at is not None:
                self.gaps.append(now - self.last_output_at)
                self.last_output_at = now
                self.output_chunks += 1


def usage_tokens(usage: dict[str, Any] | None) -> tuple[int | None, int | None]:
    """(prompt_tokens, completion_tokens) from a usage block; None for what is missing."""
    if not isinstance(usage, dict):
        return None, None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (
        prompt if isinstance(prompt, int) and not isinstance(prompt, bool) else None,
        completion if isinstance(completion, int) and not isinstance(completion, bool) else None,
    )


def parse_completion_body(body: bytes) -> tuple[str, dict[str, Any] | None]:
    """(output text, usage) of a non-streaming completion or chat response body."""
    try:
        data = json.loads(body)
    except ValueError as error:
        raise MalformedBody(f"a body that is not JSON: {body[:80]!r}") from error
    if not isinstance(data, dict):
        raise MalformedBody(f"a body that is not a JSON object: {body[:80]!r}")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise MalformedBody(f"a body without choices: {body[:80]!r}")
    try:
        text = chunk_output_text(choices[0])
    except MalformedStream as error:
        raise MalformedBody(str(error)) from error
    usage = data.get("usage")
    return text, usage if isinstance(usage, dict) else None


def _error_message(error: Any) -> str:
    if isinstance(error, dict):
        return str(error.get("message") or error)[:200]
    return str(error)[:200]
