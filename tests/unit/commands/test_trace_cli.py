"""``kneepoint trace``: output shapes and exit codes."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from kneepoint.cli import cli

REAL_TRACE = Path(__file__).resolve().parents[2] / "data" / "vllm" / "8b-tp1-profile-rank0.pt.trace.json.gz"


def test_json_keys_exactly_as_documented() -> None:
    result = CliRunner().invoke(cli, ["trace", str(REAL_TRACE), "--output", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert list(doc) == ["ranks", "steps", "commFraction", "rankSkewFraction", "stepTimeMedianMs", "perRank"]
    assert list(doc["perRank"][0]) == ["rank", "steps", "collectiveShare", "stepTimeMedianMs"]
    assert (doc["ranks"], doc["steps"], doc["commFraction"]) == (1, 316, 0.0)


def test_table() -> None:
    result = CliRunner().invoke(cli, ["trace", str(REAL_TRACE)])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("ranks 1, steps 316, step time median 6.14 ms\ncommFraction 0.0000")


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text('{"traceEvents": []}')
    for args in (["trace", str(bad)], ["trace"], ["trace", str(tmp_path / "missing.json")], ["trace", str(REAL_TRACE), "-o", "yaml"]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, (args, result.output)
        lines = result.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("kneepoint trace: error: "), (args, result.output)


def test_the_sidecar_waits_for_every_rank_then_reads_the_slice_and_clears_it(tmp_path: Path) -> None:
    from kneepoint.commands.trace import TraceWatcher
    from kneepoint.simulator import profiler as sp

    steps = [sp.ProfiledStep(10.0 + i * 0.02, 0.010, 0.002, 0, 0, 16) for i in range(20)]
    docs = sp.rank_documents(steps, 2, 1, "pcie", "NVIDIA L40S", 48 * 10**9, seed=3, base_time_ns=0)
    watcher = TraceWatcher(tmp_path)
    sp.write_traces(str(tmp_path), docs[:1], 2, use_gzip=True)
    assert watcher.poll() is None and watcher.poll() is None  # rank 1 of 2 is not there yet
    (tmp_path / "dp0_pp0_tp1_dcp0_ep0_rank1.5.pt.trace.json.gz").write_bytes(b"\x1f\x8b partial")  # being written
    assert watcher.poll() is None
    (tmp_path / "dp0_pp0_tp1_dcp0_ep0_rank1.5.pt.trace.json.gz").unlink()
    sp.write_traces(str(tmp_path), docs[1:], 2, use_gzip=True)
    assert watcher.poll() is None  # first sight: the file may still grow
    figures = watcher.poll()
    assert figures is not None and (figures.ranks, figures.steps) == (2, 20)
    assert abs(figures.comm_fraction - 0.2) < 1e-6 and figures.rank_skew_fraction > 0
    assert not list(tmp_path.iterdir())  # read slices are deleted: the emptyDir stays small
    assert watcher.poll() is None


def test_watch_needs_a_metrics_address() -> None:
    result = CliRunner().invoke(cli, ["trace", "--watch", "/tmp/x"])
    assert result.exit_code == 2 and "--serve-metrics: required with --watch" in result.output
    result = CliRunner().invoke(cli, ["trace", "--watch", "/tmp/x", "--serve-metrics", "nope"])
    assert result.exit_code == 2 and "expected HOST:PORT or :PORT" in result.output
