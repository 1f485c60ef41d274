"""`kneepoint export --kserve`: the InferenceService YAML from a file or the cluster's published ConfigMap."""

from __future__ import annotations

import yaml
from click.testing import CliRunner
from pexp_docs import RECORDED, FakeCluster, experiment, failed_middle, install_fake_cluster, pp_ladder, recorded, tier, write_doc

from kneepoint.cli import cli
from kneepoint.commands.experiment_source import read_file
from kneepoint.core.architectures import get_preset
from kneepoint.core.decision import decide
from kneepoint.kube import kserve
from kneepoint.kube.manifests import BuildContext, Owner


def run(*args: str):
    return CliRunner().invoke(cli, ["export", *args])


def predictor(text: str) -> dict:
    isvc = yaml.safe_load(text)
    assert isvc["apiVersion"] == "serving.kserve.io/v1beta1" and isvc["kind"] == "InferenceService"
    return isvc["spec"]["predictor"]


def test_recorded_example_decided_tier_replicas_and_gpus():
    result = run(str(RECORDED), "--kserve")
    assert result.exit_code == 0, result.output
    p = predictor(result.stdout)
    assert p["minReplicas"] == 1 and p["maxReplicas"] == 11
    # Standard mode by default: KEDA on vLLM's running requests, 32 per replica.
    (metric,) = p["autoScaling"]["metrics"]
    assert metric["external"]["target"] == {"type": "Value", "value": "32"}
    assert "vllm:num_requests_running" in metric["external"]["metric"]["query"]
    limits = p["model"]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "4" and limits["memory"].endswith("Gi") and int(limits["memory"][:-2]) > 130
    assert "--tensor-parallel-size=4" in p["model"]["args"] and "--pipeline-parallel-size=1" in p["model"]["args"]
    assert p["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    meta = yaml.safe_load(result.stdout)["metadata"]
    assert meta["annotations"]["kneepoint.io/decided-by"] == "default/llama-3-70b-h200-recorded"
    assert meta["annotations"]["kneepoint.io/rule"] == "last-tier"


def test_file_export_is_the_text_the_operator_would_publish():
    # The reconciler dumps build_inference_service with yaml.safe_dump(sort_keys=False) into the ConfigMap.
    exp = read_file(str(RECORDED))
    decision = decide(exp.spec, exp.tiers).decision
    owner = Owner("llama-3-70b-h200-recorded", "default", "uid")
    export = kserve.build_export(
        exp.spec,
        owner,
        decision,
        get_preset(exp.spec.model.architecture.preset),
        BuildContext(),
        prometheus_url="http://prometheus-operated.monitoring.svc:9090",
    )
    published = kserve.build_recommendation_configmap(owner, decision, export)["data"]["inferenceservice.yaml"]
    assert run(str(RECORDED), "--kserve").stdout == published


def test_pp_decision_on_hf_storage_is_refused_with_the_reason_and_lws_offered(tmp_path):
    doc = write_doc(tmp_path, pp_ladder())
    result = run(doc, "--kserve")
    assert result.exit_code == 3, result.output
    assert "accepts only pvc:// or oci:// storage" in result.stderr and "kneepoint export NAME --lws" in result.stderr
    lws = yaml.safe_load(run(doc, "--lws").stdout)
    assert lws["kind"] == "LeaderWorkerSet" and lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert lws["spec"]["replicas"] == 6


def test_pp_decision_on_a_claim_uses_worker_spec(tmp_path):
    doc = pp_ladder()
    doc["spec"]["model"]["uri"] = "pvc://models/llama-3-70b"
    doc["spec"]["model"]["architecture"] = {"preset": "llama-3-70b"}
    result = run(write_doc(tmp_path, doc), "--kserve")
    assert result.exit_code == 0, result.output
    p = predictor(result.stdout)
    assert {k: p["workerSpec"][k] for k in ("tensorParallelSize", "pipelineParallelSize")} == {
        "tensorParallelSize": 8,
        "pipelineParallelSize": 2,
    }
    assert p["model"]["resources"]["limits"]["nvidia.com/gpu"] == "8"  # per node
    assert p["workerSpec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert p["maxReplicas"] == 6 == p["minReplicas"]
    assert yaml.safe_load(result.stdout)["metadata"]["annotations"]["serving.kserve.io/autoscalerClass"] == "none"
    knative = run(write_doc(tmp_path, doc, "k.yaml"), "--kserve", "--deployment-mode", "Knative")
    assert knative.exit_code == 3 and "Standard mode only" in knative.stderr


def test_deployment_mode_flag_knative_and_legacy_names(tmp_path):
    for mode in ("Knative", "Serverless"):
        result = run(str(RECORDED), "--kserve", "--deployment-mode", mode)
        assert result.exit_code == 0, result.output
        isvc = yaml.safe_load(result.stdout)
        assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == mode
        assert isvc["metadata"]["annotations"]["autoscaling.knative.dev/target-utilization-percentage"] == "100"
        p = isvc["spec"]["predictor"]
        assert p["scaleMetric"] == "concurrency" and p["scaleTarget"] == 32


def test_status_decision_wins_over_recomputing(tmp_path):
    doc = failed_middle()
    doc["spec"]["model"]["architecture"] = {"preset": "llama-3-70b"}
    doc["status"].update(
        phase="Decided",
        decision={
            "tensorParallel": 8,
            "pipelineParallel": 1,
            "gpusPerReplica": 8,
            "replicas": 3,
            "rule": "last-tier",
            "perReplicaConcurrency": 16,
        },
    )
    p = predictor(run(write_doc(tmp_path, doc), "--kserve").stdout)
    assert p["maxReplicas"] == 3 and p["model"]["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_not_decided_yet_exits_1(tmp_path):
    in_progress = experiment([tier(1, tps=500, p99=9000), tier(2, phase="LoadTesting")], phase="Profiling", message="load-testing TP2")
    result = run(write_doc(tmp_path, in_progress), "--kserve")
    assert result.exit_code == 1
    assert result.stderr.strip().startswith("kneepoint export: error: not decided yet: ")
    assert "is in phase Profiling (load-testing TP2)" in result.stderr
    no_phase = experiment([tier(1, tps=500, p99=9000), tier(2, phase="LoadTesting")])
    result = run(write_doc(tmp_path, no_phase, "p.yaml"), "--kserve")
    assert result.exit_code == 1
    assert "not decided yet: " in result.stderr and "continue: no stop rule fired yet; TP2 is LoadTesting" in result.stderr
    assert result.stdout == ""


def test_errors_exit_2_on_one_line(tmp_path):
    bare = write_doc(tmp_path, recorded()["status"], "status.yaml")
    for args, expected in (
        ([str(RECORDED)], "--kserve or --lws: give exactly one"),
        (["--kserve"], "NAME_OR_FILE: missing"),
        ([bare, "--kserve"], f"{bare}: spec: missing; the export needs the experiment's spec"),
        (["nope.yaml", "--kserve"], "nope.yaml: no such file"),
    ):
        result = run(*args)
        assert result.exit_code == 2, (args, result.output)
        err = result.stderr.strip()
        assert len(err.splitlines()) == 1 and expected in err


# --------------------------------------------------------------------------------------
# From the cluster (fake ClusterSource)


def _decided_on_cluster() -> dict:
    doc = failed_middle()
    doc["spec"]["model"]["architecture"] = {"preset": "llama-3-70b"}
    doc["status"].update(
        phase="Decided",
        decision={
            "tensorParallel": 4,
            "pipelineParallel": 1,
            "gpusPerReplica": 4,
            "replicas": 6,
            "rule": "throughput-gain",
            "perReplicaConcurrency": 16,
        },
        recommendation={
            "configMapName": "synthetic-kserve",
            "minReplicas": 1,
            "maxReplicas": 6,
            "scaleMetric": "concurrency",
            "scaleTarget": 16,
        },
    )
    return doc


def test_cluster_export_prints_the_published_config_map(monkeypatch, tmp_path):
    # A marker line proves the text comes from the ConfigMap, not from building it again.
    published = "# published by the operator\n" + run(write_doc(tmp_path, _decided_on_cluster()), "--kserve").stdout
    install_fake_cluster(
        monkeypatch, FakeCluster({"synthetic": _decided_on_cluster()}, {"synthetic-kserve": {"inferenceservice.yaml": published}})
    )
    result = run("synthetic", "--kserve", "-n", "team-a")
    assert result.exit_code == 0, result.output
    assert result.stdout == published
    assert result.stderr == ""


def test_cluster_export_builds_when_the_config_map_is_missing(monkeypatch, tmp_path):
    install_fake_cluster(monkeypatch, FakeCluster({"synthetic": _decided_on_cluster()}))
    result = run("synthetic", "--kserve")
    assert result.exit_code == 0, result.output
    assert "note: ConfigMap team-a/synthetic-kserve not found; building the InferenceService from status.decision" in result.stderr
    p = predictor(result.stdout)
    assert p["maxReplicas"] == 6 and p["model"]["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert yaml.safe_load(result.stdout)["metadata"]["annotations"]["kneepoint.io/decided-by"] == "team-a/synthetic"
    # the same text as from the saved object
    assert result.stdout == run(write_doc(tmp_path, _decided_on_cluster()), "--kserve").stdout


def test_cluster_not_found_and_not_decided(monkeypatch):
    running = failed_middle()
    running["status"].update(phase="Profiling", message="load-testing TP8")
    install_fake_cluster(monkeypatch, FakeCluster({"running": running}))
    result = run("missing", "--kserve")
    assert result.exit_code == 2
    assert result.stderr.strip() == "kneepoint export: error: experiment team-a/missing not found"
    result = run("running", "--kserve")
    assert result.exit_code == 1
    assert (
        result.stderr.strip()
        == "kneepoint export: error: not decided yet: experiment team-a/running is in phase Profiling (load-testing TP8)"
    )
    fresh = failed_middle()
    fresh.pop("status")
    install_fake_cluster(monkeypatch, FakeCluster({"fresh": fresh}))
    result = run("fresh", "--kserve")
    assert result.exit_code == 1
    assert "not decided yet: experiment team-a/fresh has no status.decision yet" in result.stderr


def test_cluster_export_says_why_the_operator_published_no_inference_service(monkeypatch):
    doc = _decided_on_cluster()
    doc["status"]["recommendation"]["notExportable"] = "TP8 x PP2 spans 2 nodes and cannot be exported as an InferenceService: because"
    install_fake_cluster(
        monkeypatch, FakeCluster({"synthetic": doc}, {"synthetic-kserve": {"leaderworkerset.yaml": "kind: LeaderWorkerSet\n"}})
    )
    result = run("synthetic", "--kserve")
    assert result.exit_code == 3 and result.stdout == ""
    assert "kneepoint export: error: TP8 x PP2 spans 2 nodes and cannot be exported as an InferenceService: because" in result.stderr
