"""Component command lines, Prometheus configuration and KWOK stages (pure)."""

from __future__ import annotations

import ast
import gc
import ipaddress
import sys
from pathlib import Path

import pytest
import yaml

from kneepoint.sandbox import flags, layout, promconfig

PKG = Path(__file__).resolve().parents[3] / "operator" / "kneepoint"
PATHS = layout.StatePaths(Path("/state"))
BINARIES = {k: f"/bin/{k}" for k in ("etcd", "kube_apiserver", "kube_controller_manager", "kube_scheduler", "kwok", "prometheus")}


def _flag(argv: list[str], name: str) -> str:
    values = [a.split("=", 1)[1] for a in argv if a.startswith(f"--{name}=")]
    assert len(values) == 1, (name, argv)
    return values[0]


def test_every_component_listens_on_loopback_only() -> None:
    commands = flags.commands(BINARIES, "/py", PATHS, layout.Ports())
    assert list(commands) == list(flags.COMPONENTS)
    text = " ".join(" ".join(argv) for argv in commands.values())
    assert "0.0.0.0" not in text
    assert _flag(commands["kube-apiserver"], "bind-address") == "127.0.0.1"
    assert _flag(commands["kube-controller-manager"], "bind-address") == "127.0.0.1"
    assert _flag(commands["kube-scheduler"], "bind-address") == "127.0.0.1"
    assert _flag(commands["etcd"], "listen-client-urls") == "http://127.0.0.1:2379"
    assert _flag(commands["prometheus"], "web.listen-address") == "127.0.0.1:9090"
    assert _flag(commands["kwok"], "server-address") == "127.0.0.1:10247"
    assert ipaddress.ip_network(_flag(commands["kwok"], "cidr")).subnet_of(ipaddress.ip_network("127.0.0.0/8"))


def test_apiserver_runs_like_a_secure_cluster() -> None:
    argv = flags.commands(BINARIES, "/py", PATHS, layout.Ports())["kube-apiserver"]
    assert _flag(argv, "authorization-mode") == "Node,RBAC"
    assert _flag(argv, "endpoint-reconciler-type") == "none"
    assert _flag(argv, "advertise-address") == "127.0.0.1"
    assert _flag(argv, "service-account-signing-key-file") == "/state/pki/sa.key"
    assert _flag(argv, "client-ca-file") == "/state/pki/ca.crt"
    kcm = flags.commands(BINARIES, "/py", PATHS, layout.Ports())["kube-controller-manager"]
    assert _flag(kcm, "use-service-account-credentials") == "true"
    assert _flag(kcm, "kubeconfig") == "/state/controller-manager.kubeconfig"


def test_the_controller_manager_runs_every_controller_but_the_endpoint_controllers() -> None:
    # Pod IPs are loopback here, which Endpoints and EndpointSlices refuse: those controllers could only fail and retry.
    kcm = flags.commands(BINARIES, "/py", PATHS, layout.Ports())["kube-controller-manager"]
    controllers = _flag(kcm, "controllers").split(",")
    assert controllers[0] == "*"
    assert sorted(controllers[1:]) == ["-endpoints-controller", "-endpointslice-controller", "-endpointslice-mirroring-controller"]
    assert ipaddress.ip_network(flags.KWOK_POD_CIDR).is_loopback


def test_runner_command_is_the_agreed_one() -> None:
    argv = flags.commands(BINARIES, "/py", PATHS, layout.Ports())["runner"]
    assert argv == ["/py", "-m", "kneepoint.sandbox.runner", "--kubeconfig", "/state/kubeconfig", "--state-dir", "/state"]


def test_port_offset_moves_every_port_and_rejects_out_of_range() -> None:
    moved = layout.Ports().shifted(20000)
    assert moved.apiserver == 26443 and moved.etcd_client == 22379 and moved.prometheus == 29090
    argv = flags.commands(BINARIES, "/py", PATHS, moved)["kube-apiserver"]
    assert _flag(argv, "secure-port") == "26443"
    assert _flag(argv, "etcd-servers") == "http://127.0.0.1:22379"
    with pytest.raises(ValueError, match="--port-offset 60000"):
        layout.Ports().shifted(60000)


def test_state_dir_comes_from_the_environment() -> None:
    assert layout.default_state_dir({"KNEEPOINT_SANDBOX_DIR": "/x"}) == Path("/x")
    assert layout.default_state_dir({"HOME": "/home/u"}) == Path("/home/u/.cache/kneepoint/sandbox/state")
    assert layout.cache_root({"XDG_CACHE_HOME": "/c"}) == Path("/c/kneepoint")


