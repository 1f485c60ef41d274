"""Pod logs in the sandbox: CRI-format records (what KWOK reads) and the KWOK Logs object per pod."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from kneepoint.sandbox.runner.podstatus import pod_logs_object
from kneepoint.sandbox.runner.processes import CRI_MAX_LINE_BYTES, ContainerProcess, cri_records

STAMP = "2026-12-01T18:27:09.123456Z"


def test_complete_lines_become_full_records_and_the_rest_waits() -> None:
    buffer = bytearray(b"one\ntwo\nthr")
    assert cri_records(STAMP, "stdout", buffer) == f"{STAMP} stdout F one\n{STAMP} stdout F two\n".encode()
    assert buffer == b"thr"
    buffer += b"ee\n"
    assert cri_records(STAMP, "stderr", buffer) == f"{STAMP} stderr F three\n".encode() and not buffer


def test_long_lines_are_split_into_partial_records_and_the_end_of_output_is_flushed() -> None:
    buffer = bytearray(b"x" * (CRI_MAX_LINE_BYTES + 5) + b"\n")
    records = cri_records(STAMP, "stdout", buffer).splitlines()
    assert [r.split(b" ")[2] for r in records] == [b"P", b"F"] and records[1].endswith(b" xxxxx")
    tail = bytearray(b"no newline at exit")
    assert cri_records(STAMP, "stdout", tail, final=True) == f"{STAMP} stdout F no newline at exit\n".encode()


def test_logs_object_names_current_and_previous_per_container_and_belongs_to_the_pod() -> None:
    body = pod_logs_object("ns", "engine-abc", "uid-1", {"engine": ("/l/engine/1.log", "/l/engine/0.log"), "side": ("/l/side/0.log", None)})
    assert body["apiVersion"] == "kwok.x-k8s.io/v1alpha1" and body["kind"] == "Logs"
    assert body["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "engine-abc", "uid": "uid-1"}]
    assert body["spec"]["logs"] == [
        {"containers": ["engine"], "logsFile": "/l/engine/1.log", "follow": False, "previousLogsFile": "/l/engine/0.log"},
        {"containers": ["side"], "logsFile": "/l/side/0.log", "follow": False},
    ]


def test_a_run_writes_both_the_plain_log_and_its_cri_log(tmp_path: Path) -> None:
    script = "import sys; print('to stdout'); print('to stderr', file=sys.stderr); sys.exit(3)"
    process = ContainerProcess(
        [sys.executable, "-c", script],
        {},
        tmp_path / "cwd",
        tmp_path / "plain.log",
        tmp_path / "pid.json",
        cri_path=tmp_path / "logs" / "0.log",
    )

    async def run() -> int:
        await process.start("test")
        return await process.wait()

    assert asyncio.run(run()) == 3
    plain = (tmp_path / "plain.log").read_text()
    assert "to stdout" in plain and "to stderr" in plain and process.output_tail().count("to ") == 2
    records = (tmp_path / "logs" / "0.log").read_text().splitlines()
    assert sorted(r.split(" ", 1)[1] for r in records) == ["stderr F to stderr", "stdout F to stdout"]
