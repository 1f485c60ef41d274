"""`kneepoint report`: text/JSON/Markdown output, the PNG, the cross-check, --watch, one-line errors."""

from __future__ import annotations

import copy
import json
import struct
import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner
from pexp_docs import (
    RECORDED,
    FakeCluster,
    all_skipped,
    experiment,
    failed_middle,
    install_fake_cluster,
    pp_ladder,
    recorded,
    simulated,
    tier,
    write_doc,
)

from kneepoint.cli import cli
from kneepoint.commands import experiment_source
from kneepoint.commands.experiment_source import InputError, NotFoundError
from kneepoint.commands.report import progress_line, watch_experiment


def run(*args: str):
    return CliRunner().invoke(cli, ["report", *args])


def png_size(path) -> tuple[int, int]:
    with open(path, "rb") as fh:
        data = fh.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


# --------------------------------------------------------------------------------------
# From a file


def test_recorded_example_table_decision_kserve_and_gpu_minutes():
    result = run(str(RECORDED))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.startswith(f"experiment default/llama-3-70b-h200-recorded (file {RECORDED})\n")
    assert (
        "model meta-llama/Meta-Llama-3-70B (bfloat16) on NVIDIA-H200; mode Measure; workload concurrency 32, 1024 in / 256 out tokens"
        in out
    )
    assert "tier  GPUs  phase" in out and "TP1      1  Skipped" in out
    assert "TP2 -> TP4: T2=1236 tok/s T4=1897 tok/s ΔT=+0.54; P2=6764 ms P4=4395 ms ΔP=-0.35" in out
    assert "decision: TP4 (4 GPUs per replica), rule last-tier" in out
    assert "replicas: 11 (total GPUs 44)" in out
    assert (
        "KServe recommendation (computed here; the operator publishes it once Decided): InferenceService meta-llama-3-70b, "
        "4 GPUs per replica, minReplicas 1, maxReplicas 11, scaling on vllm:num_requests_running at 32 per replica" in out
    )
    assert "GPU-minutes: not recorded" in out
    assert "SIMULATED" not in out and "cross-check" not in out
    assert "\x1b" not in out


def test_png_written_from_the_cli(tmp_path):
    png = tmp_path / "knee.png"
    result = run(str(RECORDED), "--png", str(png))
    assert result.exit_code == 0, result.output
    assert png_size(png) == (1350, 840)
    assert 20_000 < png.stat().st_size < 1_000_000
    assert result.stdout.rstrip().endswith(f"chart: {png}")


def test_png_without_matplotlib_says_how_to_install_it(tmp_path):
    # A fresh interpreter without matplotlib, as in the operator's image (no `report` extra).
    def report(*args: str) -> subprocess.CompletedProcess[str]:
        code = "import sys; sys.modules['matplotlib'] = None; from kneepoint.cli import main; sys.argv[0] = 'kneepoint'; main()"
        return subprocess.run([sys.executable, "-c", code, "report", str(RECORDED), *args], capture_output=True, text=True, timeout=60)

    assert report().returncode == 0  # the report itself needs no matplotlib
    png = tmp_path / "knee.png"
    result = report("--png", str(png))
    assert result.returncode == 2 and not png.exists()
    assert (
        result.stderr.strip() == "kneepoint report: error: --png needs matplotlib, which is not installed: pip install 'kneepoint[report]'"
    )


@pytest.mark.parametrize(
    "doc, expected",
    [
        (all_skipped, "decision: none (undecidable: no tier was measured: TP1 does not fit"),
        (failed_middle, "decision: TP4 (4 GPUs per replica), rule throughput-gain"),
        (pp_ladder, "decision: TP8xPP2 (16 GPUs per replica), rule last-tier"),
        (simulated, "decision: TP1 (1 GPU per replica), rule throughput-gain"),
    ],
)
def test_synthetic_experiments_report_and_chart(tmp_path, doc, expected):
    png = tmp_path / "chart.png"
    result = run(write_doc(tmp_path, doc()), "--png", str(png))
    assert result.exit_code == 0, result.output
    assert expected in result.stdout
    assert png_size(png) == (1350, 840)


