"""One pod's life under the sandbox's pod runner: the part of a kubelet the sandbox needs.

Adapter (asyncio). A :class:`PodSupervisor` owns one pod on a simulated node: it takes a
loopback address, runs init containers in order and then the containers side by side,
probes readiness, restarts by the pod's ``restartPolicy`` with the kubelet's back-off,
writes ``pods/status`` whenever what it observed changes, and on deletion stops the
processes (SIGTERM, grace period, SIGKILL) and finishes the deletion.

What each container gets is decided by :mod:`plans` (pure); the status it writes is
built by :mod:`podstatus` (pure). What it needs from the rest of the runner (API
calls, the address pool, Service map, nodes) comes through :class:`RunnerServices`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import aiohttp

from kneepoint.core.timestamps import now_rfc3339
from kneepoint.sandbox.runner.ipam import LoopbackPool
from kneepoint.sandbox.runner.kube import KubeGateway
from kneepoint.sandbox.runner.plans import (
    PRETEND,
    ContainerCommandError,
    ContainerConfigError,
    ContainerPlan,
    EnvSources,
    build_pod_kubeconfig,
    classify_container,
    emptydir_volumes,
    plan_container,
    probe_spec,
    referenced_objects,
    service_account_token_source,
)
from kneepoint.sandbox.runner.podstatus import (
    RUNNING,
    TERMINATED,
    ContainerRecord,
    PodObservation,
    build_status_patch,
    container_status,
    pod_logs_object,
    pod_phase,
    termination_message,
    termination_reason,
)
from kneepoint.sandbox.runner.probes import probe_once
from kneepoint.sandbox.runner.processes import ContainerProcess, log_file_name
from kneepoint.sandbox.runner.resolve import ENV_VAR as RESOLVE_ENV
from kneepoint.sandbox.runner.resolve import ResolveMap

log = logging.getLogger(__name__)

LOST_REASON = "ContainerStatusUnknown"
LOST_MESSAGE = "The sandbox runner restarted and the container's process was gone"
# The kubelet resets a container's back-off after it ran this long without failing.
BACKOFF_RESET_SECONDS = 600.0
DEFAULT_TOKEN_SECONDS = 3607
# The file in-cluster configuration reads; present when the runner's host is a pod itself.
HOST_SERVICE_ACCOUNT_TOKEN = Path("/var/run/secrets/kubernetes.io/serviceaccount/token")


@dataclass(frozen=True)
class RunnerSettings:
    """Knobs of the runner; every default follows the kubelet unless said otherwise."""

    state_dir: Path
    python: str
    host_ip: str = "127.0.0.1"
    crash_backoff_seconds: float = 10.0
    """First CrashLoopBackOff delay (the kubelet's 10 s); doubles per crash."""
    crash_backoff_max_seconds: float = 300.0
    """Cap of the back-off (the kubelet's 5 min)."""
    status_debounce_seconds: float = 0.05
    """Changes within this window go out as one status patch."""
    inherited_env: Mapping[str, str] = field(default_factory=dict)
    """Passed to every child as is: the sandbox's process marker (``KNEEPOINT_SANDBOX_ID``),
    by which ``kneepoint sandbox down`` finds descendants that left their process group."""

    @property
    def runtime_dir(self) -> Path:
        """Per-pod working files (termination messages, tokens, kubeconfigs, cwd)."""
        return self.state_dir / "runner" / "pods"

    @property
    def pids_dir(self) -> Path:
        return self.state_dir / "runner" / "pids"

    @property
    def logs_dir(self) -> Path:
        """Container logs: ``<namespace>_<pod>_<container>.log``."""
        return self.state_dir / "pods"


class RunnerServices(Protocol):
    """What a pod supervisor needs from the runner."""

    settings: RunnerSettings
    gateway: KubeGateway
    pool: LoopbackPool
    session: aiohttp.ClientSession

    def node(self, name: str) -> Mapping[str, Any] | None: ...

    def resolve_map(self, namespace: str) -> ResolveMap: ...


def _now() -> str:
    return now_rfc3339()


def _version(pod: Mapping[str, Any]) -> int:
    # resourceVersions are etcd revisions; the API calls them opaque, so fall back to "newer".
    try:
        return int((pod.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 1 << 62


def _restart_policy(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("restartPolicy") or "Always")


class PodSupervisor:
    """Runs one pod; see the module doc. Feed it every new version of the pod with ``update``."""

    def __init__(self, services: RunnerServices, pod: dict[str, Any]) -> None:
        self.services = services
        self.settings = services.settings
        self.pod = pod
        metadata = pod["metadata"]
        self.uid: str = metadata["uid"]
        self.namespace: str = metadata["namespace"]
        self.name: str = metadata["name"]
        spec = pod.get("spec") or {}
        self.init_specs: list[dict[str, Any]] = list(spec.get("initContainers") or [])
        self.specs: list[dict[str, Any]] = list(spec.get("containers") or [])
        self.init_records = [ContainerRecord(c["name"], str(c.get("image") or "")) for c in self.init_specs]
        self.records = [ContainerRecord(c["name"], str(c.get("image") or "")) for c in self.specs]
        self.pod_ip = ""
        self.start_time = ""
        self.initialized = not self.init_specs
        self.init_failed = False
        self.processes: dict[str, ContainerProcess] = {}
        self.deleting = asyncio.Event()
        self.gone = False  # the API object no longer exists
        self.shutting_down = False  # the runner is stopping: no restarts, no API writes
        self.finished = asyncio.Event()
        self._dirty = asyncio.Event()
        self._last_signature = ""
        self._tasks: list[asyncio.Task[Any]] = []
        self._main: asyncio.Task[None] | None = None
        self._token_expiry = 0.0
        self.runtime_dir = self.settings.runtime_dir / self.uid
        self._log_files: dict[str, tuple[str, str | None]] = {}

    # --- entry points --------------------------------------------------------------------

    def start(self) -> None:
        """Begin running the pod (a task on the current loop)."""
        self._main = asyncio.create_task(self._run(), name=f"pod-{self.namespace}/{self.name}")

    def update(self, pod: dict[str, Any]) -> None:
        """A newer version of the pod from the API (watch or patch answer)."""
        if _version(pod) >= _version(self.pod):
            self.pod = pod
        if pod["metadata"].get("deletionTimestamp") and not self.deleting.is_set():
            log.info("Pod deletion requested pod=%s/%s", self.namespace, self.name)
            self.deleting.set()

    def vanished(self) -> None:
        """The pod was removed from the API (KWOK's pod-delete, or a forced deletion)."""
        self.gone = True
        self.deleting.set()

    async def shutdown(self, grace_cap_seconds: float) -> None:
        """Runner shutdown: stop this pod's processes (the API object is left as it is)."""
        self.shutting_down = True
        self.gone = True  # no status writes or deletions from here on
        await self._stop_processes(min(self._grace_seconds(), grace_cap_seconds))
        for task in [*self._tasks, *([self._main] if self._main else [])]:
            task.cancel()
        await asyncio.gather(*self._tasks, *([self._main] if self._main else []), return_exceptions=True)

    # --- lifecycle -------------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            self._adopt_or_allocate()
            self._tasks.append(asyncio.create_task(self._status_writer(), name=f"status-{self.name}"))
            self._mark_dirty()
            runner = asyncio.create_task(self._run_containers(), name=f"containers-{self.name}")
            deleting = asyncio.create_task(self.deleting.wait())
            await asyncio.wait({runner, deleting}, return_when=asyncio.FIRST_COMPLETED)
            if self.deleting.is_set():
                await self._terminate()
                runner.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await runner
            else:
                deleting.cancel()
                # Terminal pod: the kubelet frees the address; the status keeps naming it.
                self.services.pool.release(self.uid)
                await self.deleting.wait()
                await self._terminate()
        except asyncio.CancelledError:
            raise
        except Exception:  # one pod's failure must not stop the runner
            log.exception("Pod supervisor failed pod=%s/%s", self.namespace, self.name)
        finally:
            self.finished.set()

    def _adopt_or_allocate(self) -> None:
        """Take the pod's address: the one its status already names (runner restart), else a new one."""
        status = self.pod.get("status") or {}
        pool = self.services.pool
        previous_ip = str(status.get("podIP") or "")
        if (self.pod.get("spec") or {}).get("hostNetwork"):
            # A host-network pod shares the node's address, as in a cluster.
            adopted = previous_ip == self.settings.host_ip and bool(status.get("containerStatuses"))
            self.pod_ip = self.settings.host_ip
        else:
            adopted = bool(previous_ip) and previous_ip in pool and pool.reserve(self.uid, previous_ip)
            self.pod_ip = previous_ip if adopted else pool.allocate(self.uid)
        self.start_time = str(status.get("startTime") or _now()) if adopted else _now()
        if not adopted:
            return
        log.info("Adopted pod pod=%s/%s ip=%s", self.namespace, self.name, self.pod_ip)
        now = _now()
        for records, specs, key in (
            (self.init_records, self.init_specs, "initContainerStatuses"),
            (self.records, self.specs, "containerStatuses"),
        ):
            previous = {s.get("name"): s for s in status.get(key) or []}
            for record, spec in zip(records, specs):
                seen = previous.get(record.name)
                if not seen:
                    continue
                record.restart_count = int(seen.get("restartCount") or 0)
                last = (seen.get("lastState") or {}).get("terminated")
                record.last_terminated = dict(last) if last else None
                state = seen.get("state") or {}
                if "terminated" in state:
                    done = state["terminated"]
                    record.state, record.exit_code = TERMINATED, int(done.get("exitCode") or 0)
                    record.reason, record.message = str(done.get("reason") or ""), str(done.get("message") or "")
                    record.started_at, record.finished_at = done.get("startedAt"), done.get("finishedAt")
                    record.container_id = str(done.get("containerID") or "")
                elif "running" in state and classify_container(spec) != PRETEND:
                    # Its process died with the previous runner.
                    record.started_at = (state["running"] or {}).get("startedAt")
                    record.container_id = str(seen.get("containerID") or "")
                    record.terminate(now, 137, LOST_REASON, LOST_MESSAGE)
        if self.init_specs and all(r.state == TERMINATED and r.exit_code == 0 for r in self.init_records):
            self.initialized = True

    async def _run_containers(self) -> None:
        for spec, record in zip(self.init_specs, self.init_records):
            if record.state == TERMINATED and record.exit_code == 0:
                continue
            exit_code = await self._run_container(spec, record, init=True)
            if exit_code != 0:
                self.init_failed = True
                self._mark_dirty()
                return
        self.initialized = True
        self._mark_dirty()
        await asyncio.gather(*(self._run_container(spec, record, init=False) for spec, record in zip(self.specs, self.records)))
        self._mark_dirty()

    def _should_restart(self, policy: str, exit_code: int, init: bool) -> bool:
        if init:
            return exit_code != 0 and policy != "Never"
        return policy == "Always" or (policy == "OnFailure" and exit_code != 0)

    async def _run_container(self, spec: dict[str, Any], record: ContainerRecord, *, init: bool) -> int:
        """Run one container until it is done for good; its last exit code."""
        policy = _restart_policy(self.pod)
        failures = 0
        if record.state == TERMINATED:
            # Adopted after a runner restart: the lost run counts like any exit.
            if not self._should_restart(policy, record.exit_code or 0, init):
                return record.exit_code or 0
            record.begin_restart()
        while not self.deleting.is_set() and not self.shutting_down:
            try:
                plan = await self._plan(spec)
            except (ContainerConfigError, ContainerCommandError) as exc:
                reason = "CreateContainerConfigError" if isinstance(exc, ContainerConfigError) else "CreateContainerError"
                if (record.state, record.reason, record.message) != ("waiting", reason, str(exc)):
                    log.info(
                        "Container not started pod=%s/%s container=%s reason=%s message=%s",
                        self.namespace,
                        self.name,
                        record.name,
                        reason,
                        exc,
                    )
                record.wait(reason, str(exc))
                self._mark_dirty()
                await self._sleep_unless_deleting(self._backoff(failures))
                failures += 1
                continue
            started = time.monotonic()
            exit_code = await self._run_once(spec, record, plan, init=init)
            if exit_code is None or self.deleting.is_set() or self.shutting_down:
                return record.exit_code or 0
            if not self._should_restart(policy, exit_code, init):
                return exit_code
            if time.monotonic() - started > BACKOFF_RESET_SECONDS:
                failures = 0
            delay = self._backoff(failures)
            failures += 1
            record.begin_restart()
            if delay > 0:
                record.wait(
                    "CrashLoopBackOff",
                    f"back-off {delay:g}s restarting failed container={record.name} pod={self.name}_{self.namespace}({self.uid})",
                )
                self._mark_dirty()
                await self._sleep_unless_deleting(delay)
        return record.exit_code or 0

    def _backoff(self, failures: int) -> float:
        """0 for the first restart, then base, 2 x base, ... capped, as the kubelet."""
        if failures == 0:
            return 0.0
        return min(self.settings.crash_backoff_seconds * 2 ** (failures - 1), self.settings.crash_backoff_max_seconds)

    async def _sleep_unless_deleting(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.deleting.wait(), timeout=seconds)

    async def _run_once(self, spec: dict[str, Any], record: ContainerRecord, plan: ContainerPlan, *, init: bool) -> int | None:
        """One run of a container; its exit code, None when it ends because the pod is deleted."""
        if plan.kind == PRETEND:
            record.run(_now(), f"sandbox://pretend/{self.uid}/{record.name}")
            record.ready = True
            self._mark_dirty()
            if init or _restart_policy(self.pod) != "Always":
                # As KWOK's pod-complete stage: nothing to run, so done at once.
                record.terminate(_now(), 0, "Completed", "")
                self._mark_dirty()
                return 0
            await self.deleting.wait()
            return None
        container_dir = self.runtime_dir / record.name
        message_path = Path(plan.env["TERMINATION_MESSAGE_PATH"])
        with contextlib.suppress(FileNotFoundError):
            message_path.unlink()
        run = record.restart_count
        cri_path = self._run_log(record.name, run)
        previous = self._run_log(record.name, run - 1) if run > 0 else None
        with contextlib.suppress(OSError):
            self._run_log(record.name, run - 2).unlink()  # the kubelet keeps the current and the previous run
        process = ContainerProcess(
            plan.argv,
            plan.env,
            cwd=container_dir,
            log_path=self.settings.logs_dir / log_file_name(self.namespace, self.name, record.name),
            pid_path=self.settings.pids_dir / f"{self.uid}_{record.name}.json",
            cri_path=cri_path,
        )
        try:
            pid = await process.start(
                f"pod={self.namespace}/{self.name} container={record.name} restart={record.restart_count} argv={' '.join(plan.argv[:4])}"
            )
        except OSError as exc:
            record.terminate(_now(), 128, "StartError", f"failed to start: {exc}")
            self._mark_dirty()
            return 128
        self.processes[record.name] = process
        await self._publish_logs(record.name, cri_path, previous if previous and previous.exists() else None)
        log.info(
            "Started container pod=%s/%s container=%s kind=%s pid=%s ip=%s",
            self.namespace,
            self.name,
            record.name,
            plan.kind,
            pid,
            self.pod_ip,
        )
        record.run(_now(), f"sandbox://{pid}")
        probes = None if init else asyncio.create_task(self._probe(spec, record, process))
        if init:
            record.started = True
        self._mark_dirty()
        try:
            exit_code = await process.wait()
        finally:
            if probes is not None:
                probes.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await probes
            self.processes.pop(record.name, None)
        if not self.deleting.is_set() and self._should_restart(_restart_policy(self.pod), exit_code, init):
            # Waiting to restart, the kubelet serves this run both as the current and as the previous log.
            await self._publish_logs(record.name, cri_path, cri_path)
        try:
            file_bytes = message_path.read_bytes()[:4096]
        except OSError:
            file_bytes = b""
        tail = process.output_tail()
        policy = str(spec.get("terminationMessagePolicy") or "File")
        reason = termination_reason(exit_code, tail)
        record.terminate(_now(), exit_code, reason, termination_message(file_bytes, tail, policy, exit_code))
        log.info("Container exited pod=%s/%s container=%s exitCode=%s reason=%s", self.namespace, self.name, record.name, exit_code, reason)
        self._mark_dirty()
        return exit_code

    def _run_log(self, container: str, run: int) -> Path:
        """The CRI-format log of one run of a container (the kubelet's /var/log/pods/.../<container>/<run>.log)."""
        return self.runtime_dir / "logs" / container / f"{run}.log"

    async def _publish_logs(self, container: str, current: Path, previous: Path | None) -> None:
        """Point KWOK's Logs object of this pod at the container's current and previous run (``kubectl logs``)."""
        self._log_files[container] = (str(current), str(previous) if previous else None)
        if self.gone or self.shutting_down:
            return
        body = pod_logs_object(self.namespace, self.name, self.uid, self._log_files)
        try:
            if not await asyncio.to_thread(self.services.gateway.put_pod_logs, body):
                log.debug("No Logs object for pod=%s/%s (pod gone, or KWOK's Logs CRD not installed)", self.namespace, self.name)
        except Exception as exc:  # noqa: BLE001 - a log that cannot be served must not stop the pod
            log.warning("Could not publish logs pod=%s/%s container=%s: %s", self.namespace, self.name, container, exc)

    async def _probe(self, spec: dict[str, Any], record: ContainerRecord, process: ContainerProcess) -> None:
        """Startup probe (failing it kills the container), then readiness, every period."""
        session = self.services.session
        startup = probe_spec(spec, "startupProbe", self.pod_ip)
        if startup is not None:
            record.started = False
            self._mark_dirty()
            await asyncio.sleep(startup.initial_delay_seconds)
            failures = 0
            while True:
                if await probe_once(startup, session):
                    break
                failures += 1
                if failures >= startup.failure_threshold:
                    log.info("Startup probe failed; killing container pod=%s/%s container=%s", self.namespace, self.name, record.name)
                    await process.stop(self._grace_seconds())
                    return
                await asyncio.sleep(startup.period_seconds)
            record.started = True
            self._mark_dirty()
        readiness = probe_spec(spec, "readinessProbe", self.pod_ip)
        if readiness is None:
            record.ready = True
            self._mark_dirty()
            return
        await asyncio.sleep(readiness.initial_delay_seconds)
        successes = failures = 0
        while record.state == RUNNING:
            passed = await probe_once(readiness, session)
            successes, failures = (successes + 1, 0) if passed else (0, failures + 1)
            if passed and not record.ready and successes >= readiness.success_threshold:
                record.ready = True
                self._mark_dirty()
            elif not passed and record.ready and failures >= readiness.failure_threshold:
                record.ready = False
                self._mark_dirty()
            await asyncio.sleep(readiness.period_seconds)

    # --- what a container gets -------------------------------------------------------------

    async def _plan(self, spec: dict[str, Any]) -> ContainerPlan:
        gateway = self.services.gateway
        config_map_names, secret_names = referenced_objects(self.pod)
        config_maps = {n: await asyncio.to_thread(gateway.read_config_map, self.namespace, n) for n in sorted(config_map_names)}
        secrets = {n: await asyncio.to_thread(gateway.read_secret, self.namespace, n) for n in sorted(secret_names)}
        node = self.services.node(str((self.pod.get("spec") or {}).get("nodeName", ""))) or {}
        container_dir = self.runtime_dir / spec["name"]
        container_dir.mkdir(parents=True, exist_ok=True)
        server = urlsplit(gateway.server)
        resolve = self.services.resolve_map(self.namespace)
        for line in resolve.skipped:
            log.debug("Service port not resolvable pod=%s/%s %s", self.namespace, self.name, line)
        runtime_env = {"HOME": str(container_dir), RESOLVE_ENV: resolve.env_value()}
        if not HOST_SERVICE_ACCOUNT_TOKEN.exists():
            # On a host that is itself a pod, in-cluster config would pair these with the
            # host's own token and CA; without them clients fall back to KUBECONFIG.
            runtime_env.update(
                {
                    "KUBERNETES_SERVICE_HOST": server.hostname or "127.0.0.1",
                    "KUBERNETES_SERVICE_PORT": str(server.port or 443),
                    "KUBERNETES_SERVICE_PORT_HTTPS": str(server.port or 443),
                    "KUBERNETES_PORT": f"tcp://{server.hostname}:{server.port or 443}",
                }
            )
        forced_env = {**self.settings.inherited_env, "TERMINATION_MESSAGE_PATH": str(self.runtime_dir / f"{spec['name']}.termination-log")}
        # A pretend container runs nothing, so it needs no credentials.
        kubeconfig = None if classify_container(spec) == PRETEND else await self._service_account_kubeconfig()
        if kubeconfig is not None:
            forced_env["KUBECONFIG"] = str(kubeconfig)
        volume_dirs = {}
        for volume in emptydir_volumes(self.pod):
            directory = self.runtime_dir / "volumes" / volume
            directory.mkdir(parents=True, exist_ok=True)
            volume_dirs[volume] = str(directory)
        return plan_container(
            self.pod,
            spec,
            python=self.settings.python,
            pod_ip=self.pod_ip,
            host_ip=self.settings.host_ip,
            node=node,
            sources=EnvSources(config_maps=config_maps, secrets=secrets),
            runtime_env=runtime_env,
            forced_env=forced_env,
            volume_dirs=volume_dirs,
        )

    async def _service_account_kubeconfig(self) -> Path | None:
        """The pod's kubeconfig with a fresh bound token; None when the pod mounts no token."""
        source = service_account_token_source(self.pod)
        if source is None:
            return None
        kubeconfig = self.runtime_dir / "kubeconfig"
        if time.time() < self._token_expiry - 60 and kubeconfig.exists():
            return kubeconfig
        await self._refresh_token(source)
        gateway = self.services.gateway
        kubeconfig.write_text(build_pod_kubeconfig(gateway.server, gateway.ca_data, str(self.runtime_dir / "token"), self.namespace))
        if not any(t.get_name() == f"token-{self.name}" for t in self._tasks):
            self._tasks.append(asyncio.create_task(self._keep_token_fresh(source), name=f"token-{self.name}"))
        return kubeconfig

    async def _refresh_token(self, source: Mapping[str, Any]) -> None:
        spec = self.pod.get("spec") or {}
        expiration = int(source.get("expirationSeconds") or DEFAULT_TOKEN_SECONDS)
        token, expiry = await asyncio.to_thread(
            self.services.gateway.request_token,
            self.namespace,
            str(spec.get("serviceAccountName") or "default"),
            self.name,
            self.uid,
            expiration,
            source.get("audience") or None,
        )
        path = self.runtime_dir / "token"
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_suffix(".tmp"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(token)
        os.replace(path.with_suffix(".tmp"), path)
        self._token_expiry = expiry

    async def _keep_token_fresh(self, source: Mapping[str, Any]) -> None:
        """Rewrite the token at 80 % of its life, as the kubelet does for projected tokens."""
        while not self.deleting.is_set() and not self.shutting_down:
            lifetime = max(self._token_expiry - time.time(), 60.0)
            await self._sleep_unless_deleting(lifetime * 0.8)
            if self.deleting.is_set():
                return
            try:
                await self._refresh_token(source)
            except Exception as exc:  # noqa: BLE001 - retried; the old token is still valid a while
                log.warning("Token refresh failed pod=%s/%s error=%s", self.namespace, self.name, exc)
                await self._sleep_unless_deleting(10)

    # --- status ------------------------------------------------------------------------------

    def _mark_dirty(self) -> None:
        self._dirty.set()

    def observation(self) -> PodObservation:
        """What :func:`build_status_patch` needs, from the current records."""
        phase = pod_phase(_restart_policy(self.pod), self.init_failed, self.initialized, self.records)
        return PodObservation(
            pod_ip=self.pod_ip,
            host_ip=self.settings.host_ip,
            start_time=self.start_time,
            phase=phase,
            initialized=self.initialized,
            init_records=self.init_records,
            records=self.records,
        )

    def _signature(self, observed: PodObservation) -> str:
        return json.dumps(
            [
                observed.phase,
                observed.pod_ip,
                observed.initialized,
                [container_status(r) for r in (*observed.init_records, *observed.records)],
            ],
            sort_keys=True,
        )

    async def _status_writer(self) -> None:
        while True:
            await self._dirty.wait()
            await asyncio.sleep(self.settings.status_debounce_seconds)
            self._dirty.clear()
            if self.gone:
                continue
            observed = self.observation()
            signature = self._signature(observed)
            if signature == self._last_signature:
                continue
            body = build_status_patch(self.pod, observed, _now())
            try:
                patched = await asyncio.to_thread(self.services.gateway.patch_pod_status, self.namespace, self.name, body)
            except Exception as exc:  # noqa: BLE001 - retried on the next change or in a second
                log.warning(
                    "Status patch failed pod=%s/%s error=%s", self.namespace, self.name, str(exc).splitlines()[0] if str(exc) else exc
                )
                await asyncio.sleep(1.0)
                self._mark_dirty()
                continue
            if patched is None:
                self.vanished()
                continue
            self._last_signature = signature
            self.update(patched)
            log.debug("Patched status pod=%s/%s phase=%s", self.namespace, self.name, observed.phase)

    # --- termination -------------------------------------------------------------------------

    def _grace_seconds(self) -> float:
        metadata = self.pod.get("metadata") or {}
        grace = metadata.get("deletionGracePeriodSeconds")
        if grace is None:
            grace = (self.pod.get("spec") or {}).get("terminationGracePeriodSeconds")
        return float(30 if grace is None else grace)

    async def _stop_processes(self, grace: float) -> None:
        await asyncio.gather(*(p.stop(grace) for p in list(self.processes.values())), return_exceptions=True)

    async def _terminate(self) -> None:
        """Stop the processes, finish the deletion, free the address and the working files."""
        await self._stop_processes(self._grace_seconds())
        # Let the container tasks record their exits before the pod goes.
        await asyncio.sleep(0)
        if not self.gone:
            try:
                await asyncio.to_thread(self.services.gateway.delete_pod_now, self.namespace, self.name, self.uid)
                log.info("Deleted pod pod=%s/%s", self.namespace, self.name)
            except Exception as exc:  # noqa: BLE001 - KWOK's pod-delete or a retry finishes it
                log.warning("Deleting pod failed pod=%s/%s error=%s", self.namespace, self.name, exc)
        self.services.pool.release(self.uid)
        for task in self._tasks:
            task.cancel()
        shutil.rmtree(self.runtime_dir, ignore_errors=True)
