"""Kubernetes' own OpenAPI v3 schemas, for checking rendered objects offline.

The schemas are ``api/openapi-spec/v3/*.json`` of the k8s.io/kubernetes module at the
sandbox's pinned version, which the sandbox's control-plane build downloads into Go's module
cache (``go env GOMODCACHE``). The contract tests run before the integration tests build the
sandbox, so on a fresh machine :func:`spec_dir` downloads the module itself (``go mod download``,
the same module the build fetches, once): otherwise the schema checks would be skipped exactly
where a fresh CI run should prove them. Objects are checked with ``jsonschema`` after two
translations: ``x-kubernetes-int-or-string`` becomes integer-or-string, and an object schema
with properties refuses unknown fields (kubectl's default strict field validation).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import jsonschema

from kneepoint.sandbox import binaries, pins

MODULE = f"k8s.io/kubernetes@{pins.KUBERNETES_VERSION}"


@functools.cache
def _located() -> tuple[Path | None, str]:
    """(the module's openapi-spec/v3 directory, downloaded into Go's module cache when it is not there yet, or None;
    why it is None)."""
    try:
        go = binaries.find_go()  # the sandbox build's go command
    except binaries.BuildError as exc:
        go, why = None, f"{MODULE} is not in Go's module cache and it cannot be downloaded: {exc}"
    else:
        why = f"{MODULE} has no api/openapi-spec/v3 in Go's module cache"
    cache = os.environ.get("GOMODCACHE")
    if not cache and go:
        try:
            cache = subprocess.run([go, "env", "GOMODCACHE"], capture_output=True, text=True, timeout=30, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            cache = None
    path = Path(cache or Path.home() / "go" / "pkg" / "mod") / MODULE / "api" / "openapi-spec" / "v3"
    if not path.is_dir() and go:
        try:
            # Outside any module (the temporary directory); -modcacherw keeps the cache removable, as the build's is.
            env = {**os.environ, "GOFLAGS": f"{os.environ.get('GOFLAGS', '')} -modcacherw".strip()}
            with tempfile.TemporaryDirectory() as outside:
                proc = subprocess.run([go, "mod", "download", MODULE], capture_output=True, text=True, timeout=600, cwd=outside, env=env)
            if proc.returncode:
                why = f"go mod download {MODULE} failed: {proc.stderr.strip()[-500:]}"
        except (OSError, subprocess.SubprocessError) as exc:
            why = f"go mod download {MODULE} failed: {exc}"
    return (path, "") if path.is_dir() else (None, why)


def spec_dir() -> Path | None:
    """The module's openapi-spec/v3 directory; None when Go is absent or the download fails (:func:`download_error`)."""
    return _located()[0]


def download_error() -> str:
    """Why :func:`spec_dir` found no schemas: Go's error from the download, or why there is no usable go command."""
    return _located()[1]


def _translate(node: Any) -> Any:
    if isinstance(node, list):
        return [_translate(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _translate(v) for k, v in node.items() if not k.startswith("x-kubernetes-") and k not in ("default", "description")}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in node and "additionalProperties" not in node:
        out["additionalProperties"] = False
    return out


@functools.cache
def _document(directory: str, api_version: str) -> dict[str, Any]:
    group, _, version = api_version.rpartition("/")
    name = f"api__{version}_openapi.json" if not group else f"apis__{group}__{version}_openapi.json"
    doc = json.loads((Path(directory) / name).read_text())
    return {"components": {"schemas": _translate(doc["components"]["schemas"])}}


def _schema_name(doc: dict[str, Any], api_version: str, kind: str) -> str:
    group, _, version = api_version.rpartition("/")
    for name, _schema in doc["components"]["schemas"].items():
        if name.endswith(f".{kind}") and f".{version}." in name:
            for gvk in _gvk_index(api_version).get(name, []):
                if gvk == (group, version, kind):
                    return name
    raise KeyError(f"no schema for {api_version} {kind}")


@functools.cache
def _gvk_index(api_version: str) -> dict[str, list[tuple[str, str, str]]]:
    directory = spec_dir()
    assert directory is not None
    group, _, version = api_version.rpartition("/")
    name = f"api__{version}_openapi.json" if not group else f"apis__{group}__{version}_openapi.json"
    raw = json.loads((directory / name).read_text())["components"]["schemas"]
    return {
        n: [(g.get("group", ""), g.get("version", ""), g.get("kind", "")) for g in s.get("x-kubernetes-group-version-kind", [])]
        for n, s in raw.items()
    }


def errors(obj: dict[str, Any]) -> list[str]:
    """Schema errors of one object (``path: message``); [] when it is valid."""
    directory = spec_dir()
    assert directory is not None, "k8s.io/kubernetes openapi-spec not found"
    doc = _document(str(directory), obj["apiVersion"])
    name = _schema_name(doc, obj["apiVersion"], obj["kind"])
    schema = {"$ref": f"#/components/schemas/{name}", **doc}
    validator = jsonschema.Draft4Validator(schema)
    where = f"{obj['kind']}/{obj.get('metadata', {}).get('name')}"
    return sorted(f"{where}: {'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}" for e in validator.iter_errors(obj))
