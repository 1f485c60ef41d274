"""The engine pod as vLLM needs it: arguments real vLLM 0.33 parses, a model cache, resource requests, a start-up allowance.

vLLM is not imported (a test may not): its ``vllm serve`` argument list is data taken from the
0.33.0 wheel's parser source (tests/data/vllm/vllm-0.33.0-serve-flags.json; how in
tests/data/vllm/extract_serve_flags.py).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from kneepoint.core.architectures import get_preset
from kneepoint.core.memory_estimate import weight_bytes_per_gpu
from kneepoint.core.spec import SpecError, parse_spec
from kneepoint.core.tiers import Tier
from kneepoint.kube import manifests
from kneepoint.simulator.command import command as sim_command

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm"
VLLM_033 = json.loads((DATA / "vllm-0.33.0-serve-flags.json").read_text(encoding="utf-8"))
OWNER = manifests.Owner("exp", "team-a", "uid-1")
CTX = manifests.BuildContext(gpu_product="NVIDIA-H200", architecture=get_preset("llama-3-8b"), architecture_json="llama-3-8b")
GIB = 1024**3


def spec(**over):
    base = {
        "model": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct", "architecture": {"preset": "llama-3-8b"}},
        "placement": {"gpuProduct": "NVIDIA-H200"},
    }
    for key, value in over.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return parse_spec(base)


def vllm_033_accepts(args: list[str]) -> list[str]:
    """What real vLLM 0.33's `vllm serve` parser would reject in ``args`` (image entrypoint `vllm serve`): [] if nothing."""
    options: dict[str, dict] = {}
    for flag, entry in VLLM_033["flags"].items():
        for name in [flag, *entry["aliases"]]:
            options[name] = entry
    problems = []
    positional = bool(args) and not args[0].startswith("-")
    if not positional:
        problems.append("the model must be the first (positional) argument")
    i = 1 if positional else 0
    while i < len(args):
        word = args[i]
        name, eq, inline = word.partition("=")
        entry = options.get(name)
        if entry is None:
            problems.append(f"unknown flag {word}")
            i += 1
            continue
        if name == "--model":
            problems.append("--model is deprecated in vllm serve (the positional model replaces it)")
        takes_value = entry.get("takesValue", True)
        value = inline if eq else (args[i + 1] if takes_value and i + 1 < len(args) else None)
        if takes_value and value is None:
            problems.append(f"{name} needs a value")
        if value is not None and entry.get("choices") and value not in entry["choices"]:
            problems.append(f"{name} {value}: not one of vLLM's choices")
        i += 1 if (eq or not takes_value) else 2
    return problems


def engine_container(d):
    # The engine pod also runs the trace sidecar (docs/trace.md): pick vLLM's container by name.
    (c,) = [c for c in d["spec"]["template"]["spec"]["containers"] if c["name"] == manifests.ENGINE_CONTAINER]
    return c


SPECS = [
    spec(),
    spec(model={"dtype": "float16", "kvCacheDtype": "fp8"}, engine={"enforceEager": True, "gpuMemoryUtilization": 0.92}),
    spec(model={"dtype": "fp8", "maxModelLen": 8192}, engine={"maxNumSeqs": 64}),
    spec(model={"uri": "pvc://models/llama/8b", "dtype": "float32"}),
]


@pytest.mark.parametrize("s", SPECS)
@pytest.mark.parametrize("tier", [Tier(1, 1), Tier(4, 1), Tier(2, 2)])
def test_every_argument_the_operator_writes_passes_vllm_033s_parser(s, tier):
    args = engine_container(manifests.build_engine_deployment(s, OWNER, tier, CTX))["args"]
    assert vllm_033_accepts(args) == []
    assert args[0] == manifests.model_reference(s)


