"""Loading a ParallelismExperiment for the commands: from a file or from the cluster.

``kneepoint decide``, ``report`` and ``export`` read the same things: a saved experiment
(YAML or JSON, e.g. ``kubectl get pexp NAME -o yaml``; a one-item List; a bare status; or
a CSV of tier rows) or the live object on the API server. Either way the document goes
through the same checks here and comes out as a :class:`LoadedExperiment` whose tiers
are in ladder order, ready for ``kneepoint.core.decision.decide``.

Every problem is an :class:`InputError` with one line naming the file (or
``experiment NS/NAME``), the field and what was expected; the commands print it and exit
2. The cluster part is deliberately thin (get one custom object, get one ConfigMap):
the Kubernetes client is imported only when a name, not a file, is given.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import sys
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import yaml

from kneepoint.core.apifields import from_json, json_name, unwrap_optional
from kneepoint.core.rule_names import RULES
from kneepoint.core.spec import ExperimentSpec, ModelSpec, SpecError, parse_spec
from kneepoint.core.status import TIER_MEASURED, TIER_PENDING, TIER_PHASES, ConcurrencySearch, Decision, Recommendation, TierResult
from kneepoint.core.tiers import Tier, build_ladder, parse_tier_name
from kneepoint.kube.naming import API_VERSION, GROUP, KIND

# decide needs no model, but parse_spec requires one: a spec without spec.model gets this.
PLACEHOLDER_MODEL_URI = "hf://unspecified/model"

SOURCE_FILE = "file"
SOURCE_CLUSTER = "cluster"
FILE_SUFFIXES = (".yaml", ".yml", ".json", ".csv")
API_TIMEOUT_SECONDS = 15

_TIER_FIELDS = {json_name(f): f for f in fields(TierResult)}
_TIER_TYPES = typing.get_type_hints(TierResult)


class InputError(Exception):
    """Bad input; the message is one line: ``FILE: field: what was expected``."""


class NotFoundError(InputError):
    """The API server has no such object (``experiment NS/NAME not found``)."""


@dataclass(frozen=True)
class LoadedExperiment:
    """A checked experiment: its spec, its tiers in ladder order and its raw status."""

    spec: ExperimentSpec
    spec_given: bool
    """False when the document had no spec (defaults apply, the ladder is the tiers present)."""
    tiers: tuple[TierResult, ...]
    status: dict[str, Any]
    where: str = ""
    """What error messages start with: the file name or ``experiment NS/NAME``."""
    source: str = SOURCE_FILE
    name: str | None = None
    namespace: str | None = None
    uid: str | None = None

    @property
    def phase(self) -> str | None:
        phase = self.status.get("phase")
        return phase if isinstance(phase, str) else None

    @property
    def simulated(self) -> bool:
        """True when the status, the spec's mode or any measured tier says the numbers are simulated."""
        if self.status.get("simulated") is True:
            return True
        if self.spec_given and self.spec.mode == "Simulate":
            return True
        return any(t.simulated for t in self.tiers if t.phase == TIER_MEASURED)


# --------------------------------------------------------------------------------------
# Tiers


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
    if isinstance(tp, type) and dataclasses.is_dataclass(tp) and not from_text:
        # A nested record the operator writes (predict-first's tier prediction): its own keys, as status has them.
        if not isinstance(value, Mapping):
            raise InputError(f"{field_path}: expected a mapping, got {value!r}")
        known = {json_name(f) for f in fields(tp)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise InputError(f"{field_path}.{unknown[0]}: unknown field; expected one of {', '.join(sorted(known))}")
        return from_json(tp, value)
    raise InputError(f"{field_path}: not a CSV column" if from_text else f"{field_path}: unsupported field")


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
        raise InputError(
            f"{where}{sep}outputTokensPerSecond: a Measured tier needs a positive number, got {kwargs.get('output_tokens_per_second')!r}"
        )
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
        by_name.get(lt.name)
        or TierResult(tensor_parallel=lt.tensor_parallel, pipeline_parallel=lt.pipeline_parallel, gpus=lt.gpus, name=lt.name)
        for lt in ladder
    )


