"""Derive a node's GPU topology from an NVML recording: pair matrix and NVLink domains.

Pure (standard library only). Input is a recording as written by ``nvml_reader`` (raw NVML
answers); output is a :class:`Topology`:

- per GPU pair, whether the two GPUs talk over NVLink. The test is vLLM's
  (``vllm/platforms/cuda.py:is_fully_connected``): ``nvmlDeviceGetP2PStatus(a, b, NVLINK)``
  is ``OK``. It works through NVSwitch, where every link's remote end is the switch. Only
  when that call itself failed does the probe fall back to counting active links whose
  remote PCI bus id is the other GPU (direct NVLink bridges). A P2P status other than OK
  is believed: NCCL cannot use a link that P2P refuses.
- the PCIe path of each pair (``nvmlDeviceGetTopologyCommonAncestor``: PIX, PXB, PHB, NODE,
  SYS); it says nothing about NVLink.
- NVLink domains: the maximal cliques of the graph whose edges are NVLink pairs, so every
  GPU in a domain reaches every other one over NVLink (what a TP group needs). A GPU with
  no NVLink peer is a domain of one. Domains are ordered largest first, then by lowest GPU
  indices, so domain 0 is the largest.
- interconnect: ``nvlink`` when one domain holds every GPU (and there are at least two),
  ``pcie`` when no pair has NVLink (a single-GPU node counts as ``pcie``), else ``mixed``.
- a multi-node NVLink clique (GB200 NVL72 and the like): taken from
  ``nvmlDeviceGetGpuFabricInfoV`` only when its state is COMPLETED, its status SUCCESS and its
  cluster UUID is not all zeros, and only when every GPU of a domain reports the same one.
  Single-node HGX boards with NVSwitch (the recorded H200 pair included) answer COMPLETED
  with a zero cluster UUID; taking that as a clique would put every such node in one domain.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# nvmlGpuTopologyLevel_t values and the names nvidia-smi topo -m prints for them.
TOPOLOGY_LEVEL_NAMES: dict[int, str] = {0: "INT", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}

# nvmlGpuP2PStatus_t values.
P2P_STATUS_NAMES: dict[int, str] = {
    0: "OK",
    1: "CHIPSET_NOT_SUPPORTED",
    2: "GPU_NOT_SUPPORTED",
    3: "IOH_TOPOLOGY_NOT_SUPPORTED",
    4: "DISABLED_BY_REGKEY",
    5: "NOT_SUPPORTED",
    6: "UNKNOWN",
}
P2P_STATUS_OK = 0

FABRIC_STATE_COMPLETED = 3
NVML_SUCCESS = 0
NVLINK_DEVICE_TYPE_SWITCH = 2

INTERCONNECT_NVLINK = "nvlink"
INTERCONNECT_PCIE = "pcie"
INTERCONNECT_MIXED = "mixed"


class RecordingError(ValueError):
    """A recording lacks a field the topology needs; the message names the field path."""


@dataclass(frozen=True)
class FabricClique:
    """A multi-node NVLink clique as NVML's fabric API reports it (GFD's gpu.clique value)."""

    cluster_uuid: str  # canonical 8-4-4-4-12 form
    clique_id: int

    @property
    def label(self) -> str:
        """``<ClusterUUID>.<CliqueID>``, the same string GFD puts in ``nvidia.com/gpu.clique``."""
        return f"{self.cluster_uuid}.{self.clique_id}"


@dataclass(frozen=True)
class Gpu:
    """One GPU as NVML sees it; fields are None where NVML answered an error."""

    index: int
    name: str | None
    uuid: str | None
    pci_bus_id: str | None
    memory_mib: int | None
    active_nvlinks: int
    switch_nvlinks: int
    clique: FabricClique | None


@dataclass(frozen=True)
class GpuPair:
    """How GPUs ``a < b`` are connected."""

    a: int
    b: int
    nvlink: bool
    evidence: str  # "p2p-status" | "remote-pci" | "none"
    direct_nvlinks: int  # links whose remote end is the other GPU (bridges); 0 through a switch
    pcie_level: str | None  # PIX/PXB/PHB/NODE/SYS, None when NVML gave no answer
    p2p: dict[str, str] = field(default_factory=dict)  # capability -> status name or "ERROR:<code>"


@dataclass(frozen=True)
class Topology:
    """A node's GPUs, their pairwise links and the NVLink domains derived from them."""

    gpus: tuple[Gpu, ...]
    pairs: tuple[GpuPair, ...]
    domains: tuple[tuple[int, ...], ...]
    interconnect: str

    @property
    def largest_domain(self) -> tuple[int, ...]:
        """The largest all-NVLink group (domain 0); empty when there are no GPUs."""
        return self.domains[0] if self.domains else ()

    def pair(self, a: int, b: int) -> GpuPair:
        """The pair record for GPUs ``a`` and ``b`` in either order."""
        lo, hi = min(a, b), max(a, b)
        for pair in self.pairs:
            if pair.a == lo and pair.b == hi:
                return pair
        raise KeyError((a, b))

    def domain_clique(self, domain: Iterable[int]) -> FabricClique | None:
        """The fabric clique every GPU of ``domain`` shares, or None."""
        cliques = {self.gpus[i].clique for i in domain}
        if len(cliques) == 1:
            return next(iter(cliques))
        return None

    def link_matrix(self) -> list[list[str]]:
        """nvidia-smi ``topo -m`` style cells: X, NV<links>, or the PCIe level."""
        size = len(self.gpus)
        cells = [["X"] * size for _ in range(size)]
        for pair in self.pairs:
            cell = self._cell(pair)
            cells[pair.a][pair.b] = cells[pair.b][pair.a] = cell
        return cells

    def pcie_matrix(self) -> list[list[str]]:
        """The PCIe common-ancestor level of every pair (``?`` where NVML gave no answer)."""
        size = len(self.gpus)
        cells = [["X"] * size for _ in range(size)]
        for pair in self.pairs:
            cells[pair.a][pair.b] = cells[pair.b][pair.a] = pair.pcie_level or "?"
        return cells

    def _cell(self, pair: GpuPair) -> str:
        if not pair.nvlink:
            return pair.pcie_level or "?"
        if pair.direct_nvlinks:
            return f"NV{pair.direct_nvlinks}"
        # Through a switch nvidia-smi shows the bonded set each GPU brings: the smaller one limits.
        links = min(self.gpus[pair.a].active_nvlinks, self.gpus[pair.b].active_nvlinks)
        return f"NV{links}" if links else "NV"


