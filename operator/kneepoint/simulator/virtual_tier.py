"""One ladder tier on a virtual clock: the simulator's engine under the load generator's workload, in-process.

In the sandbox a tier's load test runs in real time over HTTP (seconds to minutes per tier).
The decision-cost benchmark (``benchmarks/decision_cost.py``) needs thousands of tier
measurements, so this module runs the same two programs against each other in one process,
on simulated time, without sockets or sleeping. Nothing of the model is copied:

- the engine is sized by ``kneepoint sim``'s own flag handling
  (:func:`kneepoint.simulator.command.build_settings`), so the same vLLM flags give the same
  KV pool, the same step-time model and the same out-of-memory refusals (exit 1 and vLLM's
  line);
- engine steps come from the simulator's :class:`~kneepoint.simulator.scheduler.Scheduler`
  over its :class:`~kneepoint.simulator.perf_model.PerfModel`, with the seeded step-time
  noise, exactly as ``engine.Engine.run`` drives them (plan a step, let its duration pass,
  complete it); collective time and busy time are accounted by its ``Telemetry`` rules;
- the workload is ``kneepoint loadgen``'s: a closed loop of ``concurrency`` slots, each
  sending its next request the moment its previous response ends; a warm-up phase, then
  ``repeats`` measured phases of ``num_requests`` with fresh prompts, each phase drained
  before the next; prompts of ``input_len`` words counted by the simulator's tokenizer
  rules, ``max_tokens = output_len`` with ``ignore_eos``;
- the summary is the load generator's: per-request :class:`RequestRecord` (TTFT, every
  inter-token gap, E2E latency) go through ``summarize_repeat``, ``select_repeat`` and
  ``build_summary``, so the keys and percentiles are CONTRACTS A's.

- a request reaches the engine through the simulator's API-server intake
  (:class:`~kneepoint.simulator.intake.Intake`, as ``engine.Engine`` admits it): a burst of
  prompts arrives later, and together, as on real vLLM. Without it every closed-loop slot's
  request reached the engine at the instant it was sent, and the in-process P99 was up to 38 %
  above real vLLM's where the HTTP simulator's was within 10 % (``benchmarks/predict_bands.py``).

What differs from a load test over HTTP: there is no network or client time (a token reaches
the client the instant its step ends) and the client never limits the run (``clientLimited``
false). Times are simulated
seconds; wall-clock stamps in the summary are ``epoch`` plus simulated time.

Optional **adaptive stopping** (:class:`AdaptiveStop`) replaces "``repeats`` x
``num_requests``" by one measured phase that stops sending once output throughput and the
P99 of end-to-end latency are known to a stated confidence: throughput by batch means (batches of
whole closed-loop cycles of completions, Student-t interval on their mean), P99 by
the distribution-free order-statistic interval (binomial ranks; no assumption about the
latency distribution). It never sends more than the fixed plan would.
"""

from __future__ import annotations

import contextlib
import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from statistics import NormalDist
from typing import Any

from kneepoint.core.timestamps import rfc3339
from kneepoint.loadgen.records import HTTP_4XX, RequestRecord
from kneepoint.loadgen.statistics import percentile_sorted
from kneepoint.loadgen.summary import ClientLoad, build_summary, select_repeat, summarize_repeat
from kneepoint.loadgen.workload import build_prompt, build_request_body
from kneepoint.simulator.engine import SimulatorSettings, scheduler_config
from kneepoint.simulator.intake import Intake
from kneepoint.simulator.scheduler import Scheduler, SimRequest
from kneepoint.simulator.startup import EXIT_REFUSED, EngineRefusal
from kneepoint.simulator.tokens import count_chat_prompt, count_completion_prompt

# The operator runs its load-test Jobs with --max-error-fraction 1.0 and judges errors itself.
OPERATOR_MAX_ERROR_FRACTION = 1.0
_OOM_MARKERS = ("CUDA out of memory", "No available memory for the cache blocks", "larger than the available KV cache memory")
_NO_CLIENT_LOAD = ClientLoad(workers=1, cpu_peak=0.0, cpu_median=0.0, loop_lag_p99_ms=0.0, limited=False)


# --------------------------------------------------------------------------------------------
# Starting the engine


