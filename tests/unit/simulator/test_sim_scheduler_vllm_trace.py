"""The scheduler's chunked-prefill split against real vLLM 0.24's steps under load.

tests/data/vllm/8b-tp1-steps-c128.txt is one row per engine step of a real trace at
concurrency 128 (1024-token prompts, --max-num-batched-tokens 8192 as the serve log prints,
--max-num-seqs 128). Its first 11 rows are a wave of new requests being prefilled while 42
others decode: every step spends the whole 8192-token budget, decode first (one token per
running request), then the rest of a prompt begun in the previous step, then whole prompts
from the queue and a first chunk of the next. Started from that state, the simulator's
scheduler must plan the same steps, row for row.
"""

from __future__ import annotations

import math
from pathlib import Path

from kneepoint.simulator.perf_model import StepTime, StepWork
from kneepoint.simulator.scheduler import RUNNING, Scheduler, SchedulerConfig

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm"
PROMPT = 1024
MAX_NUM_BATCHED_TOKENS = 8192  # "Chunked prefill is enabled with max_num_batched_tokens=8192." (8b-tp1-serve.log)


def trace_rows(name: str) -> list[tuple[int, int, int]]:
    """(context seqs, context tokens, generation seqs) per step of a step table."""
    rows = []
    for line in (DATA / name).read_text().splitlines()[1:]:
        _start, _dur, _period, ctx_seqs, ctx_tokens, gen_seqs, _gen_tokens = line.split()
        rows.append((int(ctx_seqs), int(ctx_tokens), int(gen_seqs)))
    return rows


def test_serve_log_names_the_token_budget() -> None:
    assert f"max_num_batched_tokens={MAX_NUM_BATCHED_TOKENS}." in (DATA / "8b-tp1-serve.log").read_text()


def test_a_wave_of_prefills_is_split_as_real_vllm_splits_it() -> None:
    real = trace_rows("8b-tp1-steps-c128.txt")
    wave = [r for r in real[:12] if r[0]]
    assert len(wave) == 11 and real[11] == (0, 0, 128)
    # The state at the first row: 42 decoding, one prompt begun with `left` tokens to go, the
    # rest of the wave queued. The wave's tokens are whole prompts plus that remainder.
    decoding = wave[0][2]
    total = sum(tokens for _, tokens, _ in wave)
    queued, left = divmod(total, PROMPT)
    assert decoding + 1 + queued == 128

    now = [0.0]
    config = SchedulerConfig(
        max_num_seqs=128, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, num_gpu_blocks=56_057, max_model_len=4096
    )  # async by default: the queue was there before the first step
    sched = Scheduler(config, lambda work: StepTime(0.01, 0.0, 0.0, 0.0), clock=lambda: now[0])

    def running(request_id: str, computed: int, output_tokens: int) -> None:
        req = sched.add_request(request_id, PROMPT, 256)
        sched.waiting.remove(req)
        req.status, req.num_computed, req.output_tokens = RUNNING, computed, output_tokens
        req.blocks = math.ceil(computed / config.block_size)
        sched.free_blocks -= req.blocks
        sched.running.append(req)

    for i in range(decoding):
        running(f"decode-{i}", PROMPT + 9, 10)  # past its first token: one token a step
    running("begun", PROMPT - left, 0)
    for i in range(queued):
        sched.add_request(f"queued-{i}", PROMPT, 256)

    planned = []
    for _ in range(len(wave) + 1):
        step = sched.schedule(now[0])
        assert step is not None
        work: StepWork = step.work
        planned.append((work.prefill_seqs, work.prefill_tokens, work.decode_seqs))
        now[0] += step.duration
        sched.complete(step, now[0])
    assert planned == [*wave, (0, 0, 128)]
