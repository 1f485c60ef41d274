"""Detached processes: identity by pid + start time, stopping groups and escaped descendants."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import psutil

from kneepoint.sandbox import processes


def _start(tmp_path: Path, script: str, marker: str) -> processes.Record:
    env = {**os.environ, processes.MARKER_ENV: marker}
    return processes.start("t", ["/bin/sh", "-c", script], tmp_path / "t.log", tmp_path / "t.json", env, cwd=tmp_path)


def test_started_process_is_detached_and_recorded(tmp_path: Path) -> None:
    marker = f"unit-{tmp_path}"
    record = _start(tmp_path, "exec sleep 30", marker)
    try:
        assert processes.load_record(tmp_path / "t.json") == record
        proc = processes.live_process(record)
        assert proc is not None
        assert os.getpgid(record.pid) == record.pid != os.getpgrp()  # its own process group
        assert os.getsid(record.pid) == record.pid  # and session: it outlives our terminal
        # A record whose start time does not match is someone else's process (pid reuse).
        stale = processes.Record("t", record.pid, record.pgid, record.create_time - 100, record.argv, 0)
        assert processes.live_process(stale) is None
    finally:
        assert processes.stop([record], marker) == []
    assert processes.live_process(record) is None


def test_stop_ends_descendants_that_left_the_group(tmp_path: Path) -> None:
    marker = f"unit-{tmp_path}"
    # The child escapes into its own session, as a runner's workloads might.
    record = _start(tmp_path, "setsid sleep 30 & sleep 30", marker)
    deadline = time.monotonic() + 5
    while len(processes.marked_processes(marker)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    marked = processes.marked_processes(marker)
    assert len(marked) >= 3
    assert processes.stop([record], marker, grace=5) == []
    assert processes.marked_processes(marker) == []
    for proc in marked:
        assert not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE


def test_port_in_use_sees_a_listener_on_loopback() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert processes.port_in_use(port)
        assert str(os.getpid()) in processes.port_owner(port)
    assert not processes.port_in_use(port)
