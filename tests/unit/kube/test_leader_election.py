"""Lease leader election (kube/leader_election.py) against an in-memory Lease API with
the API server's concurrency rules: create 409s when the Lease exists, replace 409s on a
stale resourceVersion. Clocks are fakes: no test here waits for real time to pass."""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from kneepoint.kube import leader_election as le

T = le.ElectionTiming()  # 15 s / 10 s / 2 s


class FakeLeases:
    """read/create/replace_namespaced_lease with resourceVersion checks; ``down`` makes every call fail."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 0
        self.down = False
        self.writes = 0

    def _check(self) -> None:
        if self.down:
            raise ApiException(status=503, reason="Service Unavailable")

    def read_namespaced_lease(self, name: str, namespace: str, **_: Any) -> client.V1Lease:
        self._check()
        body = self.objects.get((namespace, name))
        if body is None:
            raise ApiException(status=404, reason="Not Found")
        return _to_lease(body)

    def create_namespaced_lease(self, namespace: str, body: Any, **_: Any) -> None:
        self._check()
        body = _to_dict(body)
        key = (namespace, body["metadata"]["name"])
        if key in self.objects:
            raise ApiException(status=409, reason="AlreadyExists")
        self.version += 1
        body["metadata"]["resourceVersion"] = str(self.version)
        self.objects[key] = body
        self.writes += 1

    def replace_namespaced_lease(self, name: str, namespace: str, body: Any, **_: Any) -> None:
        self._check()
        body = _to_dict(body)
        current = self.objects[(namespace, name)]
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        self.version += 1
        body["metadata"]["resourceVersion"] = str(self.version)
        self.objects[(namespace, name)] = body
        self.writes += 1

    def spec(self, name: str = "lease") -> dict[str, Any]:
        return self.objects[("ns", name)]["spec"]


def _to_dict(body: Any) -> dict[str, Any]:
    if isinstance(body, dict):
        return copy.deepcopy(body)
    return client.ApiClient().sanitize_for_serialization(body)


def _to_lease(body: dict[str, Any]) -> client.V1Lease:
    # Through the client's deserializer, as a real response would be.
    return client.ApiClient().deserialize(json.dumps(body), "V1Lease", "application/json")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def candidate(api: FakeLeases, identity: str, clock: Clock, timing: le.ElectionTiming = T) -> le.LeaseElector:
    return le.LeaseElector(api, "ns", "lease", identity, timing, scope="*", clock=clock, wall=lambda: 1.7e9 + clock.t)


def test_first_candidate_creates_the_lease_and_leads_the_second_waits() -> None:
    api, clock = FakeLeases(), Clock()
    a, b = candidate(api, "a", clock), candidate(api, "b", clock)
    assert a.try_acquire_or_renew() is True
    assert api.spec()["holderIdentity"] == "a"
    assert api.spec()["leaseDurationSeconds"] == 15
    assert api.objects[("ns", "lease")]["metadata"]["annotations"][le.SCOPE_ANNOTATION] == "*"
    assert b.try_acquire_or_renew() is False
    assert b.holder == "a"
    a.fence()
    with pytest.raises(le.LeadershipLost):
        b.fence()


def test_standby_takes_over_only_after_the_lease_duration_without_renewal() -> None:
    api, clock = FakeLeases(), Clock()
    a, b = candidate(api, "a", clock), candidate(api, "b", clock)
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()  # b sees the record now
    clock.t += T.lease_duration - 0.5
    assert b.try_acquire_or_renew() is False  # not yet: b measures from when it saw the record
    clock.t += 1.0
    assert b.try_acquire_or_renew() is True
    assert api.spec()["holderIdentity"] == "b"
    assert api.spec()["leaseTransitions"] == 1


def test_renewals_keep_the_standby_out() -> None:
    api, clock = FakeLeases(), Clock()
    a, b = candidate(api, "a", clock), candidate(api, "b", clock)
    a.try_acquire_or_renew()
    for _ in range(20):  # 40 s of renewals every retry period
        clock.t += T.retry_period
        assert a.try_acquire_or_renew() is True
        assert b.try_acquire_or_renew() is False
    assert api.spec()["holderIdentity"] == "a"
    assert api.spec()["leaseTransitions"] == 0


def test_a_leader_that_cannot_renew_stops_writing_at_the_renew_deadline_before_anyone_may_take_over() -> None:
    api, clock = FakeLeases(), Clock()
    a, b = candidate(api, "a", clock), candidate(api, "b", clock)
    a.try_acquire_or_renew()
    b.try_acquire_or_renew()
    api.down = True
    clock.t += T.renew_deadline - 0.1
    assert a.try_acquire_or_renew() is True  # a failed renew, still within the deadline
    a.fence()
    clock.t += 0.2
    assert a.is_leader() is False
    with pytest.raises(le.LeadershipLost):
        a.fence("create Deployment")
    # The fence closed while the standby still has to wait: the two never write at once.
    api.down = False
    assert b.try_acquire_or_renew() is False
    clock.t += T.lease_duration - T.renew_deadline
    assert b.try_acquire_or_renew() is True


def test_a_leader_that_sees_another_holder_steps_down_at_once() -> None:
    api, clock = FakeLeases(), Clock()
    a = candidate(api, "a", clock)
    a.try_acquire_or_renew()
    api.spec()["holderIdentity"] = "someone-else"  # written by hand (kubectl edit)
    api.spec()["renewTime"] = "2030-01-01T00:00:00.000000Z"
    clock.t += T.retry_period
    assert a.try_acquire_or_renew() is False
    with pytest.raises(le.LeadershipLost):
        a.fence()


def test_release_lets_the_standby_take_over_at_its_next_try() -> None:
    api, clock = FakeLeases(), Clock()
    a, b = candidate(api, "a", clock), candidate(api, "b", clock)
    a.try_acquire_or_renew()
    assert b.try_acquire_or_renew() is False
    assert a.release() is True
    assert "holderIdentity" not in api.spec()
    assert not a.is_leader()
    clock.t += T.retry_period
    assert b.try_acquire_or_renew() is True
    assert api.spec()["holderIdentity"] == "b"


def test_two_candidates_racing_for_an_expired_lease_one_wins() -> None:
    api, clock = FakeLeases(), Clock()
    old = candidate(api, "old", clock)
    old.try_acquire_or_renew()
    a, b = candidate(api, "a", clock), candidate(api, "b", clock)
    a.try_acquire_or_renew(), b.try_acquire_or_renew()
    clock.t += T.lease_duration + 1

    # Both read the same expired record; a writes first; b's replace carries the old resourceVersion.
    real_read = api.read_namespaced_lease
    stale = real_read("lease", "ns")
    api.read_namespaced_lease = lambda *a_, **k: copy.deepcopy(stale)  # type: ignore[method-assign]
    assert a.try_acquire_or_renew() is True
    assert b.try_acquire_or_renew() is False
    api.read_namespaced_lease = real_read  # type: ignore[method-assign]
    assert api.spec()["holderIdentity"] == "a"
    assert [c.is_leader() for c in (a, b)] == [True, False]


def test_create_race_second_creator_gets_409_and_waits() -> None:
    api, clock = FakeLeases(), Clock()
    a, b = candidate(api, "a", clock), candidate(api, "b", clock)
    real_read = api.read_namespaced_lease

    def not_found(*_: Any, **__: Any) -> Any:
        raise ApiException(status=404, reason="Not Found")

    api.read_namespaced_lease = not_found  # type: ignore[method-assign]
    assert a.try_acquire_or_renew() is True
    assert b.try_acquire_or_renew() is False
    api.read_namespaced_lease = real_read  # type: ignore[method-assign]
    assert api.spec()["holderIdentity"] == "a"


async def test_hold_returns_when_renewing_fails_past_the_deadline() -> None:
    api = FakeLeases()
    timing = le.ElectionTiming(lease_duration=0.3, renew_deadline=0.1, retry_period=0.02)
    a = le.LeaseElector(api, "ns", "lease", "a", timing)
    await a.acquire()
    api.down = True
    await asyncio.wait_for(a.hold(), timeout=30)
    assert not a.is_leader()


async def test_acquire_reports_the_holder_once_then_takes_over_after_release() -> None:
    api = FakeLeases()
    timing = le.ElectionTiming(lease_duration=30, renew_deadline=20, retry_period=0.01)
    a = le.LeaseElector(api, "ns", "lease", "a", timing)
    b = le.LeaseElector(api, "ns", "lease", "b", timing)
    await a.acquire()
    told: list[str | None] = []
    waiting = asyncio.ensure_future(b.acquire(on_standby=told.append))
    while not told:
        await asyncio.sleep(0.01)
    assert not waiting.done()
    a.release()
    await asyncio.wait_for(waiting, timeout=30)
    assert told == ["a"] and b.is_leader()


def test_lease_name_names_the_scope() -> None:
    assert le.lease_name(()) == "kneepoint-operator-all"
    assert le.lease_name(("team-a",)) == "kneepoint-operator-ns-team-a"
    several = le.lease_name(("b", "a"))
    assert several == le.lease_name(("a", "b")) != le.lease_name(("a",))
    pattern = le.lease_name(("t1a2b-*",))
    assert pattern.startswith("kneepoint-operator-") and "*" not in pattern
    assert le.scope_text(("b", "a")) == "a,b" and le.scope_text(()) == "*"


def test_timing_is_validated_and_read_from_the_environment() -> None:
    with pytest.raises(ValueError, match="lease duration"):
        le.ElectionTiming(lease_duration=10, renew_deadline=10)
    with pytest.raises(ValueError, match="retry period"):
        le.ElectionTiming(lease_duration=15, renew_deadline=2, retry_period=2)
    timing = le.timing_from_env(
        {"KNEEPOINT_LEASE_DURATION_SECONDS": "6", "KNEEPOINT_RENEW_DEADLINE_SECONDS": "4", "KNEEPOINT_RETRY_PERIOD_SECONDS": "1"}
    )
    assert (timing.lease_duration, timing.renew_deadline, timing.retry_period) == (6, 4, 1)
    with pytest.raises(ValueError, match="KNEEPOINT_RETRY_PERIOD_SECONDS='x'"):
        le.timing_from_env({"KNEEPOINT_RETRY_PERIOD_SECONDS": "x"})


async def test_the_child_writer_makes_no_call_once_the_fence_closes() -> None:
    from kneepoint.kube.child_writer import ChildWriter

    api, clock = FakeLeases(), Clock()
    a = candidate(api, "a", clock)
    a.try_acquire_or_renew()
    calls: list[str] = []
    writer = ChildWriter(client.ApiClient(), on_request=calls.append, fence=a.fence)
    clock.t += T.renew_deadline + 1
    with pytest.raises(le.LeadershipLost):
        await writer.patch_status("ns", "x", {"phase": "Decided"})
    with pytest.raises(le.LeadershipLost):
        await writer.create({"kind": "Job", "metadata": {"namespace": "ns", "name": "j"}})
    assert calls == []


def test_a_local_operator_finds_the_namespace_of_the_held_lease_of_its_scope() -> None:
    def lease(namespace: str, holder: str | None, renewed: str) -> dict[str, Any]:
        return {
            "metadata": {"name": "kneepoint-operator-all", "namespace": namespace},
            "spec": {"holderIdentity": holder, "renewTime": renewed},
        }

    class Listing:
        def __init__(self, items: list[dict[str, Any]] | None, status: int = 200) -> None:
            self.items, self.status, self.selectors = items, status, []

        def list_lease_for_all_namespaces(self, field_selector: str, **_: Any) -> Any:
            self.selectors.append(field_selector)
            if self.items is None:
                raise ApiException(status=self.status, reason="Forbidden")
            return client.ApiClient().deserialize(json.dumps({"items": self.items}), "V1LeaseList", "application/json")

    api = Listing([lease("old", None, "2026-01-01T00:00:00.000000Z"), lease("kneepoint-system", "pod-a_1", "2026-01-01T00:00:01.000000Z")])
    assert le.find_lease_namespace(api, "kneepoint-operator-all") == "kneepoint-system"
    assert api.selectors == ["metadata.name=kneepoint-operator-all"]
    assert le.find_lease_namespace(Listing([]), "x") is None
    assert le.find_lease_namespace(Listing(None, 403), "x") is None


def test_a_fixed_identity_is_used_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KNEEPOINT_LEADER_IDENTITY", "op-1")
    assert le.default_identity() == "op-1"
    monkeypatch.delenv("KNEEPOINT_LEADER_IDENTITY")
    monkeypatch.setenv("KNEEPOINT_POD_NAME", "kneepoint-7f-abcde")
    first, second = le.default_identity(), le.default_identity()
    assert first.startswith("kneepoint-7f-abcde_") and first != second


async def test_hold_survives_kopf_cancelling_every_task_created_after_it_started() -> None:
    # kopf, when it stops, cancels every Task of the loop created after its start: the renew loop must
    # make none of its own, or a clean stop would end it as a lost lease (and skip the release).
    api = FakeLeases()
    a = le.LeaseElector(api, "ns", "lease", "a", le.ElectionTiming(lease_duration=30, renew_deadline=20, retry_period=0.01))
    await a.acquire()
    hold = asyncio.ensure_future(a.hold())
    existing = asyncio.all_tasks()
    writes = api.writes
    for _ in range(100):
        await asyncio.sleep(0.002)
        for task in asyncio.all_tasks() - existing:
            task.cancel()
    assert not hold.done()
    assert a.is_leader() and api.writes > writes  # it went on renewing
    hold.cancel()
    assert a.release() is True
