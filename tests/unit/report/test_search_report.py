"""The concurrency search in the report and the knee chart: the curve, the ranked alternatives, the second panel."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))

from ladder_driver import Driver
from test_concurrency_search import drive_search, measured_tp1, search_spec

from kneepoint.core.status import ExperimentStatus
from kneepoint.report.experiment_report import ReportInput, build_report, render_text
from kneepoint.report.knee_chart import ChartContext, build_knee_figure


def searched() -> Driver:
    d = measured_tp1(search_spec())
    drive_search(d)
    return d


def test_the_report_re_decides_with_the_search_and_prints_the_curve_and_the_ranking():
    d = searched()
    status: ExperimentStatus = d.status
    inp = ReportInput(spec=d.spec, spec_given=True, tiers=status.tiers, status=status.to_dict(), status_decision=status.decision)
    report = build_report(inp)
    assert report.decision_matches_status is True
    assert report.outcome.decision is not None and report.outcome.decision.per_replica_concurrency_source == "searched"
    text = render_text(report)
    assert "concurrency search on TP1 (--max-num-seqs 703, KV pool bound 703" in text
    assert "72  " in text and "<- per replica" in text
    assert "ranked alternatives" in text and "1. TP1: 72 per replica (searched), 10 replicas = 10 GPUs" in text


def test_the_knee_chart_gets_a_second_panel_with_the_curve_and_the_slo_line():
    d = searched()
    figure = build_knee_figure(d.status.tiers, d.status.decision, ChartContext(slo_latency_p99_ms=5000))
    gids = {line.get_gid() for ax in figure.axes for line in ax.get_lines()}
    assert {"curve-throughput", "curve-p99", "curve-slo", "curve-chosen", "curve-missed"} <= gids
    assert len(figure.axes) == 4  # two panels, each with its latency twin
    plain = build_knee_figure(d.status.tiers, None, ChartContext())
    assert len(plain.axes) == 2
