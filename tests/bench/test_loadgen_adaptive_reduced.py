"""The adaptive-stop benchmark in a reduced CI form: one case that stops, one plan, one seed.

Asserts what the rule promises on the simulator (deterministic on its simulated clock): no more
requests than the plan, the stop, and figures within the stated precision of the fixed plan's.
The full benchmark and its figures: benchmarks/loadgen_adaptive.py, docs/performance.md.
"""

from __future__ import annotations

from benchmark_scripts import load_benchmark


def _benchmark():
    return load_benchmark("loadgen_adaptive")


def test_the_adaptive_repeat_stops_early_and_lands_within_its_precision() -> None:
    bench = _benchmark()
    case = next(c for c in bench.CASES if c.concurrency == 64)
    plan = bench.AdaptivePlan()
    settings = bench.engine(case, 1)
    fixed, fixed_seconds, _, _ = bench.one_repeat(settings, case, 1000, None)
    adaptive, adaptive_seconds, rule, _ = bench.one_repeat(settings, case, 1000, plan)
    assert fixed.requests == 1000
    assert rule.stopped and rule.decision.completed >= 368 and adaptive.requests < 1000
    assert adaptive_seconds < fixed_seconds
    assert abs(adaptive.output_tokens_per_second / fixed.output_tokens_per_second - 1) <= plan.relative_precision
    assert abs(adaptive.latency_ms.p(99.0) / fixed.latency_ms.p(99.0) - 1) <= plan.relative_precision
    print(f"{case.name}: {adaptive.requests} of 1000 requests, {adaptive_seconds:.1f} of {fixed_seconds:.1f} simulated s")
