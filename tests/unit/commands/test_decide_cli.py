"""`kneepoint decide FILE`: outputs for YAML/JSON/CSV input and one-line errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from kneepoint.cli import cli

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "deploy" / "examples" / "recorded-h200.yaml"


def run(*args: str, stdin: str | None = None):
    return CliRunner().invoke(cli, ["decide", *args], input=stdin)


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def example_doc() -> dict:
    return yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))


def test_recorded_example_prints_table_comparison_and_decision():
    result = run(str(EXAMPLE))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "tier  GPUs  phase" in out
    assert "TP1      1  Skipped" in out and "does not fit" in out
    assert (
        "TP2 -> TP4: T2=1236 tok/s T4=1897 tok/s ΔT=+0.54; P2=6764 ms P4=4395 ms ΔP=-0.35; M2=70.9 GiB M4=35.6 GiB; C2=0.08 C4=0.17" in out
    )
    assert "conclusion: go on to TP4" in out
    assert "decision: TP4 (4 GPUs per replica), rule last-tier" in out
    assert "classification: does-not-fit" in out
    assert "replicas: 11 (total GPUs 44)" in out
    assert "cost per million output tokens: 2.05" in out


def test_json_output_is_the_status_with_gains_and_decision():
    result = run(str(EXAMPLE), "--output", "json")
    assert result.exit_code == 0, result.output
    status = json.loads(result.stdout)
    assert status["decision"]["rule"] == "last-tier"
    assert status["decision"]["tensorParallel"] == 4
    assert status["decision"]["replicas"] == 11
    assert status["tiers"][2]["throughputGain"] == pytest.approx(0.5353, abs=1e-4)
    assert status["tiers"][1]["costPerMillionTokens"] == pytest.approx(1.5736, abs=1e-4)
    assert "throughputGain" not in status["tiers"][0]


def test_yaml_output_round_trips():
    result = run(str(EXAMPLE), "-o", "yaml")
    assert result.exit_code == 0, result.output
    status = yaml.safe_load(result.stdout)
    assert status["decision"]["classification"] == "does-not-fit"
    assert [t["name"] for t in status["tiers"]] == ["tp1-pp1", "tp2-pp1", "tp4-pp1"]


def test_json_document_input(tmp_path):
    path = write(tmp_path, "exp.json", json.dumps(example_doc()))
    result = run(path)
    assert result.exit_code == 0, result.output
    assert "decision: TP4" in result.stdout


def test_kubectl_list_with_one_item_and_bare_status(tmp_path):
    doc = example_doc()
    listed = write(tmp_path, "list.yaml", yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [doc]}))
    assert "decision: TP4" in run(listed).stdout
    bare = write(tmp_path, "status.yaml", yaml.safe_dump(doc["status"]))
    result = run(bare)
    assert result.exit_code == 0, result.output
    assert "stop rules (defaults, the file has no spec)" in result.stdout
    assert "decision: TP4" in result.stdout


def test_csv_of_tier_rows(tmp_path):
    path = write(
        tmp_path,
        "tiers.csv",
        "name,phase,outputTokensPerSecond,latencyP99Ms,peakMemoryGiB,gpuMemoryGiB,doesNotFit\n"
        "tp1-pp1,Measured,1000,1000,130,140,\n"
        "tp2-pp1,Measured,1100,900,70,140,\n"
        "tp4-pp1,,1900,800,35,140,\n",
    )
    result = run(path)
    assert result.exit_code == 0, result.output
    assert "conclusion: stay at TP1 (rule: throughput-gain, column ΔT)" in result.stdout
    assert "decision: TP1 (1 GPU per replica), rule throughput-gain" in result.stdout


def test_spec_ladder_with_an_absent_tier_is_not_decided_yet(tmp_path):
    doc = example_doc()
    doc["spec"]["tiers"]["tensorParallel"] = [1, 2, 4, 8]
    result = run(write(tmp_path, "partial.yaml", yaml.safe_dump(doc, allow_unicode=True)))
    assert result.exit_code == 0, result.output
    assert "TP8      8  Pending" in result.stdout
    assert "decision: none (continue: no stop rule fired yet; TP8 is Pending" in result.stdout
    result = run(write(tmp_path, "partial2.yaml", yaml.safe_dump(doc, allow_unicode=True)), "--budget-stopped")
    assert "decision: TP4 (4 GPUs per replica), rule budget" in result.stdout


def test_stdin(tmp_path):
    result = run("-", stdin=EXAMPLE.read_text(encoding="utf-8"))
    assert result.exit_code == 0, result.output
    assert "decision: TP4" in result.stdout


def _tier_doc(**tier_fields) -> str:
    tier = {"name": "tp1-pp1", "phase": "Measured", "outputTokensPerSecond": 100.0}
    tier.update(tier_fields)
    return yaml.safe_dump({"apiVersion": "kneepoint.io/v1alpha1", "kind": "ParallelismExperiment", "status": {"tiers": [tier]}})


@pytest.mark.parametrize(
    "name, text, expected",
    [
        ("bad.yaml", "status: [unclosed\n", "not valid YAML (line"),
        ("bad.json", '{"status": ', "not valid JSON (line 1"),
        ("list.yaml", "- 1\n- 2\n", "expected a ParallelismExperiment document (a mapping), got list"),
        ("kind.yaml", "kind: Deployment\nstatus: {tiers: []}\n", "kind: expected ParallelismExperiment, got 'Deployment'"),
        ("nostatus.yaml", "kind: ParallelismExperiment\nspec: {}\n", "status.tiers: missing"),
        ("empty.yaml", "kind: ParallelismExperiment\nstatus: {tiers: []}\n", "status.tiers: expected a non-empty list"),
        ("field.yaml", _tier_doc(latencyP99ms=5), "status.tiers[0].latencyP99ms: unknown tier field"),
        ("number.yaml", _tier_doc(latencyP99Ms="fast"), "status.tiers[0].latencyP99Ms: expected a number, got 'fast'"),
        ("phase.yaml", _tier_doc(phase="Done"), "status.tiers[0].phase: expected one of Pending"),
        (
            "tps.yaml",
            _tier_doc(outputTokensPerSecond=None),
            "status.tiers[0].outputTokensPerSecond: a Measured tier needs a positive number",
        ),
        ("name.yaml", _tier_doc(name="tp-two"), "status.tiers[0].name: expected tpN-ppM"),
        ("gpus.yaml", _tier_doc(gpus=3), "status.tiers[0].gpus: expected tensorParallel x pipelineParallel = 1, got 3"),
        (
            "spec.yaml",
            "kind: ParallelismExperiment\nspec: {stopRules: {minThroughputGain: 2}}\nstatus: {tiers: [{name: tp1-pp1}]}\n",
            "spec.stopRules.minThroughputGain: must be at most 1.0",
        ),
        (
            "ladder.yaml",
            "kind: ParallelismExperiment\nspec: {tiers: {tensorParallel: [1, 2]}}\nstatus: {tiers: [{name: tp16-pp1}]}\n",
            "status.tiers[0]: tier tp16-pp1 is not in the ladder of spec.tiers (tp1-pp1, tp2-pp1)",
        ),
        ("rows.csv", "name,latencyP99Ms\ntp1-pp1,slow\n", "line 2, column latencyP99Ms: expected a number, got 'slow'"),
        ("cols.csv", "name,colour\ntp1-pp1,red\n", "column 'colour': unknown tier field"),
        ("dup.csv", "name,outputTokensPerSecond\ntp1-pp1,10\ntp1-pp1,20\n", "both use 1 GPUs"),
    ],
)
def test_bad_input_is_one_line_naming_file_and_field(tmp_path, name, text, expected):
    path = write(tmp_path, name, text)
    result = run(path)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"kneepoint decide: error: {path}: ")
    assert expected in err
    assert result.stdout == ""


def test_missing_file_bad_output_and_no_argument_exit_2(tmp_path):
    missing = str(tmp_path / "nope.yaml")
    for args, expected in (
        ([missing], f"{missing}: no such file"),
        ([str(EXAMPLE), "--output", "xml"], "--output: expected one of table, json, yaml, got 'xml'"),
        ([], "FILE: missing"),
    ):
        result = run(*args)
        assert result.exit_code == 2
        assert expected in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_real_process_prints_the_decision_without_traceback(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "kneepoint", "decide", str(EXAMPLE)], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "decision: TP4" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "kneepoint", "decide", write(tmp_path, "x.yaml", "status: {tiers: [{name: tp1-pp1, gpus: x}]}\n")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr
    assert "status.tiers[0].gpus: expected a whole number, got 'x'" in bad.stderr


def test_a_tier_with_predict_firsts_prediction_is_read_and_a_bad_nested_key_named(tmp_path):
    # status.tiers[].prediction is what predict-first writes (kneepoint demo and report read such a status).
    doc = example_doc()
    measured = next(t for t in doc["status"]["tiers"] if t.get("phase") == "Measured")
    measured["prediction"] = {"outputTokensPerSecond": 3205.0, "latencyP99Ms": 2499.0, "throughputBand": 0.03, "p99Band": 0.42}
    result = run(write(tmp_path, "predicted.yaml", yaml.safe_dump(doc)))
    assert result.exit_code == 0, result.output
    assert "decision:" in result.stdout
    measured["prediction"] = {"tokensPerSecond": 1.0}
    result = run(write(tmp_path, "bad.yaml", yaml.safe_dump(doc)))
    assert result.exit_code == 2
    assert "prediction.tokensPerSecond: unknown field; expected one of" in result.output
