"""Container processes: exit codes, logs, stop with grace, no leftovers (real child processes)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from kneepoint.sandbox.processes import start_ticks
from kneepoint.sandbox.runner.processes import ContainerProcess, log_file_name, reap_leftovers


def make(tmp_path: Path, code: str, name: str = "c") -> ContainerProcess:
    return ContainerProcess(
        [sys.executable, "-c", code],
        {"PATH": os.environ.get("PATH", ""), "PYTHONUNBUFFERED": "1"},
        cwd=tmp_path / "cwd",
        log_path=tmp_path / "pods" / log_file_name("ns", "pod", name),
        pid_path=tmp_path / "pids" / f"uid_{name}.json",
    )


async def test_exit_code_log_and_tail(tmp_path: Path) -> None:
    process = make(tmp_path, "import sys; print('hello'); print('oops', file=sys.stderr); sys.exit(3)")
    await process.start("first")
    assert (tmp_path / "pids" / "uid_c.json").exists()
    assert await process.wait() == 3
    assert not (tmp_path / "pids" / "uid_c.json").exists()
    assert process.output_tail() == "hello\noops\n"
    second = make(tmp_path, "print('again')")
    await second.start("second")
    assert await second.wait() == 0
    assert second.output_tail() == "again\n"  # only this run's output
    log = (tmp_path / "pods" / "ns_pod_c.log").read_text()
    assert log.count("==== kneepoint sandbox runner:") == 2 and "hello" in log and "again" in log


async def test_stop_escalates_to_sigkill_after_grace(tmp_path: Path) -> None:
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"
    process = make(tmp_path, code)
    await process.start("stubborn")
    waiter = asyncio.create_task(process.wait())
    await asyncio.sleep(0.5)
    began = time.monotonic()
    await process.stop(0.5)
    assert await waiter == 128 + signal.SIGKILL
    assert time.monotonic() - began < 5


async def test_sigterm_is_honoured_and_group_dies_with_main(tmp_path: Path) -> None:
    # The main process starts a grandchild in its group, then exits on SIGTERM.
    code = (
        "import subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    process = make(tmp_path, code)
    await process.start("tree")
    waiter = asyncio.create_task(process.wait())
    for _ in range(50):
        await asyncio.sleep(0.1)
        if process.output_tail().strip():
            break
    grandchild = int(process.output_tail().strip())
    await process.stop(5.0)
    assert await waiter == 128 + signal.SIGTERM
    for _ in range(20):
        if not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE:
            break
        await asyncio.sleep(0.1)
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE


def test_reap_leftovers_kills_recorded_groups_only(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    leftover = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    created = psutil.Process(leftover.pid).create_time()
    (pids / "a.json").write_text(json.dumps({"pid": leftover.pid, "pgid": leftover.pid, "createTime": created}))
    # Written with kernel start ticks: found even though the wall clock was stepped an hour since.
    stepped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    ticks = start_ticks(stepped.pid)
    (pids / "c.json").write_text(json.dumps({"pid": stepped.pid, "pgid": stepped.pid, "createTime": created + 3600, "startTicks": ticks}))
    innocent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    # A recycled pid: the start time does not match, so it is left alone.
    (pids / "b.json").write_text(
        json.dumps({"pid": innocent.pid, "pgid": innocent.pid, "createTime": created - 100, "startTicks": (ticks or 0) - 1})
    )
    try:
        assert reap_leftovers(pids, grace_seconds=2.0) == [leftover.pid, stepped.pid]
        leftover.wait(timeout=5)  # (already reaped by reap_leftovers' psutil wait: returncode unknown)
        stepped.wait(timeout=5)
        assert not psutil.pid_exists(leftover.pid)
        assert not psutil.pid_exists(stepped.pid)
        assert innocent.poll() is None
        assert list(pids.iterdir()) == []
    finally:
        innocent.kill()
        innocent.wait()
        for process in (leftover, stepped):
            if process.poll() is None:
                process.kill()
            leftover.wait()
