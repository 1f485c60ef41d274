"""The test-only pretend mode of the builders (operator-scale benchmark): labels and the summary annotation."""

from kneepoint.core.spec import parse_spec
from kneepoint.core.tiers import Tier
from kneepoint.kube import manifests
from kneepoint.settings import OperatorSettings

OWNER = manifests.Owner("exp", "ns", "uid-1")
SPEC = parse_spec({"model": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct"}})
SUMMARY = '{"v":1,"ok":true,"outputTokensPerSecond":1000.0}'


def test_without_the_setting_pods_carry_no_pretend_label_or_annotation():
    ctx = manifests.BuildContext()
    engine = manifests.build_engine_deployment(SPEC, OWNER, Tier(2), ctx)
    job = manifests.build_load_test_job(SPEC, OWNER, Tier(2), 1, ctx)
    assert manifests.SANDBOX_PRETEND_LABEL not in engine["spec"]["template"]["metadata"]["labels"]
    assert manifests.SANDBOX_PRETEND_LABEL not in job["spec"]["template"]["metadata"]["labels"]
    assert "annotations" not in job["spec"]["template"]["metadata"]


def test_pretend_mode_labels_pods_and_hands_the_summary_to_kwok():
    ctx = manifests.BuildContext(pretend_termination_message=SUMMARY)
    engine = manifests.build_engine_deployment(SPEC, OWNER, Tier(2), ctx)
    job = manifests.build_load_test_job(SPEC, OWNER, Tier(2), 1, ctx)
    template = engine["spec"]["template"]["metadata"]
    assert template["labels"][manifests.SANDBOX_PRETEND_LABEL] == "true"
    # Selectors stay the child's labels, so readers and Services find the pods as before.
    assert manifests.SANDBOX_PRETEND_LABEL not in engine["spec"]["selector"]["matchLabels"]
    assert set(engine["spec"]["selector"]["matchLabels"].items()) <= set(template["labels"].items())
    pod = job["spec"]["template"]["metadata"]
    assert pod["labels"][manifests.SANDBOX_PRETEND_LABEL] == "true"
    assert pod["annotations"] == {manifests.SANDBOX_PRETEND_MESSAGE_ANNOTATION: SUMMARY}


def test_setting_comes_from_the_environment_only_when_set(monkeypatch):
    monkeypatch.delenv("KNEEPOINT_SANDBOX_PRETEND_SUMMARY", raising=False)
    assert OperatorSettings.from_env().sandbox_pretend_termination_message is None
    monkeypatch.setenv("KNEEPOINT_SANDBOX_PRETEND_SUMMARY", SUMMARY)
    assert OperatorSettings.from_env().sandbox_pretend_termination_message == SUMMARY
