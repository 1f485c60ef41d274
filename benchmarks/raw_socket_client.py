"""The floor: a closed-loop client that does almost nothing but read bytes, for kneepoint sim only.

It shows how much of a client's TTFT error comes from the machine and the server rather
than from the client. Each stream is one asyncio.Protocol connection with hand-written
HTTP/1.1 keep-alive chat requests (the same words the load generator sends, an
``X-Request-Id`` header so the simulator's truth log names the request). Everything happens
in ``data_received``, with no coroutine in between: it takes the time of the first bytes
holding a token chunk (``{"content":"`` opens only the simulator's token deltas; the role
chunk starts with ``"role"``), counts token chunks until ``[DONE]`` and the end of the
chunked body, and writes the next request from there. No SSE or JSON parsing, no statistics
in the loop: whatever TTFT error this client shows, the machine and the simulator's HTTP
path put there, and no Python client on the same machine can do much better.

    python benchmarks/raw_socket_client.py --port P --model M --concurrency C --num-requests N
        --input-len I --output-len O --warmup W --out records.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "operator"))

from kneepoint.loadgen.workload import SYNTHETIC_WORDS

TOKEN_MARK = b'{"content":"'
END_MARK = b"data: [DONE]\n\n\r\n0\r\n\r\n"


def body(model: str, input_len: int, output_len: int, index: int) -> bytes:
    # The load generator's words: one simulator token each; seeded per request.
    words = " ".join(random.Random(index).choices(SYNTHETIC_WORDS, k=input_len))
    return json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": words}],
            "stream": True,
            "max_completion_tokens": output_len,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        },
        separators=(",", ":"),
    ).encode()


class FloorStream(asyncio.Protocol):
    """One connection: sends the next request as soon as the last one's body has ended."""

    def __init__(
        self,
        requests: list[tuple[str, bytes]],
        counter: list[int],
        records: list[dict],
        base: tuple[float, float],
        done: asyncio.Future[None],
    ) -> None:
        self.requests, self.counter, self.records, self.base, self.done = requests, counter, records, base, done
        self.transport: asyncio.Transport | None = None
        self.rid, self.start, self.first, self.tokens, self.tail = "", 0.0, None, 0, b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.send_next()

    def send_next(self) -> None:
        assert self.transport is not None
        if self.counter[0] >= len(self.requests):
            self.transport.close()
            return
        self.rid, payload = self.requests[self.counter[0]]
        self.counter[0] += 1
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"X-Request-Id: {self.rid}\r\nContent-Length: {len(payload)}\r\n\r\n"
        ).encode()
        self.first, self.tokens, self.tail = None, 0, b""
        self.start = time.perf_counter()
        self.transport.write(head + payload)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        hits = data.count(TOKEN_MARK)
        if hits and self.first is None:
            self.first = now
        self.tokens += hits
        self.tail = (self.tail + data)[-len(END_MARK) :]
        if self.tail != END_MARK:
            return
        if self.rid.startswith("m-"):
            wall0, perf0 = self.base
            self.records.append(
                {
                    "id": f"chatcmpl-{self.rid}",
                    "start": wall0 + self.start - perf0,
                    "end": wall0 + now - perf0,
                    "outputTokens": self.tokens,
                    "ttftMs": None if self.first is None else (self.first - self.start) * 1000.0,
                }
            )
        self.send_next()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def phase(port: int, concurrency: int, requests: list[tuple[str, bytes]], records: list[dict]) -> None:
    loop = asyncio.get_running_loop()
    counter = [0]
    base = (time.time(), time.perf_counter())
    done = [loop.create_future() for _ in range(concurrency)]
    for future in done:
        await loop.create_connection(lambda f=future: FloorStream(requests, counter, records, base, f), "127.0.0.1", port)
    await asyncio.gather(*done)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name in ("--port", "--concurrency", "--num-requests", "--input-len", "--output-len", "--warmup"):
        parser.add_argument(name, type=int, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    warm = [(f"w-{i}", body(args.model, args.input_len, args.output_len, 10**6 + i)) for i in range(args.warmup)]
    measured = [(f"m-{i}", body(args.model, args.input_len, args.output_len, i)) for i in range(args.num_requests)]
    records: list[dict] = []
    asyncio.run(phase(args.port, args.concurrency, warm, records))
    asyncio.run(phase(args.port, args.concurrency, measured, records))
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump({"requests": records}, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
