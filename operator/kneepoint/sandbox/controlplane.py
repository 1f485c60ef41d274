"""Bring the sandbox up, tear it down, and report on it.

``up`` is idempotent: it builds what is missing, makes the PKI once, then for each
component in order (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, KWOK,
Prometheus, the pod runner) reuses a healthy process it started before or starts one
and waits for its health endpoint. Then it waits for the ``default`` ServiceAccount,
creates the fleet's nodes, waits until they are Ready, and applies ``crds/*.yaml`` with
server-side apply. ``down`` ends every process group it started and verifies that no
process of the sandbox remains. The pytest fixture calls the same functions.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from kneepoint.core import node_labels
from kneepoint.sandbox import binaries, flags, fleet, layout, lws_component, lws_config, pins, pki, processes, promconfig
from kneepoint.sandbox.layout import HOST, Ports, StatePaths

Say = Callable[[str], None]

# Timeouts for one component to become healthy (seconds). Generous: on a loaded 2-core
# machine the API server's first start (bootstrap RBAC, priority levels) can take a while,
# and a restarted Prometheus answers 503 until it has replayed its WAL (61 s for 551 MB,
# a sandbox used for 90 minutes at the 2 s scrape interval; docs/reliability.md).
HEALTH_TIMEOUT = {"etcd": 30, "kube-apiserver": 90, "prometheus": 180}
DEFAULT_HEALTH_TIMEOUT = 45


class SandboxError(RuntimeError):
    """The sandbox could not be brought up or down; the message says why and what to do."""


def _say(line: str) -> None:
    print(line, flush=True)


def repo_root() -> Path | None:
    """The checkout this package runs from (None when installed without the repository)."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "pyproject.toml").exists() else None


def default_fleet_path() -> Path:
    """``deploy/sandbox/fleet.yaml`` of the checkout."""
    root = repo_root()
    if root is None or not (root / "deploy" / "sandbox" / "fleet.yaml").exists():
        raise SandboxError("no default fleet file (deploy/sandbox/fleet.yaml of a checkout): pass --fleet PATH")
    return root / "deploy" / "sandbox" / "fleet.yaml"


def crds_dir() -> Path | None:
    """``crds/`` of the checkout, if it has YAML files."""
    root = repo_root()
    if root is None:
        return None
    directory = root / "crds"
    return directory if any(directory.glob("*.yaml")) else None


