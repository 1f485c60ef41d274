"""spec.load.adaptive end to end in the sandbox: the load-test Job's `kneepoint loadgen --adaptive` stops its repeat
before numRequests, says so in its termination message, and the operator records the tier from that summary.

The 8B example on H200 (it stops at TP1 by memory headroom, so one tier runs) with a plan of 600 requests. A loose
precision (25 %) at 90 % confidence makes the stop depend on the request count (the P99 interval exists from 299
completions; the check runs every 16) rather than on how crowded this machine is.
"""

from __future__ import annotations

import json
import time
from typing import Any

from experiment_api import NO_SEARCH, Cluster, example_spec, experiment, is_finished, tier

from kneepoint.kube import naming

PLANNED = 600
ADAPTIVE_LOAD = {
    "concurrency": 16,
    "numRequests": PLANNED,
    "inputLen": 128,
    "outputLen": 32,
    "repeats": 1,
    "warmupRequests": 2,
    "adaptive": {"enabled": True, "relativePrecision": 0.25, "confidence": 0.9, "minRequests": 100},
}


def test_the_load_test_job_stops_early_and_the_tier_is_recorded(sandbox: Any, operator: Any, namespace: str) -> None:
    name = "llama-8b-adaptive"
    with sandbox.api_client() as api:
        exps = Cluster(api)
        # The example turns the concurrency search on; its point Jobs would be read here too: this case is the ladder's Job.
        exps.create(experiment(name, namespace, base=example_spec("experiment.yaml", load=ADAPTIVE_LOAD, capacity=NO_SEARCH)))
        # The Job and its pod are deleted once the tier is recorded: read its args and termination message while they exist.
        args: list[str] | None = None
        message: str | None = None
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and not is_finished(exps.status(namespace, name)):
            selector = f"{naming.LABEL_EXPERIMENT}={name},{naming.LABEL_ROLE}={naming.ROLE_LOADTEST}"
            for pod in exps.core.list_namespaced_pod(namespace, label_selector=selector).items:
                for container in pod.spec.containers:
                    args = container.args
                for cs in pod.status.container_statuses or []:
                    if cs.state.terminated is not None and cs.state.terminated.message:
                        message = cs.state.terminated.message
            time.sleep(0.5)
        status = exps.status(namespace, name)
    assert status["phase"] == "Decided", status.get("message")
    assert args is not None and "--adaptive" in args
    assert args[args.index("--adaptive-precision") + 1] == "0.25" and args[args.index("--num-requests") + 1] == str(PLANNED)
    assert message is not None, "the load-test pod left no termination message while it existed"
    summary = json.loads(message)
    adaptive = summary["adaptive"]
    assert adaptive["stoppedEarly"] is True, adaptive
    assert adaptive["requestsPlanned"] == PLANNED and adaptive["completedAtStop"] % 16 == 0 and adaptive["completedAtStop"] >= 299
    assert adaptive["completedAtStop"] <= adaptive["requestsSent"] < PLANNED
    # The tier is recorded from that summary: fewer completed requests than the plan, the figures of the stopped repeat.
    tp1 = tier(status, "tp1-pp1")
    assert tp1 is not None and tp1["phase"] == "Measured" and tp1["attempts"] == 1
    assert tp1["completedRequests"] == summary["completed"] == adaptive["requestsSent"] - summary["failed"]
    assert tp1["outputTokensPerSecond"] == summary["outputTokensPerSecond"] and tp1["latencyP99Ms"] == summary["latencyP99Ms"]
    print(f"adaptive Job: {json.dumps(adaptive)}; tier: completedRequests {tp1['completedRequests']} of {PLANNED}")
