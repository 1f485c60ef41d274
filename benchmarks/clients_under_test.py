"""The load generators compared by loadgen_vs_peers.py: how each is started, how its exports are read.

Each client runs one closed-loop point (fixed concurrency, a warm-up of one request per
stream, then ``num_requests`` measured requests, chat API, streaming, fixed input and output
lengths, ``ignore_eos``) and leaves per-request exports in a directory. ``read_*`` turns
those into one shape, :class:`ClientRun`: every measured request with its wall-clock start
and end, its TTFT as the client measured it, its output tokens, and the id that joins it with
the simulator's truth log; plus the throughput the client itself reported.

How the ids join (see docs/benchmarks.md):
- kneepoint loadgen records the response id of the first chunk (``responseId``);
- AIPerf sends a fresh ``X-Request-ID`` per request and exports it; the simulator, like
  vLLM, names the request ``chatcmpl-<X-Request-Id>``;
- GuideLLM records the server's response id (``response_id``);
- vLLM's ``bench serve`` sends ``x-request-id: <prefix><index>`` (``--request-id-prefix``) and
  saves its per-request lists in request order (``--save-detailed``), so request ``i`` is
  ``chatcmpl-<prefix><i>``. Its times are ``perf_counter`` readings, so way in and way out
  (wall-clock differences with the simulator's stamps) are not computed for it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Workload:
    """One measured point, identical for every client."""

    endpoint: str
    model: str
    concurrency: int
    num_requests: int
    input_len: int
    output_len: int

    @property
    def warmup(self) -> int:
        return self.concurrency


@dataclass
class MeasuredRequest:
    """One measured request as a client exported it. Times: wall seconds; TTFT: ms."""

    join_id: str | None
    start: float
    end: float
    ttft_ms: float | None
    output_tokens: int
    ok: bool
    wall_clock: bool = True
    """False when ``start``/``end`` are a monotonic clock of the client's (vLLM bench's
    perf_counter): good for the window, not for comparing with the simulator's wall stamps."""


@dataclass
class ClientRun:
    """A client's measured requests and the throughput it reported for them."""

    requests: list[MeasuredRequest] = field(default_factory=list)
    reported_requests_per_s: float | None = None
    reported_output_tokens_per_s: float | None = None
    window: tuple[float, float] | None = None
    """The client's own measurement window (wall seconds); None: first start to last end."""

    def measured_window(self) -> tuple[float, float]:
        if self.window is not None:
            return self.window
        return min(r.start for r in self.requests), max(r.end for r in self.requests)


# --------------------------------------------------------------------------------------------
# kneepoint loadgen


def loadgen_command(python: str, work: Workload, out_dir: str) -> list[str]:
    """``kneepoint loadgen`` with one measured repeat and its full records in run.json."""
    return [
        python,
        "-m",
        "kneepoint",
        "loadgen",
        "--endpoint",
        work.endpoint,
        "--model",
        work.model,
        "--api",
        "chat",
        "--concurrency",
        str(work.concurrency),
        "--num-requests",
        str(work.num_requests),
        "--input-len",
        str(work.input_len),
        "--output-len",
        str(work.output_len),
        "--seed",
        "0",
        "--warmup-requests",
        str(work.warmup),
        "--repeats",
        "1",
        "--no-progress",
        "--save-json",
        os.path.join(out_dir, "run.json"),
    ]


def read_loadgen(out_dir: str) -> ClientRun:
    with open(os.path.join(out_dir, "run.json"), encoding="utf-8") as handle:
        doc = json.load(handle)
    run = ClientRun(
        reported_requests_per_s=doc["summary"]["requestsPerSecond"], reported_output_tokens_per_s=doc["summary"]["outputTokensPerSecond"]
    )
    for r in doc["requests"]:
        run.requests.append(
            MeasuredRequest(
                join_id=r.get("responseId"),
                start=r["start"],
                end=r["end"],
                ttft_ms=r.get("ttftMs"),
                output_tokens=r.get("outputTokens") or 0,
                ok=r.get("error") is None,
            )
        )
    return run


