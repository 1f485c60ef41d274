"""Plain-text renderings of the record: the tier table, comparison blocks and the decision.

These are what a person reads (``kneepoint decide``, the Decided event, docs), so they
follow DESIGN.md's form to the letter:

    TP2 -> TP4: T2=1236 tok/s T4=1897 tok/s ΔT=+0.54; P2=6764 ms P4=4395 ms ΔP=-0.35; M2=70.9 GiB M4=35.6 GiB
    conclusion: go on to TP4

Subscripts are GPU counts (TP2 -> 2, TP8xPP2 -> 16), unique along a ladder. A segment
``C2=… C4=…`` (communication share) is appended when the larger tier reports one, because
the comm-fraction rule reads it. Standard library only; no table library.
"""

from __future__ import annotations

from collections.abc import Sequence

from kneepoint.core.status import TIER_FAILED, TIER_SKIPPED, Decision, TierResult
from kneepoint.core.stop_rules import RULE_COLUMNS, format_fraction, tier_label

MISSING = "n/a"


def format_quantity(value: float | None) -> str:
    """Throughput or milliseconds: whole numbers from 100 up, more digits below."""
    if value is None:
        return MISSING
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def format_gib(value: float | None) -> str:
    return MISSING if value is None else f"{value:.1f}"


def format_comparison_line(
    previous: TierResult,
    current: TierResult,
    throughput_gain: float | None,
    p99_change: float | None,
    min_throughput_gain: float | None = None,
    max_p99_degradation: float | None = None,
) -> str:
    """``TPa -> TPb: Ta=… tok/s Tb=… tok/s ΔT=…; Pa=… ms Pb=… ms ΔP=…; Ma=… GiB Mb=… GiB[; Ca=… Cb=…[ skewb=…]]``."""
    a, b = previous.gpus, current.gpus
    dt = MISSING if throughput_gain is None else format_fraction(throughput_gain, min_throughput_gain)
    dp = MISSING if p99_change is None else format_fraction(p99_change, max_p99_degradation)
    line = (
        f"{tier_label(previous)} -> {tier_label(current)}: "
        f"T{a}={format_quantity(previous.output_tokens_per_second)} tok/s T{b}={format_quantity(current.output_tokens_per_second)} tok/s ΔT={dt}; "
        f"P{a}={format_quantity(previous.latency_p99_ms)} ms P{b}={format_quantity(current.latency_p99_ms)} ms ΔP={dp}; "
        f"M{a}={format_gib(previous.peak_memory_gi_b)} GiB M{b}={format_gib(current.peak_memory_gi_b)} GiB"
    )
    if current.comm_fraction is not None:
        ca = MISSING if previous.comm_fraction is None else f"{previous.comm_fraction:.2f}"
        line += f"; C{a}={ca} C{b}={current.comm_fraction:.2f}"
        if current.rank_skew_fraction is not None:
            # Waiting between ranks inside collectives (docs/trace.md): not part of C.
            line += f" skew{b}={current.rank_skew_fraction:.2f}"
    return line


def format_memory_line(tier: TierResult, gpu_memory_gib: float | None, share: float | None, memory_headroom: float) -> str:
    """``TP1: M1=… GiB of … GiB = 0.37 (memoryHeadroom 0.85)`` for the 1-GPU baseline."""
    capacity = MISSING if gpu_memory_gib is None else f"{gpu_memory_gib:.1f}"
    shown = MISSING if share is None else format_fraction(share, memory_headroom, signed=False)
    return (
        f"{tier_label(tier)}: T1={format_quantity(tier.output_tokens_per_second)} tok/s; "
        f"P1={format_quantity(tier.latency_p99_ms)} ms; "
        f"M1={format_gib(tier.peak_memory_gi_b)} GiB of {capacity} GiB = {shown} (memoryHeadroom {memory_headroom:.2f})"
    )


def format_stay(stay_at: str, rule: str, also_fired: Sequence[str] = ()) -> str:
    """``conclusion: stay at TP2 (rule: throughput-gain, column ΔT)``."""
    column = RULE_COLUMNS.get(rule)
    text = f"conclusion: stay at {stay_at} (rule: {rule}" + (f", column {column})" if column else ")")
    if also_fired:
        text += "; also fired: " + ", ".join(f"{r} (column {RULE_COLUMNS[r]})" for r in also_fired)
    return text


def format_go_on(to: str) -> str:
    return f"conclusion: go on to {to}"


def format_tier_line(tier: TierResult) -> str:
    """``TP2: T2=… tok/s; P2=… ms; M2=… GiB`` for a tier with nothing to compare with."""
    n = tier.gpus
    return (
        f"{tier_label(tier)}: T{n}={format_quantity(tier.output_tokens_per_second)} tok/s; "
        f"P{n}={format_quantity(tier.latency_p99_ms)} ms; M{n}={format_gib(tier.peak_memory_gi_b)} GiB"
    )


