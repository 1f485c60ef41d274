"""Extract ``vllm serve``'s argument list from vLLM's source, without importing vLLM.

Usage (writes ``vllm-0.33.0-serve-flags.json`` beside this file)::

    pip download vllm==0.33.0 --no-deps -d /tmp/vllm-wheel
    python -c "import zipfile; z = zipfile.ZipFile('/tmp/vllm-wheel/vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl'); \
z.extractall('/tmp/vllm-wheel/src', [n for n in z.namelist() if n.endswith('.py')])"
    python tests/data/vllm/extract_serve_flags.py /tmp/vllm-wheel/src 0.33.0

vLLM's parser cannot be built here: ``vllm.engine.arg_utils`` imports torch, transformers and
pydantic at module level. So this reads the source with ``ast`` and follows the three places
``vllm serve``'s parser gets its arguments from (``vllm/entrypoints/cli/serve.py`` calls
``make_arg_parser``):

1. ``make_arg_parser`` in ``vllm/entrypoints/common/cli_args.py``: literal ``add_argument`` calls;
2. ``FrontendArgs.add_cli_args``: one ``--<field-name>`` per dataclass field of ``FrontendArgs``
   and ``BaseFrontendArgs`` (underscores to dashes);
3. ``EngineArgs.add_cli_args`` and ``AsyncEngineArgs.add_cli_args`` in
   ``vllm/engine/arg_utils.py``: literal ``add_argument`` calls whose kwargs come from
   ``get_kwargs(<Config>)[<field>]``.

``get_kwargs`` (``_compute_kwargs``) makes a bool field a ``BooleanOptionalAction`` (both
``--x`` and ``--no-x``; a ``bool | str | None`` field is a plain optional flag) and gives a
``Literal`` field its values as ``choices``; both are reproduced here from the fields'
annotations, and ``takesValue: false`` marks those flags and ``store_true`` ones. Not covered: arguments a platform plugin adds at run time
(``current_platform.pre_register_and_update``; the CUDA platform adds none) and the
``--<flag>.<key>`` JSON-key form of config flags, which the operator does not use.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any


def _module(root: Path, dotted: str) -> ast.Module:
    return ast.parse((root / (dotted.replace(".", "/") + ".py")).read_text(encoding="utf-8"))


def _literal_aliases(root: Path) -> dict[str, list[str]]:
    """Every ``Name = Literal[...]`` assignment of string values in the package."""
    out: dict[str, list[str]] = {}
    for path in (root / "vllm").rglob("*.py"):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                value = node.value
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                value = node.value
            else:
                continue
            name = node.targets[0].id if isinstance(node, ast.Assign) else node.target.id  # type: ignore[union-attr]
            if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name) and value.value.id == "Literal":
                items = value.slice.elts if isinstance(value.slice, ast.Tuple) else [value.slice]
                strings = [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]
                if strings and len(strings) == len(items):
                    out.setdefault(name, strings)
    return out


def _classes(root: Path) -> dict[str, ast.ClassDef]:
    out: dict[str, ast.ClassDef] = {}
    for path in sorted((root / "vllm").rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                out.setdefault(node.name, node)
    return out


def _fields(cls: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> dict[str, str]:
    """Annotated fields (name -> annotation source) of a dataclass, base classes first."""
    out: dict[str, str] = {}
    for base in cls.bases:
        if isinstance(base, ast.Name) and base.id in classes:
            out.update(_fields(classes[base.id], classes))
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and not node.target.id.startswith("_"):
            if "ClassVar" not in ast.unparse(node.annotation):
                out[node.target.id] = ast.unparse(node.annotation)
    return out


def _annotation_kind(annotation: str, aliases: dict[str, list[str]]) -> tuple[bool, list[str] | None]:
    """(boolean flag with a --no- form, choices) as ``_compute_kwargs`` derives them."""
    parts = {p.strip() for p in annotation.replace("(", " ").replace(")", " ").split("|")}
    if parts == {"bool", "str", "None"}:
        return False, None
    if "bool" in parts:
        return True, None
    for part in parts:
        if part in aliases:
            return False, aliases[part]
        if part.startswith("Literal["):
            node = ast.parse(part, mode="eval").body
            items = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]  # type: ignore[attr-defined]
            return False, [i.value for i in items if isinstance(i, ast.Constant)]
    return False, None


def _function(tree: ast.Module, cls_name: str | None, name: str) -> ast.FunctionDef:
    scope: list[ast.stmt] = tree.body
    if cls_name:
        scope = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls_name).body
    return next(n for n in scope if isinstance(n, ast.FunctionDef) and n.name == name)


def _add_argument_calls(func: ast.FunctionDef) -> list[ast.Call]:
    return [
        n for n in ast.walk(func)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "add_argument"
    ]


def extract(root: Path, version: str) -> dict[str, Any]:
    aliases = _literal_aliases(root)
    classes = _classes(root)
    flags: dict[str, dict[str, Any]] = {}
    positional: list[str] = []

    def record(names: list[str], where: str, boolean: bool = False, choices: list[str] | None = None, no_value: bool = False) -> None:
        long = [n for n in names if n.startswith("--")]
        main = long[0] if long else names[0]
        entry = flags.setdefault(main, {"aliases": [], "source": where})
        entry["aliases"] = sorted(set(entry["aliases"]) | {n for n in names if n != main})
        if boolean:
            entry["boolean"] = True
            entry["aliases"] = sorted(set(entry["aliases"]) | {"--no-" + main[2:]})
        if choices:
            entry["choices"] = choices
        if boolean or no_value:
            entry["takesValue"] = False

    def literal_calls(func: ast.FunctionDef, where: str) -> None:
        kwargs_of: dict[str, str] = {}
        for node in ast.walk(func):
            # x_kwargs = get_kwargs(SomeConfig)
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                    and node.value.func.id == "get_kwargs" and node.value.args and isinstance(node.value.args[0], ast.Name)):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        kwargs_of[target.id] = node.value.args[0].id
        for call in _add_argument_calls(func):
            names = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if not names:
                raise SystemExit(f"{where}: an add_argument call without literal names: {ast.unparse(call)[:120]}")
            if not names[0].startswith("-"):
                positional.append(names[0])
                continue
            boolean, choices = False, None
            # `**x_kwargs["field"]` directly, or inside a dict literal `**{**x_kwargs["field"], "default": None}`.
            unpacked = [kw.value for kw in call.keywords if kw.arg is None]
            for value in list(unpacked):
                if isinstance(value, ast.Dict):
                    unpacked += [v for k, v in zip(value.keys, value.values) if k is None]
            for value in unpacked:
                if isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name):
                    config = kwargs_of.get(value.value.id)
                    key = value.slice.value if isinstance(value.slice, ast.Constant) else None
                    if config in classes and key:
                        annotation = _fields(classes[config], classes).get(key)
                        if annotation is None:
                            raise SystemExit(f"{where}: {config} has no field {key!r}")
                        boolean, choices = _annotation_kind(annotation, aliases)
            # Explicit keywords (also inside such a dict literal) override what the field gives.
            explicit = [(kw.arg, kw.value) for kw in call.keywords if kw.arg]
            for value in unpacked:
                if isinstance(value, ast.Dict):
                    explicit += [(k.value, v) for k, v in zip(value.keys, value.values) if isinstance(k, ast.Constant)]
            no_value = False
            for key, value in explicit:
                if key == "action":
                    boolean = "BooleanOptionalAction" in ast.unparse(value)
                    no_value = isinstance(value, ast.Constant) and value.value in ("store_true", "store_false")
                if key == "choices" and isinstance(value, (ast.List, ast.Tuple)):
                    choices = [e.value for e in value.elts if isinstance(e, ast.Constant)]
            record(names, where, boolean, choices, no_value)

    cli = _module(root, "vllm.entrypoints.common.cli_args")
    literal_calls(_function(cli, None, "make_arg_parser"), "make_arg_parser")
    for name, annotation in _fields(classes["FrontendArgs"], classes).items():
        boolean, choices = _annotation_kind(annotation, aliases)
        record([f"--{name.replace('_', '-')}"], "FrontendArgs", boolean, choices)
    engine = _module(root, "vllm.engine.arg_utils")
    literal_calls(_function(engine, "EngineArgs", "add_cli_args"), "EngineArgs.add_cli_args")
    literal_calls(_function(engine, "AsyncEngineArgs", "add_cli_args"), "AsyncEngineArgs.add_cli_args")
    return {
        "vllm": version,
        "extractedBy": "tests/data/vllm/extract_serve_flags.py (ast over the wheel's source; see its docstring)",
        "positional": positional,
        "flags": dict(sorted(flags.items())),
    }


def main() -> None:
    root, version = Path(sys.argv[1]), sys.argv[2]
    out = Path(__file__).with_name(f"vllm-{version}-serve-flags.json")
    data = extract(root, version)
    out.write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    print(f"{out}: {len(data['flags'])} flags, positional {data['positional']}")


if __name__ == "__main__":
    main()
