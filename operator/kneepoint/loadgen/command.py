"""``kneepoint loadgen``: load-test an OpenAI-compatible server at fixed concurrency.

Flags follow CONTRACTS B (vLLM ``bench serve`` meanings where they overlap). The run:
optional warm-up (not measured) -> ``--repeats`` measured repeats of ``--num-requests``
each, with fresh prompts per repeat -> the kept repeat by the rule in ``summary`` -> the
table on stdout, ``--save-json``, and the compact summary (CONTRACTS A, < 4096 bytes) in
the termination-message file. Exit codes: 0 success; 1 when the kept repeat's error
fraction exceeds ``--max-error-fraction`` (or nothing completed, or a worker crashed), with
the reason in one line on stderr; 2 for bad flags, in one line naming the flag.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import sys
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import click

from kneepoint.loadgen.adaptive import (
    DEFAULT_CONFIDENCE,
    DEFAULT_MIN_REQUESTS,
    DEFAULT_RELATIVE_PRECISION,
    AdaptivePlan,
    AdaptiveStop,
    adaptive_json,
    assess_records,
)
from kneepoint.loadgen.expectation import ExpectedFigure, expectation_json, judge_repeat, parse_expectations
from kneepoint.loadgen.resolve_rules import ENV_VAR as RESOLVE_ENV
from kneepoint.loadgen.resolve_rules import ResolveRuleError, parse_resolve_rules
from kneepoint.loadgen.summary import (
    DEFAULT_CPU_LIMIT,
    DEFAULT_LOOP_LAG_LIMIT_MS,
    SavedRun,
    SLOs,
    build_summary,
    failure_line,
    fit_termination_message,
    judge_client_load,
    parse_slos,
    select_repeat,
    summarize_repeat,
)
from kneepoint.loadgen.table import render_table
from kneepoint.loadgen.worker_plan import (
    escalate_workers,
    parse_cgroup_cpu_max,
    parse_workers,
    plan_workers,
    split_concurrency,
    usable_cores,
)
from kneepoint.loadgen.workload import API_PATHS, Tokenizer, poisson_offsets, request_url

DEFAULT_TERMINATION_LOG = "/dev/termination-log"
MAX_REPEATS = 100


class OneLineUsageError(click.ClickException):
    """Bad input: ``Error: <line>`` on stderr and exit code 2, without click's usage block."""

    exit_code = 2


class _OneLineErrors(click.Command):
    """Reports click's own parse errors (unknown flag, bad integer) as one line too."""

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None, **extra: Any) -> click.Context:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.UsageError as error:
            raise OneLineUsageError(error.format_message()) from None


@dataclass(frozen=True)
class LoadgenConfig:
    """Validated flags."""

    endpoint: str
    model: str | None
    api: str
    stream: bool
    concurrency: int
    num_requests: int
    input_len: int
    output_len: int
    seed: int
    warmup_requests: int
    repeats: int
    request_rate: float | None
    timeout_s: float
    save_json: str | None
    tokenizer: str | None
    max_error_fraction: float
    resolve_rules: dict[tuple[str, int], str]
    workers: int | None
    progress: bool
    slos: SLOs
    cpu_limit: float
    lag_limit_ms: float
    profile_seconds: float = 0.0
    profile_requests: int = 0
    adaptive: AdaptivePlan | None = None
    expect: tuple[ExpectedFigure, ...] = ()
    """--expect: stop repeating after the first repeat that confirms every figure (loadgen/expectation.py)."""

    def to_json(self) -> dict[str, Any]:
        """The run's configuration as written to --save-json."""
        return {
            "endpoint": self.endpoint,
            "model": self.model,
            "api": self.api,
            "stream": self.stream,
            "concurrency": self.concurrency,
            "numRequests": self.num_requests,
            "inputLen": self.input_len,
            "outputLen": self.output_len,
            "seed": self.seed,
            "warmupRequests": self.warmup_requests,
            "repeats": self.repeats,
            "requestRate": self.request_rate,
            "timeoutSeconds": self.timeout_s,
            "tokenizer": self.tokenizer,
            "maxErrorFraction": self.max_error_fraction,
            "resolve": [f"{host}:{port}:{addr}" for (host, port), addr in self.resolve_rules.items()],
            "goodput": self.slos.to_json(),
            "clientCpuLimit": self.cpu_limit,
            "maxLoopLagMs": self.lag_limit_ms,
            "profileSeconds": self.profile_seconds,
            "profileRequests": self.profile_requests,
            "adaptive": None if self.adaptive is None else self.adaptive.to_json(),
            "expect": [f.to_flag() for f in self.expect],
        }


