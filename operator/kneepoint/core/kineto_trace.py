"""Collective time and rank skew from vLLM's torch-profiler traces (Kineto / Chrome format).

vLLM started with ``--profiler-config '{"profiler":"torch",...}'`` writes one trace per rank
(``...rank<R>.<ns>.pt.trace.json.gz``) after ``POST /stop_profile``. Each holds every GPU
kernel by name (CUDA-graph replays included) and one ``gpu_user_annotation`` per engine step
named ``execute_context_<n>(<tokens>)_generation_<n>(<n>)``. This module reads such traces
as a stream (a real 3 s slice is 135 MB of JSON: it is never held whole) and computes:

- per step and rank, the collective time: the summed duration of collective kernels
  inside the step's annotation window on that rank's GPU;
- per step, the step time: the longest of the ranks' step durations;
- ``commFraction``: median over steps of (smallest collective time over the ranks / step
  time). A rank that arrives early at an all-reduce waits inside the kernel (vLLM RFC
  #52777), so the smallest rank's time is the transfer, the rest is waiting;
- ``rankSkewFraction``: median over steps of ((largest - smallest) collective time / step
  time): the waiting, i.e. imbalance between the ranks.

Steps are matched across ranks by order. Pure: the standard library only (the sidecar,
the CLI and the simulator's trace writer share these facts).
"""

from __future__ import annotations

import gzip
import io
import json
import math
import re
import statistics
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

STEP_CATEGORY = "gpu_user_annotation"
KERNEL_CATEGORY = "kernel"
# vLLM's per-step GPU annotation (gpu_model_runner's record_function around execute_model).
STEP_NAME = re.compile(r"^execute_context_\d+\(\d+\)_generation_\d+\(\d+\)$")
# Collective kernels: NCCL (ncclDevKernel_AllReduce_..., ncclKernel_SendRecv...), vLLM's custom
# all-reduce (vllm::cross_device_reduce_1stage / _2stage), quick all-reduce
# (allreduce_prototype_twoshot), torch symmetric-memory and FlashInfer all-reduce kernels
# (one_shot_all_reduce, multimem_all_reduce, allreduce_fusion_kernel_*), and all-gather /
# reduce-scatter kernels named as such.
COLLECTIVE_KERNEL = re.compile(r"nccl|cross_device_reduce|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all", re.IGNORECASE)
# File name of a rank's trace as vLLM writes it; the rank is read from it when the trace's
# distributedInfo does not say.
RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)")
TRACE_FILE_SUFFIXES = (".pt.trace.json.gz", ".pt.trace.json")

_CHUNK = 1 << 20
_WS = re.compile(r"[ \t\n\r]*")


class TraceError(ValueError):
    """A file that is not a usable trace; the message names the file and what is wrong."""


def is_collective_kernel(name: str) -> bool:
    """True for the kernels whose time counts as communication."""
    return COLLECTIVE_KERNEL.search(name) is not None


@dataclass(frozen=True)
class RankTrace:
    """One rank's steps: start and duration (µs) and collective time (µs) per step, in order."""

    rank: int
    source: str
    step_starts_us: tuple[float, ...]
    step_durations_us: tuple[float, ...]
    collective_us: tuple[float, ...]
    kernels: int
    world_size: int | None = None
    """Ranks of the engine (the trace's distributedInfo.world_size), when the trace says."""


@dataclass(frozen=True)
class RankFigures:
    rank: int
    steps: int
    collective_share: float
    step_time_median_ms: float

    def to_json(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "steps": self.steps,
            "collectiveShare": round(self.collective_share, 4),
            "stepTimeMedianMs": round(self.step_time_median_ms, 3),
        }


@dataclass(frozen=True)
class TraceFigures:
    ranks: int
    steps: int
    comm_fraction: float
    rank_skew_fraction: float
    step_time_median_ms: float
    per_rank: tuple[RankFigures, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "ranks": self.ranks,
            "steps": self.steps,
            "commFraction": round(self.comm_fraction, 4),
            "rankSkewFraction": round(self.rank_skew_fraction, 4),
            "stepTimeMedianMs": round(self.step_time_median_ms, 3),
            "perRank": [r.to_json() for r in self.per_rank],
        }


# --------------------------------------------------------------------------------------
# Streaming JSON: the top-level object's keys one by one, traceEvents element by element.


