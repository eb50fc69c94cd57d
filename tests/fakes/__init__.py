"""Test doubles shared by every test folder: settable fake clocks (one per kind) and a free TCP
port.

The fixtures that hand them out (``wall_clock``, ``registry``) live in ``tests/conftest.py``.
"""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import ClassVar, Literal

from specwatch.shadow.values import ReplayPair

#: The repository root (tests read fixtures, docs and deploy files from it).
REPO = Path(__file__).resolve().parents[2]

WALL_START = 1_800_000_000.0  # 2027-01-15T08:00:00Z, a fixed unix time in seconds
MONOTONIC_START = 1000.0  # seconds; arbitrary, like time.monotonic()'s origin


class _FakeTime:
    """Seconds the test sets (``t``) or moves (:meth:`advance`); calling it returns them."""

    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        """Move the time forward by ``seconds``."""
        self.t += seconds


class FakeWallClock(_FakeTime):
    """A :class:`~specwatch.core.clock.WallClock` the test moves by hand (unix seconds)."""

    kind: ClassVar[Literal["wall"]] = "wall"

    def __init__(self, t: float = WALL_START) -> None:
        super().__init__(t)


class FakeMonotonicClock(_FakeTime):
    """A :class:`~specwatch.core.clock.MonotonicClock` the test moves by hand (seconds)."""

    kind: ClassVar[Literal["monotonic"]] = "monotonic"

    def __init__(self, t: float = MONOTONIC_START) -> None:
        super().__init__(t)


class FakeClocks:
    """One fake of each kind, for objects that take both: :meth:`advance` moves ``wall`` and
    ``mono`` by the same amount (assigning ``wall.t`` or ``mono.t`` moves only that one)."""

    def __init__(self, wall: float = WALL_START, mono: float = MONOTONIC_START) -> None:
        self.wall = FakeWallClock(wall)
        self.mono = FakeMonotonicClock(mono)

    def advance(self, seconds: float) -> None:
        """Move wall and monotonic time forward by ``seconds``."""
        self.wall.advance(seconds)
        self.mono.advance(seconds)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class PairSinkFn:
    """A :class:`~specwatch.shadow.pipeline.PairSink` that hands each pair to the async function
    ``fn`` (a test collects pairs or fails on one)."""

    def __init__(self, fn: Callable[[ReplayPair], Awaitable[None]]) -> None:
        self._fn = fn

    async def take_pair(self, pair: ReplayPair) -> None:
        """Await ``fn(pair)``."""
        await self._fn(pair)
