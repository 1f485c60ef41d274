"""Bad input: malformed experiments are refused by the real API server, or Failed by the operator,
always with a message that names the field.

Two judges, as a user meets them:

1. The sandbox's kube-apiserver (the CRD's structural schema and CEL rules), asked as
   ``kubectl apply`` asks (strict field validation; a server-side dry run per case, and
   kubectl itself for one case of each kind). The table is the contract
   tests' ``BAD_SPECS`` (tests/contract/test_examples.py, which checks the same cases
   against an emulation of the schema) plus the wrong types and thresholds the issue
   lists that are not in it. The real server must refuse each, naming the field.
2. What only the operator can judge, because it depends on the fleet: TP above every
   node's GPU count, a GPU resource no node offers, a GPU product no node has (known to
   the catalogue or not). The object is accepted; the operator must set it Failed (or
   finish it with every tier Skipped) with a message naming the field, deploy nothing and
   hold no GPU.
"""

from __future__ import annotations

import copy
import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from experiment_api import Cluster, condition, experiment
from fault_harness import FaultLog, session_namespace
from kubernetes import client
from kubernetes.client.exceptions import ApiException

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "contract"))
from test_examples import BAD_SPECS, BASE, _bad, _set

# Cases the issue names that BAD_SPECS does not hold (wrong types, negative thresholds).
EXTRA_BAD = [
    ("concurrency-string", _set("load.concurrency", "many"), "spec.load.concurrency"),
    ("max-model-len-string", _set("model.maxModelLen", "4k"), "spec.model.maxModelLen"),
    ("tp-not-a-list", _set("tiers.tensorParallel", 2), "spec.tiers.tensorParallel"),
    ("p99-degradation-negative", _set("stopRules.maxP99Degradation", -0.1), "spec.stopRules.maxP99Degradation"),
    ("comm-fraction-above-1", _set("stopRules.maxCommFraction", 1.5), "spec.stopRules.maxCommFraction"),
    ("memory-headroom-above-1", _set("stopRules.memoryHeadroom", 1.2), "spec.stopRules.memoryHeadroom"),
    ("max-error-fraction-above-1", _set("load.maxErrorFraction", 2), "spec.load.maxErrorFraction"),
    ("redundancy-negative", _set("capacity.redundancyFactor", -1), "spec.capacity.redundancyFactor"),
    ("gpu-resource-malformed", _set("placement.gpuResource", "GPU!"), "spec.placement.gpuResource"),
    ("kv-cache-dtype-unknown", _set("model.kvCacheDtype", "int3"), "spec.model.kvCacheDtype"),
    ("tier-timeout-too-short", _set("budget.tierTimeoutSeconds", 1), "spec.budget.tierTimeoutSeconds"),
    ("dtype-wrong-type", _set("model.dtype", 16), "spec.model.dtype"),
]
TABLE = [(i, m, f) for i, m, f in BAD_SPECS] + EXTRA_BAD


@pytest.fixture(scope="module")
def table_namespace(sandbox: Any, operator: Any) -> Iterator[str]:
    """One namespace for the whole table (nothing is created in it: every request is refused)."""
    name = session_namespace(operator, f"bad-{uuid.uuid4().hex[:6]}")
    sandbox.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        sandbox.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def custom(sandbox: Any) -> Iterator[Any]:
    with sandbox.api_client() as api:
        yield client.CustomObjectsApi(api)


