"""kneepoint loadgen side by side with NVIDIA AIPerf, GuideLLM and vLLM's bench serve against the simulator.

For every scenario, concurrency and repeat, each client gets a fresh ``kneepoint sim`` (with
``--truth-log``) pinned to one core, and runs pinned to another core (``sched_setaffinity``
before exec; children inherit it). Every client runs the same closed-loop point: chat API,
streaming, ``--input-len``/``--output-len`` fixed, ``ignore_eos``, one warm-up request per
stream, then N measured requests. The order of the clients rotates between repeats.

Per run it records:
- requests/s and output tokens/s over the client's own measurement window, from its
  per-request export (the client's reported figures are kept alongside);
- the client's CPU in cores over that same window: psutil over its whole process tree
  (process_tree_cpu.py), so the start-up and shutdown are not counted;
- tokens/s per client core = tokens/s / client cores;
- the server's CPU (cores) and its engine-lag counter, which show when the simulator and
  not the client was the limit;
- the TTFT error: each measured request joined with the simulator's truth log by id
  (ttft_truth_join.py), median and P99 of |measured - injected|, and the signed median.

A fourth client, ``floor`` (raw_socket_client.py), only reads bytes: its TTFT error is
what the machine and the simulator's HTTP path add, the floor for any client here. Before
each run the script waits (up to ``--quiet-wait`` seconds) for the 1-minute load average to
fall under ``--quiet-load``, and records the load average either way.

Results go to ``<out>/results.jsonl`` (one line per run, appended as they finish) and the
tables are printed at the end; ``--report <results.jsonl>`` prints them again.

    .venv/bin/python benchmarks/loadgen_vs_peers.py [--scenarios fast,realistic]
        [--concurrency 1,16,64,256,512] [--repeats 2] [--clients loadgen,aiperf,guidellm,vllm,floor]
        [--peers-venv ~/.cache/kneepoint/peers-venv] [--out DIR]

The peers live in virtual environments outside the repository (AIPerf and GuideLLM in
``--peers-venv``, vLLM in ``--vllm-venv``; see docs/benchmarks.md for the pip commands); a
missing one is skipped with one line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from clients_under_test import (  # noqa: E402 - after the sys.path entry above
    ClientRun,
    Workload,
    aiperf_command,
    floor_command,
    guidellm_command,
    loadgen_command,
    read_aiperf,
    read_floor,
    read_guidellm,
    read_loadgen,
    read_vllm,
    vllm_command,
)
from process_tree_cpu import ProcessTreeCpu  # noqa: E402 - after the sys.path entry above
from ttft_truth_join import join, read_truth  # noqa: E402 - after the sys.path entry above

PEERS = ("aiperf", "guidellm", "vllm")
CLIENT_TIMEOUT_S = 900.0


@dataclass(frozen=True)
class Scenario:
    """A simulated model and tier, and the request shape sent to it."""

    name: str
    model: str
    architecture: str
    tensor_parallel: int
    input_len: int
    output_len: int
    requests: dict[int, int]
    """Measured requests per concurrency (other concurrencies: 6 x concurrency, at least 40)."""

    def num_requests(self, concurrency: int) -> int:
        return self.requests.get(concurrency, max(40, 6 * concurrency))


SCENARIOS = {
    # A 1B model on one H200: steps of 1-3 ms, so at high concurrency the modelled GPU
    # outruns what one client core can read and the client becomes the limit.
    "fast": Scenario(
        "fast", "meta-llama/Llama-3.2-1B-Instruct", "llama-3.2-1b", 1, 128, 128, {1: 32, 16: 256, 64: 512, 256: 1024, 512: 1536}
    ),
    # Llama 3.1 8B on one H200 (the calibrated case): 5-40 ms steps, a realistic token rate.
    "realistic": Scenario(
        "realistic", "meta-llama/Llama-3.1-8B-Instruct", "llama-3-8b", 1, 512, 128, {1: 16, 16: 256, 64: 512, 256: 1024, 512: 1536}
    ),
}


# --------------------------------------------------------------------------------------------
# Processes


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def pinned(core: int, nice: int = 0, realtime: bool = False):
    """preexec_fn: pin the child (and so all its descendants) to one core, at a niceness.

    The child runs in a session of its own. With the kernel's autogroup scheduling
    (``/proc/sys/kernel/sched_autogroup_enabled``), CPU is shared between sessions first,
    and a process's own nice value only counts inside its session, so the niceness is also
    given to the session's group (``/proc/self/autogroup``). ``realtime`` runs the child under
    SCHED_FIFO (priority 1, root only; the kernel still keeps 5 % of each second for others):
    on a crowded machine, the only way to wake on time rather than after other tasks' slices.
    """

    def pin() -> None:
        os.sched_setaffinity(0, {core})
        if realtime:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        if nice:
            os.nice(nice)
            try:
                with open("/proc/self/autogroup", "w") as group:
                    group.write(str(nice))
            except OSError:
                pass

    return pin


def start_simulator(scenario: Scenario, port: int, truth: str, core: int, log: str, nice: int, realtime: bool) -> subprocess.Popen:
    cmd = [
        sys.executable,
        "-m",
        "kneepoint",
        "sim",
        "--model",
        scenario.model,
        "--architecture",
        scenario.architecture,
        "--tensor-parallel-size",
        str(scenario.tensor_parallel),
        "--gpu",
        "h200",
        "--port",
        str(port),
        "--dcgm-port",
        "0",
        "--model-load-seconds",
        "0",
        "--truth-log",
        truth,
    ]
    with open(log, "w") as out:
        server = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, preexec_fn=pinned(core, nice, realtime), cwd=ROOT, start_new_session=True
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the simulator exited with {server.returncode}; see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                if response.status == 200:
                    return server
        except OSError:
            pass
        time.sleep(0.1)
    server.kill()
    raise RuntimeError(f"the simulator did not become healthy; see {log}")


def engine_lag_seconds(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    match = re.search(r"^kneepoint_sim_engine_lag_seconds_total\{[^}]*\} (\S+)$", text, re.M)
    return float(match.group(1)) if match else float("nan")


def stop(process: subprocess.Popen, timeout: float = 20.0) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def kill_session(process: subprocess.Popen) -> None:
    """Kill a client we started in its own session, with whatever it spawned."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


