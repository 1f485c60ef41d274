"""The simulator starts and fails in real vLLM's words, order and phases (tests/data/vllm/, vLLM 0.24.0 on an H200)."""

from __future__ import annotations

import asyncio
import io
import re
from datetime import datetime
from pathlib import Path

from click.testing import CliRunner

from kneepoint.kube import pod_status
from kneepoint.simulator import startup
from kneepoint.simulator.command import build_settings, command

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm"
REAL_70B = (DATA / "70b-tp1-does-not-fit.log").read_text()
REAL_8B = (DATA / "8b-tp1-serve.log").read_text()
OPERATOR_FLAGS = ["--max-num-seqs", "32", "--max-model-len", "4096", "--gpu-memory-utilization", "0.9", "--dtype", "bfloat16",
                  "--gpu", "h200", "--dcgm-port", "0"]  # fmt: skip # argv: each flag beside its value
# The lines that mark vLLM's start-up phases, in the order vLLM prints them.
KEY_LINES = (
    "Initializing a V1 LLM engine",
    "Loading model from scratch",
    "Model loading took",
    "Dynamo bytecode transform time",
    "torch.compile took",
    "Initial profiling/warmup run took",
    "Available KV cache memory:",
    "GPU KV cache size:",
    "Maximum concurrency for",
    "Graph capturing finished in",
    "init engine (profile, create kv cache, warmup model) took",
    "Application startup complete.",
)


def messages(log: str) -> list[str]:
    return [pod_status.vllm_message(line) for line in log.splitlines()]


def first_index(lines: list[str], prefix: str) -> int:
    return next(i for i, line in enumerate(lines) if prefix in line)


def kneepoint_sim(args: list[str]) -> tuple[int, str]:
    result = CliRunner().invoke(command, args, env={"KNEEPOINT_SIM_MODEL_LOAD_SECONDS": "0"})
    return result.exit_code, result.output


def termination_message(log: str) -> str:
    return "\n".join(log.encode()[-2048:].decode("utf-8", "replace").splitlines()[-80:])


# --------------------------------------------------------------------------- the failure


def test_70b_at_tp1_fails_with_vllms_root_cause_then_the_api_servers_traceback_and_exit_1() -> None:
    code, out = kneepoint_sim(["meta-llama/Llama-3.3-70B-Instruct", *OPERATOR_FLAGS])
    assert code == startup.EXIT_REFUSED == 1
    real, sim = messages(REAL_70B), messages(out)
    real_cause = next(line for line in real if line.startswith("ValueError: No available memory"))
    assert real_cause in sim  # the same words
    # The same order: weights, the (negative) KV memory, the root cause, the API server's last line.
    order = ["Model loading took", "Available KV cache memory: -", "EngineCore failed to start.", real_cause, "Process EngineCore:"]
    assert [first_index(sim, p) for p in order] == sorted(first_index(sim, p) for p in order)
    assert sim[-1] == real[-1] == startup.ENGINE_INIT_FAILED
    # The simulator's own numbers, near the real ones: weights 131.42 vs 131.45 GiB, available -9.03 vs -8.06 GiB.
    weights = float(re.search(r"Model loading took ([\d.]+) GiB", out).group(1))
    available = float(re.search(r"Available KV cache memory: (-[\d.]+) GiB", out).group(1))
    assert abs(weights - 131.45) < 0.5 and -10.0 < available < -7.0


def test_the_kubelets_termination_message_of_the_simulators_failure_lacks_the_cause_as_vllms_does() -> None:
    _, out = kneepoint_sim(["meta-llama/Llama-3.3-70B-Instruct", *OPERATOR_FLAGS])
    for log in (REAL_70B, out):
        assert "No available memory" not in termination_message(log)
        cause = pod_status.classify_engine_output(log)
        assert cause is not None and cause.out_of_memory and cause.line.startswith("ValueError: No available memory")


def test_weights_beyond_the_gpu_at_tp2_fail_in_a_worker_then_the_engine_core_points_at_it() -> None:
    code, out = kneepoint_sim(["x", "--architecture", "llama-3.1-405b", "-tp", "2", *OPERATOR_FLAGS])
    assert code == 1
    lines = out.splitlines()
    worker = next(i for i, line in enumerate(lines) if line.startswith("(Worker_TP0 pid=") and "torch.OutOfMemoryError" in line)
    pointer = next(i for i, line in enumerate(lines) if "WorkerProc initialization failed" in line)
    assert worker < pointer and lines[-1].endswith(startup.ENGINE_INIT_FAILED)
    cause = pod_status.classify_engine_output(out)
    assert cause is not None and cause.out_of_memory and cause.line.startswith("torch.OutOfMemoryError: CUDA out of memory.")


