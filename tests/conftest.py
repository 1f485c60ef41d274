"""Fixtures shared by the contract and integration suites."""

from __future__ import annotations

from pathlib import Path

import pytest

from kneepoint.sandbox import binaries, helm_binary


@pytest.fixture(scope="session")
def helm() -> Path:
    """The pinned helm, built on first use (minutes, once per version); skips only when it cannot be built."""
    try:
        return helm_binary.ensure_helm()
    except binaries.BuildError as exc:
        pytest.skip(f"helm {helm_binary.pins.HELM_VERSION} is not built and cannot be built here: {exc}")
