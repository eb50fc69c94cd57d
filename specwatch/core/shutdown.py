"""The shutdown budget: what SIGTERM starts and when each part of it must be over.

Kubernetes kills a pod ``terminationGracePeriodSeconds`` after it starts terminating, so a
specwatch process drains and exits within ``server.shutdown_timeout_seconds`` (the budget, T):

- :class:`Drain` is the timeline. From the signal until ``T - close_reserve_seconds(T)``
  (:attr:`Drain.until`) live proxied streams and replays in flight may finish; what is still
  open then is cut (streams) or abandoned and counted (replays). The reserve
  (:func:`close_reserve_seconds`: 10 % of T, at most 1 s) is for closing: alert state saved,
  ledger flushed, sessions and listeners closed.
- :class:`ShutdownDeadline` arms a daemon timer when the signal arrives; if the process is
  still alive at T (its teardown hangs: a thread stuck in I/O, the interpreter's executor
  shutdown on a loaded machine), it logs one line and ends the process with ``os._exit``
  (when the orderly cleanup had finished, i.e. only the interpreter's own teardown was slow:
  exit code 0 after SIGTERM, :data:`~specwatch.core.exits.EXIT_INTERRUPTED` after SIGINT; 1
  when it had not finished, whichever the signal).
- :class:`StopSignal` remembers which signal stopped a serving command: both start the same
  orderly stop; SIGTERM (what Kubernetes sends) then ends the command with exit 0, SIGINT
  (Ctrl-C) the way Ctrl-C ends any command: one line and exit 130 from the entry point.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import NoReturn

from specwatch.core.clock import MonotonicClock
from specwatch.core.exits import EXIT_INTERRUPTED
from specwatch.core.logs import log_event

__all__ = [
    "CLOSE_RESERVE_MAX_SECONDS",
    "Drain",
    "ShutdownDeadline",
    "StopSignal",
    "close_reserve_seconds",
    "exit_now",
]

#: The most the closing part of a shutdown is given (see :func:`close_reserve_seconds`).
CLOSE_RESERVE_MAX_SECONDS = 1.0

logger = logging.getLogger("specwatch.shutdown")


def close_reserve_seconds(budget: float) -> float:
    """The end of a ``budget``-second shutdown kept for closing (alert state, ledger flush,
    listeners): 10 % of it, at most :data:`CLOSE_RESERVE_MAX_SECONDS` (10 s → 1 s, 60 s → 1 s,
    5 s → 0.5 s)."""
    return min(CLOSE_RESERVE_MAX_SECONDS, 0.1 * budget)


class Drain:
    """The shutdown timeline of one process: not draining until :meth:`begin`, then draining
    until :attr:`until` (monotonic seconds on ``mono_clock``), ``budget`` seconds after the start
    less :func:`close_reserve_seconds`."""

    def __init__(self, budget: float, mono_clock: MonotonicClock) -> None:
        self.budget = budget
        self._mono_clock = mono_clock
        self.started: float | None = None

    @property
    def draining(self) -> bool:
        """SIGTERM (or SIGINT) arrived: readiness answers 503, listeners accept nothing new."""
        return self.started is not None

    def begin(self) -> None:
        """The signal arrived (idempotent: a second signal keeps the first start)."""
        if self.started is None:
            self.started = self._mono_clock()

    @property
    def until(self) -> float:
        """When streams are cut and replays abandoned (monotonic); raises ``RuntimeError``
        before :meth:`begin`."""
        if self.started is None:
            raise RuntimeError("not draining")
        return self.started + self.budget - close_reserve_seconds(self.budget)

    @property
    def exit_by(self) -> float:
        """When the process must be gone (monotonic; ``RuntimeError`` before :meth:`begin`)."""
        if self.started is None:
            raise RuntimeError("not draining")
        return self.started + self.budget

    def left(self) -> float:
        """Seconds of draining left now (0 once :attr:`until` passed)."""
        return max(0.0, self.until - self._mono_clock())

    def exit_left(self) -> float:
        """Seconds left until :attr:`exit_by` now (0 once passed)."""
        return max(0.0, self.exit_by - self._mono_clock())

    def elapsed(self) -> float:
        """Seconds since :meth:`begin` (0 before it)."""
        return 0.0 if self.started is None else self._mono_clock() - self.started


class StopSignal:
    """The signal that stopped a serving command (the first to arrive; ``None`` before one).

    Its handler calls :meth:`note`; once the orderly stop is over (outside the event loop),
    :meth:`end` raises :class:`KeyboardInterrupt` when that signal was SIGINT, so the entry
    point's one handler prints ``specwatch COMMAND: interrupted`` and exits 130, as for Ctrl-C
    at any other moment; after SIGTERM it returns and the command exits 0.
    """

    def __init__(self) -> None:
        self.received: signal.Signals | None = None

    def note(self, signum: int) -> None:
        """``signum`` arrived (a later signal keeps the first)."""
        if self.received is None:
            self.received = signal.Signals(signum)

    @property
    def interrupted(self) -> bool:
        """SIGINT (Ctrl-C) stopped the command."""
        return self.received is signal.SIGINT

    def end(self) -> None:
        """Raise :class:`KeyboardInterrupt` when SIGINT stopped the command; else return."""
        if self.interrupted:
            raise KeyboardInterrupt


class ShutdownDeadline:
    """Force the process to end ``seconds`` after :meth:`start` unless it exited by then.

    Call :meth:`cleaned` once the orderly cleanup (requests, replays, ledger flush) is done.
    ``stop``: the command's :class:`StopSignal`; a forced exit after a finished cleanup exits
    with :data:`~specwatch.core.exits.EXIT_INTERRUPTED` when SIGINT started it (else 0).
    """

    def __init__(self, seconds: float, stop: StopSignal | None = None) -> None:
        self.seconds = seconds
        self._stop = stop
        self._timer: threading.Timer | None = None
        self._cleaned = False

    def start(self) -> None:
        """Arm the deadline (idempotent)."""
        if self._timer is None:
            self._timer = threading.Timer(self.seconds, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def cleaned(self) -> None:
        """The orderly cleanup finished: a forced exit from now on exits with code 0 (130
        after SIGINT)."""
        self._cleaned = True

    def cancel(self) -> None:
        """Disarm (the process is exiting on its own)."""
        if self._timer is not None:
            self._timer.cancel()

    def _expire(self) -> None:
        interrupted = self._stop is not None and self._stop.interrupted
        code = (EXIT_INTERRUPTED if interrupted else 0) if self._cleaned else 1
        log_event(
            logger,
            logging.WARNING,
            "shutdown deadline reached, exiting now",
            reason="shutdown_timeout",
            seconds=self.seconds,
            cleanup_finished=self._cleaned,
        )
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)


def exit_now(code: int) -> NoReturn:
    """The orderly shutdown is done (requests drained, alert state saved, ledger flushed):
    flush the logs and end the process at once, skipping the
    interpreter's own teardown (with scipy and the rest loaded it took 0.3-1.2 s on a loaded
    machine, time the budget does not have)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)
