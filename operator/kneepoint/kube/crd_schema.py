"""The ParallelismExperiment CustomResourceDefinition, generated from the core dataclasses.

There is no controller-gen for Python, so this module plays its part: it walks the spec
and status dataclasses (``kneepoint.core.spec``, ``kneepoint.core.status``), whose fields
carry their description, default and constraints in ``api_field`` metadata, and builds

- the CRD as a plain dict: a structural OpenAPI v3 schema with descriptions on every field
  (so ``kubectl explain pexp.spec.stopRules`` teaches the method), the same defaults as the
  dataclasses (the API server fills them in, so ``kubectl get -o yaml`` shows the whole
  spec), the same bounds and enums as ``parse_spec``, and CEL rules for the cross-field
  checks that ``parse_spec`` makes in Python;
- the API reference in Markdown (``docs/api.md``) from the same walk.

Everything here is pure (no Kubernetes client, no I/O besides ``main``). Regenerate with::

    python -m kneepoint.kube.crd_schema > crds/parallelismexperiments.kneepoint.io.yaml
    python -m kneepoint.kube.crd_schema --markdown > docs/api.md

Contract tests (``tests/contract/test_crd.py``) fail when either committed file is stale.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
import typing
from dataclasses import MISSING, dataclass
from typing import Any, TypeGuard

import yaml

from kneepoint.core.apifields import json_name, to_json, unwrap_optional
from kneepoint.core.spec import CHAT_TEMPLATE_ALLOWANCE_TOKENS, ArchitectureSpec, ExperimentSpec, TiersSpec
from kneepoint.core.status import Condition, ExperimentStatus
from kneepoint.kube.naming import GROUP, KIND, PLURAL, VERSION

LIST_KIND = f"{KIND}List"
SINGULAR = "parallelismexperiment"
SHORT_NAMES = ("pexp",)
CATEGORIES = ("kneepoint",)
CRD_NAME = f"{PLURAL}.{GROUP}"

CRD_COMMAND = "python -m kneepoint.kube.crd_schema > crds/parallelismexperiments.kneepoint.io.yaml"
MARKDOWN_COMMAND = "python -m kneepoint.kube.crd_schema --markdown > docs/api.md"

ROOT_DESCRIPTION = (
    "ParallelismExperiment decides, with measurements, how many GPUs one replica of an LLM inference server "
    "should use (tensor-parallel and pipeline-parallel size) and how many replicas the peak load needs. "
    "The operator deploys the engine once per tier of the ladder (spec.tiers), load-tests every tier with the "
    "same fixed workload (spec.load), reads GPU and engine metrics from Prometheus, and stops adding GPUs when a "
    "stop rule (spec.stopRules) says that one more GPU no longer pays. status.decision names the rule that fired "
    "with its numbers, the replica count for the peak load and the cost per token."
)
SPEC_DESCRIPTION = (
    "Desired state: the model, the fixed workload and the stop-rule thresholds. Only tensor and pipeline "
    "parallelism change from one tier to the next; model, precision, lengths and concurrency stay fixed, "
    "so the tiers compare like with like."
)
STATUS_DESCRIPTION = (
    "Observed state, written by the operator through the status subresource only. conditions are the source "
    "of truth; phase is a one-word summary for printer columns."
)

# Lists keyed by a field (x-kubernetes-list-type: map): conditions merge by type, as in metav1.Condition.
LIST_MAP_KEYS: dict[type, tuple[str, ...]] = {Condition: ("type",)}

# Shape numbers parse_spec requires when the architecture is given as explicit numbers
# (kneepoint.core.spec._cross_field_checks); a contract test keeps the two in step.
ARCHITECTURE_NUMBERS_REQUIRED = ("numLayers", "hiddenSize", "numAttentionHeads", "intermediateSize", "vocabSize")
_ARCHITECTURE_SOURCES = ("preset", "config_map_ref")


@dataclass(frozen=True)
class CelRule:
    """One ``x-kubernetes-validations`` entry. ``{path}`` in ``message`` becomes the node's JSON path.

    Messages are static on purpose: kube-apiserver 1.36 refused the CRD when the length
    rule had a ``messageExpression`` printing the numbers (``'...' + string(n)``), whose
    estimated cost was more than 100x the schema's budget.
    """

    rule: str
    message: str
    field_path: str | None = None  # relative to the node, e.g. ".load.inputLen"

    def render(self, path: str) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.rule, "message": self.message.format(path=path)}
        if self.field_path:
            out["fieldPath"] = self.field_path
        return out


def _strictly_increasing_rule(max_items: int) -> str:
    # Standard CEL has no index range, so the indices are a literal list as long as
    # maxItems allows; no Kubernetes-only functions, so the rule also runs in cel-python.
    indices = ", ".join(str(i) for i in range(max_items - 1))
    return f"[{indices}].all(i, i + 1 >= self.size() || self[i] < self[i + 1])"


def _architecture_rules() -> tuple[CelRule, ...]:
    explicit = [json_name(f) for f in dataclasses.fields(ArchitectureSpec) if f.name not in _ARCHITECTURE_SOURCES]
    any_explicit = "(" + " || ".join(f"has(self.{name})" for name in explicit) + ")"
    at_most_one = f"[has(self.preset), has(self.configMapRef), {any_explicit}].filter(x, x).size() <= 1"
    complete = (
        f"has(self.preset) || has(self.configMapRef) || !{any_explicit} || ("
        + " && ".join(f"has(self.{name})" for name in ARCHITECTURE_NUMBERS_REQUIRED)
        + ")"
    )
    return (
        CelRule(at_most_one, "{path} may give at most one of preset, configMapRef or explicit numbers"),
        CelRule(
            complete,
            "{path} needs " + ", ".join(ARCHITECTURE_NUMBERS_REQUIRED[:-1]) + f" and {ARCHITECTURE_NUMBERS_REQUIRED[-1]}"
            " when the shape is given as numbers",
        ),
    )


def _spec_rules() -> tuple[CelRule, ...]:
    return (
        CelRule(
            "self.load.inputLen + self.load.outputLen <= self.model.maxModelLen",
            "{path}.load.inputLen + {path}.load.outputLen must be at most {path}.model.maxModelLen "
            "(prompt and output must fit the context limit)",
            field_path=".load.inputLen",
        ),
        CelRule(
            "self.load.endpoint != 'ChatCompletions' || self.load.inputLen + self.load.outputLen + "
            f"{CHAT_TEMPLATE_ALLOWANCE_TOKENS} <= self.model.maxModelLen",
            "{path}.load.inputLen + {path}.load.outputLen + "
            f"{CHAT_TEMPLATE_ALLOWANCE_TOKENS}"
            " tokens for the chat template must be at most {path}.model.maxModelLen when {path}.load.endpoint is ChatCompletions",
            field_path=".load.inputLen",
        ),
        CelRule(
            "!self.model.uri.startsWith('sim://') || self.mode == 'Simulate'",
            "{path}.model.uri may use sim:// only when {path}.mode is Simulate; use hf:// or pvc://",
            field_path=".model.uri",
        ),
    )


def object_rules(cls: type) -> tuple[CelRule, ...]:
    """CEL rules placed on the object schema of dataclass ``cls``."""
    if cls is ExperimentSpec:
        return _spec_rules()
    if cls is ArchitectureSpec:
        return _architecture_rules()
    return ()


def field_rules(cls: type, f: dataclasses.Field[Any]) -> tuple[CelRule, ...]:
    """CEL rules placed on the schema of one field (the ladder lists must increase)."""
    if cls is TiersSpec and f.name in ("tensor_parallel", "pipeline_parallel"):
        example = "[1, 2, 4, 8]" if f.name == "tensor_parallel" else "[1, 2]"
        return (
            CelRule(
                _strictly_increasing_rule(f.metadata["max_items"]),
                "{path} must be strictly increasing without repeats, for example " + example,
            ),
        )
    return ()


# --- the schema walk -------------------------------------------------------------------

_SCALAR_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean"}


def class_doc(cls: type) -> str:
    """The dataclass docstring as one paragraph ('' for the auto-generated signature doc)."""
    doc = inspect.getdoc(cls) or ""
    if doc.startswith(f"{cls.__name__}("):
        return ""
    return " ".join(doc.split())


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def _field_description(f: dataclasses.Field[Any], inner: Any) -> str:
    """The field's description; for an object field, joined with its type's docstring.

    A short field label that the docstring already says in other words ("Spending
    limits." vs "Limits on what the experiment may spend.") would read twice, so when most
    of the label's words are in the docstring, the docstring alone is used.
    """
    desc = " ".join(f.metadata["description"].split())
    doc = class_doc(inner) if _is_dataclass_type(inner) else ""
    if not doc:
        return desc
    label = _words(desc)
    if len(label & _words(doc)) > len(label) / 2:
        return doc
    return f"{desc} {doc}"


def _is_dataclass_type(tp: Any) -> TypeGuard[type[Any]]:
    """A dataclass itself (an annotation), not an instance of one."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _has_default(f: dataclasses.Field[Any]) -> bool:
    return f.default is not MISSING or f.default_factory is not MISSING


def _default_value(f: dataclasses.Field[Any], inner: Any) -> Any:
    """The field's default as JSON, or None when the field has none (or defaults to null)."""
    if f.default_factory is not MISSING:
        value = f.default_factory()
    elif f.default is not MISSING:
        value = f.default
    else:
        return None
    if value is None:
        return None
    if _is_dataclass_type(inner) and value == inner():
        # An empty object: the API server then applies the nested defaults itself, so each
        # default is written once, at its own field.
        return {}
    return to_json(value)


def _scalar_schema(tp: Any, meta: typing.Mapping[str, Any]) -> dict[str, Any]:
    if tp not in _SCALAR_TYPES:
        raise TypeError(f"no OpenAPI type for {tp!r}")
    schema: dict[str, Any] = {"type": _SCALAR_TYPES[tp]}
    if meta.get("enum") is not None:
        schema["enum"] = list(meta["enum"])
    if meta.get("minimum") is not None:
        schema["minimum"] = meta["minimum"]
        if meta.get("exclusive_minimum"):
            schema["exclusiveMinimum"] = True
    if meta.get("maximum") is not None:
        schema["maximum"] = meta["maximum"]
    if meta.get("pattern"):
        schema["pattern"] = meta["pattern"]
    if meta.get("max_length") is not None:
        schema["maxLength"] = meta["max_length"]
    return schema


def _type_schema(tp: Any, meta: typing.Mapping[str, Any], path: str, defaults: bool) -> dict[str, Any]:
    tp, _ = unwrap_optional(tp)
    if _is_dataclass_type(tp):
        return object_schema(tp, path, defaults=defaults)
    origin = typing.get_origin(tp)
    if origin in (tuple, list):
        item_tp = typing.get_args(tp)[0]
        item_meta = {"enum": meta.get("item_enum"), "minimum": meta.get("item_minimum"), "maximum": meta.get("item_maximum")}
        items = _type_schema(item_tp, item_meta, f"{path}[]", defaults)
        schema: dict[str, Any] = {"type": "array", "items": items}
        if meta.get("min_items") is not None:
            schema["minItems"] = meta["min_items"]
        if meta.get("max_items") is not None:
            schema["maxItems"] = meta["max_items"]
        keys = LIST_MAP_KEYS.get(item_tp) if isinstance(item_tp, type) else None
        if keys:
            schema["x-kubernetes-list-type"] = "map"
            schema["x-kubernetes-list-map-keys"] = list(keys)
        return schema
    if origin is dict:
        _, value_tp = typing.get_args(tp)
        return {"type": "object", "additionalProperties": _type_schema(value_tp, {}, f"{path}[]", defaults)}
    return _scalar_schema(tp, meta)


def object_schema(cls: type, path: str, *, defaults: bool, description: str | None = None) -> dict[str, Any]:
    """OpenAPI schema of dataclass ``cls`` found at JSON path ``path`` (``spec.model``).

    ``defaults`` adds each field's dataclass default as ``default`` (the spec); status has
    none, because a default there would make the API server report observations nobody made.
    """
    hints = typing.get_type_hints(cls)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        key = json_name(f)
        sub = f"{path}.{key}"
        inner, _ = unwrap_optional(hints[f.name])
        schema = _type_schema(hints[f.name], f.metadata, sub, defaults)
        schema["description"] = _field_description(f, inner)
        if defaults:
            value = _default_value(f, inner)
            if value is not None:
                schema["default"] = value
        if f.metadata.get("nullable"):
            schema["nullable"] = True
        if f.metadata.get("preserve_unknown"):
            schema["x-kubernetes-preserve-unknown-fields"] = True
        rules = [r.render(sub) for r in field_rules(cls, f)]
        if rules:
            schema.setdefault("x-kubernetes-validations", []).extend(rules)
        properties[key] = schema
        if f.metadata.get("required") or not _has_default(f):
            required.append(key)
    out: dict[str, Any] = {"type": "object", "properties": properties}
    desc = description if description is not None else class_doc(cls)
    if desc:
        out["description"] = desc
    if required:
        out["required"] = required
    rules = [r.render(path) for r in object_rules(cls)]
    if rules:
        out["x-kubernetes-validations"] = rules
    return out


def openapi_schema() -> dict[str, Any]:
    """The ``openAPIV3Schema`` of the CRD's only version."""
    return {
        "type": "object",
        "description": ROOT_DESCRIPTION,
        "properties": {
            "apiVersion": {
                "type": "string",
                "description": "Versioned schema of this representation of an object: kneepoint.io/v1alpha1.",
            },
            "kind": {"type": "string", "description": "Kind of the object: ParallelismExperiment."},
            # The API server allows nothing but type (and name/generateName rules) here.
            "metadata": {"type": "object"},
            "spec": object_schema(ExperimentSpec, "spec", defaults=True, description=SPEC_DESCRIPTION),
            "status": object_schema(ExperimentStatus, "status", defaults=False, description=STATUS_DESCRIPTION),
        },
        "required": ["spec"],
    }


# name, JSONPath, priority (1 = only with -o wide)
PRINTER_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("Phase", ".status.phase", 0),
    ("Tier", ".status.decidedTier", 0),
    ("Replicas", ".status.decision.replicas", 0),
    ("Rule", ".status.decision.rule", 0),
    ("Current", ".status.currentTier", 1),
    ("GPU-min", ".status.gpuMinutesTotal", 1),
    ("Mode", ".spec.mode", 1),
)


