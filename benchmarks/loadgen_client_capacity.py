"""How many streams one load-generator process drives: CPU per streamed chunk, and the threshold.

Starts the test suite's stub server (tests/unit/loadgen/loadgen_stub_server.py) on 127.0.0.1
in its own process, runs ``kneepoint loadgen --workers 1`` against it at several
concurrencies, and reads the client's own self-monitoring from ``--save-json``. The client's
CPU cost per output chunk (one chunk = one token, as vLLM streams) is
    median CPU (cores) x duration / chunks received,
which does not depend on how fast the stub server is. From it:
    chunks/s one process handles at HEADROOM of a core = HEADROOM / cost,
    streams per process = that / PER_STREAM_CHUNKS,
with PER_STREAM_CHUNKS the per-stream token rate of the fastest tier in our H200 data
(8B, TP2, batch 128: 15,209 tok/s over 128 streams = 119 chunks/s per stream; see
tests/data/h200/README.md). ``worker_plan.CONCURRENCY_PER_WORKER`` is set from this output.

Run: ``.venv/bin/python benchmarks/loadgen_client_capacity.py`` (about a minute).
"""

from __future__ import annotations

import json
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
STUB = ROOT / "tests" / "unit" / "loadgen" / "loadgen_stub_server.py"
HEADROOM = 0.5  # keep one process at half a core: lag stays low and timestamps stay honest
PER_STREAM_CHUNKS = 15209 / 128
CONCURRENCIES = (16, 32, 64, 128, 256)
OUTPUT_LEN = 200


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for(port: int) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise RuntimeError("stub server did not start")


def main() -> None:
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, str(STUB), "--port", str(port), "--ttft-ms", "1", "--itl-ms", "8"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    rows = []
    try:
        _wait_for(port)
        for concurrency in CONCURRENCIES:
            with tempfile.TemporaryDirectory() as tmp:
                saved = pathlib.Path(tmp) / "run.json"
                subprocess.run(
                    [sys.executable, "-m", "kneepoint", "loadgen", "--endpoint", f"http://127.0.0.1:{port}",
                     "--model", "ok", "--concurrency", str(concurrency), "--num-requests", str(3 * concurrency),
                     "--input-len", "32", "--output-len", str(OUTPUT_LEN), "--workers", "1", "--no-progress",
                     "--save-json", str(saved)],
                    check=True, stdout=subprocess.DEVNULL, env={"TERMINATION_MESSAGE_PATH": str(pathlib.Path(tmp) / "t"),
                                                                "PATH": "/usr/bin:/bin"},
                )  # fmt: skip # argv: each flag beside its value
                document = json.loads(saved.read_text())
            repeat = document["repeats"][0]
            chunks = sum(len(r["itlMs"]) + 1 for r in document["requests"] if r["error"] is None)
            duration = repeat["durationSeconds"]
            cpu = repeat["client"]["cpuMedian"]
            cost_us = cpu * duration / chunks * 1e6
            rows.append((concurrency, chunks / duration, cpu, cost_us, repeat["client"]["loopLagP99Ms"]))
    finally:
        server.terminate()
        server.wait(10)
    print(f"{'streams':>8} {'chunks/s':>10} {'client CPU':>11} {'us CPU/chunk':>13} {'lag P99 ms':>11}")
    for concurrency, rate, cpu, cost, lag in rows:
        print(f"{concurrency:>8} {rate:>10.0f} {cpu:>11.2f} {cost:>13.1f} {lag:>11.1f}")
    costs = sorted(row[3] for row in rows)
    cost = costs[len(costs) // 2]
    per_process = HEADROOM / (cost / 1e6)
    print(f"median CPU per chunk: {cost:.1f} us -> {per_process:,.0f} chunks/s per process at {HEADROOM:.0%} of a core")
    print(f"streams per process at {PER_STREAM_CHUNKS:.0f} chunks/s each: {per_process / PER_STREAM_CHUNKS:.0f}")


if __name__ == "__main__":
    main()