# --------------------------------------------------------------------------------------------
# One run


def peer_venv(peer: str, args: argparse.Namespace) -> str:
    """vLLM pins its own torch and transformers, so it has an environment of its own."""
    return args.vllm_venv if peer == "vllm" else args.peers_venv


def client_command(client: str, work: Workload, out_dir: str, args: argparse.Namespace) -> list[str]:
    if client == "loadgen":
        return loadgen_command(sys.executable, work, out_dir)
    if client == "floor":
        return floor_command(sys.executable, work, out_dir)
    if client == "aiperf":
        return aiperf_command(args.peers_venv, work, out_dir, args.tokenizer)
    if client == "vllm":
        return vllm_command(args.vllm_venv, work, out_dir, args.tokenizer)
    return guidellm_command(args.peers_venv, work, out_dir, args.tokenizer)


def read_client(client: str, out_dir: str) -> ClientRun:
    readers = {"loadgen": read_loadgen, "aiperf": read_aiperf, "guidellm": read_guidellm, "floor": read_floor, "vllm": read_vllm}
    return readers[client](out_dir)


def align_to_wall_clock(result: ClientRun, truth: dict[str, dict]) -> None:
    """Move a client's monotonic request times onto the wall clock, for the CPU window.

    A request cannot reach the server's handler before it was sent, so the smallest
    ``received - start`` over the joined requests is the clock offset plus the shortest way in
    (well under a millisecond on loopback): close enough to cut a window of seconds.
    """
    monotonic = [r for r in result.requests if not r.wall_clock]
    offsets = [truth[r.join_id]["received"] - r.start for r in monotonic if r.join_id in truth]
    if not offsets:
        return
    offset = min(offsets)
    for request in monotonic:
        request.start += offset
        request.end += offset


