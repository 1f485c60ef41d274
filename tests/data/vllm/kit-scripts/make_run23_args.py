"""Run 23's flags, written from the project's own builders (run here, before the device call).

Engine: ``kube.manifests.vllm_args`` for deploy/examples/experiment.yaml at TP1, the model path
replaced by the kit's dummy-weight folder. Loads: ``kube.manifests.loadgen_args`` for the same
experiment and for benchmarks/decision_cost.py's 8b/h200/chat scenario (the same engine flags:
concurrency 32, maxModelLen 4096), the endpoint replaced by the engine on the same machine, the
profiled slice left out, each load its own seed (vLLM's prefix cache must not serve a
repeated prompt), and ``--expect`` from the prediction the operator would make
(``simulator.ladder_prediction.predict_ladder`` on the fleet's labels: NVIDIA-H200, nvlink).

    PYTHONPATH=operator:benchmarks .venv/bin/python tests/data/vllm/kit-scripts/make_run23_args.py .device-kit/scripts
    PYTHONPATH=operator:benchmarks .venv/bin/python tests/data/vllm/kit-scripts/make_run23_args.py --run24 tests/data/vllm/kit-scripts
"""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from kneepoint.core.architectures import architecture_from_spec, preset_names
from kneepoint.core.ladder import ladder_tiers
from kneepoint.core.spec import parse_spec
from kneepoint.core.tiers import Tier
from kneepoint.core.actions import ConfirmLoad
from kneepoint.kube.manifests import Owner, expect_args, loadgen_args, vllm_args
from kneepoint.simulator.ladder_prediction import predict_ladder

ROOT = Path(__file__).resolve().parents[4]
MODEL_DIR = "/tmp/k/models/llama-3-8b"
ENDPOINT = "http://127.0.0.1:8000"
TP1 = Tier(1, 1)


def strip(args: list[str], flag: str, values: int = 1) -> list[str]:
    if flag in args:
        i = args.index(flag)
        return args[:i] + args[i + 1 + values :]
    return args


def set_flag(args: list[str], flag: str, value: str) -> list[str]:
    out = list(args)
    out[out.index(flag) + 1] = value
    return out


def expect_flags(spec) -> list[str]:
    arch = architecture_from_spec(spec.model.architecture, None, model_name=spec.model.uri)
    preset = arch.name if arch.name in preset_names() else None
    engine = {tier: vllm_args(spec, tier) for tier in ladder_tiers(spec)}
    forecast = predict_ladder(spec, engine, "NVIDIA-H200", "nvlink", preset).forecast(TP1)
    assert forecast is not None and forecast.output_tokens_per_second and forecast.latency_p99_ms
    return expect_args(ConfirmLoad(forecast.output_tokens_per_second, forecast.throughput_band, forecast.latency_p99_ms, forecast.p99_band))


def job_args(spec, seed: int, repeats: int | None = None) -> list[str]:
    args = loadgen_args(spec, Owner("run23", "default", "uid"), TP1)
    args = strip(args, "--profile-seconds")
    args = set_flag(args, "--endpoint", ENDPOINT)
    args = set_flag(args, "--seed", str(seed))
    if repeats is not None:
        args = set_flag(args, "--repeats", str(repeats))
    return args


def main(out_dir: str) -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from decision_cost import FLEETS, MODELS, WORKLOADS, Scenario

    example = parse_spec(yaml.safe_load((ROOT / "deploy/examples/experiment.yaml").read_text())["spec"])
    chat = Scenario(MODELS["8b"], FLEETS["h200"], WORKLOADS["chat"]).spec()
    engine = vllm_args(example, TP1)
    chat_engine = vllm_args(chat, TP1)
    engine[0] = MODEL_DIR
    # One engine serves both workloads: the flags differ at most in --dtype (the example names bfloat16, auto is bfloat16).
    assert strip(vllm_args(example, TP1)[1:], "--dtype") == strip(chat_engine[1:], "--dtype"), (engine, chat_engine)
    loads = {
        "example-r5": job_args(example, 2301, repeats=5),
        "example-expect": job_args(example, 2302) + expect_flags(example),
        "chat-r5": job_args(chat, 2303, repeats=5),
        "chat-expect": job_args(chat, 2304) + expect_flags(chat),
    }
    out = Path(out_dir)
    write(out, "", engine, loads)
    # Run 23b and 23c: decision_cost.py's 8b/h200 highconc and long scenarios, each on its own engine (their
    # --max-num-seqs and --max-model-len differ), three repeats and predict-first's Job.
    for tag, workload, seeds in (("b", "highconc", (2311, 2312)), ("c", "long", (2321, 2322))):
        spec = Scenario(MODELS["8b"], FLEETS["h200"], WORKLOADS[workload]).spec()
        engine = vllm_args(spec, TP1)
        engine[0] = MODEL_DIR
        runs = {f"{workload}-r3": job_args(spec, seeds[0], repeats=3), f"{workload}-expect": job_args(spec, seeds[1]) + expect_flags(spec)}
        if workload == "long":
            runs = {f"{workload}-expect": runs[f"{workload}-expect"], f"{workload}-r2": job_args(spec, seeds[0], repeats=2)}
        write(out, tag, engine, runs)


def run24(out_dir: str) -> None:
    """Run 24 (exp-waves.sh): run 23b's engine (decision_cost.py's 8b/h200 highconc at TP1), and one repeat each of
    the highconc and the example experiment's Job beside the stamped closed loops, new seeds."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from decision_cost import FLEETS, MODELS, WORKLOADS, Scenario

    spec = Scenario(MODELS["8b"], FLEETS["h200"], WORKLOADS["highconc"]).spec()
    example = parse_spec(yaml.safe_load((ROOT / "deploy/examples/experiment.yaml").read_text())["spec"])
    engine = vllm_args(spec, TP1)
    engine[0] = MODEL_DIR
    loads = {"highconc-r1": job_args(spec, 2403, repeats=1), "example-r1": job_args(example, 2404, repeats=1)}
    write(Path(out_dir), "", engine, loads, run="run24")


def write(out: Path, tag: str, engine: list[str], loads: dict[str, list[str]], run: str = "run23") -> None:
    (out / f"{run}{tag}-engine-args.txt").write_text(" ".join(engine) + "\n")
    (out / f"{run}{tag}-loads.txt").write_text("".join(f"{name} {' '.join(args)}\n" for name, args in loads.items()))
    print((out / f"{run}{tag}-engine-args.txt").read_text() + (out / f"{run}{tag}-loads.txt").read_text())


if __name__ == "__main__":
    run24(sys.argv[2]) if sys.argv[1] == "--run24" else main(sys.argv[1])
