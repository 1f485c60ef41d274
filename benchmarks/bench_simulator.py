"""How many streamed tokens per second one `kneepoint sim` process serves on one CPU core.

Starts the simulator pinned to one core and drives it from a separate client process pinned
to another core (a lean raw-socket HTTP/1.1 client that only counts SSE events, so the client
is not the limit). The simulated model is small (llama-3.2-1b preset on one H200) so the
modelled GPU ceiling lies far above what one core can stream: the figure measures the
simulator's CPU capacity. For each concurrency it prints tokens/s, the server's CPU use and
tokens per CPU-second of the server (the capacity figure on a shared machine, where the
process may not get its whole core) and the engine-lag counter (seconds the engine loop fell
behind the modelled step times; 0 means the simulated GPU, not the CPU, set the pace).

    .venv/bin/python benchmarks/bench_simulator.py [--concurrency 64,256,512] [--seconds 8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from multiprocessing import Process, Queue

import psutil

BODY = b'{"model":"bench","prompt":[%s],"max_tokens":%d,"stream":true,"ignore_eos":true}'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pin(pid: int, core: int) -> bool:
    try:
        os.sched_setaffinity(pid, {core})
        return True
    except (AttributeError, OSError):
        return False


async def _worker(port: int, body: bytes, counter: list[int], stop_at: float) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    request = (
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    ) + body
    try:
        while time.monotonic() < stop_at:
            writer.write(request)
            tail = b""
            while True:
                data = await reader.read(262144)
                if not data:
                    return
                counter[0] += data.count(b"data: {")
                tail = (tail + data)[-32:]
                if tail.endswith(b"[DONE]\n\n\r\n0\r\n\r\n"):
                    break
    finally:
        writer.close()


def client_main(port: int, concurrency: int, warmup: float, seconds: float, output_len: int, core: int, out: Queue) -> None:
    pin(0, core)
    body = BODY % (b",".join(b"%d" % (i % 1000 + 100) for i in range(64)), output_len)

    async def run() -> tuple[float, float]:
        counter = [0]
        stop_at = time.monotonic() + warmup + seconds + 30
        tasks = [asyncio.create_task(_worker(port, body, counter, stop_at)) for _ in range(concurrency)]
        await asyncio.sleep(warmup)
        c0, t0, cpu0 = counter[0], time.monotonic(), time.process_time()
        await asyncio.sleep(seconds)
        c1, t1, cpu1 = counter[0], time.monotonic(), time.process_time()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return (c1 - c0) / (t1 - t0), (cpu1 - cpu0) / (t1 - t0)

    out.put(asyncio.run(run()))


def scrape_lag(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    m = re.search(r"^kneepoint_sim_engine_lag_seconds_total\{[^}]*\} (\S+)$", text, re.M)
    return float(m.group(1)) if m else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="64,256,512")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--client-core", type=int, default=1)
    parser.add_argument("--architecture", default="llama-3.2-1b")
    args = parser.parse_args()
    print(f"CPU cores visible: {os.cpu_count()}; server on core {args.server_core}, client on core {args.client_core}")
    print(f"{'concurrency':>11} {'tokens/s':>10} {'server CPU':>10} {'tokens/CPU-s':>12} {'client CPU':>10} {'engine lag s':>12}")
    for conc in [int(c) for c in args.concurrency.split(",")]:
        port = free_port()
        cmd = [
            sys.executable,
            "-m",
            "kneepoint",
            "sim",
            "--model",
            "bench",
            "--architecture",
            args.architecture,
            "--gpu",
            "h200",
            "--port",
            str(port),
            "--dcgm-port",
            "0",
            "--model-load-seconds",
            "0",
            "--noise",
            "0",
            "--max-num-seqs",
            str(max(conc, 256)),
        ]
        server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            pinned = pin(server.pid, args.server_core)
            for _ in range(100):
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                    break
                except OSError:
                    time.sleep(0.1)
            proc = psutil.Process(server.pid)
            out: Queue = Queue()
            client = Process(target=client_main, args=(port, conc, args.warmup, args.seconds, args.output_len, args.client_core, out))
            client.start()
            time.sleep(args.warmup)
            cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
            lag_start = scrape_lag(port)
            tokens_per_s, client_cpu = out.get(timeout=args.warmup + args.seconds + 60)
            cpu1, t1 = sum(proc.cpu_times()[:2]), time.monotonic()
            lag = scrape_lag(port) - lag_start
            client.join()
            server_cpu = (cpu1 - cpu0) / (t1 - t0)
            per_cpu_second = tokens_per_s / server_cpu if server_cpu > 0 else float("nan")
            print(
                f"{conc:>11} {tokens_per_s:>10.0f} {server_cpu:>10.2f} {per_cpu_second:>12.0f} {client_cpu:>10.2f} {lag:>12.2f}"
                + ("" if pinned else "  (not pinned)")
            )
        finally:
            server.terminate()
            server.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
