"""Command lines of the sandbox's components (pure: paths and ports in, argv lists out).

Everything binds to 127.0.0.1. Security is as in a real cluster: TLS everywhere on the
API server, RBAC on (``--authorization-mode=Node,RBAC``), client certificates whose
subjects match the bootstrap RBAC bindings, a dedicated service-account signing key, and
``--use-service-account-credentials`` so each controller acts under its own RBAC role.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kneepoint.sandbox.layout import HOST, Ports, StatePaths
from kneepoint.sandbox.lws_config import argv as lws_argv
from kneepoint.sandbox.lws_config import health_url as lws_health_url
from kneepoint.sandbox.lws_config import ports as lws_ports

# Start order; ``down`` stops in reverse.
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "prometheus",
    "lws",  # optional (``up --with-lws``): LeaderWorkerSet, for multi-node tiers
    "runner",
)
OPTIONAL_COMPONENTS = ("lws", "runner")

SERVICE_CIDR = "10.96.0.0/16"  # ClusterIPs are virtual here (no kube-proxy): never dialled
# Pod IPs that KWOK hands to pretend pods: loopback, so a process can bind to a pod's IP.
KWOK_POD_CIDR = "127.1.0.0/16"
RUNNER_MODULE = "kneepoint.sandbox.runner"
DISABLED_CONTROLLERS = ("endpoints-controller", "endpointslice-controller", "endpointslice-mirroring-controller")


@dataclass(frozen=True)
class Health:
    """How to tell that a started component is ready."""

    url: str | None  # None: being alive is all we can check
    tls: bool = False
    client_cert: bool = False  # present the admin certificate


def etcd(binary: str, paths: StatePaths, ports: Ports) -> list[str]:
    """etcd, one member, client and peer on loopback; fsync off (a throwaway sandbox)."""
    client = f"http://{HOST}:{ports.etcd_client}"
    peer = f"http://{HOST}:{ports.etcd_peer}"
    return [
        binary,
        "--name=s0",
        f"--data-dir={paths.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=s0={peer}",
        "--auto-compaction-retention=1",
        "--quota-backend-bytes=2147483648",
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def kube_apiserver(binary: str, paths: StatePaths, ports: Ports) -> list[str]:
    """kube-apiserver on 127.0.0.1 with TLS, client-certificate auth, RBAC and SA tokens."""
    pki = paths.pki
    return [
        binary,
        f"--etcd-servers=http://{HOST}:{ports.etcd_client}",
        f"--bind-address={HOST}",
        f"--secure-port={ports.apiserver}",
        # A loopback advertise address needs the endpoint reconciler off (k/k#121942, #138102).
        f"--advertise-address={HOST}",
        "--endpoint-reconciler-type=none",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--authorization-mode=Node,RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--allow-privileged=true",
        "--profiling=false",
        # Pod logs: the API server dials the node's InternalIP (127.0.0.1) at the port the node
        # reports (KWOK's server, --node-port below); the node's Hostname does not resolve.
        # Without --kubelet-certificate-authority it does not verify KWOK's self-signed certificate.
        "--kubelet-preferred-address-types=InternalIP",
    ]


def kube_controller_manager(binary: str, paths: StatePaths, ports: Ports) -> list[str]:
    """kube-controller-manager: all controllers, each with its own service-account credentials."""
    pki = paths.pki
    kubeconfig = paths.kubeconfig("controller-manager")
    return [
        binary,
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
        f"--bind-address={HOST}",
        f"--secure-port={ports.controller_manager}",
        f"--tls-cert-file={pki / 'serving.crt'}",
        f"--tls-private-key-file={pki / 'serving.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--leader-elect=false",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}",
        f"--cluster-signing-key-file={pki / 'ca.key'}",
        "--use-service-account-credentials=true",
        # Not the endpoint controllers: the API server refuses loopback pod IPs in Endpoints and EndpointSlices, so
        # they only failed, retried and posted warning events (about 16 refused writes per Service), load a real
        # cluster does not have; the runner resolves Service names itself (runner/resolve.py).
        f"--controllers=*,{','.join('-' + c for c in DISABLED_CONTROLLERS)}",
        "--node-monitor-period=5s",
        "--node-monitor-grace-period=40s",
        "--profiling=false",
    ]


def kube_scheduler(binary: str, paths: StatePaths, ports: Ports) -> list[str]:
    """kube-scheduler with the default profile (NodeResourcesFit decides GPU placement)."""
    pki = paths.pki
    kubeconfig = paths.kubeconfig("scheduler")
    return [
        binary,
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
        f"--bind-address={HOST}",
        f"--secure-port={ports.scheduler}",
        f"--tls-cert-file={pki / 'serving.crt'}",
        f"--tls-private-key-file={pki / 'serving.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--leader-elect=false",
        "--profiling=false",
    ]


def kwok(binary: str, paths: StatePaths, ports: Ports) -> list[str]:
    """KWOK managing the fleet's nodes (annotation kwok.x-k8s.io/node=fake) with our Stages."""
    return [
        binary,
        f"--kubeconfig={paths.admin_kubeconfig}",
        f"--config={paths.kwok_config}",
        "--manage-all-nodes=false",
        "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
        f"--cidr={KWOK_POD_CIDR}",
        f"--node-ip={HOST}",
        "--node-lease-duration-seconds=40",
        f"--server-address={HOST}:{ports.kwok}",
        # Written into each node's status.daemonEndpoints.kubeletEndpoint: kubectl logs reaches KWOK there.
        f"--node-port={ports.kwok}",
        # Per-pod Logs objects (the pod runner writes them; the CRD is applied before KWOK starts).
        "--enable-crds=Logs",
    ]


