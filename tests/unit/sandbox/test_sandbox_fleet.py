"""Fleet document -> Node objects (pure), including the default fleet file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from kneepoint.sandbox import fleet

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_FLEET = ROOT / "deploy" / "sandbox" / "fleet.yaml"


def _group(**overrides: Any) -> dict[str, Any]:
    group = {
        "namePrefix": "h200",
        "count": 1,
        "gpuProduct": "NVIDIA-H200",
        "gpuCount": 8,
        "gpuMemoryMiB": 143771,
        "interconnect": "nvlink",
        "nvlinkDomainSize": 8,
        "cpu": "128",
        "memory": "2Ti",
    }
    group.update(overrides)
    return group


def test_default_fleet_is_two_h200_nvlink_nodes_and_one_l40s_pcie_node() -> None:
    nodes = fleet.node_objects(fleet.parse_fleet(yaml.safe_load(DEFAULT_FLEET.read_text())))
    by_name = {n["metadata"]["name"]: n for n in nodes}
    assert sorted(by_name) == ["h200-0", "h200-1", "l40s-0"]
    h200 = by_name["h200-1"]
    labels = h200["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["nvidia.com/gpu.memory"] == "143771"
    assert labels["kneepoint.io/interconnect"] == "nvlink"
    assert labels["kneepoint.io/nvlink-domain"] == "h200-1-nvl0"
    assert labels["kneepoint.io/nvlink-domain-size"] == "8"
    assert labels["kneepoint.io/nvlink-domains"] == "1"
    assert labels["kneepoint.io/gpu-product"] == "NVIDIA-H200"
    assert labels["kneepoint.io/gpu-count"] == "8"
    assert labels["kneepoint.io/gpu-memory-mib"] == "143771"
    assert h200["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert h200["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert h200["metadata"]["annotations"][fleet.KWOK_ANNOTATION] == "fake"
    assert "taints" not in h200["spec"]
    l40s = by_name["l40s-0"]["metadata"]["labels"]
    assert l40s["nvidia.com/gpu.product"] == "NVIDIA-L40S"
    assert l40s["kneepoint.io/interconnect"] == "pcie"
    assert l40s["kneepoint.io/nvlink-domain-size"] == "1"
    assert l40s["kneepoint.io/nvlink-domains"] == "4"
    assert by_name["l40s-0"]["status"]["allocatable"]["nvidia.com/gpu"] == "4"


def test_nvlink_domain_size_defaults_to_all_gpus_on_nvlink_and_one_on_pcie() -> None:
    (nv,) = fleet.parse_fleet({"nodeGroups": [_group(nvlinkDomainSize=None)]})
    assert nv.nvlink_domain_size == 8
    (pc,) = fleet.parse_fleet({"nodeGroups": [_group(interconnect="pcie", nvlinkDomainSize=None)]})
    assert pc.nvlink_domain_size == 1


def test_extra_labels_and_inter_node_bandwidth_are_carried() -> None:
    groups = fleet.parse_fleet({"nodeGroups": [_group(labels={"zone": "a", "spot": True}, interNodeGbps=400)]})
    labels = fleet.node_objects(groups)[0]["metadata"]["labels"]
    assert labels["zone"] == "a" and labels["spot"] == "true"
    assert labels["kneepoint.io/inter-node-gbps"] == "400"


def test_cpu_only_group_has_no_gpu_labels_or_resource() -> None:
    groups = fleet.parse_fleet(
        {"nodeGroups": [_group(namePrefix="cpu", gpuCount=0, gpuProduct=None, interconnect="pcie", nvlinkDomainSize=None)]}
    )
    node = fleet.node_objects(groups)[0]
    assert "nvidia.com/gpu" not in node["status"]["allocatable"]
    assert not any(k.startswith("nvidia.com/") for k in node["metadata"]["labels"])


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"nodeGroups": []}, "nodeGroups: required"),
        ({"kind": "Other", "nodeGroups": [_group()]}, "kind: 'Other'"),
        ({"nodeGroups": [_group(count=0)]}, r"nodeGroups\[0\].count: 0 is not an integer >= 1"),
        ({"nodeGroups": [_group(namePrefix="H200")]}, r"nodeGroups\[0\].namePrefix"),
        (
            {"nodeGroups": [_group(interconnect="infiniband")]},
            r"nodeGroups\[0\].interconnect: 'infiniband' is not one of nvlink, pcie, mixed",
        ),
        ({"nodeGroups": [_group(nvlinkDomainSize=16)]}, r"nvlinkDomainSize: 16 is more than gpuCount 8"),
        ({"nodeGroups": [_group(interconnect="pcie", nvlinkDomainSize=4)]}, r"nvlinkDomainSize: 4 with interconnect pcie"),
        ({"nodeGroups": [_group(memory="lots")]}, r"nodeGroups\[0\].memory: 'lots' is not a Kubernetes quantity"),
        ({"nodeGroups": [_group(gpus=8)]}, r"nodeGroups\[0\].gpus: unknown key"),
        ({"nodeGroups": [_group(), _group(count=2)]}, r"nodeGroups\[1\].namePrefix: node name h200-0 also comes from nodeGroups\[0\]"),
        ({"nodeGroups": [_group(gpuMemoryMiB=None)]}, r"nodeGroups\[0\].gpuMemoryMiB: required"),
    ],
)
def test_bad_fleet_names_the_field(document: dict[str, Any], message: str) -> None:
    with pytest.raises(fleet.FleetError, match=message):
        fleet.parse_fleet(document)


@given(
    st.lists(
        st.tuples(st.integers(1, 4), st.integers(1, 8), st.sampled_from(["nvlink", "pcie"])),
        min_size=1,
        max_size=4,
    )
)
def test_every_gpu_node_has_a_cluster_unique_domain_and_consistent_counts(specs: list[tuple[int, int, str]]) -> None:
    groups = [
        _group(
            namePrefix=f"g{i}", count=count, gpuCount=gpus, interconnect=link, nvlinkDomainSize=None if link == "nvlink" or gpus == 1 else 1
        )
        for i, (count, gpus, link) in enumerate(specs)
        if not (link == "nvlink" and gpus == 1)
    ]
    if not groups:
        return
    nodes = fleet.node_objects(fleet.parse_fleet({"nodeGroups": groups}))
    assert len(nodes) == sum(g["count"] for g in groups)
    domains = [n["metadata"]["labels"]["kneepoint.io/nvlink-domain"] for n in nodes]
    assert len(set(domains)) == len(domains)
    for node in nodes:
        labels = node["metadata"]["labels"]
        gpus = int(labels["nvidia.com/gpu.count"])
        size = int(labels["kneepoint.io/nvlink-domain-size"])
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == str(gpus)
        assert 1 <= size <= gpus
        assert int(labels["kneepoint.io/nvlink-domains"]) * size >= gpus
