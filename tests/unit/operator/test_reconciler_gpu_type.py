"""The reconciler knows a tier's GPU type in every pass, also when the spec names no product (placement.nodeSelector).

Only passes that read the fleet (planning, placing, deploying) see the nodes' product label; the tier's
status records it when the tier is placed, and later passes (load test, metrics) take it from there.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from fake_cluster import FakeApi, node

from kneepoint.core.ladder import rfc3339
from kneepoint.core.needs import needs
from kneepoint.core.spec import parse_spec
from kneepoint.core.status import TIER_COLLECTING, ExperimentStatus
from kneepoint.reconciler import Reconciler
from kneepoint.settings import OperatorSettings

NOW = 1_800_000_000.0


def experiment() -> dict[str, Any]:
    return {
        "apiVersion": "kneepoint.io/v1alpha1",
        "kind": "ParallelismExperiment",
        "metadata": {"name": "x", "namespace": "ns", "uid": "uid-x", "generation": 1},
        "spec": {
            "model": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct", "architecture": {"preset": "llama-3-8b"}},
            "tiers": {"tensorParallel": [1, 2]},
            "placement": {"nodeSelector": {"pool": "gpu"}},
        },
    }


def test_a_node_selector_experiment_records_the_product_at_placement_and_knows_it_when_collecting() -> None:
    h200 = node("h200-0")
    h200["metadata"]["labels"]["pool"] = "gpu"
    api = FakeApi([h200])
    api.objects["x"] = experiment()
    r = Reconciler(api, api, OperatorSettings(), clock=lambda: NOW)  # type: ignore[arg-type]
    asyncio.run(r.reconcile("x", "ns"))
    asyncio.run(r.reconcile("x", "ns"))
    status = ExperimentStatus.from_dict(api.objects["x"]["status"])
    tp1 = status.tier("tp1-pp1")
    assert tp1.phase == "Deploying" and (tp1.node_name, tp1.gpu_product) == ("h200-0", "NVIDIA-H200")
    # The engine Deployment got requests sized from the resolved architecture (8B: 14.96 GiB of weights).
    [deployment] = [b for b in api.created if b["kind"] == "Deployment"]
    requests = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]
    assert requests["memory"] == "21Gi" and requests["cpu"] == "3"

    # The metrics pass reads no fleet: the GPU type comes from the tier's record.
    collecting = dataclasses.replace(tp1, phase=TIER_COLLECTING, load_test_started_at=rfc3339(NOW - 60), load_test_finished_at=rfc3339(NOW))
    spec = parse_spec(api.objects["x"]["spec"])
    before = len(api.calls)
    later = status.with_tier(collecting)
    obs = asyncio.run(r._observe("x", "ns", "uid-x", spec, later, 1, needs(spec, later)))
    assert obs.gpu is not None and obs.gpu.name == "h200" and obs.gpu_product == "NVIDIA-H200"
    assert "nodes" not in api.calls[before:] and obs.fleet is None
