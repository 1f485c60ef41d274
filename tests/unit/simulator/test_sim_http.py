"""The simulator's HTTP API, served for real on 127.0.0.1: vLLM's routes, SSE format, metrics text."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from test_sim_intake import arrivals  # same directory

from kneepoint.simulator.command import build_settings, command
from kneepoint.simulator.intake import Intake
from kneepoint.simulator.server import start, stop

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_settings(*extra: str, load: float = 0.0):
    args = [
        "--model",
        MODEL,
        "-tp",
        "2",
        "--gpu",
        "h200",
        "--max-model-len",
        "4096",
        "--port",
        str(free_port()),
        "--dcgm-port",
        str(free_port()),
        "--model-load-seconds",
        str(load),
        "--noise",
        "0",
        *extra,
    ]
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
    return [e[len("data: ") :] for e in events]


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
    payload = {
        "model": MODEL,
        "prompt": [1] * 100,
        "max_tokens": 12,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
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
    payload = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": 4,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    async with session.post("/v1/chat/completions", json=payload) as resp:
        data = await read_sse(resp)
    chunks = [json.loads(d) for d in data[:-1]]
    assert data[-1] == "[DONE]"
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = chunks[1:-1]
    assert len(content) == 4 and all(c["object"] == "chat.completion.chunk" for c in content)
    assert [c["usage"]["completion_tokens"] for c in content] == [1, 2, 3, 4]
    assert content[-1]["choices"][0]["finish_reason"] == "length"
    # BOS, the template's system turn (5 + its 20-token date preamble), 5 around the message, 2 words, 4 for the reply header.
    assert chunks[-1]["usage"]["prompt_tokens"] == 1 + 25 + 5 + 2 + 4


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
    async with session.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 5}
    ) as resp:
        body = await resp.json()
    assert body["object"] == "chat.completion" and body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 5
    # No limit at all: the reply ends by itself ("stop") after a seeded natural length.
    async with session.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}) as resp:
        body = await resp.json()
    assert body["choices"][0]["finish_reason"] == "stop" and 16 <= body["usage"]["completion_tokens"] <= 512


REAL = Path(__file__).resolve().parents[2] / "data" / "vllm"


def real_probe(title: str) -> tuple[int, dict]:
    """(HTTP status, body) of one probe of real vLLM 0.24 (tests/data/vllm/8b-tp1-api-probes.txt)."""
    text = (REAL / "8b-tp1-api-probes.txt").read_text()
    block = text.split(f"## {title}\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return int(block[1].split()[1]), json.loads(block[2])


async def test_errors_look_like_vllms(sim) -> None:
    """Status, nesting, type, param and message wording as real vLLM 0.24 answers (the same probes;
    real max_model_len 4096 as here)."""
    _, _, session = sim
    cases = [
        ("completion 4000 ids max_tokens 256 (clamp?)", "/v1/completions", {"prompt": [7] * 4000, "max_tokens": 256}),
        ("completion 4096 ids max_tokens 16", "/v1/completions", {"prompt": [7] * 4096, "max_tokens": 16}),
        ("completion 10 ids max_tokens 5000", "/v1/completions", {"prompt": [7] * 10, "max_tokens": 5000}),
        ("max_tokens 0", "/v1/completions", {"prompt": "x", "max_tokens": 0}),
        ("max_tokens -1", "/v1/completions", {"prompt": "x", "max_tokens": -1}),
        ("tokenize unknown model", "/tokenize", {"model": "nope", "prompt": "x"}),
    ]
    for title, path, payload in cases:
        status, real = real_probe(title)
        async with session.post(path, json=payload) as resp:
            assert resp.status == status, title
            body = await resp.json()
        assert set(body) == {"error"}, title
        assert body["error"] == {**real["error"], "message": body["error"]["message"]} or body["error"] == real["error"], title
        assert body["error"]["message"] == real["error"]["message"], title
    # Chat near the limit: vLLM reads only as much of the prompt as could fit, and says "at least".
    status, real = real_probe("chat 4000 words max_tokens 256 (clamp?)")
    words = " ".join(["the"] * 4000)
    async with session.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": words}], "max_tokens": 256}) as resp:
        assert resp.status == status == 400
        body = await resp.json()
    assert body["error"]["message"] == real["error"]["message"] and body["error"]["param"] == "input_tokens"
    async with session.post("/v1/completions", json={"model": "nope", "prompt": "x"}) as resp:
        assert resp.status == 404
        assert (await resp.json())["error"] == {
            "message": "The model `nope` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    async with session.post("/v1/completions", json={"prompt": "x", "stream_options": {"include_usage": True}}) as resp:
        assert resp.status == 400 and (await resp.json())["error"]["code"] == 400
    async with session.post("/v1/completions", data=b"{nope", headers={"Content-Type": "application/json"}) as resp:
        assert resp.status == 400 and (await resp.json())["error"]["type"] == "BadRequestError"


async def test_a_request_that_just_fits_is_served_in_full(sim) -> None:
    """vLLM 0.24 serves prompt + max_tokens == max_model_len whole, and refuses one token more (no clamping)."""
    _, _, session = sim
    async with session.post("/v1/completions", json={"prompt": [7] * 4090, "max_tokens": 6}) as resp:
        assert resp.status == 200
        assert (await resp.json())["usage"]["completion_tokens"] == 6
    async with session.post("/v1/completions", json={"prompt": [7] * 4091, "max_tokens": 6}) as resp:
        assert resp.status == 400


async def test_chat_template_overhead_near_max_model_len(sim) -> None:
    """Llama-3.1-Instruct's template adds 35 tokens around one user message: a chat load whose words
    plus output fill max_model_len exactly is refused, one 35 tokens shorter is served."""
    _, _, session = sim

    async def chat(words: int) -> int:
        body = {"messages": [{"role": "user", "content": " ".join(["the"] * words)}], "max_tokens": 96}
        async with session.post("/v1/chat/completions", json=body) as resp:
            if resp.status == 200:
                assert (await resp.json())["usage"]["prompt_tokens"] == words + 35
            return resp.status

    assert await chat(4096 - 96) == 400
    assert await chat(4096 - 96 - 35) == 200
    assert await chat(4096 - 96 - 34) == 400


async def test_tokenize_as_vllm_answers(sim) -> None:
    settings, _, session = sim
    _, real = real_probe("tokenize completion text")
    async with session.post("/tokenize", json={"model": MODEL, "prompt": [5, 6, 7]}) as resp:
        body = await resp.json()
    assert set(body) == set(real) and body["count"] == 3 and body["tokens"] == [5, 6, 7]
    assert body["max_model_len"] == settings.max_model_len == real["max_model_len"]
    async with session.post("/tokenize", json={"prompt": "the of and"}) as resp:
        body = await resp.json()
    assert body["count"] == 4 and len(body["tokens"]) == 4  # BOS + 3, as a Llama tokenizer
    async with session.post("/tokenize", json={"prompt": "the of and", "add_special_tokens": False}) as resp:
        assert (await resp.json())["count"] == 3
    async with session.post("/tokenize", json={"messages": [{"role": "user", "content": "the of"}]}) as resp:
        assert (await resp.json())["count"] == 2 + 35
    async with session.post(
        "/tokenize", json={"messages": [{"role": "user", "content": "the of"}], "add_generation_prompt": False}
    ) as resp:
        assert (await resp.json())["count"] == 2 + 31


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
        "vllm:num_requests_running": "gauge",
        "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge",
        "vllm:prompt_tokens": "counter",
        "vllm:generation_tokens": "counter",
        "vllm:num_preemptions": "counter",
        "vllm:request_success": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram",
        "vllm:cache_config_info": "gauge",
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
    # The label set real vLLM 0.24 writes, with its values where they do not depend on the pool size.
    [real] = families((REAL / "8b-tp1-cache-config-info-mns128.txt").read_text())["vllm:cache_config_info"].samples
    assert set(info.labels) == set(real.labels)
    pool_dependent = {"num_gpu_blocks", "kv_cache_size_tokens", "kv_cache_max_concurrency", "gpu_memory_utilization"}
    assert {k: v for k, v in info.labels.items() if k not in pool_dependent} == {
        k: v for k, v in real.labels.items() if k not in pool_dependent
    }
    assert info.labels["enable_prefix_caching"] == "True"
    assert int(info.labels["kv_cache_size_tokens"]) == settings.num_gpu_blocks * 16
    assert float(info.labels["kv_cache_max_concurrency"]) == settings.num_gpu_blocks * 16 / 4096


async def test_dcgm_endpoint_one_series_per_gpu_with_pod_labels(sim) -> None:
    settings, _, session = sim
    async with session.post("/v1/completions", json={"prompt": [1] * 64, "max_tokens": 30}) as resp:
        await resp.read()
    async with aiohttp.ClientSession() as s2, s2.get(f"http://127.0.0.1:{settings.dcgm_port}/metrics") as resp:
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
    for name in (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_NVLINK_TX_BYTES",
        "DCGM_FI_PROF_NVLINK_RX_BYTES",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "DCGM_FI_DEV_POWER_USAGE",
    ):
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
            # The API-server intake hands them over one by one, so the first may start alone; the next
            # step fills up to the cap and the rest wait.
            peak = 0
            for _ in range(200):
                peak = max(peak, engine.scheduler.num_running)
                if engine.scheduler.num_running == 4 and engine.scheduler.num_waiting == 6:
                    break
                await asyncio.sleep(0.005)
            assert engine.scheduler.num_running == 4 and engine.scheduler.num_waiting == 6 and peak <= 4
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


async def test_api_server_intake_holds_a_burst_until_the_gate_lets_it_through() -> None:
    """A burst waits for the API server's gate, shared between its requests (serving.apiGateUsPerRequest),
    then the hand-over's serial share per prompt token (serving.apiSerialUsPerPromptToken); a lone
    request takes the whole cost (simulator.intake)."""
    settings = make_settings()
    engine, runners, task = await start(settings)
    try:
        serving = settings.perf.calibration.serving
        model = Intake.of(serving)
        assert serving.api_gate_us_per_request > 0
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        got = await asyncio.gather(engine.intake(1000, t0), engine.intake(1000, t0), engine.intake(500, t0))
        waited = loop.time()
        assert got == pytest.approx(arrivals(model, [t0] * 3, [1000, 1000, 500]), abs=1e-9)
        assert got[0] >= t0 + model.lone_seconds(1000) + 2 * serving.api_gate_us_per_request * 1e-6 - 1e-9
        assert waited >= max(got) - 0.002  # the awaits lasted until then (the event loop's timer slack aside)
    finally:
        await stop(engine, runners, task)


async def test_intake_cost_runs_from_the_handlers_start() -> None:
    """The simulator's own parsing and response set-up before the intake count toward the modelled
    cost instead of adding to it; the modelled arrival is what an idle engine paces its first step from."""
    settings = make_settings()
    engine, runners, task = await start(settings)
    try:
        loop = asyncio.get_running_loop()
        lone = Intake.of(settings.perf.calibration.serving).lone_seconds(1000)
        now = loop.time()
        arrival = await engine.intake(1000, received_at=now - 0.002)
        assert arrival == pytest.approx(now - 0.002 + lone, abs=1e-6)
        # A request that spent longer than its overlapped part before the intake is held only for the
        # gate and the hand-over, which run no earlier than now.
        serving = settings.perf.calibration.serving
        now = loop.time()
        arrival = await engine.intake(100, received_at=now - 1.0)
        shared = (serving.api_gate_us_per_request + serving.api_serial_us_per_request + serving.api_serial_us_per_prompt_token * 100) * 1e-6
        assert now - 0.05 <= arrival - shared <= now + 1e-6
    finally:
        await stop(engine, runners, task)
