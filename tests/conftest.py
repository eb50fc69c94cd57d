"""Fixtures for every test folder: a fake clock and a fresh Prometheus registry."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from tests.fakes import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    """A fresh fake clock at a fixed time (wall 1.8e9 s, monotonic 1000 s)."""
    return FakeClock()


@pytest.fixture
def registry() -> CollectorRegistry:
    """An empty registry (nothing from the process-wide default one)."""
    return CollectorRegistry()
