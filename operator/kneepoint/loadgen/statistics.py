"""Latency statistics without numpy: percentiles, mean, standard deviation.

The load generator runs in small pods where numpy is dead weight, yet its numbers must be
comparable with ``vllm bench serve``, which uses ``numpy.percentile`` (linear interpolation,
"method 7") and ``numpy.std`` (population, ddof=0). This module reproduces both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

# Percentiles every latency is reported at.
REPORTED_PERCENTILES = (50.0, 90.0, 95.0, 99.0)


def percentile_sorted(ordered: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100) of an already ascending sequence, numpy's linear method.

    rank = p/100 * (n-1); the value interpolates linearly between the two neighbouring
    order statistics. Raises ValueError on an empty sequence or p outside [0, 100].
    """
    if not ordered:
        raise ValueError("percentile of an empty sequence")
    if not 0.0 <= p <= 100.0 or math.isnan(p):
        raise ValueError(f"percentile must be within [0, 100], got {p}")
    rank = p / 100.0 * (len(ordered) - 1)
    lower = math.floor(rank)
    upper = min(lower + 1, len(ordered) - 1)
    fraction = rank - lower
    low_value, high_value = ordered[lower], ordered[upper]
    # numpy's _lerp: interpolate from the nearer end so the result never leaves
    # [low_value, high_value] through rounding.
    if fraction >= 0.5:
        return high_value - (high_value - low_value) * (1.0 - fraction)
    return low_value + (high_value - low_value) * fraction


def percentile(samples: Sequence[float], p: float) -> float:
    """The p-th percentile (0-100) of unordered samples (see ``percentile_sorted``)."""
    return percentile_sorted(sorted(samples), p)


def mean(samples: Sequence[float]) -> float:
    """Arithmetic mean; ValueError when empty."""
    if not samples:
        raise ValueError("mean of an empty sequence")
    return math.fsum(samples) / len(samples)


def std(samples: Sequence[float]) -> float:
    """Population standard deviation (ddof=0, like numpy.std); ValueError when empty."""
    centre = mean(samples)
    return math.sqrt(math.fsum((x - centre) ** 2 for x in samples) / len(samples))


@dataclass(frozen=True)
class Distribution:
    """Summary of one latency's samples. All values are in the samples' unit."""

    count: int
    mean: float
    std: float
    minimum: float
    maximum: float
    percentiles: dict[float, float]

    def p(self, value: float) -> float:
        """The stored percentile ``value`` (one of REPORTED_PERCENTILES)."""
        return self.percentiles[value]


def describe(samples: Sequence[float], percentiles: Sequence[float] = REPORTED_PERCENTILES) -> Distribution | None:
    """Mean, std, min, max and percentiles of ``samples``; None when there are none."""
    if not samples:
        return None
    ordered = sorted(samples)
    return Distribution(
        count=len(ordered),
        mean=mean(ordered),
        std=std(ordered),
        minimum=ordered[0],
        maximum=ordered[-1],
        percentiles={p: percentile_sorted(ordered, p) for p in percentiles},
    )
