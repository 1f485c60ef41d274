"""``kneepoint estimate`` through click's CliRunner: the table, JSON, listings and one-line errors."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kneepoint.cli import cli
from kneepoint.core.architectures import preset_names
from kneepoint.core.gpus import gpu_names


def run(*args: str):
    return CliRunner().invoke(cli, ["estimate", *args])


def test_done_criterion_llama_70b_on_h200():
    result = run("--preset", "llama-3-70b", "--gpu", "h200")
    assert result.exit_code == 0, result.output
    rows = {line.split()[0]: line for line in result.output.splitlines() if line.startswith("TP") and "GiB" in line and "  " in line}
    assert "NO: weights > budget" in rows["TP1"] and rows["TP1"].rstrip().endswith(" 0")
    for tier in ("TP2", "TP4", "TP8"):
        assert " yes " in rows[tier]
        assert int(rows[tier].split()[-1]) > 32
    assert "TP1: weights 131.4 GiB/GPU exceed the budget 125.8 GiB (0.90 x 139.8 GiB)" in result.output
    assert "gpu-memory-utilization 0.90" in result.output


def test_json_output_has_every_tier():
    result = run("--preset", "llama-3-70b", "--gpu", "NVIDIA-H200", "--output", "json", "--tp", "1,2", "--pp", "1,2")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert [t["tier"]["name"] for t in doc["tiers"]] == ["tp1-pp1", "tp2-pp1", "tp2-pp2"]
    assert doc["tiers"][0]["fits"] is False and doc["tiers"][1]["fits_target"] is True
    assert doc["architecture"]["num_parameters"] == 70553706496 and doc["gpu"]["name"] == "h200"


def test_whole_gpu_70b_tp1_matches_the_measured_bracket():
    result = run(
        "--preset",
        "llama-3-70b",
        "--gpu",
        "h200",
        "--tp",
        "1",
        "--gpu-memory-utilization",
        "1.0",
        "--concurrency",
        "32",
        "--context",
        "1025",
        "--max-model-len",
        "1025",
        "--max-num-batched-tokens",
        "1024",
        "--output",
        "json",
    )
    tier = json.loads(result.output)["tiers"][0]
    assert tier["fits"] and not tier["fits_target"] and 16 <= tier["max_concurrent_sequences"] < 32


def test_context_from_input_and_output_lengths_and_options():
    result = run(
        "--preset",
        "llama-3-8b",
        "--gpu",
        "l40s",
        "--input-len",
        "2000",
        "--output-len",
        "48",
        "--dtype",
        "fp8",
        "--kv-cache-dtype",
        "fp8",
        "--enforce-eager",
        "--tp",
        "1",
        "--output",
        "json",
    )
    assert result.exit_code == 0, result.output
    tier = json.loads(result.output)["tiers"][0]
    assert tier["context_len"] == 2048 and tier["kv_cache_dtype"] == "fp8" and tier["dtype"] == "fp8"
    assert tier["cuda_graph_bytes_per_gpu"] == 0 and tier["max_num_batched_tokens"] == 2048


def test_config_json_and_model_name_and_explicit_shape(tmp_path):
    config = {
        "model_type": "mistral",
        "num_hidden_layers": 32,
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 32768,
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    by_config = json.loads(run("--config", str(path), "--gpu", "h100-sxm", "--output", "json").output)
    by_preset = json.loads(run("--preset", "mistral-7b", "--gpu", "h100-sxm", "--output", "json").output)
    assert [t["weights_bytes_per_gpu"] for t in by_config["tiers"]] == [t["weights_bytes_per_gpu"] for t in by_preset["tiers"]]
    by_model = json.loads(run("--model", "mistralai/Mistral-7B-Instruct-v0.3", "--gpu", "h100-sxm", "--output", "json").output)
    assert by_model["architecture"]["name"] == "mistral-7b"
    explicit = run(
        "--num-layers",
        "32",
        "--hidden-size",
        "4096",
        "--num-attention-heads",
        "32",
        "--num-key-value-heads",
        "8",
        "--intermediate-size",
        "14336",
        "--vocab-size",
        "32768",
        "--gpu",
        "h100-sxm",
        "--output",
        "json",
    )
    assert explicit.exit_code == 0, explicit.output
    assert [t["weights_bytes_per_gpu"] for t in json.loads(explicit.output)["tiers"]] == [
        t["weights_bytes_per_gpu"] for t in by_preset["tiers"]
    ]


def test_listings():
    presets = run("--list-presets")
    assert presets.exit_code == 0 and all(name in presets.output for name in preset_names())
    gpus = run("--list-gpus")
    assert gpus.exit_code == 0 and all(name in gpus.output for name in gpu_names())


@pytest.mark.parametrize(
    "args, message",
    [
        (["--preset", "llama-9", "--gpu", "h200"], "--preset: unknown preset 'llama-9'; known: llama-3.2-1b"),
        (["--preset", "llama-3-8b", "--gpu", "h20"], "--gpu: unknown GPU type 'h20'; known: h200"),
        (["--preset", "llama-3-8b"], "--gpu: required; one of h200"),
        (["--gpu", "h200"], "give exactly one architecture source"),
        (["--preset", "llama-3-8b", "--model", "x", "--gpu", "h200"], "give exactly one architecture source"),
        (["--preset", "llama-3-8b", "--gpu", "h200", "--dtype", "fp4"], "--dtype: must be one of float32, bfloat16"),
        (["--preset", "llama-3-8b", "--gpu", "h200", "--kv-cache-dtype", "int8"], "--kv-cache-dtype: must be one of auto, fp8"),
        (["--preset", "llama-3-8b", "--gpu", "h200", "--tp", "1,3"], "--tp: 3 is not allowed; use a comma-separated list of 1, 2, 4"),
        (["--preset", "llama-3-8b", "--gpu", "h200", "--pp", "x"], "--pp: expected a comma-separated list"),
        (["--preset", "llama-3-8b", "--gpu", "h200", "--concurrency", "abc"], "'--concurrency': 'abc' is not a valid integer"),
        (["--preset", "llama-3-8b", "--gpu", "h200", "--concurrency", "0"], "--concurrency: must be at least 1"),
        (["--preset", "llama-3-8b", "--gpu", "h200", "--gpu-memory-utilization", "1.2"], "--gpu-memory-utilization: must be in (0, 1]"),
        (["--preset", "llama-3-8b", "--gpu", "h200", "--context", "5000"], "--context: 5000 tokens exceed --max-model-len 4096"),
        (["--preset", "llama-3-8b", "--gpu", "h200", "--context", "10", "--input-len", "5"], "--context: give either"),
        (["--preset", "llama-3-8b", "--gpu", "h200", "--output", "yaml"], "--output: must be table or json"),
        (["--preset", "llama-3-8b", "--gpu", "h200", "--interconnect", "ib"], "--interconnect: must be one of nvlink, pcie"),
        (["--preset", "llama-3-8b", "--gpu", "h200", "--bogus"], "No such option '--bogus'"),
        (["--config", "/nonexistent/config.json", "--gpu", "h200"], "--config: cannot read '/nonexistent/config.json'"),
        (
            ["--num-layers", "2", "--hidden-size", "8", "--num-attention-heads", "2", "--intermediate-size", "8", "--gpu", "h200"],
            "--vocab-size: is required",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = run(*args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert lines[0].startswith("Error: ") and message in lines[0], lines[0]


def test_bad_config_json_is_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("{")
    result = run("--config", str(path), "--gpu", "h200")
    assert result.exit_code == 2 and "--config:" in result.output and "is not JSON" in result.output
    path.write_text(json.dumps({"hidden_size": 8}))
    result = run("--config", str(path), "--gpu", "h200")
    assert result.exit_code == 2 and "missing 'num_hidden_layers'" in result.output and len(result.output.strip().splitlines()) == 1
