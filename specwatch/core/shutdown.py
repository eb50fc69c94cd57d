"""A hard deadline for shutting down: Kubernetes kills a pod ``terminationGracePeriodSeconds``
after SIGTERM, so a specwatch process exits before that even when its teardown hangs (a thread
stuck in I/O, the interpreter's executor shutdown on a loaded machine).

:class:`ShutdownDeadline` arms a daemon timer when the signal arrives; if the process is still
alive when it fires, it logs one line and ends the process with ``os._exit`` (exit code 0 when
the orderly cleanup had finished, i.e. only the interpreter's own teardown was slow; 1 when the
cleanup itself did not finish).
"""

from __future__ import annotations

import logging
import os
import sys
import threading

from specwatch.core.logs import log_event

__all__ = ["ShutdownDeadline"]

logger = logging.getLogger("specwatch.shutdown")


class ShutdownDeadline:
    """Force the process to end ``seconds`` after :meth:`start` unless it exited by then.

    Call :meth:`cleaned` once the orderly cleanup (requests, replays, ledger flush) is done.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._timer: threading.Timer | None = None
        self._cleaned = False

    def start(self) -> None:
        """Arm the deadline (idempotent)."""
        if self._timer is None:
            self._timer = threading.Timer(self.seconds, self._expire)
            self._timer.daemon = True
            self._timer.start()

    def cleaned(self) -> None:
        """The orderly cleanup finished: a forced exit from now on exits with code 0."""
        self._cleaned = True

    def cancel(self) -> None:
        """Disarm (the process is exiting on its own)."""
        if self._timer is not None:
            self._timer.cancel()

    def _expire(self) -> None:
        code = 0 if self._cleaned else 1
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
