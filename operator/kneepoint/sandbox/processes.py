"""Detached component processes: start, identify, health-check and stop them.

Each component runs in its own session and process group (``start_new_session``), so it
outlives the ``kneepoint sandbox up`` that started it and can be stopped as a group. A
JSON pid file per component records pid, process group, start time and argv; a process
counts as ours only if its pid *and* start time match (pids get reused). The start time
that decides is the kernel's, in clock ticks since boot: psutil's wall-clock start time is
those ticks plus the boot time, which moves whenever the wall clock is stepped (a VM paused
and resumed, NTP), and a one-second step once made every live component look gone. Every started
process gets ``KNEEPOINT_SANDBOX_ID=<state dir>`` in its environment, inherited by what it
spawns, so ``down`` can find and end descendants that left their group (e.g. processes
the runner starts in their own sessions) and verify that none remains.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from kneepoint.sandbox.flags import Health
from kneepoint.sandbox.layout import HOST

MARKER_ENV = "KNEEPOINT_SANDBOX_ID"
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_RANGE = (32768, 60999)  # Linux's net.ipv4.ip_local_port_range default

# Popen objects of children started by this Python process, kept so they are reaped
# (no zombies, no ResourceWarning) when the fixture or the CLI stops them.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


class ProcessError(RuntimeError):
    """A component did not start, did not become healthy, or would not stop."""


@dataclass(frozen=True)
class Record:
    """What a pid file says about one started component."""

    name: str
    pid: int
    pgid: int
    create_time: float
    argv: list[str]
    started_at: float
    # Absent from pid files written before it existed: then create_time decides.
    start_ticks: int | None = None

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        os.replace(tmp, path)


def load_record(path: Path) -> Record | None:
    """The pid file's record, or None if absent or unreadable."""
    try:
        data = json.loads(path.read_text())
        return Record(**data)
    except (OSError, ValueError, TypeError):
        return None


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22); None off Linux or if gone.

    Unlike a wall-clock start time this never changes for a running process, whatever the
    clock does, and two processes with the same pid cannot share it unless started in the
    same tick.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')': split after the last one.
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def same_process(proc: psutil.Process, create_time: float, ticks: int | None) -> bool:
    """Whether ``proc`` is the process recorded with this start (ticks when known, else wall clock within 1 s)."""
    if ticks is not None:
        now = start_ticks(proc.pid)
        if now is not None:
            return now == ticks
    return abs(proc.create_time() - create_time) <= 1.0


def live_process(record: Record | None) -> psutil.Process | None:
    """The running process a record describes, or None (gone, zombie, or pid reused)."""
    if record is None:
        return None
    try:
        proc = psutil.Process(record.pid)
        if not same_process(proc, record.create_time, record.start_ticks):
            return None
        if proc.status() == psutil.STATUS_ZOMBIE:
            _reap(record.pid)
            return None
        return proc
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _reap(pid: int) -> None:
    child = _CHILDREN.pop(pid, None)
    if child is not None:
        try:
            child.wait(timeout=0.1)
        except subprocess.TimeoutExpired:
            _CHILDREN[pid] = child
        return
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


@contextlib.contextmanager
def exclusive_lock(path: Path, say: Callable[[str], None], what: str) -> Iterator[None]:
    """Hold an flock on ``path``; says once that it waits when another process holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"[sandbox] waiting for another process that holds {path} ({what})")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def port_in_use(port: int) -> bool:
    """True if something already listens on 127.0.0.1:port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return True
            raise
    return False


def port_owner(port: int) -> str:
    """Who holds ``port``: 'pid N (name)' of its listener, else the connections whose local end it is (the kernel
    gives one local port to several connections with different peers: each is named, up to three), else 'an
    unknown process'."""
    connections: list[str] = []
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if not conn.laddr or conn.laddr.port != port:
                continue
            if conn.status == psutil.CONN_LISTEN and conn.pid:
                try:
                    return f"pid {conn.pid} ({psutil.Process(conn.pid).name()})"
                except psutil.Error:
                    return f"pid {conn.pid}"
            if conn.status != psutil.CONN_LISTEN:
                # A client socket's local end: the kernel gave it this port from its ephemeral range.
                peer = f" to {conn.raddr.ip}:{conn.raddr.port}" if conn.raddr else ""
                connections.append(f"the local end of a {conn.status} connection{peer}" + (f" (pid {conn.pid})" if conn.pid else ""))
    except psutil.Error:
        pass
    if not connections:
        return "an unknown process"
    more = len(connections) - MAX_NAMED_CONNECTIONS
    return "; ".join(connections[:MAX_NAMED_CONNECTIONS]) + (f"; and {more} more" if more > 0 else "")


MAX_NAMED_CONNECTIONS = 3


