"""Container processes of the sandbox's pod runner: start, wait, stop, logs, leftovers.

Adapter (asyncio subprocesses, files, signals). Each container run is one child process
in its own process group (a container's processes die together: when the main process
exits, or on stop, the whole group is killed). Each child also gets the parent-death
signal SIGTERM, so no child outlives a runner that was killed outright; a pid file per
running child lets a restarted runner kill leftovers that escaped even that
(grandchildren, say).

Logs: stdout and stderr of every run of a container are appended to one file,
``<state-dir>/pods/<namespace>_<pod>_<container>.log``, each run opened by a marker line
``==== kneepoint sandbox runner: ... ====`` (for people). Each run also gets a file of its
own in the CRI log format the kubelet's container runtime writes (``<RFC 3339 time>
<stdout|stderr> <F|P> <text>``, see :func:`cri_line`), which KWOK serves to ``kubectl logs``
(pods publishes the files in a KWOK ``Logs`` object). For that the runner reads the
process's output through pipes and writes both files itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import json
import logging
import os
import signal
from collections.abc import Mapping, Sequence
from pathlib import Path

import psutil

from kneepoint.core.timestamps import now_rfc3339
from kneepoint.sandbox.processes import same_process, start_ticks
from kneepoint.sandbox.runner.podstatus import exit_code_of

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_LIBC_NAME = ctypes.util.find_library("c")
_LIBC = ctypes.CDLL(_LIBC_NAME, use_errno=True) if _LIBC_NAME else None


def _die_with_parent() -> None:  # runs in the child between fork and exec
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


# containerd splits lines longer than this into partial (P) records.
CRI_MAX_LINE_BYTES = 16 * 1024


def cri_line(stamp: str, stream: str, content: bytes, partial: bool = False) -> bytes:
    """One CRI log record: ``2026-12-01T18:27:09.123456Z stderr F <content>\\n`` (content without its newline)."""
    return f"{stamp} {stream} {'P' if partial else 'F'} ".encode() + content + b"\n"


def cri_records(stamp: str, stream: str, buffer: bytearray, final: bool = False) -> bytes:
    """Take the complete lines out of ``buffer`` as CRI records (and the rest too when ``final``)."""
    out = bytearray()
    while True:
        newline = buffer.find(b"\n")
        if newline < 0:
            if len(buffer) >= CRI_MAX_LINE_BYTES or (final and buffer):
                chunk = bytes(buffer[:CRI_MAX_LINE_BYTES])
                del buffer[: len(chunk)]
                out += cri_line(stamp, stream, chunk, partial=not final or bool(buffer))
                continue
            return bytes(out)
        line = bytes(buffer[:newline])
        del buffer[: newline + 1]
        while len(line) > CRI_MAX_LINE_BYTES:
            out += cri_line(stamp, stream, line[:CRI_MAX_LINE_BYTES], partial=True)
            line = line[CRI_MAX_LINE_BYTES:]
        out += cri_line(stamp, stream, line)


def _stamp() -> str:
    return now_rfc3339(6)


def log_file_name(namespace: str, pod: str, container: str) -> str:
    """``<namespace>_<pod>_<container>.log`` (names are DNS labels: no ``_`` inside)."""
    return f"{namespace}_{pod}_{container}.log"


class ContainerProcess:
    """One run of one container: a child process and its log.

    ``start`` spawns it, ``wait`` returns the container exit code once it has ended (and
    kills what is left of its process group), ``stop`` asks it to end (SIGTERM), then
    forces it (SIGKILL) after the grace period.
    """

    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, log_path: Path, pid_path: Path, cri_path: Path | None = None
    ) -> None:
        self.argv = list(argv)
        self.cri_path = cri_path
        self._pumps: list[asyncio.Task[None]] = []
        self.env = dict(env)
        self.cwd = cwd
        self.log_path = log_path
        self.pid_path = pid_path
        self._process: asyncio.subprocess.Process | None = None
        self._log_offset = 0
        self._exit_code: int | None = None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    async def start(self, banner: str) -> int:
        """Spawn the process; returns its pid. Raises OSError when it cannot be spawned."""
        self.cwd.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        stamp = now_rfc3339(6)
        with open(self.log_path, "ab") as log_file:
            log_file.write(f"==== kneepoint sandbox runner: {stamp} {banner} ====\n".encode())
            log_file.flush()
            self._log_offset = log_file.tell()
            piped = self.cri_path is not None
            self._process = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE if piped else log_file,
                stderr=asyncio.subprocess.PIPE if piped else log_file,
                env=self.env,
                cwd=str(self.cwd),
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        if self.cri_path is not None:
            self.cri_path.parent.mkdir(parents=True, exist_ok=True)
            self.cri_path.touch()
            assert self._process.stdout is not None and self._process.stderr is not None
            self._pumps = [
                asyncio.create_task(self._pump(reader, name))
                for reader, name in ((self._process.stdout, "stdout"), (self._process.stderr, "stderr"))
            ]
        pid = self._process.pid
        self._write_pid_file(pid)
        return pid

    async def _pump(self, reader: asyncio.StreamReader, stream: str) -> None:
        """Copy one output stream into the plain log (as is) and the run's CRI log (as records)."""
        assert self.cri_path is not None
        buffer = bytearray()
        with open(self.log_path, "ab", buffering=0) as plain, open(self.cri_path, "ab", buffering=0) as cri:
            while True:
                chunk = await reader.read(65536)
                if not chunk:
                    break
                plain.write(chunk)
                buffer += chunk
                records = cri_records(_stamp(), stream, buffer)
                if records:
                    cri.write(records)
            if buffer:
                cri.write(cri_records(_stamp(), stream, buffer, final=True))

    def _write_pid_file(self, pid: int) -> None:
        try:
            created = psutil.Process(pid).create_time()
        except psutil.Error:
            created = 0.0
        self.pid_path.parent.mkdir(parents=True, exist_ok=True)
        record = {"pid": pid, "pgid": pid, "createTime": created, "startTicks": start_ticks(pid), "argv": self.argv[:4]}
        self.pid_path.write_text(json.dumps(record))

    async def wait(self) -> int:
        """The exit code once the process has ended (a signal N gives 128+N)."""
        assert self._process is not None, "start() first"
        returncode = await self._process.wait()
        self._exit_code = exit_code_of(returncode)
        # The container is gone once its main process is: take the rest of the group with it.
        _kill_group(self._process.pid, signal.SIGKILL)
        if self._pumps:
            # The group is dead, so the pipes close: the logs hold the run's last words before its exit is reported.
            await asyncio.wait(self._pumps, timeout=5.0)
        with contextlib.suppress(FileNotFoundError):
            self.pid_path.unlink()
        return self._exit_code

    async def stop(self, grace_seconds: float) -> None:
        """SIGTERM to the process group, SIGKILL after ``grace_seconds``; returns once it ended."""
        process = self._process
        if process is None or process.returncode is not None:
            return
        _kill_group(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(process.wait()), timeout=max(grace_seconds, 0.0))
        except TimeoutError:
            log.info("Killed process group after grace period pid=%s grace=%.0fs", process.pid, grace_seconds)
            _kill_group(process.pid, signal.SIGKILL)
            await process.wait()

    def output_tail(self, max_bytes: int = 16384) -> str:
        """The last ``max_bytes`` this run wrote to its log."""
        try:
            with open(self.log_path, "rb") as log_file:
                log_file.seek(0, os.SEEK_END)
                end = log_file.tell()
                start = max(self._log_offset, end - max_bytes)
                log_file.seek(start)
                return log_file.read(end - start).decode("utf-8", "replace")
        except OSError:
            return ""


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def reap_leftovers(pids_dir: Path, grace_seconds: float = 2.0) -> list[int]:
    """Kill process groups a previous runner left behind (per its pid files); their pids.

    A pid file is trusted only when the process with that pid started at the recorded
    time (kernel ticks since boot, so a stepped wall clock does not matter), so a recycled
    pid is never signalled.
    """
    killed: list[int] = []
    if not pids_dir.is_dir():
        return killed
    for path in sorted(pids_dir.glob("*.json")):
        try:
            record = json.loads(path.read_text())
            pid, created = int(record["pid"]), float(record.get("createTime") or 0)
            ticks = record.get("startTicks")
            process = psutil.Process(pid)
            if (created or ticks is not None) and same_process(process, created, None if ticks is None else int(ticks)):
                _kill_group(int(record.get("pgid") or pid), signal.SIGTERM)
                with contextlib.suppress(psutil.TimeoutExpired, psutil.Error):
                    process.wait(timeout=grace_seconds)
                _kill_group(int(record.get("pgid") or pid), signal.SIGKILL)
                killed.append(pid)
        except (OSError, ValueError, KeyError, psutil.Error):
            pass
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return killed
