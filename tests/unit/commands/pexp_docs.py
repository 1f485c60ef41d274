"""Synthetic ParallelismExperiment documents for the report/export CLI tests, and a fake cluster.

Each builder returns a fresh dict shaped like ``kubectl get pexp NAME -o yaml``; the
numbers are invented for the case (they are inputs to the rules, not measurements).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from kneepoint.commands.experiment_source import NotFoundError

ROOT = Path(__file__).resolve().parents[3]
RECORDED = ROOT / "deploy" / "examples" / "recorded-h200.yaml"


def recorded() -> dict[str, Any]:
    """The real H200 recording (deploy/examples/recorded-h200.yaml)."""
    return yaml.safe_load(RECORDED.read_text(encoding="utf-8"))


def tier(tp: int, pp: int = 1, phase: str = "Measured", tps: float | None = None, p99: float | None = None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"name": f"tp{tp}-pp{pp}", "tensorParallel": tp, "pipelineParallel": pp, "gpus": tp * pp, "phase": phase}
    if tps is not None:
        out["outputTokensPerSecond"] = tps
    if p99 is not None:
        out["latencyP99Ms"] = p99
    out.update(extra)
    return out


def experiment(
    tiers: list[dict[str, Any]], tp=(1, 2, 4, 8), pp=(1,), name: str = "synthetic", mode: str = "Measure", **status: Any
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"uri": "hf://example/Test-Model-70B", "dtype": "bfloat16", "maxModelLen": 4096},
        "mode": mode,
        "tiers": {"tensorParallel": list(tp), "pipelineParallel": list(pp)},
        "load": {"concurrency": 16, "inputLen": 512, "outputLen": 128},
        "capacity": {"peakConcurrency": 64, "redundancyFactor": 1.5, "slo": {"latencyP99Ms": 8000}, "gpuHourlyCost": 2.0},
        "placement": {"gpuProduct": "NVIDIA-H200"},
    }
    if mode == "Simulate":
        spec["model"]["uri"] = "sim://test-model-70b"
        spec["model"]["architecture"] = {"preset": "llama-3-70b"}
    return {
        "apiVersion": "kneepoint.io/v1alpha1",
        "kind": "ParallelismExperiment",
        "metadata": {"name": name, "namespace": "team-a", "uid": "0000-1111"},
        "spec": spec,
        "status": {"tiers": tiers, **status},
    }


def all_skipped() -> dict[str, Any]:
    return experiment(
        [tier(n, phase="Skipped", doesNotFit=True, reason=f"does not fit: estimate {300 / n:.0f} GiB per GPU") for n in (1, 2, 4, 8)]
    )


def failed_middle() -> dict[str, Any]:
    """TP2 failed; TP1 -> TP4 compared directly; TP4 -> TP8 gains 7 %: stay at TP4 (throughput-gain)."""
    return experiment(
        [
            tier(1, tps=500, p99=12000),
            tier(2, phase="Failed", reason="CrashLoopBackOff"),
            tier(4, tps=1400, p99=6000),
            tier(8, tps=1500, p99=6100),
        ]
    )


def pp_ladder() -> dict[str, Any]:
    """TP1-TP4 do not fit; TP8 and TP8xPP2 measured; the last tier is decided."""
    return experiment(
        [
            tier(1, phase="Skipped", doesNotFit=True),
            tier(2, phase="Skipped", doesNotFit=True),
            tier(4, phase="Skipped", doesNotFit=True),
            tier(8, tps=900, p99=9500),
            tier(8, 2, tps=1500, p99=7000),
        ],
        pp=(1, 2),
    )


def simulated() -> dict[str, Any]:
    doc = experiment(
        [
            tier(1, tps=800, p99=7000, simulated=True),
            tier(2, tps=850, p99=6900, simulated=True),
            tier(4, phase="Skipped", reason="not needed"),
        ],
        tp=(1, 2, 4),
        mode="Simulate",
        simulated=True,
        phase="Decided",
    )
    return doc


class FakeCluster:
    """Stands in for ClusterSource: serves documents by name, one per read from a list when given several."""

    def __init__(self, experiments: dict[str, Any], config_maps: dict[str, dict[str, str]] | None = None, namespace: str = "team-a"):
        self.namespace = namespace
        self.server = "https://fake"
        self._experiments = {k: (list(v) if isinstance(v, list) else [v]) for k, v in experiments.items()}
        self._config_maps = config_maps or {}
        self.reads: list[str] = []

    def get_experiment(self, name: str) -> dict[str, Any]:
        self.reads.append(name)
        docs = self._experiments.get(name)
        if not docs:
            raise NotFoundError(f"experiment {self.namespace}/{name} not found")
        doc = docs.pop(0) if len(docs) > 1 else docs[0]
        return copy.deepcopy(doc)

    def get_config_map_data(self, name: str) -> dict[str, str]:
        if name not in self._config_maps:
            raise NotFoundError(f"ConfigMap {self.namespace}/{name} not found")
        return dict(self._config_maps[name])


def install_fake_cluster(monkeypatch, cluster: FakeCluster) -> list[tuple[Any, Any]]:
    """Make the commands read from ``cluster``; returns the (kubeconfig, namespace) each open was given."""
    from kneepoint.commands import experiment_source

    opened: list[tuple[Any, Any]] = []

    def fake_open(kubeconfig, namespace):
        opened.append((kubeconfig, namespace))
        if namespace:
            cluster.namespace = namespace
        return cluster

    monkeypatch.setattr(experiment_source, "open_cluster", fake_open)
    return opened


def write_doc(tmp_path: Path, doc: dict[str, Any], name: str = "exp.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return str(path)
