"""Continuous batching as vLLM's V1 scheduler does it, over a simulated clock.

Each engine step the scheduler
1. walks the running requests in order and gives each the tokens it still has to compute
   (one for a decoding request; the rest of its prompt, in chunks, for a prefilling one),
   within the step's token budget (``--max-num-batched-tokens``: chunked prefill);
2. allocates KV-cache blocks of 16 tokens for those tokens; when the pool is exhausted it
   preempts the lowest-priority running request (the last admitted): frees its blocks and
   puts it back at the head of the queue to be recomputed from scratch (vLLM's
   preemption by recompute);
3. if nothing was preempted, admits waiting requests while fewer than ``--max-num-seqs``
   run, budget is left and their first chunk's blocks fit. With ``async_scheduling`` the
   admission is vLLM 0.24's (its log: "Asynchronous scheduling is enabled"; ``EngineCore.
   step_with_batch_queue``): step k+1 is planned when step k is launched, so while the engine
   is busy a request is admitted only if it arrived before the previous step was planned; one
   that arrives during step k joins step k+2. An idle engine plans at once.
A request that has computed every known token samples a new one at the end of the step.
Requests generate exactly ``max_tokens`` tokens (as with ``ignore_eos``).

The step's duration comes from an injected step-time function (the roofline model) times
seeded multiplicative noise; the caller owns the clock: it calls :meth:`Scheduler.schedule`,
lets ``step.duration`` pass (really, or on a fake clock in tests), then calls
:meth:`Scheduler.complete`. Pure: no I/O, no sleeping.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from kneepoint.simulator.perf_model import StepTime, StepWork

BLOCK_TOKENS = 16

WAITING = "waiting"
RUNNING = "running"
FINISHED = "finished"
ABORTED = "aborted"


@dataclass(frozen=True)
class SchedulerConfig:
    """The engine limits, as vLLM's flags set them."""

    max_num_seqs: int
    max_num_batched_tokens: int
    num_gpu_blocks: int
    max_model_len: int
    block_size: int = BLOCK_TOKENS
    async_scheduling: bool = True
    """Admit as vLLM 0.24's asynchronous scheduling does (one step later while the engine is busy), as
    vLLM 0.24 does by default. With the intake's serial share (``simulator.intake``) it brings the
    virtual-clock replay's TTFT P50 at c64 from -33..-35 % to -6..-9 % of real vLLM, c1-c16 staying
    within 7 % (docs/simulator.md, "The intake"); with the whole intake serial it spoiled c8 (-28 %)."""

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "num_gpu_blocks", "max_model_len", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")


@dataclass(eq=False)
class SimRequest:
    """One request inside the engine, with the timestamps its metrics are computed from."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    arrival_time: float
    finish_reason: str = "length"
    """Reported when ``max_tokens`` is reached: ``length`` when the client set a limit, ``stop`` for a natural end."""
    status: str = WAITING
    num_computed: int = 0
    output_tokens: int = 0
    blocks: int = 0
    num_preemptions: int = 0
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finish_time: float | None = None
    itl_sum: float = 0.0
    itl_max: float = 0.0

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens: what the KV cache must eventually hold."""
        return self.prompt_tokens + self.output_tokens

    @property
    def finished(self) -> bool:
        return self.status in (FINISHED, ABORTED)


@dataclass(frozen=True)
class ScheduledStep:
    """What one step runs, planned at ``start``; it ends at ``start + duration``."""

    start: float
    duration: float
    step_time: StepTime
    """The model's (noise-free) split of the step."""
    entries: tuple[tuple[SimRequest, int], ...]
    """(request, tokens computed for it in this step)."""
    work: StepWork
    preempted: tuple[SimRequest, ...]

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.entries)


@dataclass
class StepOutcome:
    """What a completed step produced."""

    end: float
    tokens: list[SimRequest] = field(default_factory=list)
    """Requests that received one new token (their ``output_tokens`` already counts it)."""
    itls: list[float] = field(default_factory=list)
    """Inter-token gaps observed in this step (requests past their first token)."""
    first_tokens: list[SimRequest] = field(default_factory=list)
    """Requests whose first token this was (TTFT, queue and prompt counters)."""
    finished: list[SimRequest] = field(default_factory=list)
    prompt_tokens: int = 0
    """Prompt tokens of requests that got their first token now (vLLM counts them once)."""


