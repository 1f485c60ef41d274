"""JSON merge patch (RFC 7386) between two status documents.

The operator writes the whole status it computed; a merge patch of the full document would
never remove a key that disappeared (say ``waitingFor`` once a tier starts), so this computes
the patch that also sets removed keys to null. Lists are replaced wholesale, as merge patch does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def merge_patch(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that turns ``old`` into ``new`` (empty when they are equal)."""
    old = old or {}
    patch: dict[str, Any] = {}
    for key in old:
        if key not in new:
            patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_patch(before, value)
            if sub:
                patch[key] = sub
        elif before != value:
            patch[key] = value
    return patch
