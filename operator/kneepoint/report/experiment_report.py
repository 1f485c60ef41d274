"""The experiment report: what ``kneepoint report`` prints, as text, Markdown or JSON.

:func:`build_report` re-computes the decision with ``kneepoint.core.decision.decide``
from the tiers and the spec (the same function the operator calls), cross-checks it with
the decision the operator wrote into status, and gathers the KServe recommendation and
the GPU-minutes. The renderers only format that. The record table, comparison lines and
decision lines come from ``kneepoint.core.record_table`` so the report reads exactly like
``kneepoint decide`` and the operator's Decided event.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kneepoint.core.apifields import from_json, to_json
from kneepoint.core.decision import STATE_DECIDED, DecisionOutcome, decide
from kneepoint.core.record_table import RECORD_HEADERS, format_decision, format_record_table, record_row
from kneepoint.core.spec import ExperimentSpec
from kneepoint.core.status import ConcurrencySearch, Decision, Recommendation, TierResult
from kneepoint.core.stop_rules import BUDGET, tier_label
from kneepoint.kube import kserve
from kneepoint.report.chart_context import ChartContext

PLACEHOLDER_URIS = ("hf://unspecified/model",)
SIMULATED_BANNER = "SIMULATED: these numbers come from kneepoint's engine simulator, not from GPUs"


@dataclass(frozen=True)
class ReportInput:
    """A checked experiment, as the commands load it (file or cluster)."""

    spec: ExperimentSpec
    spec_given: bool
    tiers: tuple[TierResult, ...]
    status: Mapping[str, Any]
    status_decision: Decision | None = None
    recommendation: Recommendation | None = None
    name: str | None = None
    namespace: str | None = None
    source: str = "file"
    """file or cluster."""
    where: str = ""
    """The file name, or ``experiment NS/NAME``."""
    simulated: bool = False


@dataclass(frozen=True)
class KServeSummary:
    """The InferenceService the decision maps to, in numbers."""

    name: str | None
    tensor_parallel: int
    pipeline_parallel: int
    gpus_per_replica: int
    min_replicas: int
    max_replicas: int
    scale_metric: str
    scale_target: int
    config_map_name: str | None
    """The ConfigMap the operator published it in (status.recommendation), or None when computed here."""


@dataclass(frozen=True)
class ExperimentReport:
    """Everything the report shows."""

    input: ReportInput
    outcome: DecisionOutcome
    decision_matches_status: bool | None
    """None when status holds no decision to compare with."""
    notes: tuple[str, ...]
    kserve: KServeSummary | None
    kserve_unavailable: str | None
    """Why there is no KServe summary (not decided, no spec), when there is none."""
    gpu_minutes: tuple[tuple[str, float | None], ...]
    gpu_minutes_total: float | None
    gpu_minutes_total_source: str | None

    @property
    def decision(self) -> Decision | None:
        """The decision to show: re-computed, or the operator's when the tiers cannot reproduce one."""
        return self.outcome.decision or self.input.status_decision


def _short(decision: Decision) -> str:
    label = tier_label(TierResult(tensor_parallel=decision.tensor_parallel, pipeline_parallel=decision.pipeline_parallel))
    return f"{label} x {decision.replicas} replica{'s' if decision.replicas != 1 else ''}, rule {decision.rule}"


def _same_decision(a: Decision, b: Decision) -> bool:
    def key(d: Decision) -> tuple[int, int, int, str]:
        return d.tensor_parallel, d.pipeline_parallel, d.replicas, d.rule

    return key(a) == key(b)


def model_name(spec: ExperimentSpec, spec_given: bool) -> str | None:
    """The model as people name it (``meta-llama/Meta-Llama-3-70B``), or None without a spec."""
    if not spec_given or spec.model.uri in PLACEHOLDER_URIS:
        return None
    uri = spec.model.uri
    for scheme in ("hf://", "sim://"):
        if uri.startswith(scheme):
            return uri[len(scheme) :]
    return uri


def workload_text(spec: ExperimentSpec) -> str:
    load = spec.load
    return f"concurrency {load.concurrency}, {load.input_len} in / {load.output_len} out tokens"


