"""Read the JSON data files shipped in ``kneepoint/data`` (stdlib only, so the core stays pure)."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any


@cache
def load_data_file(name: str) -> Any:
    """Return the parsed JSON document ``kneepoint/data/<name>``."""
    return json.loads(resources.files("kneepoint.data").joinpath(name).read_text(encoding="utf-8"))