def _at_least(flag: str, value: int, minimum: int) -> int:
    if value < minimum:
        raise ValueError(f"{flag} must be an integer >= {minimum}, got {value}")
    return value


def validate(options: dict[str, Any]) -> LoadgenConfig:
    """Flags -> LoadgenConfig; ValueError with one line naming the flag and the allowed values."""
    endpoint = options["endpoint"].strip()
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"--endpoint must be an http:// or https:// base URL such as http://127.0.0.1:8000, got {endpoint!r}")
    try:
        _ = parts.port  # urllib parses the port only when asked
    except ValueError:
        raise ValueError(f"--endpoint has an invalid port: {endpoint!r}") from None
    rate = options["request_rate"]
    if rate is not None:
        if rate == math.inf:
            rate = None
        elif not rate > 0 or math.isnan(rate):
            raise ValueError(f"--request-rate must be a number of requests per second > 0 (or inf), got {rate}")
    repeats = _at_least("--repeats", options["repeats"], 1)
    if repeats > MAX_REPEATS:
        raise ValueError(f"--repeats must be an integer 1-{MAX_REPEATS}, got {repeats}")
    timeout_s = options["timeout"]
    if not timeout_s > 0:
        raise ValueError(f"--timeout must be a number of seconds > 0, got {timeout_s}")
    fraction = options["max_error_fraction"]
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"--max-error-fraction must be within [0, 1], got {fraction}")
    if not options["client_cpu_limit"] > 0.0:
        raise ValueError(f"--client-cpu-limit must be > 0 cores, got {options['client_cpu_limit']}")
    if not options["max_loop_lag_ms"] > 0.0:
        raise ValueError(f"--max-loop-lag-ms must be > 0, got {options['max_loop_lag_ms']}")
    save_json = options["save_json"]
    if save_json is not None:
        directory = os.path.dirname(os.path.abspath(save_json))
        if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
            raise ValueError(f"--save-json {save_json!r}: the directory {directory!r} does not exist or is not writable")
    model = options["model"]
    if model is not None and not model.strip():
        raise ValueError("--model must not be empty")
    try:
        rules = parse_resolve_rules(options["resolve"], os.environ.get(RESOLVE_ENV))
    except ResolveRuleError as error:
        message = str(error)
        if options["resolve"] == () and os.environ.get(RESOLVE_ENV):
            message = message.replace("--resolve", RESOLVE_ENV, 1)
        raise ValueError(message) from None
    profile_seconds = options.get("profile_seconds") or 0.0
    if not profile_seconds >= 0 or math.isinf(profile_seconds):
        raise ValueError(f"--profile-seconds must be a number of seconds >= 0 (0 = no profiled slice), got {profile_seconds}")
    profile_requests = options.get("profile_requests")
    if profile_requests is None:
        profile_requests = 2 * max(1, options["concurrency"])
    _at_least("--profile-requests", profile_requests, 1)
    adaptive = None
    if options.get("adaptive"):
        adaptive = AdaptivePlan(
            relative_precision=options.get("adaptive_precision", DEFAULT_RELATIVE_PRECISION),
            confidence=options.get("adaptive_confidence", DEFAULT_CONFIDENCE),
            min_requests=options.get("adaptive_min_requests", DEFAULT_MIN_REQUESTS),
        )  # ValueError names the flag
    expect = parse_expectations(options.get("expect") or ())
    return LoadgenConfig(
        endpoint=endpoint,
        model=model,
        api=options["api"],
        stream=options["stream"],
        concurrency=_at_least("--concurrency", options["concurrency"], 1),
        num_requests=_at_least("--num-requests", options["num_requests"], 1),
        input_len=_at_least("--input-len", options["input_len"], 1),
        output_len=_at_least("--output-len", options["output_len"], 1),
        seed=options["seed"],
        warmup_requests=_at_least("--warmup-requests", options["warmup_requests"], 0),
        repeats=repeats,
        request_rate=rate,
        timeout_s=timeout_s,
        save_json=options["save_json"],
        tokenizer=options["tokenizer"],
        max_error_fraction=fraction,
        resolve_rules=rules,
        workers=parse_workers(options["workers"]),
        progress=not options["no_progress"],
        slos=parse_slos(options["goodput"]),
        cpu_limit=options["client_cpu_limit"],
        lag_limit_ms=options["max_loop_lag_ms"],
        profile_seconds=profile_seconds,
        profile_requests=profile_requests,
        adaptive=adaptive,
        expect=expect,
    )


