"""The layering rules hold: a pure core, handlers > reconciler > GPU broker > (kube | metrics) > core.

First line: import-linter with the repository's ``.importlinter`` (the same check as
running ``lint-imports``). Second line: an AST walk of ``kneepoint/core`` that fails on any
import outside the standard library and ``kneepoint.core`` itself, including imports inside
functions and ``importlib.import_module("...")`` with a literal name, so a new subpackage
or library cannot slip past a contract list that was not updated.
"""

from __future__ import annotations

import ast
import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORE = ROOT / "operator" / "kneepoint" / "core"
CONFIG = ROOT / ".importlinter"

# What the core must never import (docs/architecture.md, "Layers").
CORE_FORBIDDEN = {
    "kopf",
    "kubernetes",
    "prometheus_api_client",
    "aiohttp",
    "httpx",
    "yaml",
    "click",
    "pynvml",
    "matplotlib",
    "numpy",
}


def _lint_imports() -> str:
    beside = Path(sys.executable).with_name("lint-imports")
    found = str(beside) if beside.exists() else shutil.which("lint-imports")
    if found is None:
        pytest.fail("lint-imports not found: install the test extras (pip install -e '.[test]')")
    return found


def test_import_linter_contracts_are_kept() -> None:
    # --no-cache: no .import_linter_cache folder left in the checkout by a test run.
    result = subprocess.run([_lint_imports(), "--no-cache", str(CONFIG)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def _contracts() -> dict[str, configparser.SectionProxy]:
    parser = configparser.ConfigParser()
    parser.read(CONFIG, encoding="utf-8")
    return {name.split(":", 2)[2]: parser[name] for name in parser.sections() if name.startswith("importlinter:contract:")}


def _lines(value: str) -> list[str]:
    return [line.strip() for line in value.strip().splitlines() if line.strip()]


def test_contracts_say_what_the_architecture_requires() -> None:
    contracts = _contracts()
    core = contracts["core-imports-no-library"]
    assert _lines(core["source_modules"]) == ["kneepoint.core"]
    assert set(_lines(core["forbidden_modules"])) >= CORE_FORBIDDEN
    layers = _lines(contracts["operator-layers"]["layers"])
    assert layers == [
        "(kneepoint.handlers)",
        "(kneepoint.reconciler)",
        "(kneepoint.broker)",
        "(kneepoint.kube) | (kneepoint.metrics)",
        "kneepoint.core",
    ]
    bottom = _lines(contracts["core-imports-no-other-package"]["layers"])
    assert bottom[-1] == "kneepoint.core"
    # A top-level package missing from this list is still caught by the AST walk below.
    assert {"(kneepoint.kube)", "(kneepoint.metrics)", "(kneepoint.handlers)"} <= {p.strip() for p in bottom[0].split(":")}
    builders = _lines(contracts["builders-import-no-client"]["source_modules"])
    assert {"kneepoint.*.manifests", "kneepoint.*.promql"} <= set(builders)


def _allowed(module: str) -> bool:
    top = module.split(".")[0]
    return top in sys.stdlib_module_names or top == "__future__" or module == "kneepoint.core" or module.startswith("kneepoint.core.")


def _non_stdlib_imports(path: Path, base: Path = ROOT) -> list[str]:
    """``file:line: module`` for every import in ``path`` that leaves the stdlib and kneepoint.core."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # Relative: one dot stays inside kneepoint.core; more would leave it.
                names = [] if node.level == 1 else [f"{'.' * node.level}{node.module or ''}"]
            else:
                names = [node.module or ""]
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, (ast.Attribute, ast.Name))
            and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        else:
            continue
        found += [f"{path.relative_to(base)}:{node.lineno}: {name}" for name in names if name.startswith(".") or not _allowed(name)]
    return found


def test_core_imports_only_the_standard_library() -> None:
    files = sorted(CORE.rglob("*.py"))
    assert len(files) >= 5
    offenders = [line for path in files for line in _non_stdlib_imports(path)]
    assert offenders == []


def test_the_ast_walk_catches_what_it_should(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os\nimport yaml\nfrom kneepoint.kube import naming\nfrom kneepoint.core import spec\n"
        "from . import tiers\nfrom .. import cli\n"
        "def f():\n    import kubernetes\n    import importlib\n    importlib.import_module('kopf')\n",
        encoding="utf-8",
    )
    offenders = _non_stdlib_imports(probe, base=tmp_path)
    assert [o.split(": ", 1)[1] for o in offenders] == ["yaml", "kneepoint.kube", "..", "kubernetes", "kopf"]


def test_only_the_knee_chart_imports_matplotlib() -> None:
    # matplotlib is the `report` extra (kneepoint report --png), not a runtime dependency:
    # the operator's image goes without it.
    package = ROOT / "operator" / "kneepoint"
    importers = sorted(
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if any(line.split(": ", 1)[1].split(".")[0] == "matplotlib" for line in _non_stdlib_imports(path))
    )
    assert importers == ["report/knee_chart.py"]
    runtime = (ROOT / "requirements" / "runtime.txt").read_text(encoding="utf-8")
    assert "\nmatplotlib==" not in runtime and "\nnumpy==" not in runtime
