"""The reconciler knows no tier phase: what a pass reads comes from core.needs(), what it does from the ladder.

Adding a phase must mean editing the core only; a tier-phase constant or its value in
reconciler.py (or the GPU broker it uses) is per-phase knowledge leaking out of the core.
"""

import ast
from pathlib import Path

import kneepoint
from kneepoint.core import status

PACKAGE = Path(kneepoint.__file__).parent
PHASE_NAMES = {name for name in vars(status) if name.startswith("TIER_") and isinstance(getattr(status, name), str)}
PHASE_VALUES = set(status.TIER_PHASES)


def _phase_knowledge(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name) and node.id in PHASE_NAMES | {"TIER_PHASES"}:
            found.append(f"line {node.lineno}: {node.id}")
        elif (
            isinstance(node, ast.Attribute)
            and node.attr in PHASE_NAMES | {"TIER_PHASES"}
            and not (isinstance(node.value, ast.Name) and node.value.id == "reasons")
        ):
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.alias) and node.name in PHASE_NAMES | {"TIER_PHASES"}:
            found.append(f"import {node.name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in PHASE_VALUES:
            found.append(f"line {node.lineno}: {node.value!r}")
    return found


def test_reconciler_names_no_tier_phase() -> None:
    assert _phase_knowledge(PACKAGE / "reconciler.py") == []


def test_the_check_sees_phase_knowledge(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('from kneepoint.core.status import TIER_WAITING\nx = t.phase == "Collecting"\ny = status.TIER_PENDING\n')
    assert len(_phase_knowledge(sample)) == 3
