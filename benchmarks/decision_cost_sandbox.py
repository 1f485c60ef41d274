"""Decision cost, cross-check: a few scenarios through the whole sandbox decide as the in-process ladder does.

``benchmarks/decision_cost.py`` runs the ladder in-process against a virtual cluster. This
script runs the same experiments (mode Simulate, a reduced load so a tier takes tens of
seconds of real time) through everything real: a sandbox of its own (own state dir and
ports; the pod runner starts ``kneepoint sim`` for each engine pod and ``kneepoint loadgen``
for each load-test Job over HTTP), ``kneepoint operator`` as a subprocess, Prometheus for the
metric window. One experiment at a time (two cores). It prints both decisions and each
tier's output tokens/s and P99 side by side; the simulators in the sandbox all use noise
seed 0 (the operator passes none), so the in-process run does too.

    .venv/bin/python benchmarks/decision_cost_sandbox.py [--scenarios 8b/h200/chat,70b/l40s/chat]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# Short ladder timings, as the integration tests use (Prometheus scrapes every 2 s in the sandbox).
OPERATOR_ENV = {
    "KNEEPOINT_SCRAPE_INTERVAL": "2",
    "KNEEPOINT_METRICS_SETTLE_SECONDS": "5",
    "KNEEPOINT_METRICS_DEADLINE_SECONDS": "60",
    "KNEEPOINT_POLL_SECONDS": "2",
    "KNEEPOINT_WAITING_POLL_SECONDS": "3",
    "KNEEPOINT_METRICS_PORT": "0",
}
REDUCED_LOAD = {"numRequests": 120, "repeats": 1, "warmupRequests": 8}
DEFAULT_SCENARIOS = "8b/h200/chat,70b/h200/chat,70b/l40s/chat"


def _decision_cost() -> Any:
    spec = importlib.util.spec_from_file_location("decision_cost", HERE / "decision_cost.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["decision_cost"] = module
    spec.loader.exec_module(module)
    return module


def _tiers(status: dict[str, Any]) -> dict[str, tuple[str, float | None, float | None]]:
    return {t["name"]: (t.get("phase", "?"), t.get("outputTokensPerSecond"), t.get("latencyP99Ms")) for t in status.get("tiers", [])}


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenarios", default=DEFAULT_SCENARIOS, help="model/fleet/workload, comma-separated")
    p.add_argument("--state-dir", type=Path, default=Path("/tmp/kneepoint-agree"))
    p.add_argument("--port-offset", type=int, default=19000)  # every port below the ephemeral range (docs/sandbox.md)
    p.add_argument("--timeout", type=float, default=1200.0, help="seconds one experiment may take in the sandbox")
    p.add_argument("--keep-sandbox", action="store_true")
    args = p.parse_args(argv)
    # Stop on SIGTERM as on Ctrl-C: the finally blocks stop the operator and the sandbox.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    dc = _decision_cost()
    chosen = []
    for key in [k.strip() for k in args.scenarios.split(",") if k.strip()]:
        parts = key.split("/")
        if len(parts) != 3 or parts[0] not in dc.MODELS or parts[1] not in dc.FLEETS or parts[2] not in dc.WORKLOADS:
            print(
                f"decision_cost_sandbox: --scenarios: {key!r} is not model/fleet/workload "
                f"({'|'.join(dc.MODELS)}/{'|'.join(dc.FLEETS)}/{'|'.join(dc.WORKLOADS)})",
                file=sys.stderr,
            )
            return 2
        chosen.append(dc.Scenario(dc.MODELS[parts[0]], dc.FLEETS[parts[1]], dc.WORKLOADS[parts[2]]))

    # In-process first (seconds).
    measurements = dc.Measurements(fixed_seed=0)
    ladder = next(v for v in dc.VARIANTS if v.name == "ladder")
    virtual = {}
    for sc in chosen:
        virtual[sc.key] = dc.run_ladder(sc, ladder, measurements, dc.LoadModel(), 0, spec=sc.spec("Simulate", REDUCED_LOAD))

    from kubernetes import client

    from kneepoint.sandbox import controlplane

    sandbox = controlplane.up(
        state_dir=args.state_dir, port_offset=args.port_offset, with_runner=True, say=lambda line: print(line, file=sys.stderr, flush=True)
    )
    api = controlplane.api_client(sandbox)
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    namespace = f"agree-{int(time.time())}"
    core.create_namespace({"metadata": {"name": namespace}})
    env = dict(
        os.environ,
        **OPERATOR_ENV,
        KUBECONFIG=str(sandbox.kubeconfig),
        KNEEPOINT_PROMETHEUS_URL=sandbox.prometheus_url,
        PYTHONUNBUFFERED="1",
    )
    log_path = sandbox.paths.logs / "operator-agree.log"
    with open(log_path, "wb") as log:
        operator = subprocess.Popen(
            [sys.executable, "-m", "kneepoint", "operator", "--namespace", namespace],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    real: dict[str, dict[str, Any]] = {}
    took: dict[str, float] = {}
    try:
        for i, sc in enumerate(chosen):
            name = f"agree-{i}-{sc.model.name}-{sc.fleet.name}-{sc.workload.name}"
            body = {
                "apiVersion": "kneepoint.io/v1alpha1",
                "kind": "ParallelismExperiment",
                "metadata": {"name": name, "namespace": namespace},
                "spec": sc.spec_dict("Simulate", REDUCED_LOAD),
            }
            started = time.monotonic()
            custom.create_namespaced_custom_object("kneepoint.io", "v1alpha1", namespace, "parallelismexperiments", body)
            status: dict[str, Any] = {}
            while time.monotonic() - started < args.timeout:
                obj = custom.get_namespaced_custom_object("kneepoint.io", "v1alpha1", namespace, "parallelismexperiments", name)
                status = obj.get("status") or {}
                if status.get("phase") in ("Decided", "Failed"):
                    break
                time.sleep(3)
            real[sc.key] = status
            took[sc.key] = time.monotonic() - started
            print(
                f"  {sc.key}: {status.get('phase')} {status.get('decidedTier') or ''} after {took[sc.key]:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    finally:
        if operator.poll() is None:
            os.killpg(operator.pid, signal.SIGTERM)
            try:
                operator.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(operator.pid, signal.SIGKILL)
        try:
            core.delete_namespace(namespace)
        except Exception:  # noqa: BLE001 - best-effort cleanup: gone already, or the API server stopped
            pass
        api.close()
        if not args.keep_sandbox:
            controlplane.down(args.state_dir, say=lambda line: print(line, file=sys.stderr))

    print(f"sandbox vs in-process ladder, mode Simulate, load {REDUCED_LOAD} (other load fields as in decision_cost.py)")
    agree = 0
    for sc in chosen:
        v, r = virtual[sc.key], real.get(sc.key, {})
        r_decision = r.get("decision") or {}
        r_label = r.get("decidedTier")
        same = v.decision == r_label
        agree += same
        print(
            f"{sc.key}: in-process {v.decision} ({v.rule}); sandbox {r_label} ({r_decision.get('rule')}) "
            f"after {took.get(sc.key, 0):.0f} s -> {'same' if same else 'DIFFERENT'}"
        )
        vt = _tiers(v.status.to_dict() if v.status else {})
        rt = _tiers(r)
        for tier in vt:
            a, b = vt[tier], rt.get(tier, ("?", None, None))
            print(
                f"    {tier}: in-process {a[0]:<9} {_fmt(a[1]):>6} tok/s P99 {_fmt(a[2]):>6} ms | "
                f"sandbox {b[0]:<9} {_fmt(b[1]):>6} tok/s P99 {_fmt(b[2]):>6} ms"
            )
    print(f"same decision: {agree}/{len(chosen)}; operator log: {log_path}")
    return 0 if agree == len(chosen) else 1


if __name__ == "__main__":
    sys.exit(main())