def test_a_tp_split_vllm_refuses_fails_in_the_api_server_before_any_engine() -> None:
    code, out = kneepoint_sim(["meta-llama/Llama-3.1-8B-Instruct", "-tp", "3", *OPERATOR_FLAGS])
    assert code == 1 and "EngineCore" not in out
    assert messages(out)[-1].startswith("ValueError: ")


# --------------------------------------------------------------------------- the start-up


def _real_seconds(log: str) -> dict[str, float]:
    """Seconds after the first line at which each key line appears in a real log (untagged lines: the last stamp before)."""
    start = last = None
    out: dict[str, float] = {}
    for line in log.splitlines():
        if m := re.search(r" (\d\d-\d\d \d\d:\d\d:\d\d) ", line):
            last = datetime.strptime(m.group(1), "%m-%d %H:%M:%S")
            start = start or last
        for key in KEY_LINES:
            if key in line and key not in out and start and last:
                out[key] = (last - start).total_seconds()
    return out


def _figures(model: str = "meta-llama/Llama-3.1-8B-Instruct") -> startup.StartupFigures:
    ctx = command.make_context("sim", [model, *OPERATOR_FLAGS, "--model-load-seconds", "89"])
    figures = build_settings(model, ctx.params).startup
    assert figures is not None
    return figures


def test_start_up_lines_come_in_vllms_order() -> None:
    sim = [line.text for line in startup.startup_lines(_figures())]
    real = messages(REAL_8B)
    for lines in (real, sim):
        at = [first_index(lines, key) for key in KEY_LINES]
        assert at == sorted(at), lines


def test_start_up_phases_take_the_real_shares_of_the_start() -> None:
    # With a model-load time of 89 s (the real start's length) each key line is where the real one is, to the second.
    real = _real_seconds(REAL_8B)
    total = real["Application startup complete."]
    assert total == 89
    sim = {key: next(line.at * 89 for line in startup.startup_lines(_figures()) if key in line.text) for key in KEY_LINES}
    for key in KEY_LINES:
        assert abs(sim[key] - real[key]) <= 1.0, (key, sim[key], real[key])


def test_start_up_numbers_are_the_simulators_own_and_near_real_vllms() -> None:
    lines = {line.text.split(":")[0]: line.text for line in startup.startup_lines(_figures())}
    text = "\n".join(lines.values())
    # Real 8B at 0.90: weights 15.0 GiB, KV 109.49 GiB = 896,912 tokens, 218.97x for 4,096 tokens.
    weights = float(re.search(r"Model loading took ([\d.]+) GiB", text).group(1))
    kv = float(re.search(r"Available KV cache memory: ([\d.]+) GiB", text).group(1))
    tokens = int(re.search(r"GPU KV cache size: ([\d,]+) tokens", text).group(1).replace(",", ""))
    assert abs(weights - 15.0) / 15.0 < 0.02 and abs(kv - 109.49) / 109.49 < 0.03 and abs(tokens - 896_912) / 896_912 < 0.03
    assert re.search(r"Maximum concurrency for 4,096 tokens per request: \d+\.\d\dx", text)
    # 89 s of start: torch.compile 29 s and init engine 57 s, as vLLM's (29.16 s, 56.90 s).
    assert re.search(r"torch.compile took 29\.\d\d s in total", text) and re.search(r"init engine .* took 57\.\d\d s", text)


def test_enforce_eager_has_no_compile_nor_graph_lines() -> None:
    figures = _figures()
    eager = startup.startup_lines(startup.StartupFigures(**{**figures.__dict__, "enforce_eager": True}))
    text = "\n".join(line.text for line in eager)
    assert "torch.compile" not in text and "Graph capturing" not in text and "Application startup complete." in text


def test_a_stop_during_the_start_prints_no_more_lines() -> None:
    out = io.StringIO()
    stop = asyncio.Event()
    stop.set()
    assert asyncio.run(startup.run_startup(_figures(), stop, out)) is False
    assert "Application startup complete." not in out.getvalue()
    done = io.StringIO()
    figures = startup.StartupFigures(**{**_figures().__dict__, "load_seconds": 0.0})
    assert asyncio.run(startup.run_startup(figures, asyncio.Event(), done)) is True
    assert done.getvalue().splitlines()[-1].endswith("INFO:     Application startup complete.")
