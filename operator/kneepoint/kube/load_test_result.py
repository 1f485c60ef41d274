"""Pure readings of a load-test Job: did it finish, and the summary its pod left.

The load generator writes its summary (JSON, ``"v": 1``) as the container's termination
message (CONTRACTS B); the Job's conditions say whether it completed or failed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from kneepoint.kube.objects import dig


def job_outcome(job: Mapping[str, Any] | None) -> tuple[bool, bool, str | None]:
    """(succeeded, failed, message) from a Job's conditions."""
    if job is None:
        return False, False, None
    for cond in dig(job, "status", "conditions", default=[]):
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            return True, False, None
        if cond.get("type") == "Failed":
            return False, True, f"{cond.get('reason', 'Failed')}: {cond.get('message', '')}".strip(": ")
    if dig(job, "status", "succeeded", default=0) >= 1:
        return True, False, None
    return False, False, None


def termination_message(pods: Iterable[Mapping[str, Any]], container: str) -> str | None:
    """The termination message of ``container`` in the most recent terminated pod."""
    best: tuple[str, str] | None = None
    for pod in pods:
        for cs in dig(pod, "status", "containerStatuses", default=[]):
            if cs.get("name") != container:
                continue
            term = dig(cs, "state", "terminated")
            if term and term.get("message"):
                stamp = term.get("finishedAt") or ""
                if best is None or stamp > best[0]:
                    best = (stamp, term["message"])
    return best[1] if best else None


def parse_summary(message: str | None) -> dict[str, Any] | None:
    """The load generator's summary (CONTRACTS A) from a termination message, or None."""
    if not message:
        return None
    try:
        data = json.loads(message)
    except ValueError:
        return None
    return data if isinstance(data, dict) and data.get("v") == 1 else None
