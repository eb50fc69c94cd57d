"""Shared helpers for the core tests: fixture bodies."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


def body(name: str) -> str:
    """Text of a fixture: ``cases/C01_dp_engines.prom`` or ``vllm-metrics/real-cpu-ngram.txt``."""
    return (FIXTURES / name).read_text(encoding="utf-8")