def test_a_multi_node_group_passes_vllm_033s_parser_on_leader_and_workers():
    lws = manifests.build_engine_leader_worker_set(spec(model={"uri": "hf://meta-llama/Llama-3.1-70B-Instruct"}), OWNER, Tier(8, 2), CTX)
    template = lws["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        args = template[role]["spec"]["containers"][0]["args"]
        assert vllm_033_accepts(args) == [], role
    worker = template["workerTemplate"]["spec"]["containers"][0]
    assert "--headless" in worker["args"] and "startupProbe" not in worker and "readinessProbe" not in worker


def test_the_checker_itself_refuses_what_vllm_would():
    assert vllm_033_accepts(["--model", "m"]) == [
        "the model must be the first (positional) argument",
        "--model is deprecated in vllm serve (the positional model replaces it)",
    ]
    assert vllm_033_accepts(["m", "--no-such-flag", "1"]) == ["unknown flag --no-such-flag", "unknown flag 1"]
    assert vllm_033_accepts(["m", "--dtype", "bf16"]) == ["--dtype bf16: not one of vLLM's choices"]
    assert vllm_033_accepts(["m", "-tp", "2", "--enforce-eager", "--no-enable-prefix-caching", "--max-model-len=4096"]) == []
    # The real capture ran with --model and got vLLM's deprecation warning for it.
    assert "provide the model as a positional argument" in (DATA / "8b-tp1-serve.log").read_text(encoding="utf-8").splitlines()[0]


def test_the_simulator_reads_the_same_arguments_with_the_model_positional():
    d = manifests.build_engine_deployment(spec(mode="Simulate"), OWNER, Tier(2, 1), CTX)
    c = engine_container(d)
    assert c["command"] == ["kneepoint", "sim"] and c["args"][0] == "meta-llama/Llama-3.1-8B-Instruct"
    ctx = sim_command.make_context("sim", list(c["args"]))
    assert ctx.params["tensor_parallel_size"] == 2 and ctx.params["served_model_name"] == ("Llama-3.1-8B-Instruct",)
    assert ctx.args[:1] == ["meta-llama/Llama-3.1-8B-Instruct"]  # the command takes the model from here
    # A simulated engine holds no GPU, downloads nothing and keeps its small fixed requests.
    assert "startupProbe" in c and c["resources"]["requests"] == {"cpu": "500m", "memory": "512Mi"}
    assert all(v["name"] != manifests.MODEL_CACHE_VOLUME for v in d["spec"]["template"]["spec"]["volumes"])


def test_the_model_cache_is_an_empty_dir_by_default_with_hf_home_and_the_compile_cache_on_it():
    d = manifests.build_engine_deployment(spec(), OWNER, Tier(1, 1), CTX)
    pod = d["spec"]["template"]["spec"]
    c = engine_container(d)
    assert {"name": "model-cache", "emptyDir": {}} in pod["volumes"]
    assert {"name": "model-cache", "mountPath": "/model-cache"} in c["volumeMounts"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["HF_HOME"] == "/model-cache/huggingface" and env["VLLM_CACHE_ROOT"] == "/model-cache/vllm"


def test_the_model_cache_on_a_pvc_and_the_users_env_wins():
    s = spec(engine={"modelCache": {"claimName": "hf-cache"}, "env": [{"name": "HF_HOME", "value": "/data/hf"}]})
    d = manifests.build_engine_deployment(s, OWNER, Tier(1, 1), CTX)
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "hf-cache"}} in d["spec"]["template"]["spec"]["volumes"]
    env = [e for e in engine_container(d)["env"] if e["name"] == "HF_HOME"]
    assert env == [{"name": "HF_HOME", "value": "/data/hf"}]
    limited = manifests.build_engine_deployment(spec(engine={"modelCache": {"sizeLimit": "200Gi"}}), OWNER, Tier(1, 1), CTX)
    assert {"name": "model-cache", "emptyDir": {"sizeLimit": "200Gi"}} in limited["spec"]["template"]["spec"]["volumes"]


