"""From raw request records to results: per-repeat statistics, the kept repeat, the summaries.

Pure: everything here is a function of records and numbers. It produces
- ``RepeatSummary`` per repeat (throughput over the repeat's wall duration, latency
  distributions, errors by kind, goodput under optional SLOs, client self-monitoring);
- the choice of the kept repeat (``select_repeat``, rule below);
- the compact termination-message summary of CONTRACTS A, kept under 4096 bytes;
- the ``--save-json`` document (the same summary plus every repeat and request).

Repeat rule: among repeats whose error fraction is within ``--max-error-fraction`` and that
completed something (all repeats if none did), keep the median repeat by output tokens/s;
with an even count, the lower of the two middle ones (the conservative choice for capacity
planning); equal values go to the earlier repeat. The median is robust to one outlier
repeat (a cold cache, a noisy neighbour), and the kept repeat is a real run whose
latencies belong to its throughput, not an average of runs. The spread
(max - min) / median of the same repeats is reported.
"""

from __future__ import annotations

import json
import statistics as _stdlib_statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kneepoint.core.timestamps import rfc3339
from kneepoint.loadgen.records import ERROR_KINDS, RequestRecord
from kneepoint.loadgen.statistics import Distribution, describe, percentile

SUMMARY_VERSION = 1
TERMINATION_MESSAGE_LIMIT = 4096  # bytes; the kubelet truncates longer messages
REPEAT_RULE = "lower-median-output-tokens-per-second"

# Self-monitoring defaults (flags --client-cpu-limit and --max-loop-lag-ms override them).
DEFAULT_CPU_LIMIT = 0.9  # median CPU of one worker process, in cores
DEFAULT_LOOP_LAG_LIMIT_MS = 25.0  # P99 event-loop lag


