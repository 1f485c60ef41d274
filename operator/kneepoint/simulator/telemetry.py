"""What the simulated GPUs did recently: busy time, collective time and bytes over links.

The engine loop records every step; the DCGM-style endpoint and the comm-fraction gauge
read rates over a sliding window (DCGM-exporter reports utilisation and PCIe/NVLink rates
per sampling interval, not since boot). Cumulative byte counters back the NVLink counter.
Pure: times are passed in.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

HOST_TO_DEVICE_BYTES_PER_TOKEN = 16
"""Input IDs and positions (int64 each) copied to the GPU for every scheduled token."""
DEVICE_TO_HOST_BYTES_PER_SAMPLE = 8
"""One sampled token ID (int64) copied back per sequence that samples."""


@dataclass(frozen=True)
class StepRecord:
    end: float
    duration: float
    comm_seconds: float
    link_bytes: float
    """Bytes each GPU sent (and received) over the replica's link in this step."""
    h2d_bytes: float
    d2h_bytes: float


@dataclass(frozen=True)
class WindowRates:
    """Averages over the window ending now."""

    busy_fraction: float
    link_tx_bytes_per_s: float
    link_rx_bytes_per_s: float
    h2d_bytes_per_s: float
    d2h_bytes_per_s: float


class Telemetry:
    """Sliding-window accounting of engine steps."""

    def __init__(self, window_seconds: float = 1.0, comm_window_seconds: float = 10.0) -> None:
        self.window = window_seconds
        self.comm_window = comm_window_seconds
        self._steps: deque[StepRecord] = deque()
        self.link_bytes_total = 0.0
        """Cumulative bytes per GPU sent plus received over the link."""
        self.busy_seconds_total = 0.0
        self._last_comm_fraction = 0.0

    def record(self, end: float, duration: float, comm_seconds: float, link_bytes: float, tokens: int, sampled: int) -> None:
        """Account one step that ran for ``duration`` seconds until ``end``."""
        self._steps.append(
            StepRecord(
                end, duration, comm_seconds, link_bytes, tokens * HOST_TO_DEVICE_BYTES_PER_TOKEN, sampled * DEVICE_TO_HOST_BYTES_PER_SAMPLE
            )
        )
        self.link_bytes_total += 2 * link_bytes
        self.busy_seconds_total += duration
        self._trim(end)

    def _trim(self, now: float) -> None:
        horizon = now - max(self.window, self.comm_window)
        steps = self._steps
        while steps and steps[0].end < horizon:
            steps.popleft()

    def rates(self, now: float) -> WindowRates:
        """Utilisation and byte rates over the last ``window_seconds``."""
        self._trim(now)
        start = now - self.window
        busy = link = h2d = d2h = 0.0
        for s in self._steps:
            if s.end <= start:
                continue
            # Count only the part of the step inside the window.
            inside = min(1.0, (s.end - start) / s.duration) if s.duration > 0 else 1.0
            busy += s.duration * inside
            link += s.link_bytes * inside
            h2d += s.h2d_bytes * inside
            d2h += s.d2h_bytes * inside
        w = self.window
        return WindowRates(min(1.0, busy / w), link / w, link / w, h2d / w, d2h / w)

    def comm_fraction(self, now: float) -> float:
        """Share of step time in collectives over the last ``comm_window_seconds``; holds its last value when idle."""
        self._trim(now)
        start = now - self.comm_window
        busy = comm = 0.0
        for s in self._steps:
            if s.end > start:
                busy += s.duration
                comm += s.comm_seconds
        if busy > 0:
            self._last_comm_fraction = comm / busy
        return self._last_comm_fraction
