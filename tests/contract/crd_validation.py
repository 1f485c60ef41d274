"""What the API server does with a CRD's schema, re-done in Python for the contract tests.

Until the sandbox's real kube-apiserver checks the CRD, these functions stand in for it:

- :func:`structural_violations`: the rules that make a schema *structural* (Kubernetes
  docs, "Specifying a structural schema") plus the apiextensions/v1 checks we could trip
  (additionalProperties beside properties, list-map keys, CEL entries), and our own rule
  that every property has a description.
- :func:`apply_defaults`: structural defaulting (nulls pruned, a missing field with a
  default set, then its children defaulted, as apiextensions-apiserver does).
- :func:`to_json_schema`: OpenAPI v3 with Kubernetes extensions -> JSON Schema draft 4
  for ``jsonschema``; unknown fields become errors, as with kubectl's strict field validation.
- :func:`cel_errors`: every ``x-kubernetes-validations`` rule evaluated with cel-python
  (not the API server's cost estimate: kube-apiserver itself is the judge of that).
- :func:`api_server_errors`: defaults, then schema, then CEL, as ``path: message`` lines.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator
from typing import Any

import celpy
import jsonschema

_JUNCTORS = ("allOf", "anyOf", "oneOf", "not")
_FORBIDDEN_IN_JUNCTORS = ("description", "type", "default", "additionalProperties", "nullable")
_SCALARS = ("string", "integer", "number", "boolean")


def _children(node: dict[str, Any], path: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(kind, path, schema) of each directly specified child: properties, items, additionalProperties."""
    for name, sub in node.get("properties", {}).items():
        yield "property", f"{path}.{name}", sub
    if isinstance(node.get("items"), dict):
        yield "items", f"{path}[]", node["items"]
    if isinstance(node.get("additionalProperties"), dict):
        yield "additionalProperties", f"{path}{{}}", node["additionalProperties"]


