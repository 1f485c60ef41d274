"""Per-CPU host probe (run 13): pin this process to each CPU in turn and time what a small model's decode step is
made of on the host side: a pure-Python loop, the CPU cost of enqueueing a tiny CUDA kernel, a launch + synchronize
round trip, and the replay of a 200-kernel CUDA graph + synchronize. The steal ticks of that CPU over the probe say
whether the hypervisor took it away. One JSON line per CPU and round."""

import json
import os
import statistics
import time

import torch


def steal_ticks() -> dict[int, int]:
    out = {}
    with open("/proc/stat") as f:
        for line in f:
            if line.startswith("cpu") and line[3].isdigit():
                fields = line.split()
                out[int(fields[0][3:])] = int(fields[8])
    return out


def py_loop_ms() -> float:
    t = time.perf_counter()
    a = 0
    for i in range(200_000):
        a += i * i
    return (time.perf_counter() - t) * 1e3


def main() -> None:
    x = torch.zeros(16, device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(3):
            x.add_(1)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(200):
            x.add_(1)
    torch.cuda.synchronize()
    cpus = sorted(os.sched_getaffinity(0))
    for rnd in range(2):
        for cpu in cpus:
            os.sched_setaffinity(0, {cpu})
            time.sleep(0.02)
            s0 = steal_ticks()
            py = min(py_loop_ms() for _ in range(3))
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(2000):
                x.add_(1)
            enqueue = (time.perf_counter() - t) / 2000 * 1e6
            torch.cuda.synchronize()
            trips = []
            for _ in range(300):
                t = time.perf_counter()
                x.add_(1)
                torch.cuda.synchronize()
                trips.append((time.perf_counter() - t) * 1e6)
            replays = []
            for _ in range(30):
                t = time.perf_counter()
                graph.replay()
                torch.cuda.synchronize()
                replays.append((time.perf_counter() - t) * 1e6)
            s1 = steal_ticks()
            print(
                json.dumps(
                    {
                        "round": rnd,
                        "cpu": cpu,
                        "pyLoopMs": round(py, 3),
                        "enqueueUs": round(enqueue, 2),
                        "roundTripUsP50": round(statistics.median(trips), 2),
                        "graph200UsP50": round(statistics.median(replays), 1),
                        "stealTicks": s1[cpu] - s0[cpu],
                    }
                ),
                flush=True,
            )
    os.sched_setaffinity(0, set(cpus))


if __name__ == "__main__":
    main()