def test_prometheus_discovers_engine_pods_through_the_admin_kubeconfig() -> None:
    config = promconfig.prometheus_config(PATHS, layout.Ports())
    assert config["global"]["scrape_interval"] == "2s"
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert {"prometheus", "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok", "vllm", "trace", "dcgm"} <= set(
        jobs
    )
    from kneepoint.kube.naming import TRACE_PORT_NAME

    assert jobs["trace"]["relabel_configs"][1]["regex"] == TRACE_PORT_NAME == promconfig.TRACE_PORT_NAME  # the sidecar's port
    for name in ("vllm", "trace", "dcgm"):
        (sd,) = jobs[name]["kubernetes_sd_configs"]
        assert sd == {"role": "pod", "kubeconfig_file": "/state/kubeconfig"}
        relabels = jobs[name]["relabel_configs"]
        keep_role = relabels[0]
        assert keep_role == {"source_labels": ["__meta_kubernetes_pod_label_kneepoint_io_role"], "regex": "engine", "action": "keep"}
        targets = {r.get("target_label") for r in relabels}
        assert {"namespace", "pod"} <= targets
        assert any(r.get("regex") == r"127\..+" and r["action"] == "keep" for r in relabels if "action" in r)
    assert jobs["dcgm"]["relabel_configs"][-1]["replacement"] == "$1:9400"
    assert jobs["dcgm"]["relabel_configs"][-1]["target_label"] == "__address__"
    assert jobs["kube-apiserver"]["tls_config"]["cert_file"] == "/state/pki/admin.crt"
    # It must survive YAML round-trip (the adapter writes it with yaml.safe_dump).
    assert yaml.safe_load(yaml.safe_dump(config)) == config


def test_kwok_stages_leave_non_pretend_pods_to_the_runner() -> None:
    stages = {d["metadata"]["name"]: d for d in yaml.safe_load_all((PKG / "data" / "sandbox" / "kwok-stages.yaml").read_text())}
    assert set(stages) == {"node-initialize", "node-heartbeat-with-lease", "pod-delete", "pod-ready", "pod-ready-again", "pod-complete"}
    pretend = {"key": '.metadata.labels["kneepoint.io/sandbox-pretend"]', "operator": "In", "values": ["true"]}
    for name in ("pod-ready", "pod-ready-again", "pod-complete"):
        assert pretend in stages[name]["spec"]["selector"]["matchExpressions"]
    assert pretend not in stages["pod-delete"]["spec"]["selector"]["matchExpressions"]
    assert stages["pod-delete"]["spec"]["next"]["delete"] is True


PURE = ("pins", "gomod", "fleet", "layout", "flags", "promconfig", "lws_config")


def _parse(path: Path) -> ast.Module:
    # Earlier sandbox tests leave subprocess transports for the collector; a finalizer that runs inside
    # ast.parse trips CPython 3.11's "AST constructor recursion depth mismatch". Collect first, then parse
    # with the collector off.
    gc.collect()
    gc.disable()
    try:
        return ast.parse(path.read_text())
    finally:
        gc.enable()


@pytest.mark.parametrize("module", PURE)
def test_pure_sandbox_modules_import_only_the_standard_library(module: str) -> None:
    tree = _parse(PKG / "sandbox" / f"{module}.py")
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            top = name.split(".")[0]
            if top == "kneepoint":
                # kneepoint.core is stdlib-only too (tests/contract/test_layering.py): its facts are allowed.
                parts = name.split(".")
                assert parts[1] == "core" or (parts[1] == "sandbox" and parts[2] in PURE), name
            else:
                assert top in sys.stdlib_module_names or top == "__future__", name


def test_a_second_sandbox_is_offered_ports_below_the_ephemeral_range() -> None:
    """Stop 30's CI: an offset of 25000 put prometheus on 34090, which a client socket took first."""
    from kneepoint.sandbox import controlplane, processes
    from kneepoint.sandbox.layout import Ports

    assert 34090 in controlplane.ports_in_ephemeral_range(Ports().shifted(25000), (32768, 60999))
    assert controlplane.ports_in_ephemeral_range(Ports(), (32768, 60999)) == []
    low, _ = processes.ephemeral_port_range()
    offset = controlplane.free_port_offset(start=11000)
    wanted = controlplane.all_ports(Ports().shifted(offset))
    assert wanted[-1] < low
    assert not any(processes.port_in_use(port) for port in wanted)
    assert set(wanted).isdisjoint(controlplane.all_ports(Ports()))
