"""The concurrency-search cost benchmark in CI: the example, on virtual time.

Prints the benchmark's lines (the curve, the search's GPU-minutes against the ladder's);
fails when the example does not end searched with the replicas the curve gives. The
figures: benchmarks/concurrency_search_cost.py, docs/decision.md#measured.
"""

from __future__ import annotations

import math
from pathlib import Path

from benchmark_scripts import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


def _benchmark():
    return load_benchmark("concurrency_search_cost")


def test_the_example_is_searched_and_the_search_costs_gpu_minutes_of_its_own(capsys):
    bench = _benchmark()
    assert bench.main([]) == 0
    out = capsys.readouterr().out
    print(out)
    assert "(searched)" in out and "GPU-minutes: ladder" in out
    spec = bench.parse_spec(__import__("yaml").safe_load((ROOT / "deploy" / "examples" / "experiment.yaml").read_text())["spec"])
    status, _cluster, _wall = bench.run(spec, 60.0)
    decision = status.decision
    assert decision.per_replica_concurrency_source == "searched" and len(decision.concurrency_curve) >= 4
    assert decision.replicas == math.ceil(math.ceil(500 / decision.per_replica_concurrency) * 1.3 - 1e-9)
    assert status.concurrency_search.gpu_minutes > 0
