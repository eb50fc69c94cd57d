"""Shared helpers for the core tests: fixture bodies."""

from __future__ import annotations

from tests.fakes import REPO

FIXTURES = REPO / "tests" / "fixtures"


def body(name: str) -> str:
    """Text of a fixture: ``cases/C01_dp_engines.prom`` or ``vllm-metrics/real-cpu-ngram.txt``."""
    return (FIXTURES / name).read_text(encoding="utf-8")
