"""topology: pair matrix, NVLink domains (maximal cliques), interconnect and fabric cliques."""

from __future__ import annotations

import itertools
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from nodeprobe_recordings import EXPECTED_DOMAINS, FIXTURES, H200_ENV_TOPO, load

from kneepoint.nodeprobe.topology import (
    FabricClique,
    RecordingError,
    maximal_cliques,
    topology_from_recording,
)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_domains_per_fixture(name: str) -> None:
    assert list(topology_from_recording(load(name)).domains) == EXPECTED_DOMAINS[name]


def test_nvswitch_8_matrix_is_nv18_everywhere_and_pcie_levels_follow_sockets() -> None:
    topo = topology_from_recording(load("nvswitch-8gpu"))
    links = topo.link_matrix()
    assert all(links[a][b] == ("X" if a == b else "NV18") for a in range(8) for b in range(8))
    pcie = topo.pcie_matrix()
    assert pcie[0][3] == "NODE" and pcie[0][4] == "SYS" and pcie[5][7] == "NODE"
    assert all(g.switch_nvlinks == 18 for g in topo.gpus)
    assert topo.interconnect == "nvlink"


def test_bridged_pairs_count_direct_links_and_are_joined_over_pcie() -> None:
    topo = topology_from_recording(load("bridged-2x2"))
    assert topo.link_matrix() == [
        ["X", "NV12", "SYS", "SYS"],
        ["NV12", "X", "SYS", "SYS"],
        ["SYS", "SYS", "X", "NV12"],
        ["SYS", "SYS", "NV12", "X"],
    ]
    assert topo.pair(1, 0).direct_nvlinks == 12 and topo.pair(0, 1).evidence == "p2p-status"
    assert topo.pair(0, 2).p2p["nvlink"] == "NOT_SUPPORTED"
    assert topo.interconnect == "mixed"


def test_pcie_only_has_no_nvlink_pairs() -> None:
    topo = topology_from_recording(load("pcie-4gpu"))
    assert not any(p.nvlink for p in topo.pairs)
    assert topo.link_matrix()[0][1] == "PIX" and topo.link_matrix()[1][2] == "SYS"
    assert topo.interconnect == "pcie" and topo.largest_domain == (0,)


def test_real_h200_pair_matches_the_earlier_topology_dump() -> None:
    """The recorded run agrees with tests/data/h200/env_topo.json (another 2 x H200 machine of the same kind)."""
    topo = topology_from_recording(load("h200x2-real"))
    env = json.loads(H200_ENV_TOPO.read_text())["calls"]["call3"]
    dump = env["nvml"]
    # 18 active NVLinks per GPU, all to the NVSwitch.
    assert [g.active_nvlinks for g in topo.gpus] == [g["nvlink_active_count"] for g in dump["gpus"]] == [18, 18]
    assert all(g.switch_nvlinks == 18 for g in topo.gpus)
    # Common ancestor HOSTBRIDGE (30), P2P statuses per index identical.
    pair = topo.pair(0, 1)
    assert dump["pairs"][0]["common_ancestor"] == 30 and pair.pcie_level == "PHB"
    for cap in ("read", "write", "nvlink", "atomics", "pci"):
        assert pair.p2p[cap] == dump["pairs"][0]["p2p"][cap]["name"].removeprefix("NVML_P2P_STATUS_")
    assert pair.nvlink and pair.evidence == "p2p-status" and pair.direct_nvlinks == 0
    # nvidia-smi topo -m printed NV18 between the two GPUs.
    assert "GPU0\t X \tNV18" in env["nvidia_smi_topo_m"]["stdout"]
    assert topo.link_matrix() == [["X", "NV18"], ["NV18", "X"]]
    # Memory as nvidia-smi reports it, and the same bus ids.
    assert [g.memory_mib for g in topo.gpus] == [143771, 143771]
    assert [g.pci_bus_id for g in topo.gpus] == [g["pci_bus_id"] for g in dump["gpus"]]
    # Fabric V said COMPLETED with an all-zero cluster UUID in both runs: not a multi-node clique.
    assert dump["gpus"][0]["fabric_info_v"]["state_name"] == "NVML_GPU_FABRIC_STATE_COMPLETED"
    assert load("h200x2-real")["devices"][0]["fabric"]["state"] == 3
    assert topo.domain_clique((0, 1)) is None
    assert topo.interconnect == "nvlink"


def _with_fabric(recording: dict, **fields) -> dict:
    base = {"clusterUuid": "0123456789abcdef0123456789abcdef", "status": 0, "cliqueId": 4, "state": 3, "healthMask": 0}
    for device in recording["devices"]:
        device["fabric"] = {**base, **fields}
    return recording


def test_completed_fabric_with_a_cluster_uuid_is_a_clique() -> None:
    topo = topology_from_recording(_with_fabric(load("nvswitch-8gpu")))
    clique = topo.domain_clique(topo.largest_domain)
    assert clique == FabricClique("01234567-89ab-cdef-0123-456789abcdef", 4)
    assert clique.label == "01234567-89ab-cdef-0123-456789abcdef.4"