def test_failed_middle_tier_row_and_comparison_skip_it(tmp_path):
    out = run(write_doc(tmp_path, failed_middle())).stdout
    assert "TP2      2  Failed" in out and "CrashLoopBackOff" in out
    assert "TP1 -> TP4: T1=500 tok/s T4=1400 tok/s ΔT=+1.80" in out
    assert "conclusion: stay at TP4 (rule: throughput-gain, column ΔT)" in out
    assert "maxReplicas 6" in out


def test_pp_decision_kserve_line_names_the_nodes(tmp_path):
    doc = pp_ladder()
    doc["spec"]["model"]["uri"] = "pvc://models/llama-3-70b"
    out = run(write_doc(tmp_path, doc)).stdout
    assert "16 GPUs per replica (TP8 on each of 2 nodes)" in out
    assert "fixed replicas (multi-node: autoscalerClass none)" in out


def test_pp_decision_on_hub_storage_says_why_there_is_no_inference_service(tmp_path):
    out = run(write_doc(tmp_path, pp_ladder())).stdout
    assert "KServe recommendation: no InferenceService (the LeaderWorkerSet manifest deploys this tier): " in out
    assert "accepts only pvc:// or oci:// storage" in out


def test_simulated_is_said_clearly(tmp_path):
    result = run(write_doc(tmp_path, simulated()))
    out = result.stdout
    banner = "SIMULATED: these numbers come from kneepoint's engine simulator, not from GPUs"
    assert out.splitlines()[1] == banner and out.rstrip().endswith(banner)
    assert "simulated: yes (engine simulator, not GPUs)" in out
    doc = json.loads(run(write_doc(tmp_path, simulated()), "-o", "json").stdout)
    assert doc["simulated"] is True


def test_json_output(tmp_path):
    result = run(str(RECORDED), "--output", "json", "--png", str(tmp_path / "c.png"))
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["experiment"] == {"name": "llama-3-70b-h200-recorded", "namespace": "default", "source": "file", "where": str(RECORDED)}
    assert doc["state"] == "decided"
    assert doc["decision"]["tensorParallel"] == 4 and doc["decision"]["replicas"] == 11
    assert doc["decisionMatchesStatus"] is None and doc["statusDecision"] is None
    assert doc["kserve"]["maxReplicas"] == 11 and doc["kserve"]["gpusPerReplica"] == 4 and doc["kserve"]["configMapName"] is None
    assert doc["tiers"][2]["throughputGain"] == pytest.approx(0.5353, abs=1e-4)
    assert doc["gpuMinutes"] == {"perTier": {"TP1": None, "TP2": None, "TP4": None}, "total": None, "totalSource": None}
    assert doc["chart"] == str(tmp_path / "c.png")


def test_markdown_output(tmp_path):
    result = run(str(RECORDED), "-o", "markdown", "--png", str(tmp_path / "c.png"))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.startswith("## experiment default/llama-3-70b-h200-recorded")
    assert "| tier | GPUs | phase | out tok/s |" in out
    assert "| TP4 | 4 | Measured | 1897 |" in out
    assert "```text\ndecision: TP4 (4 GPUs per replica), rule last-tier" in out
    assert f"![throughput and P99 per tier, knee marked]({tmp_path / 'c.png'})" in out


def test_gpu_minutes_per_tier_and_total(tmp_path):
    doc = failed_middle()
    for t, minutes in zip(doc["status"]["tiers"], (4.5, 3.0, 20.25, 41.0)):
        t["gpuMinutes"] = minutes
    out = run(write_doc(tmp_path, doc)).stdout
    assert "GPU-minutes: TP1 4.5, TP2 3.0, TP4 20.2, TP8 41.0; total 68.8 GPU-min = 1.15 GPU-h (sum of the tiers)" in out
    doc["status"]["gpuMinutesTotal"] = 70.0
    out = run(write_doc(tmp_path, doc)).stdout
    assert "total 70.0 GPU-min = 1.17 GPU-h (status.gpuMinutesTotal)" in out


