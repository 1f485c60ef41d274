"""A small OpenAI-compatible server on 127.0.0.1 whose behaviour each request chooses.

The request's ``model`` picks the behaviour, so one server serves every test:
  ok           stream (or answer) after ``ttft_ms``, one token per chunk every ``itl_ms``
  split        like ok, but every SSE event is written a few bytes at a time, with
               comments and CRLF line ends (exercises the incremental parser)
  http500      answers 500          http400    answers 400
  malformed    a stream whose second event is not JSON
  early        two tokens, then the connection is cut mid-body
  nodone       every token, then a clean end of body without `data: [DONE]`
  hang         never answers (the client's --timeout fires)
  short        ignores ignore_eos: half the asked tokens
  streamerr    one token, then `data: {"error": ...}`
  mixed-N      every N-th request (by arrival) answers 500, the others as ok
Prompt tokens are counted as words; chat adds ``CHAT_TEMPLATE_TOKENS`` like a template.

Run it alone: ``python tests/unit/loadgen/loadgen_stub_server.py --port 8123 --ttft-ms 50``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json

from aiohttp import web

CHAT_TEMPLATE_TOKENS = 7


class StubServer:
    """Holds the timing knobs and the arrival counter; ``app()`` builds the aiohttp app."""

    def __init__(self, ttft_ms: float = 20.0, itl_ms: float = 2.0) -> None:
        self.ttft_ms = ttft_ms
        self.itl_ms = itl_ms
        self.arrivals = itertools.count()
        self.seen_bodies: list[dict] = []

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/completions", self.handle)
        app.router.add_post("/v1/chat/completions", self.handle)
        app.router.add_get("/v1/models", self.models)
        return app

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "ok", "object": "model"}]})

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.seen_bodies.append(body)
        arrival = next(self.arrivals)
        chat = request.path.endswith("/chat/completions")
        model = body["model"]
        asked = body.get("max_completion_tokens") if chat else body.get("max_tokens")
        prompt = body["messages"][0]["content"] if chat else body["prompt"]
        prompt_tokens = len(prompt.split()) + (CHAT_TEMPLATE_TOKENS if chat else 0)
        if model.startswith("mixed-"):
            model = "http500" if arrival % int(model.split("-")[1]) == 0 else "ok"
        if model == "http500":
            return web.json_response({"error": {"message": "engine dead"}}, status=500)
        if model == "http400":
            return web.json_response({"error": {"message": "bad request"}}, status=400)
        if model == "hang":
            await asyncio.sleep(60)
        tokens = asked // 2 if model == "short" else asked
        await asyncio.sleep(self.ttft_ms / 1000.0)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": tokens, "total_tokens": prompt_tokens + tokens}
        if not body.get("stream"):
            choice = (
                {"index": 0, "message": {"role": "assistant", "content": "w " * tokens}} if chat else {"index": 0, "text": "w " * tokens}
            )
            return web.json_response({"choices": [choice], "usage": usage})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for index in range(tokens):
            if index:
                await asyncio.sleep(self.itl_ms / 1000.0)
            if model == "malformed" and index == 1:
                await response.write(b"data: {this is not json\n\n")
                return response
            if model == "early" and index == 2:
                request.transport.close()  # type: ignore[union-attr]
                return response
            if model == "streamerr" and index == 1:
                await response.write(b'data: {"error": {"message": "KV cache exhausted", "code": 500}}\n\n')
                await response.write(b"data: [DONE]\n\n")
                return response
            delta = {"delta": {"content": f" t{index}"}} if chat else {"text": f" t{index}"}
            event = b"data: " + json.dumps({"choices": [dict(index=0, **delta)]}).encode() + b"\n\n"
            if model == "split":
                event = b": keep-alive\r\n" + event.replace(b"\n", b"\r\n")
                for start in range(0, len(event), 5):
                    await response.write(event[start : start + 5])
            else:
                await response.write(event)
        if body.get("stream_options", {}).get("include_usage"):
            await response.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        if model != "nodone":
            await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def start_stub(server: StubServer, port: int = 0) -> tuple[web.AppRunner, int]:
    """Serve on 127.0.0.1 (port 0 = any free port); returns the runner and the port."""
    # handler_cancellation: a client that gives up (timeout) ends the "hang" handler too.
    runner = web.AppRunner(server.app(), access_log=None, handler_cancellation=True, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    sockets = site._server.sockets  # type: ignore[union-attr]
    return runner, sockets[0].getsockname()[1]


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--itl-ms", type=float, default=2.0)
    args = parser.parse_args()
    web.run_app(StubServer(args.ttft_ms, args.itl_ms).app(), host="127.0.0.1", port=args.port, access_log=None)


if __name__ == "__main__":
    _main()
