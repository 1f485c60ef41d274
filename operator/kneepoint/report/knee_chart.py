"""The knee chart: throughput and P99 latency against GPUs per replica, with the decided tier marked.

One figure answers "where does one more GPU stop paying?": output tokens/s (left axis)
and P99 end-to-end latency (right axis) per tier on a log2 axis of GPUs per replica, the
throughput gain ΔT written on each step, tiers that were skipped or failed marked at the
bottom, the latency SLO as a dotted line, and the decided tier (the knee) starred and
annotated with the stop rule that chose it.

Built on ``matplotlib.figure.Figure`` with the Agg canvas, never pyplot: no global figure
state, no display needed, safe in a pod or a test. Artists that tests look for carry a
``gid`` (``throughput``, ``p99``, ``knee``, ``knee-line``, ``slo``, ``skipped``,
``failed``, ``not-measured``, ``comm``: the communication share per tier along the bottom).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullLocator

from kneepoint.core.decision import REMAINING_PHASES
from kneepoint.core.status import TIER_FAILED, TIER_MEASURED, TIER_SKIPPED, Decision, TierResult
from kneepoint.core.stop_rules import format_fraction, relative_change, tier_label
from kneepoint.report.chart_context import ChartContext

FIGURE_SIZE_INCHES = (9.0, 5.6)
DPI = 150  # 1350 x 840 px: sharp in a README, small enough to commit

THROUGHPUT_COLOUR = "#1f5fa8"
LATENCY_COLOUR = "#d2691e"
KNEE_COLOUR = "#c0162b"
SKIPPED_COLOUR = "#6b6b6b"
FAILED_COLOUR = "#b00020"
COMM_COLOUR = "#4b7d3a"
TTFT_COLOUR = "#7a3fa0"

X_LABEL = "GPUs per replica (tier; log2 scale)"
THROUGHPUT_LABEL = "Output throughput (tokens/s)"
LATENCY_LABEL = "P99 end-to-end latency (ms)"


def chart_title(context: ChartContext, decision: Decision | None) -> str:
    """``MODEL on GPU: throughput and P99 per tier`` plus a SIMULATED marker and the workload."""
    subject = context.model or "experiment"
    if context.gpu_product:
        subject += f" on {context.gpu_product}"
    lines = [f"{subject}: throughput and P99 latency per tier"]
    second = []
    if context.simulated:
        second.append("SIMULATED (engine simulator, not GPUs)")
    if context.workload:
        second.append(context.workload)
    if decision is None:
        second.append("no decision yet")
    if second:
        lines.append("; ".join(second))
    return "\n".join(lines)


def _tier_tick(tier: TierResult) -> str:
    return f"{tier_label(tier)}\n{tier.gpus} GPU{'s' if tier.gpus != 1 else ''}"


def _knee_text(decision: Decision, tier: TierResult | None) -> str:
    label = tier_label(TierResult(tensor_parallel=decision.tensor_parallel, pipeline_parallel=decision.pipeline_parallel))
    lines = [f"knee: {label} x {decision.replicas} replica{'s' if decision.replicas != 1 else ''}"]
    if tier is not None and tier.output_tokens_per_second is not None:
        lines.append(f"{tier.output_tokens_per_second:,.0f} tokens/s per replica")
    lines.append(f"rule: {decision.rule}")
    return "\n".join(lines)


def _marker_kind(tier: TierResult) -> tuple[str, str] | None:
    """(gid, legend label) for a tier that has no measurement to plot, or None for a measured one."""
    if tier.phase == TIER_MEASURED:
        return None
    if tier.phase == TIER_FAILED:
        return "failed", "failed" + (" (does not fit)" if tier.does_not_fit else "")
    if tier.phase == TIER_SKIPPED:
        return "skipped", "skipped (does not fit)" if tier.does_not_fit else "skipped (not needed)"
    if tier.phase in REMAINING_PHASES:
        return "not-measured", "not measured yet"
    return "not-measured", tier.phase  # pragma: no cover - every phase is covered above


def _y(value: float | None) -> float:
    """A value to plot; None is NaN, which matplotlib leaves out of the line (as it does None)."""
    return math.nan if value is None else value


_MARKER_STYLE: dict[str, dict[str, Any]] = {
    "skipped": dict(marker="x", color=SKIPPED_COLOUR, markersize=11, markeredgewidth=2.2),
    "failed": dict(marker="X", color=FAILED_COLOUR, markersize=11, markeredgewidth=1.0),
    "not-measured": dict(marker="o", color=SKIPPED_COLOUR, markerfacecolor="none", markersize=9, markeredgewidth=1.5),
}


def build_knee_figure(tiers: Sequence[TierResult], decision: Decision | None, context: ChartContext = ChartContext()) -> Figure:
    """The knee chart for ``tiers`` (ladder order) and the decision (None: not decided yet)."""
    curve = decision.concurrency_curve if decision is not None else None
    width, height = FIGURE_SIZE_INCHES
    figure = Figure(figsize=(width * 1.8, height) if curve else FIGURE_SIZE_INCHES, dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    ax = figure.add_subplot(1, 2, 1) if curve else figure.add_subplot()
    ax2 = ax.twinx()
    ax.set_zorder(ax2.get_zorder() + 1)  # throughput and the knee above the latency line
    ax.patch.set_visible(False)

    measured = [t for t in tiers if t.phase == TIER_MEASURED and t.output_tokens_per_second is not None]
    with_p99 = [t for t in measured if t.latency_p99_ms is not None]

    # x axis: GPUs per replica on log2, one tick per tier of the ladder, labelled TPn / TPnxPPm.
    gpus = sorted({t.gpus for t in tiers}) or [1]
    ax.set_xscale("log", base=2)
    ax.set_xlim(gpus[0] / 1.6, gpus[-1] * 1.6)
    by_gpus = {t.gpus: t for t in tiers}
    ax.set_xticks(gpus, [_tier_tick(by_gpus[g]) if g in by_gpus else str(g) for g in gpus])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(X_LABEL)
    ax.set_ylabel(THROUGHPUT_LABEL, color=THROUGHPUT_COLOUR)
    ax2.set_ylabel(LATENCY_LABEL, color=LATENCY_COLOUR)
    ax.tick_params(axis="y", colors=THROUGHPUT_COLOUR)
    ax2.tick_params(axis="y", colors=LATENCY_COLOUR)
    ax.grid(True, which="major", alpha=0.3)

    top_tps = max((t.output_tokens_per_second or 0.0 for t in measured), default=0.0)
    ax.set_ylim(0, top_tps * 1.3 if top_tps > 0 else 1.0)
    top_p99 = max([t.latency_p99_ms or 0.0 for t in with_p99] + [context.slo_latency_p99_ms or 0.0])
    ax2.set_ylim(0, top_p99 * 1.3 if top_p99 > 0 else 1.0)

    handles: list[Line2D] = []
    if measured:
        (line,) = ax.plot(
            [t.gpus for t in measured],
            [_y(t.output_tokens_per_second) for t in measured],
            "o-",
            color=THROUGHPUT_COLOUR,
            linewidth=2.2,
            markersize=7,
            label="output throughput (tokens/s)",
            gid="throughput",
        )
        handles.append(line)
        knee_gpus = decision.gpus_per_replica if decision is not None else None
        for t in measured:
            if t.gpus == knee_gpus:
                continue  # the knee's annotation carries its number; a label here would sit under the star
            ax.annotate(
                f"{t.output_tokens_per_second:,.0f}",
                (t.gpus, t.output_tokens_per_second),
                textcoords="offset points",
                xytext=(0, 9),
                ha="center",
                fontsize=8,
                color=THROUGHPUT_COLOUR,
            )
        # ΔT on each step between consecutive measured tiers: the number the knee is read from.
        for a, b in zip(measured, measured[1:]):
            gain = relative_change(b.output_tokens_per_second, a.output_tokens_per_second)
            if gain is None:
                continue
            mid_x = math.sqrt(a.gpus * b.gpus)
            mid_y = ((a.output_tokens_per_second or 0.0) + (b.output_tokens_per_second or 0.0)) / 2
            ax.annotate(
                f"ΔT {format_fraction(gain)}",
                (mid_x, mid_y),
                textcoords="offset points",
                xytext=(0, -16),
                ha="center",
                fontsize=8,
                color=THROUGHPUT_COLOUR,
                bbox=dict(boxstyle="round,pad=0.2", facecolor="white", edgecolor="none", alpha=0.85),
            )
    # The communication share per tier (commFraction, and the ranks' waiting), along the bottom
    # (where only unmeasured tiers put their marks): the number the comm-fraction rule reads.
    for t in measured:
        if t.comm_fraction is None:
            continue
        text = f"C {t.comm_fraction:.2f}" + ("" if t.rank_skew_fraction is None else f"\nskew {t.rank_skew_fraction:.2f}")
        ax.text(
            t.gpus, 0.02, text, transform=ax.get_xaxis_transform(), ha="center", va="bottom", fontsize=7.5, color=COMM_COLOUR, gid="comm"
        )
    if with_p99:
        (line,) = ax2.plot(
            [t.gpus for t in with_p99],
            [_y(t.latency_p99_ms) for t in with_p99],
            "s--",
            color=LATENCY_COLOUR,
            linewidth=1.8,
            markersize=6,
            label="P99 latency (ms)",
            gid="p99",
        )
        handles.append(line)
        for t in with_p99:
            ax2.annotate(
                f"{t.latency_p99_ms:,.0f} ms",
                (t.gpus, t.latency_p99_ms),
                textcoords="offset points",
                xytext=(0, -14),
                ha="center",
                fontsize=8,
                color=LATENCY_COLOUR,
            )
    if context.slo_latency_p99_ms:
        slo = ax2.axhline(
            context.slo_latency_p99_ms,
            color=LATENCY_COLOUR,
            linestyle=":",
            linewidth=1.4,
            label=f"P99 SLO ({context.slo_latency_p99_ms:,.0f} ms)",
            gid="slo",
        )
        handles.append(slo)

    # Tiers without a measurement: a marker on the x axis, one legend entry per kind.
    groups: dict[tuple[str, str], list[TierResult]] = {}
    for t in tiers:
        kind = _marker_kind(t)
        if kind is not None:
            groups.setdefault(kind, []).append(t)
    for (gid, label), members in groups.items():
        (marks,) = ax.plot(
            [t.gpus for t in members],
            [0.035] * len(members),
            linestyle="none",
            transform=ax.get_xaxis_transform(),  # x in data, y in axes fraction: always at the bottom
            clip_on=False,
            label=label,
            gid=gid,
            zorder=4,
            **_MARKER_STYLE[gid],
        )
        handles.append(marks)
        for t in members:
            ax.annotate(
                "does not fit" if t.does_not_fit else t.phase.lower(),
                (t.gpus, 0.035),
                xycoords=ax.get_xaxis_transform(),
                textcoords="offset points",
                xytext=(0, 10),
                ha="center",
                fontsize=8,
                color=_MARKER_STYLE[gid]["color"],
            )
    if not measured:
        ax.set_yticks([])  # an empty 0-1 scale would read as measured zeros
        ax.text(0.5, 0.55, "no tier was measured", transform=ax.transAxes, ha="center", va="center", fontsize=12, color=SKIPPED_COLOUR)

    if decision is not None:
        knee_x = decision.gpus_per_replica or decision.tensor_parallel * decision.pipeline_parallel
        ax.axvline(knee_x, color=KNEE_COLOUR, linewidth=6, alpha=0.12, gid="knee-line")
        knee_tier = next((t for t in measured if t.gpus == knee_x), None)
        knee_y = knee_tier.output_tokens_per_second if knee_tier else ax.get_ylim()[1] * 0.5
        (knee,) = ax.plot(
            [knee_x],
            [_y(knee_y)],
            linestyle="none",
            marker="*",
            markersize=22,
            color=KNEE_COLOUR,
            markeredgecolor="white",
            markeredgewidth=1.0,
            label=f"decided tier (knee), rule {decision.rule}",
            gid="knee",
            zorder=6,
        )
        handles.append(knee)
        # Annotation toward the middle of the plot, so it never leaves the axes.
        rightmost = knee_x >= gpus[-1] and len(gpus) > 1
        ax.annotate(
            _knee_text(decision, knee_tier),
            (knee_x, knee_y),
            textcoords="offset points",
            xytext=(-24 if rightmost else 24, 22),
            ha="right" if rightmost else "left",
            va="bottom",
            fontsize=9,
            fontweight="bold",
            color=KNEE_COLOUR,
            arrowprops=dict(arrowstyle="-", color=KNEE_COLOUR, linewidth=1.0),
            bbox=dict(boxstyle="round,pad=0.3", facecolor="white", edgecolor=KNEE_COLOUR, alpha=0.95),
            zorder=7,
            gid="knee-annotation",
        )

    if curve and decision is not None:
        _curve_panel(figure.add_subplot(1, 2, 2), decision, context)
    figure.suptitle(chart_title(context, decision), fontsize=11)
    figure.legend(handles=handles, loc="outside lower center", ncols=min(4, max(1, len(handles))), fontsize=8.5, frameon=False)
    return figure


def _curve_panel(ax: Any, decision: Decision, context: ChartContext) -> None:
    """The second panel: the decided tier's concurrency search (throughput and P99 per concurrency, the SLO line)."""
    points = sorted(decision.concurrency_curve or (), key=lambda p: p.concurrency)
    ax2 = ax.twinx()
    ax.set_zorder(ax2.get_zorder() + 1)
    ax.patch.set_visible(False)
    xs = [p.concurrency for p in points]
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency per replica (requests in flight)")
    ax.set_ylabel(THROUGHPUT_LABEL, color=THROUGHPUT_COLOUR)
    ax2.set_ylabel("P99 latency and TTFT P95 (ms)", color=LATENCY_COLOUR)
    ax.tick_params(axis="y", colors=THROUGHPUT_COLOUR)
    ax2.tick_params(axis="y", colors=LATENCY_COLOUR)
    ax.grid(True, which="major", alpha=0.3)
    ax.plot(xs, [_y(p.output_tokens_per_second) for p in points], "o-", color=THROUGHPUT_COLOUR, linewidth=2.0, gid="curve-throughput")
    ax.set_xticks(xs, [str(x) for x in xs], fontsize=7.5)
    ax.xaxis.set_minor_locator(NullLocator())
    ax2.plot(xs, [_y(p.latency_p99_ms) for p in points], "s--", color=LATENCY_COLOUR, linewidth=1.6, label="P99", gid="curve-p99")
    with_ttft = [p for p in points if p.ttft_p95_ms is not None]
    if with_ttft:
        ax2.plot(
            [p.concurrency for p in with_ttft],
            [_y(p.ttft_p95_ms) for p in with_ttft],
            "^-.",
            color=TTFT_COLOUR,
            linewidth=1.4,
            label="TTFT P95",
            gid="curve-ttft",
        )
    missed = [p for p in points if p.slo_met is False]
    if missed:
        ax.plot(
            [p.concurrency for p in missed],
            [_y(p.output_tokens_per_second) for p in missed],
            "x",
            color=KNEE_COLOUR,
            markersize=11,
            markeredgewidth=2,
            gid="curve-missed",
        )
    top_tps = max((p.output_tokens_per_second or 0.0 for p in points), default=0.0)
    ax.set_ylim(0, top_tps * 1.3 if top_tps > 0 else 1.0)
    top_ms = max(
        [p.latency_p99_ms or 0.0 for p in points]
        + [p.ttft_p95_ms or 0.0 for p in points]
        + [context.slo_latency_p99_ms or 0.0, context.slo_ttft_p95_ms or 0.0]
    )
    ax2.set_ylim(0, top_ms * 1.3 if top_ms > 0 else 1.0)
    if context.slo_latency_p99_ms:
        ax2.axhline(context.slo_latency_p99_ms, color=LATENCY_COLOUR, linestyle=":", linewidth=1.4, label="P99 SLO", gid="curve-slo")
    if context.slo_ttft_p95_ms:
        ax2.axhline(context.slo_ttft_p95_ms, color=TTFT_COLOUR, linestyle=":", linewidth=1.4, label="TTFT P95 SLO", gid="curve-ttft-slo")
    ax2.legend(loc="lower right", fontsize=7.5, frameon=False)
    chosen = decision.per_replica_concurrency
    if chosen:
        ax.axvline(chosen, color=KNEE_COLOUR, linewidth=6, alpha=0.12, gid="curve-chosen")
        ax.annotate(
            f"{chosen} per replica ({decision.per_replica_concurrency_source})\n{decision.replicas} replicas",
            (chosen, ax.get_ylim()[1] * 0.92),
            ha="center",
            va="top",
            fontsize=9,
            fontweight="bold",
            color=KNEE_COLOUR,
            bbox=dict(boxstyle="round,pad=0.3", facecolor="white", edgecolor=KNEE_COLOUR, alpha=0.95),
        )
    ax.set_title("decided tier: concurrency search (x: an SLO objective missed)", fontsize=9.5)


def save_png(figure: Figure, path: str) -> None:
    """Write the figure as PNG (OSError on a path that cannot be written)."""
    figure.savefig(path, format="png", dpi=DPI)