def ephemeral_port_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's range of local ports for outgoing connections (Linux's default when unreadable).

    A server port inside it can be taken at any moment by some client's socket, so the
    sandbox keeps its ports below it where it chooses them.
    """
    try:
        low, high = (int(part) for part in path.read_text().split())
        return low, high
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL_RANGE


def start(name: str, argv: list[str], log_path: Path, pid_path: Path, env: Mapping[str, str], cwd: Path) -> Record:
    """Start ``argv`` detached (own session and process group), log to ``log_path``."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        log.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} start {' '.join(argv)}\n".encode())
        log.flush()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env),
                cwd=cwd,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise ProcessError(f"{name}: cannot start {argv[0]}: {exc}") from exc
    _CHILDREN[proc.pid] = proc
    try:
        create_time = psutil.Process(proc.pid).create_time()
    except psutil.NoSuchProcess:
        create_time = time.time()
    record = Record(name, proc.pid, proc.pid, create_time, list(argv), time.time(), start_ticks(proc.pid))
    record.save(pid_path)
    return record


def probe(health: Health, pki: Path, timeout: float = 2.0) -> tuple[bool, str]:
    """(healthy, one-line detail) from the component's readiness endpoint."""
    if health.url is None:
        return True, "running"
    context = None
    if health.tls:
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        if health.client_cert:
            context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    try:
        with urllib.request.urlopen(health.url, timeout=timeout, context=context) as resp:
            return resp.status == 200, f"{health.url} {resp.status}"
    except urllib.error.HTTPError as exc:
        return False, f"{health.url} {exc.code}"
    except (urllib.error.URLError, OSError, ssl.SSLError) as exc:
        reason = getattr(exc, "reason", exc)
        return False, f"{health.url} {reason}"


def tail(path: Path, lines: int = 15) -> str:
    """Last lines of a log file (for error messages)."""
    try:
        data = path.read_bytes()[-8000:].decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def wait_healthy(record: Record, health: Health, pki: Path, log_path: Path, timeout: float) -> None:
    """Block until the component answers healthy; ProcessError if it dies or times out."""
    if health.url is None:
        # Nothing to ask: give it a moment to fail on bad arguments or imports, then trust it.
        time.sleep(1.0)
        if live_process(record) is None:
            raise ProcessError(f"{record.name} exited right after starting; last log lines ({log_path}):\n{tail(log_path)}")
        return
    deadline = time.monotonic() + timeout
    delay = 0.1
    detail = ""
    while time.monotonic() < deadline:
        if live_process(record) is None:
            raise ProcessError(f"{record.name} exited while starting; last log lines ({log_path}):\n{tail(log_path)}")
        ok, detail = probe(health, pki)
        if ok:
            return
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)
    raise ProcessError(f"{record.name} not healthy after {timeout:.0f}s ({detail}); see {log_path}:\n{tail(log_path)}")


def marked_processes(marker: str) -> list[psutil.Process]:
    """Every process whose environment carries ``KNEEPOINT_SANDBOX_ID=<marker>``."""
    found = []
    # Never ourselves or an ancestor (a shell that happens to carry the marker).
    mine = {os.getpid()} | {p.pid for p in psutil.Process().parents()}
    for proc in psutil.process_iter():
        if proc.pid in mine:
            continue
        try:
            if proc.environ().get(MARKER_ENV) == marker and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def tree(record: Record) -> list[psutil.Process]:
    """The component's process and all its descendants (empty if not running)."""
    proc = live_process(record)
    if proc is None:
        return []
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return [proc]


def rss_bytes(procs: Iterable[psutil.Process]) -> int:
    """Summed resident memory of the given processes."""
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            continue
    return total


def stop(records: list[Record], marker: str | None, grace: float = 10.0) -> list[str]:
    """End the components' process groups and descendants; returns what is still alive.

    SIGTERM first (etcd and Prometheus flush cleanly), SIGKILL after ``grace`` seconds.
    With a ``marker``, processes that carry it in their environment are ended too.
    """
    procs: dict[int, psutil.Process] = {}
    groups: set[int] = set()
    for record in records:
        for proc in tree(record):
            procs[proc.pid] = proc
        if live_process(record) is not None:
            groups.add(record.pgid)
    if marker:
        for proc in marked_processes(marker):
            procs.setdefault(proc.pid, proc)
    for proc in procs.values():
        try:
            groups.add(os.getpgid(proc.pid))
        except OSError:
            continue
    groups.discard(os.getpgrp())  # never signal our own group (the shell or pytest)
    _signal_all(groups, procs.values(), signal.SIGTERM)
    alive = _wait_gone(list(procs.values()), grace)
    if alive:
        _signal_all(groups, alive, signal.SIGKILL)
        alive = _wait_gone(alive, 5.0)
    if marker:
        alive += [p for p in marked_processes(marker) if p.pid not in {a.pid for a in alive}]
    return [f"pid {p.pid} ({_name(p)})" for p in alive]


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except psutil.Error:
        return "?"


def _signal_all(groups: Iterable[int], procs: Iterable[psutil.Process], sig: signal.Signals) -> None:
    for group in groups:
        try:
            os.killpg(group, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for proc in procs:
        try:
            proc.send_signal(sig)
        except psutil.Error:
            pass


def _wait_gone(procs: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    alive = list(procs)
    while alive and time.monotonic() < deadline:
        for proc in alive:
            _reap(proc.pid)
        still = []
        for proc in alive:
            try:
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    still.append(proc)
            except psutil.NoSuchProcess:
                continue
        alive = still
        if alive:
            time.sleep(0.1)
    for proc in procs:
        _reap(proc.pid)
    return alive
