"""Objects the engine needs but the namespace lacks: the plan fails at once, naming the field and the object.

A pvc:// model whose PersistentVolumeClaim does not exist, a hubTokenSecretRef naming a
Secret that does not exist or a key the Secret lacks: before this check such a tier waited
Unschedulable (or CreateContainerConfigError) until its timeout. Here the first status the
operator writes (watched from the object's creation, so no intermediate status is missed)
is already Failed with reason MissingObject, nothing is deployed, and when the claim is
created the plan is made without any edit to the experiment.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from experiment_api import GROUP, PLURAL, VERSION, Cluster, condition, experiment
from kubernetes import client, watch


def _first_status(api: client.ApiClient, body: dict[str, Any], timeout: int = 60) -> dict[str, Any]:
    """Create the experiment and return the first status the operator writes (a watch from its creation)."""
    custom = client.CustomObjectsApi(api)
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    created = custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    stream = watch.Watch().stream(
        custom.list_namespaced_custom_object,
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        field_selector=f"metadata.name={name}",
        resource_version=created["metadata"]["resourceVersion"],
        timeout_seconds=timeout,
    )
    for event in stream:
        status = event["object"].get("status") or {}
        if status.get("phase"):
            return status
    raise AssertionError(f"no status written for {namespace}/{name} within {timeout} s")


CASES = [
    (
        "missing-claim",
        {"model": {"uri": "pvc://weights/llama-3.1-8b"}},
        None,
        "spec.model.uri",
        "PersistentVolumeClaim {ns}/weights not found",
    ),
    (
        "missing-secret",
        {"model": {"hubTokenSecretRef": {"name": "hf-token", "key": "token"}}},
        None,
        "spec.model.hubTokenSecretRef.name",
        "Secret {ns}/hf-token not found",
    ),
    (
        "missing-key",
        {"model": {"hubTokenSecretRef": {"name": "hf-token", "key": "token"}}},
        {"HF_TOKEN": "aGY="},
        "spec.model.hubTokenSecretRef.key",
        "Secret {ns}/hf-token has no key 'token' (keys: HF_TOKEN)",
    ),
]


@pytest.mark.parametrize(("patch", "secret", "field", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_missing_object_fails_in_the_first_pass(
    sandbox: Any, operator: Any, namespace: str, patch: dict[str, Any], secret: dict[str, str] | None, field: str, words: str
) -> None:
    name = f"miss-{uuid.uuid4().hex[:5]}"
    with sandbox.api_client() as api:
        if secret is not None:
            client.CoreV1Api(api).create_namespaced_secret(namespace, {"metadata": {"name": "hf-token"}, "data": secret})
        status = _first_status(api, experiment(name, namespace, patch))
        children = Cluster(api).workload_names(namespace, name)
    assert status["phase"] == "Failed", status
    failed = condition(status, "Failed")
    assert failed is not None and failed["reason"] == "MissingObject", status.get("conditions")
    assert field in failed["message"] and words.format(ns=namespace) in failed["message"], failed["message"]
    assert not status.get("tiers")
    assert children == {"deployments": [], "services": [], "jobs": [], "pods": []}, children


def test_the_plan_is_made_once_the_claim_appears(sandbox: Any, operator: Any, namespace: str) -> None:
    name = f"miss-{uuid.uuid4().hex[:5]}"
    with sandbox.api_client() as api:
        cluster = Cluster(api)
        status = _first_status(api, experiment(name, namespace, {"model": {"uri": "pvc://weights/llama-3.1-8b"}}))
        assert condition(status, "Failed")["reason"] == "MissingObject"
        client.CoreV1Api(api).create_namespaced_persistent_volume_claim(
            namespace,
            {"metadata": {"name": "weights"}, "spec": {"accessModes": ["ReadOnlyMany"], "resources": {"requests": {"storage": "20Gi"}}}},
        )
        # Re-checked every 30 s (no watch on claims): planned without touching the experiment.
        planned = cluster.wait(namespace, name, lambda s: (condition(s, "Planned") or {}).get("status") == "True", 75, "Planned")
        cluster.delete(namespace, name)
    assert (condition(planned, "Failed") or {}).get("status") == "False"
    assert planned.get("tiers"), planned
