"""Detached processes: identity by pid + start time, stopping groups and escaped descendants."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
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
        assert record.start_ticks is not None
        stale = processes.Record("t", record.pid, record.pgid, record.create_time - 100, record.argv, 0, record.start_ticks - 1)
        assert processes.live_process(stale) is None
        # A pid file from before start ticks were recorded: the wall-clock start time decides.
        old = processes.Record("t", record.pid, record.pgid, record.create_time, record.argv, 0)
        assert processes.live_process(old) is not None
        assert processes.live_process(dataclasses.replace(old, create_time=record.create_time - 100)) is None
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


def test_a_stepped_wall_clock_does_not_orphan_a_running_component(tmp_path: Path) -> None:
    """psutil's start time is boot time + ticks, and boot time moves with the wall clock.

    CI once ran on a VM whose clock was stepped mid-suite: every component's recorded
    wall-clock start was then more than a second off, the sandbox took its own etcd for a
    stranger's and the restart tests failed. The kernel's start ticks do not move.
    """
    marker = f"unit-{tmp_path}"
    record = _start(tmp_path, "exec sleep 30", marker)
    try:
        assert record.start_ticks == processes.start_ticks(record.pid)
        stepped = dataclasses.replace(record, create_time=record.create_time + 3600)  # as if the clock moved an hour
        assert processes.live_process(stepped) is not None
        assert [proc.pid for proc in processes.tree(stepped)] == [record.pid]
    finally:
        assert processes.stop([record], marker) == []
    assert processes.start_ticks(record.pid) is None or processes.live_process(record) is None


def test_start_ticks_reads_past_a_command_name_with_spaces_and_parentheses(tmp_path: Path) -> None:
    script = tmp_path / "odd ) name"
    script.write_text("#!/bin/sh\nsleep 30\n")  # no exec: the shell keeps the odd name as its command name
    script.chmod(0o755)
    proc = subprocess.Popen([str(script)], start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while psutil.Process(proc.pid).name() != "odd ) name" and time.monotonic() < deadline:
            time.sleep(0.02)
        assert psutil.Process(proc.pid).name() == "odd ) name"
        ticks = processes.start_ticks(proc.pid)
        mine = processes.start_ticks(os.getpid())
        assert ticks is not None and mine is not None
        assert mine <= ticks <= mine + int(time.monotonic() * os.sysconf("SC_CLK_TCK"))  # after this process, not garbage
        # The same figure psutil turns into a wall-clock start (ticks / CLK_TCK + boot time).
        assert abs(ticks / os.sysconf("SC_CLK_TCK") + psutil.boot_time() - psutil.Process(proc.pid).create_time()) < 0.05
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()


def test_a_port_held_by_an_outgoing_connection_is_in_use_and_named() -> None:
    """Stop 30's CI: a port the kernel handed to a client socket cannot be bound by a server."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()) as client:
            accepted, _ = server.accept()
            with accepted:
                local = client.getsockname()[1]
                low, high = processes.ephemeral_port_range()
                assert low <= local <= high  # the kernel chose it from its ephemeral range
                assert processes.port_in_use(local)
                owner = processes.port_owner(local)
                # One local port can serve several connections with other peers (stop 32's CI: the API server's to
                # etcd had this one too): each holder is named, this one among them.
                mine = f"the local end of a ESTABLISHED connection to 127.0.0.1:{server.getsockname()[1]} (pid {os.getpid()})"
                assert mine in owner, owner


def test_ephemeral_port_range_reads_the_kernel_file_and_falls_back_to_linux_default(tmp_path: Path) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text("40000\t50000\n")
    assert processes.ephemeral_port_range(path) == (40000, 50000)
    assert processes.ephemeral_port_range(tmp_path / "missing") == processes.DEFAULT_EPHEMERAL_RANGE
    path.write_text("garbage\n")
    assert processes.ephemeral_port_range(path) == processes.DEFAULT_EPHEMERAL_RANGE
