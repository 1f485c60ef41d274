"""``kneepoint probe``: flags, exit codes, one-line failures, recording/replay and the labelling loop."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest
from click.testing import CliRunner
from nodeprobe_fake_core_api import FakeCoreV1Api
from nodeprobe_fake_pynvml import make_fake_pynvml
from nodeprobe_recordings import EXPECTED_LABELS, FIXTURES, NODE, answers, load

from kneepoint.cli import cli
from kneepoint.nodeprobe import nvml_reader
from kneepoint.nodeprobe.command import ProbeOptions, run_probe
from kneepoint.nodeprobe.node_writer import NodeWriter


def invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(cli, ["probe", *args], env=env or {}, catch_exceptions=False)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_dry_run_from_recording_prints_the_labels(name: str) -> None:
    result = invoke("--dry-run", "--node-name", NODE, "--from-recording", str(FIXTURES[name]))
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["node"] == NODE and document["labels"] == EXPECTED_LABELS[name]
    assert json.loads(document["annotations"]["kneepoint.io/gpu-topology"])["v"] == 1


def test_node_name_comes_from_the_environment() -> None:
    result = invoke("--dry-run", "--from-recording", str(FIXTURES["pcie-4gpu"]), env={"NODE_NAME": "from-env"})
    assert json.loads(result.stdout)["labels"]["kneepoint.io/nvlink-domain"] == "from-env-nvl0"


def test_record_writes_nvml_answers(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml(load("bridged-2x2")))
    out = tmp_path / "rec.json"
    result = invoke("--dry-run", "--node-name", NODE, "--record", str(out))
    assert result.exit_code == 0
    assert answers(nvml_reader.load_recording(out)) == answers(load("bridged-2x2"))
    assert json.loads(result.stdout)["labels"] == EXPECTED_LABELS["bridged-2x2"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--record", "a.json", "--from-recording", "b.json", "--dry-run"], "--record and --from-recording exclude each other"),
        (["--from-recording", "x.json"], "--node-name (or env NODE_NAME) is required"),
        (["--node-name", "Bad_Name", "--dry-run"], "--node-name: 'Bad_Name' is not a Kubernetes node name"),
        (["--dry-run", "--node-name", NODE, "--from-recording", "/nonexistent.json"], "--from-recording: /nonexistent.json: cannot read"),
    ],
)
def test_bad_input_exits_2_with_one_line(args: list[str], message: str) -> None:
    result = invoke(*args)
    assert result.exit_code == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_incomplete_recording_exits_2(tmp_path) -> None:
    recording = load("pcie-4gpu")
    recording["pairs"] = []
    path = tmp_path / "r.json"
    nvml_reader.write_recording(recording, path)
    result = invoke("--dry-run", "--node-name", NODE, "--from-recording", str(path))
    assert result.exit_code == 2 and "recording is incomplete: recording.pairs: no entry for GPUs 0 and 1" in result.stderr


def test_without_nvml_one_line_exit_1_and_nothing_labelled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml(load("pcie-4gpu"), init_error=12))
    api = FakeCoreV1Api()
    lines: list[tuple[str, bool]] = []
    code = run_probe(ProbeOptions(NODE, False, None, None, 0), writer=NodeWriter(api), echo=lambda m, err=False: lines.append((m, err)))
    assert code == 1 and api.patches == []
    assert lines == [("kneepoint probe: no NVML on this node (nvmlInit failed: NVML Shared Library Not Found); nothing labelled", True)]


def test_without_gpus_one_line_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    empty = {"deviceCount": 0, "maxNvLinks": 36, "devices": [], "pairs": [], "system": {"driverVersion": "x", "nvmlVersion": "y"}}
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml(empty))
    result = invoke("--dry-run", "--node-name", NODE)
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr == "kneepoint probe: NVML reports no GPUs on this node; nothing labelled\n"


def test_labelling_once_patches_the_node_and_reports_what_changed() -> None:
    api = FakeCoreV1Api()
    lines: list[str] = []
    options = ProbeOptions(NODE, False, None, str(FIXTURES["h200x2-real"]), 0)
    assert run_probe(options, writer=NodeWriter(api), echo=lambda m, err=False: lines.append(m)) == 0
    assert api.node.metadata.labels == EXPECTED_LABELS["h200x2-real"]
    assert lines[0].startswith(f"kneepoint probe: node {NODE} updated: kneepoint.io/gpu-count=2")
    assert run_probe(options, writer=NodeWriter(api), echo=lambda m, err=False: lines.append(m)) == 0
    assert lines[1] == f"kneepoint probe: node {NODE} already carries these labels" and len(api.patches) == 1


def test_the_loop_follows_topology_changes_and_survives_a_failed_round() -> None:
    api = FakeCoreV1Api()
    sequence = [load("nvswitch-8gpu"), load("nvswitch-8gpu"), None, load("bridged-2x2")]
    sleeps: list[float] = []
    lines: list[tuple[str, bool]] = []

    def read() -> dict[str, Any]:
        recording = sequence.pop(0)
        if recording is None:
            raise nvml_reader.NvmlUnavailable("nvmlInit failed: GPU is lost")
        return recording

    code = run_probe(
        ProbeOptions(NODE, False, None, None, 30),
        writer=NodeWriter(api),
        read=read,
        sleep=sleeps.append,
        rounds=4,
        echo=lambda m, err=False: lines.append((m, err)),
    )
    assert code == 0 and sleeps == [30, 30, 30]
    assert len(api.patches) == 2  # first labelling, then the change; the repeat sent nothing
    assert api.node.metadata.labels == EXPECTED_LABELS["bridged-2x2"]
    assert [err for _, err in lines] == [False, False, True, False]
    assert "nothing labelled" in lines[2][0]
