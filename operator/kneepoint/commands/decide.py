"""``kneepoint decide FILE``: the record table, comparison blocks and decision for measured tiers.

FILE is a ParallelismExperiment document (YAML or JSON; a saved ``kubectl get pexp NAME
-o yaml`` works) whose ``status.tiers`` holds measured results, its bare ``status``, or a
CSV of tier rows whose column names are TierResult JSON keys (``name`` or
``tensorParallel``, ``phase``, ``outputTokensPerSecond``, ``latencyP99Ms``, ...). The
document's ``spec`` supplies the ladder, stop rules and capacity; without one the
defaults apply and the ladder is the tiers present. All deciding happens in
``kneepoint.core.decision``; this module only reads and checks input and prints.

Bad input gives one line naming the file, the field and what was expected, and exit
code 2.
"""

from __future__ import annotations

import csv
import io
import json
import math
import sys
import typing
from dataclasses import dataclass, fields
from typing import Any, Mapping

import click
import yaml

from kneepoint.core.apifields import json_name, to_json, unwrap_optional
from kneepoint.core.decision import STATE_DECIDED, DecisionOutcome, decide
from kneepoint.core.record_table import format_decision, format_record_table
from kneepoint.core.spec import ExperimentSpec, ModelSpec, SpecError, parse_spec
from kneepoint.core.status import TIER_MEASURED, TIER_PENDING, TIER_PHASES, TierResult
from kneepoint.core.tiers import Tier, build_ladder, parse_tier_name

OUTPUTS = ("table", "json", "yaml")
KIND = "ParallelismExperiment"
API_GROUP = "kneepoint.io/"
# decide needs no model, but parse_spec requires one: a spec without spec.model gets this.
PLACEHOLDER_MODEL_URI = "hf://unspecified/model"

_TIER_FIELDS = {json_name(f): f for f in fields(TierResult)}
_TIER_TYPES = typing.get_type_hints(TierResult)


class InputError(Exception):
    """Bad input; the message is one line: ``FILE: field: what was expected``."""


@dataclass(frozen=True)
class DecideInput:
    """What the file holds, checked."""

    spec: ExperimentSpec
    spec_given: bool
    tiers: tuple[TierResult, ...]
    status: dict[str, Any]


# --------------------------------------------------------------------------------------
# Reading and checking


def _convert(value: Any, key: str, where: str, from_text: bool) -> Any:
    """Check (and, for CSV text, convert) one tier field's value against its declared type."""
    tp, _ = unwrap_optional(_TIER_TYPES[_TIER_FIELDS[key].name])
    field_path = f"{where}.{key}" if not from_text else f"{where}, column {key}"
    if typing.get_origin(tp) is tuple:
        if from_text:
            return tuple(part.strip() for part in value.split(";") if part.strip())
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise InputError(f"{field_path}: expected a list of strings, got {value!r}")
        return tuple(value)
    if tp is bool:
        if from_text:
            lowered = value.strip().lower()
            if lowered in ("true", "false"):
                return lowered == "true"
        elif isinstance(value, bool):
            return value
        raise InputError(f"{field_path}: expected true or false, got {value!r}")
    if tp is str:
        if not isinstance(value, str):
            raise InputError(f"{field_path}: expected a string, got {value!r}")
        return value
    if tp in (int, float):
        number: Any = value
        if from_text:
            try:
                number = float(value)
            except ValueError:
                number = None
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
            raise InputError(f"{field_path}: expected a {'whole ' if tp is int else ''}number, got {value!r}")
        if tp is int:
            if float(number) != int(number):
                raise InputError(f"{field_path}: expected a whole number, got {value!r}")
            return int(number)
        return float(number)
    raise InputError(f"{field_path}: unsupported field")  # pragma: no cover - every TierResult field is covered above