# --------------------------------------------------------------------------------------------
# The floor: raw_socket_client.py


def floor_command(python: str, work: Workload, out_dir: str) -> list[str]:
    port = work.endpoint.rsplit(":", 1)[1]
    return [
        python,
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "raw_socket_client.py"),
        "--port",
        port,
        "--model",
        work.model,
        "--concurrency",
        str(work.concurrency),
        "--num-requests",
        str(work.num_requests),
        "--input-len",
        str(work.input_len),
        "--output-len",
        str(work.output_len),
        "--warmup",
        str(work.warmup),
        "--out",
        os.path.join(out_dir, "records.json"),
    ]


def read_floor(out_dir: str) -> ClientRun:
    with open(os.path.join(out_dir, "records.json"), encoding="utf-8") as handle:
        rows = json.load(handle)["requests"]
    run = ClientRun()
    for r in rows:
        run.requests.append(
            MeasuredRequest(
                join_id=r["id"],
                start=r["start"],
                end=r["end"],
                ttft_ms=r["ttftMs"],
                output_tokens=r["outputTokens"],
                ok=r["ttftMs"] is not None,
            )
        )
    return run


# --------------------------------------------------------------------------------------------
# NVIDIA AIPerf


def aiperf_command(venv: str, work: Workload, out_dir: str, tokenizer: str) -> list[str]:
    """``aiperf profile`` as REFERENCE.md section 8 gives it, with server metrics and GPU telemetry off."""
    return [
        os.path.join(venv, "bin", "aiperf"),
        "profile",
        "--model",
        work.model,
        "--url",
        work.endpoint,
        "--endpoint-type",
        "chat",
        "--streaming",
        "--concurrency",
        str(work.concurrency),
        "--request-count",
        str(work.num_requests),
        "--warmup-request-count",
        str(work.warmup),
        "--synthetic-input-tokens-mean",
        str(work.input_len),
        "--synthetic-input-tokens-stddev",
        "0",
        "--output-tokens-mean",
        str(work.output_len),
        "--output-tokens-stddev",
        "0",
        "--extra-inputs",
        "ignore_eos:true",
        "--tokenizer",
        tokenizer,
        "--artifact-dir",
        out_dir,
        "--ui",
        "none",
        "--no-server-metrics",
        "--no-gpu-telemetry",
        "--random-seed",
        "0",
    ]


def _metric(metrics: dict[str, Any], name: str) -> Any:
    entry = metrics.get(name)
    return entry.get("value") if isinstance(entry, dict) else None


