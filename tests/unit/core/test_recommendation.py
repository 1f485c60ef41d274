"""status.recommendation's numbers, computed in core from the spec and the decision."""

from ladder_driver import make_spec

from kneepoint.core.recommendation import recommendation
from kneepoint.core.status import Decision, Recommendation


def decision(**over):
    base = dict(tensor_parallel=1, pipeline_parallel=1, gpus_per_replica=1, replicas=11, per_replica_concurrency=32)
    return Decision(**{**base, **over})


def test_standard_scales_on_running_requests_and_knative_on_concurrency():
    standard = make_spec(export={"kserve": {"deploymentMode": "RawDeployment"}}, capacity={"minReplicas": 2})
    assert recommendation(standard, decision(), "cm") == Recommendation("cm", 2, 11, "vllm:num_requests_running", 32)
    knative = make_spec(export={"kserve": {"deploymentMode": "Serverless"}})
    assert recommendation(knative, decision(), "cm") == Recommendation("cm", 1, 11, "concurrency", 32)


def test_multi_node_and_not_exportable_keep_the_decided_replicas_fixed():
    spec = make_spec()
    assert recommendation(spec, decision(pipeline_parallel=2, multi_node=True), "cm") == Recommendation("cm", 11, 11, "none", 32)
    fixed = recommendation(spec, decision(), "cm", not_exportable="no InferenceService: why")
    assert fixed == Recommendation("cm", 11, 11, "none", 32, "no InferenceService: why")
    # Without a measured per-replica concurrency the target is the load test's.
    assert recommendation(spec, decision(per_replica_concurrency=None), "cm").scale_target == spec.load.concurrency
