"""vLLM's Prometheus metrics (V1 engine, vLLM 0.33 names, types, labels and default buckets).

Observations land in small accumulators (a bisect and two additions per sample), cheap
enough to record every token of 20,000+ tokens per second; only a scrape builds metric
families from them, rendered by prometheus_client exactly as vLLM's own exporter renders
(counters as ``<name>_total`` plus a ``<name>_created`` gauge, labels sorted). Every engine
series carries ``model_name`` (the first served model name) and ``engine="0"``.

Not simulated, so not exported: prefix-cache, speculative-decoding, LoRA and
KV-transfer metrics. There is no simulator-only series: the share of step time in
collectives comes, as from real vLLM, from the profiler's traces (simulator/profiler.py).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from kneepoint.simulator.scheduler import ScheduledStep, SimRequest, StepOutcome

# Default buckets of vllm/v1/metrics (REFERENCE.md section 1).
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


def build_1_2_5_buckets(max_value: int) -> tuple[int, ...]:
    """1, 2, 5, 10, 20, 50, ... up to ``max_value`` (vLLM's token-count histogram buckets)."""
    out: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return tuple(out)
            out.append(value)
        exponent += 1


class Histogram:
    """A Prometheus-style histogram accumulator (``le`` buckets, sum, count)."""

    __slots__ = ("bounds", "counts", "created", "total")

    def __init__(self, bounds: Sequence[float], created: float) -> None:
        self.bounds = tuple(float(b) for b in bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0
        self.created = created

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, float]]:
        """``(le, cumulative count)`` pairs ending with ``+Inf``."""
        out, running = [], 0
        for bound, n in zip(self.bounds, self.counts):
            running += n
            out.append((_le(bound), float(running)))
        out.append(("+Inf", float(running + self.counts[-1])))
        return out


def _le(bound: float) -> str:
    # Bucket bounds as prometheus_client writes them (Go-style floats: 1.0, 0.001, 2560.0).
    return floatToGoString(bound)