def run_once(scenario: Scenario, concurrency: int, repeat: int, client: str, args: argparse.Namespace) -> dict:
    run_dir = os.path.join(args.out, scenario.name, f"c{concurrency}", f"r{repeat}", client)
    os.makedirs(run_dir, exist_ok=True)
    deadline = time.monotonic() + args.quiet_wait
    while os.getloadavg()[0] > args.quiet_load and time.monotonic() < deadline:
        time.sleep(5)
    port = free_port()
    truth_path = os.path.join(run_dir, "truth.jsonl")
    load_before = os.getloadavg()[0]
    server = start_simulator(scenario, port, truth_path, args.server_core, os.path.join(run_dir, "sim.log"), args.nice, args.realtime)
    work = Workload(
        endpoint=f"http://127.0.0.1:{port}",
        model=scenario.model,
        concurrency=concurrency,
        num_requests=scenario.num_requests(concurrency),
        input_len=scenario.input_len,
        output_len=scenario.output_len,
    )
    cmd = client_command(client, work, run_dir, args)
    env = dict(os.environ, HF_HUB_DISABLE_TELEMETRY="1", DO_NOT_TRACK="1")
    row = {
        "scenario": scenario.name,
        "concurrency": concurrency,
        "repeat": repeat,
        "client": client,
        "numRequests": work.num_requests,
        "command": cmd,
        "loadAverageBefore": load_before,
        "nice": args.nice,
        "realtime": args.realtime,
    }
    try:
        server_cpu = ProcessTreeCpu(server.pid).start()
        lag_before = engine_lag_seconds(port)
        with open(os.path.join(run_dir, "client.log"), "w") as log:
            process = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=pinned(args.client_core, args.nice, args.realtime),
                start_new_session=True,
                cwd=run_dir,
                env=env,
            )
        client_cpu = ProcessTreeCpu(process.pid).start()
        try:
            code = process.wait(CLIENT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            kill_session(process)
            code = -9
        except BaseException:  # interrupted: take the client's whole session down with us
            kill_session(process)
            raise
        client_cpu.stop()
        lag = engine_lag_seconds(port) - lag_before
        server_cpu.stop()
    finally:
        stop(server)
    row.update(
        exitCode=code,
        loadAverageAfter=os.getloadavg()[0],
        clientProcessesMax=client_cpu.max_processes,
        clientAffinities=sorted(client_cpu.affinities),
        engineLagSeconds=round(lag, 3),
    )
    try:
        result = read_client(client, run_dir)
    except (OSError, KeyError, ValueError) as error:
        row["error"] = f"no readable export ({type(error).__name__}: {error}); see {run_dir}/client.log"
        return row
    ok = [r for r in result.requests if r.ok]
    if not ok:
        row["error"] = f"no successful request; see {run_dir}/client.log"
        return row
    truth = read_truth(truth_path)
    align_to_wall_clock(result, truth)
    t0, t1 = result.measured_window()
    cores = client_cpu.cores_between(t0, t1)
    tokens_per_s = sum(r.output_tokens for r in ok) / (t1 - t0)
    row.update(
        measured=len(result.requests),
        failed=len(result.requests) - len(ok),
        windowSeconds=round(t1 - t0, 3),
        requestsPerSecond=len(ok) / (t1 - t0),
        outputTokensPerSecond=tokens_per_s,
        reportedRequestsPerSecond=result.reported_requests_per_s,
        reportedOutputTokensPerSecond=result.reported_output_tokens_per_s,
        clientCores=cores,
        tokensPerSecondPerClientCore=tokens_per_s / cores if cores > 0 else None,
        serverCores=server_cpu.cores_between(t0, t1),
    )
    joined = join(result, truth)
    if joined is not None:
        row["ttft"] = asdict(joined)
    return row


# --------------------------------------------------------------------------------------------
# Report


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _spread(values: list[float]) -> float:
    """(max - min) / mean, the spread between repeats."""
    m = _mean(values)
    return (max(values) - min(values)) / m if m else float("nan")


def aggregate(rows: list[dict]) -> dict[tuple[str, int, str], dict]:
    """Mean over repeats per (scenario, concurrency, client), with the spread of tokens/s."""
    groups: dict[tuple[str, int, str], list[dict]] = {}
    for row in rows:
        if "outputTokensPerSecond" in row:
            groups.setdefault((row["scenario"], row["concurrency"], row["client"]), []).append(row)
    out = {}
    for key, runs in groups.items():
        tps = [r["outputTokensPerSecond"] for r in runs]
        ttft = [r["ttft"] for r in runs if r.get("ttft")]
        out[key] = {
            "runs": len(runs),
            "rps": _mean([r["requestsPerSecond"] for r in runs]),
            "tps": _mean(tps),
            "tpsSpread": _spread(tps),
            "tpsRange": (min(tps), max(tps)),
            "reportedTps": _mean([r["reportedOutputTokensPerSecond"] or float("nan") for r in runs]),
            "cores": _mean([r["clientCores"] for r in runs]),
            "perCore": _mean([r["tokensPerSecondPerClientCore"] or float("nan") for r in runs]),
            "serverCores": _mean([r["serverCores"] for r in runs]),
            "lag": _mean([r["engineLagSeconds"] for r in runs]),
            "errP50": _mean([t["abs_error_p50_ms"] for t in ttft]) if ttft else float("nan"),
            "errP50Range": (min(t["abs_error_p50_ms"] for t in ttft), max(t["abs_error_p50_ms"] for t in ttft)) if ttft else None,
            "errP99": _mean([t["abs_error_p99_ms"] for t in ttft]) if ttft else float("nan"),
            "signedP50": _mean([t["signed_error_p50_ms"] for t in ttft]) if ttft else float("nan"),
            "sockP50": _mean([t.get("socket_abs_error_p50_ms", float("nan")) for t in ttft]) if ttft else float("nan"),
            "sockP99": _mean([t.get("socket_abs_error_p99_ms", float("nan")) for t in ttft]) if ttft else float("nan"),
            "sockSigned": _mean([t.get("socket_signed_error_p50_ms", float("nan")) for t in ttft]) if ttft else float("nan"),
            "wayIn": _mean([t.get("way_in_p50_ms", float("nan")) for t in ttft]) if ttft else float("nan"),
            "wayOut": _mean([t.get("way_out_p50_ms", float("nan")) for t in ttft]) if ttft else float("nan"),
            "injectedP50": _mean([t["injected_ttft_p50_ms"] for t in ttft]) if ttft else float("nan"),
            "prompt": _mean([t["served_prompt_tokens_p50"] for t in ttft]) if ttft else float("nan"),
            "joined": sum(t["joined"] for t in ttft),
            "unmatched": sum(t["unmatched"] for t in ttft),
            "failed": sum(r["failed"] for r in runs),
            "load": _mean([r["loadAverageBefore"] for r in runs]),
        }
    return out


CLIENT_ORDER = ("loadgen", *PEERS, "floor")


def render(rows: list[dict]) -> str:
    """Markdown: per scenario, the main table, the TTFT detail and the ratios to the best peer."""
    agg = aggregate(rows)
    lines = []
    scenarios = sorted({k[0] for k in agg}, key=lambda s: list(SCENARIOS).index(s) if s in SCENARIOS else 99)
    for scenario in scenarios:
        points = sorted({k[1] for k in agg if k[0] == scenario})
        cells = [(c, client, agg[(scenario, c, client)]) for c in points for client in CLIENT_ORDER if (scenario, c, client) in agg]
        lines += [
            f"\n### {scenario}: throughput, client CPU, median TTFT error\n",
            "| conc. | client | runs | req/s | output tok/s (spread) | client cores | tok/s per client core "
            "| TTFT abs. error P50 ms (range) | server cores | engine lag s | load avg |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for c, client, e in cells:
            rng = e["errP50Range"]
            err = f"{e['errP50']:.2f} ({rng[0]:.2f}-{rng[1]:.2f})" if rng else "n/a"
            lines.append(
                f"| {c} | {client} | {e['runs']} | {e['rps']:,.1f} | {e['tps']:,.0f} ({e['tpsSpread']:.0%}) "
                f"| {e['cores']:.2f} | {e['perCore']:,.0f} | {err} | {e['serverCores']:.2f} | {e['lag']:.2f} "
                f"| {e['load']:.1f} |"
            )
        lines += [
            f"\n### {scenario}: TTFT against the simulator's truth\n",
            "| conc. | client | vs injected: abs. P50 ms | abs. P99 ms | signed P50 ms "
            "| vs socket: abs. P50 ms | abs. P99 ms | signed P50 ms | way in P50 ms | way out P50 ms "
            "| injected TTFT P50 ms | prompt tokens served P50 | joined (unmatched) | failed | reported tok/s |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for c, client, e in cells:
            reported = f"{e['reportedTps']:,.0f}" if e["reportedTps"] == e["reportedTps"] else "-"
            lines.append(
                f"| {c} | {client} | {e['errP50']:.2f} | {e['errP99']:.2f} | {e['signedP50']:+.2f} "
                f"| {e['sockP50']:.2f} | {e['sockP99']:.2f} | {e['sockSigned']:+.2f} "
                f"| {e['wayIn']:.2f} | {e['wayOut']:.2f} | {e['injectedP50']:.1f} | {e['prompt']:.0f} "
                f"| {e['joined']} ({e['unmatched']}) | {e['failed']} | {reported} |"
            )
        lines += [
            f"\n### {scenario}: kneepoint loadgen against the best peer\n",
            "| conc. | tok/s: loadgen / best peer | tok/s per client core: loadgen / best peer "
            "| TTFT error vs injected, P50 ms: loadgen, best peer, floor "
            "| vs socket, P50 ms: loadgen, best peer, floor |",
            "|---:|---:|---:|---|---|",
        ]
        for c in points:
            mine = agg.get((scenario, c, "loadgen"))
            peers = [agg[(scenario, c, p)] for p in PEERS if (scenario, c, p) in agg]
            if not mine or not peers:
                continue
            floor = agg.get((scenario, c, "floor"))
            best_tps = max(p["tps"] for p in peers)
            best_core = max(p["perCore"] for p in peers)
            best_err = min(p["errP50"] for p in peers)
            floor_err = f"{floor['errP50']:.2f}" if floor else "n/a"
            floor_sock = f"{floor['sockP50']:.2f}" if floor else "n/a"
            best_sock = min(p["sockP50"] for p in peers)
            lines.append(
                f"| {c} | {mine['tps'] / best_tps:.2f}x | {mine['perCore'] / best_core:.2f}x "
                f"| {mine['errP50']:.2f}, {best_err:.2f}, {floor_err} "
                f"| {mine['sockP50']:.2f}, {best_sock:.2f}, {floor_sock} |"
            )
    return "\n".join(lines)


def rejoin(rows: list[dict], out: str) -> None:
    """Join the TTFTs again from the runs' exports (so the report follows ttft_truth_join.py)."""
    for row in rows:
        run_dir = os.path.join(out, row["scenario"], f"c{row['concurrency']}", f"r{row['repeat']}", row["client"])
        if "outputTokensPerSecond" not in row or not os.path.isfile(os.path.join(run_dir, "truth.jsonl")):
            continue
        joined = join(read_client(row["client"], run_dir), read_truth(os.path.join(run_dir, "truth.jsonl")))
        if joined is not None:
            row["ttft"] = asdict(joined)


# --------------------------------------------------------------------------------------------
# Main


def ensure_tokenizer(args: argparse.Namespace) -> None:
    if os.path.isfile(os.path.join(args.tokenizer, "tokenizer.json")):
        return
    python = os.path.join(args.peers_venv, "bin", "python")
    print(f"building the peers' tokenizer in {args.tokenizer}", flush=True)
    subprocess.run([python, os.path.join(HERE, "peer_tokenizer.py"), "--out", args.tokenizer], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", default="fast,realistic")
    parser.add_argument("--concurrency", default="1,16,64,256,512")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--clients", default="loadgen,aiperf,guidellm,vllm,floor")
    parser.add_argument("--peers-venv", default=os.path.expanduser("~/.cache/kneepoint/peers-venv"))
    parser.add_argument(
        "--vllm-venv",
        default=os.path.expanduser("~/.cache/kneepoint/vllm-venv"),
        help="the environment holding vllm (its bench serve runs without GPUs)",
    )
    parser.add_argument("--tokenizer", default=os.path.expanduser("~/.cache/kneepoint/bench-tokenizer"))
    parser.add_argument("--out", default=None, help="directory for exports and results.jsonl (default: a new one in /tmp)")
    parser.add_argument("--quiet-load", type=float, default=4.0, help="wait for a 1-minute load average under this")
    parser.add_argument("--quiet-wait", type=float, default=90.0, help="but at most this many seconds per run")
    parser.add_argument(
        "--nice",
        type=int,
        default=0,
        help="niceness of the simulator and the client (negative needs root): on a shared machine, less run-queue delay in the timestamps",
    )
    parser.add_argument(
        "--realtime",
        action="store_true",
        help="run the simulator and the client under SCHED_FIFO (root; only for scenarios that leave the cores mostly idle)",
    )
    parser.add_argument("--server-core", type=int, default=0)
    parser.add_argument("--client-core", type=int, default=1)
    parser.add_argument("--report", default=None, metavar="RESULTS_JSONL", help="only print the tables of a finished run")
    args = parser.parse_args()
    if args.report:
        with open(args.report, encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle]
        rejoin(rows, os.path.dirname(os.path.abspath(args.report)))
        print(render(rows))
        return 0
    # SIGTERM unwinds like Ctrl-C, so the running client and simulator are stopped too.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    args.out = args.out or f"/tmp/kneepoint-bench-{time.strftime('%Y%m%d-%H%M%S')}"
    os.makedirs(args.out, exist_ok=True)
    # The driver only polls; it shares the simulator's core so the client's core stays the client's.
    os.sched_setaffinity(0, {args.server_core})
    clients = [c.strip() for c in args.clients.split(",") if c.strip()]
    for peer in [c for c in clients if c in PEERS]:
        binary = os.path.join(peer_venv(peer, args), "bin", peer)
        if not os.access(binary, os.X_OK):
            print(f"skipping {peer}: {binary} not found (pip install it into its venv; see docs/benchmarks.md)")
            clients.remove(peer)
    if any(c in PEERS for c in clients):
        ensure_tokenizer(args)
    versions = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    for peer in [c for c in clients if c in PEERS]:
        peer_python = os.path.join(peer_venv(peer, args), "bin", "python")
        probe = subprocess.run(
            [peer_python, "-c", f"import importlib.metadata as m; print(m.version({peer!r}))"], capture_output=True, text=True
        )
        versions[peer] = probe.stdout.strip() or "?"
    with open(os.path.join(args.out, "versions.json"), "w", encoding="utf-8") as handle:
        json.dump(versions, handle)
    print(f"results: {args.out}/results.jsonl; server core {args.server_core}, client core {args.client_core}; {versions}", flush=True)
    results = os.path.join(args.out, "results.jsonl")
    rows = []
    done: set[tuple] = set()
    if os.path.isfile(results):  # resume an interrupted run: keep its finished runs
        with open(results, encoding="utf-8") as handle:
            rows = [json.loads(line) for line in handle]
        done = {(r["scenario"], r["concurrency"], r["repeat"], r["client"]) for r in rows}
    for name in args.scenarios.split(","):
        scenario = SCENARIOS[name]
        for concurrency in [int(c) for c in args.concurrency.split(",")]:
            for repeat in range(args.repeats):
                shift = repeat % len(clients)
                for client in clients[shift:] + clients[:shift]:
                    if (name, concurrency, repeat, client) in done:
                        continue
                    row = run_once(scenario, concurrency, repeat, client, args)
                    rows.append(row)
                    with open(results, "a", encoding="utf-8") as handle:
                        handle.write(json.dumps(row) + "\n")
                    brief = (
                        f"{row['outputTokensPerSecond']:,.0f} tok/s, client {row['clientCores']:.2f} cores, "
                        f"TTFT err P50 {row.get('ttft', {}).get('abs_error_p50_ms', float('nan')):.2f} ms"
                        if "outputTokensPerSecond" in row
                        else row.get("error", "?")
                    )
                    print(f"{name} c={concurrency} r={repeat} {client}: {brief} (load {row['loadAverageBefore']:.1f})", flush=True)
    print(render(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
