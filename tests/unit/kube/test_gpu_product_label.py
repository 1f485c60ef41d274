"""Clusters without GPU Feature Discovery, or with time-slicing: engines select on the label the fleet view matched."""

import dataclasses

import pytest

from kneepoint.core import node_labels
from kneepoint.core.spec import parse_spec
from kneepoint.core.tiers import Tier
from kneepoint.kube import fleet, manifests

OWNER = manifests.Owner("llama8b", "team-a", "uid-1")
SPEC = parse_spec({"model": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct"}, "placement": {"gpuProduct": "NVIDIA-H200"}})


def node(name, labels, gpus=8):
    return {
        "metadata": {"name": name, "labels": labels},
        "status": {"allocatable": {"nvidia.com/gpu": str(gpus)}, "conditions": [{"type": "Ready", "status": "True"}]},
    }


GFD = node("gfd", {node_labels.NODE_GPU_PRODUCT: "NVIDIA-H200"})
SHARED = node("shared", {node_labels.NODE_GPU_PRODUCT: "NVIDIA-H200-SHARED"})
PROBE_ONLY = node("probed", {node_labels.NODE_PROBE_GPU_PRODUCT: "NVIDIA-H200"})
OTHER = node("l40s", {node_labels.NODE_GPU_PRODUCT: "NVIDIA-L40S"})


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (GFD, (node_labels.NODE_GPU_PRODUCT, "NVIDIA-H200")),
        (SHARED, (node_labels.NODE_GPU_PRODUCT, "NVIDIA-H200-SHARED")),
        (PROBE_ONLY, (node_labels.NODE_PROBE_GPU_PRODUCT, "NVIDIA-H200")),
        (OTHER, None),
    ],
    ids=["gfd", "time-sliced", "probe-only", "other-product"],
)
def test_the_label_a_node_matched_by(n, expected):
    assert fleet.product_selector(n["metadata"]["labels"], "NVIDIA-H200") == expected


def test_fleet_view_counts_time_sliced_and_probe_only_nodes_as_the_product():
    view = fleet.fleet_view([GFD, SHARED, PROBE_ONLY, OTHER], [], "nvidia.com/gpu", "NVIDIA-H200", {})
    assert [d.node_name for d in view.domains] == ["gfd", "probed", "shared"]
    assert {d.gpu_product for d in view.domains} == {"NVIDIA-H200"}
    assert fleet.product_selectors([GFD, SHARED, PROBE_ONLY, OTHER], "NVIDIA-H200") == {
        "gfd": (node_labels.NODE_GPU_PRODUCT, "NVIDIA-H200"),
        "shared": (node_labels.NODE_GPU_PRODUCT, "NVIDIA-H200-SHARED"),
        "probed": (node_labels.NODE_PROBE_GPU_PRODUCT, "NVIDIA-H200"),
    }
    assert fleet.placement_problem([SHARED], "nvidia.com/gpu", "NVIDIA-H200", {}) is None


@pytest.mark.parametrize("n", [GFD, SHARED, PROBE_ONLY], ids=["gfd", "time-sliced", "probe-only"])
def test_engine_selects_the_label_its_node_carries(n):
    selector = fleet.product_selector(n["metadata"]["labels"], "NVIDIA-H200")
    ctx = manifests.BuildContext(gpu_product="NVIDIA-H200", gpu_product_label=selector)
    pod = manifests.build_engine_deployment(SPEC, OWNER, Tier(1, 1), ctx)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == dict([selector])
    # The selector matches the node it was derived from.
    assert all(n["metadata"]["labels"].get(k) == v for k, v in pod["nodeSelector"].items())


def test_without_a_matched_label_the_gfd_label_is_the_default():
    ctx = dataclasses.replace(manifests.BuildContext(gpu_product="NVIDIA-H200"))
    pod = manifests.build_engine_deployment(SPEC, OWNER, Tier(1, 1), ctx)["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {node_labels.NODE_GPU_PRODUCT: "NVIDIA-H200"}
