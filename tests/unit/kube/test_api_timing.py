"""kneepoint_api_request_duration_seconds' source: the real Kubernetes client's requests, timed by HTTP verb.

The client talks to a small HTTP server on loopback that answers as the API server would (a Pod's
JSON, a 500 with a Status body), so the whole client path runs: request building, urllib3's pool,
the response's deserialization, and the ApiException a failed request raises.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes import client

from kneepoint.kube.api_timing import time_requests

ANSWER_DELAY = 0.05


class _ApiServer(BaseHTTPRequestHandler):
    def _answer(self, code: int, body: dict) -> None:
        time.sleep(ANSWER_DELAY)
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._answer(200, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": self.path.rsplit("/", 1)[-1], "namespace": "ns"}})

    def do_PATCH(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self._answer(
            500, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": "etcdserver: request timed out", "code": 500}
        )

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture()
def api() -> Iterator[client.ApiClient]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ApiServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{server.server_address[1]}"
    with client.ApiClient(configuration) as api_client:
        yield api_client
    server.shutdown()


def test_each_request_is_timed_by_its_verb_failed_ones_too(api: client.ApiClient) -> None:
    seen: list[tuple[str, float]] = []
    time_requests(api, lambda verb, seconds: seen.append((verb, seconds)))
    core = client.CoreV1Api(api)
    pod = core.read_namespaced_pod("engine-0", "ns")
    assert pod.metadata.name == "engine-0"  # the answer still reaches the caller, deserialized
    with pytest.raises(client.ApiException) as failed:
        core.patch_namespaced_pod_status("engine-0", "ns", {"status": {}})
    assert failed.value.status == 500
    assert [verb for verb, _ in seen] == ["GET", "PATCH"]
    assert all(ANSWER_DELAY <= seconds < ANSWER_DELAY + 5 for _, seconds in seen)
