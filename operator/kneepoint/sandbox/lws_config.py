"""LeaderWorkerSet's configuration in the sandbox: ports, its Configuration file, argv, webhook URLs.

Pure (standard library only), like ``flags``: paths and ports in, data out. The LWS
controller runs on the host, so its webhooks are reached by URL
(``https://127.0.0.1:<port><path>``) with the sandbox CA as ``caBundle`` instead of through
a Service; leader election and LWS's internal certificate management are off (the latter
would want a Secret and a Service in lws-system). See ``lws_component`` for the files.
"""

from __future__ import annotations

import base64
import copy
from pathlib import Path
from typing import Any

from kneepoint.sandbox.layout import HOST, Ports, StatePaths

# LWS's usual ports (webhook 9443, health probe 8081), moved with the sandbox's --port-offset.
WEBHOOK_PORT = 9443
HEALTH_PORT = 8081
CERT_NAME = "lws-webhook"
# controller-runtime reads tls.crt and tls.key from the webhook's certDir.
CERT_DIR = "lws-certs"
CERT_SANS = (f"IP:{HOST}", "DNS:localhost", "DNS:lws-webhook-service.lws-system.svc")


def ports(sandbox_ports: Ports) -> tuple[int, int]:
    """(webhook, health) ports: LWS's defaults plus the sandbox's port offset."""
    offset = sandbox_ports.apiserver - Ports().apiserver
    return WEBHOOK_PORT + offset, HEALTH_PORT + offset


def cert_dir(paths: StatePaths) -> Path:
    return paths.root / CERT_DIR


def config_path(paths: StatePaths) -> Path:
    return paths.root / "lws-config.yaml"


def webhooks_path(paths: StatePaths) -> Path:
    return paths.root / "lws-webhooks.json"


def configuration(paths: StatePaths, sandbox_ports: Ports) -> dict[str, Any]:
    """LWS's Configuration (config.lws.x-k8s.io/v1alpha1): loopback only, no leader election, own certificate."""
    webhook, health = ports(sandbox_ports)
    return {
        "apiVersion": "config.lws.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": HOST, "port": webhook, "certDir": str(cert_dir(paths))},
        "health": {"healthProbeBindAddress": f"{HOST}:{health}"},
        "metrics": {"bindAddress": "0"},
    }


def argv(binary: str, paths: StatePaths) -> list[str]:
    """The controller's command line."""
    return [binary, f"--config={config_path(paths)}", f"--kubeconfig={paths.admin_kubeconfig}", "--zap-log-level=info"]


def health_url(sandbox_ports: Ports) -> str:
    return f"http://{HOST}:{ports(sandbox_ports)[1]}/readyz"


def url_webhooks(documents: list[dict[str, Any]], webhook_port: int, ca_pem: bytes) -> list[dict[str, Any]]:
    """Webhook configurations with each ``clientConfig.service`` turned into a loopback URL and the CA bundle."""
    bundle = base64.b64encode(ca_pem).decode()
    out = copy.deepcopy(documents)
    for doc in out:
        for hook in doc["webhooks"]:
            service = hook["clientConfig"]["service"]
            hook["clientConfig"] = {"url": f"https://{HOST}:{webhook_port}{service['path']}", "caBundle": bundle}
    return out
