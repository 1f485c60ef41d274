"""Reading plain-dict API objects (as the API serves them) without KeyError at every level."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def dig(obj: Mapping[str, Any] | None, *path: str, default: Any = None) -> Any:
    """``obj[path[0]][path[1]]...``; ``default`` where a level is missing, not a mapping, or None."""
    cur: Any = obj
    for key in path:
        if not isinstance(cur, Mapping):
            return default
        cur = cur.get(key)
    return default if cur is None else cur
