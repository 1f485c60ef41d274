"""Which Prometheus ``kneepoint operator`` uses when none is named, and a one-line note when that cannot work.

The default, ``http://prometheus-operated.monitoring.svc:9090``, is a cluster DNS name: right
in a pod, unresolvable on a laptop, where every tier would then wait out its metrics
deadline. Outside a cluster: when the current kube context is the sandbox, its Prometheus
is the one; otherwise the operator says at start-up that the default does not resolve.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

IN_CLUSTER_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


@dataclass(frozen=True)
class PrometheusChoice:
    url: str
    note: str | None = None
    """One line for the start-up log (None: nothing to say)."""


def _current_server(kubeconfig: str | None) -> str | None:
    """The API server URL of the current kube context (kubectl's merge of KUBECONFIG's files: first wins), or None."""
    import yaml

    files = [f for f in (kubeconfig or "").split(os.pathsep) if f] or [os.path.expanduser("~/.kube/config")]
    current: str | None = None
    contexts: dict[Any, Any] = {}
    clusters: dict[Any, Any] = {}
    for name in files:
        try:
            with open(name, encoding="utf-8") as fh:
                doc = yaml.safe_load(fh) or {}
        except (OSError, yaml.YAMLError):
            continue
        current = current or doc.get("current-context")
        for item in doc.get("contexts") or []:
            contexts.setdefault(item.get("name"), item.get("context") or {})
        for item in doc.get("clusters") or []:
            clusters.setdefault(item.get("name"), item.get("cluster") or {})
    cluster = clusters.get(contexts.get(current, {}).get("cluster"))
    return str(cluster["server"]) if cluster and cluster.get("server") else None


def _same_server(a: str, b: str) -> bool:
    pa, pb = urlsplit(a), urlsplit(b)
    return (pa.hostname, pa.port or 443) == (pb.hostname, pb.port or 443)


def _resolves(url: str) -> bool:
    host = urlsplit(url).hostname
    if not host:
        return False
    try:
        socket.getaddrinfo(host, None)
        return True
    except OSError:
        return False


def choose(default_url: str, named: bool, env: Mapping[str, str] | None = None) -> PrometheusChoice:
    """``named``: the URL came from --prometheus-url or KNEEPOINT_PROMETHEUS_URL (then it is kept, silently)."""
    env = os.environ if env is None else env
    if named or (env.get("KUBERNETES_SERVICE_HOST") and os.path.exists(IN_CLUSTER_TOKEN)):
        return PrometheusChoice(default_url)
    server = _current_server(env.get("KUBECONFIG") or None)
    if server is not None:
        from kneepoint.sandbox import controlplane

        sandbox = controlplane.resolve(env=env)
        if _same_server(server, sandbox.apiserver_url):
            return PrometheusChoice(
                sandbox.prometheus_url, f"Prometheus: the sandbox's at {sandbox.prometheus_url} (the current kube context is the sandbox)"
            )
    if _resolves(default_url):
        return PrometheusChoice(default_url)
    return PrometheusChoice(
        default_url,
        f"Prometheus: the default {default_url} does not resolve here (outside the cluster); pass --prometheus-url "
        "or set spec.metrics.prometheusUrl, or every tier waits out its metrics deadline without metrics",
    )
