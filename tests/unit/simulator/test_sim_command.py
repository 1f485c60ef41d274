"""`kneepoint sim` flags: vLLM's spellings, env fallbacks, bad input (exit 2) and the out-of-memory refusal (exit 1)."""

from __future__ import annotations

import copy
import json

import pytest
from click.testing import CliRunner

from kneepoint.core.gpus import get_gpu_type
from kneepoint.simulator.command import build_settings, command, parse_max_model_len
from kneepoint.simulator.engine import scheduler_config


def parse(args: list[str]):
    return command.make_context("sim", list(args))


def settings(args: list[str]):
    ctx = parse(args)
    return build_settings(ctx.params["model"], ctx.params)


def invoke(args: list[str], env: dict[str, str] | None = None):
    # A refusal unfolds over the model-load time as vLLM's does (startup.py): none here.
    return CliRunner().invoke(command, args, env={"KNEEPOINT_SIM_MODEL_LOAD_SECONDS": "0", **(env or {})})


def test_70b_on_one_h200_at_090_is_refused_like_vllm() -> None:
    result = invoke(
        ["--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "h200", "--gpu-memory-utilization", "0.90", "--max-model-len", "4096"]
    )
    assert result.exit_code == 1
    assert "No available memory for the cache blocks" in result.output


def test_70b_fits_at_tp2() -> None:
    s = settings(["--model", "meta-llama/Llama-3.1-70B-Instruct", "--gpu", "h200", "-tp", "2", "--max-model-len", "4096"])
    assert s.gpus == 2 and s.num_gpu_blocks > 1000


def test_weights_beyond_the_gpu_are_a_cuda_oom() -> None:
    result = invoke(["--model", "x", "--architecture", "llama-3.1-405b", "--gpu", "h200", "-tp", "2"])
    assert result.exit_code == 1
    assert "CUDA out of memory" in result.output


def test_max_model_len_beyond_the_pool_is_refused() -> None:
    result = invoke(["--model", "meta-llama/Llama-3.1-70B", "--gpu", "h200", "-tp", "2", "--max-model-len", "4000k"])
    assert result.exit_code == 1
    assert "max seq len (4000000)" in result.output


def test_bad_flags_exit_2_with_one_line_naming_the_flag() -> None:
    for args, flag in (
        (["--model", "meta-llama/Llama-3-8B", "--gpu", "tpu-v5"], "--gpu"),
        (["--model", "meta-llama/Llama-3-8B", "--interconnect", "infiniband"], "--interconnect"),
        (["--model", "meta-llama/Llama-3-8B", "--gpu", "l40s", "--interconnect", "nvlink"], "--interconnect"),
        (["--model", "m", "--architecture", "no-such-preset"], "--architecture"),
        (["--model", "m", "--architecture", "{not json"], "--architecture"),
        (["--model", "meta-llama/Llama-3-8B", "--dtype", "int3"], "--dtype"),
        (["--model", "meta-llama/Llama-3-8B", "--quantization", "magic"], "--quantization"),
        (["--model", "meta-llama/Llama-3-8B", "--max-model-len", "lots"], "--max-model-len"),
        (["--model", "meta-llama/Llama-3-8B", "--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
        (["--model", "meta-llama/Llama-3-8B", "--noise", "-1"], "--noise"),
        ([], "--model"),
    ):
        result = invoke(args)
        assert result.exit_code == 2, (args, result.output)
        lines = result.output.strip().splitlines()
        assert lines[-1].startswith(f"kneepoint sim: {flag}:"), (args, result.output)
        assert "Traceback" not in result.output


def test_vllm_spellings_underscores_short_flags_positional_model_and_several_names() -> None:
    ctx = parse(
        [
            "meta-llama/Llama-3-8B",
            "--tensor_parallel_size=2",
            "-pp",
            "1",
            "--served-model-name",
            "a",
            "b",
            "--trust-remote-code",
            "--download-dir",
            "/tmp/x",
        ]
    )
    assert ctx.params["tensor_parallel_size"] == 2
    assert ctx.params["served_model_name"] == ("a", "b")
    assert ctx.args == ["meta-llama/Llama-3-8B", "--trust-remote-code", "--download-dir", "/tmp/x"]


def test_unknown_vllm_flags_are_ignored_with_a_warning(caplog) -> None:
    # A configuration that stops right after the flags are read (70B on one GPU), so nothing is served.
    result = invoke(
        ["--model", "meta-llama/Llama-3-70B", "--enable-chunked-prefill", "--swap-space", "4", "--gpu-memory-utilization", "0.9"]
    )
    assert "ignoring vLLM flag(s) the simulator does not model: --enable-chunked-prefill --swap-space 4" in caplog.text
    assert result.exit_code == 1


def test_env_fallbacks_for_the_simulator_flags(monkeypatch) -> None:
    for key, value in {
        "KNEEPOINT_SIM_GPU": "NVIDIA-H100-80GB-HBM3",
        "KNEEPOINT_SIM_INTERCONNECT": "pcie",
        "KNEEPOINT_SIM_ARCHITECTURE": "llama-3-8b",
        "KNEEPOINT_SIM_NOISE": "0.1",
        "KNEEPOINT_SIM_DCGM_PORT": "0",
        "KNEEPOINT_SIM_MODEL_LOAD_SECONDS": "0.5",
        "KNEEPOINT_SIM_INTER_NODE_GBPS": "25",
        "KNEEPOINT_SIM_SEED": "7",
    }.items():
        monkeypatch.setenv(key, value)
    s = settings(["--model", "anything", "-pp", "2"])
    assert s.gpu.name == "h100-sxm" and s.interconnect == "pcie" and s.noise == 0.1 and s.seed == 7
    assert s.dcgm_port == 0 and s.model_load_seconds == 0.5
    assert s.perf.hardware.inter_node_gbps == 25.0 and s.gpus == 2


def test_vllm_defaults_for_the_gpu() -> None:
    s = settings(["--model", "meta-llama/Llama-3.1-8B-Instruct"])
    assert s.max_num_seqs == 1024 and s.max_num_batched_tokens == 8192 and s.max_model_len == 8192
    assert s.memory_used_bytes_per_gpu == int(0.92 * get_gpu_type("h200").memory_bytes)
    assert s.model_load_seconds == pytest.approx(s.weights_bytes_per_gpu / 2e9)
    s = settings(["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "l40s"])
    assert s.max_num_seqs == 256 and s.max_num_batched_tokens == 2048 and s.interconnect == "pcie"


def test_architecture_from_a_config_file_and_inline_json(tmp_path) -> None:
    config = {
        "model_type": "llama",
        "num_hidden_layers": 16,
        "hidden_size": 2048,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 8192,
        "vocab_size": 128256,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    a = settings(["--model", "m", "--architecture", str(path), "--max-model-len", "2048"])
    b = settings(["--model", "m", "--architecture", json.dumps(config), "--max-model-len", "2048"])
    assert a.weights_bytes_per_gpu == b.weights_bytes_per_gpu > 0


def test_max_model_len_spellings() -> None:
    assert parse_max_model_len("4096") == 4096
    assert parse_max_model_len("32k") == 32000
    assert parse_max_model_len("32K") == 32768
    assert parse_max_model_len("auto") is None and parse_max_model_len("-1") is None
    s = settings(["--model", "meta-llama/Llama-3.1-8B", "--max-model-len", "auto"])
    assert s.max_model_len == 131072


def test_a_placeholder_model_name_runs_as_the_calibrated_8b_and_says_so(caplog) -> None:
    """`kneepoint sim --model m --tensor-parallel-size 2 --gpu h200` (the README's try-out) starts."""
    with caplog.at_level("WARNING", logger="kneepoint.sim"):
        s = settings(["--model", "m", "--tensor-parallel-size", "2", "--gpu", "h200"])
    named = settings(["--model", "meta-llama/Llama-3.1-8B-Instruct", "--tensor-parallel-size", "2", "--gpu", "h200"])
    assert s.weights_bytes_per_gpu == named.weights_bytes_per_gpu and s.gpus == 2
    assert "'m' matches no preset: simulating llama-3-8b" in caplog.text


def test_async_scheduling_is_on_as_in_vllm_024_and_can_be_turned_off() -> None:
    base = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h200", "--max-model-len", "4096"]
    assert scheduler_config(settings(base)).async_scheduling is True
    assert scheduler_config(settings([*base, "--no-async-scheduling"])).async_scheduling is False


def _shipped_calibration() -> dict:
    from kneepoint.core.catalog_files import load_data_file
    from kneepoint.simulator.calibration import CALIBRATION_FILE

    return copy.deepcopy(load_data_file(CALIBRATION_FILE))  # the loader's cached document is shared


def test_a_calibration_file_replaces_the_shipped_constants(tmp_path, monkeypatch) -> None:
    # A host whose memory streams the weights at half the shipped share: the same engine's decode step takes longer,
    # from the flag and from its environment fallback alike; without either, the shipped constants.
    doc = _shipped_calibration()
    doc["compute"]["weightBandwidthEfficiency"] /= 2
    slow = tmp_path / "slow-host.json"
    slow.write_text(json.dumps(doc))
    flags = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu", "h200"]
    shipped = settings(flags).perf
    from_flag = settings([*flags, "--calibration", str(slow)]).perf
    assert from_flag.calibration.compute.weight_bandwidth_efficiency == pytest.approx(
        shipped.calibration.compute.weight_bandwidth_efficiency / 2
    )
    assert from_flag.decode_step(1, 512).seconds > 1.5 * shipped.decode_step(1, 512).seconds
    monkeypatch.setenv("KNEEPOINT_SIM_CALIBRATION", str(slow))
    assert settings(flags).perf.decode_step(1, 512).seconds == from_flag.decode_step(1, 512).seconds


def test_a_calibration_file_that_is_not_one_exits_2_naming_the_flag_and_what_is_wrong(tmp_path) -> None:
    doc = _shipped_calibration()
    del doc["serving"]["apiGateUsPerRequest"]
    no_gate = tmp_path / "no-gate.json"
    no_gate.write_text(json.dumps(doc))
    doc = _shipped_calibration()
    doc["compute"]["fp8GemmRowFactors"] = [[24, 1.3], [16, 1.0]]
    unordered = tmp_path / "unordered.json"
    unordered.write_text(json.dumps(doc))
    (tmp_path / "half.json").write_text('{"compute": ')
    for path, says in (
        (tmp_path / "absent.json", "cannot read"),
        (tmp_path / "half.json", "not a JSON document"),
        (no_gate, "lacks the field 'apiGateUsPerRequest'"),
        (unordered, "compute.fp8GemmRowFactors must be [rows, factor] pairs"),
    ):
        result = invoke(["--model", "meta-llama/Llama-3.1-8B-Instruct", "--calibration", str(path)])
        assert result.exit_code == 2, result.output
        last = result.output.strip().splitlines()[-1]
        assert last.startswith(f"kneepoint sim: --calibration: {path}") and says in last, last
        assert "Traceback" not in result.output