def _cell(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _percentiles(*values: float | None) -> str:
    if all(v is None for v in values):
        return "-"
    return "/".join("-" if v is None else format_quantity(v) for v in values)


_COLUMNS = (
    # header, right-aligned
    ("tier", False),
    ("GPUs", True),
    ("phase", False),
    ("out tok/s", True),
    ("req/s", True),
    ("TTFT P50/P95/P99 ms", True),
    ("latency P50/P95/P99 ms", True),
    ("needed GiB (M)", True),
    ("alloc GiB", True),
    ("comm (C)", True),
    ("ΔT", True),
    ("ΔP", True),
    ("cost/M tok", True),
    ("reason", False),
)

RECORD_HEADERS = tuple(header for header, _ in _COLUMNS)
"""The record table's column headers, in the order :func:`record_row` returns cells (for other renderings)."""


def gpus_cell(tier: TierResult) -> str:
    """GPUs per replica; a multi-node tier also says over how many nodes (``16 (2 nodes)``)."""
    if tier.multi_node and tier.nodes:
        return f"{tier.gpus} ({tier.nodes} nodes)"
    return str(tier.gpus)


def record_row(tier: TierResult) -> list[str]:
    """One tier as the table's cells, in column order."""
    reason = tier.reason if tier.phase in (TIER_SKIPPED, TIER_FAILED) and tier.reason else ""
    if tier.phase in (TIER_SKIPPED, TIER_FAILED) and tier.does_not_fit and not reason.startswith("does not fit"):
        reason = "does not fit" + (f": {reason}" if reason else "")
    return [
        tier_label(tier),
        gpus_cell(tier),
        tier.phase,
        _cell(tier.output_tokens_per_second, ".0f"),
        _cell(tier.requests_per_second, ".2f"),
        _percentiles(tier.ttft_p50_ms, tier.ttft_p95_ms, tier.ttft_p99_ms),
        _percentiles(tier.latency_p50_ms, tier.latency_p95_ms, tier.latency_p99_ms),
        _cell(tier.peak_memory_gi_b, ".1f"),
        _cell(tier.allocated_memory_gi_b, ".1f"),
        _cell(tier.comm_fraction, ".2f"),
        "-" if tier.throughput_gain is None else format_fraction(tier.throughput_gain),
        "-" if tier.p99_change is None else format_fraction(tier.p99_change),
        _cell(tier.cost_per_million_tokens, ".2f"),
        reason,
    ]


def format_record_table(tiers: Sequence[TierResult]) -> str:
    """The record table: one row per tier, aligned columns, a rule under the header."""
    headers = [h for h, _ in _COLUMNS]
    rows = [record_row(t) for t in tiers]
    widths = [max(len(headers[i]), *(len(r[i]) for r in rows)) if rows else len(headers[i]) for i in range(len(headers))]

    def render(cells: list[str]) -> str:
        out = []
        for i, cell in enumerate(cells):
            right = _COLUMNS[i][1]
            last = i == len(cells) - 1
            out.append(cell.rjust(widths[i]) if right else (cell if last else cell.ljust(widths[i])))
        return "  ".join(out).rstrip()

    lines = [render(headers), render(["-" * w for w in widths[:-1]] + ["-" * len(headers[-1])])]
    lines += [render(r) for r in rows]
    return "\n".join(lines)


def _slo_text(decision: Decision) -> str:
    if decision.slo_met is not None:
        return "yes" if decision.slo_met else "no"
    return "not checked (a figure is missing)" if decision.per_replica_concurrency_source == "unchecked" else "no SLO set"


def format_decision(decision: Decision, capacity_explanation: str | None = None) -> str:
    """The decision as a few labelled lines."""
    label = tier_label(TierResult(tensor_parallel=decision.tensor_parallel, pipeline_parallel=decision.pipeline_parallel))
    lines = [
        f"decision: {label} ({decision.gpus_per_replica} GPU{'s' if decision.gpus_per_replica != 1 else ''} per replica), "
        f"rule {decision.rule}"
        + (f" (fired: {', '.join(decision.rules_fired)})" if decision.rules_fired and len(decision.rules_fired) > 1 else ""),
        f"classification: {decision.classification}",
        *(
            [
                f"multi-node: one replica spans {decision.nodes} nodes ({decision.tensor_parallel} GPUs per node, "
                f"pipeline parallel across nodes; LeaderWorkerSet, KServe workerSpec)"
            ]
            if decision.multi_node
            else []
        ),
        f"replicas: {decision.replicas} (total GPUs {decision.total_gpus if decision.total_gpus is not None else decision.replicas * decision.gpus_per_replica})",
        f"per-replica concurrency: {decision.per_replica_concurrency} ({decision.per_replica_concurrency_source})",
        "SLO met at the load-test concurrency: " + _slo_text(decision),
    ]
    if decision.cost_per_million_tokens is not None:
        lines.append(f"cost per million output tokens: {decision.cost_per_million_tokens:.2f}")
    if capacity_explanation:
        lines.append(f"capacity: {capacity_explanation}")
    if decision.unevaluated_rules:
        lines.append(f"not evaluated (missing metrics): {', '.join(decision.unevaluated_rules)}")
    if decision.simulated:
        lines.append("simulated: yes (engine simulator, not GPUs)")
    lines.append("reason:")
    lines += [f"  {line}" for line in decision.reason.splitlines()]
    return "\n".join(lines)