def _decision(tp: int, replicas: int, rule: str) -> dict:
    return {"tensorParallel": tp, "pipelineParallel": 1, "gpusPerReplica": tp, "replicas": replicas, "rule": rule, "reason": "r"}


def test_cross_check_agrees_or_notes_the_difference(tmp_path):
    doc = failed_middle()
    doc["status"]["phase"] = "Decided"
    doc["status"]["decision"] = _decision(4, 6, "throughput-gain")
    out = run(write_doc(tmp_path, doc)).stdout
    assert "cross-check: status.decision agrees" in out and "note:" not in out.split("decision: TP4")[1]
    doc["status"]["decision"] = _decision(8, 6, "last-tier")
    result = run(write_doc(tmp_path, doc))
    assert result.exit_code == 0
    assert (
        "note: status.decision (TP8 x 6 replicas, rule last-tier) differs from the decision re-computed from status.tiers "
        "and the spec (TP4 x 6 replicas, rule throughput-gain)" in result.stdout
    )
    assert json.loads(run(write_doc(tmp_path, doc), "-o", "json").stdout)["decisionMatchesStatus"] is False


def test_budget_decision_is_recomputed_as_budget(tmp_path):
    doc = experiment([tier(1, tps=500, p99=9000), tier(2, tps=900, p99=7000), tier(4, phase="Skipped", reason="budget")])
    doc["spec"]["tiers"]["tensorParallel"] = [1, 2, 4]
    doc["status"]["decision"] = _decision(2, 6, "budget")
    out = run(write_doc(tmp_path, doc)).stdout
    assert "decision: TP2 (2 GPUs per replica), rule budget" in out
    assert "cross-check: status.decision agrees" in out


def test_published_recommendation_is_shown(tmp_path):
    doc = failed_middle()
    doc["status"].update(
        phase="Decided",
        decision=_decision(4, 6, "throughput-gain"),
        recommendation={
            "configMapName": "synthetic-kserve",
            "minReplicas": 1,
            "maxReplicas": 6,
            "scaleMetric": "concurrency",
            "scaleTarget": 16,
        },
    )
    out = run(write_doc(tmp_path, doc)).stdout
    assert "KServe recommendation (published in ConfigMap synthetic-kserve): InferenceService test-model-70b, 4 GPUs per replica" in out


def test_in_progress_experiment_has_no_decision_yet(tmp_path):
    doc = experiment(
        [tier(1, tps=500, p99=9000), tier(2, phase="LoadTesting")], phase="Profiling", currentTier="tp2-pp1", message="load-testing TP2"
    )
    out = run(write_doc(tmp_path, doc)).stdout
    assert "phase Profiling; current tier tp2-pp1; load-testing TP2" in out
    assert "decision: none (continue: no stop rule fired yet; TP2 is LoadTesting" in out
    assert "TP8      8  Pending" in out
    assert "KServe recommendation: none yet (the experiment is not decided)" in out


def test_csv_input_without_spec(tmp_path):
    path = tmp_path / "tiers.csv"
    path.write_text("name,outputTokensPerSecond,latencyP99Ms\ntp1-pp1,1000,900\ntp2-pp1,1100,850\n", encoding="utf-8")
    out = run(str(path), "--png", str(tmp_path / "c.png")).stdout
    assert "stop rules (defaults, the input has no spec)" in out
    assert "decision: TP1 (1 GPU per replica), rule throughput-gain" in out
    assert "KServe recommendation: needs the experiment's spec" in out


# --------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--output", "xml", str(RECORDED)], "--output: expected one of table, json, markdown, got 'xml'"),
        ([], "NAME_OR_FILE: missing"),
        (["/nonexistent/exp.yaml"], "/nonexistent/exp.yaml: no such file"),
        (["exp.yaml"], "exp.yaml: no such file"),
        ([str(RECORDED), "--watch"], "--watch: follows an experiment on the cluster"),
        ([str(RECORDED), "--png", "/nonexistent/dir/c.png"], "--png /nonexistent/dir/c.png: cannot write: No such file or directory"),
        ([str(RECORDED), "--interval", "soon"], "--interval: expected seconds between 0.1 and 3600, got 'soon'"),
    ],
)
def test_errors_are_one_line_with_exit_2(args, expected):
    result = run(*args)
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and err.startswith("kneepoint report: error: ")
    assert expected in err
    assert result.stdout == ""


