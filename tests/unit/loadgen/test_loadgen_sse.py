"""SSE decoding and OpenAI chunk interpretation (pure, no sockets)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kneepoint.loadgen.sse import (
    CompletionStream,
    MalformedBody,
    MalformedStream,
    SSEDecoder,
    SSEEvent,
    StreamErrorPayload,
    parse_completion_body,
    usage_tokens,
)


def _stream(*chunks: dict | str) -> bytes:
    parts = []
    for chunk in chunks:
        payload = chunk if isinstance(chunk, str) else json.dumps(chunk)
        parts.append(f"data: {payload}\n\n")
    return "".join(parts).encode()


VLLM_LIKE = _stream(
    {"choices": [{"index": 0, "text": "Hello"}]},
    {"choices": [{"index": 0, "text": " wörld"}]},
    {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 2, "total_tokens": 14}},
    "[DONE]",
)


def _decode_all(pieces: list[bytes]) -> list[SSEEvent]:
    decoder = SSEDecoder()
    events = []
    for piece in pieces:
        events += decoder.feed(piece)
    return events + decoder.close()


def test_whole_stream() -> None:
    events = _decode_all([VLLM_LIKE])
    assert [e.data for e in events][-1] == "[DONE]"
    assert len(events) == 4


def test_byte_by_byte_equals_whole() -> None:
    pieces = [VLLM_LIKE[i : i + 1] for i in range(len(VLLM_LIKE))]
    assert _decode_all(pieces) == _decode_all([VLLM_LIKE])


@given(st.lists(st.integers(min_value=1, max_value=len(VLLM_LIKE) - 1), max_size=12))
def test_any_split_equals_whole(cuts: list[int]) -> None:
    points = [0, *sorted(set(cuts)), len(VLLM_LIKE)]
    pieces = [VLLM_LIKE[a:b] for a, b in zip(points, points[1:])]
    assert _decode_all(pieces) == _decode_all([VLLM_LIKE])


def test_crlf_split_between_chunks_and_comments() -> None:
    raw = b': keep-alive\r\ndata: {"choices": []}\r\n\r\nevent: x\r\nid: 3\r\nretry: 10\r\ndata: [DONE]\r\n\r\n'
    cut = raw.index(b"\r\n") + 1  # CR in one chunk, LF in the next
    events = _decode_all([raw[:cut], raw[cut:]])
    assert [e.data for e in events] == ['{"choices": []}', "[DONE]"]
    assert events[1].event == "x"


def test_multiline_data_and_no_space_after_colon() -> None:
    events = _decode_all([b"data:one\ndata: two\n\n"])
    assert events == [SSEEvent("one\ntwo")]


def test_last_event_without_blank_line_is_flushed_on_close() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: [DONE]") == []
    assert decoder.close() == [SSEEvent("[DONE]")]


def test_unknown_field_is_malformed() -> None:
    with pytest.raises(MalformedStream):
        SSEDecoder().feed(b"garbage line\n")
    with pytest.raises(MalformedStream):
        SSEDecoder().feed(b'{"choices": []}\n')


def test_invalid_utf8_is_malformed() -> None:
    with pytest.raises(MalformedStream):
        SSEDecoder().feed(b"data: \xff\xfe\n\n")


def test_utf8_character_split_across_chunks() -> None:
    raw = "data: wörld\n\n".encode()
    cut = raw.index("ö".encode()) + 1
    assert _decode_all([raw[:cut], raw[cut:]]) == [SSEEvent("wörld")]


def _run(events: list[SSEEvent], times: list[float]) -> CompletionStream:
    state = CompletionStream()
    for event, now in zip(events, times):
        state.on_event(event, now)
    return state


def test_completion_stream_timings_and_usage() -> None:
    state = _run(_decode_all([VLLM_LIKE]), [1.0, 1.25, 1.3, 1.31])
    assert state.done
    assert (state.first_output_at, state.last_output_at) == (1.0, 1.25)
    assert state.gaps == [0.25]
    assert state.output_chunks == 2
    assert usage_tokens(state.usage) == (12, 2)


def test_chat_role_chunk_is_not_output_but_reasoning_is() -> None:
    raw = _stream(
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}}]},
        {"choices": [{"index": 0, "delta": {"content": "ok"}}]},
        "[DONE]",
    )
    state = _run(_decode_all([raw]), [0.5, 0.7, 0.8, 0.9])
    assert state.first_output_at == 0.7
    assert state.output_chunks == 2


def test_response_id_is_the_first_chunks_id() -> None:
    raw = _stream(
        {"id": "chatcmpl-a", "choices": [{"index": 0, "delta": {"content": "x"}}]},
        {"id": "chatcmpl-b", "choices": [{"index": 0, "delta": {"content": "y"}}]},
        "[DONE]",
    )
    assert _run(_decode_all([raw]), [0.1, 0.2, 0.3]).response_id == "chatcmpl-a"
    assert _run(_decode_all([VLLM_LIKE]), [1.0, 1.25, 1.3, 1.31]).response_id is None


@pytest.mark.parametrize(
    "payload",
    ["{not json", "[1, 2]", '{"id": "x"}', '{"choices": 3}', '{"choices": ["text"]}'],
)
def test_malformed_payloads(payload: str) -> None:
    with pytest.raises(MalformedStream):
        CompletionStream().on_event(SSEEvent(payload), 0.0)


def test_error_payload() -> None:
    with pytest.raises(StreamErrorPayload, match="KV cache"):
        CompletionStream().on_event(SSEEvent('{"error": {"message": "KV cache exhausted"}}'), 0.0)


def test_nothing_after_done_counts() -> None:
    state = _run([SSEEvent("[DONE]"), SSEEvent('{"choices": [{"text": "late"}]}')], [0.0, 1.0])
    assert state.output_chunks == 0


def test_non_streaming_body() -> None:
    text, usage = parse_completion_body(
        b'{"choices": [{"message": {"role": "assistant", "content": "hi"}}], "usage": {"prompt_tokens": 3, "completion_tokens": 1}}'
    )
    assert text == "hi" and usage_tokens(usage) == (3, 1)
    for body in (b"oops", b"[]", b'{"choices": []}'):
        with pytest.raises(MalformedBody):
            parse_completion_body(body)


def test_usage_tokens_ignores_wrong_types() -> None:
    assert usage_tokens({"prompt_tokens": "12", "completion_tokens": True}) == (None, None)
    assert usage_tokens(None) == (None, None)


def test_payload_whitespace_is_allowed_and_trailing_garbage_is_not() -> None:
    state = _run([SSEEvent('  {"choices": [{"text": "a"}]}  '), SSEEvent(" [DONE] ")], [0.0, 1.0])
    assert state.output_chunks == 1 and state.done
    with pytest.raises(MalformedStream):
        CompletionStream().on_event(SSEEvent('{"choices": []} x'), 0.0)