@dataclass(frozen=True)
class EngineStart:
    """What ``kneepoint sim`` with these flags does at start: serve (settings) or refuse (exit code and line)."""

    settings: SimulatorSettings | None
    exit_code: int = 0
    message: str = ""
    """vLLM's error line when the engine refuses to start."""

    @property
    def ok(self) -> bool:
        return self.settings is not None

    @property
    def out_of_memory(self) -> bool:
        """The refusal is one the operator classifies as out of memory (the model does not fit)."""
        return not self.ok and any(marker in self.message for marker in _OOM_MARKERS)


def start_engine(args: Sequence[str]) -> EngineStart:
    """Size an engine exactly as ``kneepoint sim ARGS`` would (vLLM flags plus the simulator's own).

    Pass the simulator's flags explicitly (``--gpu``, ``--interconnect``, ``--noise``,
    ``--seed``, ``--architecture``): their environment fallbacks are read too, as the CLI
    reads them. A bad flag raises ValueError with the simulator's one-line message.
    """
    from kneepoint.simulator import command as sim_command

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            ctx = sim_command.command.make_context("sim", list(args))
            params = dict(ctx.params)
            model = params.get("model")
            extra = list(ctx.args)
            if model is None and extra and not extra[0].startswith("-"):
                model = extra.pop(0)
            if not model:
                sim_command.fail("--model", "required (a model name or path, as vllm serve takes it)")
            settings = sim_command.build_settings(model, params)
    except EngineRefusal as refusal:
        return EngineStart(None, EXIT_REFUSED, refusal.root_cause)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
        line = stderr.getvalue().strip()
        if code == 2:
            raise ValueError(line or "bad simulator flags") from None
        return EngineStart(None, code, line)
    return EngineStart(settings)


# --------------------------------------------------------------------------------------------
# The workload and the stopping rule


