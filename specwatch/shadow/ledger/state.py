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
import os
import sqlite3
from pathlib import Path

from specwatch.shadow.values import LedgerState

__all__ = [
    "header_problem",
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


#: The first 16 bytes of every SQLite 3 database file.
SQLITE_MAGIC = b"SQLite format 3\x00"


def header_problem(path: Path) -> str | None:
    """What makes the file at ``path`` no SQLite database, read from its 100-byte header and
    its size alone (cheap: one small read and a stat, run every minute while the ledger is
    open): another format (random bytes, JSON, a zip), a header cut short, a page size SQLite
    never writes, a file shorter than the pages its header counts (truncated), or an empty
    file (no ledger was ever written there: kept aside too, so whatever made it can be
    found). ``None`` when the header is sound or the file absent. Blocking; raises
    ``OSError`` when the file cannot be read."""
    try:
        with path.open("rb") as f:
            head = f.read(100)
            size = os.fstat(f.fileno()).st_size
    except FileNotFoundError:
        return None
    if not head:
        return "empty file"
    if not head.startswith(SQLITE_MAGIC[: len(head)]) or len(head) < len(SQLITE_MAGIC):
        return "not an SQLite database (its first bytes are another format's)"
    if len(head) < 100:
        return f"SQLite header cut short ({len(head)} of 100 bytes)"
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    if page < 512 or page > 65536 or page & (page - 1):
        return f"SQLite header names page size {page}"
    pages = int.from_bytes(head[28:32], "big")
    valid_for = int.from_bytes(head[92:96], "big")
    changes = int.from_bytes(head[24:28], "big")
    if pages and valid_for == changes and size < pages * page:
        # the header's page count is kept on every commit to the main file (and checkpoint)
        return f"truncated: {size} bytes where its header counts {pages} pages of {page}"
    return None


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