def _junctor_fields(node: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for junctor in _JUNCTORS:
        value = node.get(junctor)
        for sub in value if isinstance(value, list) else [value] if isinstance(value, dict) else []:
            yield junctor, sub


def structural_violations(schema: dict[str, Any], path: str = "") -> list[str]:
    """Every way ``schema`` (an ``openAPIV3Schema``) breaks the structural rules; [] if none."""
    problems: list[str] = []
    _check_node(schema, path or "<root>", problems, root=True, described=False)
    return problems


def _check_node(node: dict[str, Any], path: str, problems: list[str], *, root: bool, described: bool) -> None:
    escape = node.get("x-kubernetes-int-or-string") is True or node.get("x-kubernetes-preserve-unknown-fields") is True
    # Rule 1: a non-empty type at the root, for every specified field and every array item.
    if not node.get("type") and not escape:
        problems.append(f"{path}: no type")
    if described and not node.get("description"):
        problems.append(f"{path}: property without a description")
    if "x-kubernetes-preserve-unknown-fields" in node and node["x-kubernetes-preserve-unknown-fields"] is not True:
        problems.append(f"{path}: x-kubernetes-preserve-unknown-fields may only be true")
    if node.get("type") == "array" and not isinstance(node.get("items"), dict):
        problems.append(f"{path}: array without an items schema")
    if "properties" in node and "additionalProperties" in node:
        problems.append(f"{path}: properties and additionalProperties are mutually exclusive")
    if "additionalProperties" in node and not isinstance(node["additionalProperties"], dict):
        problems.append(f"{path}: additionalProperties must be a typed schema, not {node['additionalProperties']!r}")
    if node.get("uniqueItems"):
        problems.append(f"{path}: uniqueItems is not allowed in apiextensions.k8s.io/v1")
    for name in node.get("required", []):
        if name not in node.get("properties", {}):
            problems.append(f"{path}: required field {name!r} is not a property")
    if "enum" in node and node.get("type") in _SCALARS:
        kinds = {"string": str, "integer": int, "number": (int, float), "boolean": bool}[node["type"]]
        for value in node["enum"]:
            if not isinstance(value, kinds) or (node["type"] != "boolean" and isinstance(value, bool)):
                problems.append(f"{path}: enum value {value!r} is not of type {node['type']}")
    # Rules 2 and 3: logical junctors may only restate what is specified outside them.
    for junctor, sub in _junctor_fields(node):
        for key in _FORBIDDEN_IN_JUNCTORS:
            if key in sub:
                problems.append(f"{path}.{junctor}: {key} is not allowed inside a logical junctor")
        for name in sub.get("properties", {}):
            if name not in node.get("properties", {}):
                problems.append(f"{path}.{junctor}: field {name!r} is not specified outside the junctor")
        if "items" in sub and "items" not in node:
            problems.append(f"{path}.{junctor}: items are not specified outside the junctor")
    _check_list_type(node, path, problems)
    _check_validations(node, path, problems)
    for kind, sub_path, sub in _children(node, path):
        if root and kind == "property" and sub_path.endswith(".metadata"):
            # Rule 4: metadata may restrict only name and generateName; we restrict nothing.
            if sub != {"type": "object"}:
                problems.append(f"{sub_path}: metadata may only be {{type: object}} (plus name/generateName rules)")
            continue
        _check_node(sub, sub_path, problems, root=False, described=kind == "property")


def _check_list_type(node: dict[str, Any], path: str, problems: list[str]) -> None:
    list_type = node.get("x-kubernetes-list-type")
    keys = node.get("x-kubernetes-list-map-keys")
    if list_type is None and keys is None:
        return
    if node.get("type") != "array":
        problems.append(f"{path}: x-kubernetes-list-type on a non-array")
        return
    items = node.get("items", {})
    if list_type == "map":
        if items.get("type") != "object" or not keys:
            problems.append(f"{path}: list-type map needs object items and x-kubernetes-list-map-keys")
            return
        for key in keys:
            prop = items.get("properties", {}).get(key)
            if prop is None or prop.get("type") not in _SCALARS:
                problems.append(f"{path}: list-map key {key!r} must be a scalar property of the items")
            elif key not in items.get("required", []) and "default" not in prop:
                problems.append(f"{path}: list-map key {key!r} must be required or defaulted")
    elif keys is not None:
        problems.append(f"{path}: x-kubernetes-list-map-keys needs x-kubernetes-list-type map")
    elif list_type == "set" and items.get("type") not in _SCALARS:
        problems.append(f"{path}: list-type set needs scalar items")
    elif list_type not in ("atomic", "set"):
        problems.append(f"{path}: unknown x-kubernetes-list-type {list_type!r}")


def _check_validations(node: dict[str, Any], path: str, problems: list[str]) -> None:
    for entry in node.get("x-kubernetes-validations", []):
        if not entry.get("rule"):
            problems.append(f"{path}: CEL entry without a rule")
        message = entry.get("message", "")
        if not message:
            problems.append(f"{path}: CEL rule {entry.get('rule')!r} has no message")
        if "\n" in message:
            problems.append(f"{path}: CEL message contains a line break")
        if "messageExpression" in entry:
            # Its cost estimate is not re-done here, and 1.36 refused ours (see CelRule).
            problems.append(f"{path}: messageExpression is not checked by these tests; use a static message")
        if "fieldPath" in entry and resolve_field_path(node, entry["fieldPath"]) is None:
            problems.append(f"{path}: fieldPath {entry['fieldPath']!r} names no field of this node")
        try:
            compile_rule(entry["rule"])
        except Exception as exc:  # noqa: BLE001 - celpy raises its own parse errors
            problems.append(f"{path}: CEL does not compile: {entry.get('rule')!r}: {exc}")


def resolve_field_path(node: dict[str, Any], field_path: str) -> dict[str, Any] | None:
    """The schema a CEL ``fieldPath`` (``.load.inputLen``) names inside ``node``, or None."""
    for part in field_path.strip(".").split("."):
        node = node.get("properties", {}).get(part)
        if node is None:
            return None
    return node


# --- defaulting ------------------------------------------------------------------------


def apply_defaults(schema: dict[str, Any], value: Any) -> Any:
    """Default ``value`` in place like the API server does on decode; returns it."""
    if isinstance(value, dict) and "properties" in schema:
        for name, prop in schema["properties"].items():
            if name in value and value[name] is None and not prop.get("nullable"):
                del value[name]  # a null for a non-nullable field is pruned, then defaulted
            if name not in value and "default" in prop:
                value[name] = copy.deepcopy(prop["default"])
        for name, sub in value.items():
            if name in schema["properties"]:
                apply_defaults(schema["properties"][name], sub)
    elif isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        for sub in value.values():
            apply_defaults(schema["additionalProperties"], sub)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for sub in value:
            apply_defaults(schema["items"], sub)
    return value


# --- JSON Schema translation -----------------------------------------------------------


def to_json_schema(node: dict[str, Any]) -> dict[str, Any]:
    """Translate an OpenAPI v3 CRD schema into JSON Schema draft 4 (what jsonschema checks)."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("nullable", "default", "description"):
            continue
        if key == "properties":
            out[key] = {name: to_json_schema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not") and isinstance(value, dict):
            out[key] = to_json_schema(value)
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [to_json_schema(sub) for sub in value]
        else:
            out[key] = value
    if node.get("x-kubernetes-int-or-string"):
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        # The API server prunes unknown fields, and rejects them under kubectl's default
        # strict field validation: either way they never take effect, so they are errors here.
        out["additionalProperties"] = False
    return out


def _format_path(parts: Any, prefix: str = "") -> str:
    out = prefix
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


def schema_errors(schema: dict[str, Any], value: Any, prefix: str = "") -> list[str]:
    """jsonschema errors of ``value`` against the translated ``schema``, as ``path: message``."""
    validator = jsonschema.Draft4Validator(to_json_schema(schema))
    return sorted(f"{_format_path(e.absolute_path, prefix)}: {e.message}" for e in validator.iter_errors(value))


# --- CEL -------------------------------------------------------------------------------


@functools.cache
def compile_rule(expression: str) -> Any:
    """A cel-python program for one CEL expression (raises on a syntax error)."""
    env = celpy.Environment()
    return env.program(env.compile(expression))


def _evaluate(expression: str, self_value: Any) -> Any:
    result = compile_rule(expression).evaluate({"self": celpy.json_to_cel(self_value)})
    if isinstance(result, celpy.CELEvalError):
        raise result
    return result


def cel_errors(schema: dict[str, Any], value: Any, path: str = "") -> list[str]:
    """Evaluate every CEL rule on the parts of ``value`` its schema node describes.

    As on the API server, a rule runs only where its node is present, a false result
    reports ``message`` at the node's path plus ``fieldPath``, and an evaluation error is a
    failure too. The API server's cost estimate is not re-done here.
    """
    errors: list[str] = []
    for entry in schema.get("x-kubernetes-validations", []):
        where = path + entry.get("fieldPath", "")
        try:
            ok = _evaluate(entry["rule"], value)
        except Exception as exc:  # noqa: BLE001 - as the API server, any evaluation error rejects the object
            errors.append(f"{where}: rule {entry['rule']!r} failed to evaluate: {exc}")
            continue
        if not ok:
            errors.append(f"{where}: {entry['message']}")
    if isinstance(value, dict):
        for name, sub in value.items():
            prop = schema.get("properties", {}).get(name)
            if prop is None and isinstance(schema.get("additionalProperties"), dict):
                prop = schema["additionalProperties"]
            if prop is not None:
                errors += cel_errors(prop, sub, f"{path}.{name}" if path else name)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, sub in enumerate(value):
            errors += cel_errors(schema["items"], sub, f"{path}[{i}]")
    return errors


def api_server_errors(openapi_schema: dict[str, Any], obj: dict[str, Any]) -> list[str]:
    """What creating ``obj`` would be refused for: defaulting, then the schema, then CEL."""
    obj = apply_defaults(openapi_schema, copy.deepcopy(obj))
    errors = schema_errors(openapi_schema, obj)
    if errors:
        return errors  # CEL rules assume well-typed input; the schema errors come first
    return cel_errors(openapi_schema, obj)
