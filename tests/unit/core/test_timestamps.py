"""The one RFC 3339 writer gives each reader's precision (what the former copies wrote)."""

from datetime import UTC, datetime

from kneepoint.core.timestamps import parse_rfc3339, rfc3339

EPOCH = 1767323045.678912  # 2026-01-02T03:04:05.678912Z


def test_precisions_match_the_forms_kubernetes_and_the_summary_read() -> None:
    moment = datetime.fromtimestamp(EPOCH, UTC)
    assert rfc3339(EPOCH) == moment.strftime("%Y-%m-%dT%H:%M:%SZ") == "2026-01-02T03:04:05Z"
    assert rfc3339(EPOCH, 3) == moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    assert rfc3339(moment, 6) == moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def test_parse_reads_back_and_empty_is_none() -> None:
    assert parse_rfc3339(rfc3339(EPOCH, 6)) == EPOCH
    assert parse_rfc3339("") is None and parse_rfc3339(None) is None
