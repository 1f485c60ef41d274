"""Where the sandbox keeps things and which loopback ports it listens on.

Pure: paths are computed from the environment mapping passed in (``os.environ`` by the
callers), never read from disk here.

- cache root: ``$KNEEPOINT_CACHE_DIR``, else ``$XDG_CACHE_HOME/kneepoint``, else
  ``~/.cache/kneepoint``; binaries in ``bin/<name>-<version>/``, build dirs in
  ``build/<name>-<version>/``.
- state dir: ``$KNEEPOINT_SANDBOX_DIR``, else ``<cache root>/sandbox/state``: PKI,
  kubeconfigs, etcd data, configs, pid files and logs of one sandbox.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path

HOST = "127.0.0.1"


def cache_root(env: Mapping[str, str]) -> Path:
    """The cache directory that holds built binaries, build dirs and the default state dir."""
    if env.get("KNEEPOINT_CACHE_DIR"):
        return Path(env["KNEEPOINT_CACHE_DIR"]).expanduser()
    base = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    return Path(base).expanduser() / "kneepoint"


def default_state_dir(env: Mapping[str, str]) -> Path:
    """The state directory of the sandbox that ``kneepoint sandbox`` manages by default."""
    if env.get("KNEEPOINT_SANDBOX_DIR"):
        return Path(env["KNEEPOINT_SANDBOX_DIR"]).expanduser()
    return cache_root(env) / "sandbox" / "state"


@dataclass(frozen=True)
class Ports:
    """Loopback ports of one sandbox. Defaults follow each component's usual port."""

    etcd_client: int = 2379
    etcd_peer: int = 2380
    apiserver: int = 6443
    controller_manager: int = 10257
    scheduler: int = 10259
    kwok: int = 10247
    prometheus: int = 9090

    def shifted(self, offset: int) -> Ports:
        """All ports moved by ``offset`` (a second sandbox beside the default one)."""
        moved = {f.name: getattr(self, f.name) + offset for f in fields(self)}
        for name, port in moved.items():
            if not 1024 <= port <= 65535:
                raise ValueError(f"--port-offset {offset}: port {name}={port} is outside 1024-65535")
        return Ports(**moved)

    def as_dict(self) -> dict[str, int]:
        """Name -> port, for the state file and messages."""
        return asdict(self)


@dataclass(frozen=True)
class StatePaths:
    """Files inside one sandbox's state directory."""

    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def etcd_data(self) -> Path:
        return self.root / "etcd-data"

    @property
    def prometheus_data(self) -> Path:
        return self.root / "prometheus-data"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def pids(self) -> Path:
        return self.root / "pids"

    @property
    def admin_kubeconfig(self) -> Path:
        """The kubeconfig users point kubectl at (identity admin, group system:masters)."""
        return self.root / "kubeconfig"

    def kubeconfig(self, identity: str) -> Path:
        """Kubeconfig of one identity: admin, controller-manager, scheduler."""
        if identity == "admin":
            return self.admin_kubeconfig
        return self.root / f"{identity}.kubeconfig"

    @property
    def kwok_config(self) -> Path:
        return self.root / "kwok.yaml"

    @property
    def prometheus_config(self) -> Path:
        return self.root / "prometheus.yml"

    @property
    def sandbox_file(self) -> Path:
        """JSON record of the ports and binaries this sandbox was started with."""
        return self.root / "sandbox.json"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"

    def pid(self, component: str) -> Path:
        return self.pids / f"{component}.json"
