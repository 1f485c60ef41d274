"""The performance model against the plain-PyTorch + NCCL H200 measurements in tests/data/h200.

Since real vLLM serving became the ground truth (test_sim_calibration_vllm.py), the single-GPU
constants are vLLM's, whose kernels are faster than the measured plain-PyTorch model: absolute
step times no longer match these graph replays (8B TP1 decode is 10-29 % below them, as real
vLLM is). What this data still decides is how TP scales and what the links cost, so that is
what is checked here: each TP>1 point's time over its TP1 point, the collectives' share, and
the all-reduce sweep.

Which graph-replay points exist (every call of every file is checked, not only call 1):
- decode, 1024 tokens cached: 8B at batch 1/8/32/64/128 for TP1, TP2 NVLink, TP2 no-P2P,
  TP4 NVLink, TP4 no-P2P; 70B at batch 1/8/16 for TP1 (32 and 64 ran out of memory) and
  1/32/64 for TP2 NVLink, TP2 no-P2P, TP4 NVLink, TP4 no-P2P;
- prefill of one prompt: 8B 1024 and 4096 tokens, 70B 1024 tokens, at every tier above
  (TP1 and TP2-NVLink prefill were graph-timed in call 2 only; call 1 timed them eagerly,
  launch-bound in that VM, and is not a graph-replay point).
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from pathlib import Path

import pytest

from kneepoint.simulator.calibration import calibration_from_json, calibration_to_json, load_calibration
from kneepoint.simulator.calibration_fit import (
    eager_constants,
    load_allreduce_points,
    load_points,
    predict,
    predict_allreduce_us,
)
from kneepoint.simulator.calibration_vllm import scaling_error, tp_scaling_pairs

DATA = Path(__file__).resolve().parents[2] / "data" / "h200"
POINTS = load_points(DATA)
CAL = load_calibration()


def test_every_expected_point_is_loaded() -> None:
    kinds = Counter((p.model, p.kind, p.tensor_parallel, p.interconnect) for p in POINTS)
    # 8B decode: 5 batches; TP1 and TP2-NVLink have two calls each.
    assert kinds[("8B", "decode", 1, "nvlink")] == 10
    assert kinds[("8B", "decode", 2, "nvlink")] == 10
    assert kinds[("8B", "decode", 2, "pcie")] == 5
    assert kinds[("8B", "decode", 4, "nvlink")] == 5
    assert kinds[("8B", "decode", 4, "pcie")] == 5
    # 70B TP1: batches 1, 8, 16 in calls 1 and 3; TP2 NVLink: 1, 32, 64 in calls 1 and 3.
    assert kinds[("70B", "decode", 1, "nvlink")] == 6
    assert kinds[("70B", "decode", 2, "nvlink")] == 6
    assert kinds[("70B", "decode", 2, "pcie")] == 3
    assert kinds[("70B", "decode", 4, "nvlink")] == 3
    assert kinds[("70B", "decode", 4, "pcie")] == 3
    prefill = [p for p in POINTS if p.kind == "prefill"]
    assert len(prefill) == 15  # (8B x 2 lengths + 70B) x 5 tiers
    assert len(POINTS) == 71


PAIRS = tp_scaling_pairs(POINTS)


@pytest.mark.parametrize("pair", PAIRS, ids=lambda pair: f"{pair[0].label} [{pair[0].source}]")
def test_tp_speed_up_within_35_percent(pair) -> None:
    """TPn time over TP1 time, simulated against measured. The worst are no-P2P points (+31 % at 8B TP4
    prefill): with vLLM's faster compute the host-memory all-reduce weighs more than in PyTorch."""
    assert abs(scaling_error(pair, CAL)) <= 0.35


def test_tp_speed_up_mean_error_under_8_percent() -> None:
    errors = [abs(scaling_error(pair, CAL)) for pair in PAIRS]
    assert len(errors) == 42
    assert sum(errors) / len(errors) <= 0.08


@pytest.mark.parametrize(
    "point", [p for p in POINTS if p.tensor_parallel > 1 and p.measured_comm_share is not None], ids=lambda p: f"{p.label} [{p.source}]"
)
def test_communication_share_within_20_points(point) -> None:
    """Looser than the 8 points of the PyTorch-only fit: the same collectives over vLLM's faster
    compute are a larger share (8B TP4 batch 1-8 is over by 10-16 points); no multi-GPU vLLM capture
    exists to say which is right."""
    simulated = predict(point, CAL).comm_fraction
    assert abs(simulated - point.measured_comm_share) <= 0.20, (simulated, point.measured_comm_share)


def test_no_p2p_makes_tp_pay_less_than_nvlink() -> None:
    """The qualitative finding of the data: without a fast link TP2 barely beats TP1 at batch 64."""
    by_key = {(p.model, p.tensor_parallel, p.interconnect, p.kind, p.batch): predict(p, CAL).seconds for p in POINTS}
    tp1 = by_key[("8B", 1, "nvlink", "decode", 64)]
    assert tp1 / by_key[("8B", 2, "nvlink", "decode", 64)] > 1.35
    assert tp1 / by_key[("8B", 2, "pcie", "decode", 64)] < 1.1
    # ... and prefill gets slower than on one GPU.
    assert by_key[("8B", 2, "pcie", "prefill", 1024)] > by_key[("8B", 1, "nvlink", "prefill", 1024)]


