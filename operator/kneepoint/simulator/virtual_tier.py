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

- a token reaches its client through the simulator's model of the API server's output path
  (:class:`~kneepoint.simulator.output_loop.OutputLoop`, as ``engine.Engine`` writes it): at 256
  sequences real vLLM's server falls behind its engine and the closed loop's waves hold together;
- a request reaches the engine through the simulator's API-server intake
  (:class:`~kneepoint.simulator.intake.Intake`, as ``engine.Engine`` admits it): a burst of
  prompts arrives later, and together, as on real vLLM. Without it every closed-loop slot's
  request reached the engine at the instant it was sent, and the in-process P99 was up to 38 %
  above real vLLM's where the HTTP simulator's was within 10 % (``benchmarks/predict_bands.py``).

What differs from a load test over HTTP: there is no network or client time (a token reaches
the client the instant the modelled output path writes it) and the client never limits the run (``clientLimited``
false). Times are simulated
seconds; wall-clock stamps in the summary are ``epoch`` plus simulated time.

With an adaptive plan (``spec.load.adaptive``, :class:`~kneepoint.loadgen.adaptive.AdaptivePlan`)
every measured repeat is stopped by the load generator's own rule,
:class:`kneepoint.loadgen.adaptive.AdaptiveStop`, exactly as the load-test Job's
``kneepoint loadgen --adaptive`` runs it: one rule per repeat of ``num_requests``, fed each
finished request before its slot sends the next; once it says stop no new request is sent and
those in flight finish and count. A repeat never sends more than ``num_requests``.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from kneepoint.core.timestamps import rfc3339
from kneepoint.loadgen.adaptive import AdaptivePlan, AdaptiveStop, adaptive_json, assess_records
from kneepoint.loadgen.expectation import ExpectedFigure, expectation_json, judge_repeat
from kneepoint.loadgen.records import HTTP_4XX, RequestRecord
from kneepoint.loadgen.summary import ClientLoad, RepeatSummary, build_summary, select_repeat, summarize_repeat
from kneepoint.loadgen.workload import build_prompt, build_request_body
from kneepoint.simulator.engine import SimulatorSettings, scheduler_config
from kneepoint.simulator.intake import Intake
from kneepoint.simulator.output_loop import OutputLoop
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
# The workload


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
    adaptive: tuple[dict[str, Any], ...] | None = None
    """With an adaptive plan, per measured repeat what ``kneepoint loadgen --adaptive`` records
    (``adaptive.adaptive_json``): ``stoppedEarly`` (the rule converged), ``reason``, ``requestsSent``
    of ``requestsPlanned``, ``completedAtStop`` and the intervals. The kept repeat's is also the
    summary's ``adaptive``."""

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
        serving = settings.perf.calibration.serving
        self.intake = Intake.of(serving)
        self.output: OutputLoop[str] = OutputLoop(serving.api_us_per_output, serving.api_us_per_write)

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

        def send(at: float) -> None:
            while not state["stopped"] and state["next"] < phase.count:
                index = state["next"]
                state["next"] += 1
                self.sent += 1
                if prompt >= limit or prompt + w.output_len > limit:
                    # The server answers 400 at once; the slot sends its next request.
                    phase.records.append(
                        RequestRecord(
                            index=index,
                            start=at,
                            input_tokens_asked=w.input_len,
                            output_tokens_asked=w.output_len,
                            error=HTTP_4XX,
                            message=f"400: maximum context length is {limit} tokens",
                            end=at,
                        )
                    )
                    continue
                rid = f"{phase.name}-{index}"
                self.intake.receive(at, rid, prompt)
                meta[rid] = (index, at)
                times[rid] = []
                return

        finished: dict[str, SimRequest] = {}  # done in the engine, their last tokens not written yet

        def answered(req: SimRequest, at: float) -> None:
            phase.records.append(self._record(req, meta.pop(req.request_id), times.pop(req.request_id)))
            if stop is not None and not state["stopped"] and stop(phase.records):
                state["stopped"] = True
            send(at)

        for _ in range(min(w.concurrency, phase.count)):
            send(self.now)
        while meta:
            for at, rid, n in self.output.written(self.now):
                times[rid] += [at] * n
                req = finished.get(rid)
                if req is not None and len(times[rid]) == req.output_tokens:
                    answered(finished.pop(rid), at)
            if not meta:
                break
            for at, key in self.intake.reached(self.now):
                sched.add_request(str(key), prompt, w.output_len, arrival_time=at)
            step = sched.schedule(self.now)
            if step is None:
                waits = [t for t in (self.intake.next_event(), self.output.next_event()) if t is not None]
                if waits:
                    self.now = max(self.now, min(waits))  # idle until the intake or the output path next changes
                    continue
                raise RuntimeError("the scheduler has requests but cannot schedule any (KV pool smaller than one request)")
            usage = sched.kv_cache_usage
            end = self.now + step.duration
            outcome = sched.complete(step, end)
            self.now = end
            st = step.step_time
            scale = step.duration / st.seconds if st.seconds > 0 else 1.0
            self.steps.append(_Step(end, step.duration, st.comm_seconds * scale, usage, len(outcome.tokens), len(step.preempted)))
            if not self.output.free:  # the tokens reach their clients through the API server's output path
                self.output.push(end, [req.request_id for req in outcome.tokens])
                finished.update((req.request_id, req) for req in outcome.finished)
                continue
            for req in outcome.tokens:
                times[req.request_id].append(end)
            for req in outcome.finished:
                answered(req, end)

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


