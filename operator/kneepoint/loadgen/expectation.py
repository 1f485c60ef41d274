"""``--expect``: stop repeating once a repeat confirms the figures the caller expected (pure).

Predict-first (docs/predict-first.md) measures some tiers only to confirm the simulator's
prediction: the predicted winner and the tier that proves its stop. The operator passes
the predicted figures with their error bands; after each measured repeat but the last, the
load generator stops when every expected figure of that repeat, as its summary reports it
(CONTRACTS A keys), lies within its relative band and the repeat's error fraction is within
``--max-error-fraction``. A repeat outside a band is followed by the next, as without
``--expect``: the prediction was off, and the measurement must stand on its own.

The check is the operator's own (``core.predict_first.outside_band``): the same keys, the
same relative error ``(measured - expected) / expected`` against the same band.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kneepoint.core.prediction import band_error, within_band
from kneepoint.loadgen.summary import RepeatSummary, build_summary, select_repeat

EXPECTABLE_KEYS = ("outputTokensPerSecond", "latencyP99Ms", "latencyP50Ms", "ttftP99Ms", "ttftP50Ms", "tpotMeanMs")
"""Summary keys ``--expect`` accepts (the figures a repeat's summary always carries)."""


@dataclass(frozen=True)
class ExpectedFigure:
    key: str
    value: float
    band: float
    """Relative: 0.03 accepts values within +-3 % of ``value``."""

    def to_flag(self) -> str:
        return f"{self.key}={self.value:g}:{self.band:g}"


def parse_expectations(texts: Sequence[str]) -> tuple[ExpectedFigure, ...]:
    """``KEY=VALUE:BAND`` strings -> figures; ValueError naming ``--expect`` and the allowed values."""
    out: dict[str, ExpectedFigure] = {}
    for text in texts:
        key, sep, rest = text.partition("=")
        value_text, sep2, band_text = rest.partition(":")
        key = key.strip()
        if not sep or not sep2:
            raise ValueError(f"--expect must be KEY=VALUE:BAND (e.g. outputTokensPerSecond=3200:0.03), got {text!r}")
        if key not in EXPECTABLE_KEYS:
            raise ValueError(f"--expect: KEY must be one of {', '.join(EXPECTABLE_KEYS)}, got {key!r}")
        try:
            value, band = float(value_text), float(band_text)
        except ValueError:
            raise ValueError(f"--expect {text!r}: VALUE and BAND must be numbers") from None
        if not (value > 0 and math.isfinite(value)):
            raise ValueError(f"--expect {key}: VALUE must be a number > 0, got {value_text!r}")
        if not (0 <= band < 1):
            raise ValueError(f"--expect {key}: BAND must be a relative band within [0, 1), got {band_text!r}")
        if key in out:
            raise ValueError(f"--expect {key} is given twice")
        out[key] = ExpectedFigure(key, value, band)
    return tuple(out.values())


@dataclass(frozen=True)
class Verdict:
    confirmed: bool
    detail: str
    """Each figure against its expectation, e.g. ``outputTokensPerSecond 3211 (-1.2 %, band 3 %)``."""


def judge(figures: Sequence[ExpectedFigure], summary: Mapping[str, Any], max_error_fraction: float) -> Verdict:
    """Does one repeat's summary (CONTRACTS A keys) confirm every expected figure?"""
    parts: list[str] = []
    confirmed = bool(figures)
    if not summary.get("ok", True) or (summary.get("errorFraction") or 0.0) > max_error_fraction:
        confirmed = False
        parts.append(f"errorFraction {summary.get('errorFraction')}")
    for f in figures:
        measured = summary.get(f.key)
        if not isinstance(measured, (int, float)) or not math.isfinite(measured):
            confirmed = False
            parts.append(f"{f.key} not measured")
            continue
        off = band_error(float(measured), f.value)
        inside = within_band(off, f.band)  # the operator's own check (core.predict_first.outside_band)
        confirmed = confirmed and inside
        parts.append(f"{f.key} {measured:g} ({off:+.1%}, band {f.band:.0%}){'' if inside else ' outside'}")
    return Verdict(confirmed, "; ".join(parts))


def judge_repeat(figures: Sequence[ExpectedFigure], repeat: RepeatSummary, concurrency: int, max_error_fraction: float) -> Verdict:
    """One repeat judged as its summary would report it were it the only one."""
    summary = build_summary([repeat], select_repeat([repeat], max_error_fraction), concurrency, max_error_fraction)
    return judge(figures, summary, max_error_fraction)


def expectation_json(figures: Sequence[ExpectedFigure], confirmed_after: int | None, planned: int) -> dict[str, Any]:
    """The summary's ``expectation``: the repeat that confirmed (None: none did) of the planned repeats."""
    return {"confirmedAfterRepeat": confirmed_after, "repeatsPlanned": planned, "keys": [f.key for f in figures]}
