"""The builders' output, field by field: what a user would check in `kubectl get -o yaml`."""

import json

import pytest

from kneepoint.core.spec import parse_spec
from kneepoint.core.tiers import Tier
from kneepoint.kube import manifests, naming

OWNER = manifests.Owner("llama8b", "team-a", "uid-1")
CTX = manifests.BuildContext(operator_image="ghcr.io/kneepoint/kneepoint:test", architecture_json="llama-3-8b", gpu_product="NVIDIA-H200")


def spec(**over):
    base = {
        "model": {
            "uri": "hf://meta-llama/Llama-3.1-8B-Instruct",
            "architecture": {"preset": "llama-3-8b"},
            "hubTokenSecretRef": {"name": "hf", "key": "token"},
        },
        "load": {"concurrency": 16},
        "placement": {"gpuProduct": "NVIDIA-H200", "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]},
    }
    base.update(over)
    return parse_spec(base)


def test_engine_deployment_measure_mode():
    d = manifests.build_engine_deployment(spec(), OWNER, Tier(4, 1), CTX, preferred_node="h200-1")
    assert d["metadata"]["name"] == "llama8b-tp4-pp1"
    assert d["metadata"]["ownerReferences"][0] == {
        "apiVersion": "kneepoint.io/v1alpha1",
        "kind": "ParallelismExperiment",
        "name": "llama8b",
        "uid": "uid-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    pod = d["spec"]["template"]["spec"]
    c, _trace = pod["containers"]
    assert c["image"] == "vllm/vllm-openai:v0.33.0"
    args = c["args"]
    assert args[args.index("--tensor-parallel-size") + 1] == "4"
    assert args[args.index("--pipeline-parallel-size") + 1] == "1"
    assert args[args.index("--max-num-seqs") + 1] == "16"  # defaults to load.concurrency
    assert args[0] == "meta-llama/Llama-3.1-8B-Instruct" and "--model" not in args  # vllm serve MODEL
    assert args[args.index("--dtype") + 1] == "bfloat16"
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    req = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"]
    assert req == [{"key": "kneepoint.io/nvlink-domain-size", "operator": "Gt", "values": ["3"]}]
    assert pod["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    hf = next(e for e in c["env"] if e["name"] == "HF_TOKEN")
    assert hf == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    assert d["spec"]["selector"]["matchLabels"][naming.LABEL_ROLE] == "engine"


def test_tp1_has_no_nvlink_requirement_and_pcie_fleets_skip_it():
    d = manifests.build_engine_deployment(spec(), OWNER, Tier(1, 1), CTX)
    assert "affinity" not in d["spec"]["template"]["spec"]
    pcie = manifests.BuildContext(gpu_product="NVIDIA-L40S", require_nvlink=False)
    d = manifests.build_engine_deployment(spec(), OWNER, Tier(2, 1), pcie)
    assert "affinity" not in d["spec"]["template"]["spec"]


def test_simulate_mode_runs_the_simulator_without_gpus():
    s = spec(mode="Simulate", simulation={"interconnect": "pcie"})
    d = manifests.build_engine_deployment(s, OWNER, Tier(2, 1), CTX)
    c, _trace = d["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["kneepoint", "sim"] and c["image"] == "ghcr.io/kneepoint/kneepoint:test"
    assert "nvidia.com/gpu" not in str(c["resources"])
    assert c["args"][c["args"].index("--interconnect") + 1] == "pcie"
    assert c["args"][c["args"].index("--gpu") + 1] == "NVIDIA-H200"
    assert c["securityContext"]["runAsNonRoot"] is True
    assert "nodeSelector" not in d["spec"]["template"]["spec"]


@pytest.mark.parametrize(("product", "link"), [("NVIDIA-H200", "nvlink"), ("NVIDIA-L40S", "pcie")])
def test_simulate_mode_auto_interconnect_is_the_products_own_link(product, link):
    # The pod holds no GPU and may land on any node: its labels (the sandbox runner's env)
    # must not choose the link, or a simulated L40S on an H200 node would claim NVLink.
    ctx = manifests.BuildContext(operator_image="ghcr.io/kneepoint/kneepoint:test", gpu_product=product)
    d = manifests.build_engine_deployment(spec(mode="Simulate"), OWNER, Tier(2, 1), ctx)
    c, _trace = d["spec"]["template"]["spec"]["containers"]
    assert c["args"][c["args"].index("--interconnect") + 1] == link


def test_pvc_model_is_mounted_read_only():
    s = spec(model={"uri": "pvc://models/llama/8b", "architecture": {"preset": "llama-3-8b"}})
    d = manifests.build_engine_deployment(s, OWNER, Tier(1, 1), CTX)
    pod = d["spec"]["template"]["spec"]
    assert {"name": "models", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in pod["volumes"]
    args = pod["containers"][0]["args"]
    assert args[0] == "/models/llama/8b"


def test_service_and_job():
    s = spec()
    svc = manifests.build_engine_service(s, OWNER, Tier(2, 1))
    assert svc["spec"]["selector"][naming.LABEL_TIER] == "tp2-pp1"
    # headless: the name resolves to the engine pod, no cluster IP allocated; the pod listens on the Service's port
    assert svc["spec"]["clusterIP"] == "None"
    (port,) = svc["spec"]["ports"]
    engine = manifests.build_engine_deployment(s, OWNER, Tier(2, 1), CTX)
    container = engine["spec"]["template"]["spec"]["containers"][0]
    assert {"name": port["targetPort"], "containerPort": port["port"], "protocol": "TCP"} in container["ports"]
    job = manifests.build_load_test_job(s, OWNER, Tier(2, 1), 3, CTX)
    assert job["metadata"]["name"] == "llama8b-tp2-pp1-load3"
    assert job["spec"]["backoffLimit"] == 0
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["kneepoint", "loadgen"]
    assert c["args"][c["args"].index("--endpoint") + 1] == "http://llama8b-tp2-pp1.team-a.svc.cluster.local:8000"
    assert c["args"][c["args"].index("--concurrency") + 1] == "16"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


def test_names_are_dns_labels_and_stable():
    long = "a" * 80
    name = naming.engine_name(long, Tier(8, 2))
    assert len(name) <= 63 and name.endswith("-tp8-pp2")
    assert name == naming.engine_name(long, Tier(8, 2))
    assert naming.engine_name(long, Tier(8, 2)) != naming.engine_name("b" * 80, Tier(8, 2))
    assert len(naming.load_test_name(long, Tier(8, 2), 10)) <= 63


@pytest.mark.parametrize("mode", ["Measure", "Simulate"])
def test_engine_profiles_into_a_shared_emptydir_read_by_the_trace_sidecar(mode):
    d = manifests.build_engine_deployment(spec(mode=mode), OWNER, Tier(2, 1), CTX)
    pod = d["spec"]["template"]["spec"]
    engine, sidecar = pod["containers"]
    config = json.loads(engine["args"][engine["args"].index("--profiler-config") + 1])
    # The same JSON vLLM's --profiler-config takes (vllm/config/profiler.py), no stacks, bounded steps.
    assert config == {
        "profiler": "torch",
        "torch_profiler_dir": manifests.PROFILES_DIR,
        "torch_profiler_with_stack": False,
        "ignore_frontend": True,
        "max_iterations": manifests.PROFILE_MAX_ITERATIONS,
    }
    mount = {"name": manifests.PROFILES_VOLUME, "mountPath": manifests.PROFILES_DIR}
    assert mount in engine["volumeMounts"] and sidecar["volumeMounts"] == [mount]
    assert {"name": manifests.PROFILES_VOLUME, "emptyDir": {"sizeLimit": "2Gi"}} in pod["volumes"]
    assert sidecar["command"] == ["kneepoint", "trace"] and sidecar["image"] == CTX.operator_image
    assert sidecar["args"] == ["--watch", manifests.PROFILES_DIR, "--serve-metrics", "$(POD_IP):9464"]
    assert sidecar["ports"] == [{"name": naming.TRACE_PORT_NAME, "containerPort": 9464, "protocol": "TCP"}]
    assert "nvidia.com/gpu" not in json.dumps(sidecar["resources"])  # the GPUs are the engine's alone
    job = manifests.build_load_test_job(spec(mode=mode), OWNER, Tier(2, 1), 1, CTX)
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--profile-seconds") + 1] == "10"


def test_the_job_passes_spec_load_adaptive_to_the_load_generator():
    from kneepoint.loadgen.command import validate

    off = manifests.build_load_test_job(spec(), OWNER, Tier(1, 1), 1, CTX)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not any(a.startswith("--adaptive") for a in off)
    load = {
        "concurrency": 16,
        "numRequests": 1000,
        "adaptive": {"enabled": True, "relativePrecision": 0.1, "confidence": 0.9, "minRequests": 50},
    }
    on = manifests.build_load_test_job(spec(load=load), OWNER, Tier(1, 1), 1, CTX)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert on[on.index("--adaptive") + 1 : on.index("--adaptive") + 7] == [
        "--adaptive-precision", "0.1", "--adaptive-confidence", "0.9", "--adaptive-min-requests", "50",
    ]  # fmt: skip # argv: each flag beside its value
    # the load generator accepts the Job's flags as they are
    from click.testing import CliRunner

    from kneepoint.loadgen.command import command

    parsed: dict = {}

    def capture(**options):
        parsed.update(options)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(command, "callback", capture)
        result = CliRunner().invoke(command, on)
    assert result.exit_code == 0, result.output
    config = validate(parsed)
    assert config.adaptive is not None and config.adaptive.to_json() == {"relativePrecision": 0.1, "confidence": 0.9, "minRequests": 50}
    assert config.num_requests == 1000
    # the virtual tier (predict-first's adapter, the decision-cost benchmark) runs the plan the Job's loadgen parses
    from kneepoint.simulator.ladder_prediction import adaptive_plan_of

    assert adaptive_plan_of(spec(load=load)) == config.adaptive and adaptive_plan_of(spec()) is None


def test_a_tier_measured_only_to_confirm_gets_the_predicted_figures_as_expect_flags():
    from kneepoint.core.actions import ConfirmLoad, SearchLoad

    confirm = ConfirmLoad(3231.93, 0.03, 2448.63, 0.36)
    args = manifests.build_load_test_job(spec(), OWNER, Tier(1, 1), 1, CTX, confirm=confirm)["spec"]["template"]["spec"]["containers"][0][
        "args"
    ]
    assert args[args.index("--expect") :][:4] == ["--expect", "outputTokensPerSecond=3231.93:0.03", "--expect", "latencyP99Ms=2448.63:0.36"]
    assert args[args.index("--repeats") + 1] == "2"  # the plan stays the spec's: the load generator stops early
    plain = manifests.build_load_test_job(spec(), OWNER, Tier(1, 1), 1, CTX)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--expect" not in plain
    point = manifests.loadgen_args(spec(), OWNER, Tier(1, 1), SearchLoad(48, 144), confirm)
    assert "--expect" not in point  # a concurrency-search point runs one repeat anyway


def test_bad_spec_load_adaptive_names_the_field_and_the_allowed_values():
    from kneepoint.core.spec import SpecError

    with pytest.raises(SpecError, match=r"spec\.load\.adaptive\.relativePrecision") as error:
        spec(load={"adaptive": {"enabled": True, "relativePrecision": 0.9}})
    assert "0.5" in str(error.value)
    with pytest.raises(SpecError, match=r"spec\.load\.adaptive\.confidence"):
        spec(load={"adaptive": {"confidence": 0.2}})
    assert spec().load.adaptive.enabled is False