class _Stream:
    def __init__(self, text: IO[str], source: str) -> None:
        self._text = text
        self._source = source
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._decoder = json.JSONDecoder()

    def _fill(self) -> bool:
        if self._eof:
            return False
        chunk = self._text.read(_CHUNK)
        if not chunk:
            self._eof = True
            return False
        self._buf = self._buf[self._pos :] + chunk
        self._pos = 0
        return True

    def _bad(self, what: str) -> TraceError:
        return TraceError(f"{self._source}: not a Kineto/Chrome trace ({what})")

    def peek(self) -> str:
        """The next non-blank character ('' at the end)."""
        while True:
            blank = _WS.match(self._buf, self._pos)
            assert blank is not None  # a run of zero or more blanks matches anywhere
            self._pos = blank.end()
            if self._pos < len(self._buf) or not self._fill():
                return self._buf[self._pos : self._pos + 1]

    def expect(self, char: str, what: str) -> None:
        if self.peek() != char:
            raise self._bad(what)
        self._pos += 1

    def value(self) -> Any:
        self.peek()
        while True:
            try:
                obj, end = self._decoder.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError:
                if self._fill():
                    continue
                raise self._bad("invalid JSON") from None
            # A number cut by the chunk boundary decodes too early: read on and decode again.
            if end == len(self._buf) and self._fill():
                continue
            self._pos = end
            return obj

    def top_level(self) -> Iterator[tuple[str, Any]]:
        """(key, value) of the top-level object; the value of traceEvents is an event iterator."""
        if self.peek() == "":
            raise self._bad("empty file")
        self.expect("{", "expected a JSON object")
        if self.peek() == "}":
            return
        while True:
            key = self.value()
            if not isinstance(key, str):
                raise self._bad("invalid JSON")
            self.expect(":", "invalid JSON")
            if key == "traceEvents":
                yield key, self._array()
            else:
                yield key, self.value()
            nxt = self.peek()
            self._pos += 1
            if nxt == "}":
                return
            if nxt != ",":
                raise self._bad("invalid JSON")

    def _array(self) -> Iterator[Any]:
        self.expect("[", "traceEvents is not an array")
        if self.peek() == "]":
            self._pos += 1
            return
        while True:
            yield self.value()
            nxt = self.peek()
            self._pos += 1
            if nxt == "]":
                return
            if nxt != ",":
                raise self._bad("invalid JSON")


def open_text(path: str | Path) -> IO[str]:
    """A trace file as text: gzip when it starts with the gzip magic, else plain UTF-8."""
    raw = open(path, "rb")  # noqa: SIM115 - handed to the caller, closed with the wrapper
    try:
        magic = raw.read(2)
        raw.seek(0)
    except OSError:
        raw.close()
        raise
    stream: gzip.GzipFile | io.BufferedReader = gzip.GzipFile(fileobj=raw) if magic == b"\x1f\x8b" else raw
    return io.TextIOWrapper(stream, encoding="utf-8", errors="replace")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def read_rank_trace(text: IO[str], source: str, default_rank: int) -> RankTrace:
    """One rank's steps and their collective time from a trace stream."""
    stream = _Stream(text, source)
    rank: int | None = None
    world: int | None = None
    saw_events = False
    steps: list[tuple[float, float, Any]] = []  # (start, duration, device)
    collectives: dict[Any, list[tuple[float, float]]] = {}
    kernels = 0
    try:
        for key, value in stream.top_level():
            if key == "distributedInfo" and isinstance(value, dict) and isinstance(value.get("rank"), int):
                rank = value["rank"]
                world = value.get("world_size") if isinstance(value.get("world_size"), int) else None
            if key != "traceEvents":
                continue
            saw_events = True
            for event in value:
                if not isinstance(event, dict) or event.get("ph") != "X":
                    continue
                category = event.get("cat")
                if category not in (KERNEL_CATEGORY, STEP_CATEGORY):
                    continue
                ts, dur = _number(event.get("ts")), _number(event.get("dur"))
                name = event.get("name")
                if ts is None or dur is None or not isinstance(name, str):
                    continue
                device = event.get("pid")
                if category == KERNEL_CATEGORY:
                    kernels += 1
                    if is_collective_kernel(name):
                        collectives.setdefault(device, []).append((ts, ts + dur))
                elif STEP_NAME.match(name):
                    steps.append((ts, dur, device))
    except UnicodeDecodeError:
        raise TraceError(f"{source}: not a Kineto/Chrome trace (not text)") from None
    except (OSError, EOFError) as err:  # a truncated or corrupt gzip stream
        raise TraceError(f"{source}: cannot read: {err}") from None
    if not saw_events:
        raise TraceError(f"{source}: not a Kineto/Chrome trace (no traceEvents array)")
    if not steps:
        raise TraceError(
            f"{source}: no step annotations (no {STEP_CATEGORY} events named like "
            "execute_context_<n>(<tokens>)_generation_<n>(<n>); was the profiled slice under load?)"
        )
    steps.sort(key=lambda s: s[0])
    for intervals in collectives.values():
        intervals.sort()
    collective = tuple(_overlap(collectives.get(device, ()), start, start + dur) for start, dur, device in steps)
    return RankTrace(
        rank=rank if rank is not None else default_rank,
        source=source,
        step_starts_us=tuple(s[0] for s in steps),
        step_durations_us=tuple(s[1] for s in steps),
        collective_us=collective,
        kernels=kernels,
        world_size=world,
    )