def termination_message_path(environ: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
    """CONTRACTS A: $TERMINATION_MESSAGE_PATH, else /dev/termination-log if writable, else None."""
    path = environ.get("TERMINATION_MESSAGE_PATH")
    if path:
        return path
    if os.path.exists(DEFAULT_TERMINATION_LOG):
        return DEFAULT_TERMINATION_LOG if os.access(DEFAULT_TERMINATION_LOG, os.W_OK) else None
    return DEFAULT_TERMINATION_LOG if os.access(os.path.dirname(DEFAULT_TERMINATION_LOG), os.W_OK) else None


def available_cores() -> int:
    """Cores this process may use: CPU affinity bounded by the cgroup v2 quota."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        affinity = os.cpu_count() or 1
    quota = None
    try:
        with open("/sys/fs/cgroup/cpu.max", encoding="ascii") as handle:
            quota = parse_cgroup_cpu_max(handle.read())
    except OSError:
        pass
    return usable_cores(affinity, quota)


async def _resolve_model(config: LoadgenConfig) -> str:
    from kneepoint.loadgen.http_client import first_model, make_session

    if config.model:
        return config.model
    async with make_session(1, config.resolve_rules, min(config.timeout_s, 30.0)) as session:
        try:
            return await first_model(session, config.endpoint)
        except Exception as error:  # noqa: BLE001 - any failure means the same: pass --model
            raise RunFailure(
                f"--model not given and the server's model list is unreadable ({' '.join(str(error).split())[:160]}); pass --model"
            ) from None


class RunFailure(RuntimeError):
    """The run could not be carried out; one line for stderr, exit code 1."""


async def _run_phase(
    runner: Any,
    config: LoadgenConfig,
    phase: str,
    label: str,
    count: int,
    offsets: list[float] | None,
    stop: AdaptiveStop | None = None,
) -> Any:
    from kneepoint.loadgen.progress import progress_wanted, show_progress

    task = None
    if progress_wanted(config.progress):
        task = asyncio.create_task(show_progress(label, count, runner.progress))
    try:
        if stop is None:
            return await runner.run_phase(phase, count, offsets)
        return await runner.run_phase(phase, count, offsets, stop)
    finally:
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass


async def _profiled_slice(runner: Any, config: LoadgenConfig) -> None:
    """The unmeasured phase with the engine's profiler on (loadgen/profile_slice.py)."""
    from kneepoint.loadgen.profile_slice import profile_during

    phase = _run_phase(runner, config, "profile", "profile  ", config.profile_requests, None)
    _, outcome = await profile_during(
        phase, lambda: runner.progress()[0], config.endpoint, config.resolve_rules, config.profile_seconds, config.timeout_s
    )
    if outcome.error is not None:
        click.echo(f"kneepoint loadgen: profiled slice: {outcome.error} (the measured figures are unaffected)", err=True)
    else:
        click.echo(
            f"kneepoint loadgen: profiled slice: {outcome.seconds:.1f} s under load; /stop_profile answered after "
            f"{outcome.stop_seconds:.1f} s",
            err=True,
        )


@dataclass
class LoadResult:
    """What ``run_load`` measured."""

    repeats: list[Any]
    """RepeatSummary per repeat."""
    records: list[Any]
    """Raw records per repeat."""
    workers: int
    model: str
    adaptive: list[dict[str, Any]]
    """Per repeat with --adaptive (``adaptive.adaptive_json``); empty without."""
    confirmed_after: int | None = None
    """With --expect: the repeat (1-based) whose figures confirmed every expectation; None when none did."""


async def run_load(config: LoadgenConfig, tokenizer: Tokenizer | None) -> LoadResult:
    """Warm up, then run every repeat (each stopping early with --adaptive; no more once one confirms --expect)."""
    from kneepoint.loadgen.runner import LocalRunner, RunSettings
    from kneepoint.loadgen.worker_pool import WorkerError, WorkerPool

    model = await _resolve_model(config)
    settings = RunSettings(
        url=request_url(config.endpoint, config.api),
        api=config.api,
        model=model,
        stream=config.stream,
        input_len=config.input_len,
        output_len=config.output_len,
        seed=config.seed,
        timeout_s=config.timeout_s,
        resolve_rules=config.resolve_rules,
        tokenizer_path=config.tokenizer,
    )
    cores = available_cores()
    workers = plan_workers(config.workers, config.concurrency, cores)

    def make_runner(count: int) -> Any:
        if count == 1:
            return LocalRunner(settings, config.concurrency, tokenizer)
        return WorkerPool(settings, split_concurrency(config.concurrency, count))

    runner = make_runner(workers)
    summaries, raw, adaptive = [], [], []
    confirmed_after = None
    try:
        await runner.start()
        while config.warmup_requests:
            warm = await _run_phase(runner, config, "warmup", "warm-up  ", config.warmup_requests, None)
            if config.workers is not None:
                break
            # Only the CPU criterion escalates: lag can come from a crowded machine, which
            # more processes would not cure.
            saturated = judge_client_load(warm.cpu_samples, [], config.cpu_limit, math.inf).limited
            more = escalate_workers(workers, cores, config.concurrency, saturated)
            if more is None:
                break
            click.echo(
                f"kneepoint loadgen: the client's CPU limited the warm-up with {workers} worker(s); warming up again with {more}",
                err=True,
            )
            await runner.close()
            workers = more
            runner = make_runner(workers)
            await runner.start()
        for repeat in range(config.repeats):
            phase = f"repeat-{repeat + 1}"
            offsets = None
            if config.request_rate is not None:
                offsets = poisson_offsets(config.seed, phase, config.num_requests, config.request_rate)
            label = f"repeat {repeat + 1}/{config.repeats}"
            stop = None if config.adaptive is None else AdaptiveStop(config.adaptive, config.concurrency, config.num_requests)
            outcome = await _run_phase(runner, config, phase, label, config.num_requests, offsets, stop)
            if stop is not None and config.adaptive is not None:
                final = assess_records(outcome.records, config.concurrency, config.adaptive)
                adaptive.append(adaptive_json(config.adaptive, config.num_requests, len(outcome.records), stop.decision, final, stop.last))
            client = judge_client_load(outcome.cpu_samples, outcome.lag_samples_ms, config.cpu_limit, config.lag_limit_ms)
            summaries.append(
                summarize_repeat(
                    phase,
                    outcome.records,
                    client,
                    config.input_len,
                    config.output_len,
                    config.slos,
                    outcome.prompt_tokens_local,
                )
            )
            raw.append(outcome.records)
            if config.expect and repeat + 1 < config.repeats:
                verdict = judge_repeat(config.expect, summaries[-1], config.concurrency, config.max_error_fraction)
                if verdict.confirmed:
                    confirmed_after = repeat + 1
                    click.echo(
                        f"kneepoint loadgen: repeat {repeat + 1} confirms every expected figure ({verdict.detail}); "
                        f"no more repeats (of {config.repeats})",
                        err=True,
                    )
                    break
                click.echo(f"kneepoint loadgen: repeat {repeat + 1} does not confirm the expected figures ({verdict.detail})", err=True)
        if config.profile_seconds > 0:
            await _profiled_slice(runner, config)
    except WorkerError as error:
        raise RunFailure(str(error)) from None
    finally:
        await runner.close()
    return LoadResult(summaries, raw, workers, model, adaptive, confirmed_after)


def _write_termination_message(text: str) -> str | None:
    path = termination_message_path()
    if path is None:
        return None
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as error:
        click.echo(f"kneepoint loadgen: could not write the termination message to {path}: {error}", err=True)
        return None
    return path


@click.command(name="loadgen", cls=_OneLineErrors, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--endpoint", required=True, help="Base URL of the server, e.g. http://127.0.0.1:8000.")
@click.option("--model", default=None, help="Model name in requests. Default: the first entry of GET /v1/models.")
@click.option(
    "--api",
    type=click.Choice(sorted(API_PATHS)),
    default="completions",
    show_default=True,
    help="completions -> /v1/completions, chat -> /v1/chat/completions.",
)
@click.option(
    "--stream/--no-stream",
    default=True,
    show_default=True,
    help="Stream with SSE (TTFT, TPOT, ITL measured) or wait for the whole body (latency only).",
)
@click.option("--concurrency", type=int, required=True, help="Requests in flight at once (vLLM bench --max-concurrency).")
@click.option("--num-requests", type=int, default=1000, show_default=True, help="Measured requests per repeat.")
@click.option("--input-len", type=int, default=1024, show_default=True, help="Prompt tokens per request.")
@click.option("--output-len", type=int, default=128, show_default=True, help="Output tokens per request (max_tokens + ignore_eos).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of prompts and Poisson arrivals.")
@click.option("--warmup-requests", type=int, default=0, show_default=True, help="Unmeasured requests before the first repeat.")
@click.option("--repeats", type=int, default=1, show_default=True, help="Measured repeats; one is kept (see docs/loadgen.md).")
@click.option(
    "--request-rate", type=float, default=None, help="Mean requests/s with Poisson arrivals. Default: as fast as the concurrency allows."
)
@click.option("--timeout", type=float, default=600.0, show_default=True, help="Seconds one request may take in all.")
@click.option(
    "--save-json",
    type=click.Path(dir_okay=False, writable=True),
    default=None,
    help="Write the summary, every repeat and every request to this JSON file.",
)
@click.option(
    "--tokenizer",
    type=click.Path(exists=False),
    default=None,
    help="Local tokenizer.json (or a directory with one) for exact prompt lengths.",
)
@click.option(
    "--max-error-fraction", type=float, default=0.5, show_default=True, help="Exit 1 when the kept repeat's failed/all exceeds this."
)
@click.option(
    "--resolve",
    multiple=True,
    metavar="HOST:PORT:ADDR",
    help=f"Connect to ADDR when the URL names HOST:PORT (like curl). Also from ${RESOLVE_ENV}.",
)
@click.option(
    "--workers", default="auto", show_default=True, metavar="N|auto", help="Client processes; auto adds processes at high concurrency."
)
@click.option("--no-progress", is_flag=True, default=False, help="No progress line (it is drawn only on a terminal anyway).")
@click.option(
    "--goodput",
    multiple=True,
    metavar="KEY:MS",
    help="SLO for goodput, KEY one of ttft, tpot, e2el (repeatable, like vLLM bench --goodput).",
)
@click.option(
    "--client-cpu-limit",
    type=float,
    default=DEFAULT_CPU_LIMIT,
    show_default=True,
    help="A worker whose median CPU reaches this many cores marks the run client-limited.",
)
@click.option(
    "--max-loop-lag-ms",
    type=float,
    default=DEFAULT_LOOP_LAG_LIMIT_MS,
    show_default=True,
    help="Event-loop lag P99 above this marks the run client-limited.",
)
@click.option(
    "--profile-seconds",
    type=float,
    default=0.0,
    show_default=True,
    help="After the measured repeats: profile this many seconds of the same load (vLLM's /start_profile, "
    "/stop_profile; docs/trace.md). 0 = off.",
)
@click.option("--profile-requests", type=int, default=None, help="Requests of the profiled phase (unmeasured). Default: 2 x --concurrency.")
@click.option(
    "--adaptive",
    is_flag=True,
    default=False,
    help="Stop a repeat early once output throughput and the E2E P99 are known to --adaptive-precision at "
    "--adaptive-confidence (never more than --num-requests; docs/loadgen.md).",
)
@click.option(
    "--adaptive-precision",
    type=float,
    default=DEFAULT_RELATIVE_PRECISION,
    show_default=True,
    help="Largest relative half-width of both intervals.",
)
@click.option("--adaptive-confidence", type=float, default=DEFAULT_CONFIDENCE, show_default=True, help="Confidence of both intervals.")
@click.option(
    "--adaptive-min-requests",
    type=int,
    default=DEFAULT_MIN_REQUESTS,
    show_default=True,
    help="Completed requests a repeat needs before it may stop.",
)
@click.option(
    "--expect",
    multiple=True,
    metavar="KEY=VALUE:BAND",
    help="A figure the caller expects, e.g. outputTokensPerSecond=3200:0.03 (repeatable). After a repeat whose figures "
    "all lie within their relative bands no more repeats run (docs/loadgen.md, Expected figures).",
)
def command(**options: Any) -> None:
    """Load-test an OpenAI-compatible server at fixed concurrency (or Poisson arrivals)."""
    try:
        config = validate(options)
    except ValueError as error:
        raise OneLineUsageError(str(error)) from None
    tokenizer = None
    if config.tokenizer:
        from kneepoint.loadgen.tokenizer_files import TokenizerFileError, load_tokenizer

        try:
            tokenizer = load_tokenizer(config.tokenizer)
        except TokenizerFileError as error:
            raise OneLineUsageError(str(error)) from None
    try:
        result = asyncio.run(run_load(config, tokenizer))
    except RunFailure as error:
        click.echo(f"kneepoint loadgen: FAILED: {error}", err=True)
        _write_termination_message(json.dumps({"v": 1, "ok": False, "error": str(error)[:400]}))
        sys.exit(1)
    repeats, raw, workers, model = result.repeats, result.records, result.workers, result.model
    choice = select_repeat(repeats, config.max_error_fraction)
    kept_adaptive = result.adaptive[choice.index] if result.adaptive else None
    summary = build_summary(repeats, choice, config.concurrency, config.max_error_fraction, adaptive=kept_adaptive)
    if config.expect:
        summary["expectation"] = expectation_json(config.expect, result.confirmed_after, config.repeats)
    failure = failure_line(repeats[choice.index], config.max_error_fraction)
    click.echo(
        render_table(
            repeats,
            choice,
            endpoint=config.endpoint,
            api=config.api,
            stream=config.stream,
            concurrency=config.concurrency,
            request_rate=config.request_rate,
            failure=failure,
            adaptive=result.adaptive,
        )
    )
    _write_termination_message(fit_termination_message(summary))
    if config.save_json:
        document = SavedRun(dict(config.to_json(), model=model, workers=workers), summary, choice, repeats, raw, result.adaptive).to_json()
        with open(config.save_json, "w", encoding="utf-8") as handle:
            json.dump(document, handle, indent=1)
            handle.write("\n")
    if failure is not None:
        click.echo(f"kneepoint loadgen: FAILED: {failure}", err=True)
        sys.exit(1)
