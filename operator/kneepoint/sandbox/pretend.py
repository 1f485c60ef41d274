"""Pretend pods: the sandbox's KWOK stages run them without a process (test-only).

A pod labelled ``kneepoint.io/sandbox-pretend: "true"`` is left alone by the pod runner;
KWOK's stages (``data/sandbox/kwok-stages.yaml``) make it Running and Ready, and a Job's pod
Succeeded with the annotation ``kneepoint.io/sandbox-pretend-termination-message`` as its
containers' termination message.

The operator knows nothing of this. The operator-scale benchmark, which needs engines and
load tests that cost no process, marks the operator's pods at admission instead: the API
server's own MutatingAdmissionPolicy (GA in Kubernetes 1.36, the sandbox's release) adds the
label to every engine and load-test pod created in the benchmark's namespace, and the
summary annotation to the load-test pods. The objects are built here (pure) and applied by
the benchmark.
"""

from __future__ import annotations

import json
from typing import Any

from kneepoint.kube import naming

PRETEND_LABEL = "kneepoint.io/sandbox-pretend"
PRETEND_MESSAGE_ANNOTATION = "kneepoint.io/sandbox-pretend-termination-message"
ADMISSION_API_VERSION = "admissionregistration.k8s.io/v1"


def _policy(name: str, roles: list[str], metadata: str) -> dict[str, Any]:
    """A policy that merges ``metadata`` (a CEL ``Object.metadata{...}`` body) into each new pod of ``roles``."""
    return {
        "apiVersion": ADMISSION_API_VERSION,
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "matchConstraints": {
                "resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
                "objectSelector": {"matchExpressions": [{"key": naming.LABEL_ROLE, "operator": "In", "values": roles}]},
            },
            "mutations": [
                {
                    "patchType": "ApplyConfiguration",
                    "applyConfiguration": {"expression": f"Object{{metadata: Object.metadata{{{metadata}}}}}"},
                }
            ],
        },
    }


def _binding(name: str, namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": ADMISSION_API_VERSION,
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
        },
    }


def admission_policies(namespace: str, termination_message: str, prefix: str = "kneepoint-pretend") -> list[dict[str, Any]]:
    """The policies and bindings that make every engine and load-test pod created in ``namespace`` a
    pretend pod, each load-test pod ending with ``termination_message``. Cluster-scoped objects named
    ``<prefix>-pods`` and ``<prefix>-summary``; delete them (or the sandbox) when done."""
    # json.dumps writes a valid CEL string literal (CEL's escapes include JSON's).
    label = f"labels: {{{json.dumps(PRETEND_LABEL)}: {json.dumps('true')}}}"
    annotation = f"annotations: {{{json.dumps(PRETEND_MESSAGE_ANNOTATION)}: {json.dumps(termination_message)}}}"
    pods, summary = f"{prefix}-pods", f"{prefix}-summary"
    return [
        _policy(pods, [naming.ROLE_ENGINE, naming.ROLE_LOADTEST], label),
        _binding(pods, namespace),
        _policy(summary, [naming.ROLE_LOADTEST], annotation),
        _binding(summary, namespace),
    ]