@dataclass(frozen=True)
class Workload:
    """The load generator's flags that shape the load (CONTRACTS B)."""

    concurrency: int
    num_requests: int
    input_len: int
    output_len: int
    api: str = "completions"
    seed: int = 0
    warmup_requests: int = 0
    repeats: int = 1

    def __post_init__(self) -> None:
        for name in ("concurrency", "num_requests", "input_len", "output_len", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.warmup_requests < 0:
            raise ValueError(f"warmup_requests must be >= 0, got {self.warmup_requests}")
        if self.api not in ("completions", "chat"):
            raise ValueError(f"api must be completions or chat, got {self.api!r}")


@dataclass(frozen=True)
class AdaptiveStop:
    """Stop a tier's load test once throughput and P99 are known to ``confidence``.

    Throughput: the measured phase's completed requests, in completion order, are split into
    up to ``batches`` batches of whole multiples of ``concurrency`` completions (one
    closed-loop cycle refreshes every slot once); each batch's rate is its output tokens over
    its span; the Student-t interval of the batch rates' mean must have a half-width of at
    most ``throughput_rel_half_width`` of the mean (at least 3 batches). P99 (end-to-end latency): the order-statistic
    interval [X(l), X(u)] that holds the true P99 with probability >= ``confidence`` must
    exist (enough samples) and be at most ``p99_rel_width`` of the P99 wide. Checked every
    ``check_every`` completed requests once ``min_requests`` completed; no more than
    ``max_requests`` are sent (default: what the fixed plan sends, repeats x num_requests).
    """

    confidence: float = 0.95
    throughput_rel_half_width: float = 0.05
    p99_rel_width: float = 0.20
    batches: int = 10
    check_every: int = 25
    min_requests: int = 0
    max_requests: int | None = None

    def __post_init__(self) -> None:
        if not 0.5 < self.confidence < 1.0:
            raise ValueError(f"confidence must be in (0.5, 1), got {self.confidence}")
        if self.batches < 3:
            raise ValueError(f"batches must be at least 3, got {self.batches}")
        if self.check_every < 1:
            raise ValueError(f"check_every must be at least 1, got {self.check_every}")


def t_quantile(p: float, df: int) -> float:
    """Student-t quantile by the Cornish-Fisher expansion around the normal one (error < 1e-3 for df >= 5)."""
    z = NormalDist().inv_cdf(p)
    v = float(df)
    return (
        z + (z**3 + z) / (4 * v) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * v**2) + (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / (384 * v**3)
    )


def _binom_log_pmf(n: int, k: int, p: float) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(p) + (n - k) * math.log1p(-p)


def quantile_ranks(n: int, q: float, confidence: float) -> tuple[int, int] | None:
    """1-based ranks (l, u) with P(X(l) <= true q-quantile <= X(u)) >= confidence, or None with too few samples.

    The count of samples below the true quantile is Binomial(n, q); each tail gets at most
    (1 - confidence) / 2. Distribution-free (continuous distributions).
    """
    if n < 1:
        return None
    alpha = (1.0 - confidence) / 2.0
    pmf = [math.exp(_binom_log_pmf(n, k, q)) for k in range(n + 1)]
    # Upper rank: smallest u with P(B >= u) <= alpha.
    tail, u = 0.0, None
    for k in range(n, -1, -1):
        if tail + pmf[k] > alpha:
            u = k + 1
            break
        tail += pmf[k]
    # Lower rank: largest l with P(B <= l - 1) <= alpha.
    head, lower = 0.0, None
    for k in range(n + 1):
        if head + pmf[k] > alpha:
            lower = k
            break
        head += pmf[k]
    if u is None or lower is None or u > n or lower < 1:
        return None
    return lower, u


def min_samples_for_quantile(q: float, confidence: float) -> int:
    """The fewest samples for which :func:`quantile_ranks` gives an interval."""
    n = 1
    while quantile_ranks(n, q, confidence) is None:
        n = n + 1 if n < 64 else int(n * 1.05) + 1
        if n > 1_000_000:
            raise ValueError(f"no interval for quantile {q} at confidence {confidence}")
    # Step back to the smallest n (the coarse steps above may overshoot).
    while n > 1 and quantile_ranks(n - 1, q, confidence) is not None:
        n -= 1
    return n


# --------------------------------------------------------------------------------------------
# The result


@dataclass(frozen=True)
class TierMeasurement:
    """One tier's load test: the load generator's summary and what Prometheus would show."""

    summary: dict[str, Any]
    """CONTRACTS A, with startedAt/finishedAt relative to epoch 0 (see :meth:`summary_at`)."""
    seconds: float
    """Simulated seconds from the first warm-up request to the last response of the last phase."""
    requests_sent: int
    """Requests sent in all phases, warm-up included."""
    kept_started: float
    kept_finished: float
    """The kept repeat's window, simulated seconds from the test's start."""
    peak_kv_cache_usage: float
    """Max of vllm:kv_cache_usage_perc over the kept window (as max_over_time)."""
    comm_fraction: float
    """Share of step time in collectives over the kept window (the trace reader's commFraction is the per-step median)."""
    gpu_utilization: float
    """Busy share of the kept window (DCGM_FI_DEV_GPU_UTIL / 100)."""
    preemptions: int
    memory_used_gib: float
    """Framebuffer held per GPU once loaded (gpu-memory-utilization x memory): DCGM's FB_USED."""
    adaptive: dict[str, Any] | None = None
    """With adaptive stopping: whether it converged, requests measured, the intervals."""

    def summary_at(self, epoch: float) -> dict[str, Any]:
        """The summary with its wall-clock stamps for a test that started at ``epoch`` (seconds since 1970)."""
        out = dict(self.summary)
        out["startedAt"] = rfc3339(epoch + self.kept_started, 3)
        out["finishedAt"] = rfc3339(epoch + self.kept_finished, 3)
        return out


# --------------------------------------------------------------------------------------------
# The run


@dataclass
class _Step:
    end: float
    duration: float
    comm: float
    kv_usage: float
    tokens: int
    preempted: int


@dataclass
class _Phase:
    name: str
    count: int
    records: list[RequestRecord] = field(default_factory=list)


class _VirtualRun:
    """The engine loop and the closed-loop client on one simulated clock."""

    def __init__(self, settings: SimulatorSettings, workload: Workload) -> None:
        self.settings = settings
        self.workload = workload
        self.now = 0.0
        config = scheduler_config(settings)
        self.scheduler = Scheduler(config, settings.perf.step_time, clock=lambda: self.now, noise=settings.noise, seed=settings.seed)
        self.steps: list[_Step] = []
        self.sent = 0
        self.intake = Intake.of(settings.perf.calibration.serving)

    def prompt_tokens(self, phase: str) -> int:
        """Prompt tokens the simulator counts for this phase's prompts (synthetic prompts of one length count alike)."""
        w = self.workload
        prompt = build_prompt(w.seed, phase, 0, w.input_len)
        body = build_request_body(w.api, "model", prompt.text, w.output_len, True)
        return count_chat_prompt(body["messages"]) if w.api == "chat" else count_completion_prompt(body["prompt"])

    def run_phase(self, phase: _Phase, stop: Any = None) -> None:
        """Send ``phase.count`` requests with ``concurrency`` in flight; returns when all have answered.

        ``stop(records)`` is asked after each completed request; True stops sending new ones.
        """
        w, sched = self.workload, self.scheduler
        prompt = self.prompt_tokens(phase.name)
        limit = self.settings.max_model_len
        meta: dict[str, tuple[int, float]] = {}
        times: dict[str, list[float]] = {}
        state = {"next": 0, "stopped": False}

        def send() -> None:
            while not state["stopped"] and state["next"] < phase.count:
                index = state["next"]
                state["next"] += 1
                self.sent += 1
                if prompt >= limit or prompt + w.output_len > limit:
                    # The server answers 400 at once; the slot sends its next request.
                    start = self.now
                    phase.records.append(
                        RequestRecord(
                            index=index,
                            start=start,
                            input_tokens_asked=w.input_len,
                            output_tokens_asked=w.output_len,
                            error=HTTP_4XX,
                            message=f"400: maximum context length is {limit} tokens",
                            end=start,
                        )
                    )
                    continue
                rid = f"{phase.name}-{index}"
                self.intake.receive(self.now, rid, prompt)
                meta[rid] = (index, self.now)
                times[rid] = []
                return

        for _ in range(min(w.concurrency, phase.count)):
            send()
        while meta:
            for at, rid in self.intake.reached(self.now):
                sched.add_request(str(rid), prompt, w.output_len, arrival_time=at)
            step = sched.schedule(self.now)
            if step is None:
                reach = self.intake.next_event()
                if reach is not None:
                    self.now = max(self.now, reach)  # idle until the intake next changes
                    continue
                raise RuntimeError("the scheduler has requests but cannot schedule any (KV pool smaller than one request)")
            usage = sched.kv_cache_usage
            end = self.now + step.duration
            outcome = sched.complete(step, end)
            self.now = end
            st = step.step_time
            scale = step.duration / st.seconds if st.seconds > 0 else 1.0
            self.steps.append(_Step(end, step.duration, st.comm_seconds * scale, usage, len(outcome.tokens), len(step.preempted)))
            for req in outcome.tokens:
                times[req.request_id].append(end)
            for req in outcome.finished:
                phase.records.append(self._record(req, meta.pop(req.request_id), times.pop(req.request_id)))
                if stop is not None and not state["stopped"] and stop(phase.records):
                    state["stopped"] = True
                send()

    def _record(self, req: SimRequest, meta: tuple[int, float], token_times: list[float]) -> RequestRecord:
        index, start = meta
        w = self.workload
        first, last = token_times[0], token_times[-1]
        return RequestRecord(
            index=index,
            start=start,
            input_tokens_asked=w.input_len,
            output_tokens_asked=w.output_len,
            ttft=first - start,
            latency=last - start,
            itl=[b - a for a, b in zip(token_times, token_times[1:])],
            input_tokens=req.prompt_tokens,
            output_tokens=req.output_tokens,
            end=last,
        )

    def window(self, start: float, end: float) -> tuple[float, float, float, int]:
        """(peak KV usage, comm fraction, busy share, preemptions) of the steps ending in [start, end]."""
        peak = busy = comm = 0.0
        preempted = 0
        for s in self.steps:
            if s.end < start or s.end - s.duration > end:
                continue
            peak = max(peak, s.kv_usage)
            busy += s.duration
            comm += s.comm
            preempted += s.preempted
        span = max(end - start, 1e-9)
        return peak, (comm / busy if busy > 0 else 0.0), min(1.0, busy / span), preempted


def _adaptive_check(
    rule: AdaptiveStop, run: _VirtualRun, phase_start: float, records: Sequence[RequestRecord], min_requests: int
) -> tuple[bool, dict[str, Any]]:
    """Whether throughput and P99 are known well enough; the figures either way."""
    done = [r.latency for r in records if r.ok and r.latency is not None]
    info: dict[str, Any] = {"requests": len(records)}
    if len(records) < min_requests or len(records) % rule.check_every:
        return False, info
    # Batch means over completion cycles: in a closed loop of C slots every slot is refreshed
    # once per C completions, so batches of whole multiples of C completions are comparable.
    finished = sorted(r.end for r in records if r.ok and r.end is not None)
    tokens_done = sorted((r.end, r.output_tokens or 0) for r in records if r.ok and r.end is not None)
    cycle = max(1, run.workload.concurrency)
    per_batch = cycle * max(1, len(finished) // (cycle * rule.batches))
    count = len(finished) // per_batch
    if count < 3:
        return False, info
    rates, start = [], phase_start
    for b in range(count):
        chunk = tokens_done[b * per_batch : (b + 1) * per_batch]
        end = chunk[-1][0]
        if end <= start:
            return False, info
        rates.append(sum(t for _, t in chunk) / (end - start))
        start = end
    mean = sum(rates) / len(rates)
    sd = math.sqrt(sum((x - mean) ** 2 for x in rates) / (len(rates) - 1))
    half = t_quantile(0.5 + rule.confidence / 2, len(rates) - 1) * sd / math.sqrt(len(rates))
    info["batches"] = count
    ordered = sorted(done)
    ranks = quantile_ranks(len(ordered), 0.99, rule.confidence)
    info["throughputRelHalfWidth"] = round(half / mean, 4) if mean > 0 else None
    if ranks is None or mean <= 0:
        return False, info
    p99 = percentile_sorted(ordered, 99.0)
    low, high = ordered[ranks[0] - 1], ordered[ranks[1] - 1]
    info["p99RelWidth"] = round((high - low) / p99, 4) if p99 > 0 else None
    converged = half / mean <= rule.throughput_rel_half_width and p99 > 0 and (high - low) / p99 <= rule.p99_rel_width
    return converged, info


def run_load_test(settings: SimulatorSettings, workload: Workload, adaptive: AdaptiveStop | None = None) -> TierMeasurement:
    """Load-test one engine on a virtual clock and return the load generator's summary with the window's metrics."""
    run = _VirtualRun(settings, workload)
    w = workload
    if w.warmup_requests:
        run.run_phase(_Phase("warmup", w.warmup_requests))
    phases: list[_Phase] = []
    adaptive_info: dict[str, Any] | None = None
    if adaptive is None:
        for i in range(w.repeats):
            phase = _Phase(f"repeat-{i + 1}", w.num_requests)
            run.run_phase(phase)
            phases.append(phase)
    else:
        cap = adaptive.max_requests or w.repeats * w.num_requests
        floor = max(adaptive.min_requests, w.concurrency, min_samples_for_quantile(0.99, adaptive.confidence))
        phase = _Phase("repeat-1", cap)
        phase_start = run.now
        last: dict[str, Any] = {}

        def stop(records: list[RequestRecord]) -> bool:
            converged, info = _adaptive_check(adaptive, run, phase_start, records, min(floor, cap))
            if len(info) > 1:
                last.update(info)
            return converged

        run.run_phase(phase, stop)
        phases.append(phase)
        converged, info = _adaptive_check(replace(adaptive, check_every=1), run, phase_start, phase.records, 1)
        adaptive_info = {"converged": converged, "cap": cap, "floor": min(floor, cap), **info}
    repeats = [summarize_repeat(p.name, p.records, _NO_CLIENT_LOAD, w.input_len, w.output_len) for p in phases]
    choice = select_repeat(repeats, OPERATOR_MAX_ERROR_FRACTION)
    summary = build_summary(repeats, choice, w.concurrency, OPERATOR_MAX_ERROR_FRACTION)
    kept = repeats[choice.index]
    start = kept.started_at if kept.started_at is not None else 0.0
    end = kept.finished_at if kept.finished_at is not None else start
    peak, comm, busy, preempted = run.window(start, end)
    measurement = TierMeasurement(
        summary=summary,
        seconds=run.now,
        requests_sent=run.sent,
        kept_started=start,
        kept_finished=end,
        peak_kv_cache_usage=peak,
        comm_fraction=comm,
        gpu_utilization=busy,
        preemptions=preempted,
        memory_used_gib=settings.memory_used_bytes_per_gpu / 1024**3,
        adaptive=adaptive_info,
    )
    return replace(measurement, summary=measurement.summary_at(0.0))