def test_requests_are_derived_from_the_tier_and_the_weights():
    c = engine_container(manifests.build_engine_deployment(spec(), OWNER, Tier(1, 1), CTX))
    # 8B bfloat16: 14.96 GiB of weights (vLLM logged 15.0 GiB) + 4 GiB + 2 GiB per GPU; the checkpoint + 10 GiB on disk.
    assert c["resources"]["requests"] == {"cpu": "3", "memory": "21Gi", "ephemeral-storage": "25Gi", "nvidia.com/gpu": "1"}
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    tp4 = engine_container(manifests.build_engine_deployment(spec(), OWNER, Tier(4, 1), CTX))["resources"]["requests"]
    assert tp4["cpu"] == "6" and tp4["ephemeral-storage"] == "25Gi" and tp4["nvidia.com/gpu"] == "4"
    # The four GPUs' weights (TP4 shards, embeddings split too) + 4 GiB + 4 x 2 GiB.
    per_gpu = weight_bytes_per_gpu(get_preset("llama-3-8b"), Tier(4, 1), "bfloat16")
    assert tp4["memory"] == f"{math.ceil((4 * per_gpu + 12 * GIB) / GIB)}Gi" == "27Gi"
    # Weights on a PVC or a cache on a PVC: nothing downloaded into ephemeral storage.
    for s in (spec(model={"uri": "pvc://models/llama/8b"}), spec(engine={"modelCache": {"claimName": "hf-cache"}})):
        c = engine_container(manifests.build_engine_deployment(s, OWNER, Tier(1, 1), CTX))
        assert c["resources"]["requests"]["ephemeral-storage"] == "10Gi"


def test_requests_can_be_set_in_the_spec():
    s = spec(engine={"resources": {"cpu": "16", "memory": "64Gi", "ephemeralStorage": "500Gi"}})
    c = engine_container(manifests.build_engine_deployment(s, OWNER, Tier(2, 1), CTX))
    assert c["resources"]["requests"] == {"cpu": "16", "memory": "64Gi", "ephemeral-storage": "500Gi", "nvidia.com/gpu": "2"}
    with pytest.raises(SpecError, match=r"spec.engine.resources.memory: has an invalid format"):
        spec(engine={"resources": {"memory": "lots"}})


def test_a_multi_node_pod_requests_for_its_own_gpus():
    lws = manifests.build_engine_leader_worker_set(
        spec(model={"uri": "hf://meta-llama/Llama-3.1-70B-Instruct"}),
        OWNER,
        Tier(8, 2),
        manifests.BuildContext(gpu_product="NVIDIA-H200", architecture=get_preset("llama-3-70b")),
    )
    for role in ("leaderTemplate", "workerTemplate"):
        pod = lws["spec"]["leaderWorkerTemplate"][role]["spec"]
        requests = pod["containers"][0]["resources"]["requests"]
        assert requests["cpu"] == "10" and requests["nvidia.com/gpu"] == "8"
        assert [v["name"] for v in pod["volumes"]].count("model-cache") == 1
        assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "8"}


def test_the_start_up_allowance_fits_real_vllm_and_is_configurable():
    c = engine_container(manifests.build_engine_deployment(spec(), OWNER, Tier(1, 1), CTX))
    probe = c["startupProbe"]
    assert probe["httpGet"] == {"path": "/health", "port": "http"}
    allowance = probe["periodSeconds"] * probe["failureThreshold"]
    assert allowance == 1800 + 60  # budget.tierTimeoutSeconds + 60 s: the operator gives up first
    # Real vLLM 0.24, 8B on one H200: healthy after 136 s (capture README); its log alone spans start to serving.
    log = (DATA / "8b-tp1-serve.log").read_text(encoding="utf-8")
    stamps = re.findall(r"(\d\d):(\d\d):(\d\d) \[", log)
    serving = next(i for i, line in enumerate(log.splitlines()) if "Starting vLLM server" in line)
    first = int(stamps[0][0]) * 3600 + int(stamps[0][1]) * 60 + int(stamps[0][2])
    h, m, s_ = re.search(r"(\d\d):(\d\d):(\d\d) \[", log.splitlines()[serving]).groups()
    assert int(h) * 3600 + int(m) * 60 + int(s_) - first == 89 and allowance > 136
    short = engine_container(manifests.build_engine_deployment(spec(engine={"startupTimeoutSeconds": 605}), OWNER, Tier(1, 1), CTX))
    assert short["startupProbe"]["failureThreshold"] == math.ceil(605 / 10)
    tied = engine_container(manifests.build_engine_deployment(spec(budget={"tierTimeoutSeconds": 600}), OWNER, Tier(1, 1), CTX))
    assert tied["startupProbe"]["failureThreshold"] == 66
    assert "livenessProbe" not in c
