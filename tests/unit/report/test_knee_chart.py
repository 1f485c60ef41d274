"""The knee chart's figure: labelled axes with units, tier ticks on log2, the knee, the legend, the PNG."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
import yaml
from PIL import Image

from kneepoint.core.decision import decide
from kneepoint.core.spec import parse_spec
from kneepoint.core.status import TierResult
from kneepoint.report.knee_chart import DPI, FIGURE_SIZE_INCHES, ChartContext, build_knee_figure, save_png

ROOT = Path(__file__).resolve().parents[3]
RECORDED = ROOT / "deploy" / "examples" / "recorded-h200.yaml"
H200 = ChartContext(model="meta-llama/Meta-Llama-3-70B", gpu_product="NVIDIA-H200", workload="concurrency 32", slo_latency_p99_ms=5000)


def T(tp: int, pp: int = 1, phase: str = "Measured", tps: float | None = None, p99: float | None = None, **kw) -> TierResult:
    return TierResult(
        tensor_parallel=tp,
        pipeline_parallel=pp,
        gpus=tp * pp,
        name=f"tp{tp}-pp{pp}",
        phase=phase,
        output_tokens_per_second=tps,
        latency_p99_ms=p99,
        **kw,
    )


def spec(tp=(1, 2, 4, 8), pp=(1,)):
    return parse_spec({"model": {"uri": "hf://example/m"}, "tiers": {"tensorParallel": list(tp), "pipelineParallel": list(pp)}})


def recorded_figure():
    from kneepoint.commands.experiment_source import read_file

    exp = read_file(str(RECORDED))
    outcome = decide(exp.spec, exp.tiers)
    return build_knee_figure(outcome.tiers, outcome.decision, H200), outcome


def by_gid(figure, gid: str):
    return figure.findobj(lambda artist: artist.get_gid() == gid)


def legend_texts(figure) -> list[str]:
    assert len(figure.legends) == 1
    return [t.get_text() for t in figure.legends[0].get_texts()]


def test_recorded_h200_axes_are_labelled_with_units_and_tier_ticks():
    figure, _ = recorded_figure()
    ax, ax2 = figure.axes
    assert ax.get_xlabel() == "GPUs per replica (tier; log2 scale)"
    assert ax.get_ylabel() == "Output throughput (tokens/s)"
    assert ax2.get_ylabel() == "P99 end-to-end latency (ms)"
    assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
    assert list(ax.get_xticks()) == [1, 2, 4]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["TP1\n1 GPU", "TP2\n2 GPUs", "TP4\n4 GPUs"]
    title = figure.get_suptitle()
    assert "meta-llama/Meta-Llama-3-70B on NVIDIA-H200" in title and "SIMULATED" not in title


def test_recorded_h200_knee_marker_at_the_decided_tier_with_the_rule():
    figure, outcome = recorded_figure()
    assert outcome.decision.tensor_parallel == 4
    (knee,) = by_gid(figure, "knee")
    assert list(knee.get_xdata()) == [4]
    assert list(knee.get_ydata()) == pytest.approx([1897.09])
    (annotation,) = by_gid(figure, "knee-annotation")
    assert "knee: TP4 x 11 replicas" in annotation.get_text() and "rule: last-tier" in annotation.get_text()
    (band,) = by_gid(figure, "knee-line")
    assert list(band.get_xdata()) == [4, 4]


def test_recorded_h200_lines_markers_and_legend():
    figure, _ = recorded_figure()
    (throughput,) = by_gid(figure, "throughput")
    assert list(throughput.get_xdata()) == [2, 4] and throughput.get_marker() == "o"
    (p99,) = by_gid(figure, "p99")
    assert list(p99.get_ydata()) == pytest.approx([6764.3, 4394.8])
    (skipped,) = by_gid(figure, "skipped")
    assert list(skipped.get_xdata()) == [1] and skipped.get_marker() == "x"
    (slo,) = by_gid(figure, "slo")
    assert list(slo.get_ydata()) == [5000, 5000]
    assert legend_texts(figure) == [
        "output throughput (tokens/s)",
        "P99 latency (ms)",
        "P99 SLO (5,000 ms)",
        "skipped (does not fit)",
        "decided tier (knee), rule last-tier",
    ]
    texts = [t.get_text() for t in figure.axes[0].texts]
    assert "ΔT +0.54" in texts and "does not fit" in texts


def test_failed_middle_tier_is_marked_and_the_knee_names_throughput_gain():
    tiers = [T(1, tps=500, p99=12000), T(2, phase="Failed", reason="CrashLoopBackOff"), T(4, tps=1400, p99=6000), T(8, tps=1500, p99=6100)]
    outcome = decide(spec(), tiers)
    figure = build_knee_figure(outcome.tiers, outcome.decision)
    (failed,) = by_gid(figure, "failed")
    assert list(failed.get_xdata()) == [2] and failed.get_marker() == "X"
    (throughput,) = by_gid(figure, "throughput")
    assert list(throughput.get_xdata()) == [1, 4, 8]
    (knee,) = by_gid(figure, "knee")
    assert list(knee.get_xdata()) == [4]
    assert "failed" in legend_texts(figure)
    assert "decided tier (knee), rule throughput-gain" in legend_texts(figure)


def test_pp_tier_tick_and_knee():
    tiers = [
        T(1, phase="Skipped", does_not_fit=True),
        T(2, phase="Skipped", does_not_fit=True),
        T(4, phase="Skipped", does_not_fit=True),
        T(8, tps=900, p99=9500),
        T(8, 2, tps=1500, p99=7000),
    ]
    outcome = decide(spec(pp=(1, 2)), tiers)
    assert outcome.decision.pipeline_parallel == 2
    figure = build_knee_figure(outcome.tiers, outcome.decision)
    ax = figure.axes[0]
    assert list(ax.get_xticks()) == [1, 2, 4, 8, 16]
    assert ax.get_xticklabels()[-1].get_text() == "TP8xPP2\n16 GPUs"
    (knee,) = by_gid(figure, "knee")
    assert list(knee.get_xdata()) == [16]
    (skipped,) = by_gid(figure, "skipped")
    assert list(skipped.get_xdata()) == [1, 2, 4]


def test_all_tiers_skipped_has_no_knee_and_says_so():
    tiers = [T(n, phase="Skipped", does_not_fit=True) for n in (1, 2, 4, 8)]
    outcome = decide(spec(), tiers)
    assert outcome.decision is None
    figure = build_knee_figure(outcome.tiers, outcome.decision, ChartContext(model="big"))
    assert by_gid(figure, "knee") == [] and by_gid(figure, "throughput") == []
    assert "no decision yet" in figure.get_suptitle()
    assert "no tier was measured" in [t.get_text() for t in figure.axes[0].texts]
    assert legend_texts(figure) == ["skipped (does not fit)"]


def test_simulated_and_pending_tiers():
    tiers = [
        T(1, tps=800, p99=7000, simulated=True),
        T(2, tps=1400, p99=5000, simulated=True),
        T(4, phase="Pending"),
        T(8, phase="Pending"),
    ]
    outcome = decide(spec(), tiers)
    assert outcome.decision is None  # TP4 still Pending
    figure = build_knee_figure(outcome.tiers, None, ChartContext(simulated=True))
    assert "SIMULATED" in figure.get_suptitle()
    (pending,) = by_gid(figure, "not-measured")
    assert list(pending.get_xdata()) == [4, 8]
    assert "not measured yet" in legend_texts(figure)


def test_png_is_valid_and_of_the_declared_size(tmp_path):
    figure, _ = recorded_figure()
    path = tmp_path / "knee.png"
    save_png(figure, str(path))
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (round(FIGURE_SIZE_INCHES[0] * DPI), round(FIGURE_SIZE_INCHES[1] * DPI))
    assert 20_000 < len(data) < 1_000_000
    with Image.open(path) as image:
        image.verify()


def test_recorded_example_still_matches_this_test_data():
    # The tests above quote the recording's numbers; fail loudly if the example changes.
    doc = yaml.safe_load(RECORDED.read_text(encoding="utf-8"))
    assert [t["outputTokensPerSecond"] for t in doc["status"]["tiers"][1:]] == [1235.68, 1897.09]


def test_the_comm_share_of_each_tier_is_written_along_the_bottom():
    tiers = [
        T(1, tps=1000, p99=900, comm_fraction=0.0, rank_skew_fraction=0.0),
        T(2, tps=1300, p99=800, comm_fraction=0.19, rank_skew_fraction=0.01),
        T(4, tps=1400, p99=850),
    ]
    outcome = decide(spec(tp=(1, 2, 4)), tiers)
    figure = build_knee_figure(outcome.tiers, outcome.decision, H200)
    texts = sorted((t.get_position()[0], t.get_text()) for t in by_gid(figure, "comm"))
    assert texts == [(1, "C 0.00\nskew 0.00"), (2, "C 0.19\nskew 0.01")]  # TP4 has none: nothing is drawn, nothing guessed
