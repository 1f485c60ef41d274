"""The runner's pure mapping of a pod's container to a process and its environment."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kneepoint.sandbox.runner.plans import (
    ENGINE,
    KNEEPOINT,
    PRETEND,
    ContainerCommandError,
    ContainerConfigError,
    EnvSources,
    build_pod_kubeconfig,
    classify_container,
    container_argv,
    container_env,
    expand_references,
    hardware_env,
    parse_quantity,
    plan_container,
    probe_spec,
    service_account_token_source,
    vllm_server_args,
)

PY = "/venv/bin/python"
IP = "127.2.0.7"


def pod(containers: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "eng-0", "namespace": "ns1", "uid": "u-1", "labels": {"app": "x"}, "annotations": {"a/b": "c"}},
        "spec": {"nodeName": "h200-0", "serviceAccountName": "sa1", "containers": containers, **spec},
    }


NODE = {
    "metadata": {
        "name": "h200-0",
        "labels": {
            "nvidia.com/gpu.product": "NVIDIA-H200",
            "kneepoint.io/interconnect": "nvlink",
            "kneepoint.io/nvlink-domain-size": "8",
            "kneepoint.io/inter-node-gbps": "400",
        },
    },
    "status": {"allocatable": {"cpu": "128", "memory": "2Ti"}},
}


def plan(container: dict[str, Any], sources: EnvSources | None = None, node: dict[str, Any] = NODE, **pod_spec: Any):
    return plan_container(
        pod([container], **pod_spec),
        container,
        python=PY,
        pod_ip=IP,
        host_ip="127.0.0.1",
        node=node,
        sources=sources or EnvSources(),
        runtime_env={"KNEEPOINT_RESOLVE": "a:1:127.0.0.1"},
        forced_env={"TERMINATION_MESSAGE_PATH": "/state/t.log"},
    )


# --- which process ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("container", "kind"),
    [
        ({"image": "vllm/vllm-openai:v0.33.0", "args": ["--model", "m"]}, ENGINE),
        ({"image": "registry.local/team/VLLM-custom:1"}, ENGINE),
        ({"image": "ghcr.io/kneepoint/kneepoint:0.1.0", "command": ["kneepoint", "loadgen"]}, KNEEPOINT),
        ({"image": "anything", "command": ["/usr/local/bin/kneepoint", "operator"]}, KNEEPOINT),
        ({"image": "anything", "command": ["python3", "-m", "kneepoint", "operator"]}, KNEEPOINT),
        ({"image": "ghcr.io/kneepoint/kneepoint:0.1.0", "args": ["operator"]}, KNEEPOINT),
        ({"image": "ghcr.io/kneepoint/kneepoint@sha256:abc", "args": ["operator"]}, KNEEPOINT),
        ({"image": "busybox", "command": ["sh", "-c", "kneepoint loadgen --endpoint http://x:8000"]}, KNEEPOINT),
        ({"image": "busybox", "command": ["sh", "-c", "kneepoint loadgen && echo hi"]}, PRETEND),
        ({"image": "busybox", "command": ["sleep", "3600"]}, PRETEND),
        ({"image": "ghcr.io/kneepoint/kneepoint:0.1.0"}, PRETEND),  # no command, no args: unknown default
        ({"image": "localhost:5000/kneepoint"}, PRETEND),
    ],
)
def test_classify_container(container: dict[str, Any], kind: str) -> None:
    assert classify_container(container) == kind


def test_engine_args_become_sim_with_host_forced_and_port_kept() -> None:
    container = {
        "name": "engine",
        "image": "vllm/vllm-openai:v0.33.0",
        "args": ["--model", "meta/llama", "--tensor-parallel-size", "2", "--host", "0.0.0.0", "--port", "8001"],
    }
    kind, argv, listen = container_argv(container, PY, IP)
    assert kind == ENGINE
    assert argv == [PY, "-m", "kneepoint", "sim", "--model", "meta/llama", "--tensor-parallel-size", "2", "--host", IP, "--port", "8001"]
    assert listen == (IP, 8001)


def test_engine_without_port_gets_vllm_default() -> None:
    _, argv, listen = container_argv({"image": "vllm/vllm-openai", "args": ["--model", "m", "--host=0.0.0.0"]}, PY, IP)
    assert argv[-4:] == ["--host", IP, "--port", "8000"]
    assert "--host=0.0.0.0" not in argv
    assert listen == (IP, 8000)


@pytest.mark.parametrize(
    "container",
    [
        {"image": "vllm/vllm-openai", "command": ["vllm", "serve", "meta/llama"], "args": ["--max-num-seqs", "8"]},
        {"image": "vllm/vllm-openai", "args": ["meta/llama", "--max-num-seqs", "8", "--model", "other"]},
        {
            "image": "vllm/vllm-openai",
            "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
            "args": ["--model", "meta/llama", "--max-num-seqs", "8"],
        },
        {"image": "vllm/vllm-openai", "command": ["/bin/bash", "-c", "exec vllm serve meta/llama --max-num-seqs 8"]},
    ],
)
def test_vllm_launchers_are_stripped(container: dict[str, Any]) -> None:
    assert vllm_server_args(container) == ["--model", "meta/llama", "--max-num-seqs", "8"]


def test_unknown_engine_command_is_refused() -> None:
    with pytest.raises(ContainerCommandError, match="not a vLLM server command"):
        vllm_server_args({"name": "engine", "image": "vllm/vllm-openai", "command": ["/start.sh"]})


def test_bad_port_is_refused() -> None:
    with pytest.raises(ContainerCommandError, match="--port 'http'"):
        container_argv({"image": "vllm/vllm-openai", "args": ["--port", "http"]}, PY, IP)


def test_kneepoint_sim_container_is_bound_too() -> None:
    container = {
        "image": "ghcr.io/kneepoint/kneepoint:0.1.0",
        "command": ["kneepoint", "sim"],
        "args": ["--model", "m", "--host", "0.0.0.0", "--port", "8000", "--gpu", "NVIDIA-L40S"],
    }
    kind, argv, listen = container_argv(container, PY, IP)
    assert kind == KNEEPOINT
    assert argv == [PY, "-m", "kneepoint", "sim", "--model", "m", "--gpu", "NVIDIA-L40S", "--host", IP, "--port", "8000"]
    assert listen == (IP, 8000)


def test_kneepoint_loadgen_keeps_its_words() -> None:
    container = {
        "image": "x",
        "command": ["kneepoint", "loadgen"],
        "args": ["--endpoint", "http://e.ns.svc.cluster.local:8000", "--host", "h"],
    }
    kind, argv, listen = container_argv(container, PY, IP)
    assert (kind, listen) == (KNEEPOINT, None)
    assert argv == [PY, "-m", "kneepoint", "loadgen", "--endpoint", "http://e.ns.svc.cluster.local:8000", "--host", "h"]


def test_pretend_has_no_argv() -> None:
    assert container_argv({"image": "busybox", "command": ["sleep", "1"]}, PY, IP) == (PRETEND, [], None)


# --- environment -----------------------------------------------------------------------


def test_env_order_refs_and_expansion() -> None:
    container = {
        "name": "c",
        "image": "busybox",
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}, {"secretRef": {"name": "sec"}}],
        "env": [
            {"name": "A", "value": "1"},
            {"name": "B", "value": "$(A)-$(CM_x)-$(NOPE)-$$(A)"},
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "LBL", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "ANN", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['a/b']"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "token"}}},
            {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "missing", "key": "k", "optional": True}}},
            {"name": "PASSWORD", "value": "override"},
        ],
    }
    sources = EnvSources(
        config_maps={"cm": {"x": "cmx", "bad=key": "dropped"}, "missing": None}, secrets={"sec": {"token": "s3cr3t", "PASSWORD": "p"}}
    )
    env = container_env(pod([container]), container, pod_ip=IP, host_ip="127.0.0.1", node=NODE, sources=sources, defaults={"PATH": "/bin"})
    assert env["PATH"] == "/bin"
    assert env["CM_x"] == "cmx" and not any(k.startswith("CM_bad") for k in env)
    assert env["B"] == "1-cmx-$(NOPE)-$(A)"
    assert (env["NAME"], env["NS"], env["IP"], env["LBL"], env["ANN"]) == ("eng-0", "ns1", IP, "x", "c")
    assert env["TOKEN"] == "s3cr3t"
    assert env["PASSWORD"] == "override"
    assert "OPT" not in env


@pytest.mark.parametrize(
    ("var", "sources", "message"),
    [
        ({"configMapKeyRef": {"name": "cm", "key": "k"}}, EnvSources(config_maps={"cm": None}), 'configmaps "cm" not found'),
        ({"configMapKeyRef": {"name": "cm", "key": "k"}}, EnvSources(config_maps={"cm": {}}), "couldn't find key k in ConfigMap ns1/cm"),
        ({"secretKeyRef": {"name": "s", "key": "k"}}, EnvSources(secrets={"s": None}), 'secrets "s" not found'),
        ({"secretKeyRef": {"name": "s", "key": "k"}}, EnvSources(secrets={"s": {"j": "v"}}), "couldn't find key k in Secret ns1/s"),
    ],
)
def test_missing_references_are_create_container_config_errors(var: dict[str, Any], sources: EnvSources, message: str) -> None:
    container = {"name": "c", "image": "busybox", "env": [{"name": "V", "valueFrom": var}]}
    with pytest.raises(ContainerConfigError) as caught:
        container_env(pod([container]), container, pod_ip=IP, host_ip="127.0.0.1", node=NODE, sources=sources, defaults={})
    assert str(caught.value) == message


def test_secret_values_never_appear_in_errors() -> None:
    container = {"name": "c", "image": "busybox", "env": [{"name": "V", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}
    with pytest.raises(ContainerConfigError) as caught:
        container_env(
            pod([container]),
            container,
            pod_ip=IP,
            host_ip="",
            node=NODE,
            sources=EnvSources(secrets={"s": {"other": "hunter2"}}),
            defaults={},
        )
    assert "hunter2" not in str(caught.value)


def test_resource_field_ref_uses_limit_else_node_allocatable() -> None:
    container = {
        "name": "c",
        "image": "busybox",
        "resources": {"limits": {"memory": "1Gi"}, "requests": {"cpu": "250m"}},
        "env": [
            {"name": "MEM_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
            {"name": "CPU_REQ", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
            {"name": "CPU_LIM", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
        ],
    }
    env = container_env(pod([container]), container, pod_ip=IP, host_ip="", node=NODE, sources=EnvSources(), defaults={})
    assert (env["MEM_MI"], env["CPU_REQ"], env["CPU_LIM"]) == ("1024", "250", "128")


@pytest.mark.parametrize(("text", "value"), [("500m", 0.5), ("2", 2), ("1Gi", 2**30), ("1e3", 1000), ("1.5k", 1500)])
def test_parse_quantity(text: str, value: float) -> None:
    assert float(parse_quantity(text)) == value


def test_expand_references_edge_cases() -> None:
    assert expand_references("$(A", {"A": "x"}) == "$(A"
    assert expand_references("$", {}) == "$"
    assert expand_references("a$b", {}) == "a$b"


@pytest.mark.parametrize(
    ("labels", "gpus", "expected"),
    [
        (
            {"nvidia.com/gpu.product": "NVIDIA-H200", "kneepoint.io/interconnect": "pcie"},
            2,
            {"KNEEPOINT_SIM_GPU": "NVIDIA-H200", "KNEEPOINT_SIM_INTERCONNECT": "pcie"},
        ),
        (
            {"kneepoint.io/gpu-product": "NVIDIA-L40S", "kneepoint.io/interconnect": "mixed", "kneepoint.io/nvlink-domain-size": "4"},
            4,
            {"KNEEPOINT_SIM_GPU": "NVIDIA-L40S", "KNEEPOINT_SIM_INTERCONNECT": "nvlink"},
        ),
        ({"kneepoint.io/interconnect": "mixed", "kneepoint.io/nvlink-domain-size": "4"}, 8, {"KNEEPOINT_SIM_INTERCONNECT": "pcie"}),
        ({"kneepoint.io/inter-node-gbps": "100"}, 1, {"KNEEPOINT_SIM_INTER_NODE_GBPS": "100"}),
        ({}, 1, {}),
    ],
)
def test_hardware_env(labels: dict[str, str], gpus: int, expected: dict[str, str]) -> None:
    assert hardware_env(labels, gpus) == expected


def test_engine_plan_env_layers() -> None:
    container = {
        "name": "engine",
        "image": "vllm/vllm-openai:v0.33.0",
        "args": ["--model", "m", "--tensor-parallel-size", "1"],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
        "env": [
            {"name": "KNEEPOINT_SIM_ARCHITECTURE", "value": "llama-3-8b"},
            {"name": "KNEEPOINT_SIM_GPU", "value": "NVIDIA-L40S"},  # hardware comes from the node
            {"name": "KNEEPOINT_SIM_MODEL_LOAD_SECONDS", "value": "5"},  # the pod may choose this
            {"name": "KNEEPOINT_RESOLVE", "value": "mine:1:127.0.0.9"},
            {"name": "TERMINATION_MESSAGE_PATH", "value": "/dev/termination-log"},
        ],
    }
    result = plan(container)
    env = result.env
    assert result.kind == ENGINE and result.listen == (IP, 8000)
    assert env["KNEEPOINT_SIM_ARCHITECTURE"] == "llama-3-8b"
    assert env["KNEEPOINT_SIM_GPU"] == "NVIDIA-H200"
    assert env["KNEEPOINT_SIM_INTERCONNECT"] == "nvlink"
    assert "KNEEPOINT_SIM_INTER_NODE_GBPS" not in env  # one node: stages never cross the inter-node link
    assert env["KNEEPOINT_SIM_MODEL_LOAD_SECONDS"] == "5"
    assert (env["POD_NAME"], env["POD_NAMESPACE"], env["CONTAINER_NAME"]) == ("eng-0", "ns1", "engine")
    assert env["KNEEPOINT_RESOLVE"] == "mine:1:127.0.0.9"
    assert env["TERMINATION_MESSAGE_PATH"] == "/state/t.log"
    assert env["HOSTNAME"] == "eng-0" and env["PYTHONUNBUFFERED"] == "1"


def test_engine_plan_defaults_model_load_and_names() -> None:
    result = plan({"name": "engine", "image": "vllm/vllm-openai", "args": ["--model", "m"]})
    assert result.env["KNEEPOINT_SIM_MODEL_LOAD_SECONDS"] == "2"
    assert result.env["CONTAINER_NAME"] == "engine"
    assert result.env["KNEEPOINT_RESOLVE"] == "a:1:127.0.0.1"


def test_loadgen_plan_gets_no_simulator_env_and_expanded_args() -> None:
    container = {
        "name": "loadgen",
        "image": "ghcr.io/kneepoint/kneepoint:0.1.0",
        "command": ["kneepoint", "loadgen"],
        "args": ["--endpoint", "http://$(SVC):8000"],
        "env": [{"name": "SVC", "value": "eng.ns1.svc.cluster.local"}],
    }
    result = plan(container)
    assert result.argv == (PY, "-m", "kneepoint", "loadgen", "--endpoint", "http://eng.ns1.svc.cluster.local:8000")
    assert "KNEEPOINT_SIM_GPU" not in result.env and "POD_NAME" not in result.env


# --- probes and credentials --------------------------------------------------------------


def test_probe_spec_named_port_and_defaults() -> None:
    container = {
        "ports": [{"name": "http", "containerPort": 8000}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 5},
    }
    spec = probe_spec(container, "readinessProbe", IP)
    assert spec is not None
    assert (spec.action, spec.host, spec.port, spec.path, spec.period_seconds, spec.timeout_seconds, spec.failure_threshold) == (
        "http",
        IP,
        8000,
        "/health",
        5.0,
        1.0,
        3,
    )
    assert probe_spec(container, "startupProbe", IP) is None
    assert probe_spec({"readinessProbe": {"exec": {"command": ["true"]}}}, "readinessProbe", IP).action == "exec"  # type: ignore[union-attr]
    assert probe_spec({"readinessProbe": {"tcpSocket": {"port": 9}}}, "readinessProbe", IP).port == 9  # type: ignore[union-attr]


def test_service_account_token_source_follows_admission() -> None:
    projected = {
        "name": "kube-api-access-x",
        "projected": {
            "sources": [{"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}, {"configMap": {"name": "kube-root-ca.crt"}}]
        },
    }
    assert service_account_token_source(pod([], volumes=[projected])) == {"expirationSeconds": 3607, "path": "token"}
    assert service_account_token_source(pod([], volumes=[{"name": "dshm", "emptyDir": {}}])) is None


def test_pod_kubeconfig_uses_token_file() -> None:
    config = json.loads(build_pod_kubeconfig("https://127.0.0.1:6443", "Q0E=", "/state/token", "ns1"))
    assert config["users"][0]["user"] == {"tokenFile": "/state/token"}
    assert config["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:6443"
    assert config["contexts"][0]["context"]["namespace"] == "ns1"


def test_mixed_node_without_gpu_request_uses_the_tp_flags() -> None:
    node = {"metadata": {"labels": {"kneepoint.io/interconnect": "mixed", "kneepoint.io/nvlink-domain-size": "2"}}}
    small = plan({"name": "engine", "image": "vllm/vllm-openai", "args": ["--model", "m", "-tp", "2"]}, node=node)
    big = plan({"name": "engine", "image": "vllm/vllm-openai", "args": ["--model", "m", "--tensor-parallel-size=2", "-pp", "2"]}, node=node)
    assert small.env["KNEEPOINT_SIM_INTERCONNECT"] == "nvlink"
    assert big.env["KNEEPOINT_SIM_INTERCONNECT"] == "pcie"


def test_an_emptydir_shared_by_two_containers_becomes_one_per_pod_directory() -> None:
    from kneepoint.kube import manifests
    from kneepoint.sandbox.runner.plans import emptydir_volumes

    mount = [{"name": "profiles", "mountPath": "/var/run/kneepoint/profiles"}, {"name": "dshm", "mountPath": "/dev/shm"}]
    volumes = [{"name": "profiles", "emptyDir": {}}, {"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    engine = {
        "name": "engine",
        "image": "vllm/vllm-openai:v0.33.0",
        "args": ["--model", "m", "--profiler-config", '{"profiler":"torch","torch_profiler_dir":"/var/run/kneepoint/profiles"}'],
        "volumeMounts": mount,
    }
    sidecar = {
        "name": "trace",
        "image": "ghcr.io/kneepoint/kneepoint:0.1.0",
        "command": ["kneepoint", "trace"],
        "args": ["--watch", "/var/run/kneepoint/profiles", "--serve-metrics", "$(POD_IP):9464"],
        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
        "volumeMounts": mount[:1],
    }
    p = pod([engine, sidecar], volumes=volumes)
    assert emptydir_volumes(p) == ["profiles"]  # a Memory emptyDir (/dev/shm) stays where it is
    dirs = {"profiles": "/state/pods/u-1/volumes/profiles"}
    common = dict(
        python=PY, pod_ip=IP, host_ip="127.0.0.1", node=NODE, sources=EnvSources(), runtime_env={}, forced_env={}, volume_dirs=dirs
    )
    e, s = plan_container(p, engine, **common), plan_container(p, sidecar, **common)
    assert '{"profiler":"torch","torch_profiler_dir":"/state/pods/u-1/volumes/profiles"}' in e.argv
    assert list(s.argv) == [PY, "-m", "kneepoint", "trace", "--watch", "/state/pods/u-1/volumes/profiles", "--serve-metrics", f"{IP}:9464"]
    assert manifests.PROFILES_DIR == "/var/run/kneepoint/profiles"


def test_a_mount_never_rewrites_the_runners_own_interpreter_or_forced_files() -> None:
    # A checkout under /tmp (a CI clone) beside the operator pod's emptyDir at /tmp: the runner's python
    # and the files it forces (KUBECONFIG) stay where they are; only the container's own words move.
    operator = {
        "name": "operator",
        "image": "ghcr.io/kneepoint/kneepoint:0.1.0",
        "args": ["operator", "--json-logs"],
        "env": [{"name": "SCRATCH", "value": "/tmp/scratch"}],
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
    }
    p = pod([operator], volumes=[{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}])
    plan = plan_container(
        p,
        operator,
        python="/tmp/clone/.venv/bin/python",
        pod_ip=IP,
        host_ip="127.0.0.1",
        node=NODE,
        sources=EnvSources(),
        runtime_env={},
        forced_env={"KUBECONFIG": "/tmp/clone/state/kubeconfig"},
        volume_dirs={"tmp": "/state/pods/u-2/volumes/tmp"},
    )
    assert plan.argv[0] == "/tmp/clone/.venv/bin/python"
    assert plan.env["KUBECONFIG"] == "/tmp/clone/state/kubeconfig"
    assert plan.env["SCRATCH"] == "/state/pods/u-2/volumes/tmp/scratch"
