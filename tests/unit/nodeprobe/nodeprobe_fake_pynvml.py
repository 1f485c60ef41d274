"""A fake ``pynvml`` module that replays an NVML recording, for tests at the reader's boundary.

It answers the calls ``kneepoint.nodeprobe.nvml_reader`` makes with the recorded values and
raises ``NVMLError(code)`` where the recording holds ``{"nvmlError": code}``, the way the
real module does. It keeps the real module's sharp edges that the reader must survive:

- ``NVML_P2P_CAPS_INDEX_READ`` is the tuple ``(0,)`` (nvidia-ml-py 13.x), and
  ``nvmlDeviceGetP2PStatus`` raises ``ctypes.ArgumentError`` for a non-integer index, as
  ctypes does when the tuple reaches the C call;
- the fabric API takes ``ctypes.byref`` of a real ``ctypes.Structure`` and fills it in;
- a device whose recorded fabric answer is ``{"absent": ...}`` means the bindings lack
  ``nvmlDeviceGetGpuFabricInfoV``, so the module has no such attribute;
- every call before ``nvmlInit`` or after ``nvmlShutdown`` raises Uninitialized.
"""

from __future__ import annotations

import ctypes
import types
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    9: "Driver Not Loaded",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_FUNCTION_NOT_FOUND: "Function Not Found",
    15: "GPU is lost",
}


class _FabricInfoV(ctypes.Structure):
    # Layout of nvidia-ml-py's c_nvmlGpuFabricInfo_v2_t.
    _fields_ = [
        ("version", ctypes.c_uint),
        ("clusterUuid", ctypes.c_uint8 * 16),
        ("status", ctypes.c_int),
        ("cliqueId", ctypes.c_uint32),
        ("state", ctypes.c_uint),
        ("healthMask", ctypes.c_uint32),
    ]


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


