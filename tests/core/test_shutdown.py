"""How a command stopped by a signal ends: :class:`StopSignal` (which signal came first, and
Ctrl-C's ending after the orderly stop) and the forced exit of :class:`ShutdownDeadline`,
whose code says both which signal started the shutdown and whether the cleanup finished."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from specwatch.core.shutdown import StopSignal
from tests.fakes import REPO


def test_stop_signal_keeps_the_first_and_ends_as_ctrl_c_only_after_sigint() -> None:
    """SIGTERM then SIGINT: SIGTERM stopped it, :meth:`end` returns (exit 0 follows); SIGINT
    then SIGTERM: :meth:`end` raises KeyboardInterrupt (the entry point's line and 130); no
    signal at all (a duration ran out): returns."""
    term_first = StopSignal()
    term_first.note(signal.SIGTERM)
    term_first.note(signal.SIGINT)
    assert (term_first.received, term_first.interrupted) == (signal.SIGTERM, False)
    term_first.end()
    StopSignal().end()
    int_first = StopSignal()
    int_first.note(signal.SIGINT)
    int_first.note(signal.SIGTERM)
    assert (int_first.received, int_first.interrupted) == (signal.SIGINT, True)
    with pytest.raises(KeyboardInterrupt):
        int_first.end()


@pytest.mark.parametrize(
    ("sig", "cleaned", "code"),
    [
        (signal.SIGINT, True, 130),  # Ctrl-C, cleanup done: only the teardown hung
        (signal.SIGINT, False, 1),  # Ctrl-C, cleanup not done: a failure whatever the signal
        (signal.SIGTERM, True, 0),
        (signal.SIGTERM, False, 1),
    ],
)
def test_forced_exit_code_names_the_signal_and_the_cleanup(
    sig: signal.Signals, cleaned: bool, code: int
) -> None:
    """A process whose teardown hangs past the deadline (a 30 s sleep against 0.05 s) is ended
    with 130 after SIGINT when the cleanup finished, 0 after SIGTERM, and 1 when it had not."""
    script = (
        "import signal, time\n"
        "from specwatch.core.shutdown import ShutdownDeadline, StopSignal\n"
        "stop = StopSignal()\n"
        f"stop.note({int(sig)})\n"
        "deadline = ShutdownDeadline(0.05, stop)\n"
        f"if {cleaned}:\n"
        "    deadline.cleaned()\n"
        "deadline.start()\n"
        "time.sleep(30)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, timeout=60, check=False
    )
    assert proc.returncode == code, proc.stderr.decode()[-2000:]
    assert b"shutdown deadline reached, exiting now" in proc.stderr