def run_load_test(
    settings: SimulatorSettings, workload: Workload, adaptive: AdaptivePlan | None = None, expect: Sequence[ExpectedFigure] = ()
) -> TierMeasurement:
    """Load-test one engine on a virtual clock and return the load generator's summary with the window's metrics.

    ``adaptive``: the experiment's plan (``spec.load.adaptive`` when enabled); each repeat then
    stops as ``kneepoint loadgen --adaptive`` stops it (at most ``num_requests``).
    ``expect``: ``kneepoint loadgen --expect``'s figures: no more repeats after one that confirms them all.
    """
    run = _VirtualRun(settings, workload)
    w = workload
    if w.warmup_requests:
        run.run_phase(_Phase("warmup", w.warmup_requests))
    phases: list[_Phase] = []
    adaptive_repeats: list[dict[str, Any]] = []
    repeats: list[RepeatSummary] = []
    confirmed_after = None
    for i in range(w.repeats):
        phase = _Phase(f"repeat-{i + 1}", w.num_requests)
        if adaptive is None:
            run.run_phase(phase)
        else:
            # As kneepoint loadgen's run_load: a fresh rule per repeat, judged on each finished request.
            rule = AdaptiveStop(adaptive, w.concurrency, w.num_requests)
            run.run_phase(phase, lambda records, rule=rule: rule.add(records[-1]))
            final = assess_records(phase.records, w.concurrency, adaptive)
            adaptive_repeats.append(adaptive_json(adaptive, w.num_requests, len(phase.records), rule.decision, final, rule.last))
        phases.append(phase)
        repeats.append(summarize_repeat(phase.name, phase.records, _NO_CLIENT_LOAD, w.input_len, w.output_len))
        # As kneepoint loadgen --expect: the repeat judged as its own summary, then no more repeats once confirmed.
        if expect and i + 1 < w.repeats and judge_repeat(expect, repeats[-1], w.concurrency, OPERATOR_MAX_ERROR_FRACTION).confirmed:
            confirmed_after = i + 1
            break
    choice = select_repeat(repeats, OPERATOR_MAX_ERROR_FRACTION)
    kept_adaptive = adaptive_repeats[choice.index] if adaptive_repeats else None
    summary = build_summary(repeats, choice, w.concurrency, OPERATOR_MAX_ERROR_FRACTION, adaptive=kept_adaptive)
    if expect:
        summary["expectation"] = expectation_json(expect, confirmed_after, w.repeats)
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
        adaptive=tuple(adaptive_repeats) if adaptive is not None else None,
    )
    return replace(measurement, summary=measurement.summary_at(0.0))
