"""``kneepoint report NAME_OR_FILE``: the record table, comparisons, decision and a knee chart.

NAME_OR_FILE is a saved experiment (anything ``kneepoint decide`` reads) or the name of a
ParallelismExperiment on the cluster (current kube context, or ``--kubeconfig``;
``-n`` for the namespace). The report re-computes the decision from the tiers and the
spec, cross-checks it with ``status.decision``, and adds the KServe recommendation and
the GPU-minutes spent; ``--png`` writes the knee chart. ``--watch`` follows an
experiment on the cluster until it is Decided or Failed, printing a progress line when
it changes and the record table when the tiers change, then the report.

Output never contains terminal control codes, so a watched run reads the same in a
terminal, a log file or a README. Bad input is one line on stderr and exit code 2.
"""

from __future__ import annotations

import json
import sys
import time
import typing
from collections.abc import Callable

import click

from kneepoint.commands import experiment_source
from kneepoint.commands.experiment_source import SOURCE_CLUSTER, InputError, LoadedExperiment, NotFoundError
from kneepoint.core.decision import decide
from kneepoint.core.record_table import format_record_table
from kneepoint.core.status import TIER_FAILED, TIER_MEASURED, TIER_SKIPPED
from kneepoint.report.experiment_report import (
    ExperimentReport,
    ReportInput,
    build_report,
    chart_context,
    render_markdown,
    render_text,
    report_json,
)

OUTPUTS = ("table", "json", "markdown")
FINAL_PHASES = ("Decided", "Failed")
DEFAULT_INTERVAL_SECONDS = 5.0
MAX_READ_FAILURES = 5
"""Consecutive failed reads a watch tolerates (an API server restart) before it gives up."""


def report_input(exp: LoadedExperiment) -> ReportInput:
    """The renderer's view of a loaded experiment (status decision and recommendation checked)."""
    return ReportInput(
        spec=exp.spec,
        spec_given=exp.spec_given,
        tiers=exp.tiers,
        status=exp.status,
        status_decision=experiment_source.status_decision(exp),
        recommendation=experiment_source.status_recommendation(exp),
        name=exp.name,
        namespace=exp.namespace,
        source=exp.source,
        where=exp.where,
        simulated=exp.simulated,
    )


def make_report(exp: LoadedExperiment) -> ExperimentReport:
    try:
        return build_report(report_input(exp))
    except ValueError as err:  # tiers out of ladder order
        raise InputError(f"{exp.where}: status.tiers: {err}") from None


def write_chart(report: ExperimentReport, path: str) -> None:
    """Build the knee chart and write it as PNG; InputError naming --png when the path cannot be written
    or matplotlib (the `report` extra) is not installed."""
    try:
        from kneepoint.report.knee_chart import build_knee_figure, save_png  # matplotlib only when asked for
    except ModuleNotFoundError as err:
        if (err.name or "").partition(".")[0] != "matplotlib":
            raise
        raise InputError("--png needs matplotlib, which is not installed: pip install 'kneepoint[report]'") from None

    figure = build_knee_figure(report.outcome.tiers, report.decision, chart_context(report.input))
    try:
        save_png(figure, path)
    except OSError as err:
        raise InputError(f"--png {path}: cannot write: {err.strerror or err}") from None


def render(report: ExperimentReport, output: str, chart_path: str | None, export_hint: str) -> str:
    if output == "json":
        return json.dumps(report_json(report, chart_path), indent=2, ensure_ascii=False)
    if output == "markdown":
        return render_markdown(report, chart_path, export_hint)
    return render_text(report, chart_path, export_hint)


# --------------------------------------------------------------------------------------
# --watch


def progress_line(exp: LoadedExperiment, clock: Callable[[], float] = time.time) -> str:
    """``[HH:MM:SS] NS/NAME: phase Profiling; tier tp2-pp1 LoadTesting; 1/3 tiers done; MESSAGE``."""
    status = exp.status
    parts = [f"phase {exp.phase or 'Pending (no status yet)'}"]
    current = status.get("currentTier")
    if isinstance(current, str) and current:
        tier = next((t for t in exp.tiers if t.name == current), None)
        parts.append(f"tier {current}" + (f" {tier.phase}" if tier else ""))
    done = sum(1 for t in exp.tiers if t.phase in (TIER_MEASURED, TIER_SKIPPED, TIER_FAILED))
    parts.append(f"{done}/{len(exp.tiers)} tiers done")
    if status.get("message"):
        parts.append(" ".join(str(status["message"]).split()))
    stamp = time.strftime("%H:%M:%S", time.localtime(clock()))
    return f"[{stamp}] {exp.namespace}/{exp.name}: " + "; ".join(parts)


def _tiers_signature(exp: LoadedExperiment) -> tuple:
    return tuple((t.name, t.phase, t.output_tokens_per_second, t.latency_p99_ms, t.reason) for t in exp.tiers)


