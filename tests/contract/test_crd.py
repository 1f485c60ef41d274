"""The committed CRD is the generated one, is structural, and agrees with the dataclasses.

The API server's own verdict comes later, in the sandbox's integration tests; here
``crd_validation`` re-does its checks (structural rules, defaulting, schema, CEL).
"""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from crd_validation import (
    apply_defaults,
    cel_errors,
    compile_rule,
    resolve_field_path,
    schema_errors,
    structural_violations,
)

from kneepoint.core.apifields import json_name, to_json, unwrap_optional
from kneepoint.core.spec import TP_SIZES, ExperimentSpec, parse_spec
from kneepoint.core.status import ExperimentStatus
from kneepoint.kube import api_doc, crd_schema

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "parallelismexperiments.kneepoint.io.yaml"
API_DOC = ROOT / "docs" / "api.md"


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_FILE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def schema(crd: dict[str, Any]) -> dict[str, Any]:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _all_nodes(node: dict[str, Any], path: str = "") -> typing.Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, sub in node.get("properties", {}).items():
        yield from _all_nodes(sub, f"{path}.{name}" if path else name)
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from _all_nodes(node[key], f"{path}[]")


def test_committed_crd_is_the_generated_one() -> None:
    assert CRD_FILE.read_text(encoding="utf-8") == crd_schema.render_crd_yaml(), (
        f"crds/ is stale; regenerate with: {crd_schema.CRD_COMMAND}"
    )


def test_committed_api_reference_is_current() -> None:
    assert API_DOC.read_text(encoding="utf-8") == api_doc.render_markdown(), (
        f"docs/api.md is stale; regenerate with: {crd_schema.MARKDOWN_COMMAND}"
    )


def test_api_reference_has_a_row_per_field_and_working_links(schema: dict[str, Any]) -> None:
    text = api_doc.render_markdown()
    for path, _node in _all_nodes(schema):
        if path.startswith(("spec.", "status.")) and not path.endswith("[]"):
            assert f"| `{path.rsplit('.', 1)[1]}` |" in text, path
    anchors = set(re.findall(r'<a id="([^"]+)"></a>', text))
    links = set(re.findall(r"\]\(#([^)]+)\)", text))
    assert links and links <= anchors


def test_committed_crd_starts_with_a_generated_header() -> None:
    first = CRD_FILE.read_text(encoding="utf-8").splitlines()[:3]
    assert first[0].startswith("# Generated") and crd_schema.CRD_COMMAND in first[1]


def test_names_scope_and_version(crd: dict[str, Any]) -> None:
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["metadata"]["name"] == "parallelismexperiments.kneepoint.io"
    spec = crd["spec"]
    assert spec["group"] == "kneepoint.io"
    assert spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "ParallelismExperiment",
        "listKind": "ParallelismExperimentList",
        "plural": "parallelismexperiments",
        "singular": "parallelismexperiment",
        "shortNames": ["pexp"],
        "categories": ["kneepoint"],
    }
    (version,) = spec["versions"]
    assert (version["name"], version["served"], version["storage"]) == ("v1alpha1", True, True)
    assert version["subresources"] == {"status": {}}


def test_printer_columns(crd: dict[str, Any], schema: dict[str, Any]) -> None:
    columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
    always = [c["name"] for c in columns if not c.get("priority")]
    assert always == ["Phase", "Tier", "Replicas", "Rule", "Age"]
    by_name = {c["name"]: c for c in columns}
    assert by_name["Phase"]["jsonPath"] == ".status.phase"
    assert by_name["Replicas"]["jsonPath"] == ".status.decision.replicas"
    assert by_name["Rule"]["jsonPath"] == ".status.decision.rule"
    assert by_name["GPU-min"] == {
        "name": "GPU-min",
        "type": "number",
        "jsonPath": ".status.gpuMinutesTotal",
        "priority": 1,
        "description": "GPU-minutes spent by all tiers and the concurrency search.",
    }
    assert by_name["Age"]["type"] == "date"
    for column in columns:
        assert column["description"]
        if column["name"] != "Age":
            node = crd_schema.schema_at(schema, column["jsonPath"])
            assert node["type"] == column["type"], column["name"]


def test_schema_is_structural(schema: dict[str, Any]) -> None:
    assert structural_violations(schema) == []