def _is_error(answer: Any) -> bool:
    return isinstance(answer, dict) and ("nvmlError" in answer or "absent" in answer)


def _value(answer: Any, kind: type | tuple[type, ...]) -> Any:
    return None if _is_error(answer) or not isinstance(answer, kind) else answer


def _bus_key(bus_id: Any) -> tuple[int, int, int, int] | None:
    """Parse ``DDDDDDDD:BB:DD.F`` (any domain width) so that formats compare equal."""
    if not isinstance(bus_id, str):
        return None
    try:
        domain, bus, rest = bus_id.strip().split(":")
        device, function = rest.split(".")
        return int(domain, 16), int(bus, 16), int(device, 16), int(function, 16)
    except ValueError:
        return None


def _canonical_uuid(hex_digits: str) -> str:
    h = hex_digits.lower()
    return f"{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _clique(fabric: Any) -> FabricClique | None:
    if not isinstance(fabric, dict) or _is_error(fabric):
        return None
    uuid_hex = fabric.get("clusterUuid")
    if fabric.get("state") != FABRIC_STATE_COMPLETED or fabric.get("status") != NVML_SUCCESS:
        return None
    if not isinstance(uuid_hex, str) or len(uuid_hex) != 32 or set(uuid_hex) <= {"0"}:
        return None
    return FabricClique(_canonical_uuid(uuid_hex), int(fabric.get("cliqueId", 0)))


