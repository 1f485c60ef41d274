"""A leader that lost its Lease starts over in place: the process execs itself with its own arguments."""

from __future__ import annotations

import sys

import pytest

from kneepoint.commands import operator as command


def test_start_over_execs_the_same_interpreter_with_the_same_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(sys, "orig_argv", ["/venv/bin/python", "-m", "kneepoint", "operator", "-n", "team-a"])
    monkeypatch.setattr(command.os, "execv", lambda path, argv: seen.append((path, argv)))
    command._start_over()
    assert seen == [(sys.executable, [sys.executable, "-m", "kneepoint", "operator", "-n", "team-a"])]


def test_exit_on_lost_lease_is_a_flag_of_the_command() -> None:
    names = {param.name for param in command.command.params}
    assert "exit_on_lost_lease" in names