def watch_experiment(
    fetch: Callable[[], LoadedExperiment],
    echo: Callable[[str], None],
    warn: Callable[[str], None],
    interval: float = DEFAULT_INTERVAL_SECONDS,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> LoadedExperiment:
    """Read the experiment every ``interval`` seconds until its phase is Decided or Failed.

    Prints the progress line when it changes (the time stamp aside) and the record table
    when the tiers change. A read that fails after a first good one is reported and
    retried, up to MAX_READ_FAILURES in a row; a deleted experiment ends the watch.
    """
    last_progress = last_tiers = None
    failures = 0
    seen = False
    while True:
        try:
            exp = fetch()
        except NotFoundError:
            raise
        except InputError as err:
            failures += 1
            if not seen or failures >= MAX_READ_FAILURES:
                raise
            warn(f"{err} (retrying, {failures}/{MAX_READ_FAILURES})")
            sleep(interval)
            continue
        seen, failures = True, 0
        line = progress_line(exp, clock)
        progress = line.split("] ", 1)[1]
        if progress != last_progress:
            echo(line)
            last_progress = progress
        signature = _tiers_signature(exp)
        if signature != last_tiers:
            try:
                tiers = decide(exp.spec, exp.tiers).tiers  # ΔT/ΔP filled in
            except ValueError:
                tiers = exp.tiers
            echo(format_record_table(tiers))
            last_tiers = signature
        if exp.phase in FINAL_PHASES:
            return exp
        sleep(interval)


# --------------------------------------------------------------------------------------
# The command


def _fail(message: str) -> typing.NoReturn:
    click.echo(f"kneepoint report: error: {' '.join(message.split())}", err=True)
    sys.exit(2)


def _load(name_or_file: str, namespace: str | None, kubeconfig: str | None) -> LoadedExperiment:
    exp = experiment_source.load_experiment(name_or_file, namespace, kubeconfig, require_tiers=False)
    if not exp.spec_given and not exp.tiers:
        raise InputError(f"{exp.where}: status.tiers: expected a non-empty list of tier results, or a spec with a ladder")
    return exp


@click.command(name="report", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("name_or_file", required=False)
@click.option("--namespace", "-n", default=None, help="Namespace of the experiment (default: the kube context's, then default).")
@click.option(
    "--kubeconfig",
    default=None,
    metavar="PATH",
    help="Kubeconfig file (default: KUBECONFIG or ~/.kube/config, in a pod the service account).",
)
@click.option("--png", "png", default=None, metavar="PATH", help="Write the knee chart (throughput and P99 per tier, knee marked) as PNG.")
@click.option("--output", "-o", "output", default="table", metavar="table|json|markdown", help="table (default), json or markdown.")
@click.option("--watch", "-w", is_flag=True, help="Cluster only: follow the experiment until it is Decided or Failed, then report.")
@click.option(
    "--interval", default=str(DEFAULT_INTERVAL_SECONDS), metavar="SECONDS", help="Seconds between reads with --watch (default 5)."
)
def command(
    name_or_file: str | None, namespace: str | None, kubeconfig: str | None, png: str | None, output: str, watch: bool, interval: str
) -> None:
    """Report an experiment: record table, comparison blocks, decision, KServe recommendation, GPU-minutes.

    NAME_OR_FILE: a saved ParallelismExperiment (YAML/JSON, kubectl get pexp NAME -o yaml),
    a CSV of tier rows, '-' for stdin, or the name of an experiment on the cluster.
    """
    if output not in OUTPUTS:
        _fail(f"--output: expected one of {', '.join(OUTPUTS)}, got {output!r}")
    if not name_or_file:
        _fail("NAME_OR_FILE: missing; expected an experiment name on the cluster or a saved experiment file")
    try:
        seconds = float(interval)
    except ValueError:
        seconds = float("nan")
    if not 0.1 <= seconds <= 3600:
        _fail(f"--interval: expected seconds between 0.1 and 3600, got {interval!r}")
    exit_code = 0
    try:
        if watch:
            if experiment_source.looks_like_file(name_or_file):
                _fail(f"--watch: follows an experiment on the cluster; {name_or_file} is a file (drop --watch to report it)")
            cluster = experiment_source.open_cluster(kubeconfig, namespace)
            # Progress goes where it cannot spoil a JSON or Markdown document on stdout.
            to_stdout = output == "table"
            exp = watch_experiment(
                lambda: experiment_source.load_from_cluster(cluster, name_or_file, require_tiers=False),
                echo=lambda text: click.echo(text, err=not to_stdout),
                warn=lambda text: click.echo(f"kneepoint report: warning: {text}", err=True),
                interval=seconds,
            )
            if to_stdout:
                click.echo("")
            exit_code = 1 if exp.phase == "Failed" else 0
        else:
            exp = _load(name_or_file, namespace, kubeconfig)
        report = make_report(exp)
        if png:
            write_chart(report, png)
    except InputError as err:
        _fail(str(err))
    except KeyboardInterrupt:
        click.echo("kneepoint report: interrupted", err=True)
        sys.exit(130)
    hint = f"kneepoint export {name_or_file} --kserve" + (f" -n {exp.namespace}" if exp.source == SOURCE_CLUSTER and exp.namespace else "")
    click.echo(render(report, output, png, hint))
    sys.exit(exit_code)