def test_allreduce_sweep_within_30_percent() -> None:
    """The link model against the in-graph all-reduce sweep (8 KiB .. 4 MiB), a looser secondary check."""
    points = load_allreduce_points(DATA)
    assert len(points) == 20
    for a in points:
        assert abs(predict_allreduce_us(a, CAL) / a.measured_us - 1.0) <= 0.30, a


def test_shipped_file_round_trips_and_eager_constants_match_the_data() -> None:
    assert calibration_from_json(calibration_to_json(CAL)) == CAL
    assert eager_constants(DATA) == CAL.eager


@pytest.mark.parametrize(
    ("tables", "field"),
    [
        ([[16, 1.0]], "compute.fp8GemmRowFactorsByGpu"),
        ({"h100-sxm": [[24, 1.1], [16, 1.0]]}, "compute.fp8GemmRowFactorsByGpu.h100-sxm"),
        ({"h100-sxm": [[16, 0.0]]}, "compute.fp8GemmRowFactorsByGpu.h100-sxm"),
    ],
)
def test_a_bad_per_gpu_row_factor_table_is_refused_by_its_field(tables: object, field: str) -> None:
    doc = calibration_to_json(CAL)
    doc["compute"]["fp8GemmRowFactorsByGpu"] = tables
    with pytest.raises(ValueError, match=re.escape(field)):
        calibration_from_json(doc)


@pytest.mark.parametrize("value", [-1.0, "nan"])
def test_a_negative_fp8_elementwise_figure_is_refused_by_its_field(value: object) -> None:
    doc = calibration_to_json(CAL)
    doc["compute"]["fp8ElementwiseBytesPerTokenWidth"] = value
    with pytest.raises(ValueError, match=re.escape("compute.fp8ElementwiseBytesPerTokenWidth")):
        calibration_from_json(doc)


def test_a_calibration_without_the_fp8_elementwise_figure_reads_it_as_none() -> None:
    doc = calibration_to_json(CAL)
    del doc["compute"]["fp8ElementwiseBytesPerTokenWidth"]
    assert calibration_from_json(doc).compute.fp8_elementwise_bytes_per_token_width == 0.0


def test_a_calibration_without_per_gpu_row_factors_gives_every_gpu_the_shared_table() -> None:
    doc = calibration_to_json(CAL)
    del doc["compute"]["fp8GemmRowFactorsByGpu"]
    shared = calibration_from_json(doc).compute
    assert shared.fp8_row_factors_for("h100-sxm") == shared.fp8_row_factors_for("h200") == CAL.compute.fp8_gemm_row_factors


@pytest.mark.parametrize("scales", [[["h100-sxm", 1.05]], {"h100-sxm": 0.0}, {"h100-sxm": -1.0}, {"h100-sxm": "fast"}])
def test_a_bad_per_gpu_bandwidth_scale_is_refused_by_its_field(scales: object) -> None:
    doc = calibration_to_json(CAL)
    doc["compute"]["bandwidthScaleByGpu"] = scales
    with pytest.raises(ValueError, match=re.escape("compute.bandwidthScaleByGpu")):
        calibration_from_json(doc)


def test_a_calibration_without_bandwidth_scales_gives_every_gpu_its_datasheet_share() -> None:
    doc = calibration_to_json(CAL)
    del doc["compute"]["bandwidthScaleByGpu"]
    plain = calibration_from_json(doc).compute
    assert plain.bandwidth_scale_for("h100-sxm") == plain.bandwidth_scale_for("h200") == plain.bandwidth_scale_for(None) == 1.0
    # the shipped file scales the H100's alone
    assert CAL.compute.bandwidth_scale_for("h200") == 1.0 and CAL.compute.bandwidth_scale_for("h100-sxm") > 1.0


def test_bf16_row_factor_tables_are_read_checked_and_written_back() -> None:
    doc = copy.deepcopy(calibration_to_json(CAL))
    doc["compute"]["bf16GemmRowFactors"] = [[16, 1.0], [128, 1.12]]
    doc["compute"]["bf16GemmRowFactorsByGpu"] = {"h100-sxm": [[16, 1.0], [128, 1.08]]}
    cal = calibration_from_json(doc)
    assert cal.compute.bf16_row_factors_for("h100-sxm") == ((16, 1.0), (128, 1.08))
    assert cal.compute.bf16_row_factors_for("h200") == cal.compute.bf16_row_factors_for(None) == ((16, 1.0), (128, 1.12))
    assert calibration_from_json(calibration_to_json(cal)) == cal
    doc["compute"]["bf16GemmRowFactorsByGpu"] = {"h100-sxm": [[128, 1.08], [16, 1.0]]}
    with pytest.raises(ValueError, match=r"compute\.bf16GemmRowFactorsByGpu\.h100-sxm"):
        calibration_from_json(doc)
