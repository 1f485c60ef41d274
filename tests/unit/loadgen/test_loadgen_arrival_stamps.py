"""Chunks are timed when the connection received them, not when the coroutine read them."""

from __future__ import annotations

import asyncio
import time

from kneepoint.loadgen.http_client import ArrivalStampingHandler, make_session

HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


async def test_only_body_bytes_are_stamped_and_the_first_unread_arrival_is_kept() -> None:
    protocol = ArrivalStampingHandler(loop=asyncio.get_running_loop())
    protocol.set_response_params()
    protocol.data_received(HEAD)
    assert protocol.arrival is None  # headers alone carry no token
    before = time.perf_counter()
    protocol.data_received(b"5\r\nhello\r\n")
    assert protocol.arrival is not None
    payload, first = protocol.arrival
    assert before <= first <= time.perf_counter() and payload.total_bytes == 5
    protocol.data_received(b"5\r\nworld\r\n")
    assert protocol.arrival == (payload, first)  # still unread: the earlier arrival counts
    protocol.arrival = None  # what the reader does after draining
    protocol.data_received(b"1\r\n!\r\n")
    assert protocol.arrival is not None and protocol.arrival[1] > first


async def test_body_bytes_in_the_headers_segment_are_stamped() -> None:
    protocol = ArrivalStampingHandler(loop=asyncio.get_running_loop())
    protocol.set_response_params()
    protocol.data_received(HEAD + b"5\r\nhello\r\n")
    assert protocol.arrival is not None and protocol.arrival[0].total_bytes == 5


async def test_sessions_use_the_stamping_protocol() -> None:
    session = make_session(4, {}, 10.0)
    try:
        assert isinstance(session.connector._factory(), ArrivalStampingHandler)  # type: ignore[union-attr]
    finally:
        await session.close()
