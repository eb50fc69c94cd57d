"""Clocks: the wall-clock protocol every time-dependent object takes.

``time.time`` in production, a fake in tests.
"""

from __future__ import annotations

from typing import Protocol


class Clock(Protocol):
    """A wall clock returning unix seconds (``time.time`` in production, a fake in tests)."""

    def __call__(self) -> float: ...
