"""Clocks: the wall-clock protocol every time-dependent object takes, and the one timestamp
format sent to Alertmanager and shown in ``/api/v1/snapshot``.

``time.time`` in production, a fake in tests.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Protocol


class Clock(Protocol):
    """A wall clock returning unix seconds (``time.time`` in production, a fake in tests)."""

    def __call__(self) -> float: ...


def format_rfc3339(ts: float) -> str:
    """Unix seconds → RFC 3339 UTC with milliseconds, e.g. ``2026-11-30T01:02:03.250Z``."""
    dt = datetime.fromtimestamp(ts, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"
