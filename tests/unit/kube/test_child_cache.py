"""The watch-fed cache: never older than what it was given, deleted children stay out, a miss is not an answer."""

from __future__ import annotations

from typing import Any

from kneepoint.kube.child_cache import DEPLOYMENTS, EXPERIMENTS, PODS, ChildCache


def obj(name: str, rv: str, uid: str = "u1", labels: dict[str, str] | None = None, **extra: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv, "labels": labels or {}}, **extra}


def test_an_older_resource_version_of_the_same_object_does_not_replace_a_newer_one() -> None:
    cache = ChildCache()
    cache.offer(EXPERIMENTS, obj("e", "20", status={"phase": "Profiling"}))
    cache.offer(EXPERIMENTS, obj("e", "7", status={"phase": "Pending"}))  # a late watch event, older than our patch
    got = cache.get(EXPERIMENTS, "ns", "e")
    assert got is not None and got["status"] == {"phase": "Profiling"}
    cache.offer(EXPERIMENTS, obj("e", "21", status={"phase": "Decided"}))
    got = cache.get(EXPERIMENTS, "ns", "e")
    assert got is not None and got["status"] == {"phase": "Decided"}


def test_a_new_object_of_the_same_name_replaces_the_old_one_whatever_its_version() -> None:
    cache = ChildCache()
    cache.offer(DEPLOYMENTS, obj("d", "50", uid="old"))
    cache.offer(DEPLOYMENTS, obj("d", "3", uid="new"))
    got = cache.get(DEPLOYMENTS, "ns", "d")
    assert got is not None and got["metadata"]["uid"] == "new"


def test_what_is_cached_is_a_copy() -> None:
    cache = ChildCache()
    given = obj("e", "1", status={"phase": "Pending"})
    cache.offer(EXPERIMENTS, given)
    given["status"]["phase"] = "Decided"
    got = cache.get(EXPERIMENTS, "ns", "e")
    assert got is not None and got["status"]["phase"] == "Pending"


def test_forgotten_children_do_not_come_back_with_a_late_event_but_kept_ones_stay() -> None:
    cache = ChildCache()
    tier1 = {"kneepoint.io/experiment": "e", "kneepoint.io/tier": "tp1-pp1"}
    cache.offer(PODS, obj("e-tp1-a", "5", uid="p1", labels=tier1))
    cache.offer(PODS, obj("e-tp1-b", "5", uid="p2", labels=tier1))
    cache.offer(PODS, obj("other", "5", uid="p3", labels={"kneepoint.io/experiment": "f"}))
    forgotten = cache.forget((PODS,), "ns", {"kneepoint.io/experiment": "e"}, keep=lambda o: o["metadata"]["name"] == "e-tp1-b")
    assert forgotten == 1
    cache.offer(PODS, obj("e-tp1-a", "6", uid="p1", labels=tier1))  # its last MODIFIED, delivered after the delete
    assert [o["metadata"]["name"] for o in cache.select(PODS, "ns", {"kneepoint.io/experiment": "e"})] == ["e-tp1-b"]
    cache.offer(PODS, obj("e-tp1-a", "9", uid="p9", labels=tier1))  # a new pod of the same name is a new object
    assert len(cache.select(PODS, "ns", tier1)) == 2


def test_a_deleted_event_drops_only_the_object_it_names() -> None:
    cache = ChildCache()
    cache.offer(DEPLOYMENTS, obj("d", "5", uid="new"))
    cache.drop(DEPLOYMENTS, obj("d", "4", uid="old"))  # the previous object of that name
    assert cache.get(DEPLOYMENTS, "ns", "d") is not None
    cache.drop(DEPLOYMENTS, obj("d", "6", uid="new"))
    assert cache.get(DEPLOYMENTS, "ns", "d") is None
    assert (cache.hits, cache.misses) == (1, 1)


def test_an_entry_not_refreshed_for_max_age_is_a_miss_and_a_read_that_no_longer_finds_it_removes_it() -> None:
    now = [0.0]
    cache = ChildCache(max_age=60.0, clock=lambda: now[0])
    labels = {"kneepoint.io/experiment": "e"}
    cache.offer(PODS, obj("ghost", "5", uid="g", labels=labels))  # its deletion never came (a watch re-listed)
    cache.offer(DEPLOYMENTS, obj("d", "5"))
    now[0] = 59.0
    assert len(cache.select(PODS, "ns", labels)) == 1 and cache.get(DEPLOYMENTS, "ns", "d") is not None
    now[0] = 61.0
    assert cache.select(PODS, "ns", labels) == [] and cache.get(DEPLOYMENTS, "ns", "d") is None  # read them again
    cache.listed(PODS, "ns", labels, [obj("real", "9", uid="r", labels=labels)])
    cache.absent(DEPLOYMENTS, "ns", "d")
    assert [o["metadata"]["name"] for o in cache.select(PODS, "ns", labels)] == ["real"]
    assert cache.objects[DEPLOYMENTS] == {}
