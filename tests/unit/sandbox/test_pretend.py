"""The pretend pods of the operator-scale benchmark: made at admission, not by the operator's builders."""

import json
import re

import yaml

from kneepoint.core.spec import parse_spec
from kneepoint.core.tiers import Tier
from kneepoint.kube import manifests, naming
from kneepoint.sandbox import pretend
from kneepoint.sandbox.runner.main import is_pretend

PKG = __import__("pathlib").Path(pretend.__file__).resolve().parents[1]
OWNER = manifests.Owner("exp", "ns", "uid-1")
SPEC = parse_spec({"model": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct"}})
SUMMARY = '{"v":1,"ok":true,"outputTokensPerSecond":1000.0,"note":"a \\"quoted\\" \\\\ line"}'


def test_the_operator_builds_no_pretend_pods():
    ctx = manifests.BuildContext()
    engine = manifests.build_engine_deployment(SPEC, OWNER, Tier(2), ctx)
    job = manifests.build_load_test_job(SPEC, OWNER, Tier(2), 1, ctx)
    for template in (engine["spec"]["template"], job["spec"]["template"]):
        assert pretend.PRETEND_LABEL not in template["metadata"]["labels"]
        assert pretend.PRETEND_MESSAGE_ANNOTATION not in template["metadata"].get("annotations", {})


def test_policies_mark_engine_and_load_test_pods_of_one_namespace():
    objects = pretend.admission_policies("scale-1", SUMMARY, prefix="p")
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert kinds == [
        ("MutatingAdmissionPolicy", "p-pods"),
        ("MutatingAdmissionPolicyBinding", "p-pods"),
        ("MutatingAdmissionPolicy", "p-summary"),
        ("MutatingAdmissionPolicyBinding", "p-summary"),
    ]
    assert all(o["apiVersion"] == "admissionregistration.k8s.io/v1" for o in objects)
    pods, pods_binding, summary, summary_binding = objects
    for policy, binding, roles in ((pods, pods_binding, ["engine", "loadtest"]), (summary, summary_binding, ["loadtest"])):
        match = policy["spec"]["matchConstraints"]
        assert match["resourceRules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]
        assert match["objectSelector"]["matchExpressions"] == [{"key": naming.LABEL_ROLE, "operator": "In", "values": roles}]
        assert binding["spec"]["policyName"] == policy["metadata"]["name"]
        assert binding["spec"]["matchResources"]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "scale-1"}}
    label = pods["spec"]["mutations"][0]["applyConfiguration"]["expression"]
    assert label == 'Object{metadata: Object.metadata{labels: {"kneepoint.io/sandbox-pretend": "true"}}}'
    annotation = summary["spec"]["mutations"][0]["applyConfiguration"]["expression"]
    key, literal = re.fullmatch(r'Object\{metadata: Object\.metadata\{annotations: \{("[^"]+"): (".*")\}\}\}', annotation).groups()
    # The summary reaches the pod as it was given (the literal is JSON's escaping, which CEL reads alike).
    assert json.loads(key) == pretend.PRETEND_MESSAGE_ANNOTATION and json.loads(literal) == SUMMARY


def test_the_label_is_the_one_the_runner_and_kwok_stages_read():
    assert is_pretend({"metadata": {"labels": {pretend.PRETEND_LABEL: "true"}}})
    stages = (PKG / "data" / "sandbox" / "kwok-stages.yaml").read_text()
    assert f'.metadata.labels["{pretend.PRETEND_LABEL}"]' in stages
    complete = next(d for d in yaml.safe_load_all(stages) if d["metadata"]["name"] == "pod-complete")
    assert pretend.PRETEND_MESSAGE_ANNOTATION in complete["spec"]["next"]["statusTemplate"]
