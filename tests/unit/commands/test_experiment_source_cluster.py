"""ClusterSource through the real Kubernetes client against a stub API server on loopback.

The stub answers the two GETs ClusterSource makes (a ParallelismExperiment, a ConfigMap)
and Kubernetes-style 404/403 Status bodies, so the request paths, the namespace from the
kube context and the one-line errors are checked without a cluster.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from pexp_docs import failed_middle

from kneepoint.cli import cli
from kneepoint.commands.experiment_source import ClusterSource, InputError, NotFoundError, load_from_cluster

EXPERIMENT_PATH = "/apis/kneepoint.io/v1alpha1/namespaces/team-a/parallelismexperiments/synthetic"
CONFIG_MAP_PATH = "/api/v1/namespaces/team-a/configmaps/synthetic-kserve"


class _StubApi(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # http.server's name
        self.server.paths.append(self.path)  # type: ignore[attr-defined]
        if self.path == EXPERIMENT_PATH:
            self._send(200, failed_middle())
        elif self.path == CONFIG_MAP_PATH:
            self._send(
                200,
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": "synthetic-kserve"},
                    "data": {"inferenceservice.yaml": "kind: InferenceService\n"},
                },
            )
        elif "/namespaces/locked/" in self.path:
            self._send(
                403,
                {
                    "kind": "Status",
                    "status": "Failure",
                    "message": 'parallelismexperiments.kneepoint.io "x" is forbidden: User "u" cannot get',
                    "code": 403,
                },
            )
        else:
            self._send(404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404})

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture()
def stub_api(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StubApi)
    server.paths = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "stub", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
                "users": [{"name": "tester", "user": {"token": "test-token"}}],
                "contexts": [{"name": "stub", "context": {"cluster": "stub", "user": "tester", "namespace": "team-a"}}],
                "current-context": "stub",
            }
        ),
        encoding="utf-8",
    )
    yield server, str(kubeconfig)
    server.shutdown()
    server.server_close()


def test_reads_the_experiment_in_the_context_namespace(stub_api):
    server, kubeconfig = stub_api
    cluster = ClusterSource(kubeconfig)
    assert cluster.namespace == "team-a"
    exp = load_from_cluster(cluster, "synthetic")
    assert exp.source == "cluster" and exp.where == "experiment team-a/synthetic"
    assert [t.name for t in exp.tiers] == ["tp1-pp1", "tp2-pp1", "tp4-pp1", "tp8-pp1"]
    assert cluster.get_config_map_data("synthetic-kserve") == {"inferenceservice.yaml": "kind: InferenceService\n"}
    assert server.paths == [EXPERIMENT_PATH, CONFIG_MAP_PATH]


def test_not_found_forbidden_and_unreachable_are_one_line(stub_api, tmp_path):
    _, kubeconfig = stub_api
    with pytest.raises(NotFoundError, match=r"^experiment other/nope not found$"):
        ClusterSource(kubeconfig, "other").get_experiment("nope")
    with pytest.raises(InputError) as forbidden:
        ClusterSource(kubeconfig, "locked").get_experiment("x")
    assert str(forbidden.value).startswith("experiment locked/x: the API server at http://127.0.0.1:")
    assert 'answered 403 Forbidden: parallelismexperiments.kneepoint.io "x" is forbidden' in str(forbidden.value)
    dead = tmp_path / "dead"
    dead.write_text(Path(kubeconfig).read_text().replace(f":{stub_api[0].server_port}", ":9"), encoding="utf-8")
    with pytest.raises(InputError) as unreachable:
        ClusterSource(str(dead)).get_experiment("synthetic")
    assert "experiment team-a/synthetic: cannot reach the API server at http://127.0.0.1:9" in str(unreachable.value)
    assert "\n" not in str(unreachable.value)


def test_report_and_export_commands_through_the_stub(stub_api):
    _, kubeconfig = stub_api
    runner = CliRunner()
    result = runner.invoke(cli, ["report", "synthetic", "--kubeconfig", kubeconfig])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("experiment team-a/synthetic (cluster, experiment team-a/synthetic)")
    assert "decision: TP4 (4 GPUs per replica), rule throughput-gain" in result.stdout
    result = runner.invoke(cli, ["export", "synthetic", "--kserve", "--kubeconfig", kubeconfig])
    assert result.exit_code == 1  # the stub's experiment has no phase Decided / status.decision
    assert "not decided yet: experiment team-a/synthetic has no status.decision yet" in result.stderr
    result = runner.invoke(cli, ["report", "nope", "--kubeconfig", kubeconfig, "-n", "team-b"])
    assert result.exit_code == 2
    assert result.stderr.strip() == "kneepoint report: error: experiment team-b/nope not found"


def test_bad_kubeconfig_is_one_line(tmp_path):
    path = tmp_path / "empty"
    path.write_text("", encoding="utf-8")
    with pytest.raises(InputError, match=r"^--kubeconfig .*empty: cannot load a Kubernetes configuration"):
        ClusterSource(str(path))
