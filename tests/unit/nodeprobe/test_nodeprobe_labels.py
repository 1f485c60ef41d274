"""node_labels: the CONTRACTS D labels and annotation per topology, and label-value hygiene."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from nodeprobe_recordings import DATA, EXPECTED_LABELS, FIXTURES, H200_ENV_TOPO, NODE, load

from kneepoint.nodeprobe.node_labels import (
    ANNOTATION_GPU_TOPOLOGY,
    PROBE_LABEL_KEYS,
    domain_id,
    gfd_product_name,
    is_valid_label_value,
    node_labels,
    node_marks,
    sanitize_label_value,
    validate_node_name,
)
from kneepoint.nodeprobe.topology import topology_from_recording


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_labels_per_fixture(name: str) -> None:
    labels = node_labels(topology_from_recording(load(name)), NODE)
    assert labels == EXPECTED_LABELS[name]
    assert set(labels) == set(PROBE_LABEL_KEYS)
    assert all(is_valid_label_value(v) for v in labels.values())


def test_real_h200_labels_match_the_device_run_and_nvidia_smi() -> None:
    """Labels derived here equal those the device printed from the same recording, and nvidia-smi's facts."""
    device_output = json.loads((DATA / "h200x2-real.labels.json").read_text())
    marks = node_marks(topology_from_recording(load("h200x2-real")), device_output["node"])
    assert marks.labels == device_output["labels"]
    assert marks.annotations == device_output["annotations"]
    assert marks.labels == {
        "kneepoint.io/gpu-product": "NVIDIA-H200",
        "kneepoint.io/gpu-count": "2",
        "kneepoint.io/gpu-memory-mib": "143771",
        "kneepoint.io/nvlink-domain": "h200x2-nvl0",
        "kneepoint.io/nvlink-domain-size": "2",
        "kneepoint.io/nvlink-domains": "1",
        "kneepoint.io/interconnect": "nvlink",
    }
    smi = (DATA / "h200x2-real.env.txt").read_text()
    assert "0, NVIDIA H200, 143771 MiB, 00000000:00:06.0" in smi and "GPU0\t X \tNV18" in smi
    # GFD would label this product NVIDIA-H200 (the sandbox fleet uses the same value).
    env = json.loads(H200_ENV_TOPO.read_text())["calls"]["call3"]
    assert gfd_product_name(env["versions"]["gpus_visible"][0]) == "NVIDIA-H200"


def test_annotation_carries_matrix_gpus_and_domains() -> None:
    marks = node_marks(topology_from_recording(load("bridged-2x2")), NODE)
    doc = json.loads(marks.annotations[ANNOTATION_GPU_TOPOLOGY])
    assert doc["v"] == 1 and doc["interconnect"] == "mixed"
    assert doc["links"][0] == ["X", "NV12", "SYS", "SYS"]
    assert doc["pcie"][0] == ["X", "NODE", "SYS", "SYS"]
    assert doc["domains"] == [{"id": "gpu-node-a-nvl0", "gpus": [0, 1]}, {"id": "gpu-node-a-nvl1", "gpus": [2, 3]}]
    assert [g["activeNvlinks"] for g in doc["gpus"]] == [12, 12, 12, 12]
    assert doc["gpus"][3]["uuid"] == "GPU-00000000-0000-4000-8000-000000000003"


def test_annotation_of_8_gpus_stays_small() -> None:
    marks = node_marks(topology_from_recording(load("nvswitch-8gpu")), NODE)
    assert len(marks.annotations[ANNOTATION_GPU_TOPOLOGY]) < 4096


def test_multi_node_clique_becomes_the_domain_id() -> None:
    recording = load("nvswitch-8gpu")
    for device in recording["devices"]:
        device["fabric"] = {"clusterUuid": "0123456789abcdef0123456789abcdef", "status": 0, "cliqueId": 32766, "state": 3, "healthMask": 0}
    labels = node_labels(topology_from_recording(recording), NODE)
    assert labels["kneepoint.io/nvlink-domain"] == "01234567-89ab-cdef-0123-456789abcdef.32766"
    assert is_valid_label_value(labels["kneepoint.io/nvlink-domain"])
    assert labels["kneepoint.io/nvlink-domain-size"] == "8"


def test_unreadable_name_and_memory_leave_those_labels_out() -> None:
    recording = load("pcie-4gpu")
    recording["devices"][0]["name"] = {"nvmlError": 15, "message": "GPU is lost"}
    recording["devices"][3]["memoryTotalBytes"] = {"nvmlError": 15, "message": "GPU is lost"}
    labels = node_labels(topology_from_recording(recording), NODE)
    assert "kneepoint.io/gpu-product" not in labels and "kneepoint.io/gpu-memory-mib" not in labels
    assert labels["kneepoint.io/gpu-count"] == "4"


def test_memory_label_is_the_smallest_gpu() -> None:
    recording = load("pcie-4gpu")
    recording["devices"][2]["memoryTotalBytes"] = 1000 * 1024 * 1024
    assert node_labels(topology_from_recording(recording), NODE)["kneepoint.io/gpu-memory-mib"] == "1000"


def test_no_gpus_gives_no_labels() -> None:
    empty = {"deviceCount": 0, "devices": [], "pairs": []}
    with pytest.raises(ValueError, match="no GPUs"):
        node_labels(topology_from_recording(empty), NODE)


@pytest.mark.parametrize(
    ("name", "label"),
    [
        ("NVIDIA H200", "NVIDIA-H200"),
        ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
        ("NVIDIA GeForce RTX 4090 (ES)", "NVIDIA-GeForce-RTX-4090-ES"),
        ("  Tesla   T4 ", "Tesla-T4"),
    ],
)
def test_gfd_product_names(name: str, label: str) -> None:
    assert gfd_product_name(name) == label


@given(st.text(max_size=200))
def test_sanitized_values_are_always_valid_label_values(text: str) -> None:
    assert is_valid_label_value(sanitize_label_value(text))


def test_long_node_names_get_short_unique_domain_ids() -> None:
    first = "a" * 60 + ".compute.internal"
    second = "a" * 60 + ".compute.example"
    ids = {domain_id(first, 0), domain_id(second, 0), domain_id(first, 1)}
    assert len(ids) == 3 and all(is_valid_label_value(i) and i.endswith(("-nvl0", "-nvl1")) for i in ids)
    assert domain_id("ip-10-0-1-5.ec2.internal", 0) == "ip-10-0-1-5.ec2.internal-nvl0"


@pytest.mark.parametrize("bad", ["", "Upper", "under_score", "-lead", "a" * 254])
def test_invalid_node_names_are_refused_with_the_flag_named(bad: str) -> None:
    with pytest.raises(ValueError, match="--node-name"):
        validate_node_name(bad)