def test_structural_check_catches_what_it_should() -> None:
    # The checker itself must fail bad schemas, or the test above proves nothing.
    bad = {
        "type": "object",
        "properties": {
            "metadata": {"type": "object", "properties": {"labels": {"type": "object"}}},
            "spec": {
                "type": "object",
                "description": "d",
                "properties": {
                    "untyped": {"description": "no type"},
                    "bare": {"type": "object", "description": "d", "additionalProperties": True},
                    "list": {"type": "array", "description": "d"},
                    "nodesc": {"type": "string"},
                    "junctor": {
                        "type": "object",
                        "description": "d",
                        "anyOf": [{"type": "object", "properties": {"x": {"type": "string"}}}],
                    },
                    "conds": {
                        "type": "array",
                        "description": "d",
                        "items": {"type": "object", "properties": {"type": {"type": "string"}}},
                        "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["type"],
                    },
                },
                "x-kubernetes-validations": [{"rule": "self.x > 1"}, {"rule": "self.(", "message": "m"}],
            },
        },
    }
    text = "\n".join(structural_violations(bad))
    for expected in (
        "metadata may only be",
        "spec.untyped: no type",
        "spec.bare: additionalProperties must be a typed schema",
        "spec.list: array without an items schema",
        "spec.nodesc: property without a description",
        "spec.junctor.anyOf: type is not allowed",
        "spec.junctor.anyOf: field 'x' is not specified outside",
        "list-map key 'type' must be required or defaulted",
        "has no message",
        "CEL does not compile",
    ):
        assert expected in text


def test_no_field_preserves_unknown_fields(schema: dict[str, Any]) -> None:
    # kopf keeps its progress in annotations, so status needs no open-ended storage;
    # every field is declared, and pruning drops anything else.
    assert [p for p, n in _all_nodes(schema) if n.get("x-kubernetes-preserve-unknown-fields")] == []


def test_every_cel_rule_has_a_message_naming_a_spec_field_and_compiles(schema: dict[str, Any]) -> None:
    rules = [(p, r) for p, n in _all_nodes(schema) for r in n.get("x-kubernetes-validations", [])]
    assert len(rules) >= 6
    paths = {p for p, _ in _all_nodes(schema)}
    for path, rule in rules:
        named = rule["message"].split()[0].rstrip(":")
        assert named.startswith("spec.") and named in paths, (path, rule["message"])
        compile_rule(rule["rule"])


def test_cel_field_paths_resolve(schema: dict[str, Any]) -> None:
    spec = schema["properties"]["spec"]
    paths = [r["fieldPath"] for r in spec["x-kubernetes-validations"] if "fieldPath" in r]
    assert paths == [".load.inputLen", ".load.inputLen", ".model.uri"]
    for p in paths:
        assert resolve_field_path(spec, p) is not None


def test_tensor_parallel_sizes_are_an_enum_of_powers_of_two(schema: dict[str, Any]) -> None:
    tp = schema["properties"]["spec"]["properties"]["tiers"]["properties"]["tensorParallel"]
    assert tp["items"] == {"type": "integer", "enum": [1, 2, 4, 8, 16, 32, 64]}
    assert tp["items"]["enum"] == list(TP_SIZES)
    assert (tp["minItems"], tp["maxItems"]) == (1, 7)


def test_bounds_are_in_the_schema(schema: dict[str, Any]) -> None:
    spec = schema["properties"]["spec"]["properties"]
    gain = spec["stopRules"]["properties"]["minThroughputGain"]
    assert (gain["minimum"], gain.get("exclusiveMinimum"), gain["maximum"]) == (0.0, True, 1.0)
    assert spec["load"]["properties"]["concurrency"]["minimum"] == 1
    assert spec["load"]["properties"]["inputLen"]["minimum"] == 1
    assert spec["model"]["properties"]["dtype"]["enum"] == ["bfloat16", "float16", "float32", "fp8", "int8", "int4"]
    assert spec["model"]["required"] == ["uri"]
    assert schema["required"] == ["spec"]
    pp = spec["tiers"]["properties"]["pipelineParallel"]
    assert pp["items"]["minimum"] == 1


