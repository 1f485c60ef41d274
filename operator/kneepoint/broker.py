"""The GPU broker: who may have which GPUs now, for all experiments of one operator process.

The ladder (core) decides what a tier needs; the broker answers where it can run now:
one shared read of nodes and GPU-holding pods (:class:`FleetCache`), the GPUs promised to
engines just created (:class:`GpuLedger`, under its lock with the capacity check), the
queue of experiments waiting per GPU product (:class:`WaitQueue`), and a tier's own engine
pods counted as its own (adoption after an operator restart). The reconciler asks it for
the fleet a :class:`~kneepoint.core.needs.Needs` names and tells it what a step promised.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from kneepoint.core.actions import EnsureEngine
from kneepoint.core.ladder import Step
from kneepoint.core.needs import Needs
from kneepoint.core.observations import FleetView
from kneepoint.core.spec import ExperimentSpec
from kneepoint.core.timestamps import rfc3339
from kneepoint.kube import fleet as kube_fleet
from kneepoint.kube import naming
from kneepoint.kube.child_reader import ChildReader

log = logging.getLogger("kneepoint.broker")

RESERVATION_SECONDS = 120.0
STALE_FLEET_WAIT_FACTOR = 3.0
"""A capacity check waits for a new fleet read when the last is this many cache windows old; younger, it goes on
with the last read while a refresh runs in the background."""


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

    def view(
        self, gpu_resource: str, product: str | None, node_selector: dict[str, str], topology_key: str | None, reserved: dict[str, int]
    ) -> Any:
        """kube.fleet.fleet_view over the cached lists, with ``reserved`` GPUs taken off."""
        key = (gpu_resource, product, tuple(sorted(node_selector.items())), topology_key)
        base = self.views.get(key)
        if base is None:
            base = self.views[key] = kube_fleet.fleet_view(
                self.nodes, self.pods, gpu_resource, product, node_selector, None, topology_key=topology_key
            )
        if not reserved:
            return base
        # fleet_view computes max(0, total - used - reserved); taking reserved off max(0, total - used) is the same.
        return dataclasses.replace(
            base,
            domains=tuple(
                dataclasses.replace(d, gpus_free=max(0, d.gpus_free - reserved[d.node_name])) if reserved.get(d.node_name) else d
                for d in base.domains
            ),
        )


@dataclass
class WaitQueue:
    """FIFO of experiments waiting for GPUs, per GPU product (queue position in status)."""

    entries: dict[str, dict[str, tuple[str, int]]] = field(default_factory=dict)
    """product -> {experiment uid: (waitingSince, join order)}"""
    joined: Iterator[int] = field(default_factory=itertools.count)
    """Join order breaks ties of waitingSince (whole seconds): without it, experiments that
    started waiting in the same second were ordered by uid, and a later one overtook."""

    def join(self, product: str, uid: str, since: str | None) -> None:
        """Join the product's queue (a no-op when already in it)."""
        queue = self.entries.setdefault(product, {})
        if uid not in queue:
            queue[uid] = (since or rfc3339(time.time()), next(self.joined))

    def position(self, product: str, uid: str, since: str | None) -> int:
        """Join (if not yet in it) and return the 1-based position."""
        self.join(product, uid, since)
        return self.peek_position(product, uid)

    def peek_position(self, product: str, uid: str) -> int:
        """The 1-based position; for ``uid`` not in the queue, the one it gets by joining now (others already waiting go first)."""
        queue = self.entries.get(product, {})
        if uid not in queue:
            return len(queue) + 1
        return sorted(queue, key=queue.__getitem__).index(uid) + 1

    def leave(self, uid: str) -> None:
        for queue in self.entries.values():
            queue.pop(uid, None)


@dataclass(frozen=True)
class FleetRead:
    """What the broker saw for one experiment's pass (typed, for Observations)."""

    fleet: FleetView | None
    gpu_product: str | None
    queue_position: int | None = None
    product_selectors: dict[str, tuple[str, str]] = field(default_factory=dict)
    placement_problem: str | None = None


class GpuBroker:
    """One per operator process, shared by all experiments (see the module docstring)."""

    def __init__(self, reader: ChildReader, fleet_cache_seconds: float, clock: Callable[[], float] = time.time):
        self.reader = reader
        self.clock = clock
        self.ledger = GpuLedger()
        self.fleet_cache = FleetCache(max_age=fleet_cache_seconds)
        self.queue = WaitQueue()

    async def fleet(
        self,
        spec: ExperimentSpec,
        name: str,
        namespace: str,
        uid: str,
        waiting_since: str | None,
        need: Needs,
        now: float,
        wait: bool = True,
    ) -> FleetRead:
        """The matching fleet with promised GPUs taken off, the queue place a capacity check holds, and the product's labels.

        ``wait=False`` under the capacity lock (the caller waited for a fresh read before taking it).
        """
        product = need.gpu_product
        queue_position = None
        selectors: dict[str, tuple[str, str]] = {}
        problem = None
        nodes, pods = await self.fleet_lists(wait=wait)
        all_pods = pods
        if need.capacity is not None:
            # An operator killed after creating this tier's engine but before writing
            # status finds the engine's pod holding GPUs: they are this tier's own, not
            # taken (else it would wait for GPUs it holds, for ever on a full fleet).
            own = naming.child_labels(name, need.capacity.tier, naming.ROLE_ENGINE)
            pods = [
                p
                for p in pods
                if not (
                    p["metadata"].get("namespace") == namespace and all(p["metadata"].get("labels", {}).get(k) == v for k, v in own.items())
                )
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
                return kube_fleet.fleet_view(
                    nodes, pods, spec.placement.gpu_resource, product, spec.placement.node_selector, reserved, topology_key=topology_key
                )

        if product is None:
            all_view = view(None)
            product = all_view.products()[0] if all_view.products() else None
        fleet = view(product, spec.placement.multi_node_topology_key)
        if need.capacity is not None and product:
            if need.capacity.join_queue:
                queue_position = self.queue.position(product, uid, waiting_since)
            else:
                queue_position = self.queue.peek_position(product, uid)
        if product:
            selectors = kube_fleet.product_selectors(nodes, product)
        if not fleet.domains:
            problem = kube_fleet.placement_problem(nodes, spec.placement.gpu_resource, product, spec.placement.node_selector)
        return FleetRead(fleet, product, queue_position, selectors, problem)

    def reserve(self, step: Step, spec: ExperimentSpec, name: str, now: float) -> None:
        """Record in the ledger the GPUs this step's EnsureEngine promises, before the engine exists."""
        if spec.mode != "Measure":
            return
        key = f"{naming.experiment_label_value(name)}/"
        for action in step.actions:
            if not isinstance(action, EnsureEngine):
                continue
            if action.group_size > 1:
                for index, node in enumerate(action.node_names):
                    self.ledger.reserve(node, action.tier.tensor_parallel, f"{key}{action.tier.name}#{index}", now)
            elif action.node_name:
                self.ledger.reserve(action.node_name, action.tier.gpus, f"{key}{action.tier.name}", now)

    def hold_place(self, uid: str, product: str | None, waiting: bool, since: str | None) -> None:
        """After a pass: keep (or join) the queue while a tier waits, else leave it.

        The place itself is computed once, by :meth:`fleet` (the capacity check's read): the
        core writes that one to status (``peek_position`` is the place joining gives)."""
        if not waiting:
            self.queue.leave(uid)
        elif product:
            # Join in the pass that starts the wait, not the next one: in between, others
            # would peek without this experiment and overtake it.
            self.queue.join(product, uid, since)

    async def fleet_lists(self, wait: bool = True) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
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
