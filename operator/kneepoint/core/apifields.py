"""Field declarations shared by the spec and status dataclasses.

Every API field is declared once, with its JSON name, description and schema constraints
in the dataclass field's metadata. Three things read that metadata: the spec parser
(validation errors naming the JSON path), the serialisers (snake_case attributes <->
camelCase JSON) and the CRD generator (``kneepoint.kube.crd_schema``), so the CRD, the
parser and ``kubectl explain`` cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import MISSING, field
from typing import Any


def api_field(
    description: str,
    *,
    default: Any = MISSING,
    default_factory: Any = MISSING,
    json_name: str | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    exclusive_minimum: bool = False,
    enum: tuple[str, ...] | None = None,
    pattern: str | None = None,
    min_items: int | None = None,
    max_items: int | None = None,
    max_length: int | None = None,
    item_enum: tuple[Any, ...] | None = None,
    item_minimum: float | None = None,
    item_maximum: float | None = None,
    nullable: bool = False,
    preserve_unknown: bool = False,
    required: bool = False,
) -> Any:
    """Declare a dataclass field that is part of the Kubernetes API."""
    metadata = {
        "description": description,
        "json_name": json_name,
        "minimum": minimum,
        "maximum": maximum,
        "exclusive_minimum": exclusive_minimum,
        "enum": enum,
        "pattern": pattern,
        "min_items": min_items,
        "max_items": max_items,
        "max_length": max_length,
        "item_enum": item_enum,
        "item_minimum": item_minimum,
        "item_maximum": item_maximum,
        "nullable": nullable,
        "preserve_unknown": preserve_unknown,
        "required": required,
    }
    if default is not MISSING:
        return field(default=default, metadata=metadata)
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(metadata=metadata)


def camel(name: str) -> str:
    """snake_case -> camelCase (``ttft_p95_ms`` -> ``ttftP95Ms``)."""
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def json_name(f: dataclasses.Field[Any]) -> str:
    """The JSON key of a dataclass field."""
    return f.metadata.get("json_name") or camel(f.name)


def unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """Return (inner type, was_optional) for ``X | None``."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(tp)) == 2:
            return args[0], True
    return tp, False


def to_json(obj: Any) -> Any:
    """Serialise dataclasses (recursively) to JSON-ready dicts with camelCase keys.

    ``None`` values are omitted so that status patches stay small and the API server's
    schema never sees an explicit null it did not declare.
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            if value is None:
                continue
            out[json_name(f)] = to_json(value)
        return out
    if isinstance(obj, (list, tuple)):
        return [to_json(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_json(v) for k, v in obj.items()}
    return obj


@functools.cache
def type_hints(cls: Any) -> dict[str, Any]:
    """``typing.get_type_hints(cls)``, once per class: it re-evaluates every annotation string on each call,
    which made it the largest CPU cost of an operator pass (status and spec are parsed on every pass).
    Callers must not modify the returned dict."""
    return typing.get_type_hints(cls)


def from_json(cls: Any, data: Any) -> Any:
    """Inverse of :func:`to_json` for trusted data (our own status). No validation here."""
    cls, _ = unwrap_optional(cls)
    if data is None:
        return None
    if isinstance(cls, type) and dataclasses.is_dataclass(cls):
        hints = type_hints(cls)
        kwargs = {}
        for f in dataclasses.fields(cls):
            key = json_name(f)
            if key in data:
                kwargs[f.name] = from_json(hints[f.name], data[key])
        return cls(**kwargs)
    origin = typing.get_origin(cls)
    if origin in (list, tuple):
        (item,) = typing.get_args(cls)[:1]
        values = [from_json(item, v) for v in data]
        return tuple(values) if origin is tuple else values
    if cls is float and isinstance(data, int):
        return float(data)
    return data