def read_aiperf(out_dir: str) -> ClientRun:
    with open(os.path.join(out_dir, "profile_export_aiperf.json"), encoding="utf-8") as handle:
        summary = json.load(handle)
    run = ClientRun(
        reported_requests_per_s=summary["request_throughput"]["avg"], reported_output_tokens_per_s=summary["output_token_throughput"]["avg"]
    )
    with open(os.path.join(out_dir, "profile_export.jsonl"), encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            meta, metrics = row["metadata"], row.get("metrics") or {}
            if meta.get("benchmark_phase", "profiling") != "profiling":
                continue
            x_id = meta.get("x_request_id")
            run.requests.append(
                MeasuredRequest(
                    join_id=f"chatcmpl-{x_id}" if x_id else None,
                    start=meta["request_start_ns"] / 1e9,
                    end=meta["request_end_ns"] / 1e9,
                    ttft_ms=_metric(metrics, "time_to_first_token"),
                    output_tokens=int(_metric(metrics, "output_sequence_length") or 0),
                    ok=not row.get("error") and not meta.get("was_cancelled"),
                )
            )
    return run


# --------------------------------------------------------------------------------------------
# GuideLLM


def guidellm_command(venv: str, work: Workload, out_dir: str, tokenizer: str) -> list[str]:
    """``guidellm run`` (0.8 CLI): concurrent profile, warm-up inside the request budget."""
    return [
        os.path.join(venv, "bin", "guidellm"),
        "run",
        "--backend",
        f"kind=openai_http,target={work.endpoint},model={work.model}",
        "--profile",
        f"kind=concurrent,streams={work.concurrency},warmup={work.warmup}",
        "--constraint",
        f"kind=max_requests,count={work.num_requests + work.warmup}",
        "--data",
        f"kind=synthetic_text,prompt_tokens={work.input_len},output_tokens={work.output_len}",
        "--tokenizer",
        f"kind=huggingface_auto,model={tokenizer}",
        "--output",
        f"kind=json,path={os.path.join(out_dir, 'benchmarks.json')}",
        "--disable-progress",
    ]


def read_guidellm(out_dir: str) -> ClientRun:
    with open(os.path.join(out_dir, "benchmarks.json"), encoding="utf-8") as handle:
        bench = json.load(handle)["benchmarks"][0]
    metrics = bench["metrics"]
    run = ClientRun(
        reported_requests_per_s=metrics["requests_per_second"]["successful"]["mean"],
        reported_output_tokens_per_s=metrics["output_tokens_per_second"]["successful"]["mean"],
    )
    # The per-request lists hold the warm-up too. GuideLLM's statistics cover the requests
    # that ended inside [start_time, end_time] (the warm-up ends at start_time, while
    # streams keep running: no barrier), over that window; ours do the same.
    lo, hi = bench["start_time"], bench["end_time"]
    run.window = (lo, hi)
    for status in ("successful", "errored", "incomplete"):
        for r in bench["requests"].get(status) or []:
            start, end = r.get("request_start_time"), r.get("request_end_time")
            if start is None or end is None or not lo <= end <= hi:
                continue
            run.requests.append(
                MeasuredRequest(
                    join_id=r.get("response_id"),
                    start=start,
                    end=end,
                    ttft_ms=r.get("time_to_first_token_ms"),
                    output_tokens=int(r.get("output_tokens") or 0),
                    ok=status == "successful",
                )
            )
    return run


# --------------------------------------------------------------------------------------------
# vLLM bench serve

VLLM_REQUEST_ID_PREFIX = "kbvllm-"


def vllm_command(venv: str, work: Workload, out_dir: str, tokenizer: str) -> list[str]:
    """``vllm bench serve`` with the random dataset, the chat backend and per-request results."""
    return [
        os.path.join(venv, "bin", "vllm"),
        "bench",
        "serve",
        "--backend",
        "openai-chat",
        "--base-url",
        work.endpoint,
        "--endpoint",
        "/v1/chat/completions",
        "--model",
        work.model,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(work.input_len),
        "--random-output-len",
        str(work.output_len),
        "--random-range-ratio",
        "0",
        "--ignore-eos",
        "--max-concurrency",
        str(work.concurrency),
        "--num-prompts",
        str(work.num_requests),
        "--num-warmups",
        str(work.warmup),
        "--seed",
        "0",
        "--request-id-prefix",
        VLLM_REQUEST_ID_PREFIX,
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        out_dir,
        "--result-filename",
        "vllm.json",
    ]


def read_vllm(out_dir: str) -> ClientRun:
    with open(os.path.join(out_dir, "vllm.json"), encoding="utf-8") as handle:
        result = json.load(handle)
    run = ClientRun(reported_requests_per_s=result["request_throughput"], reported_output_tokens_per_s=result["output_throughput"])
    rows = zip(result["start_times"], result["latencies"], result["ttfts"], result["output_lens"], result["errors"])
    for index, (start, latency, ttft, out_len, error) in enumerate(rows):
        ok = not error
        run.requests.append(
            MeasuredRequest(
                join_id=f"chatcmpl-{VLLM_REQUEST_ID_PREFIX}{index}",
                start=start,
                end=start + (latency or 0.0),
                ttft_ms=ttft * 1000.0 if ok and ttft else None,
                output_tokens=int(out_len or 0),
                ok=ok,
                wall_clock=False,
            )
        )
    return run
