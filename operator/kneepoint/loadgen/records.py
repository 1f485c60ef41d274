"""What one request measured, and the error kinds a request can end with.

Records are plain data so that worker processes can send them to the parent (pickle) and
``--save-json`` can write them; every aggregate is computed later from these raw records.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

# Error kinds. A failed request carries exactly one; the summary counts them per kind.
CONNECT = "connect"  # no TCP connection (refused, unreachable, name not resolved)
TIMEOUT = "timeout"  # --timeout passed before the response ended
HTTP_4XX = "http_4xx"  # the server answered 400-499
HTTP_5XX = "http_5xx"  # the server answered 500-599
MALFORMED_SSE = "malformed_sse"  # a stream line or payload that is not OpenAI-style SSE
MALFORMED_RESPONSE = "malformed_response"  # a non-streaming body that is not a completion
EARLY_CLOSE = "early_close"  # the connection closed before `data: [DONE]` (or the full body)
STREAM_ERROR = "stream_error"  # the stream carried an {"error": ...} object
SHORT_OUTPUT = "short_output"  # fewer output tokens than max_tokens: ignore_eos not honoured
OTHER = "other"  # anything else (the message names the exception)

ERROR_KINDS = (
    CONNECT,
    TIMEOUT,
    HTTP_4XX,
    HTTP_5XX,
    MALFORMED_SSE,
    MALFORMED_RESPONSE,
    EARLY_CLOSE,
    STREAM_ERROR,
    SHORT_OUTPUT,
    OTHER,
)


@dataclass
class RequestRecord:
    """One request's measurements. Times in seconds; ``start`` is wall time (epoch seconds).

    ``start`` comes from a perf_counter anchored to the wall clock once per process, so
    records of several processes share one time base; durations are perf_counter
    differences inside one request and never see wall-clock steps.
    """

    index: int
    """Position of the request in its phase (0-based)."""
    start: float
    """Wall time just before the POST was sent."""
    input_tokens_asked: int
    output_tokens_asked: int
    ttft: float | None = None
    """Start to the first chunk carrying output text (streaming only)."""
    latency: float | None = None
    """Start to the last output chunk (streaming) or to the full body (non-streaming)."""
    itl: list[float] = field(default_factory=list)
    """Gaps between consecutive output chunks."""
    input_tokens: int | None = None
    """usage.prompt_tokens as the server reported it."""
    output_tokens: int | None = None
    """usage.completion_tokens, or the number of output chunks when usage is missing."""
    output_tokens_from_usage: bool = True
    error: str | None = None
    """One of ERROR_KINDS, or None when the request succeeded."""
    message: str | None = None
    """Short description of the error (status line, exception, offending line)."""
    end: float | None = None
    """Wall time the request finished (success or failure)."""
    worker: int = 0
    response_id: str | None = None
    """The ``id`` of the first streamed chunk, to join with server-side logs (streaming only)."""

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tpot(self) -> float | None:
        """(latency - TTFT) / (output tokens - 1), as vLLM bench; None with < 2 tokens."""
        if self.ttft is None or self.latency is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.latency - self.ttft) / (self.output_tokens - 1)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict: times in milliseconds (rounded to microseconds)."""
        data = asdict(self)
        for key in ("ttft", "latency"):
            value = data.pop(key)
            data[f"{key}Ms"] = None if value is None else round(value * 1000.0, 3)
        data["itlMs"] = [round(x * 1000.0, 3) for x in data.pop("itl")]
        tpot = self.tpot
        data["tpotMs"] = None if tpot is None else round(tpot * 1000.0, 3)
        return {_camel(k): v for k, v in data.items()}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)
