"""Shared helpers for the core tests: fixture bodies and a settable fake clock."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def body(name: str) -> str:
    """Text of a fixture: ``cases/C01_dp_engines.prom`` or ``vllm-metrics/real-cpu-ngram.txt``."""
    return (FIXTURES / name).read_text(encoding="utf-8")


class FakeClock:
    """A unix clock the test moves by hand."""

    def __init__(self, t: float = 1_800_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@pytest.fixture
def clock() -> FakeClock:
    """A fresh fake clock at a fixed time."""
    return FakeClock()
