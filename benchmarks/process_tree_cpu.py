"""CPU time of a process and all its descendants, sampled over time (psutil).

AIPerf and GuideLLM are multi-process (a controller, workers, record processors), so a
client's CPU is the sum over its whole process tree. A background thread polls the tree
every ``interval`` seconds and keeps, per pid, the last user+system time it saw (a process
that exits keeps its last reading), so the series is the tree's cumulative CPU seconds
against wall time. ``cores_between(t0, t1)`` then gives the mean cores used over any window,
such as the client's own measured phase, without its start-up (imports, tokenizer, prompt
generation) or shutdown. Processes are sampled with their CPU affinity, so the benchmark
can say whether every descendant stayed on the pinned core.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left

import psutil


class ProcessTreeCpu:
    """Polls the CPU seconds of ``pid``'s process tree in a thread until :meth:`stop`."""

    def __init__(self, pid: int, interval: float = 0.25) -> None:
        self._root = psutil.Process(pid)
        self._interval = interval
        self._last: dict[int, float] = {}
        self._procs: dict[int, psutil.Process] = {}
        self.times: list[float] = []
        self.cpu: list[float] = []
        self.max_processes = 0
        self.affinities: set[tuple[int, ...]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> ProcessTreeCpu:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        try:
            members = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:
            members = []
        live = 0
        for proc in members:
            # Reuse Process objects so psutil keeps its identity check against pid reuse.
            proc = self._procs.setdefault(proc.pid, proc)
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    if proc.pid not in self._last:
                        self.affinities.add(tuple(sorted(proc.cpu_affinity())))
                self._last[proc.pid] = times.user + times.system
                live += 1
            except psutil.Error:
                continue
        self.max_processes = max(self.max_processes, live)
        self.times.append(time.time())
        self.cpu.append(sum(self._last.values()))

    def _run(self) -> None:
        while True:
            self._sample()
            if self._stop.wait(self._interval):
                self._sample()
                return

    def _at(self, t: float) -> float:
        """Cumulative CPU seconds at wall time ``t``, interpolated between samples."""
        i = bisect_left(self.times, t)
        if i <= 0:
            return self.cpu[0]
        if i >= len(self.times):
            return self.cpu[-1]
        t0, t1 = self.times[i - 1], self.times[i]
        c0, c1 = self.cpu[i - 1], self.cpu[i]
        return c0 + (c1 - c0) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.0)

    def cores_between(self, t0: float, t1: float) -> float:
        """Mean cores the tree used between wall times t0 and t1 (nan without samples)."""
        if not self.times or t1 <= t0:
            return float("nan")
        return (self._at(t1) - self._at(t0)) / (t1 - t0)
