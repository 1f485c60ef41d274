"""The table printed at the end of a run (pure text formatting, like vLLM bench's result block)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kneepoint.loadgen.statistics import Distribution
from kneepoint.loadgen.summary import RepeatChoice, RepeatSummary

_WIDTH = 64


def _number(value: float | int | None, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, int):
        return str(value)
    return f"{value:,.{digits}f}"


def _row(label: str, value: str) -> str:
    return f"{label:<36}{value:>28}"


def _latency_rows(repeat: RepeatSummary) -> list[str]:
    header = f"{'(ms)':<6}{'mean':>9}{'std':>9}{'P50':>9}{'P90':>9}{'P95':>9}{'P99':>9}"
    rows = [header]
    metrics: list[tuple[str, Distribution | None]] = [
        ("TTFT", repeat.ttft_ms),
        ("TPOT", repeat.tpot_ms),
        ("ITL", repeat.itl_ms),
        ("E2E", repeat.latency_ms),
    ]
    for name, dist in metrics:
        if dist is None:
            rows.append(f"{name:<6}{'-':>9}{'-':>9}{'-':>9}{'-':>9}{'-':>9}{'-':>9}")
            continue
        values = [dist.mean, dist.std, dist.p(50.0), dist.p(90.0), dist.p(95.0), dist.p(99.0)]
        rows.append(f"{name:<6}" + "".join(f"{v:>9.2f}" for v in values))
    return rows


def render_table(
    repeats: Sequence[RepeatSummary],
    choice: RepeatChoice,
    *,
    endpoint: str,
    api: str,
    stream: bool,
    concurrency: int,
    request_rate: float | None,
    failure: str | None,
    adaptive: Sequence[Mapping[str, Any]] = (),
) -> str:
    """The end-of-run table: the kept repeat in full, then one line per repeat."""
    kept = repeats[choice.index]
    errors = ", ".join(f"{kind} {count}" for kind, count in kept.errors.items()) or "none"
    mode = "streaming" if stream else "non-streaming"
    rate = "as fast as concurrency allows" if request_rate is None else f"Poisson {request_rate:g} req/s"
    lines = [
        " kneepoint loadgen ".center(_WIDTH, "="),
        _row("Endpoint:", f"{endpoint}"),
        _row("API:", f"{api}, {mode}"),
        _row("Concurrency:", str(concurrency)),
        _row("Arrivals:", rate),
        _row("Repeats (kept):", f"{len(repeats)} (#{choice.index + 1}, spread {choice.spread * 100:.1f} %)"),
        _row("Successful requests:", str(kept.completed)),
        _row("Failed requests:", str(kept.failed)),
        _row("Errors by kind:", errors),
        _row("Duration (s):", _number(kept.duration, 3)),
        _row("Input tokens/request asked, served:", f"{kept.input_tokens.asked}, {_number(kept.input_tokens.served_median)}"),
        _row("Output tokens/request asked, served:", f"{kept.output_tokens.asked}, {_number(kept.output_tokens.served_median)}"),
        _row("Request throughput (req/s):", _number(kept.requests_per_second, 3)),
        _row("Output token throughput (tok/s):", _number(kept.output_tokens_per_second)),
        _row("Total token throughput (tok/s):", _number(kept.total_tokens_per_second)),
    ]
    if kept.goodput_requests_per_second is not None:
        lines.append(_row("Goodput (req/s):", _number(kept.goodput_requests_per_second, 3)))
    client = kept.client
    lines.append(
        _row(
            "Client (workers, CPU peak, lag P99):",
            f"{client.workers}, {client.cpu_peak:.2f} core, {client.loop_lag_p99_ms:.1f} ms",
        )
    )
    lines.append(_row("Client limited the run:", "YES" if client.limited else "no"))
    if client.limited and client.reason:
        lines.append(f"  {client.reason}")
    if adaptive:
        kept_stop = adaptive[choice.index]
        sent = f"{kept_stop['requestsSent']} of {kept_stop['requestsPlanned']} sent"
        lines.append(_row("Adaptive stop (kept repeat):", ("early, " if kept_stop["stoppedEarly"] else "full plan, ") + sent))
        lines.append(f"  {kept_stop['reason']}")
        for label, key in (("throughput (tok/s)", "outputTokensPerSecondInterval"), ("E2E P99 (ms)", "latencyP99MsInterval")):
            bounds = kept_stop.get(key)
            if bounds is not None:
                lines.append(f"  {label} {kept_stop['confidence']:.0%} interval: {bounds[0]:,.2f} .. {bounds[1]:,.2f}")
    lines.append(" Latency of the kept repeat ".center(_WIDTH, "-"))
    lines.extend(_latency_rows(kept))
    if len(repeats) > 1:
        lines.append(" Repeats ".center(_WIDTH, "-"))
        lines.append(f"{'#':<4}{'out tok/s':>12}{'req/s':>9}{'TTFT P50':>10}{'E2E P99':>10}{'failed':>8}{'client':>8}  ")
        for i, repeat in enumerate(repeats):
            ttft = repeat.ttft_ms.p(50.0) if repeat.ttft_ms else None
            e2e = repeat.latency_ms.p(99.0) if repeat.latency_ms else None
            mark = "kept" if i == choice.index else ""
            lines.append(
                f"{i + 1:<4}{repeat.output_tokens_per_second:>12.2f}{repeat.requests_per_second:>9.3f}"
                f"{_number(ttft):>10}{_number(e2e):>10}{repeat.failed:>8}{'LIMIT' if repeat.client.limited else 'ok':>8}  {mark}"
            )
    if failure:
        lines.append(f"FAILED: {failure}")
    lines.append("=" * _WIDTH)
    return "\n".join(lines)
