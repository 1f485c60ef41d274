"""Reconcile passes of a ParallelismExperiment: needs -> reads -> core ladder -> apply -> one status patch.

No kopf here (the handlers call this), so the loop can be driven by tests and tools directly.
Each pass reads exactly what :func:`kneepoint.core.needs.needs` names (this module knows no
tier phase; a test checks it), asks the GPU broker (:mod:`kneepoint.broker`) for the fleet,
calls :func:`kneepoint.core.ladder.reconcile_step`, applies its idempotent actions, writes
status with one merge patch through the status subresource and posts its events. A wake-up
runs passes until the experiment waits (at most ``max_passes_per_wakeup``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kubernetes.client.rest import ApiException

from kneepoint.broker import GpuBroker
from kneepoint.core import reasons
from kneepoint.core.actions import DeleteAllChildren, DeleteTier, EnsureEngine, EnsureLoadTest, PublishRecommendation
from kneepoint.core.architectures import architecture_from_spec, preset_names
from kneepoint.core.gpus import find_gpu_type
from kneepoint.core.ladder import (
    Step,
    derive_phase,
    is_settled,
    is_waiting_for_gpus,
    reconcile_step,
    reject_spec,
)
from kneepoint.core.needs import Needs, needs
from kneepoint.core.observations import LoadTestState, Observations
from kneepoint.core.prediction import LadderPrediction
from kneepoint.core.recommendation import recommendation
from kneepoint.core.spec import ExperimentSpec, SpecError, parse_spec
from kneepoint.core.status import ExperimentStatus
from kneepoint.core.tiers import Tier
from kneepoint.kube import kserve, load_test_result, manifests, naming, pod_status
from kneepoint.kube.child_reader import ChildReader
from kneepoint.kube.child_writer import ChildWriter
from kneepoint.kube.status_patch import merge_patch
from kneepoint.metrics.prometheus_reader import PrometheusReader
from kneepoint.metrics.promql import ENGINE_SERIES
from kneepoint.operator_metrics import OperatorMetrics
from kneepoint.settings import OperatorSettings
from kneepoint.simulator import ladder_prediction

log = logging.getLogger("kneepoint.reconciler")

_TIER_FAILURE_REASONS = (
    reasons.TIER_OUT_OF_MEMORY,
    reasons.TIER_START_FAILED,
    reasons.TIER_UNSCHEDULABLE,
    reasons.LOAD_TEST_FAILED,
)


def _hf_config_json(arch: Any) -> str:
    """The resolved architecture as HF config.json keys (what ``kneepoint sim --architecture`` reads)."""
    data = {
        "num_hidden_layers": arch.num_layers,
        "hidden_size": arch.hidden_size,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_key_value_heads,
        "head_dim": arch.head_dim,
        "intermediate_size": arch.intermediate_size,
        "vocab_size": arch.vocab_size,
        "tie_word_embeddings": arch.tie_word_embeddings,
    }
    if getattr(arch, "num_experts", None):
        data.update(
            {
                "num_local_experts": arch.num_experts,
                "num_experts_per_tok": arch.num_experts_per_token,
                "moe_intermediate_size": arch.moe_intermediate_size,
            }
        )
    return json.dumps({k: v for k, v in data.items() if v is not None}, sort_keys=True)


@dataclass
class EngineLogCache:
    """What the log of each failed engine run said, so a run's log is read once (per operator process).

    Keyed by :attr:`pod_status.FailedRun.key` (pod uid, container, the run's container id):
    a crash-looping engine costs one log read per crash, not one per pass. The value is the
    cause vLLM's log names (its line; "" when none), None for a log the API could not give
    (the termination message stands in).
    """

    max_entries: int = 512
    entries: dict[str, str | None] = field(default_factory=dict)
    failures: dict[str, int] = field(default_factory=dict)

    def get(self, key: str) -> tuple[bool, str | None]:
        return (key in self.entries, self.entries.get(key))

    def put(self, key: str, text: str | None) -> None:
        self.failures.pop(key, None)
        self.entries.pop(key, None)
        self.entries[key] = text
        self._trim(self.entries)

    def failed(self, key: str) -> int:
        """Count one more read of ``key``'s log that raised; returns how many have."""
        self.failures[key] = self.failures.get(key, 0) + 1
        self._trim(self.failures)
        return self.failures[key]

    def _trim(self, table: dict[str, Any]) -> None:
        while len(table) > self.max_entries:
            del table[next(iter(table))]


LOG_READ_ATTEMPTS = 3
"""Passes in a row whose read of one failed run's log may raise (a 5xx, a broken connection) before the
termination message decides alone. The pass that raises is retried with the handler's back-off (10, 20,
40 s), so a brief API-server error costs one retry and a log the API server keeps failing (a node it
cannot reach: 500 "no preferred addresses found") stalls the tier about a minute, not for ever."""


SLOW_PASS_SECONDS = 1.0
"""A pass at least this long logs where its time went."""


def action_waves(actions: Sequence[Any]) -> list[list[Any]]:
    """A step's actions in order, cut into waves whose actions touch different objects and may run at once.

    A tier's creates and deletes touch that tier's children (by its labels), a cleanup every child, the
    recommendation only its ConfigMap; an action that touches what one in the current wave touches starts
    the next wave, so a delete-collection never runs beside a create it could catch."""
    waves: list[list[Any]] = []
    touched: set[str] = set()
    for action in actions:
        mine = _touches(action)
        if not waves or _overlap(mine, touched):
            waves.append([])
            touched = set()
        waves[-1].append(action)
        touched |= mine
    return waves


_RECOMMENDATION, _EVERY_CHILD = "recommendation", "*"


def _touches(action: Any) -> set[str]:
    """What an action writes: its tier's children (by tier name), every child, or the recommendation."""
    if isinstance(action, PublishRecommendation):
        return {_RECOMMENDATION}
    tier = None if isinstance(action, DeleteAllChildren) else getattr(action, "tier", None)
    return {_EVERY_CHILD} if tier is None else {tier.name}


def _overlap(a: set[str], b: set[str]) -> bool:
    children_a, children_b = a - {_RECOMMENDATION}, b - {_RECOMMENDATION}
    if _EVERY_CHILD in a | b:
        return bool(children_a and children_b) or bool(a & b)
    return bool(a & b)


class PredictionPending(Exception):
    """The plan's prediction is still being computed: the pass ends without a step."""


# The parts of a pass (kneepoint_reconcile_part_seconds{part}; the slow-pass log line names them with spaces).
PART_FLEET_READ, PART_CAPACITY_LOCK, PART_OBSERVE, PART_WRITES = "fleet_read", "capacity_lock", "observe_and_decide", "writes"


class Reconciler:
    """Reconciles experiments; one instance per operator process, shared by all experiments."""

    def __init__(
        self,
        reader: ChildReader,
        writer: ChildWriter,
        settings: OperatorSettings,
        prometheus_factory: Callable[[str, float], PrometheusReader] | None = None,
        clock: Callable[[], float] = time.time,
        metrics: OperatorMetrics | None = None,
        on_ready: Callable[[str, str], None] | None = None,
    ):
        """``on_ready(namespace, name)`` wakes an experiment's daemon. Given, a plan pass whose prediction is still
        being computed ends at once and the experiment is woken when it is ready; without it (tools and tests that
        drive :meth:`reconcile` themselves) the pass waits for the prediction."""
        self.reader = reader
        self.writer = writer
        self.settings = settings
        self.broker = GpuBroker(reader, settings.fleet_cache_seconds, clock)
        # The broker's parts, by the names tests and tools reach them by.
        self.ledger, self.fleet_cache, self.queue = self.broker.ledger, self.broker.fleet_cache, self.broker.queue
        self._fleet_lists = self.broker.fleet_lists
        self.engine_logs = EngineLogCache()
        self.clock = clock
        self._prometheus: dict[str, PrometheusReader] = {}
        self._prometheus_factory = prometheus_factory or (lambda url, interval: PrometheusReader(url, scrape_interval_seconds=interval))
        self.metrics = metrics or OperatorMetrics()
        limit = settings.max_concurrent_passes
        self._slots: asyncio.Semaphore | contextlib.nullcontext[None] = asyncio.Semaphore(limit) if limit else contextlib.nullcontext()
        """Passes at once over all experiments (FIFO: asyncio's semaphore serves waiters in order)."""
        self._posting: dict[tuple[str, str], list[asyncio.Future[Any]]] = {}
        """Events being posted, per experiment whose wake-up is running (awaited before it returns)."""
        self._predicting: dict[tuple[object, ...], asyncio.Task[LadderPrediction]] = {}
        """Predictions being computed, by what they are a function of: like experiments planned at
        once (a GitOps apply of many) wait for one computation instead of each running its own."""
        self.on_ready = on_ready
        self._waiting: dict[tuple[object, ...], set[tuple[str, str]]] = {}
        """Experiments (namespace, name) to wake when the prediction of that key is ready."""
        self._prediction_failures: dict[tuple[str, str], BaseException] = {}
        """A failed prediction's error, raised once in the next pass of each experiment that waited for it."""

    # ------------------------------------------------------------------ entry point
    async def reconcile(self, name: str, namespace: str) -> float | None:
        """Run passes until the experiment waits; return seconds until it should be looked at again.

        The passes' events are posted while the next pass runs, and all of them before this returns.
        """
        key = (namespace, name)
        posting = self._posting.setdefault(key, [])
        try:
            return await self._passes(name, namespace)
        finally:
            self._posting.pop(key, None)
            for result in await asyncio.gather(*posting, return_exceptions=True):
                if isinstance(result, Exception):  # an event is never worth failing the wake-up for (the status holds it all)
                    log.warning("%s/%s: could not post an event: %s", namespace, name, result)

    async def _passes(self, name: str, namespace: str) -> float | None:
        for _ in range(self.settings.max_passes_per_wakeup):
            # One slot per pass, not per wake-up: a chain of passes (plan -> deploy) lets others in between.
            queued = time.perf_counter()
            async with self._slots:
                self.metrics.queue_wait.observe(time.perf_counter() - queued)
                done, delay = await self._slotted_pass(name, namespace)
            if done:
                return delay
        return 0.5

    async def _slotted_pass(self, name: str, namespace: str) -> tuple[bool, float | None]:
        """One pass, holding a slot: (True, seconds until the next look or None for none) when the wake-up
        should end, (False, None) when the next pass should follow at once.

        The experiment is read after the wait for the slot, so the pass sees what changed while it waited."""
        body = await self.reader.experiment(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            uid = (body or {}).get("metadata", {}).get("uid", "")
            self.queue.leave(uid)
            self.metrics.set_phase(uid, None)
            return True, None
        started = time.perf_counter()
        timing: dict[str, float] = {}  # where this pass spent its time, by part (logged when it is slow)
        step = None
        try:
            step = await self._pass(body, timing)
        except PredictionPending:
            # No step until the prediction is ready: the computation's end wakes this experiment (on_ready),
            # so the daemon sleeps instead of holding a pass open for seconds of simulation.
            log.debug("%s/%s: predicting the ladder on the simulator; woken when it is ready", namespace, name)
            step = None
        except Exception:
            self.metrics.errors.inc()
            raise
        finally:
            took = time.perf_counter() - started
            self.metrics.duration.observe(took)
            self.metrics.passes.inc()
            for part, seconds in timing.items():
                self.metrics.pass_parts.labels(part).observe(seconds)
            if took >= SLOW_PASS_SECONDS:  # where a slow pass spent its time: API round trips, the lock, a prediction
                parts = ", ".join(f"{k.replace('_', ' ')} {v:.2f} s" for k, v in timing.items())
                did = ", ".join(sorted({type(a).__name__ for a in step.actions})) if step is not None else ""
                log.info("%s/%s: pass took %.2f s (%s); actions: %s", namespace, name, took, parts or "before its reads", did or "none")
        if step is None:
            return True, None
        if not step.progressed or (step.requeue_after or 0) > 0:
            if step.requeue_after is not None:
                return True, step.requeue_after
            # Decided or Failed: nothing changes until the spec does, and a spec change
            # wakes the daemon (handlers.experiment_changed); no periodic re-reads.
            return True, None if is_settled(step.status) else self.settings.idle_poll_seconds
        return False, None

    # ------------------------------------------------------------------ one pass
    async def _pass(self, body: dict[str, Any], timing: dict[str, float] | None = None) -> Step | None:
        """needs -> reads -> reconcile_step -> apply -> one status patch."""
        meta = body["metadata"]
        name, namespace, uid, generation = meta["name"], meta["namespace"], meta["uid"], meta.get("generation", 1)
        old_status_json = body.get("status") or {}
        status = ExperimentStatus.from_dict(old_status_json)
        try:
            spec = parse_spec(body.get("spec") or {})
        except SpecError as exc:
            rejected = reject_spec(status, [str(e) for e in exc.errors], self.clock(), generation)
            await self._write(body, old_status_json, rejected)
            for ev in rejected.events:
                log.warning("%s/%s: %s", namespace, name, ev.message)
            return None

        need = needs(spec, status, self.settings.ladder)
        timing = {} if timing is None else timing
        mark = time.perf_counter()
        if need.capacity is not None:
            # The capacity check and the GPUs it promises must not interleave between
            # experiments: observe, decide and reserve under the lock; the API writes that
            # follow (Deployment, status, events) run after it, so one experiment's writes
            # never hold up another's capacity check.
            await self._fleet_lists()  # any wait for a fleet read happens here, outside the lock
            timing[PART_FLEET_READ] = time.perf_counter() - mark
            mark = time.perf_counter()
            async with self.ledger.lock:
                timing[PART_CAPACITY_LOCK] = time.perf_counter() - mark
                mark = time.perf_counter()
                obs = await self._observe(name, namespace, uid, spec, status, generation, need, fleet_wait=False)
                step = reconcile_step(spec, status, obs, self.settings.ladder)
                self.broker.reserve(step, spec, name, obs.now)
        else:
            obs = await self._observe(name, namespace, uid, spec, status, generation, need)
            step = reconcile_step(spec, status, obs, self.settings.ladder)
        timing[PART_OBSERVE] = time.perf_counter() - mark
        mark = time.perf_counter()
        try:
            return await self._apply_and_write(body, spec, status, old_status_json, obs, step)
        finally:
            timing[PART_WRITES] = time.perf_counter() - mark

    async def _apply_and_write(
        self,
        body: dict[str, Any],
        spec: ExperimentSpec,
        status: ExperimentStatus,
        old_json: dict[str, Any],
        obs: Observations,
        step: Step,
    ) -> Step:
        meta = body["metadata"]
        name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
        new_status = step.status
        owner = manifests.Owner(name, namespace, uid)
        for wave in action_waves(step.actions):
            # Actions on different objects at once; their order kept where they touch the same children.
            results = await asyncio.gather(*(self._apply(action, spec, owner, new_status, obs) for action in wave))
            changed = [r for r in results if r is not new_status]
            if changed:
                new_status = changed[-1]  # only PublishRecommendation edits status, and a wave holds one at most
        self.broker.hold_place(uid, obs.gpu_product, is_waiting_for_gpus(new_status), new_status.waiting_since)
        step = dataclasses.replace(step, status=new_status)
        await self._write(body, old_json, step)
        if new_status.phase != derive_phase(status.conditions):
            log.info("%s/%s: phase %s -> %s", namespace, name, derive_phase(status.conditions), new_status.phase)
        self._record_metrics(spec, uid, status, new_status, step)
        return step

    async def _write(self, body: dict[str, Any], old_json: dict[str, Any], step: Step) -> None:
        """The one status patch of a pass (when anything changed), then its events."""
        meta = body["metadata"]
        name, namespace = meta["name"], meta["namespace"]
        patch = merge_patch(old_json, step.status.to_dict())
        if patch:
            await self.writer.patch_status(namespace, name, patch)
        for ev in step.events:
            log.info("%s/%s: %s: %s", namespace, name, ev.reason, ev.message)
        # Events are independent of each other and of the next pass (each failure is only logged): posted at
        # once, in the background, as client-go's event recorder does; the wake-up awaits them before it ends.
        posting = [asyncio.ensure_future(self.writer.post_event(body, ev.reason, ev.message, ev.type)) for ev in step.events]
        pending = self._posting.get((namespace, name))
        if pending is None:
            await asyncio.gather(*posting)
        else:
            pending.extend(posting)

    def _record_metrics(self, spec: ExperimentSpec, uid: str, old: ExperimentStatus, new: ExperimentStatus, step: Step) -> None:
        m = self.metrics
        m.set_phase(uid, new.phase)
        mode = spec.mode
        for ev in step.events:
            if ev.reason == reasons.TIER_MEASURED:
                m.tiers_measured.labels(mode).inc()
            elif ev.type == "Warning" and ev.reason in _TIER_FAILURE_REASONS:
                m.tiers_failed.labels(mode).inc()
            elif ev.reason == reasons.DECISION_MADE and new.decision is not None:
                m.decisions.labels(new.decision.rule).inc()
        delta = (new.gpu_minutes_total or 0.0) - (old.gpu_minutes_total or 0.0)
        if mode == "Measure" and delta > 0:
            m.gpu_minutes.inc(delta)

    # ------------------------------------------------------------------ observe
    async def _missing_objects(self, spec: ExperimentSpec, namespace: str) -> tuple[str, ...]:
        """What the engine pod would wait for forever: the model's PVC, the hub-token Secret or its key."""
        missing = []
        if spec.model.uri.startswith("pvc://"):
            claim = spec.model.uri[len("pvc://") :].partition("/")[0]
            if await self.reader.persistent_volume_claim(namespace, claim) is None:
                missing.append(f"spec.model.uri: PersistentVolumeClaim {namespace}/{claim} not found")
        ref = spec.model.hub_token_secret_ref
        if ref is not None:
            try:
                keys = await self.reader.secret_keys(namespace, ref.name)
            except ApiException as exc:
                if exc.status != 403:
                    raise
                # No get on this Secret (the chart grants it by name only): the kubelet will tell.
                log.debug("%s: cannot read Secret %s to check it (403)", namespace, ref.name)
            else:
                if keys is None:
                    missing.append(f"spec.model.hubTokenSecretRef.name: Secret {namespace}/{ref.name} not found")
                elif ref.key not in keys:
                    missing.append(
                        f"spec.model.hubTokenSecretRef.key: Secret {namespace}/{ref.name} has no key {ref.key!r} "
                        f"(keys: {', '.join(sorted(keys)) or 'none'})"
                    )
        return tuple(missing)

    async def _resolve_architecture(self, spec: ExperimentSpec, namespace: str) -> tuple[Any, str | None, str | None]:
        """(architecture, architecture JSON for simulators, error)."""
        arch_spec = spec.model.architecture
        config = None
        raw = None
        if arch_spec.config_map_ref is not None:
            ref = arch_spec.config_map_ref
            cm = await self.reader.config_map(namespace, ref.name)
            if cm is None:
                return None, None, f"spec.model.architecture.configMapRef: ConfigMap {namespace}/{ref.name} not found"
            raw = (cm.get("data") or {}).get(ref.key)
            if raw is None:
                return None, None, f"spec.model.architecture.configMapRef: key {ref.key!r} not in ConfigMap {ref.name}"
            try:
                config = json.loads(raw)
            except ValueError as exc:
                return None, None, f"spec.model.architecture.configMapRef: {ref.name}/{ref.key} is not JSON ({exc})"
        try:
            arch = architecture_from_spec(arch_spec, config, model_name=spec.model.uri)
        except (KeyError, ValueError) as exc:
            return None, None, f"spec.model.architecture: {exc}"
        if arch_spec.preset:
            return arch, arch_spec.preset, None
        if raw is not None:
            return arch, raw, None
        if arch.name in preset_names():
            return arch, arch.name, None
        return arch, _hf_config_json(arch), None

    async def _observe(
        self,
        name: str,
        namespace: str,
        uid: str,
        spec: ExperimentSpec,
        status: ExperimentStatus,
        generation: int,
        need: Needs,
        fleet_wait: bool = True,
    ) -> Observations:
        """Read what ``need`` names, nothing else."""
        now = self.clock()
        arch = arch_json = arch_error = None
        if need.architecture:
            arch, arch_json, arch_error = await self._resolve_architecture(spec, namespace)
        missing = await self._missing_objects(spec, namespace) if need.missing_objects else ()

        fleet = None
        queue_position = None
        product = need.gpu_product
        selectors: dict[str, tuple[str, str]] = {}
        problem = None
        if need.fleet:
            read = await self.broker.fleet(spec, name, namespace, uid, status.waiting_since, need, now, wait=fleet_wait)
            fleet, product, queue_position, selectors, problem = (
                read.fleet,
                read.gpu_product,
                read.queue_position,
                read.product_selectors,
                read.placement_problem,
            )
        gpu = find_gpu_type(product) if product else None

        engine = load_test = metrics = None
        not_scraped = None
        lws_api = await self.reader.leader_worker_set_served() if need.leader_worker_set_api else None
        if need.engine is not None:
            engine_name = naming.engine_name(name, need.engine.tier)
            # Both reads at once: a pass's duration is mostly API round trips.
            if need.engine.group:
                group, pods = await asyncio.gather(
                    self.reader.leader_worker_set(namespace, engine_name), self.reader.engine_pods(name, namespace, need.engine.tier)
                )
                engine = pod_status.group_state(group, pods if group else [], await self._engine_logs(namespace, pods if group else []))
            else:
                deployment, pods = await asyncio.gather(
                    self.reader.deployment(namespace, engine_name), self.reader.engine_pods(name, namespace, need.engine.tier)
                )
                engine = pod_status.engine_state(
                    deployment, pods if deployment else [], await self._engine_logs(namespace, pods if deployment else [])
                )
        if need.load_test is not None:
            load_test = await self._load_test(namespace, name, need.load_test.tier, need.load_test.attempt)
        if need.metrics is not None and now >= need.metrics.not_before:
            m = need.metrics
            metrics = await self._prometheus_reader(spec).window(
                namespace, naming.engine_name(name, m.tier), m.start, m.end, traced=m.traced
            )
        if need.scrape_check is not None:
            not_scraped = await self._scrape_check(spec, name, namespace, need.scrape_check.tier, need.scrape_check.load_test_started, now)
        prediction = None
        if need.prediction is not None and product and gpu is not None and arch is not None and not missing:
            prediction = await self._predict(spec, need.prediction.tiers, product, gpu, fleet, arch_json, (namespace, name))

        return Observations(
            now=now,
            generation=generation,
            fleet=fleet,
            queue_position=queue_position,
            engine=engine,
            load_test=load_test,
            metrics=metrics,
            leader_worker_set_api=lws_api,
            plan_error=arch_error,
            missing_objects=missing,
            engine_not_scraped=not_scraped,
            architecture=arch,
            gpu=gpu,
            gpu_product=product,
            architecture_json=arch_json,
            product_selectors=tuple(sorted(selectors.items())),
            placement_problem=problem,
            prediction=prediction,
        )

    async def _predict(
        self,
        spec: ExperimentSpec,
        tiers: tuple[Tier, ...],
        product: str,
        gpu: Any,
        fleet: Any,
        arch_json: str | None,
        waiter: tuple[str, str],
    ) -> LadderPrediction:
        """Predict-first: the whole ladder on the engine simulator (CPU, seconds; in a thread, off the event loop).

        A prediction already made is returned at once. Otherwise its computation is started (or joined) and, with
        ``on_ready``, :class:`PredictionPending` ends the pass; ``waiter`` is woken when the computation ends."""
        links = [d.interconnect for d in fleet.domains] if fleet is not None and fleet.domains else []
        interconnect = max(set(links), key=links.count) if links else (gpu.interconnect or "nvlink")
        if spec.simulation.interconnect != "auto" and spec.mode == "Simulate":
            interconnect = spec.simulation.interconnect
        if interconnect not in ("nvlink", "pcie"):
            interconnect = "pcie"  # a mixed node: the slower link bounds the band
        args = {tier: manifests.vllm_args(spec, tier) for tier in tiers}
        key = ladder_prediction.prediction_key(spec, args, product, interconnect, arch_json)
        failure = self._prediction_failures.pop(waiter, None)
        if failure is not None:
            raise failure  # the handler's back-off, then a new computation
        made = ladder_prediction.cached_prediction(key)
        if made is not None:
            return made
        task = self._predicting.get(key)
        if task is None:
            task = asyncio.ensure_future(asyncio.to_thread(ladder_prediction.predict_ladder, spec, args, product, interconnect, arch_json))
            self._predicting[key] = task
            task.add_done_callback(lambda done: self._prediction_done(key, done))
        if self.on_ready is None or task.done():
            # shielded: one experiment's pass cancelled (its daemon stopped) leaves the others' computation running
            return await asyncio.shield(task)
        self._waiting.setdefault(key, set()).add(waiter)
        raise PredictionPending(key)

    def _prediction_done(self, key: tuple[object, ...], task: asyncio.Task[LadderPrediction]) -> None:
        self._predicting.pop(key, None)
        waiters = self._waiting.pop(key, set())
        failure = RuntimeError("the prediction was cancelled") if task.cancelled() else task.exception()
        for waiter in waiters:
            if failure is not None:
                self._prediction_failures[waiter] = failure
            if self.on_ready is not None:
                self.on_ready(*waiter)

    async def _load_test(self, namespace: str, name: str, tier: Tier, attempt: int) -> LoadTestState:
        """The load-test Job of this attempt: whether it exists, its outcome and the summary its pod left."""
        job_name = naming.load_test_name(name, tier, attempt)
        job = await self.reader.job(namespace, job_name)
        if job is None:
            return LoadTestState(attempt=attempt, exists=False)
        succeeded, failed, message = load_test_result.job_outcome(job)
        summary = None
        if succeeded or failed:
            job_pods = await self.reader.job_pods(namespace, job_name)
            term = load_test_result.termination_message(job_pods, manifests.LOADGEN_CONTAINER)
            if term is None and getattr(self.reader, "cache", None) is not None:
                # The Job's watch can deliver its end before the pod's: ask the API for the pods once.
                job_pods = await self.reader.job_pods(namespace, job_name, fresh=True)
                term = load_test_result.termination_message(job_pods, manifests.LOADGEN_CONTAINER)
            summary = load_test_result.parse_summary(term)
            if failed and summary and summary.get("error"):
                message = f"{message}; load generator: {summary['error']}"
            elif failed and term and not summary:
                message = f"{message}; {term[-300:]}"
        return LoadTestState(attempt, True, succeeded, failed, summary, message)

    async def _engine_logs(self, namespace: str, pods: list[dict[str, Any]]) -> dict[str, str | None]:
        """The log of each engine run that failed (read once per run; see EngineLogCache).

        vLLM writes why it could not start only in its log (the kubelet's termination message
        keeps the last 2048 bytes: the API server's traceback). A run restarted since is read
        with ``previous``; where that is not served, the current container's log, and where
        neither is, none: the termination message is the fallback (pod_status.engine_state).
        """
        out: dict[str, str | None] = {}
        for run in pod_status.failed_engine_runs(pods, manifests.ENGINE_CONTAINER)[: pod_status.MAX_LOG_READS_PER_PASS]:
            known, text = self.engine_logs.get(run.key)
            if not known:
                try:
                    text = await self.reader.container_log(
                        namespace, run.pod, run.container, run.previous, pod_status.LOG_TAIL_LINES, pod_status.LOG_LIMIT_BYTES
                    )
                    if text is None and run.previous:
                        text = await self.reader.container_log(
                            namespace, run.pod, run.container, False, pod_status.LOG_TAIL_LINES, pod_status.LOG_LIMIT_BYTES
                        )
                except Exception as exc:
                    attempts = self.engine_logs.failed(run.key)
                    if attempts < LOG_READ_ATTEMPTS:
                        raise
                    log.warning(
                        "%s/%s: the log of engine container %s could not be read in %d passes (%s); its termination message decides",
                        namespace,
                        run.pod,
                        run.container,
                        attempts,
                        " ".join(str(exc).split())[:300] or type(exc).__name__,
                    )
                    text = None
                if text is not None:
                    # Keep vLLM's line only (it classifies as the whole log does), not up to a MiB per run.
                    cause = pod_status.classify_engine_output(text)
                    text = cause.line if cause is not None else ""
                self.engine_logs.put(run.key, text)
            out[run.pod] = text
        return out

    def _prometheus_reader(self, spec: ExperimentSpec) -> Any:
        url = spec.metrics.prometheus_url or self.settings.prometheus_url
        reader = self._prometheus.get(url)
        if reader is None:
            reader = self._prometheus[url] = self._prometheus_factory(url, self.settings.prometheus_scrape_interval_seconds)
        return reader

    async def _scrape_check(self, spec: ExperimentSpec, name: str, namespace: str, tier: Tier, started: float, now: float) -> str | None:
        """Two scrape intervals into the load test: what Prometheus lacks of the engine, or None."""
        if now - started < 2 * self.settings.prometheus_scrape_interval_seconds:
            return None
        reader = self._prometheus_reader(spec)
        prefix = naming.engine_name(name, tier)
        scraped = await reader.engine_scraped(namespace, prefix, now)
        if scraped is False:
            return f"Prometheus {reader.url} has no {ENGINE_SERIES} series for the engine's pods {namespace}/{prefix}-*"
        return None

    # ------------------------------------------------------------------ apply
    async def _ensure_group(
        self, action: EnsureEngine, spec: ExperimentSpec, owner: manifests.Owner, build: manifests.BuildContext, obs: Observations
    ) -> None:
        """A multi-node tier: the LeaderWorkerSet and a Service for its leader (GPUs were reserved per pod under the lock)."""
        await self.writer.create(
            manifests.build_engine_leader_worker_set(spec, owner, action.tier, build, spec.placement.multi_node_topology_key)
        )
        await self.writer.create(manifests.build_engine_service(spec, owner, action.tier, leader_only=True))

    async def _apply(
        self,
        action: Any,
        spec: ExperimentSpec,
        owner: manifests.Owner,
        status: ExperimentStatus,
        obs: Observations,
    ) -> ExperimentStatus:
        build = manifests.BuildContext(
            operator_image=self.settings.operator_image,
            architecture_json=obs.architecture_json,
            architecture=obs.architecture,
            gpu_product=obs.gpu_product or spec.placement.gpu_product,
            require_nvlink=obs.require_nvlink,
        )
        if isinstance(action, EnsureEngine):
            selectors = dict(obs.product_selectors)
            chosen = [selectors[n] for n in (action.node_name, *action.node_names) if n in selectors]
            if not chosen and len(set(selectors.values())) == 1:
                chosen = list(selectors.values())
            if chosen:
                build = dataclasses.replace(build, gpu_product_label=chosen[0])
            if spec.mode == "Simulate" and not build.gpu_product:
                build = dataclasses.replace(build, gpu_product=(obs.gpu.product_labels[0] if obs.gpu else None))
            if action.group_size > 1:
                await self._ensure_group(action, spec, owner, build, obs)
                return status
            # Both at once (each create is idempotent): a pass's duration is mostly API round trips.
            await asyncio.gather(
                self.writer.create(
                    manifests.build_engine_deployment(
                        spec, owner, action.tier, build, action.node_name, action.interconnect, max_num_seqs=action.max_num_seqs
                    )
                ),
                self.writer.create(manifests.build_engine_service(spec, owner, action.tier)),
            )
        elif isinstance(action, EnsureLoadTest):
            await self.writer.create(
                manifests.build_load_test_job(spec, owner, action.tier, action.attempt, build, action.search, action.confirm)
            )
        elif isinstance(action, DeleteTier):
            await self.writer.delete_tier(owner.name, owner.namespace, action.tier, action.keep_engine)
        elif isinstance(action, DeleteAllChildren):
            await self.writer.delete_all(owner.name, owner.namespace, action.keep_tier)
        elif isinstance(action, PublishRecommendation):
            arch, _, _ = await self._resolve_architecture(spec, owner.namespace)
            export = kserve.build_export(spec, owner, action.decision, arch, build, prometheus_url=self.settings.prometheus_url)
            await self.writer.replace_config_map(kserve.build_recommendation_configmap(owner, action.decision, export))
            if export.not_exportable:
                log.warning("%s/%s: %s", owner.namespace, owner.name, export.not_exportable)
            numbers = recommendation(spec, action.decision, naming.recommendation_name(owner.name), export.not_exportable)
            status = dataclasses.replace(status, recommendation=numbers)
        return status
