"""One reconcile pass of a ParallelismExperiment: observe -> core ladder -> apply -> write status.

No kopf here (the handlers call this), so the loop can be driven by tests and tools directly.
Per pass it reads only what the current tier's phase needs (the fleet while a tier waits for
GPUs, the engine while it deploys, the Job while it load-tests, Prometheus while it collects),
applies the ladder's idempotent actions, posts its events and writes status with one merge
patch through the status subresource.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import yaml
from kubernetes.client.rest import ApiException

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
    rfc3339,
)
from kneepoint.core.needs import Needs, needs
from kneepoint.core.observations import LoadTestState, Observations
from kneepoint.core.spec import ExperimentSpec, SpecError, parse_spec
from kneepoint.core.recommendation import recommendation
from kneepoint.core.status import ExperimentStatus
from kneepoint.core.tiers import Tier
from kneepoint.kube import kserve, manifests, naming, pod_status
from kneepoint.kube.child_reader import ChildReader
from kneepoint.kube.child_writer import ChildWriter
from kneepoint.kube.status_patch import merge_patch
from kneepoint.metrics.promql import ENGINE_SERIES
from kneepoint.metrics.prometheus_reader import PrometheusReader
from kneepoint.operator_metrics import OperatorMetrics
from kneepoint.settings import OperatorSettings

log = logging.getLogger("kneepoint.reconciler")

RESERVATION_SECONDS = 120.0
STALE_FLEET_WAIT_FACTOR = 3.0
"""A capacity check waits for a new fleet read when the last is this many cache windows old; younger, it goes on
with the last read while a refresh runs in the background."""
_TIER_FAILURE_REASONS = (
    reasons.TIER_OUT_OF_MEMORY,
    reasons.TIER_START_FAILED,
    reasons.TIER_UNSCHEDULABLE,
    reasons.LOAD_TEST_FAILED,
)


@dataclass
class _Reservation:
    node: str
    gpus: int
    key: str
    expires: float


@dataclass
class GpuLedger:
    """GPUs promised to engines just created, until their pods show up (per operator process).

    Together with the lock this prevents two experiments from being promised the same GPUs
    in the moment between creating a Deployment and its pod being bound.
    """

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    reservations: dict[str, _Reservation] = field(default_factory=dict)

    def reserved(self, now: float, visible_keys: set[str]) -> dict[str, int]:
        out: dict[str, int] = {}
        for key, r in list(self.reservations.items()):
            # A group's reservations are keyed "<experiment>/<tier>#<pod>"; its pods show the tier.
            if r.expires < now or key.split("#", 1)[0] in visible_keys:
                del self.reservations[key]
                continue
            out[r.node] = out.get(r.node, 0) + r.gpus
        return out

    def reserve(self, node: str, gpus: int, key: str, now: float) -> None:
        self.reservations[key] = _Reservation(node, gpus, key, now + RESERVATION_SECONDS)


@dataclass
class FleetCache:
    """Nodes and resource-holding pods, listed at most once per ``max_age`` seconds for all experiments.

    A capacity check needs every GPU node and every pod that holds GPUs. Listing both for
    each pass of each waiting experiment costs O(experiments x nodes) per round; one shared
    read per window costs O(nodes). What a cached read misses is covered: engines this
    operator created since are in the GpuLedger until their pods show up, and GPUs freed
    since only look busy a little longer (the check waits, it never over-promises them).
    A stale read is refreshed in the background while passes go on with the last one (a
    list of hundreds of nodes takes seconds on a busy API server); a pass waits only for
    the first read and after a quiet spell (see STALE_FLEET_WAIT_FACTOR).
    """

    max_age: float
    refreshing: asyncio.Future[None] | None = None
    fetched_at: float | None = None
    """When the current lists were requested (not received: the conservative age)."""
    nodes: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    reads: int = 0
    views: dict[tuple[Any, ...], Any] = field(default_factory=dict)
    """FleetViews of this read (before reservations), per product/selector: built once, not per pass."""

    def view(self, gpu_resource: str, product: str | None, node_selector: dict[str, str], topology_key: str | None,
             reserved: dict[str, int]) -> Any:
        """pod_status.fleet_view over the cached lists, with ``reserved`` GPUs taken off."""
        key = (gpu_resource, product, tuple(sorted(node_selector.items())), topology_key)
        base = self.views.get(key)
        if base is None:
            base = self.views[key] = pod_status.fleet_view(self.nodes, self.pods, gpu_resource, product, node_selector,
                                                           None, topology_key=topology_key)
        if not reserved:
            return base
        # fleet_view computes max(0, total - used - reserved); taking reserved off max(0, total - used) is the same.
        return dataclasses.replace(base, domains=tuple(
            dataclasses.replace(d, gpus_free=max(0, d.gpus_free - reserved[d.node_name])) if reserved.get(d.node_name) else d
            for d in base.domains))


@dataclass
class WaitQueue:
    """FIFO of experiments waiting for GPUs, per GPU product (queue position in status)."""

    entries: dict[str, dict[str, tuple[str, int]]] = field(default_factory=dict)
    """product -> {experiment uid: (waitingSince, join order)}"""
    joined: Iterator[int] = field(default_factory=itertools.count)
    """Join order breaks ties of waitingSince (whole seconds): without it, experiments that
    started waiting in the same second were ordered by uid, and a later one overtook."""

    def position(self, product: str, uid: str, since: str | None) -> int:
        """Join (if not yet in it) and return the 1-based position."""
        queue = self.entries.setdefault(product, {})
        if uid not in queue:
            queue[uid] = (since or rfc3339(time.time()), next(self.joined))
        ordered = sorted(queue.items(), key=lambda kv: kv[1])
        return [u for u, _ in ordered].index(uid) + 1

    def peek_position(self, product: str, uid: str) -> int | None:
        """Position if ``uid`` were to join now (others already waiting go first)."""
        queue = self.entries.get(product, {})
        if uid in queue:
            ordered = sorted(queue.items(), key=lambda kv: kv[1])
            return [u for u, _ in ordered].index(uid) + 1
        return len(queue) + 1 if queue else None

    def leave(self, uid: str) -> None:
        for queue in self.entries.values():
            queue.pop(uid, None)


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

    def get(self, key: str) -> tuple[bool, str | None]:
        return (key in self.entries, self.entries.get(key))

    def put(self, key: str, text: str | None) -> None:
        self.entries.pop(key, None)
        self.entries[key] = text
        while len(self.entries) > self.max_entries:
            del self.entries[next(iter(self.entries))]


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
    ):
        self.reader = reader
        self.writer = writer
        self.settings = settings
        self.ledger = GpuLedger()
        self.fleet_cache = FleetCache(max_age=settings.fleet_cache_seconds)
        self.queue = WaitQueue()
        self.engine_logs = EngineLogCache()
        self.clock = clock
        self._prometheus: dict[str, PrometheusReader] = {}
        self._prometheus_factory = prometheus_factory or (lambda url, interval: PrometheusReader(url, scrape_interval_seconds=interval))
        self.metrics = metrics or OperatorMetrics()

    # ------------------------------------------------------------------ entry point
    async def reconcile(self, name: str, namespace: str) -> float | None:
        """Run passes until the experiment waits; return seconds until it should be looked at again."""
        for _ in range(self.settings.max_passes_per_wakeup):
            body = await self.reader.experiment(namespace, name)
            if body is None or body["metadata"].get("deletionTimestamp"):
                uid = (body or {}).get("metadata", {}).get("uid", "")
                self.queue.leave(uid)
                self.metrics.set_phase(uid, None)
                return None
            started = time.perf_counter()
            try:
                step = await self._pass(body)
            except Exception:
                self.metrics.errors.inc()
                raise
            finally:
                self.metrics.duration.observe(time.perf_counter() - started)
                self.metrics.passes.inc()
            if step is None:
                return None
            if not step.progressed or (step.requeue_after or 0) > 0:
                if step.requeue_after is not None:
                    return step.requeue_after
                # Decided or Failed: nothing changes until the spec does, and a spec change
                # wakes the daemon (handlers.experiment_changed); no periodic re-reads.
                return None if is_settled(step.status) else self.settings.idle_poll_seconds
        return 0.5

    # ------------------------------------------------------------------ one pass
    async def _pass(self, body: dict[str, Any]) -> Step | None:
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
        if need.capacity is not None:
            # The capacity check and the GPUs it promises must not interleave between
            # experiments: observe, decide and reserve under the lock; the API writes that
            # follow (Deployment, status, events) run after it, so one experiment's writes
            # never hold up another's capacity check.
            await self._fleet_lists()  # any wait for a fleet read happens here, outside the lock
            async with self.ledger.lock:
                obs = await self._observe(name, namespace, uid, spec, status, generation, need, fleet_wait=False)
                step = reconcile_step(spec, status, obs, self.settings.ladder)
                self._reserve_gpus(step, spec, name, obs)
        else:
            obs = await self._observe(name, namespace, uid, spec, status, generation, need)
            step = reconcile_step(spec, status, obs, self.settings.ladder)
        return await self._apply_and_write(body, spec, status, old_status_json, obs, step)

    def _reserve_gpus(self, step: Step, spec: ExperimentSpec, name: str, obs: Observations) -> None:
        """Record in the ledger the GPUs this step's EnsureEngine promises, before the engine exists."""
        if spec.mode != "Measure":
            return
        key = f"{naming.experiment_label_value(name)}/"
        for action in step.actions:
            if not isinstance(action, EnsureEngine):
                continue
            if action.group_size > 1:
                for index, node in enumerate(action.node_names):
                    self.ledger.reserve(node, action.tier.tensor_parallel, f"{key}{action.tier.name}#{index}", obs.now)
            elif action.node_name:
                self.ledger.reserve(action.node_name, action.tier.gpus, f"{key}{action.tier.name}", obs.now)

    async def _apply_and_write(
        self, body: dict[str, Any], spec: ExperimentSpec, status: ExperimentStatus, old_json: dict[str, Any],
        obs: Observations, step: Step,
    ) -> Step:
        meta = body["metadata"]
        name, namespace, uid = meta["name"], meta["namespace"], meta["uid"]
        new_status = step.status
        owner = manifests.Owner(name, namespace, uid)
        for action in step.actions:
            new_status = await self._apply(action, spec, owner, new_status, obs)
        if not is_waiting_for_gpus(new_status):
            self.queue.leave(uid)
        elif obs.gpu_product:
            # Join in the pass that starts the wait, not the next one: in between, others
            # would peek an empty queue and overtake. Status shows the place at once too.
            position = self.queue.position(obs.gpu_product, uid, new_status.waiting_since)
            new_status = dataclasses.replace(new_status, queue_position=position)
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
        # Events are independent of each other: post them at once (each failure is only logged).
        await asyncio.gather(*(self.writer.post_event(body, ev.reason, ev.message, ev.type) for ev in step.events))

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
        self, name: str, namespace: str, uid: str, spec: ExperimentSpec, status: ExperimentStatus, generation: int,
        need: Needs, fleet_wait: bool = True,
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
        selectors: dict[str, str] = {}
        problem = None
        if need.fleet:
            nodes, pods = await self._fleet_lists(wait=fleet_wait)
            all_pods = pods
            if need.capacity is not None:
                # An operator killed after creating this tier's engine but before writing
                # status finds the engine's pod holding GPUs: they are this tier's own, not
                # taken (else it would wait for GPUs it holds, for ever on a full fleet).
                own = naming.child_labels(name, need.capacity.tier, naming.ROLE_ENGINE)
                pods = [
                    p for p in pods
                    if not (p["metadata"].get("namespace") == namespace
                            and all(p["metadata"].get("labels", {}).get(k) == v for k, v in own.items()))
                ]
            visible = {
                f"{p['metadata'].get('labels', {}).get(naming.LABEL_EXPERIMENT)}/{p['metadata'].get('labels', {}).get(naming.LABEL_TIER)}"
                for p in pods
                if p.get("spec", {}).get("nodeName")
            }
            reserved = self.ledger.reserved(now, visible)
            if len(pods) == len(all_pods):
                # The common case: views of the shared read are built once per read, not per pass.
                def view(product: str | None, topology_key: str | None = None) -> Any:
                    return self.fleet_cache.view(spec.placement.gpu_resource, product, spec.placement.node_selector, topology_key, reserved)
            else:
                def view(product: str | None, topology_key: str | None = None) -> Any:
                    return pod_status.fleet_view(nodes, pods, spec.placement.gpu_resource, product, spec.placement.node_selector,
                                                 reserved, topology_key=topology_key)
            if product is None:
                all_view = view(None)
                product = all_view.products()[0] if all_view.products() else None
            fleet = view(product, spec.placement.multi_node_topology_key)
            if need.capacity is not None and product:
                if need.capacity.join_queue:
                    queue_position = self.queue.position(product, uid, status.waiting_since)
                else:
                    queue_position = self.queue.peek_position(product, uid)
            if product:
                selectors = pod_status.product_selectors(nodes, product)
            if not fleet.domains:
                problem = pod_status.placement_problem(nodes, spec.placement.gpu_resource, product, spec.placement.node_selector)
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
                engine = pod_status.engine_state(deployment, pods if deployment else [], await self._engine_logs(namespace, pods if deployment else []))
        if need.load_test is not None:
            load_test = await self._load_test(namespace, name, need.load_test.tier, need.load_test.attempt)
        if need.metrics is not None and now >= need.metrics.not_before:
            m = need.metrics
            metrics = await self._prometheus_reader(spec).window(
                namespace, naming.engine_name(name, m.tier), m.start, m.end, traced=m.traced
            )
        if need.scrape_check is not None:
            not_scraped = await self._scrape_check(spec, name, namespace, need.scrape_check.tier, need.scrape_check.load_test_started, now)

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
        )

    async def _load_test(self, namespace: str, name: str, tier: Tier, attempt: int) -> LoadTestState:
        """The load-test Job of this attempt: whether it exists, its outcome and the summary its pod left."""
        job_name = naming.load_test_name(name, tier, attempt)
        job = await self.reader.job(namespace, job_name)
        if job is None:
            return LoadTestState(attempt=attempt, exists=False)
        succeeded, failed, message = pod_status.job_outcome(job)
        summary = None
        if succeeded or failed:
            job_pods = await self.reader.job_pods(namespace, job_name)
            term = pod_status.termination_message(job_pods, manifests.LOADGEN_CONTAINER)
            summary = pod_status.parse_summary(term)
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
                text = await self.reader.container_log(
                    namespace, run.pod, run.container, run.previous, pod_status.LOG_TAIL_LINES, pod_status.LOG_LIMIT_BYTES
                )
                if text is None and run.previous:
                    text = await self.reader.container_log(
                        namespace, run.pod, run.container, False, pod_status.LOG_TAIL_LINES, pod_status.LOG_LIMIT_BYTES
                    )
                if text is not None:
                    # Keep vLLM's line only (it classifies as the whole log does), not up to a MiB per run.
                    cause = pod_status.classify_engine_output(text)
                    text = cause.line if cause is not None else ""
                self.engine_logs.put(run.key, text)
            out[run.pod] = text
        return out

    async def _fleet_lists(self, wait: bool = True) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Every node and every pod holding resources, from the shared cache (see FleetCache).

        ``wait=False`` returns the last read as it is, starting nothing: the caller holds the capacity
        lock and called with ``wait=True`` just before taking it.
        """
        cache = self.fleet_cache
        if not wait:
            return cache.nodes, cache.pods
        age = math.inf if cache.fetched_at is None else self.clock() - cache.fetched_at
        if age >= cache.max_age and cache.refreshing is None:
            cache.refreshing = asyncio.ensure_future(self._refresh_fleet())
        if age >= STALE_FLEET_WAIT_FACTOR * cache.max_age and cache.refreshing is not None:
            # Nothing read yet, or the last read is from before a quiet spell: wait for a fresh one.
            await asyncio.shield(cache.refreshing)
        return cache.nodes, cache.pods

    async def _refresh_fleet(self) -> None:
        cache = self.fleet_cache
        requested = self.clock()
        try:
            nodes = await self.reader.nodes()
            pods = await self.reader.active_pods_on_nodes()
            cache.nodes, cache.pods, cache.views = nodes, pods, {}
            cache.fetched_at = requested
            cache.reads += 1
        except Exception as exc:
            if cache.fetched_at is not None:  # a background refresh: log, keep the last read, retry next pass
                log.warning("Listing nodes and pods for the capacity check failed: %s", exc)
                return
            raise
        finally:
            cache.refreshing = None

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
            pretend_termination_message=self.settings.sandbox_pretend_termination_message,
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
            await self.writer.create(
                manifests.build_engine_deployment(spec, owner, action.tier, build, action.node_name, action.interconnect)
            )
            await self.writer.create(manifests.build_engine_service(spec, owner, action.tier))
        elif isinstance(action, EnsureLoadTest):
            await self.writer.create(manifests.build_load_test_job(spec, owner, action.tier, action.attempt, build))
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
