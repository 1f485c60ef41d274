"""The sandbox's PKI and kubeconfigs, made with openssl like a hand-built cluster's.

One CA signs: the API server's serving certificate (SANs 127.0.0.1, localhost and the
kubernetes.default names), one serving certificate shared by the controller-manager,
scheduler and KWOK, and client certificates whose subjects match the bootstrap RBAC
bindings (admin in ``system:masters``, ``system:kube-controller-manager``,
``system:kube-scheduler``). A separate RSA pair signs service-account tokens. Every file
is made only if missing (written to a temporary name first), so a second ``up`` keeps
the identities of the first and running clients stay valid.
"""

from __future__ import annotations

import base64
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import yaml

from kneepoint.sandbox.layout import HOST, StatePaths

CLUSTER_NAME = "kneepoint-sandbox"
DAYS = 3650


class PkiError(RuntimeError):
    """openssl is missing or failed."""


@dataclass(frozen=True)
class ClientIdentity:
    """A client certificate subject and the kubeconfig it goes into."""

    name: str
    common_name: str
    organization: str | None


CLIENTS = (
    ClientIdentity("admin", "kneepoint-admin", "system:masters"),
    ClientIdentity("controller-manager", "system:kube-controller-manager", None),
    ClientIdentity("scheduler", "system:kube-scheduler", None),
)

APISERVER_SANS = (
    f"IP:{HOST}",
    "IP:10.96.0.1",  # the kubernetes Service's ClusterIP: in-cluster clients verify it; never dialled here
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
)
SERVING_SANS = (f"IP:{HOST}", "DNS:localhost")


def _openssl(args: list[str], cwd: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise PkiError("openssl not found on PATH (Debian: apt-get install openssl)")
    proc = subprocess.run([openssl, *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise PkiError(f"openssl {' '.join(args[:2])} failed: {proc.stderr.strip()[-400:]}")


def _publish(tmp: Path, final: Path) -> None:
    os.chmod(tmp, 0o600 if final.suffix == ".key" else 0o644)
    os.replace(tmp, final)


def ensure_ca(pki: Path) -> None:
    """Self-signed CA ``ca.crt``/``ca.key``."""
    if (pki / "ca.crt").exists() and (pki / "ca.key").exists():
        return
    _openssl(
        [
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=kneepoint-sandbox-ca",
            "-keyout",
            "ca.key.tmp",
            "-out",
            "ca.crt.tmp",
            "-days",
            str(DAYS),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
        pki,
    )
    _publish(pki / "ca.key.tmp", pki / "ca.key")
    _publish(pki / "ca.crt.tmp", pki / "ca.crt")


def ensure_cert(pki: Path, name: str, subject: str, usage: str, sans: tuple[str, ...] = ()) -> None:
    """``<name>.crt``/``<name>.key`` signed by the CA; usage is serverAuth or clientAuth."""
    if (pki / f"{name}.crt").exists() and (pki / f"{name}.key").exists():
        return
    ext = [
        "basicConstraints=CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={usage}",
    ]
    if sans:
        ext.append("subjectAltName=" + ",".join(sans))
    (pki / f"{name}.ext").write_text("\n".join(ext) + "\n")
    _openssl(["req", "-new", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", f"{name}.key.tmp", "-out", f"{name}.csr"], pki)
    _openssl(
        [
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            str(DAYS),
            "-sha256",
            "-extfile",
            f"{name}.ext",
            "-out",
            f"{name}.crt.tmp",
        ],
        pki,
    )
    (pki / f"{name}.csr").unlink(missing_ok=True)
    (pki / f"{name}.ext").unlink(missing_ok=True)
    _publish(pki / f"{name}.key.tmp", pki / f"{name}.key")
    _publish(pki / f"{name}.crt.tmp", pki / f"{name}.crt")


def ensure_service_account_keys(pki: Path) -> None:
    """RSA pair ``sa.key``/``sa.pub``: the API server signs tokens, the controller-manager too."""
    if (pki / "sa.key").exists() and (pki / "sa.pub").exists():
        return
    _openssl(["genrsa", "-out", "sa.key.tmp", "2048"], pki)
    _openssl(["rsa", "-in", "sa.key.tmp", "-pubout", "-out", "sa.pub.tmp"], pki)
    _publish(pki / "sa.pub.tmp", pki / "sa.pub")
    _publish(pki / "sa.key.tmp", pki / "sa.key")


def ensure_pki(paths: StatePaths) -> None:
    """Every key and certificate the sandbox's components use."""
    pki = paths.pki
    pki.mkdir(parents=True, exist_ok=True)
    ensure_ca(pki)
    ensure_cert(pki, "apiserver", "/CN=kube-apiserver", "serverAuth", APISERVER_SANS)
    ensure_cert(pki, "serving", "/CN=kneepoint-sandbox-serving", "serverAuth", SERVING_SANS)
    for client in CLIENTS:
        subject = f"/CN={client.common_name}" + (f"/O={client.organization}" if client.organization else "")
        ensure_cert(pki, client.name, subject, "clientAuth")
    ensure_service_account_keys(pki)


def kubeconfig_document(server: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, user: str) -> dict:
    """A kubeconfig with embedded credentials (what ``kubectl config --embed-certs`` writes)."""

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": CLUSTER_NAME, "cluster": {"server": server, "certificate-authority-data": b64(ca_pem)}}],
        "users": [{"name": user, "user": {"client-certificate-data": b64(cert_pem), "client-key-data": b64(key_pem)}}],
        "contexts": [{"name": CLUSTER_NAME, "context": {"cluster": CLUSTER_NAME, "user": user}}],
        "current-context": CLUSTER_NAME,
        "preferences": {},
    }


def write_kubeconfigs(paths: StatePaths, apiserver_port: int) -> None:
    """Kubeconfigs for admin (``<state>/kubeconfig``), controller-manager and scheduler.

    Rewritten on every ``up``: cheap, and it follows a changed API server port.
    """
    pki = paths.pki
    server = f"https://{HOST}:{apiserver_port}"
    ca = (pki / "ca.crt").read_bytes()
    for client in CLIENTS:
        doc = kubeconfig_document(
            server,
            ca,
            (pki / f"{client.name}.crt").read_bytes(),
            (pki / f"{client.name}.key").read_bytes(),
            client.name,
        )
        target = paths.kubeconfig(client.name)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
        os.chmod(tmp, 0o600)
        os.replace(tmp, target)
