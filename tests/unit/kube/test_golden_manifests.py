"""Golden manifests: each example's objects as the builders write them, checked in as YAML.

test_manifests.py and test_multinode_kube.py check fields one by one; these files show the
whole of what the operator creates for each example in deploy/examples (as kubebuilder
projects keep expected output beside their tests), so a change to any field shows up in
review as a diff of tests/golden/*.yaml. For every tier of the example's ladder: the engine
(a Deployment, or a LeaderWorkerSet when the tier spans nodes), its Service and the
load-test Job of attempt 1; then the KServe InferenceService the export publishes, or the
LeaderWorkerSet it writes when KServe cannot run the decided tier.

After an intended change, regenerate and review the diff:

    KNEEPOINT_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -q tests/unit/kube/test_golden_manifests.py
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from kneepoint.commands import experiment_source
from kneepoint.commands.export import NotDecided, decision_for_export
from kneepoint.core.architectures import architecture_from_spec
from kneepoint.core.status import Decision
from kneepoint.core.tiers import Tier, build_ladder
from kneepoint.kube import kserve, manifests
from kneepoint.settings import OperatorSettings

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "deploy" / "examples").glob("*.yaml"))
GOLDEN = ROOT / "tests" / "golden"
UPDATE = "KNEEPOINT_UPDATE_GOLDEN"
COMMAND = f"{UPDATE}=1 .venv/bin/python -m pytest -q tests/unit/kube/test_golden_manifests.py"

UID = "00000000-0000-4000-8000-000000000000"
NODE_GPUS = 8
"""GPUs per node in the examples' fleets (H200 and L40S nodes of eight): a tier of more spans nodes."""
UNDECIDED = Decision(tensor_parallel=2, pipeline_parallel=1, gpus_per_replica=2, replicas=3, rule="throughput-gain")
"""The decision exported for an example without recorded results (the builders' input, not a measurement)."""


def _objects(example: Path) -> list[dict[str, Any]]:
    exp = experiment_source.read_file(str(example), require_tiers=False)
    spec = exp.spec
    owner = manifests.Owner(exp.name or example.stem, exp.namespace or "default", UID)
    architecture = architecture_from_spec(spec.model.architecture, None, model_name=spec.model.uri)
    ctx = manifests.BuildContext(
        operator_image=OperatorSettings().operator_image,
        architecture_json=spec.model.architecture.preset,
        architecture=architecture,
        gpu_product=spec.placement.gpu_product,
        require_nvlink=spec.placement.gpu_product != "NVIDIA-L40S",  # the PCIe example's fleet has no NVLink
    )
    out: list[dict[str, Any]] = []
    for tier in build_ladder(spec.tiers.tensor_parallel, spec.tiers.pipeline_parallel):
        if tier.gpus > NODE_GPUS:
            out.append(manifests.build_engine_leader_worker_set(spec, owner, tier, ctx, spec.placement.multi_node_topology_key))
            out.append(manifests.build_engine_service(spec, owner, tier, leader_only=True))
        else:
            out.append(manifests.build_engine_deployment(spec, owner, tier, ctx))
            out.append(manifests.build_engine_service(spec, owner, tier))
        out.append(manifests.build_load_test_job(spec, owner, tier, 1, ctx))
    try:
        decision = decision_for_export(exp)  # recomputed from the recorded tiers
    except NotDecided:
        decision = UNDECIDED
    if kserve.multi_node_problem(spec, kserve.canonical_mode(spec.export.kserve.deployment_mode)) and kserve.is_multi_node(decision):
        lws = manifests.build_engine_leader_worker_set(spec, owner, Tier(decision.tensor_parallel, decision.pipeline_parallel), ctx)
        lws["spec"]["replicas"] = max(1, decision.replicas)
        out.append(lws)
    else:
        out.append(
            kserve.build_inference_service(
                spec,
                owner.name,
                owner.namespace,
                decision,
                kserve.checkpoint_bytes(spec, architecture),
                prometheus_url=OperatorSettings().prometheus_url,
            )
        )
    return out


def _render(example: Path) -> str:
    header = f"# The builders' output for deploy/examples/{example.name} (tests/unit/kube/test_golden_manifests.py).\n# Do not edit: regenerate with {COMMAND}\n"
    return header + yaml.safe_dump_all(_objects(example), sort_keys=False, explicit_start=True)


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.stem for e in EXAMPLES])
def test_builders_write_the_golden_manifests(example: Path) -> None:
    golden = GOLDEN / example.name
    text = _render(example)
    if os.environ.get(UPDATE):
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(text, encoding="utf-8")
    assert golden.exists(), f"{golden.relative_to(ROOT)} is missing: write it with {COMMAND}"
    assert golden.read_text(encoding="utf-8") == text, (
        f"the builders' output differs from {golden.relative_to(ROOT)}: if intended, {COMMAND} and review the diff"
    )


def test_every_golden_file_has_its_example() -> None:
    assert sorted(p.name for p in GOLDEN.glob("*.yaml")) == [e.name for e in EXAMPLES]


def test_the_golden_files_hold_each_kind() -> None:
    kinds = {p.stem: [d["kind"] for d in yaml.safe_load_all(p.read_text(encoding="utf-8"))] for p in GOLDEN.glob("*.yaml")}
    assert all({"Deployment", "Service", "Job"} <= set(k) for k in kinds.values()), kinds
    assert "LeaderWorkerSet" in kinds["large-model"]
    assert all(k[-1] in ("InferenceService", "LeaderWorkerSet") for k in kinds.values())
