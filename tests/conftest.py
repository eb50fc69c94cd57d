"""Fixtures for every test folder: a fake wall clock and a fresh Prometheus registry."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from tests.fakes import FakeWallClock


@pytest.fixture
def wall_clock() -> FakeWallClock:
    """A fresh fake wall clock at a fixed unix time (1.8e9 s)."""
    return FakeWallClock()


@pytest.fixture
def registry() -> CollectorRegistry:
    """An empty registry (nothing from the process-wide default one)."""
    return CollectorRegistry()
