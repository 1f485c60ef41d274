"""Launch probe (run 39): the CPU time the host spends handing work to the GPU, unpinned, as vLLM's EngineCore runs.
Runs 20-21 (an H200 machine) launched a lone prefill inside the piecewise CUDA graphs in 10.3-10.8 ms, runs 33 and 38
(H100 machines, the same CPU model by lscpu) in 6.3-7.2 ms. This times, with the GPU idle and not waiting on it:
one eager kernel's enqueue; one replay of a CUDA graph of 1, 50 and 200 kernels (the call alone, then with a sync);
and a piecewise-like launch, N graphs of 10 kernels each with one eager kernel between (N = 16, 32, 48, 80, vLLM's
layers of the 1B, 8B, 14B, 70B). One JSON line per figure: the median and the 10th/90th percentiles in microseconds."""

import json
import statistics
import time

import torch


def quantiles(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    n = len(xs)
    return {"p10": round(xs[n // 10], 2), "p50": round(statistics.median(xs), 2), "p90": round(xs[(9 * n) // 10], 2)}


def emit(what: str, samples_us: list[float], **extra: object) -> None:
    print(json.dumps({"what": what, "n": len(samples_us), **extra, **quantiles(samples_us)}), flush=True)


def capture(x: torch.Tensor, kernels: int) -> torch.cuda.CUDAGraph:
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(kernels):
            x.add_(1)
    return g


def main() -> None:
    print(json.dumps({"what": "device", "name": torch.cuda.get_device_name(0), "torch": torch.__version__}), flush=True)
    x = torch.zeros(16, device="cuda")
    y = torch.zeros(16, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        for _ in range(3):
            x.add_(1)
    torch.cuda.synchronize()
    graphs = {k: capture(x, k) for k in (1, 10, 50, 200)}
    torch.cuda.synchronize()
    for rnd in range(2):
        # One eager kernel's enqueue, in batches of 100 so the queue never fills.
        samples = []
        for _ in range(200):
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(100):
                y.add_(1)
            samples.append((time.perf_counter() - t) / 100 * 1e6)
        emit("eager_enqueue_us", samples, round=rnd)
        for k in (1, 50, 200):
            call, synced = [], []
            for _ in range(200):
                torch.cuda.synchronize()
                t = time.perf_counter()
                graphs[k].replay()
                call.append((time.perf_counter() - t) * 1e6)
                torch.cuda.synchronize()
                synced.append((time.perf_counter() - t) * 1e6)
            emit("graph_replay_call_us", call, kernels=k, round=rnd)
            emit("graph_replay_synced_us", synced, kernels=k, round=rnd)
        for layers in (16, 32, 48, 80):
            call, synced = [], []
            for _ in range(100):
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(layers):
                    graphs[10].replay()
                    y.add_(1)
                call.append((time.perf_counter() - t) * 1e6)
                torch.cuda.synchronize()
                synced.append((time.perf_counter() - t) * 1e6)
            emit("piecewise_call_us", call, layers=layers, round=rnd)
            emit("piecewise_synced_us", synced, layers=layers, round=rnd)


if __name__ == "__main__":
    main()
