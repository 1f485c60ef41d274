"""``kneepoint trace FILE...``: collective share and rank skew from one engine's profiler traces.

FILE is one rank's torch-profiler trace as vLLM writes it after ``POST /stop_profile``
(``...rank<R>.<ns>.pt.trace.json.gz``, gzip or plain JSON); give every rank of one profiled
slice. The reading and the figures are ``kneepoint.core.kineto_trace``; this module prints.
Bad input gives one line naming the file and what is wrong, and exit code 2.
"""

from __future__ import annotations

import json
import sys
import typing

import click

from kneepoint.core.kineto_trace import TraceError, analyse_files, format_table

OUTPUTS = ("table", "json")


def _fail(message: str) -> typing.NoReturn:
    click.echo(f"kneepoint trace: error: {' '.join(message.split())}", err=True)
    sys.exit(2)


@click.command(name="trace", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("files", nargs=-1)
@click.option("--output", "-o", "output", default="table", metavar="table|json", help="table (default) or json.")
def command(files: tuple[str, ...], output: str) -> None:
    """Print commFraction, rankSkewFraction, step time and per-rank figures for FILES.

    FILES: the torch-profiler traces of one engine's ranks (vLLM --profiler-config,
    POST /start_profile, /stop_profile), gzip or plain.
    """
    if output not in OUTPUTS:
        _fail(f"--output: expected one of {', '.join(OUTPUTS)}, got {output!r}")
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
