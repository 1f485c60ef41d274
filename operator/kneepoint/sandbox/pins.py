"""Pinned upstream versions and how each set of sandbox binaries is built.

Pure data: one :class:`GoBuild` per wrapper module. Everything the sandbox runs comes from
one Kubernetes release (kube-apiserver, -controller-manager, -scheduler, kubectl), etcd's
server module, KWOK and Prometheus, each built from its Go module into the cache. Changing a patch
release is a one-line change here; the cache directory names carry the version, so an
old build is never mistaken for a new one.
"""

from __future__ import annotations

from dataclasses import dataclass

KUBERNETES_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.16"
KWOK_VERSION = "v0.8.0"
# Prometheus 3.x publishes Go module versions v0.3MM.P for release 3.MM.P.
PROMETHEUS_VERSION = "v3.16.0"
# helm renders and lints the chart (charts/kneepoint); not part of ``all_builds``: the
# sandbox itself never runs it, the chart tests build it on first use.
HELM_VERSION = "v3.21.4"
# LeaderWorkerSet runs one engine replica over several nodes (pipeline parallel across
# nodes). Optional like helm: ``kneepoint sandbox up --with-lws`` builds and starts it.
# v0.10.0 was the plan, but the Go module proxy answers 403 "This module version is not
# available" for its zip (and for v0.10.1); v0.9.0 is the newest it serves (go 1.26.0,
# k8s.io/* v0.36.2, controller-runtime v0.24.1).
LWS_VERSION = "v0.9.0"

# Fixed so that two builds of the same pin are byte-identical (-trimpath, no VCS stamp).
BUILD_DATE = "2026-11-29T00:00:00Z"

# The 33 staging modules of Kubernetes 1.36. k8s.io/kubernetes requires each at v0.0.0 and
# maps it to ./staging/...; a wrapper module must replace every one with its published
# v0.Y.Z, or module loading stops (the module zip has no staging/ directory).
STAGING_MODULES_1_36: tuple[str, ...] = (
    "api",
    "apiextensions-apiserver",
    "apimachinery",
    "apiserver",
    "cli-runtime",
    "client-go",
    "cloud-provider",
    "cluster-bootstrap",
    "code-generator",
    "component-base",
    "component-helpers",
    "controller-manager",
    "cri-api",
    "cri-client",
    "cri-streaming",
    "csi-translation-lib",
    "dynamic-resource-allocation",
    "endpointslice",
    "externaljwt",
    "kms",
    "kube-aggregator",
    "kube-controller-manager",
    "kube-proxy",
    "kube-scheduler",
    "kubectl",
    "kubelet",
    "metrics",
    "mount-utils",
    "pod-security-admission",
    "sample-apiserver",
    "sample-cli-plugin",
    "sample-controller",
    "streaming",
)


@dataclass(frozen=True)
class GoBuild:
    """A wrapper Go module and the binaries built from it.

    ``outputs`` maps a binary name to the package path whose main it is; ``name`` and
    ``version`` name the cache directories ``build/<name>-<version>`` and
    ``bin/<name>-<version>``.
    """

    name: str
    version: str
    module_path: str
    go_directive: str
    godebug: str | None
    requires: tuple[tuple[str, str], ...]
    replaces: tuple[tuple[str, str, str], ...]
    outputs: tuple[tuple[str, str], ...]
    ldflags: str
    tags: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        """Directory stem under the cache's build/ and bin/ folders."""
        return f"{self.name}-{self.version}"

    @property
    def binaries(self) -> tuple[str, ...]:
        """Names of the binaries this build produces."""
        return tuple(name for name, _ in self.outputs)


def kubernetes_ldflags(version: str, build_date: str = BUILD_DATE) -> str:
    """Linker flags that stamp the version the way upstream's hack/lib/version.sh does.

    Without them /version reports v0.0.0-master, which breaks helm's kubeVersion checks.
    """
    major, minor = version.lstrip("v").split(".")[:2]
    parts = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        parts += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate={build_date}",
        ]
    return " ".join(parts)


def kubernetes_build(version: str = KUBERNETES_VERSION) -> GoBuild:
    """The wrapper module for kube-apiserver, kube-controller-manager, kube-scheduler, kubectl."""
    staging_version = "v0." + version.lstrip("v").split(".", 1)[1]
    minor = version.lstrip("v").split(".")[1]
    return GoBuild(
        name="k8s",
        version=version,
        module_path="kneepoint.sandbox/k8sbin",
        go_directive=f"1.{minor_go_line(int(minor))}.0",
        godebug=f"default=go1.{minor_go_line(int(minor))}",
        requires=(("k8s.io/kubernetes", version),),
        replaces=tuple((f"k8s.io/{m}", f"k8s.io/{m}", staging_version) for m in STAGING_MODULES_1_36),
        outputs=tuple(
            (cmd, f"k8s.io/kubernetes/cmd/{cmd}") for cmd in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
        ),
        ldflags=kubernetes_ldflags(version),
    )


def minor_go_line(kube_minor: int) -> int:
    """Go minor version whose language line a Kubernetes minor release declares (1.36 -> 26)."""
    # 1.33 declares go 1.24, 1.35 go 1.25, 1.36 go 1.26 (k/k go.mod of each release).
    table = {33: 24, 34: 24, 35: 25, 36: 26, 37: 26}
    if kube_minor not in table:
        raise ValueError(f"kubernetes minor 1.{kube_minor}: no known Go line (known: {sorted(table)})")
    return table[kube_minor]