def _order_without_spec(tiers: list[TierResult], where: str) -> tuple[TierResult, ...]:
    seen: dict[int, TierResult] = {}
    for t in tiers:
        if t.gpus in seen:
            raise InputError(f"{where}: tiers {seen[t.gpus].name} and {t.name} both use {t.gpus} GPUs; a ladder has one tier per GPU count")
        seen[t.gpus] = t
    return tuple(sorted(tiers, key=lambda t: t.gpus))


# --------------------------------------------------------------------------------------
# Documents


def _split_document(doc: Any, where: str, require_tiers: bool) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(raw spec or None, status mapping, metadata) from a ParallelismExperiment, a one-item List or a bare status."""
    if not isinstance(doc, Mapping):
        raise InputError(f"{where}: expected a {KIND} document (a mapping), got {type(doc).__name__}")
    if doc.get("kind") == "List":
        items = doc.get("items")
        if not isinstance(items, list) or len(items) != 1:
            count = len(items) if isinstance(items, list) else 0
            raise InputError(f"{where}: items: expected exactly one {KIND} in the List, got {count} (use kubectl get pexp NAME -o yaml)")
        return _split_document(items[0], f"{where}: items[0]", require_tiers)
    if "tiers" in doc and "status" not in doc and "spec" not in doc:
        return None, dict(doc), {}  # a bare status (kubectl ... -o jsonpath='{.status}')
    kind = doc.get("kind")
    if kind is not None and kind != KIND:
        raise InputError(f"{where}: kind: expected {KIND}, got {kind!r}")
    api_version = doc.get("apiVersion")
    if api_version is not None and not str(api_version).startswith(f"{GROUP}/"):
        raise InputError(f"{where}: apiVersion: expected {API_VERSION}, got {api_version!r}")
    metadata = doc.get("metadata")
    metadata = dict(metadata) if isinstance(metadata, Mapping) else {}
    status = doc.get("status")
    if status is None:
        if require_tiers:
            raise InputError(f"{where}: status.tiers: missing; expected the measured tiers (save the experiment after its ladder ran)")
        status = {}
    if not isinstance(status, Mapping):
        raise InputError(f"{where}: status: expected a mapping, got {type(status).__name__}")
    return doc.get("spec"), dict(status), metadata


def _parse_spec(raw: Any, where: str) -> ExperimentSpec:
    if not isinstance(raw, Mapping):
        raise InputError(f"{where}: spec: expected a mapping, got {type(raw).__name__}")
    data = dict(raw)
    data.setdefault("model", {"uri": PLACEHOLDER_MODEL_URI})
    try:
        return parse_spec(data)
    except SpecError as err:
        raise InputError(f"{where}: " + "; ".join(str(e) for e in err.errors)) from None


def read_document(doc: Any, where: str, *, require_tiers: bool = True, source: str = SOURCE_FILE) -> LoadedExperiment:
    """Check a parsed document (file contents or the API server's object) and order its tiers.

    With ``require_tiers`` False an experiment whose ladder has not started (no status, or
    no tiers yet) is accepted: its tiers are the spec's ladder, all Pending.
    """
    raw_spec, status, metadata = _split_document(doc, where, require_tiers)
    raw_tiers = status.get("tiers")
    if require_tiers and (not isinstance(raw_tiers, list) or not raw_tiers):
        got = "nothing" if raw_tiers is None else repr(raw_tiers)[:60]
        raise InputError(f"{where}: status.tiers: expected a non-empty list of tier results, got {got}")
    if raw_tiers is None:
        raw_tiers = []
    if not isinstance(raw_tiers, list):
        raise InputError(f"{where}: status.tiers: expected a list of tier results, got {repr(raw_tiers)[:60]}")
    tiers = [parse_tier(item, f"{where}: status.tiers[{i}]") for i, item in enumerate(raw_tiers)]
    common: dict[str, Any] = dict(
        status=status,
        where=where,
        source=source,
        name=metadata.get("name") if isinstance(metadata.get("name"), str) else None,
        namespace=metadata.get("namespace") if isinstance(metadata.get("namespace"), str) else None,
        uid=metadata.get("uid") if isinstance(metadata.get("uid"), str) else None,
    )
    if raw_spec is None:
        spec = ExperimentSpec(model=ModelSpec(uri=PLACEHOLDER_MODEL_URI))
        return LoadedExperiment(spec, False, _order_without_spec(tiers, where), **common)
    spec = _parse_spec(raw_spec, where)
    return LoadedExperiment(spec, True, _order_by_ladder(spec, tiers, where), **common)


def read_file(path: str, *, require_tiers: bool = True) -> LoadedExperiment:
    """Read and check FILE ('-' for stdin): YAML, JSON or a CSV of tier rows."""
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
        return LoadedExperiment(spec, False, _order_without_spec(tiers, where), {}, where=where)

    try:
        doc = json.loads(text) if path.lower().endswith(".json") else yaml.safe_load(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{where}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg})") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise InputError(f"{where}: not valid YAML ({at}{problem})") from None
    return read_document(doc, where, require_tiers=require_tiers)


# --------------------------------------------------------------------------------------
# The operator's own decision and recommendation in status


def _check_whole(data: Mapping[str, Any], key: str, where: str, minimum: int = 1) -> None:
    value = data.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(f"{where}.{key}: expected a whole number of at least {minimum}, got {value!r}")


def status_search(experiment: LoadedExperiment) -> ConcurrencySearch | None:
    """status.concurrencySearch as written by the operator (its points give the searched per-replica concurrency)."""
    raw = experiment.status.get("concurrencySearch")
    if raw is None:
        return None
    if not isinstance(raw, Mapping) or not isinstance(raw.get("points", []), list):
        raise InputError(f"{experiment.where}: status.concurrencySearch: expected a mapping with a list of points")
    search: ConcurrencySearch | None = from_json(ConcurrencySearch, raw)
    return search


def status_decision(experiment: LoadedExperiment) -> Decision | None:
    """status.decision as written by the operator, or None; InputError if it is malformed."""
    raw = experiment.status.get("decision")
    if raw is None:
        return None
    where = f"{experiment.where}: status.decision"
    if not isinstance(raw, Mapping):
        raise InputError(f"{where}: expected a mapping, got {type(raw).__name__}")
    if "tensorParallel" not in raw:
        raise InputError(f"{where}.tensorParallel: required")
    for key in ("tensorParallel", "pipelineParallel", "gpusPerReplica", "replicas"):
        _check_whole(raw, key, where)
    rule = raw.get("rule")
    if rule is not None and rule not in RULES:
        raise InputError(f"{where}.rule: expected one of {', '.join(RULES)}, got {rule!r}")
    return typing.cast(Decision, from_json(Decision, dict(raw)))


def status_recommendation(experiment: LoadedExperiment) -> Recommendation | None:
    """status.recommendation (the ConfigMap holding the InferenceService), or None."""
    raw = experiment.status.get("recommendation")
    if raw is None:
        return None
    where = f"{experiment.where}: status.recommendation"
    if not isinstance(raw, Mapping):
        raise InputError(f"{where}: expected a mapping, got {type(raw).__name__}")
    if not isinstance(raw.get("configMapName"), str) or not raw["configMapName"]:
        raise InputError(f"{where}.configMapName: expected a ConfigMap name, got {raw.get('configMapName')!r}")
    for key in ("minReplicas", "maxReplicas", "scaleTarget"):
        _check_whole(raw, key, where, minimum=0)
    return typing.cast(Recommendation, from_json(Recommendation, dict(raw)))


# --------------------------------------------------------------------------------------
# The cluster


def looks_like_file(name_or_file: str) -> bool:
    """A path, not an object name: it exists, is '-', has a directory part or a file suffix."""
    return (
        name_or_file == "-"
        or os.path.exists(name_or_file)
        or os.sep in name_or_file
        or "/" in name_or_file
        or name_or_file.lower().endswith(FILE_SUFFIXES)
    )


class ClusterSource:
    """Reads ParallelismExperiments and ConfigMaps through the current kube context (or ``kubeconfig``).

    Only GETs; no watch, no writes. ``namespace`` defaults to the context's namespace, then
    ``default``. Connection and API failures become one-line :class:`InputError` messages.
    """

    def __init__(self, kubeconfig: str | None = None, namespace: str | None = None) -> None:
        from kubernetes import client, config  # imported here: a file-only run never needs it

        self._api_exception = client.ApiException
        try:
            if kubeconfig is None and not os.environ.get("KUBECONFIG") and not os.path.exists(os.path.expanduser("~/.kube/config")):
                config.load_incluster_config()
                api_client = client.ApiClient()
                context_namespace = _in_cluster_namespace()
            else:
                api_client = config.new_client_from_config(config_file=kubeconfig)
                _, active = config.list_kube_config_contexts(config_file=kubeconfig)
                context_namespace = (active or {}).get("context", {}).get("namespace")
        except (config.ConfigException, OSError, TypeError, KeyError) as err:
            where = f"--kubeconfig {kubeconfig}" if kubeconfig else "kubeconfig"
            detail = " ".join(str(err).split()) or type(err).__name__
            raise InputError(
                f"{where}: cannot load a Kubernetes configuration ({detail}); pass --kubeconfig PATH or set KUBECONFIG"
            ) from None
        self.namespace: str = namespace or context_namespace or "default"
        self.server: str = str(api_client.configuration.host)
        self._custom = client.CustomObjectsApi(api_client)
        self._core = client.CoreV1Api(api_client)

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        import urllib3

        try:
            return fn(*args, _request_timeout=API_TIMEOUT_SECONDS)
        except self._api_exception as err:
            if err.status == 404:
                raise NotFoundError(f"{what} not found") from None
            reason = _api_error_message(err)
            raise InputError(
                f"{what}: the API server at {self.server} answered {err.status} {err.reason}{': ' + reason if reason else ''}"
            ) from None
        except (urllib3.exceptions.HTTPError, OSError) as err:
            detail = " ".join(str(err).split())[:200]
            raise InputError(f"{what}: cannot reach the API server at {self.server} ({detail})") from None

    def get_experiment(self, name: str) -> dict[str, Any]:
        """The ParallelismExperiment as the API server returns it (a dict)."""
        from kneepoint.kube import naming

        what = f"experiment {self.namespace}/{name}"
        return typing.cast(
            dict,
            self._call(what, self._custom.get_namespaced_custom_object, naming.GROUP, naming.VERSION, self.namespace, naming.PLURAL, name),
        )

    def get_config_map_data(self, name: str) -> dict[str, str]:
        """The ``data`` of a ConfigMap in the namespace."""
        config_map = self._call(f"ConfigMap {self.namespace}/{name}", self._core.read_namespaced_config_map, name, self.namespace)
        return dict(config_map.data or {})


def _in_cluster_namespace() -> str | None:
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace", encoding="utf-8") as handle:
            return handle.read().strip() or None
    except OSError:
        return None


def _api_error_message(err: Any) -> str:
    """The Status message of an ApiException body, on one line."""
    try:
        body = json.loads(err.body or "")
        return " ".join(str(body.get("message", "")).split())[:300]
    except (ValueError, AttributeError):
        return ""


def open_cluster(kubeconfig: str | None, namespace: str | None) -> ClusterSource:
    """The cluster reader the commands use (tests replace this function)."""
    return ClusterSource(kubeconfig, namespace)


def load_from_cluster(cluster: ClusterSource, name: str, *, require_tiers: bool = True) -> LoadedExperiment:
    """Get experiment NAME and check it like a file."""
    doc = cluster.get_experiment(name)
    return read_document(doc, f"experiment {cluster.namespace}/{name}", require_tiers=require_tiers, source=SOURCE_CLUSTER)


def load_experiment(
    name_or_file: str,
    namespace: str | None = None,
    kubeconfig: str | None = None,
    *,
    require_tiers: bool = True,
) -> LoadedExperiment:
    """A file when ``name_or_file`` looks like one (see :func:`looks_like_file`), else the cluster's experiment of that name."""
    if looks_like_file(name_or_file):
        return read_file(name_or_file, require_tiers=require_tiers)
    return load_from_cluster(open_cluster(kubeconfig, namespace), name_or_file, require_tiers=require_tiers)
