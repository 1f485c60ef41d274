"""nvml_reader against a fake pynvml that replays recorded NVML answers (and, where no driver is
installed, against the real pynvml's failure)."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import sys

import pytest
from nodeprobe_fake_pynvml import make_fake_pynvml
from nodeprobe_recordings import FIXTURES, answers, load

from kneepoint.nodeprobe import nvml_reader
from kneepoint.nodeprobe.topology import topology_from_recording


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_replaying_a_recording_through_the_reader_reproduces_it(name: str) -> None:
    recording = load(name)
    fake = make_fake_pynvml(recording)
    read = nvml_reader.read_nvml(fake)
    assert answers(read) == answers(recording)
    assert read["kind"] == nvml_reader.RECORDING_KIND and read["source"] == "nvml"
    assert fake.calls[0][0] == "nvmlInit" and fake.calls[-1][0] == "nvmlShutdown"


def test_reader_imports_pynvml_from_sys_modules_when_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    recording = load("h200x2-real")
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml(recording))
    assert answers(nvml_reader.read_nvml()) == answers(recording)


def test_p2p_read_index_quirk_is_handled_with_integer_indices() -> None:
    recording = load("h200x2-real")
    probe = make_fake_pynvml(recording, tuple_read_index=True)
    # The module's own constant is unusable: ctypes rejects the tuple.
    assert probe.NVML_P2P_CAPS_INDEX_READ == (0,)
    probe.nvmlInit()
    first, second = probe.nvmlDeviceGetHandleByIndex(0), probe.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(ctypes.ArgumentError):
        probe.nvmlDeviceGetP2PStatus(first, second, probe.NVML_P2P_CAPS_INDEX_READ)

    fake = make_fake_pynvml(recording, tuple_read_index=True)
    read = nvml_reader.read_nvml(fake)
    assert read["pairs"][0]["p2p"]["read"] == 0
    assert read["library"]["p2pCapsIndexReadConstant"] == "(0,)"
    indices = [args[2] for name, args in fake.calls if name == "nvmlDeviceGetP2PStatus"]
    assert indices == [0, 1, 2, 3, 4]


def test_real_device_had_the_quirky_nvidia_ml_py() -> None:
    # The device's nvidia-ml-py 13.610.43 defines the read index as a tuple; the reader still read it.
    recording = load("h200x2-real")
    assert recording["library"] == {"nvidiaMlPy": "13.610.43", "p2pCapsIndexReadConstant": "(0,)"}
    assert recording["pairs"][0]["p2p"]["read"] == 0


def test_links_past_the_gpu_count_and_not_supported_links_are_recorded_not_fatal() -> None:
    real = nvml_reader.read_nvml(make_fake_pynvml(load("h200x2-real")))
    states = [link["state"] for link in real["devices"][0]["nvlinks"]]
    assert states[:18] == [1] * 18
    assert all(nvml_reader.is_nvml_error(s) and s["nvmlError"] == 2 for s in states[18:])
    pcie = nvml_reader.read_nvml(make_fake_pynvml(load("pcie-4gpu")))
    assert all(link["state"]["nvmlError"] == 3 for link in pcie["devices"][0]["nvlinks"])
    assert topology_from_recording(pcie).gpus[0].active_nvlinks == 0


def test_fabric_api_missing_from_the_bindings_is_recorded_as_absent() -> None:
    recording = load("nvswitch-8gpu")
    for device in recording["devices"]:
        device["fabric"] = {"absent": "test"}
    fake = make_fake_pynvml(recording)
    assert not hasattr(fake, "nvmlDeviceGetGpuFabricInfoV")
    read = nvml_reader.read_nvml(fake)
    assert all("absent" in d["fabric"] for d in read["devices"])
    assert topology_from_recording(read).domain_clique(range(8)) is None


def test_fabric_function_missing_from_the_driver_is_recorded_as_an_error() -> None:
    recording = load("nvswitch-8gpu")
    for device in recording["devices"]:
        device["fabric"] = {"nvmlError": 13, "message": "Function Not Found"}
    read = nvml_reader.read_nvml(make_fake_pynvml(recording))
    assert read["devices"][0]["fabric"] == {"nvmlError": 13, "message": "Function Not Found"}


def test_fabric_struct_is_filled_through_byref() -> None:
    recording = load("nvswitch-8gpu")
    recording["devices"][3]["fabric"] = {
        "clusterUuid": "0123456789abcdef0123456789abcdef",
        "status": 0,
        "cliqueId": 7,
        "state": 3,
        "healthMask": 5,
    }
    read = nvml_reader.read_nvml(make_fake_pynvml(recording))
    assert read["devices"][3]["fabric"] == recording["devices"][3]["fabric"]


@pytest.mark.parametrize("code", [9, 12])
def test_nvml_init_failure_raises_nvml_unavailable(code: int) -> None:
    with pytest.raises(nvml_reader.NvmlUnavailable, match="nvmlInit failed"):
        nvml_reader.read_nvml(make_fake_pynvml(load("pcie-4gpu"), init_error=code))


def test_device_count_failure_raises_and_shuts_nvml_down() -> None:
    fake = make_fake_pynvml(load("pcie-4gpu"), count_error=15)
    with pytest.raises(nvml_reader.NvmlUnavailable, match="nvmlDeviceGetCount failed: GPU is lost"):
        nvml_reader.read_nvml(fake)
    assert fake.calls[-1][0] == "nvmlShutdown"


def test_zero_devices_is_a_recording_with_no_devices() -> None:
    empty = {"deviceCount": 0, "maxNvLinks": 36, "devices": [], "pairs": [], "system": {"driverVersion": "x", "nvmlVersion": "y"}}
    read = nvml_reader.read_nvml(make_fake_pynvml(empty))
    assert read["deviceCount"] == 0 and read["devices"] == [] and read["pairs"] == []


def test_missing_pynvml_module_raises_nvml_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with pytest.raises(nvml_reader.NvmlUnavailable, match="nvidia-ml-py"):
        nvml_reader.read_nvml()


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="a driver is installed here")
def test_real_pynvml_without_a_driver_raises_nvml_unavailable() -> None:
    with pytest.raises(nvml_reader.NvmlUnavailable, match="NVML Shared Library Not Found"):
        nvml_reader.read_nvml()


def test_write_and_load_round_trip(tmp_path) -> None:
    recording = load("bridged-2x2")
    path = tmp_path / "sub" / "rec.json"
    nvml_reader.write_recording(recording, path)
    assert nvml_reader.load_recording(path) == recording


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "cannot read an NVML recording"),
        (json.dumps({"kind": "other"}), "not an NVML recording"),
        (json.dumps({"kind": nvml_reader.RECORDING_KIND, "version": 99}), "version 99 is not supported"),
    ],
)
def test_load_recording_rejects_other_files_with_one_line(tmp_path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as info:
        nvml_reader.load_recording(path)
    assert "\n" not in str(info.value)


def test_reader_main_writes_the_recording(tmp_path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml(load("h200x2-real")))
    out = tmp_path / "r.json"
    assert nvml_reader.main(["--out", str(out)]) == 0
    assert answers(nvml_reader.load_recording(out)) == answers(load("h200x2-real"))
    assert "recorded 2 GPU(s)" in capsys.readouterr().out


def test_synthetic_fixtures_are_what_their_builder_writes() -> None:
    import importlib.util

    from nodeprobe_recordings import DATA

    spec = importlib.util.spec_from_file_location("build_synthetic", DATA / "build_synthetic.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for file_name, build in module.FIXTURES.items():
        on_disk = json.loads((DATA / file_name).read_text())
        assert on_disk == build() and on_disk["source"] == "synthetic" and "SYNTHETIC" in on_disk["note"]