def etcd_build(version: str = ETCD_VERSION) -> GoBuild:
    """The wrapper module for etcd: server/v3 is itself the main package.

    ``go install go.etcd.io/etcd/server/v3@v`` fails because server's go.mod replaces its
    siblings with relative paths; a wrapper module that requires it ignores those replaces.
    """
    return GoBuild(
        name="etcd",
        version=version,
        module_path="kneepoint.sandbox/etcdbin",
        go_directive="1.25.0",
        godebug=None,
        requires=(("go.etcd.io/etcd/server/v3", version),),
        replaces=(),
        outputs=(("etcd", "go.etcd.io/etcd/server/v3"),),
        ldflags="-s -w",
    )


def kwok_build(version: str = KWOK_VERSION) -> GoBuild:
    """The wrapper module for kwok (no replaces upstream, so the graph is kwok's own)."""
    return GoBuild(
        name="kwok",
        version=version,
        module_path="kneepoint.sandbox/kwokbin",
        go_directive="1.26.0",
        godebug=None,
        requires=(("sigs.k8s.io/kwok", version),),
        replaces=(),
        outputs=(("kwok", "sigs.k8s.io/kwok/cmd/kwok"),),
        # kwok carries its version in pkg/consts as a constant string: nothing to stamp.
        ldflags="-s -w",
    )


def prometheus_module_version(version: str) -> str:
    """Go module version of a Prometheus 3 release: v3.16.0 -> v0.316.0."""
    major, minor, patch = (int(part) for part in version.lstrip("v").split("."))
    if major != 3:
        raise ValueError(f"prometheus {version}: only 3.x releases map to module versions v0.3MM.P")
    return f"v0.{300 + minor}.{patch}"


def prometheus_build(version: str = PROMETHEUS_VERSION) -> GoBuild:
    """Prometheus with only the Kubernetes service discovery (plus file/http/static).

    Debian 12's prometheus package (2.42) is built without Kubernetes service discovery
    (its config parser rejects ``kubernetes_sd_configs``), so the sandbox builds
    Prometheus from its module like the other components. The tags drop the cloud SDs,
    which are most of the build. The module has no web UI assets (they are built with
    npm); the HTTP API, which is what kneepoint reads, is complete.
    """
    common = "github.com/prometheus/common/version"
    plain = version.lstrip("v")
    return GoBuild(
        name="prometheus",
        version=version,
        module_path="kneepoint.sandbox/prometheusbin",
        go_directive="1.26.7",
        godebug=None,
        requires=(("github.com/prometheus/prometheus", prometheus_module_version(version)),),
        replaces=(),
        outputs=(("prometheus", "github.com/prometheus/prometheus/cmd/prometheus"),),
        ldflags=f"-s -w -X {common}.Version={plain} -X {common}.Branch=module -X {common}.BuildDate={BUILD_DATE}",
        tags=("remove_all_sd", "enable_kubernetes_sd"),
    )


def helm_build(version: str = HELM_VERSION) -> GoBuild:
    """helm 3 from its module (no replaces upstream; go.mod says go 1.26.0).

    The ldflags are upstream's Makefile ones: the version, and the Kubernetes version that
    ``helm lint``/``helm template`` assume without a cluster, which upstream derives from
    its client-go requirement (v0.36.2 for v3.21.4 -> 1.36).
    """
    pkg = "helm.sh/helm/v3"
    k8s = ("1", "36")
    return GoBuild(
        name="helm",
        version=version,
        module_path="kneepoint.sandbox/helmbin",
        go_directive="1.26.0",
        godebug=None,
        requires=((pkg, version),),
        replaces=(),
        outputs=(("helm", f"{pkg}/cmd/helm"),),
        ldflags=" ".join(
            ["-s", "-w", f"-X {pkg}/internal/version.version={version}", f"-X {pkg}/internal/version.gitTreeState=clean"]
            + [f"-X {pkg}/pkg/{p}.k8sVersionMajor={k8s[0]} -X {pkg}/pkg/{p}.k8sVersionMinor={k8s[1]}" for p in ("lint/rules", "chartutil")]
        ),
    )


def lws_build(version: str = LWS_VERSION) -> GoBuild:
    """The LeaderWorkerSet controller (with its webhooks) from ``sigs.k8s.io/lws``.

    Upstream's main package is ``sigs.k8s.io/lws/cmd``, so ``go install`` names the binary
    ``cmd``; the wrapper builds it as ``lws``. go.mod has no replaces and says go 1.26.0.
    The ldflags stamp the version as upstream's Makefile does (``pkg/version``).
    """
    pkg = "sigs.k8s.io/lws/pkg/version"
    return GoBuild(
        name="lws",
        version=version,
        module_path="kneepoint.sandbox/lwsbin",
        go_directive="1.26.0",
        godebug=None,
        requires=(("sigs.k8s.io/lws", version),),
        replaces=(),
        outputs=(("lws", "sigs.k8s.io/lws/cmd"),),
        ldflags=f"-s -w -X {pkg}.GitVersion={version} -X {pkg}.GitCommit=module -X {pkg}.BuildDate={BUILD_DATE}",
    )


def all_builds() -> tuple[GoBuild, ...]:
    """Every Go build the sandbox needs, in the order ``up`` builds them."""
    return (kubernetes_build(), etcd_build(), kwok_build(), prometheus_build())