def _overlap(intervals: Iterable[tuple[float, float]], start: float, end: float) -> float:
    """Summed length of the intervals (sorted by start) inside [start, end]."""
    total = 0.0
    for a, b in intervals:  # collective kernels are few per step; a linear scan is enough
        if a >= end:
            break
        if b > start:
            total += min(b, end) - max(a, start)
    return total


def rank_from_name(path: str | Path, default: int) -> int:
    match = RANK_IN_NAME.search(Path(path).name)
    return int(match.group(1)) if match else default


def read_trace_file(path: str | Path, default_rank: int = 0) -> RankTrace:
    """One rank's trace file (gz or plain)."""
    try:
        with open_text(path) as text:
            return read_rank_trace(text, str(path), rank_from_name(path, default_rank))
    except OSError as err:
        raise TraceError(f"{path}: cannot read: {err.strerror or err}") from None


def analyse(ranks: list[RankTrace]) -> TraceFigures:
    """The engine's figures from its ranks' traces (steps matched by order)."""
    if not ranks:
        raise TraceError("no trace files given")
    seen: dict[int, str] = {}
    for r in ranks:
        if r.rank in seen:
            raise TraceError(f"{r.source}: rank {r.rank} given twice (also {seen[r.rank]})")
        seen[r.rank] = r.source
    ordered = sorted(ranks, key=lambda r: r.rank)
    counts = {len(r.step_durations_us) for r in ordered}
    if len(counts) != 1:
        listing = ", ".join(f"rank {r.rank}: {len(r.step_durations_us)}" for r in ordered)
        raise TraceError(f"ranks have different step counts ({listing}); give the traces of one profiled slice")
    n = counts.pop()
    step_times, comm, skew = [], [], []
    for i in range(n):
        step_time = max(r.step_durations_us[i] for r in ordered)
        coll = [r.collective_us[i] for r in ordered]
        if step_time <= 0:
            continue
        step_times.append(step_time)
        comm.append(min(coll) / step_time)
        skew.append((max(coll) - min(coll)) / step_time)
    if not step_times:
        raise TraceError("every step has zero duration")
    per_rank = tuple(
        RankFigures(
            rank=r.rank,
            steps=n,
            collective_share=statistics.median(c / d if d > 0 else 0.0 for c, d in zip(r.collective_us, r.step_durations_us)),
            step_time_median_ms=statistics.median(r.step_durations_us) / 1000.0,
        )
        for r in ordered
    )
    return TraceFigures(
        ranks=len(ordered),
        steps=n,
        comm_fraction=statistics.median(comm),
        rank_skew_fraction=statistics.median(skew),
        step_time_median_ms=statistics.median(step_times) / 1000.0,
        per_rank=per_rank,
    )


def analyse_files(paths: list[str | Path]) -> TraceFigures:
    return analyse([read_trace_file(p, default_rank=i) for i, p in enumerate(paths)])


def format_table(figures: TraceFigures) -> str:
    lines = [
        f"ranks {figures.ranks}, steps {figures.steps}, step time median {figures.step_time_median_ms:.2f} ms",
        f"commFraction {figures.comm_fraction:.4f} (median over steps of the smallest rank's collective time / step time)",
        f"rankSkewFraction {figures.rank_skew_fraction:.4f} (median over steps of (largest - smallest) collective time / step time)",
        "",
        f"{'rank':>4}  {'steps':>5}  {'collective share':>16}  {'step time median ms':>19}",
    ]
    for r in figures.per_rank:
        lines.append(f"{r.rank:>4}  {r.steps:>5}  {r.collective_share:>16.4f}  {r.step_time_median_ms:>19.3f}")
    return "\n".join(lines)
