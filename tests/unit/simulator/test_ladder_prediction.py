"""The predict-first adapter: the ladder on the simulator, held to real vLLM where a capture exists (tests/data/vllm)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from kneepoint.core.ladder import ladder_tiers
from kneepoint.core.spec import parse_spec
from kneepoint.core.tiers import Tier
from kneepoint.kube.manifests import vllm_args
from kneepoint.simulator import ladder_prediction as lp

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = parse_spec(yaml.safe_load((ROOT / "deploy" / "examples" / "experiment.yaml").read_text())["spec"])


def test_tp1_is_predicted_within_its_band_of_real_vllm() -> None:
    # The operator's c32 workload on real vLLM 0.24 (one H200): the load-test Job's flags exactly.
    real = json.loads((ROOT / "tests" / "data" / "vllm" / "8b-tp1-loadgen-c32-operator.json").read_text())["summary"]
    pred = lp.predict_ladder(EXAMPLE, {Tier(1): vllm_args(EXAMPLE, Tier(1))}, "NVIDIA-H200", "nvlink", "llama-3-8b")
    tp1 = pred.forecast(Tier(1))
    assert tp1 is not None and tp1.start_failure is None
    assert abs(tp1.output_tokens_per_second / real["outputTokensPerSecond"] - 1) <= tp1.throughput_band
    assert abs(tp1.latency_p99_ms / real["latencyP99Ms"] - 1) <= tp1.p99_band
    assert tp1.comm_fraction is None and tp1.scaling_band == 0.0


def test_the_shipped_bands_cover_every_real_vllm_capture() -> None:
    # benchmarks/predict_bands.py: every capture of tests/data/vllm replayed the way the prediction runs.
    import importlib.util
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("predict_bands", ROOT / "benchmarks" / "predict_bands.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # bf16: the 8B and the held-out 14B (run 18, Qwen2.5-14B's shape, fitted to nothing: its c1 is the largest, +2.9 %).
    rows = module.errors(("8b-tp1", "14b-tp1"))
    assert len(rows) >= 40 and {r[0].split("-r")[0] for r in rows} >= {"c1", "14b"}
    assert max(abs(r[2]) for r in rows if r[5] <= lp.MEASURED_CONCURRENCY) <= lp.TP1_THROUGHPUT_BAND
    assert max(abs(r[4]) for r in rows) <= lp.TP1_P99_BAND
    # Above 128 in flight (run 23b: the 8B at c256) the prediction is -9.3 % and +0.9 % off (with the API server's
    # output path; 5.5-17.5 % fast before it): the wider band covers it, the narrow one would not.
    high = [r for r in rows if r[5] > lp.MEASURED_CONCURRENCY]
    assert {r[0] for r in high} == {"r23-highconc-r3", "r23-highconc-expect"}
    assert (
        lp.TP1_THROUGHPUT_BAND < max(abs(r[2]) for r in high) <= lp.tp1_throughput_band(False, 256) == lp.HIGH_CONCURRENCY_THROUGHPUT_BAND
    )
    # Engines with online fp8: the 8B (run 12b, held out from every fit) and the 70B.
    fp8 = module.errors(("8b-fp8-tp1", "70b-fp8-tp1"))
    assert len(fp8) >= 20 and {r[0].split("-r")[0] for r in fp8} >= {"8b-fp8", "70b-fp8"}
    assert max(abs(r[2]) for r in fp8) <= lp.FP8_TP1_THROUGHPUT_BAND
    assert max(abs(r[4]) for r in fp8) <= lp.TP1_P99_BAND
    # The bf16 band would not hold them: an fp8 prediction would fall back to the full ladder on every experiment.
    assert max(abs(r[2]) for r in fp8) > lp.TP1_THROUGHPUT_BAND


def test_bands_grow_with_tp_and_over_pcie() -> None:
    assert lp.bands(Tier(1), "nvlink") == (0.035, 0.36, 0.0)
    t, p, s = lp.bands(Tier(4), "nvlink")
    assert (round(t, 3), round(p, 3), s) == (0.175, 0.5, 0.14)
    assert lp.bands(Tier(4), "pcie")[2] == 0.329
    assert lp.bands(Tier(1), "nvlink", fp8=True) == (0.06, 0.36, 0.0)
    assert lp.bands(Tier(1), "nvlink", concurrency=128) == (0.035, 0.36, 0.0)
    assert lp.bands(Tier(1), "nvlink", concurrency=129)[0] == lp.bands(Tier(1), "nvlink", fp8=True, concurrency=256)[0] == 0.10
    assert round(lp.bands(Tier(2), "nvlink", fp8=True)[0], 3) == 0.2


def test_an_fp8_experiment_is_predicted_with_the_fp8_band() -> None:
    doc = yaml.safe_load((ROOT / "deploy" / "examples" / "experiment.yaml").read_text())["spec"]
    doc["model"]["dtype"] = "fp8"
    doc["load"]["numRequests"] = 64
    spec = parse_spec(doc)
    args = vllm_args(spec, Tier(1))
    assert lp.is_fp8_engine(args) and not lp.is_fp8_engine(["--quantization"]) and not lp.is_fp8_engine(["--dtype", "bfloat16"])
    tp1 = lp.predict_ladder(spec, {Tier(1): args}, "NVIDIA-H200", "nvlink", spec.model.architecture.preset).forecast(Tier(1))
    assert tp1 is not None and tp1.throughput_band == lp.FP8_TP1_THROUGHPUT_BAND and tp1.output_tokens_per_second


def test_a_70b_engine_that_does_not_fit_one_gpu_is_predicted_not_to_start() -> None:
    spec = parse_spec(yaml.safe_load((ROOT / "deploy" / "examples" / "large-model.yaml").read_text())["spec"])
    tiers = [t for t in ladder_tiers(spec) if t.gpus <= 2]
    pred = lp.predict_ladder(spec, {t: vllm_args(spec, t) for t in tiers}, "NVIDIA-H200", "nvlink", spec.model.architecture.preset)
    tp1 = pred.forecast(Tier(1))
    # Real vLLM's line at TP1 (tests/data/vllm/70b-tp1-does-not-fit.log).
    assert tp1 is not None and "No available memory for the cache blocks" in (tp1.start_failure or "")
    tp2 = pred.forecast(Tier(2))
    assert tp2 is not None and tp2.start_failure is None and (tp2.output_tokens_per_second or 0) > 0


def test_like_experiments_share_one_prediction_and_a_changed_workload_makes_its_own() -> None:
    import dataclasses

    args = {Tier(1): vllm_args(EXAMPLE, Tier(1))}
    first = lp.predict_ladder(EXAMPLE, args, "NVIDIA-H200", "nvlink", "llama-3-8b")
    again = lp.predict_ladder(EXAMPLE, {Tier(1): list(args[Tier(1)])}, "NVIDIA-H200", "nvlink", "llama-3-8b")
    assert again is first
    shorter = dataclasses.replace(EXAMPLE, load=dataclasses.replace(EXAMPLE.load, output_len=EXAMPLE.load.output_len // 2))
    other = lp.predict_ladder(shorter, args, "NVIDIA-H200", "nvlink", "llama-3-8b")
    assert other is not first
    t_other, t_first = other.forecast(Tier(1)), first.forecast(Tier(1))
    assert t_other is not None and t_first is not None
    assert t_other.latency_p99_ms < t_first.latency_p99_ms


def test_the_tp_scaling_band_covers_every_pytorch_point_of_its_link() -> None:
    # The band between two predicted tiers is the simulator's TPn/TP1 error against the PyTorch + NCCL
    # H200 data: it must cover every point of its interconnect under the shipped calibration.
    from kneepoint.simulator.calibration import load_calibration
    from kneepoint.simulator.calibration_fit import load_points
    from kneepoint.simulator.calibration_vllm import scaling_error, tp_scaling_pairs

    cal = load_calibration()
    pairs = tp_scaling_pairs(load_points(ROOT / "tests" / "data" / "h200"))
    for link, band in lp.TP_SCALING_BAND.items():
        errors = [abs(scaling_error(pair, cal)) for pair in pairs if pair[0].interconnect == link]
        assert errors and max(errors) <= band, link