def make_fake_pynvml(
    recording: dict[str, Any],
    *,
    init_error: int | None = None,
    count_error: int | None = None,
    tuple_read_index: bool = True,
) -> types.ModuleType:
    """A module object standing in for ``pynvml`` that replays ``recording``.

    ``init_error``/``count_error`` make nvmlInit/nvmlDeviceGetCount raise that NVML code.
    The module records the calls it received in ``calls`` (name, args) for assertions.
    """
    m = types.ModuleType("pynvml")
    m.calls = []  # type: ignore[attr-defined]
    state = {"init": False}
    devices = recording.get("devices", [])
    pairs = {(p["a"], p["b"]): p for p in recording.get("pairs", [])}

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(value)
            self.value = value

        def __str__(self) -> str:
            return _MESSAGES.get(self.value, f"Unknown Error {self.value}")

    m.NVMLError = NVMLError  # type: ignore[attr-defined]
    m.NVML_SUCCESS = NVML_SUCCESS  # type: ignore[attr-defined]
    m.NVML_NVLINK_MAX_LINKS = recording.get("maxNvLinks", 36)  # type: ignore[attr-defined]
    m.NVML_P2P_CAPS_INDEX_READ = (0,) if tuple_read_index else 0  # type: ignore[attr-defined]
    m.NVML_P2P_CAPS_INDEX_WRITE = 1  # type: ignore[attr-defined]
    m.NVML_P2P_CAPS_INDEX_NVLINK = 2  # type: ignore[attr-defined]
    m.NVML_P2P_CAPS_INDEX_ATOMICS = 3  # type: ignore[attr-defined]
    m.NVML_P2P_CAPS_INDEX_PCI = 4  # type: ignore[attr-defined]

    def replay(answer: Any) -> Any:
        if isinstance(answer, dict) and "nvmlError" in answer:
            raise NVMLError(answer["nvmlError"])
        return answer

    def api(fn):  # test helper decorator
        def wrapper(*args: Any) -> Any:
            m.calls.append((fn.__name__, args))
            if fn.__name__ != "nvmlInit" and not state["init"]:
                raise NVMLError(NVML_ERROR_UNINITIALIZED)
            return fn(*args)

        wrapper.__name__ = fn.__name__
        setattr(m, fn.__name__, wrapper)
        return wrapper

    def device(handle: _Handle) -> dict[str, Any]:
        if not isinstance(handle, _Handle) or not 0 <= handle.index < len(devices):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return devices[handle.index]

    def link_entry(handle: _Handle, link: int) -> dict[str, Any]:
        if not isinstance(link, int):
            raise ctypes.ArgumentError("argument 2: TypeError: wrong type")
        links = device(handle)["nvlinks"]
        if not 0 <= link < len(links):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return links[link]

    @api
    def nvmlInit() -> None:
        if init_error is not None:
            raise NVMLError(init_error)
        state["init"] = True

    @api
    def nvmlShutdown() -> None:
        state["init"] = False

    @api
    def nvmlDeviceGetCount() -> int:
        if count_error is not None:
            raise NVMLError(count_error)
        return recording["deviceCount"]

    @api
    def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
        if not 0 <= index < recording["deviceCount"]:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    @api
    def nvmlSystemGetDriverVersion() -> str:
        return replay(recording["system"]["driverVersion"])

    @api
    def nvmlSystemGetNVMLVersion() -> str:
        return replay(recording["system"]["nvmlVersion"])

    @api
    def nvmlDeviceGetName(handle: _Handle) -> str:
        return replay(device(handle)["name"])

    @api
    def nvmlDeviceGetUUID(handle: _Handle) -> str:
        return replay(device(handle)["uuid"])

    @api
    def nvmlDeviceGetPciInfo(handle: _Handle) -> types.SimpleNamespace:
        # nvidia-ml-py decodes char arrays to str on attribute access.
        return types.SimpleNamespace(busId=replay(device(handle)["pciBusId"]))

    @api
    def nvmlDeviceGetMemoryInfo(handle: _Handle) -> types.SimpleNamespace:
        total = replay(device(handle)["memoryTotalBytes"])
        return types.SimpleNamespace(total=total, free=total, used=0)

    @api
    def nvmlDeviceGetNvLinkState(handle: _Handle, link: int) -> int:
        return replay(link_entry(handle, link)["state"])

    @api
    def nvmlDeviceGetNvLinkVersion(handle: _Handle, link: int) -> int:
        return replay(link_entry(handle, link).get("version", {"nvmlError": NVML_ERROR_INVALID_ARGUMENT}))

    @api
    def nvmlDeviceGetNvLinkRemoteDeviceType(handle: _Handle, link: int) -> int:
        return replay(link_entry(handle, link).get("remoteDeviceType", {"nvmlError": NVML_ERROR_INVALID_ARGUMENT}))

    @api
    def nvmlDeviceGetNvLinkRemotePciInfo(handle: _Handle, link: int) -> types.SimpleNamespace:
        bus = replay(link_entry(handle, link).get("remotePciBusId", {"nvmlError": NVML_ERROR_INVALID_ARGUMENT}))
        return types.SimpleNamespace(busId=bus)

    @api
    def nvmlDeviceGetTopologyCommonAncestor(first: _Handle, second: _Handle) -> int:
        return replay(pair(first, second)["commonAncestor"])

    @api
    def nvmlDeviceGetP2PStatus(first: _Handle, second: _Handle, index: Any) -> int:
        if not isinstance(index, int):
            # What ctypes raises when NVML_P2P_CAPS_INDEX_READ == (0,) is passed through.
            raise ctypes.ArgumentError("argument 3: TypeError: Don't know how to convert parameter 3")
        names = {0: "read", 1: "write", 2: "nvlink", 3: "atomics", 4: "pci"}
        if index not in names:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return replay(pair(first, second)["p2p"][names[index]])

    def pair(first: _Handle, second: _Handle) -> dict[str, Any]:
        device(first), device(second)
        key = (min(first.index, second.index), max(first.index, second.index))
        if key[0] == key[1] or key not in pairs:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return pairs[key]

    if all("absent" not in d.get("fabric", {}) for d in devices):
        m.c_nvmlGpuFabricInfoV_t = _FabricInfoV  # type: ignore[attr-defined]

        @api
        def nvmlDeviceGetGpuFabricInfoV(handle: _Handle, info_ref: Any) -> int:
            fabric = replay(device(handle)["fabric"])
            info = info_ref._obj  # ctypes.byref keeps the structure it points at
            if not isinstance(info, _FabricInfoV):
                raise ctypes.ArgumentError("argument 2: expected a pointer to c_nvmlGpuFabricInfoV_t")
            info.clusterUuid = (ctypes.c_uint8 * 16)(*bytes.fromhex(fabric["clusterUuid"]))
            info.status = fabric["status"]
            info.cliqueId = fabric["cliqueId"]
            info.state = fabric["state"]
            info.healthMask = fabric["healthMask"]
            return NVML_SUCCESS

    return m
