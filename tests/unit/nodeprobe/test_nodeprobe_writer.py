"""node_writer: merge patches that update the probe's labels in place, remove stale ones, touch nothing else."""

from __future__ import annotations

import pytest
from kubernetes.client.exceptions import ApiException
from nodeprobe_fake_core_api import FakeCoreV1Api
from nodeprobe_recordings import NODE, load

from kneepoint.nodeprobe.node_labels import ANNOTATION_GPU_TOPOLOGY, NodeMarks, node_marks
from kneepoint.nodeprobe.node_writer import NodeWriteError, NodeWriter, plan_patch
from kneepoint.nodeprobe.topology import topology_from_recording


def marks(name: str) -> NodeMarks:
    return node_marks(topology_from_recording(load(name)), NODE)


FOREIGN = {
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "kneepoint.io/inter-node-gbps": "400",
    "kubernetes.io/hostname": NODE,
}


def test_first_run_labels_the_node_and_a_second_run_sends_nothing() -> None:
    api = FakeCoreV1Api(labels=FOREIGN)
    writer = NodeWriter(api)
    first = writer.apply(NODE, marks("nvswitch-8gpu"))
    assert first is not None and len(api.patches) == 1
    assert {k: v for k, v in api.node.metadata.labels.items() if k not in FOREIGN} == marks("nvswitch-8gpu").labels
    assert writer.apply(NODE, marks("nvswitch-8gpu")) is None
    assert len(api.patches) == 1


def test_topology_change_updates_in_place_and_keeps_foreign_labels() -> None:
    api = FakeCoreV1Api(labels=FOREIGN)
    writer = NodeWriter(api)
    writer.apply(NODE, marks("nvswitch-8gpu"))
    patch = writer.apply(NODE, marks("bridged-2x2"))
    assert patch is not None
    assert patch["metadata"]["labels"]["kneepoint.io/interconnect"] == "mixed"
    assert "kneepoint.io/nvlink-domain" not in patch["metadata"]["labels"]  # same id, not re-sent
    labels = api.node.metadata.labels
    assert {k: v for k, v in labels.items() if k in FOREIGN} == FOREIGN
    assert {k: v for k, v in labels.items() if k not in FOREIGN} == marks("bridged-2x2").labels
    assert api.node.metadata.annotations[ANNOTATION_GPU_TOPOLOGY] == marks("bridged-2x2").annotations[ANNOTATION_GPU_TOPOLOGY]


def test_a_label_the_probe_no_longer_computes_is_removed() -> None:
    api = FakeCoreV1Api()
    writer = NodeWriter(api)
    writer.apply(NODE, marks("pcie-4gpu"))
    recording = load("pcie-4gpu")
    recording["devices"][1]["memoryTotalBytes"] = {"nvmlError": 15, "message": "GPU is lost"}
    patch = writer.apply(NODE, node_marks(topology_from_recording(recording), NODE))
    assert patch is not None and patch["metadata"]["labels"] == {"kneepoint.io/gpu-memory-mib": None}
    assert "kneepoint.io/gpu-memory-mib" not in api.node.metadata.labels


def test_plan_patch_on_a_node_without_labels_or_annotations() -> None:
    wanted = marks("h200x2-real")
    patch = plan_patch(None, None, wanted)
    assert patch == {"metadata": {"labels": wanted.labels, "annotations": wanted.annotations}}


@pytest.mark.parametrize("where", ["read", "patch"])
def test_api_errors_become_one_line(where: str) -> None:
    api = FakeCoreV1Api()
    setattr(api, f"{where}_error", ApiException(status=403, reason="Forbidden"))
    with pytest.raises(NodeWriteError) as info:
        NodeWriter(api).apply(NODE, marks("pcie-4gpu"))
    assert str(info.value) == f"{'reading' if where == 'read' else 'patching'} node {NODE}: HTTP 403 Forbidden"
