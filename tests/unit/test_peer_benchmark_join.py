"""The peer benchmark's bookkeeping: a vLLM bench export joined with the simulator's truth log.

vLLM's ``bench serve`` keeps monotonic times and no response ids, so the benchmark names its
requests through ``--request-id-prefix`` and moves its times onto the wall clock; a wrong
index or offset would silently compare a request with another one's truth.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

from clients_under_test import VLLM_REQUEST_ID_PREFIX, read_vllm  # noqa: E402 - after the sys.path entry above
from loadgen_vs_peers import align_to_wall_clock  # noqa: E402 - after the sys.path entry above
from ttft_truth_join import join, read_truth  # noqa: E402 - after the sys.path entry above

WALL = 1_800_000_000.0  # the simulator's wall clock at the first request
MONO = 5_000.0  # the client's perf_counter at the same moment


def _write(tmp_path: Path) -> None:
    # Three requests 1 s apart; the client measured TTFT = injected + 2 ms, except the failed one.
    export = {
        "request_throughput": 3.0,
        "output_throughput": 30.0,
        "start_times": [MONO, MONO + 1, MONO + 2],
        "latencies": [0.5, 0.5, 0.5],
        "ttfts": [0.012, 0.022, 0.0],
        "output_lens": [10, 10, 0],
        "errors": ["", "", "boom"],
    }
    (tmp_path / "vllm.json").write_text(json.dumps(export))
    truth = []
    for i, injected in enumerate((0.010, 0.020, 0.030)):
        received = WALL + i + 0.0003
        truth.append(
            {
                "id": f"chatcmpl-{VLLM_REQUEST_ID_PREFIX}{i}",
                "received": received,
                "arrival": received + 0.0001,
                "firstToken": received + injected,
                "firstWrite": received + injected + 0.0001,
                "finish": received + 0.5,
                "ttftSeconds": injected,
                "socketTtftSeconds": injected + 0.0001,
                "promptTokens": 128,
                "outputTokens": 10,
            }
        )
    # A warm-up request the simulator named itself: not joined with anything.
    truth.append({**truth[0], "id": "chatcmpl-d82c07cd00000001"})
    (tmp_path / "truth.jsonl").write_text("".join(json.dumps(row) + "\n" for row in truth))


def test_vllm_requests_join_their_own_truth_line_by_index(tmp_path: Path) -> None:
    _write(tmp_path)
    run = read_vllm(str(tmp_path))
    assert [r.join_id for r in run.requests] == [f"chatcmpl-{VLLM_REQUEST_ID_PREFIX}{i}" for i in range(3)]
    assert [r.ok for r in run.requests] == [True, True, False]
    joined = join(run, read_truth(str(tmp_path / "truth.jsonl")))
    assert joined is not None
    assert joined.joined == 2 and joined.unmatched == 0
    assert math.isclose(joined.signed_error_p50_ms, 2.0, abs_tol=1e-6)
    # Monotonic client times say nothing about the way in and out.
    assert math.isnan(joined.way_in_p50_ms) and math.isnan(joined.way_out_p50_ms)


def test_monotonic_times_move_onto_the_wall_clock_within_the_shortest_way_in(tmp_path: Path) -> None:
    _write(tmp_path)
    run = read_vllm(str(tmp_path))
    align_to_wall_clock(run, read_truth(str(tmp_path / "truth.jsonl")))
    start, end = run.measured_window()
    assert math.isclose(start, WALL + 0.0003, abs_tol=1e-6)  # the offset absorbs the 0.3 ms way in
    assert math.isclose(end, WALL + 2.5003, abs_tol=1e-6)
