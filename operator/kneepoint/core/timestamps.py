"""RFC 3339 timestamps in UTC with a ``Z``, the form Kubernetes writes; defined once.

``digits`` picks the precision of the form a reader expects: 0 for ``metav1.Time`` (status,
events, pod states), 3 for the load-test summary's milliseconds, 6 for ``metav1.MicroTime``
(Lease renew times) and CRI log lines. Fractions are truncated, as ``isoformat`` does.
"""

from __future__ import annotations

from datetime import UTC, datetime


def rfc3339(moment: float | datetime, digits: int = 0) -> str:
    """``2026-01-02T03:04:05Z`` (``digits`` 0) or ``2026-01-02T03:04:05.678Z`` (3) for an epoch or a datetime."""
    if not isinstance(moment, datetime):
        moment = datetime.fromtimestamp(moment, UTC)
    moment = moment.astimezone(UTC)
    text = moment.strftime("%Y-%m-%dT%H:%M:%S")
    if digits:
        text += "." + f"{moment.microsecond:06d}"[:digits]
    return text + "Z"


def now_rfc3339(digits: int = 0) -> str:
    """The current time as :func:`rfc3339` writes it."""
    return rfc3339(datetime.now(UTC), digits)


def parse_rfc3339(text: str | None) -> float | None:
    """Epoch seconds of an RFC 3339 text; None for an empty one. Raises ValueError on a malformed one."""
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