def test_bad_file_field_and_bad_status_decision(tmp_path):
    doc = recorded()
    doc["status"]["tiers"][1]["latencyP99Ms"] = "slow"
    result = run(write_doc(tmp_path, doc))
    assert result.exit_code == 2
    assert "status.tiers[1].latencyP99Ms: expected a number, got 'slow'" in result.stderr
    doc = recorded()
    doc["status"]["decision"] = {"tensorParallel": 4, "replicas": "many"}
    result = run(write_doc(tmp_path, doc))
    assert result.exit_code == 2
    assert "status.decision.replicas: expected a whole number of at least 1, got 'many'" in result.stderr


def test_document_with_neither_spec_nor_tiers(tmp_path):
    result = run(write_doc(tmp_path, {"kind": "ParallelismExperiment", "status": {"phase": "Pending"}}))
    assert result.exit_code == 2
    assert "status.tiers: expected a non-empty list of tier results, or a spec with a ladder" in result.stderr


def test_real_process_has_no_traceback(tmp_path):
    bad = subprocess.run(
        [sys.executable, "-m", "kneepoint", "report", write_doc(tmp_path, {"kind": "Deployment"})],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "kind: expected ParallelismExperiment, got 'Deployment'" in bad.stderr


# --------------------------------------------------------------------------------------
# From the cluster (a fake ClusterSource; the real one is exercised in the sandbox)


def test_report_from_cluster_by_name(monkeypatch, tmp_path):
    doc = failed_middle()
    doc["status"].update(phase="Decided", decision=_decision(4, 6, "throughput-gain"))
    opened = install_fake_cluster(monkeypatch, FakeCluster({"synthetic": doc}))
    result = run("synthetic", "-n", "team-a", "--kubeconfig", "/k", "--png", str(tmp_path / "c.png"))
    assert result.exit_code == 0, result.output
    assert opened == [("/k", "team-a")]
    assert result.stdout.startswith("experiment team-a/synthetic (cluster, experiment team-a/synthetic)")
    assert "`kneepoint export synthetic --kserve -n team-a` prints it" in result.stdout
    assert png_size(tmp_path / "c.png") == (1350, 840)


def test_report_experiment_not_found(monkeypatch):
    install_fake_cluster(monkeypatch, FakeCluster({}))
    result = run("missing")
    assert result.exit_code == 2
    assert result.stderr.strip() == "kneepoint report: error: experiment team-a/missing not found"


def _stages() -> list[dict]:
    """Pending (no status) -> TP1 load test -> TP2 load test -> Decided."""
    final = failed_middle()
    base = copy.deepcopy(final)
    base.pop("status")
    s1 = copy.deepcopy(final)
    s1["status"] = {"phase": "Profiling", "currentTier": "tp1-pp1", "message": "load-testing TP1", "tiers": [tier(1, phase="LoadTesting")]}
    s1b = copy.deepcopy(s1)  # unchanged: no new output
    s2 = copy.deepcopy(final)
    s2["status"] = {
        "phase": "Profiling",
        "currentTier": "tp2-pp1",
        "message": "deploying TP2",
        "tiers": [tier(1, tps=500, p99=12000), tier(2, phase="Deploying")],
    }
    final["status"].update(
        phase="Decided", message="decided: TP4 x 6 replicas (rule throughput-gain)", decision=_decision(4, 6, "throughput-gain")
    )
    return [base, s1, s1b, s2, final]


def test_watch_function_prints_progress_and_tables_on_change():
    cluster = FakeCluster({"synthetic": _stages()})
    lines: list[str] = []
    sleeps: list[float] = []
    exp = watch_experiment(
        lambda: experiment_source.load_from_cluster(cluster, "synthetic", require_tiers=False),
        echo=lines.append,
        warn=lines.append,
        interval=2.0,
        sleep=sleeps.append,
        clock=lambda: 0.0,
    )
    assert exp.phase == "Decided"
    assert sleeps == [2.0, 2.0, 2.0, 2.0]
    progress = [line.split("] ", 1)[1] for line in lines if line.startswith("[")]
    assert progress == [
        "team-a/synthetic: phase Pending (no status yet); 0/4 tiers done",
        "team-a/synthetic: phase Profiling; tier tp1-pp1 LoadTesting; 0/4 tiers done; load-testing TP1",
        "team-a/synthetic: phase Profiling; tier tp2-pp1 Deploying; 1/4 tiers done; deploying TP2",
        "team-a/synthetic: phase Decided; 4/4 tiers done; decided: TP4 x 6 replicas (rule throughput-gain)",
    ]
    tables = [line for line in lines if line.startswith("tier  GPUs")]
    assert len(tables) == 4  # the unchanged read printed nothing
    assert all("\x1b" not in line for line in lines)


def test_watch_retries_a_failed_read_and_stops_when_deleted():
    docs = iter([failed_middle()])
    calls = {"n": 0}

    def fetch():
        calls["n"] += 1
        if calls["n"] == 1:
            doc = next(docs)
            doc["status"]["phase"] = "Profiling"
            return experiment_source.read_document(doc, "experiment team-a/synthetic", require_tiers=False, source="cluster")
        if calls["n"] == 2:
            raise InputError("experiment team-a/synthetic: cannot reach the API server at https://fake (refused)")
        raise NotFoundError("experiment team-a/synthetic not found")

    warnings: list[str] = []
    with pytest.raises(NotFoundError):
        watch_experiment(fetch, echo=lambda _: None, warn=warnings.append, interval=1.0, sleep=lambda _: None)
    assert warnings == ["experiment team-a/synthetic: cannot reach the API server at https://fake (refused) (retrying, 1/5)"]


def test_watch_cli_until_decided_then_report(monkeypatch, tmp_path):
    install_fake_cluster(monkeypatch, FakeCluster({"synthetic": _stages()}))
    png = tmp_path / "c.png"
    result = run("synthetic", "--watch", "--interval", "0.1", "--png", str(png))
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.count("phase Profiling; tier tp1-pp1 LoadTesting") == 1
    assert "phase Decided; 4/4 tiers done" in out
    assert "\nexperiment team-a/synthetic (cluster, experiment team-a/synthetic)\n" in out
    assert "cross-check: status.decision agrees" in out
    assert "\x1b" not in out
    assert png.exists()


def test_watch_cli_failed_experiment_exits_1(monkeypatch):
    doc = all_skipped()
    doc["status"].update(phase="Failed", message="undecidable: no tier was measured")
    install_fake_cluster(monkeypatch, FakeCluster({"big": doc}))
    result = run("big", "--watch", "--interval", "0.1")
    assert result.exit_code == 1
    assert "phase Failed; 4/4 tiers done; undecidable: no tier was measured" in result.stdout


def test_watch_json_keeps_progress_off_stdout(monkeypatch):
    install_fake_cluster(monkeypatch, FakeCluster({"synthetic": _stages()}))
    result = run("synthetic", "--watch", "--interval", "0.1", "-o", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["decision"]["tensorParallel"] == 4
    assert "phase Decided" in result.stderr


def test_progress_line_format():
    doc = experiment([tier(1, phase="Deploying")], phase="Profiling", currentTier="tp1-pp1", message="deploying\n TP1")
    exp = experiment_source.read_document(doc, "x", require_tiers=False)
    line = progress_line(exp, clock=lambda: 0.0)
    assert line.endswith("] team-a/synthetic: phase Profiling; tier tp1-pp1 Deploying; 0/4 tiers done; deploying TP1")
    assert yaml.safe_load(yaml.safe_dump(line)) == line


def test_committed_readme_image_is_a_chart_png():
    # docs/images/recorded-h200-knee.png is generated by:
    #   kneepoint report deploy/examples/recorded-h200.yaml --png docs/images/recorded-h200-knee.png
    image = RECORDED.parents[2] / "docs" / "images" / "recorded-h200-knee.png"
    assert png_size(image) == (1350, 840)
