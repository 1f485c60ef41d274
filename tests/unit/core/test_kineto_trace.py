"""kneepoint.core.kineto_trace on synthetic multi-rank traces and on the real vLLM 0.24 TP1 trace."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import pytest

from kneepoint.core import kineto_trace as kt

REAL_TRACE = Path(__file__).resolve().parents[2] / "data" / "vllm" / "8b-tp1-profile-rank0.pt.trace.json.gz"
NCCL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
CUSTOM_AR = (
    "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 2>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, __nv_bfloat16*, int, int)"
)
GEMM = "nvjet_sm90_tst_128x32_64x10_2x1_v_bz_TNT"


def trace_doc(rank: int, steps: list[tuple[float, list[tuple[str, float]]]], world: int = 2) -> dict:
    """A Kineto-shaped document: per step (duration µs, kernels [(name, µs)] laid end to end)."""
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}}]
    t = 1_000_000.0
    for i, (dur, kernels) in enumerate(steps):
        events.append(
            {
                "ph": "X",
                "cat": "gpu_user_annotation",
                "name": f"execute_context_0(0)_generation_{i + 1}({i + 1})",
                "pid": 0,
                "tid": 7,
                "ts": t,
                "dur": dur,
            }
        )
        k = t
        for name, kdur in kernels:
            events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": k, "dur": kdur, "args": {"device": 0}})
            k += kdur
        t += dur + 50.0
    # a host-side annotation and a kernel outside every step: neither counts
    events.append(
        {"ph": "X", "cat": "user_annotation", "name": "execute_context_0(0)_generation_1(1)", "pid": 1, "tid": 1, "ts": 0.0, "dur": 5.0}
    )
    events.append({"ph": "X", "cat": "kernel", "name": NCCL, "pid": 0, "tid": 7, "ts": t + 1000, "dur": 999.0})
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world},
        "traceEvents": events,
        "traceName": "x",
    }


def write(tmp: Path, name: str, doc: dict, gz: bool = True) -> Path:
    path = tmp / name
    data = json.dumps(doc, indent=1).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def skewed_pair(tmp: Path) -> list[Path]:
    # Rank 0 arrives late at the all-reduce (its compute is longer): it waits 1 ms; rank 1
    # arrives early and waits 4 ms inside the same all-reduce. Steps last 10 ms on rank 1 and
    # 9.5 ms on rank 0: the step time is the longer.
    r0 = [(9500.0, [(GEMM, 7000.0), (NCCL, 1000.0)])] * 5
    r1 = [(10000.0, [(GEMM, 4000.0), (CUSTOM_AR, 4000.0)])] * 5
    return [
        write(tmp, "dp0_pp0_tp0_dcp0_ep0_rank0.1790857026000000000.pt.trace.json.gz", trace_doc(0, r0)),
        write(tmp, "dp0_pp0_tp1_dcp0_ep0_rank1.1790857026000000001.pt.trace.json", trace_doc(1, r1), gz=False),
    ]


def test_two_ranks_with_skew_take_the_smallest_rank_as_transfer(tmp_path: Path) -> None:
    figures = kt.analyse_files(skewed_pair(tmp_path))
    assert figures.ranks == 2 and figures.steps == 5
    assert figures.comm_fraction == pytest.approx(1000 / 10000)  # not the naive mean over ranks (0.25)
    assert figures.rank_skew_fraction == pytest.approx(3000 / 10000)
    assert figures.step_time_median_ms == pytest.approx(10.0)
    assert [(r.rank, r.steps) for r in figures.per_rank] == [(0, 5), (1, 5)]
    assert figures.per_rank[0].collective_share == pytest.approx(1000 / 9500)
    assert figures.per_rank[1].collective_share == pytest.approx(0.4)
    assert figures.per_rank[0].step_time_median_ms == pytest.approx(9.5)


def test_the_median_is_over_steps_and_the_slowest_rank_sets_each_step(tmp_path: Path) -> None:
    # Three steps; in step 2 rank 1 is the slow one. Per step: min/step = 0.1, 0.05, 0.2.
    r0 = [(10000.0, [(NCCL, 1000.0)]), (20000.0, [(NCCL, 5000.0)]), (5000.0, [(NCCL, 1000.0)])]
    r1 = [(8000.0, [(NCCL, 3000.0)]), (10000.0, [(NCCL, 1000.0)]), (4000.0, [(NCCL, 1000.0)])]
    paths = [
        write(tmp_path, "a_rank0.1.pt.trace.json.gz", trace_doc(0, r0)),
        write(tmp_path, "a_rank1.1.pt.trace.json.gz", trace_doc(1, r1)),
    ]
    f = kt.analyse_files(paths)
    assert f.comm_fraction == pytest.approx(0.1)
    assert f.rank_skew_fraction == pytest.approx(0.2)  # (2000/10000, 4000/20000, 0/5000) -> median 0.2
    assert f.step_time_median_ms == pytest.approx(10.0)


def test_a_kernel_crossing_the_step_boundary_counts_only_inside(tmp_path: Path) -> None:
    doc = trace_doc(0, [(1000.0, [(GEMM, 600.0)])], world=1)
    doc["traceEvents"].append({"ph": "X", "cat": "kernel", "name": NCCL, "pid": 0, "tid": 7, "ts": 1_000_000.0 + 800, "dur": 500.0})
    f = kt.analyse_files([write(tmp_path, "x.pt.trace.json.gz", doc)])
    assert f.comm_fraction == pytest.approx(0.2)


def test_rank_comes_from_distributed_info_then_the_file_name(tmp_path: Path) -> None:
    doc = trace_doc(3, [(1000.0, [])])
    assert kt.read_trace_file(write(tmp_path, "x_rank1.1.pt.trace.json", doc, gz=False)).rank == 3
    del doc["distributedInfo"]
    assert kt.read_trace_file(write(tmp_path, "x_rank1.2.pt.trace.json", doc, gz=False)).rank == 1


def test_numbers_and_strings_cut_by_chunk_boundaries_are_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kt, "_CHUNK", 7)
    doc = trace_doc(0, [(12345.678, [(NCCL, 1234.5)])] * 3, world=1)
    r = kt.read_rank_trace(io.StringIO(json.dumps(doc)), "mem", 0)
    assert r.step_durations_us == (12345.678,) * 3 and r.collective_us == (1234.5,) * 3


@pytest.mark.parametrize(
    "name,collective",
    [
        (NCCL, True),
        (CUSTOM_AR, True),
        ("void vllm::cross_device_reduce_2stage<float, 4>(...)", True),
        ("allreduce_prototype_twoshot<AllReduceTwoshot<__half, CodecFP>, __half>", True),
        ("void c10d::symmetric_memory::one_shot_all_reduce_kernel<c10::BFloat16, 8>(...)", True),
        ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", True),
        (GEMM, False),
        ("void cublasLt::splitKreduce_kernel<32, 16, int, float>(...)", False),
        ("triton_red_fused_fused_add_rms_norm_0", False),
    ],
)
def test_collective_kernel_names(name: str, collective: bool) -> None:
    assert kt.is_collective_kernel(name) is collective


@pytest.mark.parametrize(
    "content,message",
    [
        (b"", "empty file"),
        (b"hello", "expected a JSON object"),
        (b'{"traceEvents": [', "invalid JSON"),
        (b'{"schemaVersion": 1}', "no traceEvents array"),
        (b'{"traceEvents": {}}', "traceEvents is not an array"),
        (
            json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": NCCL, "pid": 0, "ts": 1, "dur": 1}]}).encode(),
            "no step annotations",
        ),
        (b"\x1f\x8b\x08\x00garbage", "cannot read"),
    ],
)
def test_bad_files_get_one_clear_error(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(kt.TraceError, match=message) as err:
        kt.read_trace_file(path)
    assert str(err.value).startswith(str(path))


def test_ranks_with_different_step_counts_are_refused(tmp_path: Path) -> None:
    a = write(tmp_path, "a_rank0.1.pt.trace.json.gz", trace_doc(0, [(1000.0, [])] * 3))
    b = write(tmp_path, "a_rank1.1.pt.trace.json.gz", trace_doc(1, [(1000.0, [])] * 2))
    with pytest.raises(kt.TraceError, match=r"different step counts \(rank 0: 3, rank 1: 2\)"):
        kt.analyse_files([a, b])
    with pytest.raises(kt.TraceError, match="rank 0 given twice"):
        kt.analyse_files([a, a])


def test_the_real_vllm_tp1_trace() -> None:
    # vLLM 0.24.0, Llama-3.1-8B shapes, one H200, 3 s at concurrency 32 (tests/data/vllm).
    f = kt.analyse_files([REAL_TRACE])
    assert (f.ranks, f.steps) == (1, 316)
    assert f.comm_fraction == 0.0 and f.rank_skew_fraction == 0.0
    assert f.step_time_median_ms == pytest.approx(6.143, abs=0.01)  # 301 decode steps of 32 sequences
    assert f.to_json() == {
        "ranks": 1,
        "steps": 316,
        "commFraction": 0.0,
        "rankSkewFraction": 0.0,
        "stepTimeMedianMs": 6.143,
        "perRank": [{"rank": 0, "steps": 316, "collectiveShare": 0.0, "stepTimeMedianMs": 6.143}],
    }
