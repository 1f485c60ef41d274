"""The sandbox's pod runner: processes for pods on simulated nodes.

``python -m kneepoint.sandbox.runner --kubeconfig <admin kubeconfig> --state-dir <dir>``

KWOK simulates the sandbox's GPU nodes, but pods need processes: engine pods (the vLLM
image) must serve the vLLM API and metrics, load-test Job pods must run the load
generator, the operator's own pod must run the operator. This process plays the kubelet
for every pod bound to a KWOK-managed node (annotation ``kwok.x-k8s.io/node: fake``) that
is not labelled ``kneepoint.io/sandbox-pretend: "true"`` (KWOK's stages handle those): it
lists and watches pods, nodes and Services, and hands each such pod to a
:class:`~kneepoint.sandbox.runner.pods.PodSupervisor`.

On start it kills processes a previous runner left behind and adopts the pods the API
shows it was running (same address; containers whose process is gone count as exited
with ``ContainerStatusUnknown`` and restart by the pod's policy). On SIGTERM/SIGINT it
stops every child (SIGTERM, then SIGKILL after at most ``--shutdown-grace-seconds``) and
leaves the pods' status as it was. See ``docs/sandbox-runner.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
import click

from kneepoint.sandbox.pretend import PRETEND_LABEL
from kneepoint.sandbox.processes import MARKER_ENV
from kneepoint.sandbox.runner.ipam import DEFAULT_POD_CIDR, LoopbackPool
from kneepoint.sandbox.runner.kube import KubeGateway, WatchFeed
from kneepoint.sandbox.runner.pods import PodSupervisor, RunnerSettings
from kneepoint.sandbox.runner.processes import reap_leftovers
from kneepoint.sandbox.runner.resolve import DEFAULT_CLUSTER_DOMAIN, ResolveMap, build_resolve_map

log = logging.getLogger("kneepoint.sandbox.runner")

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KINDS = ("nodes", "services", "pods")


def is_kwok_node(node: Mapping[str, Any] | None) -> bool:
    """Whether KWOK manages ``node`` (the sandbox's selector: annotation ``kwok.x-k8s.io/node=fake``)."""
    annotations = ((node or {}).get("metadata") or {}).get("annotations") or {}
    return annotations.get(KWOK_NODE_ANNOTATION) == "fake"


def is_pretend(pod: Mapping[str, Any]) -> bool:
    """Whether KWOK's own stages run ``pod`` (label ``kneepoint.io/sandbox-pretend: "true"``)."""
    return ((pod.get("metadata") or {}).get("labels") or {}).get(PRETEND_LABEL) == "true"


def is_terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


class Runner:
    """Watches the API and keeps one :class:`PodSupervisor` per pod it owns."""

    def __init__(
        self, gateway: KubeGateway, settings: RunnerSettings, pool: LoopbackPool, cluster_domain: str = DEFAULT_CLUSTER_DOMAIN
    ) -> None:
        self.gateway = gateway
        self.settings = settings
        self.pool = pool
        self.cluster_domain = cluster_domain
        self.session: aiohttp.ClientSession
        self.nodes: dict[str, dict[str, Any]] = {}
        self.services: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.supervisors: dict[str, PodSupervisor] = {}
        self.synced: set[str] = set()
        self._queue: asyncio.Queue[tuple[str, str, dict[str, Any]]] = asyncio.Queue()
        self._deleting: set[str] = set()

    # --- RunnerServices -----------------------------------------------------------------

    def node(self, name: str) -> Mapping[str, Any] | None:
        return self.nodes.get(name)

    def resolve_map(self, namespace: str) -> ResolveMap:
        # The range's network address is never a pod's: connections there are refused.
        refuse = str(self.pool.network.network_address)
        return build_resolve_map(namespace, self.services.values(), self.pods.values(), self.cluster_domain, refuse)

    # --- main loop ------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, shutdown_grace_seconds: float = 10.0) -> None:
        """Run until ``stop`` is set; then stop every child process."""
        killed = await asyncio.to_thread(reap_leftovers, self.settings.pids_dir)
        if killed:
            log.info("Killed leftover processes of a previous runner pids=%s", killed)
        loop = asyncio.get_running_loop()

        def sink(kind: str, event: str, obj: dict[str, Any]) -> None:
            loop.call_soon_threadsafe(self._queue.put_nowait, (kind, event, obj))

        self.session = aiohttp.ClientSession()
        feed = WatchFeed(self.gateway, KINDS, sink)
        feed.start()
        log.info("Runner started pod-cidr=%s state-dir=%s server=%s", self.pool.network, self.settings.state_dir, self.gateway.server)
        stopper = asyncio.create_task(stop.wait())
        try:
            while not stop.is_set():
                getter = asyncio.create_task(self._queue.get())
                done, _ = await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    break
                self.handle(*getter.result())
        finally:
            feed.stop()
            stopper.cancel()
            log.info("Runner stopping: ending %d pods' processes", len(self.supervisors))
            await asyncio.gather(*(s.shutdown(shutdown_grace_seconds) for s in self.supervisors.values()), return_exceptions=True)
            await self.session.close()
            log.info("Runner stopped")

    def handle(self, kind: str, event: str, obj: dict[str, Any]) -> None:
        """Apply one watch event to the caches, then act on the pods it concerns."""
        if kind == "nodes":
            self._apply(self.nodes, event, obj, lambda o: o["metadata"]["name"])
            changed = list(self.pods.values())  # a node appearing may make its pods ours
        elif kind == "services":
            self._apply(self.services, event, obj, lambda o: (o["metadata"]["namespace"], o["metadata"]["name"]))
            changed = []
        else:
            if event == "SYNCED":
                fresh = {p["metadata"]["uid"] for p in obj["items"]}
                for uid in [u for u in self.pods if u not in fresh]:
                    self._pod_removed(uid)
            elif event == "DELETED":
                self._pod_removed(obj["metadata"]["uid"])
            if event == "SYNCED" and "pods" not in self.synced:
                for item in obj["items"]:
                    self.pool.skip_past(str((item.get("status") or {}).get("podIP") or ""))
            self._apply(self.pods, event, obj, lambda o: o["metadata"]["uid"])
            changed = obj["items"] if event == "SYNCED" else ([obj] if event != "DELETED" else [])
        if event == "SYNCED" and kind not in self.synced:
            self.synced.add(kind)
            if self.synced.issuperset(KINDS):
                changed = list(self.pods.values())  # everything is known now: act on all pods
        if self.synced.issuperset(KINDS):
            for pod in changed:
                self._reconcile(pod)

    @staticmethod
    def _apply(table: dict[Any, dict[str, Any]], event: str, obj: dict[str, Any], key: Any) -> None:
        if event == "SYNCED":
            table.clear()
            for item in obj["items"]:
                table[key(item)] = item
        elif event == "DELETED":
            table.pop(key(obj), None)
        else:
            table[key(obj)] = obj

    def owns(self, pod: Mapping[str, Any]) -> bool:
        """Whether this runner runs ``pod``: bound to a KWOK node and not left to KWOK."""
        node_name = (pod.get("spec") or {}).get("nodeName")
        return bool(node_name) and is_kwok_node(self.nodes.get(str(node_name))) and not is_pretend(pod)

    def _reconcile(self, pod: dict[str, Any]) -> None:
        uid = pod["metadata"]["uid"]
        supervisor = self.supervisors.get(uid)
        if supervisor is not None:
            supervisor.update(pod)
            return
        if not self.owns(pod):
            return
        if is_terminal(pod):
            # Finished before this runner started: nothing to run; finish a deletion if asked.
            if pod["metadata"].get("deletionTimestamp") and uid not in self._deleting:
                self._deleting.add(uid)
                meta = pod["metadata"]
                asyncio.get_running_loop().run_in_executor(None, self.gateway.delete_pod_now, meta["namespace"], meta["name"], uid)
            return
        supervisor = PodSupervisor(self, pod)
        self.supervisors[uid] = supervisor
        supervisor.start()

    def _pod_removed(self, uid: str) -> None:
        self._deleting.discard(uid)
        supervisor = self.supervisors.pop(uid, None)
        if supervisor is not None:
            supervisor.vanished()


def _install_signal_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


async def _main(kubeconfig: Path, settings: RunnerSettings, pod_cidr: str, cluster_domain: str, shutdown_grace: float) -> None:
    stop = asyncio.Event()
    _install_signal_handlers(stop)
    gateway = KubeGateway(kubeconfig)
    runner = Runner(gateway, settings, LoopbackPool(pod_cidr), cluster_domain)
    await runner.run(stop, shutdown_grace)


@click.command()
@click.option(
    "--kubeconfig",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Kubeconfig the runner acts with (the sandbox's admin one).",
)
@click.option(
    "--state-dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Sandbox state dir; container logs go to <state-dir>/pods/.",
)
@click.option(
    "--pod-cidr",
    default=DEFAULT_POD_CIDR,
    show_default=True,
    envvar="KNEEPOINT_SANDBOX_POD_CIDR",
    help="Loopback range for pod addresses (inside 127.0.0.0/8, apart from KWOK's --cidr); "
    "env KNEEPOINT_SANDBOX_POD_CIDR. Two sandboxes side by side need two ranges.",
)
@click.option("--host-ip", default="127.0.0.1", show_default=True, help="status.hostIP of every pod (the nodes' address).")
@click.option(
    "--cluster-domain", default=DEFAULT_CLUSTER_DOMAIN, show_default=True, help="DNS suffix of Service names in KNEEPOINT_RESOLVE."
)
@click.option(
    "--crash-backoff-seconds",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="First CrashLoopBackOff delay; doubles per crash.",
)
@click.option(
    "--crash-backoff-max-seconds", default=300.0, show_default=True, type=click.FloatRange(min=0), help="Largest CrashLoopBackOff delay."
)
@click.option(
    "--shutdown-grace-seconds",
    default=10.0,
    show_default=True,
    type=click.FloatRange(min=0),
    help="On SIGTERM, how long children get before SIGKILL.",
)
@click.option("--log-level", default="info", show_default=True, type=click.Choice(["debug", "info", "warning", "error"]))
def command(
    kubeconfig: Path,
    state_dir: Path,
    pod_cidr: str,
    host_ip: str,
    cluster_domain: str,
    crash_backoff_seconds: float,
    crash_backoff_max_seconds: float,
    shutdown_grace_seconds: float,
    log_level: str,
) -> None:
    """Run processes for the pods of the sandbox's simulated nodes (the sandbox's kubelet)."""
    try:
        LoopbackPool(pod_cidr)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    if not host_ip.startswith("127."):
        raise click.UsageError(f"--host-ip {host_ip!r}: must be a loopback address (127.x.y.z)")
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    settings = RunnerSettings(
        state_dir=state_dir.resolve(),
        python=sys.executable,
        host_ip=host_ip,
        crash_backoff_seconds=crash_backoff_seconds,
        crash_backoff_max_seconds=crash_backoff_max_seconds,
        inherited_env={MARKER_ENV: os.environ[MARKER_ENV]} if os.environ.get(MARKER_ENV) else {},
    )
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(kubeconfig, settings, pod_cidr, cluster_domain, shutdown_grace_seconds))


def main() -> None:
    """``python -m kneepoint.sandbox.runner``."""
    command(prog_name="python -m kneepoint.sandbox.runner")


if __name__ == "__main__":
    main()