def test_conditions_are_a_map_keyed_by_type(schema: dict[str, Any]) -> None:
    conditions = schema["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map"
    assert conditions["x-kubernetes-list-map-keys"] == ["type"]
    assert set(conditions["items"]["required"]) == {"type", "status", "reason", "message", "lastTransitionTime"}


def test_every_dataclass_field_is_in_the_schema(schema: dict[str, Any]) -> None:
    def walk(cls: Any, node: dict[str, Any], path: str) -> None:
        hints = typing.get_type_hints(cls)
        assert set(node["properties"]) == {json_name(f) for f in dataclasses.fields(cls)}, path
        for f in dataclasses.fields(cls):
            inner, _ = unwrap_optional(hints[f.name])
            sub = node["properties"][json_name(f)]
            if dataclasses.is_dataclass(inner):
                assert sub["description"], (path, f.name)
            else:
                assert sub["description"] == " ".join(f.metadata["description"].split()), (path, f.name)
            if typing.get_origin(inner) is tuple:
                inner, sub = typing.get_args(inner)[0], sub["items"]
            if dataclasses.is_dataclass(inner):
                walk(inner, sub, f"{path}.{json_name(f)}")

    walk(ExperimentSpec, schema["properties"]["spec"], "spec")
    walk(ExperimentStatus, schema["properties"]["status"], "status")


def test_schema_defaults_equal_the_dataclass_defaults(schema: dict[str, Any]) -> None:
    # What the API server fills in for a minimal object is exactly what parse_spec fills in.
    minimal = {"model": {"uri": "hf://org/model"}}
    defaulted = apply_defaults(schema["properties"]["spec"], dict(minimal))
    assert defaulted == to_json(parse_spec(minimal))
    assert defaulted["tiers"]["tensorParallel"] == [1, 2, 4, 8]
    assert defaulted["model"]["architecture"] == {}
    assert defaulted["capacity"]["slo"] == {}


def test_nested_defaults_apply_inside_given_objects(schema: dict[str, Any]) -> None:
    given = {
        "model": {"uri": "hf://org/model", "architecture": {"configMapRef": {"name": "cfg"}}},
        "engine": {"env": [{"name": "A"}]},
    }
    defaulted = apply_defaults(schema["properties"]["spec"], given)
    assert defaulted == to_json(parse_spec(given))
    assert defaulted["model"]["architecture"]["configMapRef"] == {"name": "cfg", "key": "config.json"}
    assert defaulted["engine"]["env"] == [{"name": "A", "value": ""}]


def test_defaults_satisfy_the_schema_and_every_rule(schema: dict[str, Any]) -> None:
    spec = apply_defaults(schema["properties"]["spec"], {"model": {"uri": "hf://org/model"}})
    assert schema_errors(schema["properties"]["spec"], spec, "spec") == []
    assert cel_errors(schema["properties"]["spec"], spec, "spec") == []


def test_status_has_no_defaults(schema: dict[str, Any]) -> None:
    assert [p for p, n in _all_nodes(schema["properties"]["status"]) if "default" in n] == []


def _sample(tp: Any, meta: typing.Mapping[str, Any]) -> Any:
    """A value of type ``tp`` that satisfies ``meta`` (first enum value, minimum, ...)."""
    tp, _ = unwrap_optional(tp)
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return tp(**{f.name: _sample(hints[f.name], f.metadata) for f in dataclasses.fields(tp)})
    if typing.get_origin(tp) is tuple:
        item_meta = {"enum": meta.get("item_enum"), "minimum": meta.get("item_minimum")}
        return (_sample(typing.get_args(tp)[0], item_meta),)
    if meta.get("enum"):
        return meta["enum"][0]
    if tp is bool:
        return True
    if tp is int:
        return int(meta.get("minimum") or 0) + 1
    if tp is float:
        return float(meta.get("minimum") or 0) + 0.5
    return "x"


def test_a_status_with_every_field_set_passes_the_status_schema(schema: dict[str, Any]) -> None:
    # Every field the operator can write survives validation and pruning.
    status = _sample(ExperimentStatus, {})
    data = to_json(status)
    assert "decidedTier" in data
    assert data["tiers"][0]["peakMemoryGiB"] is not None
    assert schema_errors(schema["properties"]["status"], data, "status") == []
    assert ExperimentStatus.from_dict(data) == status


def test_status_schema_refuses_an_unknown_phase(schema: dict[str, Any]) -> None:
    errors = schema_errors(schema["properties"]["status"], {"phase": "Deploying"}, "status")
    assert len(errors) == 1 and errors[0].startswith("status.phase:")