def load_fleet(path: Path) -> list[fleet.NodeGroup]:
    """Read and validate a fleet file; SandboxError names the file and the bad field."""
    try:
        document = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise SandboxError(f"--fleet {path}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise SandboxError(f"--fleet {path}: not valid YAML: {exc}") from exc
    try:
        return fleet.parse_fleet(document)
    except fleet.FleetError as exc:
        raise SandboxError(f"--fleet {path}: {exc}") from exc


@dataclass
class Sandbox:
    """Handle on one sandbox: where it lives and where to reach it."""

    paths: StatePaths
    ports: Ports
    started: list[str] = field(default_factory=list)  # components this call started

    @property
    def kubeconfig(self) -> Path:
        return self.paths.admin_kubeconfig

    @property
    def apiserver_url(self) -> str:
        return f"https://{HOST}:{self.ports.apiserver}"

    @property
    def prometheus_url(self) -> str:
        return f"http://{HOST}:{self.ports.prometheus}"

    @property
    def marker(self) -> str:
        """Value of KNEEPOINT_SANDBOX_ID in every process of this sandbox."""
        return str(self.paths.root.resolve())


def resolve(state_dir: Path | None = None, port_offset: int | None = None, env: Mapping[str, str] | None = None) -> Sandbox:
    """The sandbox at ``state_dir`` (default: KNEEPOINT_SANDBOX_DIR or the cache), with its ports.

    Ports come from ``port_offset`` when given, else from the state dir's record of an
    earlier ``up``, else ``KNEEPOINT_SANDBOX_PORT_OFFSET``, else the defaults.
    """
    env = os.environ if env is None else env
    root = (state_dir or layout.default_state_dir(env)).expanduser().resolve()
    paths = StatePaths(root)
    if port_offset is None and not paths.sandbox_file.exists():
        port_offset = env_port_offset(env)
    if port_offset is not None:
        ports = Ports().shifted(port_offset)
    else:
        ports = Ports()
        try:
            recorded = json.loads(paths.sandbox_file.read_text()).get("ports", {})
            ports = Ports(**recorded)
        except (OSError, ValueError, TypeError):
            pass
    return Sandbox(paths, ports)


def env_port_offset(env: Mapping[str, str]) -> int | None:
    """``KNEEPOINT_SANDBOX_PORT_OFFSET`` as an int (None when unset); SandboxError when not a number."""
    raw = env.get("KNEEPOINT_SANDBOX_PORT_OFFSET")
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise SandboxError(f"KNEEPOINT_SANDBOX_PORT_OFFSET={raw!r} is not an integer") from None


def all_ports(ports: Ports) -> list[int]:
    """Every loopback port a sandbox on ``ports`` may listen on (LWS's too)."""
    return sorted({port for listed in flags.listen_ports(ports).values() for port in listed})


def ports_in_ephemeral_range(ports: Ports, ephemeral: tuple[int, int] | None = None) -> list[int]:
    """The sandbox's ports that lie in the kernel's range for outgoing connections' local ends."""
    low, high = ephemeral or processes.ephemeral_port_range()
    return [port for port in all_ports(ports) if low <= port <= high]


def free_port_offset(start: int = 11000, step: int = 137) -> int:
    """The first port offset from ``start`` whose every port is free and below the kernel's ephemeral range.

    For a second sandbox beside the default one (tests, a user's experiments). Ports in
    the ephemeral range would be free when chosen and could be taken by any outgoing
    connection before their component binds them.
    """
    low, _ = processes.ephemeral_port_range()
    offset = start
    while True:
        ports = Ports().shifted(offset)
        wanted = all_ports(ports)
        if wanted[-1] >= low:
            raise SandboxError(f"no port offset from {start} keeps every sandbox port free and below the ephemeral range's {low}")
        if not any(processes.port_in_use(port) for port in wanted):
            return offset
        offset += step


# --- up --------------------------------------------------------------------------------------


def up(
    state_dir: Path | None = None,
    fleet_path: Path | None = None,
    port_offset: int | None = None,
    say: Say = _say,
    with_runner: bool = True,
    with_lws: bool = False,
) -> Sandbox:
    """Start (or reuse) every component and the fleet; returns the sandbox handle.

    Holds a lock on the state dir, so two ``up`` (a user's and a test session's) do not race.
    ``with_lws`` adds LeaderWorkerSet (built on first use); once a sandbox has it, later
    ``up`` calls keep it (recorded in ``sandbox.json``).
    """
    started_at = time.monotonic()
    fleet_path = (fleet_path or default_fleet_path()).resolve()
    groups = load_fleet(fleet_path)
    root = resolve(state_dir, port_offset).paths.root
    with processes.exclusive_lock(root.parent / f".{root.name}.lock", say, "sandbox up/down"):
        # Resolve again under the lock: a concurrent up may have recorded the ports meanwhile.
        sandbox = resolve(state_dir, port_offset)
        return _up_locked(sandbox, groups, fleet_path, port_offset, say, with_runner, started_at, with_lws)


def _recorded_lws(paths: StatePaths) -> bool:
    try:
        return bool(json.loads(paths.sandbox_file.read_text()).get("lws"))
    except (OSError, ValueError, AttributeError):
        return False


def lws_expected(sandbox: Sandbox) -> bool:
    """Whether this sandbox was brought up with LeaderWorkerSet (``up --with-lws``)."""
    return _recorded_lws(sandbox.paths)


def _up_locked(
    sandbox: Sandbox,
    groups: list[fleet.NodeGroup],
    fleet_path: Path,
    port_offset: int | None,
    say: Say,
    with_runner: bool,
    started_at: float,
    with_lws: bool = False,
) -> Sandbox:
    paths, ports = sandbox.paths, sandbox.ports
    _check_recorded_ports(sandbox, port_offset)
    exposed = ports_in_ephemeral_range(ports)
    if exposed:
        low, high = processes.ephemeral_port_range()
        say(
            f"[sandbox] warning: port(s) {', '.join(map(str, exposed))} lie in the kernel's ephemeral range {low}-{high}, "
            f"where any outgoing connection may take them before they are bound; "
            f"a --port-offset of at most {low - 1 - max(all_ports(Ports()))} keeps every port below it"
        )
    with_lws = with_lws or _recorded_lws(paths)

    try:
        bins = binaries.ensure_all(say=say)
        lws_binary = binaries.ensure_go_build(pins.lws_build(), os.environ, say) / "lws" if with_lws else None
    except binaries.BuildError as exc:
        raise SandboxError(str(exc)) from exc

    for directory in (paths.root, paths.logs, paths.pids, paths.etcd_data, paths.prometheus_data):
        directory.mkdir(parents=True, exist_ok=True)
    os.chmod(paths.etcd_data, 0o700)  # etcd refuses a data dir others can read
    try:
        pki.ensure_pki(paths)
    except pki.PkiError as exc:
        raise SandboxError(str(exc)) from exc
    pki.write_kubeconfigs(paths, ports.apiserver)
    kwok_changed = _write_kwok_config(paths)
    prometheus_changed = _write_prometheus_config(paths, ports)
    binary_paths = {**bins.as_dict(), **({"lws": str(lws_binary)} if lws_binary else {})}
    paths.sandbox_file.write_text(
        json.dumps({"ports": ports.as_dict(), "binaries": binary_paths, "fleet": str(fleet_path), "lws": with_lws}, indent=1)
    )

    commands = flags.commands(binary_paths, sys.executable, paths, ports)
    health = flags.health(ports)
    env = {**os.environ, processes.MARKER_ENV: sandbox.marker}
    crd_error: SandboxError | None = None
    for name in flags.COMPONENTS:
        if name == "runner":
            if not with_runner:
                continue
            if importlib.util.find_spec(flags.RUNNER_MODULE) is None:
                say(f"[sandbox] runner: module {flags.RUNNER_MODULE} not found; not started (pods stay Pending)")
                continue
        if name == "lws":
            if not with_lws:
                continue
            _prepare_lws(sandbox, bins.kubectl, say)
        if name == "kwok":
            # The default ServiceAccount proves the controller-manager works end to end.
            _wait_default_service_account(sandbox)
            _apply_kwok_crds(sandbox, bins.kubectl, say)
        _ensure_component(sandbox, name, commands[name], health[name], env, say, config_changed=name == "kwok" and kwok_changed)
        if name == "lws":
            _apply_lws_webhooks(sandbox, bins.kubectl, say)
        if name == "kwok":
            _sync_nodes(sandbox, groups, say)
            _wait_nodes_ready(sandbox, [n["metadata"]["name"] for n in fleet.node_objects(groups)])
            try:
                _apply_crds(sandbox, bins.kubectl, say)
            except SandboxError as exc:
                # The cluster is still useful; finish starting it, then report the CRD error.
                crd_error = exc
        if name == "prometheus" and prometheus_changed and name not in sandbox.started:
            _reload_prometheus(sandbox, say)

    took = time.monotonic() - started_at
    say(
        f"[sandbox] up in {took:.1f}s: {', '.join(sandbox.started) or 'everything reused'}"
        + (f" started; {len(groups)} node groups from {fleet_path}" if sandbox.started else "")
    )
    say(f"[sandbox] kubectl: {bins.kubectl}")
    say(f"[sandbox] point kubectl at it:  export KUBECONFIG={paths.admin_kubeconfig}")
    say(f"[sandbox] prometheus: {sandbox.prometheus_url}")
    if crd_error is not None:
        raise crd_error
    return sandbox


def _check_recorded_ports(sandbox: Sandbox, port_offset: int | None) -> None:
    """Refuse to move a running sandbox to other ports (down it first)."""
    if port_offset is None:
        return
    try:
        recorded = Ports(**json.loads(sandbox.paths.sandbox_file.read_text())["ports"])
    except (OSError, ValueError, TypeError, KeyError):
        return
    if recorded != sandbox.ports and any(_live(sandbox, name) for name in flags.COMPONENTS):
        raise SandboxError(
            f"--port-offset {port_offset}: the sandbox in {sandbox.paths.root} runs on other ports; run `kneepoint sandbox down` first"
        )


def _live(sandbox: Sandbox, name: str) -> processes.Record | None:
    record = processes.load_record(sandbox.paths.pid(name))
    return record if processes.live_process(record) is not None else None


PORT_FREE_WAIT_SECONDS = 5.0


def _ensure_component(
    sandbox: Sandbox, name: str, argv: list[str], health: flags.Health, env: Mapping[str, str], say: Say, config_changed: bool = False
) -> None:
    paths = sandbox.paths
    record = _live(sandbox, name)
    if record is not None:
        same = _same_command(record.argv, argv)
        if same and not config_changed and processes.probe(health, paths.pki)[0]:
            if record.start_ticks is None:  # a pid file from before start ticks: record them while its start time still matches
                dataclasses.replace(record, start_ticks=processes.start_ticks(record.pid)).save(paths.pid(name))
            say(f"[sandbox] {name}: running (pid {record.pid}), reused")
            return
        why = "its command line changed" if not same else "its configuration changed" if config_changed else "it is not healthy"
        say(f"[sandbox] {name}: restarting pid {record.pid} ({why})")
        left = processes.stop([record], marker=None)
        if left:
            raise SandboxError(f"{name}: could not stop {', '.join(left)}")
    for port in flags.listen_ports(sandbox.ports)[name]:
        # A component just stopped (restarted above) can hold its listener for a moment while it exits.
        deadline = time.monotonic() + (PORT_FREE_WAIT_SECONDS if record is not None else 0.0)
        while processes.port_in_use(port) and time.monotonic() < deadline:
            time.sleep(0.2)
        if processes.port_in_use(port):
            raise SandboxError(
                f"{name}: port {HOST}:{port} is taken by {processes.port_owner(port)}, not by this sandbox; "
                f"stop it, or start the sandbox on other ports with --port-offset N"
            )
    began = time.monotonic()
    record = processes.start(name, argv, paths.log(name), paths.pid(name), env, cwd=paths.root)
    try:
        processes.wait_healthy(record, health, paths.pki, paths.log(name), HEALTH_TIMEOUT.get(name, DEFAULT_HEALTH_TIMEOUT))
    except processes.ProcessError as exc:
        processes.stop([record], marker=None)
        raise SandboxError(str(exc)) from exc
    sandbox.started.append(name)
    say(f"[sandbox] {name}: started (pid {record.pid}) and healthy in {time.monotonic() - began:.1f}s")


def _same_command(recorded: list[str], wanted: list[str]) -> bool:
    """Same arguments and the same executable (``python`` and ``python3`` of one venv are one)."""
    if not recorded or not wanted or recorded[1:] != wanted[1:]:
        return False
    return os.path.realpath(recorded[0]) == os.path.realpath(wanted[0])


def _write_kwok_config(paths: StatePaths) -> bool:
    """Write KWOK's stages; True when they changed (KWOK reads them only when it starts)."""
    stages = importlib.resources.files("kneepoint.data").joinpath("sandbox/kwok-stages.yaml").read_text()
    return _write_if_changed(paths.kwok_config, stages)


def _write_prometheus_config(paths: StatePaths, ports: Ports) -> bool:
    text = "# Generated by `kneepoint sandbox up`; edits are overwritten.\n" + yaml.safe_dump(
        promconfig.prometheus_config(paths, ports), sort_keys=False
    )
    return _write_if_changed(paths.prometheus_config, text)


def _write_if_changed(path: Path, text: str) -> bool:
    if path.exists() and path.read_text() == text:
        return False
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return True


def _reload_prometheus(sandbox: Sandbox, say: Say) -> None:
    import urllib.request

    request = urllib.request.Request(f"{sandbox.prometheus_url}/-/reload", method="POST")
    with urllib.request.urlopen(request, timeout=10):
        pass
    say("[sandbox] prometheus: configuration changed, reloaded")


# --- Kubernetes API steps ------------------------------------------------------------------


def api_client(sandbox: Sandbox) -> Any:
    """A kubernetes.client.ApiClient authenticated as the sandbox's admin."""
    from kubernetes import config

    return config.new_client_from_config(config_file=str(sandbox.kubeconfig))


def _wait_default_service_account(sandbox: Sandbox, timeout: float = 90) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    with api_client(sandbox) as api:
        core = client.CoreV1Api(api)
        deadline = time.monotonic() + timeout
        while True:
            try:
                core.read_namespaced_service_account("default", "default")
                return
            except ApiException as exc:
                if exc.status != 404 or time.monotonic() > deadline:
                    raise SandboxError(
                        f"ServiceAccount default/default did not appear within {timeout:.0f}s "
                        f"(controller-manager log: {sandbox.paths.log('kube-controller-manager')})"
                    ) from exc
            time.sleep(0.3)


def _sync_nodes(sandbox: Sandbox, groups: list[fleet.NodeGroup], say: Say) -> None:
    """Create the fleet's nodes, update changed ones, delete sandbox nodes no longer listed."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    wanted = {node["metadata"]["name"]: node for node in fleet.node_objects(groups)}
    # Where the API server finds the node's "kubelet" for pod logs: KWOK's server (flags.kwok).
    # KWOK writes it only when it initialises a node, so nodes kept from an earlier start get it here.
    endpoints = {"kubeletEndpoint": {"Port": sandbox.ports.kwok}}
    for node in wanted.values():
        node["status"]["daemonEndpoints"] = endpoints
    with api_client(sandbox) as api:
        core = client.CoreV1Api(api)
        existing = {n.metadata.name: n for n in core.list_node(label_selector=f"{fleet.SANDBOX_NODE_LABEL}=true").items}
        created, updated, deleted = [], [], []
        for name in existing.keys() - wanted.keys():
            core.delete_node(name)
            deleted.append(name)
        for name, node in wanted.items():
            current = existing.get(name)
            if current is None:
                try:
                    core.create_node(node)  # nodes accept status on create
                    created.append(name)
                except ApiException as exc:
                    if exc.status != 409:
                        raise
                continue
            labels = current.metadata.labels or {}
            capacity = current.status.capacity or {}
            want_labels = node["metadata"]["labels"]
            stale = {
                key: None for key in labels if key.startswith((node_labels.GFD_PREFIX, node_labels.PROBE_PREFIX)) and key not in want_labels
            }
            if any(labels.get(k) != v for k, v in want_labels.items()) or stale:
                core.patch_node(name, {"metadata": {"labels": {**want_labels, **stale}}})
                updated.append(name)
            port = current.status.daemon_endpoints.kubelet_endpoint.port if current.status.daemon_endpoints else 0
            if capacity != node["status"]["capacity"] or port != sandbox.ports.kwok:
                core.patch_node_status(name, {"status": {k: node["status"][k] for k in ("capacity", "allocatable", "daemonEndpoints")}})
                if name not in updated:
                    updated.append(name)
    parts = [f"{label} {', '.join(names)}" for label, names in (("created", created), ("updated", updated), ("deleted", deleted)) if names]
    say(f"[sandbox] nodes: {'; '.join(parts) if parts else 'unchanged'} ({len(wanted)} in the fleet)")


def _wait_nodes_ready(sandbox: Sandbox, names: list[str], timeout: float = 60) -> None:
    from kubernetes import client

    deadline = time.monotonic() + timeout
    with api_client(sandbox) as api:
        core = client.CoreV1Api(api)
        while True:
            ready = set()
            for node in core.list_node(label_selector=f"{fleet.SANDBOX_NODE_LABEL}=true").items:
                for cond in node.status.conditions or []:
                    if cond.type == "Ready" and cond.status == "True":
                        ready.add(node.metadata.name)
            missing = [n for n in names if n not in ready]
            if not missing:
                return
            if time.monotonic() > deadline:
                raise SandboxError(f"nodes not Ready after {timeout:.0f}s: {', '.join(missing)} (KWOK log: {sandbox.paths.log('kwok')})")
            time.sleep(0.3)


def kubectl(sandbox: Sandbox, kubectl_path: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the sandbox's kubectl against it."""
    proc = subprocess.run([str(kubectl_path), f"--kubeconfig={sandbox.kubeconfig}", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise SandboxError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc


def _wait_established(sandbox: Sandbox, kubectl_path: Path, path: Path, timeout: float = 60.0) -> None:
    """``kubectl wait --for=condition=Established``, retried: right after an apply a CRD may
    have no ``status.conditions`` yet, and kubectl then fails at once ("accessor error")."""
    deadline = time.monotonic() + timeout
    while True:
        proc = kubectl(sandbox, kubectl_path, "wait", "--for=condition=Established", "--timeout=30s", "-f", str(path), check=False)
        if proc.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise SandboxError(f"CRDs in {path} not Established within {timeout:.0f}s: {proc.stderr.strip()}")
        time.sleep(0.5)


def _apply_crds(sandbox: Sandbox, kubectl_path: Path, say: Say) -> None:
    directory = crds_dir()
    if directory is None:
        say("[sandbox] crds/: no CRD files found; none applied")
        return
    kubectl(sandbox, kubectl_path, "apply", "--server-side", "--force-conflicts", "--field-manager=kneepoint-sandbox", "-f", str(directory))
    _wait_established(sandbox, kubectl_path, directory)
    say(f"[sandbox] CRDs from {directory} applied (server-side) and Established")


def _apply_kwok_crds(sandbox: Sandbox, kubectl_path: Path, say: Say) -> None:
    """KWOK's Logs CRD (kneepoint/data/sandbox), Established before KWOK starts watching Logs objects."""
    resource = importlib.resources.files("kneepoint.data").joinpath("sandbox/kwok-logs-crd.yaml")
    with importlib.resources.as_file(resource) as path:
        kubectl(sandbox, kubectl_path, "apply", "--server-side", "--force-conflicts", "--field-manager=kneepoint-sandbox", "-f", str(path))
        _wait_established(sandbox, kubectl_path, path)
    say("[sandbox] KWOK Logs CRD applied (pod logs for kubectl logs)")


def _prepare_lws(sandbox: Sandbox, kubectl_path: Path, say: Say) -> None:
    """LWS's serving certificate (IP:127.0.0.1), its Configuration, and its CRDs (Established before it starts)."""
    paths = sandbox.paths
    try:
        pki.ensure_cert(paths.pki, lws_config.CERT_NAME, "/CN=lws-webhook-service.lws-system.svc", "serverAuth", lws_config.CERT_SANS)
    except pki.PkiError as exc:
        raise SandboxError(str(exc)) from exc
    certs = lws_config.cert_dir(paths)
    certs.mkdir(exist_ok=True)
    _write_if_changed(certs / "tls.crt", (paths.pki / f"{lws_config.CERT_NAME}.crt").read_text())
    _write_if_changed(certs / "tls.key", (paths.pki / f"{lws_config.CERT_NAME}.key").read_text())
    os.chmod(certs / "tls.key", 0o600)
    _write_if_changed(lws_config.config_path(paths), yaml.safe_dump(lws_config.configuration(paths, sandbox.ports), sort_keys=False))
    began = time.monotonic()
    documents = lws_component.crd_documents()
    if _crds_current(sandbox, documents):
        say("[sandbox] lws: CRDs present and current")
        return
    target = paths.root / "lws-crds.json"
    _write_if_changed(target, json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}))
    kubectl(sandbox, kubectl_path, "apply", "--server-side", "--force-conflicts", "--field-manager=kneepoint-sandbox", "-f", str(target))
    _wait_established(sandbox, kubectl_path, target)
    say(f"[sandbox] lws: CRDs applied (server-side) and Established in {time.monotonic() - began:.1f}s")


def _crds_current(sandbox: Sandbox, documents: list[dict[str, Any]]) -> bool:
    """Whether every CRD exists, is Established and carries the digest of the packaged copy
    (re-applying 260 kB of schema costs the API server seconds for nothing)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    with api_client(sandbox) as api:
        ext = client.ApiextensionsV1Api(api)
        for doc in documents:
            try:
                crd = ext.read_custom_resource_definition(doc["metadata"]["name"])
            except ApiException as exc:
                if exc.status == 404:
                    return False
                raise
            wanted = doc["metadata"]["annotations"][lws_component.DIGEST_ANNOTATION]
            if (crd.metadata.annotations or {}).get(lws_component.DIGEST_ANNOTATION) != wanted:
                return False
            if not any(c.type == "Established" and c.status == "True" for c in (crd.status.conditions or [])):
                return False
    return True


def _apply_lws_webhooks(sandbox: Sandbox, kubectl_path: Path, say: Say, timeout: float = 30) -> None:
    """Point LWS's webhook configurations at the controller on loopback, once its webhook server listens."""
    webhook_port, _ = lws_config.ports(sandbox.ports)
    deadline = time.monotonic() + timeout
    while not processes.port_in_use(webhook_port):
        if time.monotonic() > deadline:
            raise SandboxError(
                f"lws: webhook server not listening on {layout.HOST}:{webhook_port} after {timeout:.0f}s; see {sandbox.paths.log('lws')}"
            )
        time.sleep(0.2)
    documents = lws_component.webhook_configurations(webhook_port, (sandbox.paths.pki / "ca.crt").read_bytes())
    target = lws_config.webhooks_path(sandbox.paths)
    _write_if_changed(target, json.dumps({"apiVersion": "v1", "kind": "List", "items": documents}, indent=1))
    kubectl(sandbox, kubectl_path, "apply", "--server-side", "--force-conflicts", "--field-manager=kneepoint-sandbox", "-f", str(target))
    say(f"[sandbox] lws: webhooks at https://{layout.HOST}:{webhook_port} registered")


# --- down ------------------------------------------------------------------------------------


def down(state_dir: Path | None = None, only: list[str] | None = None, purge: bool = False, say: Say = _say) -> list[str]:
    """Stop the sandbox's processes (all, or ``only`` those named); returns any left alive.

    Stopping everything also ends every process that carries this sandbox's marker (what
    the runner started). ``purge`` then deletes the state directory (etcd data, PKI, logs).
    """
    root = resolve(state_dir).paths.root
    with processes.exclusive_lock(root.parent / f".{root.name}.lock", say, "sandbox up/down"):
        return _down_locked(resolve(state_dir), only, purge, say)


def _down_locked(sandbox: Sandbox, only: list[str] | None, purge: bool, say: Say) -> list[str]:
    names = [n for n in reversed(flags.COMPONENTS) if only is None or n in only]
    records = [r for r in (processes.load_record(sandbox.paths.pid(n)) for n in names) if r is not None]
    running = [r.name for r in records if processes.live_process(r) is not None]
    left = processes.stop(records, marker=sandbox.marker if only is None else None)
    for name in names:
        if not any(name in entry for entry in left):
            sandbox.paths.pid(name).unlink(missing_ok=True)
    if left:
        say(f"[sandbox] still running after SIGKILL: {', '.join(left)}")
        return left
    say(f"[sandbox] stopped: {', '.join(running) if running else 'nothing was running'}")
    if purge and only is None:
        shutil.rmtree(sandbox.paths.root, ignore_errors=True)
        say(f"[sandbox] removed {sandbox.paths.root}")
    return []


# --- status ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ComponentStatus:
    """One line of ``kneepoint sandbox status``."""

    name: str
    state: str  # running | unhealthy | stopped
    pid: int | None
    detail: str
    rss_bytes: int


def status(state_dir: Path | None = None) -> tuple[Sandbox, list[ComponentStatus]]:
    """Each component's state, pid, health detail and resident memory (with descendants)."""
    sandbox = resolve(state_dir)
    health = flags.health(sandbox.ports)
    rows = []
    for name in flags.COMPONENTS:
        record = processes.load_record(sandbox.paths.pid(name))
        if processes.live_process(record) is None or record is None:
            rows.append(ComponentStatus(name, "stopped", None, "", 0))
            continue
        ok, detail = processes.probe(health[name], sandbox.paths.pki)
        rss = processes.rss_bytes(processes.tree(record))
        rows.append(ComponentStatus(name, "running" if ok else "unhealthy", record.pid, detail, rss))
    return sandbox, rows


def sandbox_rss_bytes(sandbox: Sandbox) -> int:
    """Resident memory of every process of the sandbox (components, descendants, marked ones)."""
    procs = {}
    for name in flags.COMPONENTS:
        record = processes.load_record(sandbox.paths.pid(name))
        for proc in processes.tree(record) if record is not None else []:
            procs[proc.pid] = proc
    for proc in processes.marked_processes(sandbox.marker):
        procs.setdefault(proc.pid, proc)
    return processes.rss_bytes(procs.values())