def _require(mapping: Any, key: str, kind: type, where: str) -> Any:
    if not isinstance(mapping, dict) or key not in mapping:
        raise RecordingError(f"{where}.{key}: missing")
    value = mapping[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise RecordingError(f"{where}.{key}: expected {kind.__name__}, got {type(value).__name__}")
    return value


def _gpu(device: Any, index: int) -> tuple[Gpu, list[tuple[Any, tuple[int, int, int, int] | None]]]:
    where = f"recording.devices[{index}]"
    if _require(device, "index", int, where) != index:
        raise RecordingError(f"{where}.index: expected {index}")
    links = _require(device, "nvlinks", list, where)
    active = [link for link in links if isinstance(link, dict) and link.get("state") == 1]
    memory = _value(device.get("memoryTotalBytes"), int)
    gpu = Gpu(
        index=index,
        name=_value(device.get("name"), str),
        uuid=_value(device.get("uuid"), str),
        pci_bus_id=_value(device.get("pciBusId"), str),
        memory_mib=None if memory is None else memory // (1024 * 1024),
        active_nvlinks=len(active),
        switch_nvlinks=sum(1 for link in active if link.get("remoteDeviceType") == NVLINK_DEVICE_TYPE_SWITCH),
        clique=_clique(device.get("fabric")),
    )
    remote = [(link.get("link"), _bus_key(_value(link.get("remotePciBusId"), str))) for link in active]
    return gpu, remote


def _status_name(answer: Any) -> str:
    if isinstance(answer, dict) and "nvmlError" in answer:
        return f"ERROR:{answer['nvmlError']}"
    if isinstance(answer, int) and not isinstance(answer, bool):
        return P2P_STATUS_NAMES.get(answer, str(answer))
    return "MISSING"


def maximal_cliques(size: int, edges: Iterable[tuple[int, int]]) -> list[tuple[int, ...]]:
    """All maximal cliques of an undirected graph on vertices ``0..size-1`` (Bron-Kerbosch, pivoting).

    Isolated vertices come back as cliques of one. Sorted largest first, then by vertex indices.
    """
    neighbours: dict[int, set[int]] = {v: set() for v in range(size)}
    for a, b in edges:
        if a != b:
            neighbours[a].add(b)
            neighbours[b].add(a)
    found: list[tuple[int, ...]] = []

    def expand(chosen: set[int], candidates: set[int], excluded: set[int]) -> None:
        if not candidates and not excluded:
            found.append(tuple(sorted(chosen)))
            return
        pivot = max(candidates | excluded, key=lambda v: len(neighbours[v] & candidates))
        for v in sorted(candidates - neighbours[pivot]):
            expand(chosen | {v}, candidates & neighbours[v], excluded & neighbours[v])
            candidates = candidates - {v}
            excluded = excluded | {v}

    if size:
        expand(set(), set(range(size)), set())
    return sorted(found, key=lambda clique: (-len(clique), clique))


def topology_from_recording(recording: dict[str, Any]) -> Topology:
    """Build the :class:`Topology` of a recording; raises :class:`RecordingError` on missing fields."""
    count = _require(recording, "deviceCount", int, "recording")
    devices = _require(recording, "devices", list, "recording")
    if len(devices) != count:
        raise RecordingError(f"recording.devices: {len(devices)} entries but deviceCount is {count}")
    parsed = [_gpu(device, i) for i, device in enumerate(devices)]
    gpus = tuple(gpu for gpu, _ in parsed)
    remotes = [remote for _, remote in parsed]
    bus_keys = [_bus_key(gpu.pci_bus_id) for gpu in gpus]

    by_pair: dict[tuple[int, int], dict[str, Any]] = {}
    for k, entry in enumerate(_require(recording, "pairs", list, "recording")):
        a = _require(entry, "a", int, f"recording.pairs[{k}]")
        b = _require(entry, "b", int, f"recording.pairs[{k}]")
        by_pair[(min(a, b), max(a, b))] = entry

    pairs: list[GpuPair] = []
    for a in range(count):
        for b in range(a + 1, count):
            entry = by_pair.get((a, b))
            if entry is None:
                raise RecordingError(f"recording.pairs: no entry for GPUs {a} and {b}")
            p2p: dict[str, Any] = entry["p2p"] if isinstance(entry.get("p2p"), dict) else {}
            direct = max(
                sum(1 for _, key in remotes[a] if key is not None and key == bus_keys[b]),
                sum(1 for _, key in remotes[b] if key is not None and key == bus_keys[a]),
            )
            nvlink_answer = p2p.get("nvlink")
            if isinstance(nvlink_answer, int) and not isinstance(nvlink_answer, bool):
                nvlink, evidence = nvlink_answer == P2P_STATUS_OK, "p2p-status"
            else:
                # NVML could not answer the P2P question: fall back to direct link wiring.
                nvlink, evidence = direct > 0, "remote-pci"
            level = _value(entry.get("commonAncestor"), int)
            pairs.append(
                GpuPair(
                    a=a,
                    b=b,
                    nvlink=nvlink,
                    evidence=evidence if nvlink else "none",
                    direct_nvlinks=direct,
                    pcie_level=None if level is None else TOPOLOGY_LEVEL_NAMES.get(level, str(level)),
                    p2p={cap: _status_name(answer) for cap, answer in p2p.items()},
                )
            )

    nvlink_edges = [(p.a, p.b) for p in pairs if p.nvlink]
    domains = tuple(maximal_cliques(count, nvlink_edges))
    if count >= 2 and len(domains[0]) == count:
        interconnect = INTERCONNECT_NVLINK
    elif not nvlink_edges:
        interconnect = INTERCONNECT_PCIE
    else:
        interconnect = INTERCONNECT_MIXED
    return Topology(gpus=gpus, pairs=tuple(pairs), domains=domains, interconnect=interconnect)