def _kserve(inp: ReportInput, decision: Decision | None) -> tuple[KServeSummary | None, str | None]:
    if decision is None:
        return None, "none yet (the experiment is not decided)"
    if not inp.spec_given:
        return None, "needs the experiment's spec (model, engine, capacity); the input has none"
    if inp.recommendation and inp.recommendation.not_exportable:
        return None, inp.recommendation.not_exportable
    problem = kserve.export_problem(inp.spec, decision)
    if problem:
        return None, f"no InferenceService (the LeaderWorkerSet manifest deploys this tier): {problem}"
    planned = kserve.planned_scaling(inp.spec, decision)
    rec = inp.recommendation
    return (
        KServeSummary(
            name=kserve.isvc_name(inp.spec.served_model_name),
            tensor_parallel=decision.tensor_parallel,
            pipeline_parallel=decision.pipeline_parallel,
            gpus_per_replica=decision.gpus_per_replica,
            min_replicas=rec.min_replicas if rec else planned.min_replicas,
            max_replicas=rec.max_replicas if rec else planned.max_replicas,
            scale_metric=rec.scale_metric if rec else planned.scale_metric,
            scale_target=rec.scale_target if rec else planned.scale_target,
            config_map_name=rec.config_map_name if rec else None,
        ),
        None,
    )


def _gpu_minutes(inp: ReportInput) -> tuple[tuple[tuple[str, float | None], ...], float | None, str | None]:
    per_tier = tuple((tier_label(t), t.gpu_minutes) for t in inp.tiers)
    total = inp.status.get("gpuMinutesTotal")
    if isinstance(total, (int, float)) and not isinstance(total, bool):
        return per_tier, float(total), "status.gpuMinutesTotal"
    known = [m for _, m in per_tier if m is not None]
    if known:
        return per_tier, sum(known), "sum of the tiers"
    return per_tier, None, None


def build_report(inp: ReportInput) -> ExperimentReport:
    """Re-decide from the tiers and the spec, and compare with status.decision.

    A decision the operator made because the GPU-hour budget ran out (rule ``budget``)
    is re-computed the same way, as the operator itself does when it re-decides.
    Raises ValueError when the tiers are not in ladder order.
    """
    budget_stopped = inp.status_decision is not None and inp.status_decision.rule == BUDGET
    outcome = decide(inp.spec, inp.tiers, budget_stopped=budget_stopped, search=status_search(inp))
    notes: list[str] = []
    matches: bool | None = None
    theirs = inp.status_decision
    if theirs is not None:
        ours = outcome.decision
        matches = ours is not None and _same_decision(ours, theirs)
        if ours is None:
            notes.append(
                f"note: status.decision says {_short(theirs)}, but the tiers in status decide nothing ({outcome.message}); "
                "the report shows the operator's decision"
            )
        elif not matches:
            notes.append(
                f"note: status.decision ({_short(theirs)}) differs from the decision re-computed from status.tiers "
                f"and the spec ({_short(ours)}); the spec's stop rules or capacity may have changed after the operator decided"
            )
    decision = outcome.decision or theirs
    kserve, unavailable = _kserve(inp, decision)
    per_tier, total, source = _gpu_minutes(inp)
    return ExperimentReport(inp, outcome, matches, tuple(notes), kserve, unavailable, per_tier, total, source)


def status_search(inp: ReportInput) -> ConcurrencySearch | None:
    """status.concurrencySearch, as the operator wrote it (its points decide the per-replica concurrency)."""
    raw = inp.status.get("concurrencySearch")
    search: ConcurrencySearch | None = from_json(ConcurrencySearch, raw) if isinstance(raw, Mapping) else None
    return search


def chart_context(inp: ReportInput) -> ChartContext:
    """Title and reference lines for the knee chart."""
    slo = inp.spec.capacity.slo.latency_p99_ms if inp.spec_given else None
    ttft = inp.spec.capacity.slo.ttft_p95_ms if inp.spec_given else None
    return ChartContext(
        slo_ttft_p95_ms=float(ttft) if ttft else None,
        model=model_name(inp.spec, inp.spec_given) or inp.name,
        gpu_product=inp.spec.placement.gpu_product if inp.spec_given else None,
        workload=workload_text(inp.spec) if inp.spec_given else None,
        slo_latency_p99_ms=float(slo) if slo else None,
        simulated=inp.simulated,
    )


# --------------------------------------------------------------------------------------
# Lines shared by text and Markdown


def identity_line(inp: ReportInput) -> str:
    name = f"{inp.namespace}/{inp.name}" if inp.name and inp.namespace else (inp.name or "(unnamed)")
    source = f"file {inp.where}" if inp.source == "file" else f"cluster, {inp.where}"
    return f"experiment {name} ({source})"


def context_lines(inp: ReportInput) -> list[str]:
    lines = []
    if inp.spec_given:
        model = model_name(inp.spec, inp.spec_given) or "(no model)"
        gpu = inp.spec.placement.gpu_product or "any GPU"
        lines.append(f"model {model} ({inp.spec.model.dtype}) on {gpu}; mode {inp.spec.mode}; workload {workload_text(inp.spec)}")
    phase = inp.status.get("phase")
    if phase:
        current = inp.status.get("currentTier")
        lines.append(
            f"phase {phase}"
            + (f"; current tier {current}" if current else "")
            + (f"; {inp.status['message']}" if inp.status.get("message") else "")
        )
    return lines


