"""The last state of every experiment and child the operator's watches delivered (pure: no API calls).

kopf already watches the experiments and the children that wake a daemon (engine and
load-test pods, engine Deployments, load-test Jobs); ``handlers.experiment`` offers each event's
object here, the writer offers the experiment its status patch returned, and the reader answers
from here before it asks the API. A pass then reads nothing that has not changed.

What keeps it honest:

- **Never older than what we wrote or read.** An object replaces the cached one only when its
  ``resourceVersion`` is not older. kube-apiserver's resourceVersions are etcd revisions
  (integers); one that is not an integer always replaces (and the reader reads from the API when
  it must be sure, see ``child_reader``).
- **A miss is not an answer.** The cache starts empty (a restarted operator, a watch that has not
  listed yet); the reader asks the API on a miss and offers what it got, so absence is only ever
  the API's word.
- **What we delete is gone at once.** The writer forgets the children it deletes and remembers
  their uids, so a late watch event of a deleted object does not bring it back (a ladder restarted
  after a spec change reuses the same child names).
- **Nothing is believed for long without a word from the API.** An entry neither a watch event nor a
  read has refreshed for ``max_age`` seconds (60) counts as a miss: the reader reads it again, and a
  read that no longer finds it (404, or a label-selected list without it) removes it. That bounds the
  life of an object whose deletion a watch never delivered (kopf re-lists after a watch expired
  without telling what vanished meanwhile) to a minute, for about one read per minute of an
  unchanged child.
"""

from __future__ import annotations

import copy
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

DEPLOYMENTS, JOBS, PODS, EXPERIMENTS = "deployments", "jobs", "pods", "parallelismexperiments"
KINDS = (DEPLOYMENTS, JOBS, PODS, EXPERIMENTS)
MAX_TOMBSTONES = 8192
MAX_AGE_SECONDS = 60.0


def _rv(obj: Mapping[str, Any]) -> int | None:
    raw = (obj.get("metadata") or {}).get("resourceVersion")
    return int(raw) if isinstance(raw, str) and raw.isdigit() else None


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (meta.get("namespace") or "", meta.get("name") or "")


class ChildCache:
    """Objects by kind, namespace and name; see the module docstring. One per operator process (one event loop)."""

    def __init__(self, max_age: float = MAX_AGE_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.objects: dict[str, dict[tuple[str, str], dict[str, Any]]] = {kind: {} for kind in KINDS}
        self.seen: dict[str, dict[tuple[str, str], float]] = {kind: {} for kind in KINDS}
        """When a watch event or a read last gave each entry."""
        self.max_age = max_age
        self.clock = clock
        self.deleted_uids: OrderedDict[str, None] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def offer(self, kind: str, obj: Mapping[str, Any] | None) -> None:
        """Keep ``obj`` unless the cached one is newer, or we deleted it."""
        if not obj or not (obj.get("metadata") or {}).get("name"):
            return
        uid = (obj.get("metadata") or {}).get("uid")
        if uid and uid in self.deleted_uids:
            return
        store = self.objects[kind]
        key = _key(obj)
        old = store.get(key)
        if old is not None:
            new_rv, old_rv = _rv(obj), _rv(old)
            same = (old.get("metadata") or {}).get("uid") == uid
            if same and new_rv is not None and old_rv is not None and new_rv < old_rv:
                return
        store[key] = copy.deepcopy(dict(obj))
        self.seen[kind][key] = self.clock()

    def drop(self, kind: str, obj: Mapping[str, Any]) -> None:
        """A watch said DELETED."""
        store = self.objects[kind]
        key = _key(obj)
        old = store.get(key)
        uid = (obj.get("metadata") or {}).get("uid")
        if old is not None and (not uid or (old.get("metadata") or {}).get("uid") == uid):
            del store[key]
            self.seen[kind].pop(key, None)

    def absent(self, kind: str, namespace: str, name: str) -> None:
        """A read found no such object (404)."""
        self.objects[kind].pop((namespace, name), None)
        self.seen[kind].pop((namespace, name), None)

    def listed(self, kind: str, namespace: str, labels: Mapping[str, str], found: Iterable[Mapping[str, Any]]) -> None:
        """A label-selected list read ``found``: every one offered, the cached ones it did not return removed."""
        given = list(found)
        uids = {(o.get("metadata") or {}).get("uid") for o in given}
        for key, cached in list(self.objects[kind].items()):
            if key[0] == namespace and _matches(cached, labels) and (cached.get("metadata") or {}).get("uid") not in uids:
                del self.objects[kind][key]
                self.seen[kind].pop(key, None)
        for obj in given:
            self.offer(kind, obj)

    def forget(self, kinds: Iterable[str], namespace: str, labels: Mapping[str, str], keep: Callable[[dict[str, Any]], bool]) -> int:
        """We deleted the children matching ``labels`` (but those ``keep`` says stay): out now, and not back."""
        forgotten = 0
        for kind in kinds:
            store = self.objects[kind]
            for key, obj in list(store.items()):
                if key[0] == namespace and _matches(obj, labels) and not keep(obj):
                    del store[key]
                    self.seen[kind].pop(key, None)
                    uid = (obj.get("metadata") or {}).get("uid")
                    if uid:
                        self.deleted_uids[uid] = None
                        while len(self.deleted_uids) > MAX_TOMBSTONES:
                            self.deleted_uids.popitem(last=False)
                    forgotten += 1
        return forgotten

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """The cached object, or None: not cached, or not refreshed for max_age (read it)."""
        obj = self.objects[kind].get((namespace, name))
        if obj is not None and not self._fresh(kind, (namespace, name)):
            obj = None
        self._count(obj is not None)
        return obj

    def select(self, kind: str, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        """The cached objects matching ``labels``; [] (list them) when there are none or any is past max_age."""
        keys = [k for k, o in self.objects[kind].items() if k[0] == namespace and _matches(o, labels)]
        found = [self.objects[kind][k] for k in keys] if keys and all(self._fresh(kind, k) for k in keys) else []
        self._count(bool(found))
        return found

    def _fresh(self, kind: str, key: tuple[str, str]) -> bool:
        return self.clock() - self.seen[kind].get(key, -float("inf")) < self.max_age

    def _count(self, hit: bool) -> None:
        if hit:
            self.hits += 1
        else:
            self.misses += 1


def _matches(obj: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    have = (obj.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())
