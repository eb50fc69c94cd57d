"""The two SQLite connections of one ledger file (WAL): one for writes, one for reads, each
used under its own lock from worker threads; write transactions are numbered (what a
:class:`~specwatch.shadow.ledger.aggregates.HistoryListener` is told). Blocking: call from a
worker thread (``asyncio.to_thread``)."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

_T = TypeVar("_T")

SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")


class Connections:
    """The write and the read connection of the ledger at ``path`` (``PRAGMA synchronous`` =
    ``synchronous``, one of :data:`SYNCHRONOUS`; raises ``ValueError`` for another)."""

    def __init__(self, path: Path, synchronous: str) -> None:
        if synchronous not in SYNCHRONOUS:
            raise ValueError("synchronous must be OFF|NORMAL|FULL|EXTRA")
        self.path = path
        self.synchronous = synchronous
        self._wconn: sqlite3.Connection | None = None
        self._rconn: sqlite3.Connection | None = None
        self._rlock = threading.Lock()
        self._wlock = threading.Lock()
        self._commits = 0  # write transactions committed (under _wlock)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        conn.execute("PRAGMA busy_timeout=5000")
        return conn

    def open(self, prepare: Callable[[sqlite3.Connection], None]) -> None:
        """Open the write connection, run ``prepare`` on it (schema, migrations), then open the
        read connection. Raises ``sqlite3.Error`` / ``OSError`` when the file cannot be opened."""
        self._wconn = self._connect()
        prepare(self._wconn)
        self._rconn = self._connect()

    def open_read_only(self) -> None:
        """Open only the read connection, with SQLite's ``mode=ro``: no schema, no migration,
        no pragma that writes; the file is never changed. Raises ``sqlite3.Error``."""
        uri = f"{self.path.resolve().as_uri()}?mode=ro"
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA busy_timeout=5000")
        self._rconn = conn

    def close(self) -> None:
        """Close both connections (those open)."""
        for conn in (self._wconn, self._rconn):
            if conn is not None:
                conn.close()
        self._wconn = self._rconn = None

    def transaction(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``work`` on the write connection in one transaction (rolled back if it raises).
        Raises ``ValueError`` when the ledger is closed."""
        return self.numbered_transaction(work)[0]

    def numbered_transaction(
        self,
        work: Callable[[sqlite3.Connection], _T],
        *,
        changes_rows: bool = True,
        begin: str = "BEGIN",
    ) -> tuple[_T, int]:
        """:meth:`transaction`, also returning the number of the write transaction
        committed (1, 2, ... since open; what a ``HistoryListener`` is told). A
        transaction that changes no row (``changes_rows=False``: a read that may repair the
        stored sums) is not numbered: it returns the number of the last one that did."""
        conn = self._wconn
        if conn is None:
            raise ValueError("ledger is closed")
        with self._wlock:
            conn.execute(begin)
            try:
                result = work(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            if changes_rows:
                self._commits += 1
            return result, self._commits

    @contextmanager
    def reading(self) -> Iterator[sqlite3.Connection]:
        """The read connection, held under its lock for the ``with`` block. Raises
        ``ValueError`` when the ledger is closed."""
        conn = self._rconn
        if conn is None:
            raise ValueError("ledger is closed")
        with self._rlock:
            yield conn

    def read(self, sql: str, params: Iterable[Any]) -> list[tuple[Any, ...]]:
        """Every row ``sql`` returns, read on the read connection."""
        with self.reading() as conn:
            return list(conn.execute(sql, tuple(params)).fetchall())