def stop_rules_line(inp: ReportInput) -> str:
    r = inp.spec.stop_rules
    source = "from the spec" if inp.spec_given else "defaults, the input has no spec"
    return (
        f"stop rules ({source}): memoryHeadroom {r.memory_headroom:g}, minThroughputGain {r.min_throughput_gain:g}, "
        f"maxP99Degradation {r.max_p99_degradation:g}, maxCommFraction {r.max_comm_fraction:g}"
    )


def decision_block(report: ExperimentReport) -> str:
    outcome = report.outcome
    if outcome.state == STATE_DECIDED and outcome.decision is not None:
        text = format_decision(outcome.decision, outcome.capacity.explanation if outcome.capacity else None)
    elif report.input.status_decision is not None:
        text = "decision (from status; the tiers do not reproduce it):\n" + format_decision(report.input.status_decision)
    else:
        text = f"decision: none ({outcome.message})"
    if report.decision_matches_status:
        text += "\ncross-check: status.decision agrees"
    return "\n".join([text, *report.notes])


def kserve_line(report: ExperimentReport, export_hint: str | None = None) -> str:
    k = report.kserve
    if k is None:
        return f"KServe recommendation: {report.kserve_unavailable}"
    where = f"published in ConfigMap {k.config_map_name}" if k.config_map_name else "computed here; the operator publishes it once Decided"
    shape = f"{k.gpus_per_replica} GPU{'s' if k.gpus_per_replica != 1 else ''} per replica"
    if k.pipeline_parallel > 1:
        shape += f" (TP{k.tensor_parallel} on each of {k.pipeline_parallel} nodes)"
    text = (
        f"KServe recommendation ({where}): InferenceService {k.name}, {shape}, minReplicas {k.min_replicas}, "
        f"maxReplicas {k.max_replicas}, "
        + (
            f"scaling on {k.scale_metric} at {k.scale_target} per replica"
            if k.scale_metric != "none"
            else "fixed replicas (multi-node: autoscalerClass none)"
        )
    )
    if export_hint:
        text += f"; `{export_hint}` prints it"
    return text


def search_lines(report: ExperimentReport) -> list[str]:
    """The concurrency search's curve (decision.concurrencyCurve), one line per point, and how it ended."""
    decision = report.decision
    search = status_search(report.input)
    if decision is None or not decision.concurrency_curve:
        return []
    head = f"concurrency search on {tier_label(TierResult(tensor_parallel=decision.tensor_parallel, pipeline_parallel=decision.pipeline_parallel))}"
    if search is not None:
        head += f" (--max-num-seqs {search.max_num_seqs}, KV pool bound {search.kv_cache_bound if search.kv_cache_bound else 'unknown'}"
        head += f", {search.gpu_minutes:.1f} GPU-min)" if search.gpu_minutes is not None else ")"
    lines = [head + ":", f"  {'concurrency':>11}  {'tok/s':>7}  {'TTFT P95 ms':>11}  {'P99 ms':>7}  SLO"]
    for p in decision.concurrency_curve:
        verdict = "-" if p.slo_met is None else ("met" if p.slo_met else "missed")
        mark = "  <- per replica" if p.concurrency == decision.per_replica_concurrency else ""
        lines.append(
            f"  {p.concurrency:>11}  {p.output_tokens_per_second or 0:>7.0f}  {p.ttft_p95_ms or 0:>11.0f}  {p.latency_p99_ms or 0:>7.0f}  "
            f"{verdict}{' (ladder)' if p.source == 'ladder' else ''}{mark}"
        )
    if search is not None and search.stopped:
        lines.append(f"  stopped early: {search.stopped}")
    return lines


def alternatives_lines(report: ExperimentReport) -> list[str]:
    """Every measured tier sized for the peak at its own SLO concurrency, cheapest first (decision.alternatives)."""
    decision = report.decision
    if decision is None or not decision.alternatives:
        return []
    lines = ["ranked alternatives (each tier at its own per-replica concurrency at the SLO):"]
    for a in decision.alternatives:
        cost = "-" if a.cost_per_million_tokens is None else f"{a.cost_per_million_tokens:.3f}/M tok"
        lines.append(
            f"  {a.rank}. {a.tier}: {a.per_replica_concurrency} per replica ({a.per_replica_concurrency_source}), "
            f"{a.replicas} replicas = {a.total_gpus} GPUs, {cost}{'  <- decided' if a.decided else ''}"
        )
    return lines


