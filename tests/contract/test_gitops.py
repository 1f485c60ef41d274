"""deploy/gitops: the Argo CD health check runs in Lua 5.1 (the language of Argo CD's
gopher-lua, here through lupa) over experiment objects, and agrees with the operator's
own phase (``derive_phase``) on every combination of conditions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kneepoint.core import reasons
from kneepoint.core.ladder import derive_phase
from kneepoint.core.status import Condition

lua51 = pytest.importorskip("lupa.lua51", reason="lupa (a test dependency) brings Lua 5.1")

ROOT = Path(__file__).resolve().parents[2]
GITOPS = ROOT / "deploy" / "gitops"
SCRIPT = (GITOPS / "argocd-health-check.lua").read_text()
HEALTH = {"Failed": "Degraded", "Decided": "Healthy"}


def _to_lua(runtime: Any, value: Any) -> Any:
    """JSON -> Lua values the way Argo CD converts an object (arrays are 1-based tables)."""
    if isinstance(value, dict):
        return runtime.table_from({k: _to_lua(runtime, v) for k, v in value.items()})
    if isinstance(value, list):
        return runtime.table_from([_to_lua(runtime, v) for v in value])
    return value


def health(obj: dict[str, Any]) -> tuple[str, str]:
    """Run the health check on ``obj``; (status, message)."""
    runtime = lua51.LuaRuntime(unpack_returned_tuples=True)
    runtime.globals().obj = _to_lua(runtime, obj)
    result = runtime.execute(SCRIPT)
    return result["status"], result["message"]


def _condition(kind: str, status: str, message: str, generation: int = 1) -> dict[str, Any]:
    return {
        "type": kind,
        "status": status,
        "reason": "Test",
        "message": message,
        "lastTransitionTime": "2026-11-29T00:00:00Z",
        "observedGeneration": generation,
    }


def _experiment(status: dict[str, Any] | None, generation: int = 1) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "kneepoint.io/v1alpha1",
        "kind": "ParallelismExperiment",
        "metadata": {"name": "llama-8b-h200", "namespace": "llm", "generation": generation},
        "spec": {},
    }
    if status is not None:
        obj["status"] = status
    return obj


def test_lua_is_5_1_like_argo_cds() -> None:
    assert lua51.LuaRuntime().eval("_VERSION") == "Lua 5.1"


@pytest.mark.parametrize(
    ("status", "generation", "expected"),
    [
        (None, 1, ("Progressing", "Waiting for the kneepoint operator to accept the experiment")),
        ({"phase": "Pending"}, 1, ("Progressing", "Waiting for the kneepoint operator to accept the experiment")),
        (
            {
                "observedGeneration": 1,
                "message": "tp2-pp1: load test attempt 1 running",
                "conditions": [_condition("Accepted", "True", "Spec is valid"), _condition("Profiling", "True", "Measuring tp2-pp1")],
            },
            1,
            ("Progressing", "tp2-pp1: load test attempt 1 running"),
        ),
        (
            {
                "observedGeneration": 1,
                "message": "Decided: TP2, 4 replicas",
                "conditions": [
                    _condition("Accepted", "True", "Spec is valid"),
                    _condition("Profiling", "False", "Ladder finished"),
                    _condition("Decided", "True", "conclusion: stay at TP2 (rule: throughput-gain, column ΔT)"),
                ],
            },
            1,
            ("Healthy", "conclusion: stay at TP2 (rule: throughput-gain, column ΔT)"),
        ),
        (
            {
                "observedGeneration": 1,
                "conditions": [
                    _condition("Accepted", "False", "Invalid spec: spec.load.concurrency: must be >= 1"),
                    _condition("Failed", "True", "Invalid spec: spec.load.concurrency: must be >= 1"),
                ],
            },
            1,
            ("Degraded", "Invalid spec: spec.load.concurrency: must be >= 1"),
        ),
        (
            {
                "observedGeneration": 1,
                "conditions": [_condition("Decided", "True", "TP1"), _condition("Failed", "True", "budget exhausted")],
            },
            1,
            ("Degraded", "budget exhausted"),
        ),
        (
            # A spec change after the decision: the old decision no longer describes the spec.
            {"observedGeneration": 1, "conditions": [_condition("Decided", "True", "TP1")]},
            2,
            ("Progressing", "Waiting for the kneepoint operator to observe generation 2"),
        ),
        (
            {"observedGeneration": 3, "conditions": [_condition("Decided", "Unknown", "not yet")]},
            3,
            ("Progressing", "Running the parallelism ladder"),
        ),
    ],
    ids=["no-status", "no-observed-generation", "profiling", "decided", "invalid-spec", "failed-wins", "stale-generation", "unknown"],
)
def test_health_of_example_experiments(status: dict[str, Any] | None, generation: int, expected: tuple[str, str]) -> None:
    assert health(_experiment(status, generation)) == expected


CONDITION = st.tuples(st.sampled_from(reasons.CONDITION_TYPES), st.sampled_from(["True", "False", "Unknown"]))


@settings(max_examples=200, deadline=None)
@given(st.lists(CONDITION, max_size=6, unique_by=lambda c: c[0]))
def test_health_agrees_with_the_operators_phase(conditions: list[tuple[str, str]]) -> None:
    status = {"observedGeneration": 1, "message": "m", "conditions": [_condition(k, s, f"{k}={s}") for k, s in conditions]}
    phase = derive_phase([Condition(k, s, "Test", f"{k}={s}", "2026-11-29T00:00:00Z", 1) for k, s in conditions])
    got, _ = health(_experiment(status))
    assert got == HEALTH.get(phase, "Progressing"), (phase, conditions)


def test_argocd_cm_patch_embeds_the_script_verbatim() -> None:
    patch = yaml.safe_load((GITOPS / "argocd-cm-health.yaml").read_text())
    assert patch["data"]["resource.customizations.health.kneepoint.io_ParallelismExperiment"] == SCRIPT


def test_argocd_applications_point_at_this_repository_layout() -> None:
    apps = [d for d in yaml.safe_load_all((GITOPS / "argocd-application.yaml").read_text()) if d]
    assert [a["kind"] for a in apps] == ["Application", "Application"]
    for app in apps:
        assert app["apiVersion"] == "argoproj.io/v1alpha1"
        source = app["spec"]["source"]
        assert (ROOT / source["path"]).is_dir(), source["path"]
        assert app["spec"]["destination"]["namespace"]
    chart_app, experiments_app = apps
    assert chart_app["spec"]["source"]["path"] == "charts/kneepoint"
    assert "ServerSideApply=true" in chart_app["spec"]["syncPolicy"]["syncOptions"]
    values = chart_app["spec"]["source"]["helm"]["valuesObject"]
    chart_values = yaml.safe_load((ROOT / "charts" / "kneepoint" / "values.yaml").read_text())
    assert set(values) <= set(chart_values), "valuesObject may only set keys the chart has"
    include = experiments_app["spec"]["source"]["directory"]["include"]
    assert (ROOT / experiments_app["spec"]["source"]["path"] / include).is_file()
