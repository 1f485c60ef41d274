"""``kneepoint trace FILE...``: collective share and rank skew from one engine's profiler traces.

FILE is one rank's torch-profiler trace as vLLM writes it after ``POST /stop_profile``
(``...rank<R>.<ns>.pt.trace.json.gz``, gzip or plain JSON); give every rank of one profiled
slice. The reading and the figures are ``kneepoint.core.kineto_trace``; this module prints.
Bad input gives one line naming the file and what is wrong, and exit code 2.

``kneepoint trace --watch DIR --serve-metrics HOST:PORT`` is the engine pod's sidecar: it
waits for every rank's trace of a slice to appear in DIR (the engine's
``torch_profiler_dir``, a shared emptyDir), reads them with the same code and exports
``kneepoint_comm_fraction`` and ``kneepoint_rank_skew_fraction`` for Prometheus.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import typing
from dataclasses import dataclass, field
from pathlib import Path

import click

from kneepoint.core.kineto_trace import (
    TRACE_FILE_SUFFIXES,
    RankTrace,
    TraceError,
    TraceFigures,
    analyse,
    analyse_files,
    format_table,
    read_trace_file,
)
from kneepoint.metrics import promql

log = logging.getLogger("kneepoint.trace")

OUTPUTS = ("table", "json")


def _fail(message: str) -> typing.NoReturn:
    click.echo(f"kneepoint trace: error: {' '.join(message.split())}", err=True)
    sys.exit(2)


@dataclass
class _Seen:
    size: int
    mtime: float
    polls: int = 1


@dataclass
class TraceWatcher:
    """Finds complete slices in a directory: every rank's trace, each file no longer growing.

    A file is read once its size and mtime held for one poll (real torch writes in place);
    a slice is complete when it holds ``world_size`` distinct ranks (from the traces'
    distributedInfo). Files of an analysed slice are deleted, so the emptyDir stays small.
    """

    directory: Path
    _seen: dict[Path, _Seen] = field(default_factory=dict)
    _read: dict[Path, RankTrace] = field(default_factory=dict)
    _bad: set[Path] = field(default_factory=set)

    def poll(self) -> TraceFigures | None:
        try:
            names = sorted(p for p in self.directory.iterdir() if p.name.endswith(TRACE_FILE_SUFFIXES) and not p.name.startswith("."))
        except FileNotFoundError:
            return None
        for path in names:
            if path in self._read or path in self._bad:
                continue
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            seen = self._seen.get(path)
            if seen is None or (seen.size, seen.mtime) != (st.st_size, st.st_mtime):
                self._seen[path] = _Seen(st.st_size, st.st_mtime)
                continue
            try:
                self._read[path] = read_trace_file(path)
            except TraceError as err:
                log.warning("skipping %s", err)
                self._bad.add(path)
        by_rank: dict[int, tuple[Path, RankTrace]] = {}
        for path, trace in sorted(self._read.items(), key=lambda item: item[0].stat().st_mtime if item[0].exists() else 0.0):
            by_rank[trace.rank] = (path, trace)  # the newest file of each rank
        if not by_rank:
            return None
        world = max((t.world_size or 1) for _, t in by_rank.values())
        if len(by_rank) < world:
            return None
        try:
            figures = analyse([t for _, t in by_rank.values()])
        except TraceError as err:
            log.warning("slice not usable: %s", err)
            figures = None
        for path in list(self._read):
            self._forget(path)
        for path in list(self._bad):
            self._forget(path)
        return figures

    def _forget(self, path: Path) -> None:
        self._read.pop(path, None)
        self._seen.pop(path, None)
        self._bad.discard(path)
        try:
            path.unlink()
        except OSError:
            pass


def _listen_address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        _fail(f"--serve-metrics: expected HOST:PORT or :PORT, got {text!r}")
    return host or "0.0.0.0", int(port)


def watch(directory: str, listen: str, interval: float) -> None:
    """The sidecar loop: serve the gauges, publish each complete slice's figures."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(levelname)s %(asctime)s [kneepoint.trace] %(message)s")
    host, port = _listen_address(listen)
    registry = CollectorRegistry()
    comm = Gauge(
        promql.COMM_FRACTION,
        "Median over the profiled slice's steps of the smallest rank's collective time / step time.",
        registry=registry,
    )
    skew = Gauge(
        promql.RANK_SKEW_FRACTION,
        "Median over the slice's steps of (largest - smallest rank's collective time) / step time.",
        registry=registry,
    )
    steps = Gauge(promql.TRACE_STEPS, "Engine steps in the last analysed slice.", registry=registry)
    slices = Counter(promql.TRACE_SLICES, "Profiled slices analysed.", registry=registry)
    start_http_server(port, addr=host, registry=registry)
    watcher = TraceWatcher(Path(directory))
    os.makedirs(directory, exist_ok=True)
    log.info("watching %s for torch-profiler traces; metrics on http://%s:%d/metrics", directory, host, port)
    while True:
        figures = watcher.poll()
        if figures is not None:
            comm.set(figures.comm_fraction)
            skew.set(figures.rank_skew_fraction)
            steps.set(figures.steps)
            slices.inc()
            log.info("slice: %s", json.dumps(figures.to_json(), separators=(",", ":")))
        time.sleep(interval)


@click.command(name="trace", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("files", nargs=-1)
@click.option("--output", "-o", "output", default="table", metavar="table|json", help="table (default) or json.")
@click.option(
    "--watch",
    "watch_dir",
    default=None,
    metavar="DIR",
    help="Sidecar mode: read every complete slice of traces appearing in DIR (the engine's torch_profiler_dir).",
)
@click.option("--serve-metrics", default=None, metavar="HOST:PORT", help="With --watch: serve the figures as Prometheus gauges here.")
@click.option("--interval", default=1.0, show_default=True, help="With --watch: seconds between looks at DIR.")
def command(files: tuple[str, ...], output: str, watch_dir: str | None, serve_metrics: str | None, interval: float) -> None:
    """Print commFraction, rankSkewFraction, step time and per-rank figures for FILES.

    FILES: the torch-profiler traces of one engine's ranks (vLLM --profiler-config,
    POST /start_profile, /stop_profile), gzip or plain.
    """
    if output not in OUTPUTS:
        _fail(f"--output: expected one of {', '.join(OUTPUTS)}, got {output!r}")
    if watch_dir is not None:
        if files:
            _fail("FILE: not taken with --watch (the sidecar reads what appears in DIR)")
        if not serve_metrics:
            _fail("--serve-metrics: required with --watch (HOST:PORT or :PORT)")
        if interval <= 0:
            _fail(f"--interval: must be > 0; got {interval}")
        watch(watch_dir, serve_metrics, interval)
        return
    if not files:
        _fail("FILE: missing; expected one or more torch-profiler traces (...rank<R>.<ns>.pt.trace.json.gz)")
    try:
        figures = analyse_files(list(files))
    except TraceError as err:
        _fail(str(err))
    if output == "json":
        click.echo(json.dumps(figures.to_json(), indent=2))
    else:
        click.echo(format_table(figures))
