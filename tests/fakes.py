"""Test doubles shared by every test folder: one settable fake clock and a free TCP port.

The fixtures that hand them out (``clock``, ``registry``) live in ``tests/conftest.py``.
"""

from __future__ import annotations

import socket
from pathlib import Path

#: The repository root (tests read fixtures, docs and deploy files from it).
REPO = Path(__file__).resolve().parents[1]

WALL_START = 1_800_000_000.0  # 2027-01-15T08:00:00Z, a fixed unix time in seconds
MONOTONIC_START = 1000.0  # seconds; arbitrary, like time.monotonic()'s origin


class FakeClock:
    """A clock the test moves by hand: ``wall`` (unix seconds, also what calling the clock
    returns, so it can stand in for ``time.time``) and ``monotonic`` (seconds, for
    ``time.monotonic``). :meth:`advance` moves both by the same amount; assigning ``t`` moves
    only the wall time."""

    def __init__(self, t: float = WALL_START, monotonic_start: float = MONOTONIC_START) -> None:
        self.t = t
        self.mono = monotonic_start

    def __call__(self) -> float:
        return self.t

    def wall(self) -> float:
        """Unix time in seconds (same as calling the clock)."""
        return self.t

    def monotonic(self) -> float:
        """Monotonic seconds."""
        return self.mono

    def advance(self, seconds: float) -> None:
        """Move wall and monotonic time forward by ``seconds``."""
        self.t += seconds
        self.mono += seconds


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (bound to port 0, then closed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