@dataclass(frozen=True)
class SLOs:
    """Goodput service-level objectives in milliseconds (vLLM bench's --goodput keys)."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2el_ms))

    def met_by(self, record: RequestRecord) -> bool:
        """True when a successful request meets every set SLO (TPOT of a 1-token output is 0)."""
        if not record.ok:
            return False
        if self.ttft_ms is not None and (record.ttft is None or record.ttft * 1000.0 > self.ttft_ms):
            return False
        if self.tpot_ms is not None and (record.tpot or 0.0) * 1000.0 > self.tpot_ms:
            return False
        if self.e2el_ms is not None and (record.latency is None or record.latency * 1000.0 > self.e2el_ms):
            return False
        return True

    def to_json(self) -> dict[str, float]:
        return {k: v for k, v in (("ttft", self.ttft_ms), ("tpot", self.tpot_ms), ("e2el", self.e2el_ms)) if v is not None}


def parse_slos(values: Iterable[str]) -> SLOs:
    """``["ttft:500", "tpot:50"]`` -> SLOs. ValueError names the bad entry and the keys."""
    limits: dict[str, float] = {}
    for entry in values:
        for part in entry.replace(",", " ").split():
            key, colon, number = part.partition(":")
            if key not in ("ttft", "tpot", "e2el") or not colon:
                raise ValueError(f"--goodput {part!r}: expected KEY:MS with KEY one of ttft, tpot, e2el")
            try:
                limit = float(number)
            except ValueError:
                raise ValueError(f"--goodput {part!r}: MS must be a number of milliseconds > 0") from None
            if not limit > 0:
                raise ValueError(f"--goodput {part!r}: MS must be a number of milliseconds > 0")
            limits[key] = limit
    return SLOs(limits.get("ttft"), limits.get("tpot"), limits.get("e2el"))


@dataclass(frozen=True)
class ClientLoad:
    """How hard the load generator itself worked during one phase."""

    workers: int
    cpu_peak: float
    """Highest CPU sample of any worker process, in cores (1.0 = one core busy)."""
    cpu_median: float
    """Highest per-worker median CPU, in cores."""
    loop_lag_p99_ms: float
    limited: bool
    reason: str | None = None


def judge_client_load(
    cpu_samples: Sequence[Sequence[float]],
    lag_samples_ms: Sequence[float],
    cpu_limit: float = DEFAULT_CPU_LIMIT,
    lag_limit_ms: float = DEFAULT_LOOP_LAG_LIMIT_MS,
) -> ClientLoad:
    """Decide whether the client limited the run.

    ``cpu_samples`` holds one list per worker process (cores). A process is saturated when
    its median sample reaches ``cpu_limit``: one asyncio loop cannot use more than one core,
    so a process at ~1 core queues callbacks and every timestamp it takes is late. Event-loop
    lag (how late a timer fires) shows the same delay directly; its P99 above
    ``lag_limit_ms`` also marks the run client-limited.
    """
    peaks = [max(s) for s in cpu_samples if s]
    medians = [percentile(s, 50.0) for s in cpu_samples if s]
    cpu_peak = max(peaks, default=0.0)
    cpu_median = max(medians, default=0.0)
    lag_p99 = percentile(lag_samples_ms, 99.0) if lag_samples_ms else 0.0
    reasons = []
    if cpu_median >= cpu_limit:
        reasons.append(f"a worker's median CPU {cpu_median:.2f} core >= {cpu_limit:.2f}")
    if lag_p99 > lag_limit_ms:
        reasons.append(f"event-loop lag P99 {lag_p99:.1f} ms > {lag_limit_ms:.1f} ms")
    return ClientLoad(
        workers=len(cpu_samples),
        cpu_peak=cpu_peak,
        cpu_median=cpu_median,
        loop_lag_p99_ms=lag_p99,
        limited=bool(reasons),
        reason="; ".join(reasons) or None,
    )


@dataclass(frozen=True)
class TokenCounts:
    """Per-request token counts of completed requests: asked, and served (server's usage)."""

    asked: int
    served_median: int | None
    served_min: int | None
    served_max: int | None
    served_total: int


def _token_counts(asked: int, served: Sequence[int]) -> TokenCounts:
    if not served:
        return TokenCounts(asked, None, None, None, 0)
    return TokenCounts(asked, _stdlib_statistics.median_low(served), min(served), max(served), sum(served))


@dataclass(frozen=True)
class RepeatSummary:
    """Results of one measured repeat."""

    name: str
    requests: int
    completed: int
    failed: int
    errors: dict[str, int]
    first_errors: dict[str, str]
    """The first message seen for each error kind."""
    started_at: float | None
    finished_at: float | None
    duration: float
    """Seconds from the first request's start to the last request's end."""
    requests_per_second: float
    output_tokens_per_second: float
    total_tokens_per_second: float
    goodput_requests_per_second: float | None
    ttft_ms: Distribution | None
    tpot_ms: Distribution | None
    itl_ms: Distribution | None
    latency_ms: Distribution | None
    input_tokens: TokenCounts
    output_tokens: TokenCounts
    input_tokens_local_mismatch: int
    """Prompts the local tokenizer could not bring to the exact asked length."""
    output_tokens_estimated: int
    """Completed requests whose output count came from chunks, not usage."""
    client: ClientLoad

    @property
    def error_fraction(self) -> float:
        return self.failed / self.requests if self.requests else 1.0


def summarize_repeat(
    name: str,
    records: Sequence[RequestRecord],
    client: ClientLoad,
    input_tokens_asked: int,
    output_tokens_asked: int,
    slos: SLOs | None = None,
    input_tokens_local: Sequence[int | None] = (),
) -> RepeatSummary:
    """Aggregate one repeat's records (throughputs use the repeat's wall duration)."""
    done = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    errors = Counter(r.error or "" for r in failed)  # a failed record always names its error kind
    first_errors: dict[str, str] = {}
    for record in sorted(failed, key=lambda r: r.start):
        if record.error is not None and record.error not in first_errors:
            first_errors[record.error] = (record.message or "")[:200]
    starts = [r.start for r in records]
    ends = [r.end for r in records if r.end is not None]
    started_at = min(starts) if starts else None
    finished_at = max(ends) if ends else None
    duration = (finished_at - started_at) if started_at is not None and finished_at is not None else 0.0
    out_served = [r.output_tokens or 0 for r in done]
    in_served = [r.input_tokens for r in done if r.input_tokens is not None]
    # Requests without usage.prompt_tokens count as the asked length in the total.
    in_total = sum(r.input_tokens if r.input_tokens is not None else r.input_tokens_asked for r in done)

    def per_second(amount: float) -> float:
        return amount / duration if duration > 0 else 0.0

    goodput = None
    if slos is not None and slos.any:
        goodput = per_second(sum(1 for r in done if slos.met_by(r)))
    return RepeatSummary(
        name=name,
        requests=len(records),
        completed=len(done),
        failed=len(failed),
        errors={kind: errors[kind] for kind in sorted(errors, key=_kind_order)},
        first_errors=first_errors,
        started_at=started_at,
        finished_at=finished_at,
        duration=duration,
        requests_per_second=per_second(len(done)),
        output_tokens_per_second=per_second(sum(out_served)),
        total_tokens_per_second=per_second(sum(out_served) + in_total),
        goodput_requests_per_second=goodput,
        ttft_ms=describe([r.ttft * 1000.0 for r in done if r.ttft is not None]),
        tpot_ms=describe([t * 1000.0 for r in done if (t := r.tpot) is not None]),
        itl_ms=describe([gap * 1000.0 for r in done for gap in r.itl]),
        latency_ms=describe([r.latency * 1000.0 for r in done if r.latency is not None]),
        input_tokens=_token_counts(input_tokens_asked, in_served),
        output_tokens=_token_counts(output_tokens_asked, out_served),
        input_tokens_local_mismatch=sum(1 for n in input_tokens_local if n is not None and n != input_tokens_asked),
        output_tokens_estimated=sum(1 for r in done if not r.output_tokens_from_usage),
        client=client,
    )


def _kind_order(kind: str | None) -> tuple[int, str]:
    return (ERROR_KINDS.index(kind) if kind in ERROR_KINDS else len(ERROR_KINDS), kind or "")


@dataclass(frozen=True)
class RepeatChoice:
    """Which repeat is kept and how far apart the candidate repeats were."""

    index: int
    candidates: tuple[int, ...]
    median_output_tokens_per_second: float
    spread: float
    """(max - min) / median of the candidates' output tokens/s; 0 with one candidate."""
    rule: str = REPEAT_RULE


def select_repeat(repeats: Sequence[RepeatSummary], max_error_fraction: float) -> RepeatChoice:
    """Apply the repeat rule (module docstring). ValueError when there are no repeats."""
    if not repeats:
        raise ValueError("no repeats to choose from")
    candidates = [i for i, r in enumerate(repeats) if r.completed and r.error_fraction <= max_error_fraction]
    if not candidates:
        candidates = list(range(len(repeats)))
    values = [repeats[i].output_tokens_per_second for i in candidates]
    lower_median = _stdlib_statistics.median_low(values)
    kept = min(i for i in candidates if repeats[i].output_tokens_per_second == lower_median)
    middle = _stdlib_statistics.median(values)
    spread = (max(values) - min(values)) / middle if middle > 0 else 0.0
    return RepeatChoice(kept, tuple(candidates), middle, spread)


def _stamp(epoch_seconds: float | None) -> str | None:
    """The summary's timestamps carry milliseconds (``2026-01-02T03:04:05.678Z``)."""
    return None if epoch_seconds is None else rfc3339(epoch_seconds, 3)


def failure_line(repeat: RepeatSummary, max_error_fraction: float) -> str | None:
    """One line saying why the run failed, or None when it did not."""
    if repeat.requests and repeat.completed and repeat.error_fraction <= max_error_fraction:
        return None
    if not repeat.requests:
        return "no request was sent"
    kinds = ", ".join(f"{kind} {count}" for kind, count in repeat.errors.items())
    first_kind = next(iter(repeat.errors), None)
    detail = f"; first {first_kind}: {repeat.first_errors.get(first_kind, '')}" if first_kind else ""
    text = (
        f"{repeat.failed} of {repeat.requests} requests failed "
        f"(error fraction {repeat.error_fraction:.2f} > --max-error-fraction {max_error_fraction:g}): {kinds}{detail}"
    )
    return " ".join(text.split())[:400]


def _ms(distribution: Distribution | None, attribute: str | float) -> float | None:
    if distribution is None:
        return None
    value = getattr(distribution, attribute) if isinstance(attribute, str) else distribution.p(attribute)
    return round(value, 3)


def build_summary(
    repeats: Sequence[RepeatSummary],
    choice: RepeatChoice,
    concurrency: int,
    max_error_fraction: float,
    adaptive: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The CONTRACTS A object for the kept repeat (full size; see ``fit_termination_message``).

    ``adaptive`` (``adaptive.adaptive_json`` of the kept repeat, with --adaptive) is added as is.
    """
    kept = repeats[choice.index]
    error = failure_line(kept, max_error_fraction)
    summary: dict[str, Any] = {"v": SUMMARY_VERSION, "ok": error is None}
    if error is not None:
        summary["error"] = error
    summary.update(
        {
            "outputTokensPerSecond": round(kept.output_tokens_per_second, 3),
            "totalTokensPerSecond": round(kept.total_tokens_per_second, 3),
            "requestsPerSecond": round(kept.requests_per_second, 4),
            "ttftP50Ms": _ms(kept.ttft_ms, 50.0),
            "ttftP90Ms": _ms(kept.ttft_ms, 90.0),
            "ttftP95Ms": _ms(kept.ttft_ms, 95.0),
            "ttftP99Ms": _ms(kept.ttft_ms, 99.0),
            "ttftMeanMs": _ms(kept.ttft_ms, "mean"),
            "tpotMeanMs": _ms(kept.tpot_ms, "mean"),
            "tpotP99Ms": _ms(kept.tpot_ms, 99.0),
            "itlP99Ms": _ms(kept.itl_ms, 99.0),
            "latencyP50Ms": _ms(kept.latency_ms, 50.0),
            "latencyP90Ms": _ms(kept.latency_ms, 90.0),
            "latencyP95Ms": _ms(kept.latency_ms, 95.0),
            "latencyP99Ms": _ms(kept.latency_ms, 99.0),
            "latencyMeanMs": _ms(kept.latency_ms, "mean"),
            "completed": kept.completed,
            "failed": kept.failed,
            "errorFraction": round(kept.error_fraction, 4),
            "errors": dict(kept.errors),
            "inputTokensAsked": kept.input_tokens.asked,
            "inputTokensServed": kept.input_tokens.served_median,
            "outputTokensAsked": kept.output_tokens.asked,
            "outputTokensServed": kept.output_tokens.served_median,
            "concurrency": concurrency,
            "repeats": len(repeats),
            "keptRepeat": choice.index,
            "repeatOutputTokensPerSecond": [round(r.output_tokens_per_second, 2) for r in repeats],
            "clientLimited": kept.client.limited,
            "clientCpuPeak": round(kept.client.cpu_peak, 3),
            "loopLagP99Ms": round(kept.client.loop_lag_p99_ms, 3),
            "startedAt": _stamp(kept.started_at),
            "finishedAt": _stamp(kept.finished_at),
            "durationSeconds": round(kept.duration, 3),
        }
    )
    if kept.goodput_requests_per_second is not None:
        summary["goodputRequestsPerSecond"] = round(kept.goodput_requests_per_second, 4)
    if adaptive is not None:
        summary["adaptive"] = adaptive
    return summary


def _encode(summary: dict[str, Any]) -> str:
    return json.dumps(summary, separators=(",", ":"), ensure_ascii=False)


def fit_termination_message(summary: dict[str, Any], limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
    """Compact JSON of ``summary`` that is < ``limit`` bytes in UTF-8.

    Shrinks, in order, only what can grow: error kinds beyond the largest are folded into
    ``"more"``, the per-repeat list keeps its head and the kept repeat's value, then the
    error line is cut. The numeric fields of the contract are never dropped.
    """
    data = dict(summary)
    text = _encode(data)
    if len(text.encode()) < limit:
        return text
    errors = dict(data.get("errors") or {})
    ranked = sorted(errors.items(), key=lambda item: (-item[1], item[0]))
    keep = len(ranked)
    while len(text.encode()) >= limit and keep > 1:
        keep -= 1
        folded = dict(ranked[:keep])
        folded["more"] = sum(count for _, count in ranked[keep:])
        data["errors"] = folded
        text = _encode(data)
    per_repeat = list(data.get("repeatOutputTokensPerSecond") or [])
    while len(text.encode()) >= limit and len(per_repeat) > 1:
        per_repeat = per_repeat[: max(1, len(per_repeat) // 2)]
        data["repeatOutputTokensPerSecond"] = per_repeat
        text = _encode(data)
    if len(text.encode()) >= limit and isinstance(data.get("error"), str):
        excess = len(text.encode()) - limit + 4
        data["error"] = data["error"].encode()[: max(0, len(data["error"].encode()) - excess)].decode("utf-8", "ignore")
        text = _encode(data)
    if len(text.encode()) >= limit:
        raise ValueError(f"summary does not fit in {limit} bytes")
    return text


def distribution_json(distribution: Distribution | None) -> dict[str, Any] | None:
    """mean/std/min/max/pNN of one latency (ms), for --save-json."""
    if distribution is None:
        return None
    data: dict[str, Any] = {
        "count": distribution.count,
        "mean": round(distribution.mean, 3),
        "std": round(distribution.std, 3),
        "min": round(distribution.minimum, 3),
        "max": round(distribution.maximum, 3),
    }
    data.update({f"p{p:g}": round(v, 3) for p, v in distribution.percentiles.items()})
    return data


def repeat_json(repeat: RepeatSummary) -> dict[str, Any]:
    """Every number of one repeat, for --save-json."""
    return {
        "name": repeat.name,
        "requests": repeat.requests,
        "completed": repeat.completed,
        "failed": repeat.failed,
        "errorFraction": round(repeat.error_fraction, 4),
        "errors": repeat.errors,
        "firstErrors": repeat.first_errors,
        "startedAt": _stamp(repeat.started_at),
        "finishedAt": _stamp(repeat.finished_at),
        "durationSeconds": round(repeat.duration, 4),
        "requestsPerSecond": round(repeat.requests_per_second, 4),
        "outputTokensPerSecond": round(repeat.output_tokens_per_second, 3),
        "totalTokensPerSecond": round(repeat.total_tokens_per_second, 3),
        "goodputRequestsPerSecond": None if repeat.goodput_requests_per_second is None else round(repeat.goodput_requests_per_second, 4),
        "ttftMs": distribution_json(repeat.ttft_ms),
        "tpotMs": distribution_json(repeat.tpot_ms),
        "itlMs": distribution_json(repeat.itl_ms),
        "latencyMs": distribution_json(repeat.latency_ms),
        "inputTokens": _tokens_json(repeat.input_tokens),
        "outputTokens": _tokens_json(repeat.output_tokens),
        "inputTokensLocalMismatch": repeat.input_tokens_local_mismatch,
        "outputTokensEstimated": repeat.output_tokens_estimated,
        "client": {
            "workers": repeat.client.workers,
            "cpuPeak": round(repeat.client.cpu_peak, 3),
            "cpuMedian": round(repeat.client.cpu_median, 3),
            "loopLagP99Ms": round(repeat.client.loop_lag_p99_ms, 3),
            "limited": repeat.client.limited,
            "reason": repeat.client.reason,
        },
    }


def _tokens_json(tokens: TokenCounts) -> dict[str, Any]:
    return {
        "asked": tokens.asked,
        "servedMedian": tokens.served_median,
        "servedMin": tokens.served_min,
        "servedMax": tokens.served_max,
        "servedTotal": tokens.served_total,
    }


@dataclass
class SavedRun:
    """What ``--save-json`` writes: config, summary, repeats and every request."""

    config: dict[str, Any]
    summary: dict[str, Any]
    choice: RepeatChoice
    repeats: Sequence[RepeatSummary]
    records: Sequence[Sequence[RequestRecord]] = field(default_factory=list)
    adaptive: Sequence[dict[str, Any]] = field(default_factory=list)
    """Per repeat with --adaptive."""

    def to_json(self) -> dict[str, Any]:
        """The document (the summary object is CONTRACTS A, untruncated)."""
        return {
            "summary": self.summary,
            "config": self.config,
            "repeatRule": {
                "rule": self.choice.rule,
                "candidates": list(self.choice.candidates),
                "medianOutputTokensPerSecond": round(self.choice.median_output_tokens_per_second, 3),
                "spread": round(self.choice.spread, 4),
            },
            "repeats": [
                dict(repeat_json(r), adaptive=self.adaptive[i]) if i < len(self.adaptive) else repeat_json(r)
                for i, r in enumerate(self.repeats)
            ],
            "requests": [dict(record.to_json(), repeat=i) for i, records in enumerate(self.records) for record in records],
        }
