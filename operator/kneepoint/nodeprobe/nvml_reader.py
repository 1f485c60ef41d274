"""Read NVML's raw answers about a node's GPUs into a plain dict: a *recording*.

This is the only kneepoint module that imports ``pynvml`` (from nvidia-ml-py), and it does
so inside :func:`read_nvml`, so that importing this module needs nothing but the standard
library (the sandbox, the tests and a machine without a driver can load recordings).
Everything downstream (``topology``, ``node_labels``) works on recordings, so a topology
read on a real node can be saved with ``kneepoint probe --record PATH`` and replayed with
``--from-recording PATH`` or through the fake ``pynvml`` in the unit tests.

Recording format (``kind: kneepoint.io/nvml-recording``, ``version: 1``). Every NVML answer
is stored either as its plain JSON value or, when the call raised, as
``{"nvmlError": <NVML return code>, "message": "<str(error)>"}``:

- ``deviceCount``; ``maxNvLinks`` (the ``NVML_NVLINK_MAX_LINKS`` the reader looped over);
- ``system``: ``driverVersion``, ``nvmlVersion``;
- ``library``: the nvidia-ml-py version and ``p2pCapsIndexReadConstant`` (``repr`` of the
  module's ``NVML_P2P_CAPS_INDEX_READ``: some releases define it as the tuple ``(0,)``);
- ``devices[i]``: ``index``, ``name``, ``uuid``, ``pciBusId``, ``memoryTotalBytes``;
  ``nvlinks``: one entry per link ``0..maxNvLinks-1`` with ``state`` and, for an active
  link, ``version``, ``remoteDeviceType`` (GPU 0, IBMNPU 1, SWITCH 2) and ``remotePciBusId``;
  ``fabric``: the ``nvmlDeviceGetGpuFabricInfoV`` struct (``clusterUuid`` as 32 hex digits,
  ``status``, ``cliqueId``, ``state``, ``healthMask``), an error, or ``{"absent": "..."}``
  when the installed nvidia-ml-py has no binding for it;
- ``pairs``: one entry per GPU pair ``a < b`` (the same direction vLLM checks) with
  ``commonAncestor`` (NVML topology level) and ``p2p`` (status per capability index
  ``read``, ``write``, ``nvlink``, ``atomics``, ``pci``).

Run on a GPU node without the rest of kneepoint installed:
``PYTHONPATH=operator python3 -m kneepoint.nodeprobe.nvml_reader --out recording.json``.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.metadata
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kneepoint.core.timestamps import now_rfc3339

RECORDING_KIND = "kneepoint.io/nvml-recording"
RECORDING_VERSION = 1

# NVML's P2P capability indices, as integers. nvidia-ml-py 13.x defines
# NVML_P2P_CAPS_INDEX_READ as ``0,`` (a tuple, by a trailing comma), which ctypes rejects,
# so the reader never passes the module's constants.
P2P_CAPS_INDEX: dict[str, int] = {"read": 0, "write": 1, "nvlink": 2, "atomics": 3, "pci": 4}

# Used when the module lacks NVML_NVLINK_MAX_LINKS (it is 36 in every current release).
_DEFAULT_MAX_NVLINKS = 36


class NvmlUnavailable(Exception):
    """NVML cannot be used here: no nvidia-ml-py, no driver library, or nvmlInit failed."""


def is_nvml_error(answer: Any) -> bool:
    """True when a recorded answer is an NVML error rather than a value."""
    return isinstance(answer, dict) and "nvmlError" in answer


def _text(value: Any) -> Any:
    # ctypes char arrays come back as bytes in some nvidia-ml-py releases and str in others.
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value


def _answer(nvml: Any, call: Callable[..., Any], *args: Any) -> Any:
    """Call NVML and return its answer, or the error as a recordable dict."""
    try:
        return call(*args)
    except nvml.NVMLError as err:
        return {"nvmlError": int(getattr(err, "value", -1)), "message": str(err)}


def _read_links(nvml: Any, handle: Any, max_links: int) -> list[dict[str, Any]]:
    links: list[dict[str, Any]] = []
    for link in range(max_links):
        # Links past the GPU's own count answer NotSupported or InvalidArgument: recorded, not fatal.
        entry: dict[str, Any] = {"link": link, "state": _answer(nvml, nvml.nvmlDeviceGetNvLinkState, handle, link)}
        if entry["state"] == 1:
            entry["version"] = _answer(nvml, nvml.nvmlDeviceGetNvLinkVersion, handle, link)
            entry["remoteDeviceType"] = _answer(nvml, nvml.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
            remote = _answer(nvml, nvml.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
            entry["remotePciBusId"] = remote if is_nvml_error(remote) else _text(remote.busId)
        links.append(entry)
    return links


def _read_fabric(nvml: Any, handle: Any) -> dict[str, Any]:
    struct_type = getattr(nvml, "c_nvmlGpuFabricInfoV_t", None)
    getter = getattr(nvml, "nvmlDeviceGetGpuFabricInfoV", None)
    if struct_type is None or getter is None:
        return {"absent": "nvidia-ml-py has no nvmlDeviceGetGpuFabricInfoV/c_nvmlGpuFabricInfoV_t"}
    info = struct_type()
    answer = _answer(nvml, getter, handle, ctypes.byref(info))
    if is_nvml_error(answer):
        return answer
    return {
        "clusterUuid": bytes(info.clusterUuid).hex(),
        "status": int(info.status),
        "cliqueId": int(info.cliqueId),
        "state": int(info.state),
        "healthMask": int(getattr(info, "healthMask", 0)),
    }


def _read_device(nvml: Any, index: int, handle: Any, max_links: int) -> dict[str, Any]:
    pci = _answer(nvml, nvml.nvmlDeviceGetPciInfo, handle)
    memory = _answer(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
    return {
        "index": index,
        "name": _text(_answer(nvml, nvml.nvmlDeviceGetName, handle)),
        "uuid": _text(_answer(nvml, nvml.nvmlDeviceGetUUID, handle)),
        "pciBusId": pci if is_nvml_error(pci) else _text(pci.busId),
        "memoryTotalBytes": memory if is_nvml_error(memory) else int(memory.total),
        "nvlinks": _read_links(nvml, handle, max_links),
        "fabric": _read_fabric(nvml, handle),
    }


def _read_pair(nvml: Any, a: int, b: int, handles: list[Any]) -> dict[str, Any]:
    ha, hb = handles[a], handles[b]
    return {
        "a": a,
        "b": b,
        "commonAncestor": _answer(nvml, nvml.nvmlDeviceGetTopologyCommonAncestor, ha, hb),
        "p2p": {cap: _answer(nvml, nvml.nvmlDeviceGetP2PStatus, ha, hb, idx) for cap, idx in P2P_CAPS_INDEX.items()},
    }


def _library_version() -> str | None:
    try:
        return importlib.metadata.version("nvidia-ml-py")
    except importlib.metadata.PackageNotFoundError:
        return None


def _import_pynvml() -> Any:
    try:
        import pynvml  # imported here so that loading recordings needs no NVML
    except ImportError as err:
        raise NvmlUnavailable(f"the pynvml module (package nvidia-ml-py) is not installed: {err}") from err
    return pynvml


def read_nvml(nvml: Any | None = None) -> dict[str, Any]:
    """Read every NVML answer the probe uses into a recording (see the module docstring).

    ``nvml`` is the ``pynvml`` module (imported when omitted). Raises :class:`NvmlUnavailable`
    when the module is missing, nvmlInit fails, or the device count cannot be read.
    A recording with ``deviceCount`` 0 is returned as such: the caller decides what no GPUs means.
    """
    if nvml is None:
        nvml = _import_pynvml()
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        raise NvmlUnavailable(f"nvmlInit failed: {err}") from err
    try:
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError as err:
            raise NvmlUnavailable(f"nvmlDeviceGetCount failed: {err}") from err
        max_links = int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", _DEFAULT_MAX_NVLINKS))
        handles = []
        for i in range(count):
            try:
                handles.append(nvml.nvmlDeviceGetHandleByIndex(i))
            except nvml.NVMLError as err:
                raise NvmlUnavailable(f"nvmlDeviceGetHandleByIndex({i}) failed: {err}") from err
        return {
            "kind": RECORDING_KIND,
            "version": RECORDING_VERSION,
            "source": "nvml",
            "recordedAt": now_rfc3339(),
            "library": {
                "nvidiaMlPy": _library_version(),
                "p2pCapsIndexReadConstant": repr(getattr(nvml, "NVML_P2P_CAPS_INDEX_READ", None)),
            },
            "system": {
                "driverVersion": _text(_answer(nvml, nvml.nvmlSystemGetDriverVersion)),
                "nvmlVersion": _text(_answer(nvml, nvml.nvmlSystemGetNVMLVersion)),
            },
            "deviceCount": count,
            "maxNvLinks": max_links,
            "devices": [_read_device(nvml, i, h, max_links) for i, h in enumerate(handles)],
            "pairs": [_read_pair(nvml, a, b, handles) for a in range(count) for b in range(a + 1, count)],
        }
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass  # shutting down is best effort; the answers are already read


def write_recording(recording: dict[str, Any], path: str | Path) -> None:
    """Write a recording as indented JSON (UTF-8), creating parent folders."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(recording, indent=1, sort_keys=False) + "\n", encoding="utf-8")