@pytest.mark.parametrize(
    "fields",
    [{"clusterUuid": "0" * 32}, {"state": 2}, {"status": 3}, {"clusterUuid": "abc"}],
    ids=["zero-uuid", "in-progress", "status-error", "malformed-uuid"],
)
def test_fabric_answers_that_are_not_a_clique(fields: dict) -> None:
    topo = topology_from_recording(_with_fabric(load("nvswitch-8gpu"), **fields))
    assert topo.domain_clique(topo.largest_domain) is None


def test_gpus_disagreeing_on_the_clique_have_none() -> None:
    recording = _with_fabric(load("nvswitch-8gpu"))
    recording["devices"][5]["fabric"]["cliqueId"] = 9
    topo = topology_from_recording(recording)
    assert topo.domain_clique(topo.largest_domain) is None


def test_p2p_call_failure_falls_back_to_direct_link_wiring() -> None:
    recording = load("bridged-2x2")
    for pair in recording["pairs"]:
        pair["p2p"]["nvlink"] = {"nvmlError": 3, "message": "Not Supported"}
    topo = topology_from_recording(recording)
    assert list(topo.domains) == [(0, 1), (2, 3)]
    assert topo.pair(0, 1).evidence == "remote-pci" and topo.pair(0, 2).evidence == "none"


def test_p2p_call_failure_through_a_switch_cannot_prove_nvlink() -> None:
    # Links to an NVSwitch do not name the peer GPU, so without the P2P answer the pair is not NVLink.
    recording = load("h200x2-real")
    recording["pairs"][0]["p2p"]["nvlink"] = {"nvmlError": 999, "message": "Unknown Error"}
    topo = topology_from_recording(recording)
    assert topo.interconnect == "pcie" and topo.link_matrix()[0][1] == "PHB"
    assert topo.pair(0, 1).p2p["nvlink"] == "ERROR:999"


def test_p2p_refusal_wins_over_wired_links() -> None:
    recording = load("bridged-2x2")
    recording["pairs"][0]["p2p"]["nvlink"] = 4  # DISABLED_BY_REGKEY
    topo = topology_from_recording(recording)
    assert topo.pair(0, 1).nvlink is False and topo.pair(0, 1).direct_nvlinks == 12
    assert list(topo.domains) == [(2, 3), (0,), (1,)]
    assert topo.link_matrix()[0][1] == "NODE"


def test_single_gpu_node_is_one_domain_of_one() -> None:
    recording = load("h200x2-real")
    recording["deviceCount"] = 1
    recording["devices"] = recording["devices"][:1]
    recording["pairs"] = []
    topo = topology_from_recording(recording)
    assert topo.domains == ((0,),) and topo.interconnect == "pcie" and topo.link_matrix() == [["X"]]


def test_failed_name_and_memory_reads_become_none() -> None:
    recording = load("pcie-4gpu")
    recording["devices"][2]["name"] = {"nvmlError": 15, "message": "GPU is lost"}
    recording["devices"][2]["memoryTotalBytes"] = {"nvmlError": 15, "message": "GPU is lost"}
    gpu = topology_from_recording(recording).gpus[2]
    assert gpu.name is None and gpu.memory_mib is None


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda r: r.pop("devices"), r"recording\.devices: missing"),
        (lambda r: r.update(deviceCount=5), "5"),
        (lambda r: r["pairs"].pop(3), "no entry for GPUs"),
        (lambda r: r["devices"][1].update(index=7), r"devices\[1\]\.index: expected 1"),
        (lambda r: r["devices"][0].update(nvlinks="x"), r"devices\[0\]\.nvlinks: expected list"),
    ],
)
def test_malformed_recordings_name_the_field(mutate, message: str) -> None:
    recording = load("pcie-4gpu")
    mutate(recording)
    with pytest.raises(RecordingError, match=message):
        topology_from_recording(recording)


def test_ring_without_diagonals_has_four_overlapping_domains() -> None:
    assert maximal_cliques(4, [(0, 1), (1, 2), (2, 3), (3, 0)]) == [(0, 1), (0, 3), (1, 2), (2, 3)]


def test_cliques_sort_largest_first() -> None:
    assert maximal_cliques(5, [(3, 4), (0, 1), (1, 2), (0, 2)]) == [(0, 1, 2), (3, 4)]
    assert maximal_cliques(0, []) == []


def _brute_force_maximal_cliques(size: int, edges: set[frozenset[int]]) -> set[tuple[int, ...]]:
    def is_clique(vs: tuple[int, ...]) -> bool:
        return all(frozenset(p) in edges for p in itertools.combinations(vs, 2))

    cliques = [vs for r in range(1, size + 1) for vs in itertools.combinations(range(size), r) if is_clique(vs)]
    return {c for c in cliques if not any(set(c) < set(d) for d in cliques)}


@settings(max_examples=200, deadline=None)
@given(
    st.integers(min_value=1, max_value=7).flatmap(
        lambda n: st.tuples(st.just(n), st.sets(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1))))
    )
)
def test_maximal_cliques_match_brute_force(graph: tuple[int, set[tuple[int, int]]]) -> None:
    size, raw = graph
    edges = {frozenset(e) for e in raw if e[0] != e[1]}
    found = maximal_cliques(size, [tuple(e) for e in edges])
    assert len(found) == len(set(found))
    assert set(found) == _brute_force_maximal_cliques(size, edges)
    assert [len(c) for c in found] == sorted((len(c) for c in found), reverse=True)
    assert set().union(*map(set, found)) == set(range(size))  # every GPU is in some domain
