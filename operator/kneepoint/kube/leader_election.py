"""Leader election on a coordination.k8s.io/v1 Lease: one active operator per scope.

The algorithm is client-go's (``k8s.io/client-go/tools/leaderelection``), which
controller-runtime uses, with its default timing: a leader renews every ``retry_period``
(2 s); it stops writing once ``renew_deadline`` (10 s) has passed since its last
successful renew; a standby may take the lease once its record has not changed for
``lease_duration`` (15 s), measured on the standby's own clock from when it last saw the
record change, so the two hosts' clocks never need to agree. ``renew_deadline <
lease_duration`` is the fence: a leader cut off from the API server stops writing at least
``lease_duration - renew_deadline`` before anyone else may start. Writes that pass the fence
check (``LeaseElector.fence``) are those of a process that renewed within the deadline.

Concurrency comes from the API server: create fails with 409 when another candidate
created the Lease first, update fails with 409 when the Lease changed since it was read
(resourceVersion). The scope (the watched namespaces) is in the Lease's name
(``lease_name``), so installs watching different namespaces do not block each other.

Why not ``kubernetes.leaderelection`` (the pinned client 37.0.2 has it, with a LeaseLock):
its ``run()`` blocks a thread with ``time.sleep`` and runs the leader's work in another
thread, so kopf's event loop would live inside its callback; it has no query a write can be
fenced on, makes requests without a timeout (a hung renew outlives the deadline), and never
releases the lease on a clean stop (a rolling update would wait a whole lease duration).
Why not kopf's peering: see docs/operator.md ("One active operator per scope").
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kneepoint.core.timestamps import rfc3339

log = logging.getLogger("kneepoint.election")

LEASE_PREFIX = "kneepoint-operator"
SCOPE_ANNOTATION = "kneepoint.io/scope"
"""The watched namespaces, comma-separated ("*" for all), on the Lease: its name may be a hash."""
SERVICE_ACCOUNT_NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
JITTER_FACTOR = 1.2
"""A standby waits retry_period x [1, 1.2) between attempts, as client-go's JitterFactor."""


class LeadershipLost(RuntimeError):
    """Raised by the fence: this process is not (or no longer) the leader; it must not write."""


