"""The simulator's HTTP API, served for real on 127.0.0.1: vLLM's routes, SSE format, metrics text."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from kneepoint.simulator.command import build_settings, command
from kneepoint.simulator.server import start, stop

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_settings(*extra: str, load: float = 0.0):
    args = ["--model", MODEL, "-tp", "2", "--gpu", "h200", "--max-model-len", "4096", "--port", str(free_port()),
            "--dcgm-port", str(free_port()), "--model-load-seconds", str(load), "--noise", "0", *extra]
    ctx = command.make_context("sim", args)
    return build_settings(MODEL, ctx.params)


@pytest.fixture
async def sim(monkeypatch):
    monkeypatch.setenv("POD_NAME", "engine-tp2-0")
    monkeypatch.setenv("POD_NAMESPACE", "kp")
    monkeypatch.setenv("CONTAINER_NAME", "engine")
    monkeypatch.setenv("NODE_NAME", "gpu-node-1")
    settings = make_settings()
    engine, runners, task = await start(settings)
    async with aiohttp.ClientSession(f"http://127.0.0.1:{settings.port}") as session:
        yield settings, engine, session
    await stop(engine, runners, task)


async def read_sse(resp: aiohttp.ClientResponse) -> list[str]:
    """The data fields of an SSE stream, checking the event framing."""
    body = (await resp.read()).decode()
    assert body.endswith("\n\n")
    events = body.split("\n\n")[:-1]
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    return [e[len("data: "):] for e in events]


async def test_health_is_503_while_loading_then_200() -> None:
    settings = make_settings(load=0.4)
    engine, runners, task = await start(settings)
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{settings.port}") as session:
            async with session.get("/health") as resp:
                assert resp.status == 503
            async with session.post("/v1/completions", json={"prompt": "hi"}) as resp:
                assert resp.status == 503
            await asyncio.sleep(0.5)
            async with session.get("/health") as resp:
                assert resp.status == 200
    finally:
        await stop(engine, runners, task)


async def test_models_lists_the_served_name_with_max_model_len(sim) -> None:
    settings, _, session = sim
    async with session.get("/v1/models") as resp:
        body = await resp.json()
    assert body["object"] == "list"
    [card] = body["data"]
    assert card["id"] == MODEL and card["root"] == MODEL and card["max_model_len"] == 4096


async def test_streaming_completion_sse_with_usage_chunk_and_done(sim) -> None:
    _, _, session = sim
    payload = {"model": MODEL, "prompt": [1] * 100, "max_tokens": 12, "stream": True, "ignore_eos": True,
               "stream_options": {"include_usage": True}}
    async with session.post("/v1/completions", json=payload) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        data = await read_sse(resp)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    tokens, usage = chunks[:-1], chunks[-1]
    assert len(tokens) == 12
    assert all(c["object"] == "text_completion" and c["model"] == MODEL and len(c["choices"]) == 1 for c in tokens)
    assert all(c["choices"][0]["text"].startswith(" ") for c in tokens)
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 11 + ["length"]
    assert len({c["id"] for c in chunks}) == 1 and tokens[0]["id"].startswith("cmpl-")
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 100, "completion_tokens": 12, "total_tokens": 112}


async def test_streaming_chat_sends_role_then_content(sim) -> None:
    _, _, session = sim
    payload = {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4, "stream": True,
               "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    async with session.post("/v1/chat/completions", json=payload) as resp:
        data = await read_sse(resp)
    chunks = [json.loads(d) for d in data[:-1]]
    assert data[-1] == "[DONE]"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = chunks[1:-1]
    assert len(content) == 4 and all(c["object"] == "chat.completion.chunk" for c in content)
    assert [c["usage"]["completion_tokens"] for c in content] == [1, 2, 3, 4]
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    # BOS + 5 template tokens around the message + 2 words + 4 for the reply header.
    assert chunks[-1]["usage"]["prompt_tokens"] == 1 + 5 + 2 + 4


async def test_streaming_without_usage_ends_with_done(sim) -> None:
    _, _, session = sim
    async with session.post("/v1/completions", json={"prompt": "a b c", "max_tokens": 3, "stream": True}) as resp:
        data = await read_sse(resp)
    assert len(data) == 4 and data[-1] == "[DONE]"
    assert all("usage" not in json.loads(d) for d in data[:-1])


async def test_non_streaming_completion_and_chat(sim) -> None:
    _, _, session = sim
    async with session.post("/v1/completions", json={"model": MODEL, "prompt": "one two three", "max_tokens": 7}) as resp:
        body = await resp.json()
    assert body["object"] == "text_completion"
    assert body["choices"][0]["finish_reason"] == "length"
    assert len(body["choices"][0]["text"].split()) == 7
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 7, "total_tokens": 11}
    async with session.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}],
                                                          "max_completion_tokens": 5}) as resp:
        body = await resp.json()
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 5
    # No limit at all: the reply ends by itself ("stop") after a seeded natural length.
    async with session.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}) as resp:
        body = await resp.json()
    assert body["choices"][0]["finish_reason"] == "stop" and 16 <= body["usage"]["completion_tokens"] <= 512


async def test_errors_look_like_vllms(sim) -> None:
    _, _, session = sim
    async with session.post("/v1/completions", json={"prompt": [1] * 4000, "max_tokens": 200}) as resp:
        assert resp.status == 400
        body = await resp.json()
    assert body["object"] == "error" and "maximum context length is 4096 tokens" in body["message"]
    async with session.post("/v1/completions", json={"model": "other", "prompt": "x"}) as resp:
        assert resp.status == 404
    async with session.post("/v1/completions", json={"prompt": "x", "stream_options": {"include_usage": True}}) as resp:
        assert resp.status == 400
    async with session.post("/v1/completions", data=b"{nope", headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 400


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


async def test_metrics_parse_with_vllm_names_types_and_labels(sim) -> None:
    settings, engine, session = sim
    payload = {"prompt": [7] * 50, "max_tokens": 20, "stream": True}
    async def one():
        async with session.post("/v1/completions", json=payload) as resp:
            await resp.read()
    await asyncio.gather(*(one() for _ in range(5)))
    async with session.get("/metrics") as resp:
        text = await resp.text()
    fams = families(text)
    expected = {
        "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge", "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter", "vllm:num_preemptions": "counter",
        "vllm:request_success": "counter", "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram", "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram", "vllm:cache_config_info": "gauge",
    }
    for name, kind in expected.items():
        assert fams[name].type == kind, name
    labels = {"model_name": MODEL, "engine": "0"}
    def sample(name, **extra):
        [s] = [s for f in fams.values() for s in f.samples if s.name == name and s.labels == {**labels, **extra}]
        return s.value
    assert sample("vllm:prompt_tokens_total") == 250
    assert sample("vllm:generation_tokens_total") == 100
    assert sample("vllm:request_success_total", finished_reason="length") == 5
    assert sample("vllm:num_requests_running") == 0
    assert sample("vllm:time_to_first_token_seconds_count") == 5
    assert sample("vllm:inter_token_latency_seconds_count") == 5 * 19
    assert sample("vllm:e2e_request_latency_seconds_count") == 5
    assert not [f for f in fams if f.startswith("kneepoint_sim_comm")]  # no simulator-only series: traces tell it
    # vLLM's default buckets, and no le="2" in TTFT.
    ttft_les = [s.labels["le"] for s in fams["vllm:time_to_first_token_seconds"].samples if s.name.endswith("_bucket")]
    assert ttft_les[:3] == ["0.001", "0.005", "0.01"] and ttft_les[-1] == "+Inf" and "2.0" not in ttft_les
    itl_les = [s.labels["le"] for s in fams["vllm:inter_token_latency_seconds"].samples if s.name.endswith("_bucket")]
    assert itl_les[0] == "0.01" and itl_les[-2] == "80.0"
    [info] = fams["vllm:cache_config_info"].samples
    assert info.labels["block_size"] == "16" and info.labels["num_gpu_blocks"] == str(settings.num_gpu_blocks)
    assert info.labels["engine"] == "0" and info.value == 1.0


async def test_dcgm_endpoint_one_series_per_gpu_with_pod_labels(sim) -> None:
    settings, _, session = sim
    async with session.post("/v1/completions", json={"prompt": [1] * 64, "max_tokens": 30}) as resp:
        await resp.read()
    async with aiohttp.ClientSession() as s2:
        async with s2.get(f"http://127.0.0.1:{settings.dcgm_port}/metrics") as resp:
            text = await resp.text()
    fams = families(text)
    used = fams["DCGM_FI_DEV_FB_USED"].samples
    assert [s.labels["gpu"] for s in used] == ["0", "1"]
    for s in used:
        assert s.labels["modelName"] == settings.gpu.display_name and s.labels["Hostname"] == "gpu-node-1"
        assert (s.labels["pod"], s.labels["namespace"], s.labels["container"]) == ("engine-tp2-0", "kp", "engine")
        assert s.labels["UUID"].startswith("GPU-") and s.labels["device"] in ("nvidia0", "nvidia1")
        # The pre-allocated budget, not the KV cache in use.
        assert s.value == int(settings.memory_used_bytes_per_gpu // 2**20)
    assert len({s.labels["UUID"] for s in used}) == 2
    free = fams["DCGM_FI_DEV_FB_FREE"].samples[0].value
    reserved = fams["DCGM_FI_DEV_FB_RESERVED"].samples[0].value
    assert used[0].value + free + reserved == settings.gpu.gfd_memory_mib
    assert fams["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"].type == "counter"
    assert fams["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"].samples[0].value > 0  # TP2 all-reduces crossed NVLink
    assert 0 <= fams["DCGM_FI_DEV_GPU_UTIL"].samples[0].value <= 100
    for name in ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES",
                 "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES", "DCGM_FI_DEV_POWER_USAGE"):
        assert len(fams[name].samples) == 2


async def test_a_client_that_goes_away_aborts_its_request(sim) -> None:
    settings, engine, session = sim
    payload = {"prompt": [1] * 10, "max_tokens": 2000, "stream": True}
    async with session.post("/v1/completions", json=payload) as resp:
        await resp.content.readline()
        resp.close()
    for _ in range(100):
        if engine.scheduler.num_running == 0:
            break
        await asyncio.sleep(0.02)
    assert engine.scheduler.num_running == 0 and engine.scheduler.kv_cache_usage == 0.0
    assert engine.metrics.request_success["abort"] == 1


async def test_continuous_batching_over_http_queues_beyond_max_num_seqs() -> None:
    settings = make_settings("--max-num-seqs", "4", "--max-num-batched-tokens", "4096")
    engine, runners, task = await start(settings)
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{settings.port}") as session:
            async def one():
                async with session.post("/v1/completions", json={"prompt": [1] * 20, "max_tokens": 120}) as resp:
                    return await resp.json()
            jobs = [asyncio.create_task(one()) for _ in range(10)]
            # 120 tokens take about half a second of simulated decode, far longer than submitting ten requests.
            for _ in range(200):
                if engine.scheduler.num_running + engine.scheduler.num_waiting == 10:
                    break
                await asyncio.sleep(0.005)
            assert engine.scheduler.num_running == 4 and engine.scheduler.num_waiting == 6
            results = await asyncio.gather(*jobs)
        assert all(r["usage"]["completion_tokens"] == 120 for r in results)
    finally:
        await stop(engine, runners, task)


async def test_truth_log_has_one_line_per_finished_request(tmp_path) -> None:
    path = tmp_path / "truth.jsonl"
    settings = make_settings("--truth-log", str(path))
    engine, runners, task = await start(settings)
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{settings.port}") as session:
            for n in (3, 5):
                async with session.post("/v1/completions", json={"prompt": [1] * 30, "max_tokens": n}) as resp:
                    await resp.read()
    finally:
        await stop(engine, runners, task)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["outputTokens"] for r in rows] == [3, 5]
    for r in rows:
        assert r["promptTokens"] == 30 and r["finishReason"] == "length" and r["preemptions"] == 0
        assert r["arrival"] <= r["firstScheduled"] <= r["firstToken"] <= r["finish"]
        assert r["ttftSeconds"] == pytest.approx(r["firstToken"] - r["arrival"], abs=1e-5)
        assert r["e2eSeconds"] >= r["ttftSeconds"] > 0
        # Non-streaming: the handler's start is known, a first streamed write is not.
        assert r["received"] <= r["arrival"] and r["firstWrite"] is None and r["socketTtftSeconds"] is None


async def test_truth_log_stamps_the_first_streamed_write(tmp_path) -> None:
    path = tmp_path / "truth.jsonl"
    settings = make_settings("--truth-log", str(path))
    engine, runners, task = await start(settings)
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{settings.port}") as session:
            body = {"prompt": [1] * 30, "max_tokens": 4, "stream": True}
            async with session.post("/v1/completions", json=body) as resp:
                await resp.read()
    finally:
        await stop(engine, runners, task)
    (r,) = [json.loads(line) for line in path.read_text().splitlines()]
    assert r["received"] <= r["arrival"] <= r["firstToken"] <= r["firstWrite"] <= r["finish"] + 1.0
    assert r["socketTtftSeconds"] == pytest.approx(r["firstWrite"] - r["received"], abs=1e-5)
    assert r["socketTtftSeconds"] >= r["ttftSeconds"]


async def test_x_request_id_names_the_response_and_the_truth_line(tmp_path) -> None:
    # vLLM's behaviour: the header becomes the response id, so a client's records join the truth log.
    path = tmp_path / "truth.jsonl"
    settings = make_settings("--truth-log", str(path))
    engine, runners, task = await start(settings)
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{settings.port}") as session:
            async def one(header: str) -> dict:
                body = {"prompt": [1] * 10, "max_tokens": 40}
                async with session.post("/v1/completions", json=body, headers={"X-Request-Id": header}) as resp:
                    return await resp.json()
            first = await one("abc-1")
            # Two in flight with one id: the second gets a generated id instead of clashing.
            twins = await asyncio.gather(one("dup"), one("dup"))
    finally:
        await stop(engine, runners, task)
    assert first["id"] == "cmpl-abc-1"
    assert sorted(t["id"] == "cmpl-dup" for t in twins) == [False, True]
    ids = {json.loads(line)["id"] for line in path.read_text().splitlines()}
    assert ids == {"cmpl-abc-1"} | {t["id"] for t in twins}
