"""A one-line progress display on stderr, only when stderr is a terminal.

Redrawn twice a second with a carriage return; in a pod (no TTY) nothing is written, so
logs stay clean and the termination message is the result channel.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from typing import TextIO


def progress_wanted(enabled: bool, stream: TextIO = sys.stderr) -> bool:
    """True when the line should be drawn: not disabled and ``stream`` is a terminal."""
    return enabled and stream.isatty()


def format_progress(label: str, done: int, failed: int, total: int, elapsed: float) -> str:
    """``label [#####.....] 40/100 requests, 2 failed, 12.3 s`` (pure)."""
    width = 24
    filled = width * done // total if total else width
    bar = "#" * filled + "." * (width - filled)
    return f"{label} [{bar}] {done}/{total} requests, {failed} failed, {elapsed:.1f} s"


async def show_progress(
    label: str, total: int, read: Callable[[], tuple[int, int]], stream: TextIO = sys.stderr, interval: float = 0.5
) -> None:
    """Redraw until cancelled; the caller cancels it when the phase ends."""
    started = time.monotonic()
    try:
        while True:
            done, failed = read()
            stream.write("\r" + format_progress(label, done, failed, total, time.monotonic() - started) + "\x1b[K")
            stream.flush()
            await asyncio.sleep(interval)
    finally:
        done, failed = read()
        stream.write("\r" + format_progress(label, done, failed, total, time.monotonic() - started) + "\x1b[K\n")
        stream.flush()
