"""`kneepoint operator` outside the cluster: the sandbox's Prometheus when the sandbox is the current context, else one line."""

from __future__ import annotations

from pathlib import Path

import yaml

from kneepoint.handlers import prometheus_default
from kneepoint.sandbox import controlplane

DEFAULT = "http://prometheus-operated.monitoring.svc:9090"


def _kubeconfig(tmp_path: Path, server: str) -> str:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "here",
                "contexts": [{"name": "here", "context": {"cluster": "c", "user": "u"}}, {"name": "other", "context": {"cluster": "d"}}],
                "clusters": [{"name": "c", "cluster": {"server": server}}, {"name": "d", "cluster": {"server": "https://10.0.0.1:6443"}}],
                "users": [{"name": "u", "user": {}}],
            }
        )
    )
    return str(path)


def test_sandbox_context_uses_the_sandboxs_prometheus(tmp_path: Path) -> None:
    env = {"KNEEPOINT_SANDBOX_DIR": str(tmp_path / "sb")}
    sandbox = controlplane.resolve(env=env)
    env["KUBECONFIG"] = _kubeconfig(tmp_path, sandbox.apiserver_url)
    choice = prometheus_default.choose(DEFAULT, named=False, env=env)
    assert choice.url == sandbox.prometheus_url
    assert choice.note and "sandbox" in choice.note and "\n" not in choice.note


def test_other_context_says_in_one_line_that_the_default_does_not_resolve(tmp_path: Path) -> None:
    env = {"KNEEPOINT_SANDBOX_DIR": str(tmp_path / "sb"), "KUBECONFIG": _kubeconfig(tmp_path, "https://203.0.113.7:6443")}
    choice = prometheus_default.choose("http://prometheus-operated.monitoring.svc.invalid:9090", named=False, env=env)
    assert choice.url == "http://prometheus-operated.monitoring.svc.invalid:9090"
    assert choice.note is not None and "does not resolve" in choice.note and "--prometheus-url" in choice.note
    assert "\n" not in choice.note


def test_a_named_url_is_kept_silently(tmp_path: Path) -> None:
    env = {"KNEEPOINT_SANDBOX_DIR": str(tmp_path / "sb")}
    env["KUBECONFIG"] = _kubeconfig(tmp_path, controlplane.resolve(env=env).apiserver_url)
    assert prometheus_default.choose("http://prom.example:9090", named=True, env=env) == prometheus_default.PrometheusChoice(
        "http://prom.example:9090"
    )


def test_a_resolvable_default_is_kept(tmp_path: Path) -> None:
    env = {"KNEEPOINT_SANDBOX_DIR": str(tmp_path / "sb"), "KUBECONFIG": _kubeconfig(tmp_path, "https://203.0.113.7:6443")}
    assert prometheus_default.choose("http://localhost:9090", named=False, env=env).note is None
