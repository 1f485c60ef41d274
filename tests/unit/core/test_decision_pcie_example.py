"""The PCIe example's stop rules decide by comm-fraction on its own figures.

deploy/examples/pcie-fleet.yaml (Qwen2.5-14B on L40S, TP1 then TP2 over PCIe): throughput
from the sandbox run in docs/operator.md (TP1 399, TP2 524 output tok/s: ΔT +0.31) and the
virtual tier (ΔT +0.24), TP2's commFraction 0.19 as the profiler path reads it (docs/trace.md).
The throughput-gain rule, evaluated first, lets TP2's gain through; the link decides.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kneepoint.core.decision import STATE_DECIDED, decide
from kneepoint.core.spec import parse_spec
from kneepoint.core.status import TierResult

EXAMPLE = Path(__file__).resolve().parents[3] / "deploy" / "examples" / "pcie-fleet.yaml"


def measured(tp: int, tps: float, p99: float, mem: float, comm: float) -> TierResult:
    return TierResult(
        tensor_parallel=tp,
        pipeline_parallel=1,
        gpus=tp,
        name=f"tp{tp}-pp1",
        phase="Measured",
        output_tokens_per_second=tps,
        latency_p99_ms=p99,
        peak_memory_gi_b=mem,
        gpu_memory_gi_b=44.4,
        comm_fraction=comm,
    )


@pytest.mark.parametrize("tp2_tps", [524.0, 1.24 * 399.0])
def test_pcie_example_keeps_tp1_by_comm_fraction(tp2_tps: float) -> None:
    spec = parse_spec(yaml.safe_load(EXAMPLE.read_text())["spec"])
    tiers = [
        measured(1, 399.0, 18481.0, 38.8, 0.0),
        measured(2, tp2_tps, 15520.0, 20.72, 0.19),
        TierResult(tensor_parallel=4, pipeline_parallel=1, gpus=4, name="tp4-pp1", phase="Pending"),
    ]
    out = decide(spec, tiers)
    assert out.state == STATE_DECIDED and out.decision is not None
    assert (out.decision.tensor_parallel, out.decision.rule) == (1, "comm-fraction"), out.decision.reason
    assert "throughput-gain" not in (out.decision.rules_fired or ())