def load_recording(path: str | Path) -> dict[str, Any]:
    """Load a recording written by :func:`write_recording` (or by hand: see tests/data/nvml/).

    Raises ``ValueError`` with one line naming the file when it is not such a recording.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path}: cannot read an NVML recording: {err}") from err
    if not isinstance(data, dict) or data.get("kind") != RECORDING_KIND:
        raise ValueError(f"{path}: not an NVML recording (expected kind {RECORDING_KIND!r})")
    if data.get("version") != RECORDING_VERSION:
        raise ValueError(f"{path}: recording version {data.get('version')!r} is not supported (expected {RECORDING_VERSION})")
    return data


def main(argv: list[str] | None = None) -> int:
    """``python -m kneepoint.nodeprobe.nvml_reader --out PATH``: record this machine's NVML answers."""
    parser = argparse.ArgumentParser(prog="python -m kneepoint.nodeprobe.nvml_reader", description=main.__doc__)
    parser.add_argument("--out", required=True, help="where to write the recording (JSON)")
    args = parser.parse_args(argv)
    try:
        recording = read_nvml()
    except NvmlUnavailable as err:
        print(f"nvml_reader: no NVML: {err}", file=sys.stderr)
        return 1
    write_recording(recording, args.out)
    print(f"nvml_reader: recorded {recording['deviceCount']} GPU(s) to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
