"""``kneepoint probe``: read NVML, derive NVLink domains, label this node.

Runs once (``--interval 0``, the default) or as the DaemonSet's loop, re-reading NVML every
``--interval`` seconds and patching the node only when something changed. ``--dry-run``
prints the labels and annotation as JSON and touches no cluster (and so needs no
``kubernetes`` client); ``--record PATH`` saves NVML's raw answers, ``--from-recording PATH``
replays such a file instead of reading NVML.

Exit codes: 0 done; 1 no NVML, no GPU, or the Kubernetes API refused (one line on stderr,
nothing labelled); 2 bad flags or an unreadable recording.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click

from kneepoint.nodeprobe import nvml_reader
from kneepoint.nodeprobe.node_labels import NodeMarks, node_marks, sanitize_label_value, validate_node_name
from kneepoint.nodeprobe.topology import RecordingError, topology_from_recording

PREFIX = "kneepoint probe"


class ProbeFailure(Exception):
    """A one-line reason the probe labelled nothing, with its exit code."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class ProbeOptions:
    """The command's flags, resolved."""

    node_name: str
    dry_run: bool
    record_path: str | None
    recording_path: str | None
    interval: float


def acquire_recording(options: ProbeOptions, read: Callable[[], dict[str, Any]] = nvml_reader.read_nvml) -> dict[str, Any]:
    """Read NVML (or the given recording), save it if asked; raises ProbeFailure when there is nothing to label."""
    if options.recording_path:
        try:
            recording = nvml_reader.load_recording(options.recording_path)
        except ValueError as err:
            raise ProbeFailure(f"--from-recording: {err}", 2) from err
    else:
        try:
            recording = read()
        except nvml_reader.NvmlUnavailable as err:
            raise ProbeFailure(f"no NVML on this node ({err}); nothing labelled", 1) from err
        if options.record_path:
            nvml_reader.write_recording(recording, options.record_path)
    if not recording.get("deviceCount"):
        raise ProbeFailure("NVML reports no GPUs on this node; nothing labelled", 1)
    return recording


def marks_for(recording: dict[str, Any], node_name: str) -> NodeMarks:
    """Labels and annotation for a recording; ProbeFailure(2) when the recording is malformed."""
    try:
        topology = topology_from_recording(recording)
    except RecordingError as err:
        raise ProbeFailure(f"recording is incomplete: {err}", 2) from err
    return node_marks(topology, node_name)


def probe_once(options: ProbeOptions, writer: Any | None, read: Callable[[], dict[str, Any]] = nvml_reader.read_nvml) -> str:
    """One round: returns the line (or JSON document) to print."""
    marks = marks_for(acquire_recording(options, read), options.node_name)
    if options.dry_run:
        return json.dumps({"node": options.node_name, "labels": marks.labels, "annotations": marks.annotations}, indent=1)
    from kneepoint.nodeprobe.node_writer import NodeWriteError  # kubernetes only when labelling

    assert writer is not None, "a writer is needed unless --dry-run"
    try:
        patch = writer.apply(options.node_name, marks)
    except NodeWriteError as err:
        raise ProbeFailure(str(err), 1) from err
    if patch is None:
        return f"{PREFIX}: node {options.node_name} already carries these labels"
    changed = sorted(patch["metadata"].get("labels", {}))
    summary = ", ".join(f"{key}={marks.labels.get(key, '<removed>')}" for key in changed) or "annotation only"
    return f"{PREFIX}: node {options.node_name} updated: {summary}"


def run_probe(
    options: ProbeOptions,
    *,
    writer: Any | None = None,
    read: Callable[[], dict[str, Any]] = nvml_reader.read_nvml,
    sleep: Callable[[float], None] = time.sleep,
    rounds: int | None = None,
    echo: Callable[..., None] = click.echo,
) -> int:
    """Run the probe: once, or every ``options.interval`` seconds (``rounds`` bounds the loop for tests).

    A failure in the first round ends the run with its exit code; later failures (a
    transient API error, a GPU fallen off the bus) are reported and the loop goes on.
    """
    if writer is None and not options.dry_run:
        from kneepoint.nodeprobe.node_writer import NodeWriter

        writer = NodeWriter()
    done = 0
    while True:
        try:
            echo(probe_once(options, writer, read))
        except ProbeFailure as failure:
            echo(f"{PREFIX}: {failure}", err=True)
            if done == 0 or failure.exit_code == 2 or options.interval == 0:
                return failure.exit_code
        done += 1
        if options.interval == 0 or (rounds is not None and done >= rounds):
            return 0
        sleep(options.interval)


def _default_node_name() -> str:
    name = sanitize_label_value(socket.gethostname().lower().split(".")[0]).lower()
    return name or "node"


@click.command(name="probe", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--node-name", envvar="NODE_NAME", default=None, help="Node to label [env NODE_NAME; with --dry-run the host name by default]."
)
@click.option("--dry-run", is_flag=True, help="Print the labels and annotation as JSON; change nothing.")
@click.option(
    "--record", "record_path", type=click.Path(dir_okay=False), default=None, help="Also write NVML's raw answers to PATH (JSON)."
)
@click.option(
    "--from-recording",
    "recording_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="Replay a recording instead of reading NVML.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0),
    default=0.0,
    show_default=True,
    help="Seconds between probes; 0 probes once and exits.",
)
def command(node_name: str | None, dry_run: bool, record_path: str | None, recording_path: str | None, interval: float) -> None:
    """Read NVML topology and label this node with its NVLink domains."""
    if record_path and recording_path:
        click.echo(f"{PREFIX}: --record and --from-recording exclude each other (record from NVML, or replay a file)", err=True)
        sys.exit(2)
    if not node_name:
        if not dry_run:
            click.echo(f"{PREFIX}: --node-name (or env NODE_NAME) is required to label a node; use --dry-run to only print", err=True)
            sys.exit(2)
        node_name = _default_node_name()
    try:
        validate_node_name(node_name)
    except ValueError as err:
        click.echo(f"{PREFIX}: {err}", err=True)
        sys.exit(2)
    options = ProbeOptions(node_name, dry_run, record_path, recording_path, interval)
    sys.exit(run_probe(options))