def _document(namespace: str, spec: dict[str, Any], name: str = "bad") -> dict[str, Any]:
    return {
        "apiVersion": "kneepoint.io/v1alpha1",
        "kind": "ParallelismExperiment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


@pytest.mark.parametrize(("mutation", "field"), [(m, f) for _, m, f in TABLE], ids=[i for i, _, _ in TABLE])
def test_api_server_refuses_naming_the_field(
    custom: Any, table_namespace: str, mutation: Callable[[dict[str, Any]], None], field: str
) -> None:
    # As kubectl sends it (strict field validation), but a dry run: a refusal leaves nothing either way.
    with pytest.raises(ApiException) as info:
        custom.create_namespaced_custom_object(
            "kneepoint.io",
            "v1alpha1",
            table_namespace,
            "parallelismexperiments",
            _document(table_namespace, _bad(mutation)),
            dry_run="All",
            field_validation="Strict",
        )
    assert info.value.status in (400, 422), info.value
    message = json.loads(info.value.body)["message"]
    assert field in message, message
    FaultLog().record("bad-input", f"api-server: {field}", True, rejected_by="kube-apiserver", message=message[:300])


def test_kubectl_apply_shows_the_user_the_field(sandbox: Any, table_namespace: str, tmp_path: Path) -> None:
    """The same refusal through the user's own tool, for one case of each kind (schema, CEL, unknown field)."""
    for mutation, field in (
        (_set("tiers.tensorParallel", [1, 3]), "spec.tiers.tensorParallel[1]"),
        (_set("load.outputLen", 3073), "spec.load.inputLen"),
        (_set("load.burstiness", 3), "burstiness"),
    ):
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(_document(table_namespace, _bad(mutation))))
        proc = sandbox.kubectl("apply", "-f", str(path), check=False)
        assert proc.returncode != 0 and field in proc.stderr, proc.stderr
    assert sandbox.kubectl("get", "parallelismexperiments.kneepoint.io", "-n", table_namespace, "-o", "name").stdout.strip() == ""


def test_the_base_of_the_table_is_accepted(custom: Any, table_namespace: str) -> None:
    custom.create_namespaced_custom_object(
        "kneepoint.io",
        "v1alpha1",
        table_namespace,
        "parallelismexperiments",
        _document(table_namespace, copy.deepcopy(BASE), "good"),
        dry_run="All",
        field_validation="Strict",
    )


# id, spec patch (on the suite's small experiment), field the message must name, words it must say
OPERATOR_JUDGED = [
    ("tp-above-every-node", {"tiers": {"tensorParallel": [16]}}, "spec.tiers.tensorParallel", "8"),
    ("gpu-resource-nobody-offers", {"placement": {"gpuResource": "example.com/gpu"}}, "spec.placement.gpuResource", "example.com/gpu"),
    ("gpu-product-not-in-fleet", {"placement": {"gpuProduct": "NVIDIA-A100-SXM4-80GB"}}, "spec.placement.gpuProduct", "NVIDIA-H200"),
    ("gpu-product-unknown", {"placement": {"gpuProduct": "NVIDIA-X999"}}, "spec.placement.gpuProduct", "NVIDIA-X999"),
]


@pytest.mark.parametrize(
    ("patch", "field", "words"), [(p, f, w) for _, p, f, w in OPERATOR_JUDGED], ids=[i for i, _, _, _ in OPERATOR_JUDGED]
)
def test_operator_fails_what_only_the_fleet_can_judge(
    sandbox: Any, operator: Any, namespace: str, patch: dict[str, Any], field: str, words: str
) -> None:
    name = f"bad-{uuid.uuid4().hex[:5]}"
    with sandbox.api_client() as api:
        cluster = Cluster(api)
        cluster.create(experiment(name, namespace, patch))
        status = cluster.wait(namespace, name, lambda s: s.get("phase") in ("Failed", "Decided"), 60, "Failed")
        # Events are posted right after the status write.
        deadline = time.monotonic() + 10
        while not (events := cluster.events(namespace, name, order="first")) and time.monotonic() < deadline:
            time.sleep(0.3)
        children = cluster.workload_names(namespace, name)
    assert status["phase"] == "Failed", status
    failed = condition(status, "Failed")
    assert failed and failed["status"] == "True", status.get("conditions")
    assert field in failed["message"] and words in failed["message"], failed["message"]
    assert any(field in e["message"] and e["type"] == "Warning" for e in events), events
    assert children == {"deployments": [], "services": [], "jobs": [], "pods": []}, children
    FaultLog().record("bad-input", f"operator: {field}", True, rejected_by="operator", message=failed["message"][:300])