def parse_tier(data: Any, where: str, from_text: bool = False) -> TierResult:
    """One tier (a status.tiers item or a CSV row) -> TierResult, or InputError naming the field."""
    if not isinstance(data, Mapping):
        raise InputError(f"{where}: expected a mapping of tier fields, got {data!r}")
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in _TIER_FIELDS:
            what = f"column {key!r}" if from_text else f"{key}"
            raise InputError(
                f"{where}{', ' if from_text else '.'}{what}: unknown tier field; expected TierResult keys such as "
                "name, tensorParallel, phase, outputTokensPerSecond, latencyP99Ms, peakMemoryGiB, commFraction"
            )
        if value is None or (from_text and value.strip() == ""):
            continue
        kwargs[_TIER_FIELDS[key].name] = _convert(value, key, where, from_text)

    sep = ", column " if from_text else "."
    name = kwargs.get("name")
    named: Tier | None = None
    if name is not None:
        try:
            named = parse_tier_name(name)
        except ValueError:
            raise InputError(f"{where}{sep}name: expected tpN-ppM (for example tp2-pp1), got {name!r}") from None
    tp = kwargs.get("tensor_parallel", named.tensor_parallel if named else None)
    pp = kwargs.get("pipeline_parallel", named.pipeline_parallel if named else 1)
    if tp is None:
        raise InputError(f"{where}{sep}tensorParallel: required (or a name like tp2-pp1)")
    for key, value in (("tensorParallel", tp), ("pipelineParallel", pp)):
        if value < 1:
            raise InputError(f"{where}{sep}{key}: expected a whole number of at least 1, got {value}")
    tier = Tier(tp, pp)
    if named is not None and named != tier:
        raise InputError(f"{where}{sep}name: {name!r} disagrees with tensorParallel {tp} and pipelineParallel {pp}")
    if kwargs.get("gpus", tier.gpus) != tier.gpus:
        raise InputError(f"{where}{sep}gpus: expected tensorParallel x pipelineParallel = {tier.gpus}, got {kwargs['gpus']}")
    phase = kwargs.get("phase", TIER_MEASURED if from_text else TIER_PENDING)
    if phase not in TIER_PHASES:
        raise InputError(f"{where}{sep}phase: expected one of {', '.join(TIER_PHASES)}, got {phase!r}")
    if phase == TIER_MEASURED and not (kwargs.get("output_tokens_per_second") or 0) > 0:
        raise InputError(f"{where}{sep}outputTokensPerSecond: a Measured tier needs a positive number, got {kwargs.get('output_tokens_per_second')!r}")
    kwargs.update(tensor_parallel=tp, pipeline_parallel=pp, gpus=tier.gpus, name=tier.name, phase=phase)
    return TierResult(**kwargs)


def _read_csv(text: str, where: str) -> list[TierResult]:
    reader = csv.DictReader(io.StringIO(text))
    if not reader.fieldnames:
        raise InputError(f"{where}: expected a CSV header row naming tier fields (name or tensorParallel, outputTokensPerSecond, ...)")
    tiers = []
    for row in reader:
        if None in row:
            raise InputError(f"{where}: line {reader.line_num}: more cells than header columns")
        if all((v or "").strip() == "" for v in row.values()):
            continue
        tiers.append(parse_tier({k.strip(): (v or "") for k, v in row.items()}, f"{where}: line {reader.line_num}", from_text=True))
    if not tiers:
        raise InputError(f"{where}: no tier rows after the header")
    return tiers


def _parse_document(doc: Any, where: str) -> tuple[Any, dict[str, Any]]:
    """(raw spec or None, status mapping) from a ParallelismExperiment, a one-item List or a bare status."""
    if not isinstance(doc, Mapping):
        raise InputError(f"{where}: expected a {KIND} document (a mapping), got {type(doc).__name__}")
    if doc.get("kind") == "List":
        items = doc.get("items")
        if not isinstance(items, list) or len(items) != 1:
            count = len(items) if isinstance(items, list) else 0
            raise InputError(f"{where}: items: expected exactly one {KIND} in the List, got {count} (use kubectl get pexp NAME -o yaml)")
        return _parse_document(items[0], f"{where}: items[0]")
    if "tiers" in doc and "status" not in doc and "spec" not in doc:
        return None, dict(doc)  # a bare status (kubectl ... -o jsonpath='{.status}')
    kind = doc.get("kind")
    if kind is not None and kind != KIND:
        raise InputError(f"{where}: kind: expected {KIND}, got {kind!r}")
    api_version = doc.get("apiVersion")
    if api_version is not None and not str(api_version).startswith(API_GROUP):
        raise InputError(f"{where}: apiVersion: expected {API_GROUP}v1alpha1, got {api_version!r}")
    status = doc.get("status")
    if status is None:
        raise InputError(f"{where}: status.tiers: missing; expected the measured tiers (save the experiment after its ladder ran)")
    if not isinstance(status, Mapping):
        raise InputError(f"{where}: status: expected a mapping, got {type(status).__name__}")
    return doc.get("spec"), dict(status)


