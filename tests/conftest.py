"""Fixtures shared by the contract and integration suites."""

from __future__ import annotations

from pathlib import Path

import pytest

from kneepoint.sandbox import binaries, helm_binary

# Fixtures that build something (the pinned helm from Go modules, the wheel): a test that
# uses one, directly or through another fixture, is marked `build` and runs in
# `make contract`, not in the fast loop `make unit`.
BUILD_FIXTURES = frozenset({"helm", "wheel"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if BUILD_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.build)


@pytest.fixture(scope="session")
def helm() -> Path:
    """The pinned helm, built on first use (minutes, once per version); skips only when it cannot be built."""
    try:
        return helm_binary.ensure_helm()
    except binaries.BuildError as exc:
        pytest.skip(f"helm {helm_binary.pins.HELM_VERSION} is not built and cannot be built here: {exc}")
