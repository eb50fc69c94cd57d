"""The exit codes every command shares besides 0 (done) and 2 (bad input or settings).

It imports nothing, so the entry point reads them without loading anything, and the forced
exit at the end of a shutdown budget (:mod:`specwatch.core.shutdown`) uses the same ones.
"""

from __future__ import annotations

__all__ = ["EXIT_CLOSED_PIPE", "EXIT_INTERRUPTED"]

#: The exit code after Ctrl-C (128 + SIGINT, as a shell reports a process SIGINT ended), at
#: any moment: during start-up, or while a command serves (after its orderly stop).
EXIT_INTERRUPTED = 130

#: The exit code when stdout's reader went away (``specwatch analyze ... | head``), as
#: Python's documentation of SIGPIPE advises.
EXIT_CLOSED_PIPE = 1