def gpu_minutes_line(report: ExperimentReport) -> str:
    if report.gpu_minutes_total is None:
        return "GPU-minutes: not recorded (no tier carries gpuMinutes and status has no gpuMinutesTotal)"
    per = ", ".join(f"{label} {'-' if m is None else f'{m:.1f}'}" for label, m in report.gpu_minutes)
    total = report.gpu_minutes_total
    return f"GPU-minutes: {per}; total {total:.1f} GPU-min = {total / 60:.2f} GPU-h ({report.gpu_minutes_total_source})"


# --------------------------------------------------------------------------------------
# Renderers


def render_text(report: ExperimentReport, chart_path: str | None = None, export_hint: str | None = None) -> str:
    """The plain-text report (no terminal control codes)."""
    inp = report.input
    parts = [identity_line(inp)]
    if inp.simulated:
        parts.append(SIMULATED_BANNER)
    parts += context_lines(inp)
    parts += [stop_rules_line(inp), "", format_record_table(report.outcome.tiers), ""]
    if report.outcome.comparisons:
        parts += ["\n\n".join(report.outcome.comparisons), ""]
    parts += [decision_block(report), ""]
    extra = search_lines(report) + alternatives_lines(report)
    if extra:
        parts += [*extra, ""]
    parts += [kserve_line(report, export_hint), gpu_minutes_line(report)]
    if inp.simulated:
        parts.append(SIMULATED_BANNER)
    if chart_path:
        parts.append(f"chart: {chart_path}")
    return "\n".join(parts)


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|") or " "


def render_markdown(report: ExperimentReport, chart_path: str | None = None, export_hint: str | None = None) -> str:
    """The report as GitHub Markdown: a real table for the record, code blocks for the rule lines."""
    inp = report.input
    lines = [f"## {identity_line(inp)}", ""]
    if inp.simulated:
        lines += [f"**{SIMULATED_BANNER}.**", ""]
    lines += [f"- {line}" for line in [*context_lines(inp), stop_rules_line(inp)]]
    lines += ["", "| " + " | ".join(RECORD_HEADERS) + " |", "|" + "|".join("---" for _ in RECORD_HEADERS) + "|"]
    lines += ["| " + " | ".join(_md_cell(c) for c in record_row(t)) + " |" for t in report.outcome.tiers]
    if report.outcome.comparisons:
        lines += ["", "### Comparisons", "", "```text", "\n\n".join(report.outcome.comparisons), "```"]
    lines += ["", "### Decision", "", "```text", decision_block(report), "```", ""]
    extra = search_lines(report) + alternatives_lines(report)
    if extra:
        lines += ["```text", *extra, "```", ""]
    lines += [f"- {kserve_line(report, export_hint)}", f"- {gpu_minutes_line(report)}"]
    if chart_path:
        lines += ["", f"![throughput and P99 per tier, knee marked]({chart_path})"]
    return "\n".join(lines)


def report_json(report: ExperimentReport, chart_path: str | None = None) -> dict[str, Any]:
    """The report as one JSON-ready mapping (camelCase, like the status)."""
    inp = report.input
    k = report.kserve
    return {
        "experiment": {"name": inp.name, "namespace": inp.namespace, "source": inp.source, "where": inp.where},
        "model": model_name(inp.spec, inp.spec_given),
        "gpuProduct": inp.spec.placement.gpu_product if inp.spec_given else None,
        "mode": inp.spec.mode if inp.spec_given else None,
        "phase": inp.status.get("phase"),
        "message": inp.status.get("message"),
        "simulated": inp.simulated,
        "tiers": [to_json(t) for t in report.outcome.tiers],
        "comparisons": list(report.outcome.comparisons),
        "state": report.outcome.state,
        "stateMessage": report.outcome.message,
        "decision": to_json(report.decision) if report.decision else None,
        "statusDecision": to_json(inp.status_decision) if inp.status_decision else None,
        "decisionMatchesStatus": report.decision_matches_status,
        "notes": list(report.notes),
        "kserve": None
        if k is None
        else {
            "inferenceServiceName": k.name,
            "tensorParallel": k.tensor_parallel,
            "pipelineParallel": k.pipeline_parallel,
            "gpusPerReplica": k.gpus_per_replica,
            "minReplicas": k.min_replicas,
            "maxReplicas": k.max_replicas,
            "scaleMetric": k.scale_metric,
            "scaleTarget": k.scale_target,
            "configMapName": k.config_map_name,
        },
        "gpuMinutes": {
            "perTier": dict(report.gpu_minutes),
            "total": report.gpu_minutes_total,
            "totalSource": report.gpu_minutes_total_source,
        },
        "chart": chart_path,
    }
