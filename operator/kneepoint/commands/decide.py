"""``kneepoint decide FILE``: the record table, comparison blocks and decision for measured tiers.

FILE is a ParallelismExperiment document (YAML or JSON; a saved ``kubectl get pexp NAME
-o yaml`` works) whose ``status.tiers`` holds measured results, its bare ``status``, or a
CSV of tier rows whose column names are TierResult JSON keys (``name`` or
``tensorParallel``, ``phase``, ``outputTokensPerSecond``, ``latencyP99Ms``, ...). The
document's ``spec`` supplies the ladder, stop rules and capacity; without one the
defaults apply and the ladder is the tiers present. Reading and checking the file is
``kneepoint.commands.experiment_source`` (shared with ``report`` and ``export``); all
deciding happens in ``kneepoint.core.decision``; this module only prints.

Bad input gives one line naming the file, the field and what was expected, and exit
code 2.
"""

from __future__ import annotations

import json
import sys
import typing
from typing import Any

import click
import yaml

from kneepoint.commands.experiment_source import InputError, LoadedExperiment, read_file, status_search
from kneepoint.core.apifields import to_json
from kneepoint.core.decision import STATE_DECIDED, DecisionOutcome, decide
from kneepoint.core.record_table import format_decision, format_record_table

OUTPUTS = ("table", "json", "yaml")


# --------------------------------------------------------------------------------------
# Printing


def status_document(data: LoadedExperiment, outcome: DecisionOutcome) -> dict[str, Any]:
    """The experiment's status with tiers (gains filled) and the decision replaced."""
    status = dict(data.status)
    status["tiers"] = [to_json(t) for t in outcome.tiers]
    if outcome.decision is not None:
        status["decision"] = to_json(outcome.decision)
    else:
        status.pop("decision", None)
    return status


def render_table(data: LoadedExperiment, outcome: DecisionOutcome) -> str:
    """The record table, the comparison blocks and the decision, as plain text."""
    r = data.spec.stop_rules
    source = "from the document's spec" if data.spec_given else "defaults, the file has no spec"
    parts = [
        f"stop rules ({source}): memoryHeadroom {r.memory_headroom:g}, minThroughputGain {r.min_throughput_gain:g}, "
        f"maxP99Degradation {r.max_p99_degradation:g}, maxCommFraction {r.max_comm_fraction:g}",
        "",
        format_record_table(outcome.tiers),
        "",
    ]
    if outcome.comparisons:
        parts += ["\n\n".join(outcome.comparisons), ""]
    if outcome.state == STATE_DECIDED and outcome.decision is not None:
        parts.append(format_decision(outcome.decision, outcome.capacity.explanation if outcome.capacity else None))
    else:
        parts.append(f"decision: none ({outcome.message})")
    return "\n".join(parts)


def _fail(message: str) -> typing.NoReturn:
    click.echo(f"kneepoint decide: error: {' '.join(message.split())}", err=True)
    sys.exit(2)


@click.command(name="decide", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("file", required=False)
@click.option(
    "--output", "-o", "output", default="table", metavar="table|json|yaml", help="table (default), or json/yaml: the experiment's status."
)
@click.option(
    "--budget-stopped",
    is_flag=True,
    help="The ladder was stopped for its GPU-hour budget: if no rule fired, decide the last measured tier (rule budget).",
)
def command(file: str | None, output: str, budget_stopped: bool) -> None:
    """Print the record table, the comparison blocks and the decision for FILE.

    FILE: a ParallelismExperiment (YAML or JSON, e.g. kubectl get pexp NAME -o yaml) whose
    status.tiers holds measured results, or a CSV of tier rows; '-' reads stdin.
    """
    if output not in OUTPUTS:
        _fail(f"--output: expected one of {', '.join(OUTPUTS)}, got {output!r}")
    if not file:
        _fail("FILE: missing; expected a ParallelismExperiment YAML/JSON file or a CSV of tier rows")
    try:
        data = read_file(file)
        outcome = decide(data.spec, data.tiers, budget_stopped=budget_stopped, search=status_search(data))
    except InputError as err:
        _fail(str(err))
    except ValueError as err:  # tiers out of ladder order
        _fail(f"{file}: status.tiers: {err}")
    if output == "table":
        click.echo(render_table(data, outcome))
    elif output == "json":
        click.echo(json.dumps(status_document(data, outcome), indent=2, ensure_ascii=False))
    else:
        click.echo(yaml.safe_dump(status_document(data, outcome), sort_keys=False, allow_unicode=True), nl=False)