class Scheduler:
    """Continuous-batching engine core: queue, running batch, KV blocks, preemption."""

    def __init__(
        self,
        config: SchedulerConfig,
        step_time: Callable[[StepWork], StepTime],
        *,
        clock: Callable[[], float],
        noise: float = 0.0,
        seed: int = 0,
    ) -> None:
        if noise < 0:
            raise ValueError(f"noise must be >= 0, got {noise}")
        self.config = config
        self._step_time = step_time
        self._clock = clock
        self._noise = noise
        self._rng = random.Random(seed)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self._by_id: dict[str, SimRequest] = {}
        self.free_blocks = config.num_gpu_blocks
        self.num_preemptions = 0
        self._planned_at: float | None = None
        """When the step in flight (or last planned) was planned; None once the engine is idle."""

    # -- requests ----------------------------------------------------------------------------
    def add_request(
        self, request_id: str, prompt_tokens: int, max_tokens: int, *, finish_reason: str = "length", arrival_time: float | None = None
    ) -> SimRequest:
        """Queue a request that reached the engine at ``arrival_time`` (default: now); the caller has
        checked it against ``max_model_len``. Arrivals must come in time order (the queue is FIFO)."""
        if prompt_tokens < 1 or max_tokens < 1:
            raise ValueError("prompt_tokens and max_tokens must be at least 1")
        if prompt_tokens + max_tokens > self.config.max_model_len:
            raise ValueError(f"prompt ({prompt_tokens}) + max_tokens ({max_tokens}) exceed max_model_len {self.config.max_model_len}")
        if request_id in self._by_id:
            raise ValueError(f"duplicate request id {request_id!r}")
        arrival = self._clock() if arrival_time is None else arrival_time
        req = SimRequest(request_id, prompt_tokens, max_tokens, arrival, finish_reason=finish_reason)
        self.waiting.append(req)
        self._by_id[request_id] = req
        return req

    def abort_request(self, request_id: str) -> None:
        """Drop a request (client gone): frees its blocks; a step in flight skips it."""
        req = self._by_id.pop(request_id, None)
        if req is None or req.finished:
            return
        if req.status == RUNNING:
            self.running.remove(req)
        else:
            self.waiting.remove(req)
        self._free(req)
        req.status = ABORTED

    # -- state -------------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def kv_cache_usage(self) -> float:
        """Fraction of KV blocks in use, 0-1 (vllm:kv_cache_usage_perc)."""
        total = self.config.num_gpu_blocks
        return (total - self.free_blocks) / total

    # -- blocks ------------------------------------------------------------------------------
    def _blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.config.block_size)

    def _try_allocate(self, req: SimRequest, new_tokens: int) -> bool:
        need = self._blocks_for(req.num_computed + new_tokens) - req.blocks
        if need > self.free_blocks:
            return False
        if need > 0:
            self.free_blocks -= need
            req.blocks += need
        return True

    def _free(self, req: SimRequest) -> None:
        self.free_blocks += req.blocks
        req.blocks = 0

    def _preempt(self, victim: SimRequest) -> None:
        self._free(victim)
        victim.num_computed = 0
        victim.status = WAITING
        victim.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(victim)

    # -- one step ----------------------------------------------------------------------------
    def schedule(self, now: float) -> ScheduledStep | None:
        """Plan the next step starting at ``now``; None when there is nothing to run."""
        budget = self.config.max_num_batched_tokens
        entries: list[tuple[SimRequest, int]] = []
        preempted: list[SimRequest] = []
        # Asynchronous scheduling: a busy engine planned this step when it launched the previous
        # one, with the requests that had arrived by then.
        busy = self.config.async_scheduling and self.running and self._planned_at is not None
        admit_until = self._planned_at if busy and self._planned_at is not None else now
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed, budget)
            scheduled = True
            while not self._try_allocate(req, n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted.append(victim)
                if victim is req:
                    scheduled = False
                    break
            if not scheduled:
                break
            entries.append((req, n))
            budget -= n
            i += 1
        if not preempted:
            while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
                req = self.waiting[0]
                if req.arrival_time > admit_until:
                    break
                n = min(req.num_tokens - req.num_computed, budget)
                if not self._try_allocate(req, n):
                    break
                self.waiting.popleft()
                req.status = RUNNING
                if req.first_scheduled_time is None:
                    req.first_scheduled_time = now
                self.running.append(req)
                entries.append((req, n))
                budget -= n
        if not entries:
            self._planned_at = None
            return None
        self._planned_at = now
        work = self._work(entries)
        st = self._step_time(work)
        factor = 1.0
        if self._noise:
            factor = max(0.2, 1.0 + self._rng.gauss(0.0, self._noise))
        return ScheduledStep(
            start=now, duration=st.seconds * factor, step_time=st, entries=tuple(entries), work=work, preempted=tuple(preempted)
        )

    @staticmethod
    def _work(entries: list[tuple[SimRequest, int]]) -> StepWork:
        decode_seqs = decode_ctx = prefill_tokens = prefill_prior = prefill_seqs = sampled = 0
        pairs = 0.0
        for req, n in entries:
            if n == 1 and req.output_tokens > 0:
                decode_seqs += 1
                decode_ctx += req.num_computed + 1
            else:
                prior = req.num_computed
                prefill_tokens += n
                prefill_prior += prior
                prefill_seqs += 1
                pairs += n * prior + n * (n + 1) / 2
            if req.num_computed + n == req.num_tokens:
                sampled += 1
        return StepWork(
            decode_seqs=decode_seqs,
            decode_context_tokens=decode_ctx,
            prefill_tokens=prefill_tokens,
            prefill_attention_pairs=pairs,
            prefill_prior_tokens=prefill_prior,
            prefill_seqs=prefill_seqs,
            sampled_seqs=sampled,
        )

    def complete(self, step: ScheduledStep, end: float) -> StepOutcome:
        """Apply a step that ended at ``end``: advance computed tokens, sample, finish requests."""
        out = StepOutcome(end=end)
        for req, n in step.entries:
            if req.status != RUNNING:
                continue  # aborted while the step ran
            req.num_computed += n
            if req.num_computed < req.num_tokens:
                continue  # a prefill chunk; more to come
            req.output_tokens += 1
            if req.first_token_time is None:
                req.first_token_time = end
                out.first_tokens.append(req)
                out.prompt_tokens += req.prompt_tokens
            else:
                gap = end - (req.last_token_time or end)
                out.itls.append(gap)
                req.itl_sum += gap
                req.itl_max = max(req.itl_max, gap)
            req.last_token_time = end
            out.tokens.append(req)
            if req.output_tokens >= req.max_tokens:
                req.status = FINISHED
                req.finish_time = end
                self.running.remove(req)
                self._free(req)
                self._by_id.pop(req.request_id, None)
                out.finished.append(req)
        return out