class VllmMetrics:
    """Accumulates one engine's vLLM metrics and exposes them as a prometheus_client collector."""

    def __init__(
        self,
        model_name: str,
        *,
        max_model_len: int,
        cache_config: Mapping[str, str],
        gauges: Callable[[], Mapping[str, float]],
        created: float | None = None,
    ) -> None:
        self.model_name = model_name
        self.cache_config = dict(cache_config)
        self._gauges = gauges
        self.created = time.time() if created is None else created
        c = self.created
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.num_preemptions = 0
        self.request_success = dict.fromkeys(FINISHED_REASONS, 0)
        token_buckets = build_1_2_5_buckets(max_model_len)
        self.histograms: dict[str, tuple[str, Histogram]] = {
            "vllm:time_to_first_token_seconds": ("Histogram of time to first token in seconds.", Histogram(TTFT_BUCKETS, c)),
            "vllm:inter_token_latency_seconds": ("Histogram of inter-token latency in seconds.", Histogram(ITL_BUCKETS, c)),
            "vllm:request_time_per_output_token_seconds": (
                "Histogram of time_per_output_token_seconds per request.",
                Histogram(ITL_BUCKETS, c),
            ),
            "vllm:e2e_request_latency_seconds": ("Histogram of e2e request latency in seconds.", Histogram(REQUEST_LATENCY_BUCKETS, c)),
            "vllm:request_queue_time_seconds": (
                "Histogram of time spent in WAITING phase for request.",
                Histogram(REQUEST_LATENCY_BUCKETS, c),
            ),
            "vllm:request_inference_time_seconds": (
                "Histogram of time spent in RUNNING phase for request.",
                Histogram(REQUEST_LATENCY_BUCKETS, c),
            ),
            "vllm:request_prefill_time_seconds": (
                "Histogram of time spent in PREFILL phase for request.",
                Histogram(REQUEST_LATENCY_BUCKETS, c),
            ),
            "vllm:request_decode_time_seconds": (
                "Histogram of time spent in DECODE phase for request.",
                Histogram(REQUEST_LATENCY_BUCKETS, c),
            ),
            "vllm:request_prompt_tokens": ("Number of prefill tokens processed.", Histogram(token_buckets, c)),
            "vllm:request_generation_tokens": ("Number of generation tokens processed.", Histogram(token_buckets, c)),
            "vllm:request_params_max_tokens": ("Histogram of the max_tokens request parameter.", Histogram(token_buckets, c)),
            "vllm:iteration_tokens_total": ("Histogram of number of tokens per engine_step.", Histogram(ITERATION_TOKEN_BUCKETS, c)),
        }
        h = self.histograms
        self._ttft = h["vllm:time_to_first_token_seconds"][1]
        self._itl = h["vllm:inter_token_latency_seconds"][1]
        self._tpot = h["vllm:request_time_per_output_token_seconds"][1]
        self._e2e = h["vllm:e2e_request_latency_seconds"][1]
        self._queue = h["vllm:request_queue_time_seconds"][1]
        self._inference = h["vllm:request_inference_time_seconds"][1]
        self._prefill = h["vllm:request_prefill_time_seconds"][1]
        self._decode = h["vllm:request_decode_time_seconds"][1]
        self._req_prompt = h["vllm:request_prompt_tokens"][1]
        self._req_gen = h["vllm:request_generation_tokens"][1]
        self._max_tokens = h["vllm:request_params_max_tokens"][1]
        self._iteration = h["vllm:iteration_tokens_total"][1]

    # -- recording ---------------------------------------------------------------------------
    def record_step(self, step: ScheduledStep, outcome: StepOutcome) -> None:
        """Account one completed engine step."""
        self._iteration.observe(step.num_tokens)
        self.num_preemptions += len(step.preempted)
        self.generation_tokens += len(outcome.tokens)
        self.prompt_tokens += outcome.prompt_tokens
        observe_itl = self._itl.observe
        for gap in outcome.itls:
            observe_itl(gap)
        for req in outcome.first_tokens:
            # A request in first_tokens has both times set (Optional only before it is scheduled).
            self._ttft.observe(req.first_token_time - req.arrival_time)  # type: ignore[operator]
            self._queue.observe(req.first_scheduled_time - req.arrival_time)  # type: ignore[operator]
        for req in outcome.finished:
            self.record_finished(req)

    def record_finished(self, req: SimRequest) -> None:
        """Per-request histograms and the success counter of a request that ended normally."""
        first, scheduled, end = req.first_token_time, req.first_scheduled_time, req.finish_time
        assert first is not None and scheduled is not None and end is not None
        self.request_success[req.finish_reason] += 1
        self._e2e.observe(end - req.arrival_time)
        self._inference.observe(end - scheduled)
        self._prefill.observe(first - scheduled)
        self._decode.observe(end - first)
        if req.output_tokens > 1:
            self._tpot.observe((end - first) / (req.output_tokens - 1))
        self._req_prompt.observe(req.prompt_tokens)
        self._req_gen.observe(req.output_tokens)
        self._max_tokens.observe(req.max_tokens)

    def record_abort(self) -> None:
        """A request the client abandoned (counted as ``finished_reason="abort"``)."""
        self.request_success["abort"] += 1

    # -- exposition --------------------------------------------------------------------------
    def collect(self) -> Iterable[Metric]:
        """Metric families for prometheus_client (the collector protocol)."""
        labels = ["model_name", "engine"]
        values = [self.model_name, "0"]
        live = self._gauges()
        for name, doc, key in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.", "running"),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", "waiting"),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", "kv_cache_usage"),
        ):
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(values, float(live[key]))
            yield g
        for name, doc, value in (
            ("vllm:num_preemptions", "Cumulative number of preemption from the engine.", self.num_preemptions),
            ("vllm:prompt_tokens", "Number of prefill tokens processed.", self.prompt_tokens),
            ("vllm:generation_tokens", "Number of generation tokens processed.", self.generation_tokens),
        ):
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(values, float(value), created=self.created)
            yield c
        success = CounterMetricFamily(
            "vllm:request_success", "Count of successfully processed requests.", labels=labels + ["finished_reason"]
        )
        for reason, count in self.request_success.items():
            success.add_metric(values + [reason], float(count), created=self.created)
        yield success
        for name, (doc, hist) in self.histograms.items():
            fam = HistogramMetricFamily(name, doc, labels=labels)
            fam.add_metric(values, hist.cumulative(), hist.total)
            yield fam
            created = GaugeMetricFamily(f"{name}_created", doc, labels=labels)
            created.add_metric(values, hist.created)
            yield created
        info_labels = sorted(self.cache_config) + ["engine"]
        info = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", labels=info_labels)
        info.add_metric([self.cache_config[k] for k in sorted(self.cache_config)] + ["0"], 1.0)
        yield info

    def render(self) -> bytes:
        """The /metrics body (Prometheus text format 0.0.4)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Adapter(self))
        return generate_latest(registry)


class _Adapter(Collector):
    def __init__(self, metrics: VllmMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self._metrics.collect()
