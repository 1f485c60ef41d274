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
