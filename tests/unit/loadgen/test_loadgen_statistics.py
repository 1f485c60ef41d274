"""Percentiles, mean and std: hand-computed values, numpy agreement, invariants."""

from __future__ import annotations

import math

import numpy
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kneepoint.loadgen.statistics import describe, mean, percentile, std

finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)
samples = st.lists(finite, min_size=1, max_size=60)
percent = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)


def test_hand_computed_percentiles() -> None:
    data = [15.0, 20.0, 35.0, 40.0, 50.0]
    # rank = p/100 * (n-1): P50 -> 2 -> 35; P90 -> 3.6 -> 40 + 0.6*10; P99 -> 3.96 -> 49.6
    assert percentile(data, 50) == 35.0
    assert percentile(data, 90) == pytest.approx(46.0)
    assert percentile(data, 99) == pytest.approx(49.6)
    assert percentile(data, 0) == 15.0
    assert percentile(data, 100) == 50.0
    assert percentile([1.0, 2.0], 50) == 1.5
    assert percentile([7.0], 99) == 7.0
    assert percentile([3.0, 1.0, 2.0, 4.0], 25) == pytest.approx(1.75)  # unsorted input


def test_mean_and_population_std() -> None:
    data = [2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]
    assert mean(data) == 5.0
    assert std(data) == 2.0  # population std, numpy's default ddof=0


def test_empty_and_out_of_range() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)
    with pytest.raises(ValueError):
        mean([])
    assert describe([]) is None


def test_describe_fields() -> None:
    dist = describe([4.0, 1.0, 3.0, 2.0])
    assert dist is not None
    assert (dist.count, dist.minimum, dist.maximum, dist.mean) == (4, 1.0, 4.0, 2.5)
    assert dist.p(50.0) == 2.5
    assert dist.p(99.0) == pytest.approx(3.97)


@given(samples, percent)
def test_matches_numpy_linear(data: list[float], p: float) -> None:
    expected = float(numpy.percentile(numpy.array(data), p))
    assert math.isclose(percentile(data, p), expected, rel_tol=1e-9, abs_tol=1e-6)


@given(samples, percent, percent)
def test_monotone_in_p(data: list[float], p: float, q: float) -> None:
    low, high = sorted((p, q))
    assert percentile(data, low) <= percentile(data, high)


@given(samples, percent)
def test_within_min_and_max(data: list[float], p: float) -> None:
    assert min(data) <= percentile(data, p) <= max(data)


@given(samples)
def test_std_matches_numpy(data: list[float]) -> None:
    assert math.isclose(std(data), float(numpy.std(numpy.array(data))), rel_tol=1e-7, abs_tol=1e-6)
