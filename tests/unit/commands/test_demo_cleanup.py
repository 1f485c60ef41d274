"""``kneepoint demo`` removes what it started (commands/demo.py ``_Cleanup``): the whole sandbox
when it started the API server, else its experiment, namespace and Helm release, and only
the components it started."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace
from typing import Any

import pytest

from kneepoint.commands import demo
from kneepoint.sandbox import controlplane


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    seen: list[Any] = []
    monkeypatch.setattr(subprocess, "run", lambda argv, **_: seen.append(argv) or SimpleNamespace(returncode=0, stdout="", stderr=""))
    monkeypatch.setattr(controlplane, "down", lambda **kw: seen.append(("down", kw.get("only"))) or [])
    return seen


def test_a_sandbox_the_demo_started_is_stopped_whole(calls: list[Any]) -> None:
    cleanup = demo._Cleanup(SimpleNamespace(started=["etcd", "kube-apiserver", "runner"]), ["kubectl"], "kneepoint-demo", "x")
    cleanup.helm, cleanup.release_installed, cleanup.namespace_created = ["helm"], True, True
    cleanup.run()
    assert calls == [("down", None)]


def test_in_a_running_sandbox_it_removes_its_experiment_namespace_and_release_only(calls: list[Any]) -> None:
    cleanup = demo._Cleanup(SimpleNamespace(started=[]), ["kubectl"], "kneepoint-demo", "x")
    cleanup.helm, cleanup.release_installed, cleanup.namespace_created = ["helm"], True, True
    cleanup.run()
    assert [c[:5] for c in calls] == [
        ["kubectl", "-n", "kneepoint-demo", "delete", "pexp"],  # the experiment first, while the operator removes its finalizer
        ["kubectl", "delete", "namespace", "kneepoint-demo", "--wait=false"],
        ["helm", "uninstall", demo.RELEASE, "--namespace", demo.OPERATOR_NAMESPACE],
        # its pods' processes end after the pods are gone: wait for the Lease to be released, then remove it
        ["kubectl", "-n", demo.OPERATOR_NAMESPACE, "get", "lease"],
        ["kubectl", "-n", demo.OPERATOR_NAMESPACE, "delete", "lease"],
    ]


def test_what_existed_before_the_demo_stays(calls: list[Any]) -> None:
    cleanup = demo._Cleanup(SimpleNamespace(started=["prometheus"]), ["kubectl"], "team", "x")
    cleanup.helm, cleanup.release_installed, cleanup.namespace_created = ["helm"], False, False
    cleanup.run()
    assert calls[0][:4] == ["kubectl", "-n", "team", "delete"]
    assert calls[1:] == [("down", ["prometheus"])]