def prometheus(binary: str, paths: StatePaths, ports: Ports) -> list[str]:
    """Prometheus with the generated config; lifecycle API on so the config can be reloaded."""
    return [
        binary,
        f"--config.file={paths.prometheus_config}",
        f"--storage.tsdb.path={paths.prometheus_data}",
        "--storage.tsdb.retention.time=2d",
        f"--web.listen-address={HOST}:{ports.prometheus}",
        "--web.enable-lifecycle",
        "--log.level=warn",
    ]


def runner(python: str, paths: StatePaths) -> list[str]:
    """The pod runner (another module's): starts real processes for pods on simulated nodes."""
    return [python, "-m", RUNNER_MODULE, "--kubeconfig", str(paths.admin_kubeconfig), "--state-dir", str(paths.root)]


def commands(binaries: Mapping[str, str], python: str, paths: StatePaths, ports: Ports) -> dict[str, list[str]]:
    """argv of every component, keyed by component name in start order.

    ``binaries`` maps etcd, kube_apiserver, kube_controller_manager, kube_scheduler, kwok,
    prometheus (and lws, when built) to executable paths.
    """
    return {
        "etcd": etcd(binaries["etcd"], paths, ports),
        "kube-apiserver": kube_apiserver(binaries["kube_apiserver"], paths, ports),
        "kube-controller-manager": kube_controller_manager(binaries["kube_controller_manager"], paths, ports),
        "kube-scheduler": kube_scheduler(binaries["kube_scheduler"], paths, ports),
        "kwok": kwok(binaries["kwok"], paths, ports),
        "prometheus": prometheus(binaries["prometheus"], paths, ports),
        "lws": lws_argv(binaries.get("lws", "lws"), paths),
        "runner": runner(python, paths),
    }


def health(ports: Ports) -> dict[str, Health]:
    """Readiness endpoint of each component."""
    return {
        "etcd": Health(f"http://{HOST}:{ports.etcd_client}/readyz"),
        "kube-apiserver": Health(f"https://{HOST}:{ports.apiserver}/readyz", tls=True, client_cert=True),
        "kube-controller-manager": Health(f"https://{HOST}:{ports.controller_manager}/healthz", tls=True),
        "kube-scheduler": Health(f"https://{HOST}:{ports.scheduler}/readyz", tls=True),
        "kwok": Health(f"http://{HOST}:{ports.kwok}/healthz"),
        "prometheus": Health(f"http://{HOST}:{ports.prometheus}/-/ready"),
        "lws": Health(lws_health_url(ports)),
        "runner": Health(None),
    }


def listen_ports(ports: Ports) -> dict[str, list[int]]:
    """Ports each component binds, for the 'port taken' check before starting it."""
    return {
        "etcd": [ports.etcd_client, ports.etcd_peer],
        "kube-apiserver": [ports.apiserver],
        "kube-controller-manager": [ports.controller_manager],
        "kube-scheduler": [ports.scheduler],
        "kwok": [ports.kwok],
        "prometheus": [ports.prometheus],
        "lws": list(lws_ports(ports)),
        "runner": [],
    }
