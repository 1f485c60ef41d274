"""The floor: a closed-loop client that does almost nothing but read bytes, for kneepoint sim only.

It shows how much of a client's TTFT error comes from the machine and the server rather
than from the client. Each stream is one asyncio connection with hand-written HTTP/1.1
keep-alive chat requests (the same body the simulator counts as the prompt, an
``X-Request-Id`` header so the simulator's truth log names the request); it takes the time
of the first read holding a token chunk (``{"content":"`` opens only the simulator's token
deltas; the role chunk starts with ``"role"``) and counts token chunks until ``[DONE]`` and
the end of the chunked body. No SSE or JSON parsing, no statistics in the loop: whatever
TTFT error this client shows, the machine and the simulator's HTTP path put there, and no
Python client on the same machine can do better.

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

from kneepoint.loadgen.workload import SYNTHETIC_WORDS  # noqa: E402

TOKEN_MARK = b'{"content":"'
END_MARK = b"data: [DONE]\n\n\r\n0\r\n\r\n"


def body(model: str, input_len: int, output_len: int, index: int) -> bytes:
    # The load generator's words: one simulator token each; seeded per request.
    words = " ".join(random.Random(index).choices(SYNTHETIC_WORDS, k=input_len))
    return json.dumps({"model": model, "messages": [{"role": "user", "content": words}], "stream": True,
                       "max_completion_tokens": output_len, "ignore_eos": True,
                       "stream_options": {"include_usage": True}}, separators=(",", ":")).encode()


async def stream(port: int, requests: list[tuple[str, bytes]], counter: list[int], records: list[dict],
                 base: tuple[float, float]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    wall0, perf0 = base
    try:
        while counter[0] < len(requests):
            rid, payload = requests[counter[0]]
            counter[0] += 1
            head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                    f"X-Request-Id: {rid}\r\nContent-Length: {len(payload)}\r\n\r\n").encode()
            start = time.perf_counter()
            writer.write(head + payload)
            first = None
            tokens = 0
            tail = b""
            while True:
                data = await reader.read(262144)
                now = time.perf_counter()
                if not data:
                    return
                hits = data.count(TOKEN_MARK)
                if hits and first is None:
                    first = now
                tokens += hits
                tail = (tail + data)[-len(END_MARK):]
                if tail == END_MARK:
                    break
            if rid.startswith("m-"):
                records.append({"id": f"chatcmpl-{rid}", "start": wall0 + start - perf0, "end": wall0 + now - perf0,
                                "ttftMs": None if first is None else (first - start) * 1000.0, "outputTokens": tokens})
    finally:
        writer.close()


async def phase(port: int, concurrency: int, requests: list[tuple[str, bytes]], records: list[dict]) -> None:
    counter = [0]
    base = (time.time(), time.perf_counter())
    await asyncio.gather(*(stream(port, requests, counter, records, base) for _ in range(concurrency)))


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
