"""A leader that lost its Lease starts over in place: the process execs itself with its own arguments."""

from __future__ import annotations

import sys

import pytest

from kneepoint.commands import operator as command


def test_start_over_execs_the_same_interpreter_with_the_same_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, list[str]]] = []
    monkeypatch.setattr(sys, "orig_argv", ["/venv/bin/python", "-m", "kneepoint", "operator", "-n", "team-a"])
    monkeypatch.setattr(command.os, "execv", lambda path, argv: seen.append((path, argv)))
    monkeypatch.setenv("KNEEPOINT_LEASE_NAMESPACE", "before")  # so the test undoes what _start_over sets
    command._start_over("kneepoint-system")
    assert seen == [(sys.executable, [sys.executable, "-m", "kneepoint", "operator", "-n", "team-a"])]
    # The new process reads the Lease's namespace from its option's variable: no lookup while the API is away.
    assert command.os.environ["KNEEPOINT_LEASE_NAMESPACE"] == "kneepoint-system"


async def test_the_lease_lookup_waits_for_an_unreachable_api_server(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    class Lookup:
        @staticmethod
        def find_lease_namespace(api: object, name: str) -> str | None:
            calls.append(name)
            if len(calls) < 3:
                raise ConnectionRefusedError("API server restarting")
            return "kneepoint-system"

    async def no_sleep(seconds: float) -> None:
        return None

    monkeypatch.setattr(command.asyncio, "sleep", no_sleep)
    assert await command._find_lease_namespace(Lookup, object(), "kneepoint-operator-all") == "kneepoint-system"
    assert len(calls) == 3


def test_exit_on_lost_lease_is_a_flag_of_the_command() -> None:
    names = {param.name for param in command.command.params}
    assert "exit_on_lost_lease" in names
