"""The README's two commands in sequence on one machine: ``make demo``, then ``make test``.

``kneepoint demo`` installs the chart's operator in the sandbox, watching every namespace.
Left running, it would drive the next test session's experiments beside the session's own
operator (every event and child twice: issue 20's 14 failures). The demo therefore removes
what it started when it ends (``--keep`` leaves it). This test runs the demo's own code
path (``kneepoint demo`` with its default example) against the session's sandbox, sees its
operator lead the every-namespace Lease while it runs (what the session's guard in
conftest.py refuses to test beside), sees nothing of it left afterwards, and then runs an
integration case with the session's operator: Decided, every child and event once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from conftest import leaders_of_every_namespace
from experiment_api import Cluster, experiment, tier
from fault_harness import ChildLedger

DEMO_NAMESPACE = "kneepoint-demo"
OPERATOR_NAMESPACE = "kneepoint-system"


def test_demo_leaves_no_operator_behind_and_an_integration_case_then_passes(
    sandbox: Any, operator: Any, namespace: str, tmp_path: Path
) -> None:
    out = tmp_path / "demo.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with out.open("wb") as log:
        demo = subprocess.Popen(
            [sys.executable, "-m", "kneepoint", "demo", "--png", str(tmp_path / "knee.png"), "--timeout", "420"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        seen_leading: list[str] = []
        deadline = time.monotonic() + 540
        try:
            while demo.poll() is None and time.monotonic() < deadline:
                if not seen_leading:
                    seen_leading = leaders_of_every_namespace(sandbox)
                time.sleep(1)
        finally:
            if demo.poll() is None:
                demo.kill()
    text = out.read_text(errors="replace")
    assert demo.returncode == 0, text[-4000:]
    assert "conclusion:" in text and "cleaning up what the demo started" in text, text[-3000:]
    # While it ran, its operator led the every-namespace Lease (the chart's pod, named after it).
    assert seen_leading and "kneepoint-operator-all held by kneepoint-" in seen_leading[0], seen_leading

    # Nothing of it is left: no operator leading every namespace, no pod, no experiment.
    assert leaders_of_every_namespace(sandbox) == []
    pods = sandbox.kubectl("get", "pods", "-n", OPERATOR_NAMESPACE, "-o", "name", check=False).stdout.split()
    assert pods == [], pods
    left = sandbox.kubectl("get", "pexp", "-n", DEMO_NAMESPACE, "-o", "name", check=False).stdout.split()
    assert left == [], left

    # `make test` after it: an integration case with the session's operator alone.
    name = "after-demo"
    with sandbox.api_client() as api:
        cluster = Cluster(api)
        with ChildLedger(api, {namespace}) as ledger:
            cluster.create(experiment(name, namespace, {"tiers": {"tensorParallel": [1]}}))
            status = cluster.wait_finished(namespace, name, 180)
        events = [(e["reason"], e["message"]) for e in cluster.events(namespace, name, order="first")]
    assert status["phase"] == "Decided", status.get("message")
    assert tier(status, "tp1-pp1")["attempts"] == 1
    assert [r for r, _ in events].count("TierMeasured") == 1, events
    assert sorted({e for e in events if events.count(e) > 1}) == [], events
    assert ledger.duplicates(namespace=namespace) == {}