@dataclass(frozen=True)
class ElectionTiming:
    """Seconds; controller-runtime's defaults."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not self.lease_duration > self.renew_deadline:
            raise ValueError(
                f"leader election: lease duration ({self.lease_duration} s) must exceed the renew deadline ({self.renew_deadline} s)"
            )
        if not self.renew_deadline > JITTER_FACTOR * self.retry_period:
            raise ValueError(
                f"leader election: renew deadline ({self.renew_deadline} s) must exceed {JITTER_FACTOR} x the retry period "
                f"({self.retry_period} s)"
            )
        if self.retry_period <= 0:
            raise ValueError(f"leader election: retry period must be > 0 s, got {self.retry_period}")


def lease_name(namespaces: tuple[str, ...] | list[str]) -> str:
    """The Lease of one scope: ``kneepoint-operator-all`` for every namespace, ``-<ns>`` for one
    namespace (when that stays a valid name), else ``-<hash of the sorted namespaces>``."""
    scope = sorted(set(namespaces))
    if not scope:
        return f"{LEASE_PREFIX}-all"
    if len(scope) == 1 and all(c.isalnum() or c == "-" for c in scope[0]) and len(scope[0]) <= 200:
        return f"{LEASE_PREFIX}-ns-{scope[0].lower()}"
    digest = hashlib.sha256(",".join(scope).encode()).hexdigest()[:12]
    return f"{LEASE_PREFIX}-{digest}"


def scope_text(namespaces: tuple[str, ...] | list[str]) -> str:
    return ",".join(sorted(set(namespaces))) or "*"


def default_identity() -> str:
    """The pod's name (KNEEPOINT_POD_NAME, from the chart) or the host's, plus a random part, as client-go:
    a restarted process is a new candidate. KNEEPOINT_LEADER_IDENTITY sets it exactly, for a process restarted
    in place that may reclaim its own Lease at once (never give two live processes the same one)."""
    fixed = os.environ.get("KNEEPOINT_LEADER_IDENTITY")
    if fixed:
        return fixed
    return f"{os.environ.get('KNEEPOINT_POD_NAME') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def in_cluster_namespace() -> str | None:
    try:
        with open(SERVICE_ACCOUNT_NAMESPACE_FILE) as f:
            return f.read().strip() or None
    except OSError:
        return None


def find_lease_namespace(api: client.CoordinationV1Api, name: str) -> str | None:
    """The namespace of an existing Lease called ``name`` (a chart install's), if one is visible.

    A local ``kneepoint operator`` does not know where the chart was installed; it joins that
    install's election instead of starting one of its own. None when none is found or listing
    Leases cluster-wide is forbidden.
    """
    try:
        leases = api.list_lease_for_all_namespaces(field_selector=f"metadata.name={name}", _request_timeout=10).items
    except ApiException as exc:
        log.debug("Cannot list Leases cluster-wide (%s); using the configured namespace", exc.reason)
        return None
    held = [lease for lease in leases if lease.spec and lease.spec.holder_identity]
    chosen = max(held or leases, key=lambda lease: _micro(lease.spec.renew_time) if lease.spec else 0.0, default=None)
    return chosen.metadata.namespace if chosen is not None else None


def _micro(value: Any) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    return 0.0


def _now_micro(wall: Callable[[], float]) -> datetime:
    return datetime.fromtimestamp(wall(), tz=UTC)


@dataclass
class Observed:
    holder: str | None
    renew_time: Any
    acquire_time: Any
    transitions: int
    duration: float
    seen_at: float
    """Our monotonic clock when this record was first seen (client-go's observedTime)."""


class LeaseElector:
    """Acquire, hold and release one Lease. ``try_acquire_or_renew`` is one synchronous round;
    ``acquire`` and ``hold`` are the asyncio loops around it (the calls run in a worker thread)."""

    def __init__(
        self,
        api: Any,
        namespace: str,
        name: str,
        identity: str,
        timing: ElectionTiming = ElectionTiming(),
        scope: str = "*",
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ):
        self.api = api
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.timing = timing
        self.scope = scope
        self.clock = clock
        self.wall = wall
        self.observed: Observed | None = None
        self.renewed_at: float | None = None
        """Monotonic time at the start of the last successful acquire or renew; None: not the leader."""
        # A thread of its own: the operator's API threads may all be busy, and a renew must not queue behind them.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kneepoint-lease")

    def _round(self) -> asyncio.Future[bool]:
        # A Future, not a coroutine: asyncio.wait_for then creates no Task for it. kopf cancels every Task created
        # after its start when it stops, and a cancelled renew would end ``hold`` as if the lease were lost.
        return asyncio.get_running_loop().run_in_executor(self._executor, self.try_acquire_or_renew)

    # ---------------------------------------------------------------- the fence
    def is_leader(self) -> bool:
        return self.renewed_at is not None and self.clock() < self.renewed_at + self.timing.renew_deadline

    def fence(self, what: str = "write") -> None:
        """Raise LeadershipLost unless this process holds the lease (renewed within the deadline)."""
        if not self.is_leader():
            raise LeadershipLost(f"not the leader of Lease {self.namespace}/{self.name}: refusing {what}")

    @property
    def holder(self) -> str | None:
        return self.observed.holder if self.observed else None

    # ---------------------------------------------------------------- one round
    def _spec(self, acquire_time: Any, transitions: int, now: datetime) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.timing.lease_duration)),
            "acquireTime": _iso(acquire_time or now),
            "renewTime": _iso(now),
            "leaseTransitions": transitions,
        }

    def try_acquire_or_renew(self) -> bool:
        """One attempt; True when this process holds the lease afterwards."""
        started = self.clock()
        now = _now_micro(self.wall)
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=self.timing.renew_deadline)
        except ApiException as exc:
            if exc.status != 404:
                log.warning("Reading Lease %s/%s failed: %s", self.namespace, self.name, exc.reason)
                return self._failed()
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": self.name,
                    "namespace": self.namespace,
                    "labels": {"app.kubernetes.io/name": "kneepoint", "app.kubernetes.io/component": "leader-election"},
                    "annotations": {SCOPE_ANNOTATION: self.scope},
                },
                "spec": self._spec(None, 0, now),
            }
            try:
                self.api.create_namespaced_lease(self.namespace, body, _request_timeout=self.timing.renew_deadline)
            except ApiException as exc2:
                if exc2.status != 409:  # 409: another candidate created it first
                    log.warning("Creating Lease %s/%s failed: %s", self.namespace, self.name, exc2.reason)
                return self._failed()
            self._won(started)
            return True
        except Exception as exc:  # noqa: BLE001 - connection refused, timeout: the API server is unreachable
            log.warning("Reading Lease %s/%s failed: %s", self.namespace, self.name, exc)
            return self._failed()

        spec = lease.spec or client.V1LeaseSpec()
        record = (spec.holder_identity or None, spec.renew_time, spec.acquire_time, spec.lease_transitions or 0)
        if self.observed is None or record != (
            self.observed.holder,
            self.observed.renew_time,
            self.observed.acquire_time,
            self.observed.transitions,
        ):
            self.observed = Observed(*record, duration=float(spec.lease_duration_seconds or self.timing.lease_duration), seen_at=started)
        observed = self.observed
        mine = observed.holder == self.identity
        if observed.holder and not mine:
            if self.renewed_at is not None:
                # Someone else holds it (taken over after we missed our deadline, or written by hand): stop at once.
                log.error("Lease %s/%s is held by %s, not by this process", self.namespace, self.name, observed.holder)
                self.renewed_at = None
            if started < observed.seen_at + observed.duration:
                return False  # held by another, and renewed within its duration as far as we have seen
        body = {
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "resourceVersion": lease.metadata.resource_version,
                "labels": lease.metadata.labels,
                "annotations": {**(lease.metadata.annotations or {}), SCOPE_ANNOTATION: self.scope},
            },
            "spec": self._spec(observed.acquire_time if mine else None, observed.transitions if mine else observed.transitions + 1, now),
        }
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, body, _request_timeout=self.timing.renew_deadline)
        except ApiException as exc:
            if exc.status != 409:  # 409: it changed since we read it (another candidate won the round)
                log.warning("Updating Lease %s/%s failed: %s", self.namespace, self.name, exc.reason)
            return self._failed()
        except Exception as exc:  # noqa: BLE001 - as reading: the API server is unreachable
            log.warning("Updating Lease %s/%s failed: %s", self.namespace, self.name, exc)
            return self._failed()
        self._won(started)
        return True

    def _won(self, started: float) -> None:
        self.renewed_at = started
        # What we wrote is now the record; the next round compares against it.
        self.observed = Observed(self.identity, None, None, 0, self.timing.lease_duration, started)

    def _failed(self) -> bool:
        return self.is_leader()

    # ---------------------------------------------------------------- loops
    async def acquire(self, on_standby: Callable[[str | None], None] | None = None) -> None:
        """Return once this process is the leader; ``on_standby(holder)`` is called when a new holder is seen."""
        told: str | None = None
        while True:
            if await self._round():
                return
            if on_standby is not None and self.holder and self.holder != told:
                told = self.holder
                on_standby(self.holder)
            await asyncio.sleep(self.timing.retry_period * random.uniform(1.0, JITTER_FACTOR))

    async def hold(self) -> None:
        """Renew every retry period; return when the renew deadline passed without a successful renew."""
        while True:
            # Never sleep past the deadline: the moment it passes, the caller must stop.
            await asyncio.sleep(max(0.0, min(self.timing.retry_period, self._remaining())))
            remaining = self._remaining()
            if remaining <= 0:
                break
            try:
                await asyncio.wait_for(self._round(), timeout=remaining)
            except TimeoutError:
                pass
            if not self.is_leader():
                break
        self.renewed_at = None
        log.error("Lost Lease %s/%s (no renew within %.0f s)", self.namespace, self.name, self.timing.renew_deadline)

    def _remaining(self) -> float:
        return (self.renewed_at or 0.0) + self.timing.renew_deadline - self.clock()

    async def release_after_renewals(self) -> bool:
        """``release`` on the elector's own thread, so it runs after any renew still in flight (no 409 between them)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, self.release)

    def release(self) -> bool:
        """Give the lease up (on a clean stop) so a standby takes over at its next retry, not after lease_duration."""
        if not self.is_leader():
            return False
        self.renewed_at = None
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=5)
            if (lease.spec.holder_identity or None) != self.identity:
                return False
            lease.spec.holder_identity = None
            lease.spec.lease_duration_seconds = 1
            lease.spec.renew_time = _now_micro(self.wall)
            self.api.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=5)
            return True
        except Exception as exc:  # noqa: BLE001 - the standby then waits lease_duration instead
            log.warning("Releasing Lease %s/%s failed: %s", self.namespace, self.name, exc)
            return False


def _iso(value: Any) -> str:
    if isinstance(value, datetime):
        return rfc3339(value, 6)
    return str(value)


def timing_from_env(env: dict[str, str] | None = None) -> ElectionTiming:
    env = dict(os.environ) if env is None else env

    def read(key: str, default: float) -> float:
        raw = env.get(key)
        try:
            return float(raw) if raw not in (None, "") else default
        except ValueError:
            raise ValueError(f"{key}={raw!r}: expected seconds (a number)") from None

    return ElectionTiming(
        lease_duration=read("KNEEPOINT_LEASE_DURATION_SECONDS", ElectionTiming.lease_duration),
        renew_deadline=read("KNEEPOINT_RENEW_DEADLINE_SECONDS", ElectionTiming.renew_deadline),
        retry_period=read("KNEEPOINT_RETRY_PERIOD_SECONDS", ElectionTiming.retry_period),
    )