def schema_at(schema: dict[str, Any], json_path: str) -> dict[str, Any]:
    """The schema node at a simple JSONPath (``.status.decision.rule``); KeyError if absent."""
    node = schema
    for part in json_path.strip(".").split("."):
        node = node["properties"][part]
    return node


def printer_columns(schema: dict[str, Any]) -> list[dict[str, Any]]:
    """additionalPrinterColumns; type and description come from the schema node each column shows."""
    columns = []
    for name, path, priority in PRINTER_COLUMNS:
        node = schema_at(schema, path)
        column: dict[str, Any] = {
            "name": name,
            "type": node["type"],
            "jsonPath": path,
            "description": node["description"],
        }
        if priority:
            column["priority"] = priority
        columns.append(column)
    columns.append(
        {
            "name": "Age",
            "type": "date",
            "jsonPath": ".metadata.creationTimestamp",
            "description": "Time since the experiment was created.",
        }
    )
    return columns


def build_crd() -> dict[str, Any]:
    """The CustomResourceDefinition (apiextensions.k8s.io/v1) as a dict."""
    schema = openapi_schema()
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD_NAME},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": LIST_KIND,
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": list(SHORT_NAMES),
                "categories": list(CATEGORIES),
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": printer_columns(schema),
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


class _IndentedDumper(yaml.SafeDumper):
    """Indents block sequences under their key, as kubectl and controller-gen do."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def render_crd_yaml() -> str:
    """The CRD file's text: a header saying it is generated, then YAML with sorted keys."""
    header = (
        "# Generated from operator/kneepoint/core/spec.py and status.py by:\n"
        f"#   {CRD_COMMAND}\n"
        "# Do not edit: change the dataclasses' api_field metadata and regenerate.\n"
    )
    body = yaml.dump(build_crd(), Dumper=_IndentedDumper, sort_keys=True, allow_unicode=True, width=110, default_flow_style=False)
    return header + body


def main(argv: list[str] | None = None) -> int:
    """Print the CRD YAML (default) or the Markdown API reference (``--markdown``)."""
    parser = argparse.ArgumentParser(prog="python -m kneepoint.kube.crd_schema", description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print docs/api.md instead of the CRD")
    args = parser.parse_args(argv)
    if args.markdown:
        from kneepoint.kube.api_doc import render_markdown  # it reads this module's schema: imported here, not above

        sys.stdout.write(render_markdown())
    else:
        sys.stdout.write(render_crd_yaml())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
