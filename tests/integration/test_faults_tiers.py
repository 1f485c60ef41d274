"""Faults inside one tier: the engine, the load test and Prometheus fail; the user sees why.

Every case is one experiment in its own namespace; all of them run at once (a module
fixture applies them together and samples their status every second until each is Decided
or Failed), so the module costs as long as its slowest case, not their sum.

| case | fault injected | the user must see |
|---|---|---|
| oom | `--gpu-memory-utilization 0.12` in engine.extraArgs: the 8B model fits the estimate but not the engine's budget at TP1 (the simulator prints vLLM's "No available memory for the cache blocks" and exits 1) | TP1 Failed, doesNotFit, event TierOutOfMemory; the ladder goes on; TP2 Measured and Decided |
| crashloop | `--block-size 7` in engine.extraArgs (the engine refuses it: exit 2, every restart) | TP1 Failed with TierStartFailed "CrashLoopBackOff after 3 restarts" and the engine's own error line; Failed, NoDecision |
| neverready | `KNEEPOINT_SIM_MODEL_LOAD_SECONDS=3600` in engine.env, tierTimeoutSeconds 10 | both tiers Failed "not Ready within 10 s"; Failed, NoDecision |
| unschedulable | the only L40S node is tainted NoSchedule (the experiment has no toleration) | TP1 Failed with TierUnschedulable and the scheduler's message |
| loadfail | `KNEEPOINT_SIM_FAIL_FRACTION=1` (every request answered 500), maxAttempts 2 | LoadTestRetried, then TP1 Failed "load test failed after 2 attempt(s)" naming the errors |
| partial | `KNEEPOINT_SIM_FAIL_FRACTION=0.3`, load.maxErrorFraction 0.1, maxAttempts 3 | two retries, then Failed naming the error fraction and the threshold |
| tolerated | `KNEEPOINT_SIM_FAIL_FRACTION=0.05`, load.maxErrorFraction 0.25 | Measured with its errorFraction; Decided |
| promdown | spec.metrics.prometheusUrl is a closed loopback port (this case and the next run under an operator whose metrics deadline is 30 s) | MetricsAvailable False / PrometheusUnreachable while it retries with growing gaps; after the deadline the tier is Measured with every metric listed missing and the decision lists the rules it could not evaluate |
| promempty | spec.metrics.prometheusUrl is a second, empty Prometheus (no series at all) | MetricsAvailable False / MetricsMissing naming the metrics; the same ending |

After each case: no child left (Deployments, Services, Jobs, pods) and no GPU held.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pytest
import yaml
from conftest import OperatorProcess
from experiment_api import Cluster, condition, experiment, is_finished, tier
from fault_harness import ChildLedger, FaultLog, session_namespace

from kneepoint.sandbox import binaries

# The Prometheus cases run under an operator of their own whose metrics deadline is 30 s
# (the session operator's is 60 s, tests/integration/conftest.py): the same code path, half
# the wait.
METRICS_DEADLINE = 30
TAINT = {"key": "kneepoint.io/fault-test", "value": "unschedulable", "effect": "NoSchedule"}


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again when the block ends: nothing listens


def _epoch(stamp: str | None) -> float | None:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp() if stamp else None


@dataclass
class Case:
    id: str
    spec: dict[str, Any]
    fault: str
    namespace: str = ""
    name: str = ""
    own_operator: bool = False
    """Run under the module's short-deadline operator instead of the session's."""
    samples: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    applied_at: float = 0.0
    finished_at: float | None = None

    @property
    def final(self) -> dict[str, Any]:
        return self.samples[-1][1] if self.samples else {}

    def seen_condition(self, type_: str, status: str, reason: str) -> list[str]:
        """Messages of that condition in every sample that showed it."""
        out = []
        for _, s in self.samples:
            c = condition(s, type_)
            if c and c.get("status") == status and c.get("reason") == reason:
                out.append(c.get("message", ""))
        return out


@dataclass
class Batch:
    cases: dict[str, Case]
    cluster: Cluster
    ledger: ChildLedger
    operator_log: str
    empty_prometheus: str

    def case(self, id_: str) -> Case:
        return self.cases[id_]


@pytest.fixture(scope="module")
def empty_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus that scrapes nothing: every query answers success with no series."""
    found = binaries.find_all()
    assert found is not None
    tmp = tmp_path_factory.mktemp("empty-prometheus")
    (tmp / "prometheus.yml").write_text(yaml.safe_dump({"global": {"scrape_interval": "2s"}, "scrape_configs": []}))
    port = _closed_port()
    log = (tmp / "prometheus.log").open("w")
    proc = subprocess.Popen(
        [str(found.prometheus), f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip # argv: each flag beside its value
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
                if resp.status == 200:
                    break
        except OSError:
            assert proc.poll() is None, (tmp / "prometheus.log").read_text()[-2000:]
            time.sleep(0.3)
    try:
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _cases(empty_prometheus_url: str) -> list[Case]:
    one_tier = {"tiers": {"tensorParallel": [1]}}
    return [
        Case("oom", {"engine": {"extraArgs": ["--gpu-memory-utilization", "0.12"]}}, "engine out of memory at start (TP1)"),
        Case(
            "crashloop",
            {**one_tier, "engine": {"extraArgs": ["--block-size", "7"]}, "budget": {"tierTimeoutSeconds": 120}},
            "engine crash loop (rejected flag)",
        ),
        Case(
            "neverready",
            {"engine": {"env": [{"name": "KNEEPOINT_SIM_MODEL_LOAD_SECONDS", "value": "3600"}]}, "budget": {"tierTimeoutSeconds": 10}},
            "engine never Ready",
        ),
        Case(
            "unschedulable",
            {**one_tier, "placement": {"gpuProduct": "NVIDIA-L40S"}, "budget": {"tierTimeoutSeconds": 10}},
            "engine Unschedulable (node tainted)",
        ),
        Case(
            "loadfail",
            {**one_tier, "engine": {"env": [{"name": "KNEEPOINT_SIM_FAIL_FRACTION", "value": "1"}]}, "load": {"maxAttempts": 2}},
            "load-test Job failure (every request 500)",
        ),
        Case(
            "partial",
            {
                **one_tier,
                "engine": {"env": [{"name": "KNEEPOINT_SIM_FAIL_FRACTION", "value": "0.3"}]},
                "load": {"maxAttempts": 3, "maxErrorFraction": 0.1},
            },
            "load-test partial failure (30 % errors > 10 %)",
        ),
        Case(
            "tolerated",
            {**one_tier, "engine": {"env": [{"name": "KNEEPOINT_SIM_FAIL_FRACTION", "value": "0.05"}]}, "load": {"maxErrorFraction": 0.25}},
            "load-test errors under the threshold (5 % < 25 %)",
        ),
        Case(
            "promdown",
            {**one_tier, "metrics": {"prometheusUrl": f"http://127.0.0.1:{_closed_port()}"}},
            "Prometheus unreachable",
            own_operator=True,
        ),
        Case(
            "promempty", {**one_tier, "metrics": {"prometheusUrl": empty_prometheus_url}}, "Prometheus returns no series", own_operator=True
        ),
    ]


@pytest.fixture(scope="module")
def batch(sandbox: Any, operator: Any, empty_prometheus: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Batch]:
    suffix = uuid.uuid4().hex[:5]
    cases = {c.id: c for c in _cases(empty_prometheus)}
    for case in cases.values():
        # Namespaces of the short-deadline operator lie outside the session operator's prefix.
        case.namespace = f"kpf-{case.id}-{suffix}" if case.own_operator else session_namespace(operator, f"{case.id}-{suffix}")
        case.name = case.id
    namespaces = [c.namespace for c in cases.values()]
    fast = OperatorProcess(
        sandbox,
        tmp_path_factory.mktemp("fast-metrics-operator"),
        extra_env={
            "KNEEPOINT_NAMESPACES": ",".join(c.namespace for c in cases.values() if c.own_operator),
            "KNEEPOINT_METRICS_DEADLINE_SECONDS": str(METRICS_DEADLINE),
        },
    )
    with sandbox.api_client() as api:
        cluster = Cluster(api)
        node = cluster.core.read_node("l40s-0")
        old_taints = [t.to_dict() for t in (node.spec.taints or [])]
        cluster.core.patch_node("l40s-0", {"spec": {"taints": [*old_taints, TAINT]}})
        try:
            for ns in namespaces:
                sandbox.kubectl("create", "namespace", ns)
            fast.start()
            ledger = ChildLedger(api, set(namespaces)).start()
            for case in cases.values():
                cluster.create(experiment(case.name, case.namespace, case.spec))
                case.applied_at = time.time()
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and any(c.finished_at is None for c in cases.values()):
                for case in cases.values():
                    if case.finished_at is None:
                        status = cluster.status(case.namespace, case.name)
                        case.samples.append((time.time(), status))
                        if is_finished(status):
                            case.finished_at = time.time()
                time.sleep(1.0)
            # Children are deleted when the experiment finishes: give the API a moment.
            time.sleep(3)
            yield Batch(cases, cluster, ledger, operator.logs() + fast.logs(), empty_prometheus)
            ledger.stop()
        finally:
            cluster.core.patch_node("l40s-0", {"spec": {"taints": old_taints or None}})
            for ns in namespaces:
                sandbox.kubectl("delete", "parallelismexperiments.kneepoint.io", "--all", "-n", ns, "--timeout=30s", check=False)
                sandbox.kubectl("delete", "namespace", ns, "--wait=false", check=False)
            fast.stop()


def _finished(case: Case) -> dict[str, Any]:
    assert case.finished_at is not None, f"{case.id} did not finish within the batch's 300 s: {case.final}"
    return case.final


def _events(batch: Batch, case: Case) -> list[dict[str, str]]:
    return batch.cluster.events(case.namespace, case.name, order="first")


def _reasons(events: list[dict[str, str]]) -> list[str]:
    return [e["reason"] for e in events]


def _nothing_left(batch: Batch, case: Case) -> None:
    left = batch.cluster.workload_names(case.namespace, case.name)
    assert left == {"deployments": [], "services": [], "jobs": [], "pods": []}, (case.id, left)
    assert batch.cluster.gpus_held([case.namespace]) == {}, case.id
    assert batch.ledger.duplicates(namespace=case.namespace) == {}, case.id


def _tier_seconds(t: dict[str, Any]) -> float:
    return round((_epoch(t["finishedAt"]) or 0) - (_epoch(t["startedAt"]) or 0), 1)


def _log(case: Case, **figures: Any) -> None:
    reasons = [f"{t['name']}: {t['phase']}: {t.get('reason') or ''}"[:400] for t in case.final.get("tiers") or []]
    FaultLog().record(
        "tier-faults",
        case.fault,
        True,
        case_id=case.id,
        phase=case.final.get("phase"),
        tier_reasons=reasons,
        experiment_seconds=round((case.finished_at or 0) - case.applied_at, 1),
        **figures,
    )


def test_engine_out_of_memory_at_start_is_recorded_and_the_ladder_goes_on(batch: Batch) -> None:
    case = batch.case("oom")
    status = _finished(case)
    tp1, tp2 = tier(status, "tp1-pp1"), tier(status, "tp2-pp1")
    assert tp1["phase"] == "Failed" and tp1["doesNotFit"] is True, tp1
    assert tp1["reason"].startswith("out of memory at start"), tp1["reason"]
    assert "No available memory for the cache blocks" in tp1["reason"], tp1["reason"]
    assert tp2["phase"] == "Measured", tp2
    assert status["phase"] == "Decided" and status["decision"]["tensorParallel"] == 2, status.get("decision")
    events = _events(batch, case)
    oom = [e for e in events if e["reason"] == "TierOutOfMemory"]
    assert len(oom) == 1 and oom[0]["type"] == "Warning" and oom[0]["message"].startswith("TP1 failed: out of memory"), events
    _nothing_left(batch, case)
    _log(case, seconds_to_record=_tier_seconds(tp1))


def test_engine_crash_loop_fails_the_tier_with_the_engines_error(batch: Batch) -> None:
    case = batch.case("crashloop")
    status = _finished(case)
    tp1 = tier(status, "tp1-pp1")
    assert tp1["phase"] == "Failed", tp1
    assert re.match(r"CrashLoopBackOff after [3-9] restarts", tp1["reason"]), tp1["reason"]
    # The engine's own line says why it cannot start (terminationMessagePolicy FallbackToLogsOnError).
    assert "--block-size" in tp1["reason"], tp1["reason"]
    assert status["phase"] == "Failed" and condition(status, "Failed")["reason"] == "NoDecision", status.get("conditions")
    assert "TierStartFailed" in _reasons(_events(batch, case))
    _nothing_left(batch, case)
    _log(case, seconds_to_record=_tier_seconds(tp1))


def test_engine_never_ready_fails_each_tier_after_its_timeout(batch: Batch) -> None:
    case = batch.case("neverready")
    status = _finished(case)
    for name in ("tp1-pp1", "tp2-pp1"):
        t = tier(status, name)
        assert t["phase"] == "Failed" and t["reason"].startswith("not Ready within 10 s"), t
        assert 10 <= _tier_seconds(t) <= 25, (name, _tier_seconds(t))
    assert status["phase"] == "Failed" and condition(status, "Failed")["reason"] == "NoDecision"
    assert _reasons(_events(batch, case)).count("TierStartFailed") == 2
    _nothing_left(batch, case)
    _log(case, seconds_to_record=_tier_seconds(tier(status, "tp1-pp1")))


def test_engine_unschedulable_fails_the_tier_with_the_schedulers_reason(batch: Batch) -> None:
    case = batch.case("unschedulable")
    status = _finished(case)
    tp1 = tier(status, "tp1-pp1")
    assert tp1["phase"] == "Failed", tp1
    assert "Unschedulable" in tp1["reason"] and "taint" in tp1["reason"], tp1["reason"]
    assert "TierUnschedulable" in _reasons(_events(batch, case))
    assert status["phase"] == "Failed"
    _nothing_left(batch, case)
    _log(case, seconds_to_record=_tier_seconds(tp1))


def test_load_test_job_failure_is_retried_then_the_tier_fails(batch: Batch) -> None:
    case = batch.case("loadfail")
    status = _finished(case)
    tp1 = tier(status, "tp1-pp1")
    assert tp1["phase"] == "Failed" and tp1["attempts"] == 2, tp1
    assert tp1["reason"].startswith("load test failed after 2 attempt(s)"), tp1["reason"]
    assert "500" in tp1["reason"] or "http" in tp1["reason"].lower(), tp1["reason"]
    reasons = _reasons(_events(batch, case))
    assert reasons.count("LoadTestRetried") == 1 and reasons.count("LoadTestFailed") == 1, reasons
    jobs = sorted(n.split("/")[1] for n in batch.ledger.created("Job", case.namespace))
    assert jobs == ["loadfail-tp1-pp1-load1", "loadfail-tp1-pp1-load2"], jobs
    assert status["phase"] == "Failed"
    _nothing_left(batch, case)
    _log(case, seconds_to_record=_tier_seconds(tp1), attempts=2)


def test_load_test_partial_failure_over_the_threshold_is_retried_to_the_limit(batch: Batch) -> None:
    case = batch.case("partial")
    status = _finished(case)
    tp1 = tier(status, "tp1-pp1")
    assert tp1["phase"] == "Failed" and tp1["attempts"] == 3, tp1
    match = re.search(r"error fraction (0\.\d+) above load\.maxErrorFraction 0\.1", tp1["reason"])
    assert match and 0.15 <= float(match.group(1)) <= 0.45, tp1["reason"]
    reasons = _reasons(_events(batch, case))
    assert reasons.count("LoadTestRetried") == 2 and reasons.count("LoadTestFailed") == 1, reasons
    _nothing_left(batch, case)
    _log(case, seconds_to_record=_tier_seconds(tp1), attempts=3)


def test_load_test_errors_under_the_threshold_are_measured_and_reported(batch: Batch) -> None:
    case = batch.case("tolerated")
    status = _finished(case)
    tp1 = tier(status, "tp1-pp1")
    assert tp1["phase"] == "Measured" and 0 < tp1["errorFraction"] <= 0.25, tp1
    assert status["phase"] == "Decided"
    _nothing_left(batch, case)
    _log(case, error_fraction=tp1["errorFraction"])


def _retry_times(log: str, url: str) -> list[float]:
    stamps = []
    for line in log.splitlines():
        if f"Prometheus at {url} failed" in line:
            stamps.append(datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp())
    return stamps


def test_prometheus_unreachable_is_retried_with_backoff_and_named(batch: Batch) -> None:
    case = batch.case("promdown")
    status = _finished(case)
    url = case.spec["metrics"]["prometheusUrl"]
    unreachable = case.seen_condition("MetricsAvailable", "False", "PrometheusUnreachable")
    assert unreachable and "Prometheus query failed" in unreachable[0], unreachable
    # Retried with growing gaps (the ladder waits a quarter of the time since the load test).
    # Each failed pass takes about 6 s itself (prometheus-api-client's own retries of the refused connection).
    stamps = _retry_times(batch.operator_log, url)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    assert len(stamps) >= 3, stamps
    assert gaps[-1] >= gaps[0], gaps
    tp1 = tier(status, "tp1-pp1")
    assert tp1["phase"] == "Measured" and set(tp1["missingMetrics"]) >= {"DCGM_FI_DEV_FB_USED", "vllm:kv_cache_usage_perc"}, tp1
    since_end = _epoch(tp1["finishedAt"]) - _epoch(tp1["loadTestFinishedAt"])
    assert METRICS_DEADLINE - 2 <= since_end <= METRICS_DEADLINE + 15, since_end
    decision = status["decision"]
    assert "memory-headroom" in (decision.get("unevaluatedRules") or []), decision
    assert "M1=n/a" in decision["reason"], decision["reason"]  # no figure is made up
    final = condition(status, "MetricsAvailable")
    assert final["status"] == "False" and final["reason"] == "PrometheusUnreachable", final
    assert "DCGM_FI_DEV_FB_USED" in final["message"] and "not evaluated" in final["message"], final
    _nothing_left(batch, case)
    _log(case, retries=len(stamps), gaps_seconds=[round(g, 1) for g in gaps], seconds_after_load_test=round(since_end, 1))


def test_prometheus_without_series_names_the_missing_metrics(batch: Batch) -> None:
    case = batch.case("promempty")
    status = _finished(case)
    missing = case.seen_condition("MetricsAvailable", "False", "MetricsMissing")
    assert missing and "DCGM_FI_DEV_FB_USED" in missing[0] and "vllm:kv_cache_usage_perc" in missing[0], missing
    tp1 = tier(status, "tp1-pp1")
    assert tp1["phase"] == "Measured" and "DCGM_FI_DEV_FB_USED" in tp1["missingMetrics"], tp1
    assert tp1.get("peakMemoryGiB") is None, tp1  # never guessed
    decision = status["decision"]
    assert "memory-headroom" in (decision.get("unevaluatedRules") or []), decision
    assert any(e["reason"] == "MetricsMissing" and e["type"] == "Warning" for e in _events(batch, case))
    _nothing_left(batch, case)
    since_end = _epoch(tp1["finishedAt"]) - _epoch(tp1["loadTestFinishedAt"])
    assert METRICS_DEADLINE - 2 <= since_end <= METRICS_DEADLINE + 15, since_end
    _log(case, seconds_after_load_test=round(since_end, 1))
