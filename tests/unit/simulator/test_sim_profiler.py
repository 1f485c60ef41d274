"""The simulator's torch profiler: vLLM's --profiler-config, /start_profile, /stop_profile, traces per rank."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from test_sim_http import make_settings  # same directory

from kneepoint.core.kineto_trace import analyse, analyse_files, read_trace_file
from kneepoint.simulator import profiler as sp
from kneepoint.simulator.server import start, stop


def test_config_parses_as_vllm_does(tmp_path: Path) -> None:
    c = sp.parse_profiler_config(
        f'{{"profiler":"torch","torch_profiler_dir":"{tmp_path}","torch_profiler_with_stack":false,'
        '"ignore_frontend":true,"max_iterations":50}'
    )
    assert (c.profiler, c.torch_profiler_dir, c.max_iterations, c.use_gzip) == ("torch", str(tmp_path), 50, True)


@pytest.mark.parametrize(
    "text,message",
    [
        ("{", "not JSON"),
        ("[]", "expected a JSON object"),
        ('{"profiler":"torch"}', "torch_profiler_dir must be set when profiler is 'torch'"),
        ('{"torch_profiler_dir":"/x"}', "only applicable when profiler is set to 'torch'"),
        ('{"profiler":"nsys","torch_profiler_dir":"/x"}', "must be one of torch, cuda"),
        ('{"profiler":"torch","torch_profiler_dir":"/x","max_iterations":-1}', "max_iterations: must be an integer >= 0"),
        ('{"profiler":"torch","torch_profiler_dir":"/x","active_iterations":0}', "active_iterations: must be an integer >= 1"),
        ('{"profiler":"torch","torch_profiler_dir":"/x","with_stack":false}', "unknown field(s) with_stack"),
    ],
)
def test_bad_configs_are_refused_naming_the_field(text: str, message: str) -> None:
    with pytest.raises(sp.ProfilerConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        sp.parse_profiler_config(text)


def steps(n: int, duration: float = 0.010, comm: float = 0.001) -> list[sp.ProfiledStep]:
    return [sp.ProfiledStep(100.0 + i * 0.011, duration, comm, 0, 0, 32) for i in range(n)]


def test_rank_traces_read_back_as_the_modelled_transfer_plus_skew(tmp_path: Path) -> None:
    docs = sp.rank_documents(steps(50), 4, 1, "nvlink", "NVIDIA H200", 150 * 10**9, seed=1, base_time_ns=0)
    paths = sp.write_traces(str(tmp_path), docs, 4, use_gzip=True)
    assert sorted(Path(p).name.split(".")[0] for p in paths) == [f"dp0_pp0_tp{r}_dcp0_ep0_rank{r}" for r in range(4)]
    f = analyse_files(paths)
    assert (f.ranks, f.steps) == (4, 50)
    assert f.comm_fraction == pytest.approx(0.1, abs=1e-6)  # the last-arriving rank waits nothing
    assert 0 < f.rank_skew_fraction <= sp.RANK_SKEW * 0.9
    assert f.step_time_median_ms == pytest.approx(10.0)
    # the early ranks' own collective share includes their waiting
    assert max(r.collective_share for r in f.per_rank) > f.comm_fraction
    kernels = {e["name"] for e in docs[0]["traceEvents"] if e.get("cat") == "kernel"}
    assert sp.CUSTOM_ALLREDUCE.format(ranks=4) in kernels


def test_pcie_uses_nccl_and_pipeline_only_send_recv() -> None:
    assert sp.collective_kernel_name(2, "pcie") == sp.NCCL_ALLREDUCE
    assert sp.collective_kernel_name(1, "nvlink") == sp.NCCL_SENDRECV
    docs = sp.rank_documents(steps(3), 1, 1, "nvlink", "NVIDIA H200", 1, seed=0, base_time_ns=0)
    assert not [e for e in docs[0]["traceEvents"] if e.get("name") == sp.NCCL_SENDRECV]  # one GPU: no collectives


def test_the_stop_stall_follows_the_real_capture() -> None:
    p = sp.SimProfiler(sp.ProfilerConfig("torch", "/x"), 1, 1, 32, "nvlink", "H200", 1)
    assert p.stall_seconds(316) == pytest.approx(32.0)  # vLLM 0.24, 8B TP1: 316 steps, 32 s to write


def test_max_iterations_stops_by_itself() -> None:
    p = sp.SimProfiler(sp.ProfilerConfig("torch", "/x", max_iterations=3, delay_iterations=2), 2, 1, 32, "nvlink", "H200", 1)
    p.start()
    for i in range(10):
        p.record_step(float(i), 0.01, 0.001, 0, 0, 8)
    assert p._pending is not None and len(p._pending) == 3 and p._pending[0].start == 2.0


async def _complete(session: aiohttp.ClientSession, n: int) -> None:
    async def one() -> None:
        async with session.post("/v1/completions", json={"prompt": "hello " * 200, "max_tokens": 40}) as resp:
            assert resp.status == 200
            await resp.read()

    await asyncio.gather(*(one() for _ in range(n)))


async def test_start_and_stop_profile_write_one_trace_per_rank(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sp, "STOP_SECONDS_PER_STEP_LAYER", 0.0)  # no stall in a unit test
    settings = make_settings("--profiler-config", f'{{"profiler":"torch","torch_profiler_dir":"{tmp_path}"}}')
    engine, runners, task = await start(settings)
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{settings.port}") as session:
            async with session.post("/start_profile") as resp:
                assert resp.status == 200
            await _complete(session, 8)
            async with session.post("/stop_profile") as resp:
                assert resp.status == 200
            async with session.post("/stop_profile") as resp:  # not active: ignored, as vLLM
                assert resp.status == 200
    finally:
        await stop(engine, runners, task)
    files = sorted(tmp_path.glob("*.pt.trace.json.gz"))
    assert [f.name.split(".")[0] for f in files] == ["dp0_pp0_tp0_dcp0_ep0_rank0", "dp0_pp0_tp1_dcp0_ep0_rank1"]
    figures = analyse([read_trace_file(f) for f in files])
    assert figures.ranks == 2 and figures.steps >= 40
    assert 0.0 < figures.comm_fraction < 0.5  # TP2 over NVLink: about 15 % in the H200 data
    assert figures.rank_skew_fraction > 0


async def test_without_a_profiler_config_the_routes_do_not_exist() -> None:
    settings = make_settings()
    engine, runners, task = await start(settings)
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{settings.port}") as session, session.post("/start_profile") as resp:
            assert resp.status == 404
    finally:
        await stop(engine, runners, task)


async def test_the_stall_at_stop_holds_the_engine_and_is_not_counted_as_lag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sp, "STOP_SECONDS_PER_STEP_LAYER", 0.3 / (20 * 32))  # 20 steps of a 32-layer model: 0.3 s
    settings = make_settings("--profiler-config", f'{{"profiler":"torch","torch_profiler_dir":"{tmp_path}","max_iterations":20}}')
    engine, runners, task = await start(settings)
    try:
        async with aiohttp.ClientSession(f"http://127.0.0.1:{settings.port}") as session:
            async with session.post("/start_profile") as resp:
                assert resp.status == 200
            await _complete(session, 4)
            async with session.post("/stop_profile") as resp:
                assert resp.status == 200
    finally:
        await stop(engine, runners, task)
    assert len(list(tmp_path.glob("*.pt.trace.json.gz"))) == 2  # written when max_iterations was reached
    # Counted as lag, the 0.3 s hold would show as at least 0.25 s (lag starts 50 ms behind).
    assert engine.lag_seconds_total < 0.25
