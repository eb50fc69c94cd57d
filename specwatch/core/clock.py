"""Clocks: the two kinds of time source every time-dependent object takes, and the one
timestamp format sent to Alertmanager and shown in ``/api/v1/snapshot``.

:class:`WallClock` returns unix seconds (``time.time``): ledger rows, window buckets, alert
times, ``received_at``. :class:`MonotonicClock` returns seconds from an arbitrary origin
(``time.monotonic``) of which only differences mean anything: latencies, token buckets,
staleness, rate limits. Production passes :data:`SYSTEM_WALL` and :data:`SYSTEM_MONOTONIC`;
tests pass fakes (``tests/fakes/``).

Both are called the same way (``clock() -> float``), so a bare callable would let one stand in
for the other unnoticed. Each protocol therefore also requires a ``kind`` marker of its own
literal type, which makes ``mypy --strict`` reject a wall clock where a monotonic one is wanted
(and a bare ``time.time`` or lambda anywhere a clock is wanted).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import ClassVar, Literal, Protocol


class WallClock(Protocol):
    """A wall clock: calling it returns unix seconds (:data:`SYSTEM_WALL` in production)."""

    @property
    def kind(self) -> Literal["wall"]:
        """The marker that tells a wall clock from a monotonic one."""
        ...

    def __call__(self) -> float: ...


class MonotonicClock(Protocol):
    """A monotonic clock: calling it returns seconds that never go back, from an arbitrary
    origin, so only differences mean anything (:data:`SYSTEM_MONOTONIC` in production)."""

    @property
    def kind(self) -> Literal["monotonic"]:
        """The marker that tells a monotonic clock from a wall one."""
        ...

    def __call__(self) -> float: ...


class _SystemWallClock:
    """``time.time`` as a :class:`WallClock`."""

    __slots__ = ()
    kind: ClassVar[Literal["wall"]] = "wall"
    __call__ = staticmethod(time.time)


class _SystemMonotonicClock:
    """``time.monotonic`` as a :class:`MonotonicClock`."""

    __slots__ = ()
    kind: ClassVar[Literal["monotonic"]] = "monotonic"
    __call__ = staticmethod(time.monotonic)


#: The process's wall clock (``time.time``, unix seconds).
SYSTEM_WALL: WallClock = _SystemWallClock()

#: The process's monotonic clock (``time.monotonic``, seconds; only differences mean anything).
SYSTEM_MONOTONIC: MonotonicClock = _SystemMonotonicClock()


def format_rfc3339(ts: float) -> str:
    """Unix seconds → RFC 3339 UTC with milliseconds, e.g. ``2026-11-30T01:02:03.250Z``."""
    dt = datetime.fromtimestamp(ts, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}Z"
