"""Whether the ledger can store rows (:data:`~specwatch.shadow.values.LedgerState`), told
from the errors SQLite and the file system raise (:func:`state_of_error`), and the two file
operations that go with it: a corrupt file moved aside (:func:`move_aside`) and the integrity
check run while the ledger is open (:func:`quick_check_sync`, blocking: call from a worker
thread).

While the state is not ``ok`` the shadow side stores nothing and replays nothing (a pair whose
row cannot be stored would spend GPU time for nothing); live traffic, scraping and alerting go
on (``specwatch_ledger_state{state}``, ``SpecwatchLedgerFailing``).
"""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

from specwatch.shadow.values import LedgerState

__all__ = [
    "move_aside",
    "quick_check_sync",
    "state_of_error",
]

_CORRUPT_WORDS = ("malformed", "not a database", "corrupt", "file is encrypted")
_FULL_WORDS = ("database or disk is full", "file too large", "no space left")
_READ_ONLY_WORDS = ("readonly", "read-only", "read only", "unable to open", "permission denied")


def state_of_error(exc: BaseException) -> LedgerState:
    """The state an error raised by an open or a write leaves the ledger in (see
    :data:`LedgerState`); never ``ok``."""
    if isinstance(exc, OSError) and not isinstance(exc, sqlite3.Error):
        if exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            return "full"
        if exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
            return "read_only"
        return "unavailable"
    text = str(exc).lower()
    if isinstance(exc, sqlite3.DatabaseError):
        if any(w in text for w in _CORRUPT_WORDS):
            return "corrupt"
        if any(w in text for w in _FULL_WORDS):
            return "full"
        if any(w in text for w in _READ_ONLY_WORDS):
            return "read_only"
    return "unavailable"


def move_aside(path: Path, stamp: str) -> Path:
    """Rename the ledger file ``path`` (and its ``-wal`` and ``-shm`` files, where present) to
    ``<path>.corrupt-<stamp>`` so a fresh ledger can be created in its place; returns the new
    path of the main file. Raises ``OSError`` when the rename fails."""
    aside = path.with_name(f"{path.name}.corrupt-{stamp}")
    for suffix in ("-wal", "-shm"):
        extra = path.with_name(path.name + suffix)
        if extra.exists():
            extra.rename(aside.with_name(aside.name + suffix))
    path.rename(aside)
    return aside


def quick_check_sync(path: Path) -> str | None:
    """``PRAGMA quick_check`` of the ledger at ``path`` on a connection of its own, opened
    read-only (a long-lived connection could answer from pages it cached before the file went
    bad): ``None`` when the database is sound, else the first problem SQLite reports (one
    line). An error raised by the check itself is a problem too."""
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            rows = conn.execute("PRAGMA quick_check(1)").fetchall()
        finally:
            conn.close()
    except sqlite3.DatabaseError as exc:
        return str(exc)
    first = str(rows[0][0]) if rows else "no answer"
    return None if first == "ok" else first