def _parse_spec(raw: Any, where: str) -> ExperimentSpec:
    if not isinstance(raw, Mapping):
        raise InputError(f"{where}: spec: expected a mapping, got {type(raw).__name__}")
    data = dict(raw)
    data.setdefault("model", {"uri": PLACEHOLDER_MODEL_URI})
    try:
        return parse_spec(data)
    except SpecError as err:
        raise InputError(f"{where}: " + "; ".join(str(e) for e in err.errors)) from None


def _order_by_ladder(spec: ExperimentSpec, tiers: list[TierResult], where: str) -> tuple[TierResult, ...]:
    ladder = build_ladder(spec.tiers.tensor_parallel, spec.tiers.pipeline_parallel)
    by_name: dict[str, TierResult] = {}
    for i, t in enumerate(tiers):
        assert t.name is not None
        if t.name not in {lt.name for lt in ladder}:
            raise InputError(
                f"{where}: status.tiers[{i}]: tier {t.name} is not in the ladder of spec.tiers ({', '.join(lt.name for lt in ladder)})"
            )
        if t.name in by_name:
            raise InputError(f"{where}: status.tiers[{i}]: tier {t.name} appears twice")
        by_name[t.name] = t
    # A ladder tier the status lacks has not run yet.
    return tuple(
        by_name.get(lt.name) or TierResult(tensor_parallel=lt.tensor_parallel, pipeline_parallel=lt.pipeline_parallel, gpus=lt.gpus, name=lt.name)
        for lt in ladder
    )


def _order_without_spec(tiers: list[TierResult], where: str) -> tuple[TierResult, ...]:
    seen: dict[int, TierResult] = {}
    for t in tiers:
        if t.gpus in seen:
            raise InputError(f"{where}: tiers {seen[t.gpus].name} and {t.name} both use {t.gpus} GPUs; a ladder has one tier per GPU count")
        seen[t.gpus] = t
    return tuple(sorted(tiers, key=lambda t: t.gpus))


def read_input(path: str) -> DecideInput:
    """Read and check FILE ('-' for stdin); raise InputError with one line on any problem."""
    where = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
    except FileNotFoundError:
        raise InputError(f"{where}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"{where}: is a directory; expected a YAML, JSON or CSV file") from None
    except UnicodeDecodeError:
        raise InputError(f"{where}: not UTF-8 text; expected a YAML, JSON or CSV file") from None
    except OSError as err:
        raise InputError(f"{where}: cannot read: {err.strerror}") from None

    if path.lower().endswith(".csv"):
        tiers = _read_csv(text, where)
        spec = ExperimentSpec(model=ModelSpec(uri=PLACEHOLDER_MODEL_URI))
        return DecideInput(spec, False, _order_without_spec(tiers, where), {})

    try:
        doc = json.loads(text) if path.lower().endswith(".json") else yaml.safe_load(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{where}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise InputError(f"{where}: not valid YAML ({at}{problem})") from None
    raw_spec, status = _parse_document(doc, where)
    raw_tiers = status.get("tiers")
    if not isinstance(raw_tiers, list) or not raw_tiers:
        got = "nothing" if raw_tiers is None else repr(raw_tiers)[:60]
        raise InputError(f"{where}: status.tiers: expected a non-empty list of tier results, got {got}")
    tiers = [parse_tier(item, f"{where}: status.tiers[{i}]") for i, item in enumerate(raw_tiers)]
    if raw_spec is None:
        spec = ExperimentSpec(model=ModelSpec(uri=PLACEHOLDER_MODEL_URI))
        return DecideInput(spec, False, _order_without_spec(tiers, where), status)
    spec = _parse_spec(raw_spec, where)
    return DecideInput(spec, True, _order_by_ladder(spec, tiers, where), status)


# --------------------------------------------------------------------------------------
# Printing


def status_document(data: DecideInput, outcome: DecisionOutcome) -> dict[str, Any]:
    """The experiment's status with tiers (gains filled) and the decision replaced."""
    status = dict(data.status)
    status["tiers"] = [to_json(t) for t in outcome.tiers]
    if outcome.decision is not None:
        status["decision"] = to_json(outcome.decision)
    else:
        status.pop("decision", None)
    return status


def render_table(data: DecideInput, outcome: DecisionOutcome) -> str:
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
@click.option("--output", "-o", "output", default="table", metavar="table|json|yaml", help="table (default), or json/yaml: the experiment's status.")
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
        data = read_input(file)
        outcome = decide(data.spec, data.tiers, budget_stopped=budget_stopped)
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
