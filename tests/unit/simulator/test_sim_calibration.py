"""The performance model against the real H200 measurements in tests/data/h200.

Which graph-replay points exist (every call of every file is checked, not only call 1):
- decode, 1024 tokens cached: 8B at batch 1/8/32/64/128 for TP1, TP2 NVLink, TP2 no-P2P,
  TP4 NVLink, TP4 no-P2P; 70B at batch 1/8/16 for TP1 (32 and 64 ran out of memory) and
  1/32/64 for TP2 NVLink, TP2 no-P2P, TP4 NVLink, TP4 no-P2P;
- prefill of one prompt: 8B 1024 and 4096 tokens, 70B 1024 tokens, at every tier above
  (TP1 and TP2-NVLink prefill were graph-timed in call 2 only; call 1 timed them eagerly,
  launch-bound in that VM, and is not a graph-replay point).
"""

from __future__ import annotations

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


@pytest.mark.parametrize("point", POINTS, ids=lambda p: f"{p.label} [{p.source}]")
def test_step_time_within_15_percent(point) -> None:
    simulated_ms = predict(point, CAL).seconds * 1e3
    assert abs(simulated_ms / point.measured_ms - 1.0) <= 0.15, (simulated_ms, point.measured_ms)


@pytest.mark.parametrize("point", [p for p in POINTS if p.tensor_parallel > 1 and p.measured_comm_share is not None],
                         ids=lambda p: f"{p.label} [{p.source}]")
def test_communication_share_within_8_points(point) -> None:
    simulated = predict(point, CAL).comm_fraction
    assert abs(simulated - point.measured_comm_share) <= 0.08, (simulated, point.measured_comm_share)


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
