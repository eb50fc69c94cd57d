"""Pair ledger: one SQLite row per replayed pair (WAL mode, written off the event loop).

:class:`Ledger` is the one object the rest of specwatch opens; it composes the package's parts.
Writes are queued by :meth:`Ledger.submit` (non-blocking) and committed in batches by one
writer task in a worker thread (:mod:`.writer`); reads also run in a thread on a second
connection (:mod:`.connections`, :mod:`.queries`, :mod:`.reports`), so nothing blocks the loop.
A committed batch survives a ``kill -9`` of the process (WAL, ``synchronous=NORMAL``; use
``FULL`` to survive power loss too). A failed write is never silent: it is counted per
exception type (:attr:`LedgerHealth.write_errors`, exported as
``specwatch_ledger_write_errors_total``) and logged as one structured line. No prompt or
completion text is stored unless ``store_text``.

A ledger that cannot store rows never stops the process: :meth:`Ledger.open` moves a corrupt
file aside (``<path>.corrupt-<unix seconds>``) and starts a fresh one; a read-only, full or
otherwise failing file leaves the ledger open in that state
(:data:`~specwatch.shadow.values.LedgerState`; nothing is stored; :meth:`Ledger.retry` tries
again); :meth:`Ledger.quick_check` finds corruption while running. The state is in
:attr:`LedgerHealth.state`.

Beside the rows, table ``pair_sums`` holds their aggregates, updated in the same transaction as
every insert and every retention prune (:mod:`.aggregates`, :mod:`.retention`), so the restart
rebuild (:meth:`Ledger.history`) reads O(stored groups + the rows of the last day or two)
instead of grouping every row.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from specwatch.core.clock import SYSTEM_WALL, WallClock
from specwatch.core.logs import log_event
from specwatch.shadow.ledger.aggregates import (
    SUMS_SCHEMA,
    HistoryGroup,
    HistoryGrouping,
    HistoryListener,
    drop_outdated_aggregates,
    stored_history_sync,
    sums_rebuild,
)
from specwatch.shadow.ledger.cells import CELLS_SCHEMA
from specwatch.shadow.ledger.connections import Connections
from specwatch.shadow.ledger.queries import RowQueries
from specwatch.shadow.ledger.reports import ReportQueries
from specwatch.shadow.ledger.retention import Retention
from specwatch.shadow.ledger.rows import SCHEMA, LedgerRow, add_missing_columns
from specwatch.shadow.ledger.state import (
    header_problem,
    move_aside,
    quick_check_sync,
    state_of_error,
)
from specwatch.shadow.ledger.writer import LedgerHealth, QueueWriter
from specwatch.shadow.values import LedgerState, PairOutcome

log = logging.getLogger("specwatch.shadow.ledger")

#: The table a write probe writes to and empties (:meth:`Ledger.retry`).
_PROBE = "CREATE TABLE IF NOT EXISTS write_probe (x INTEGER)"


def _probe(conn: sqlite3.Connection) -> None:
    """One small write that needs free space and a writable file (rolled into a transaction)."""
    conn.execute(_PROBE)
    conn.execute("INSERT INTO write_probe VALUES (1)")
    conn.execute("DELETE FROM write_probe")


def _prepare(conn: sqlite3.Connection) -> None:
    """Create the tables a ledger needs (a new file's empty aggregates are current before any
    numbered write) and add the columns an older ledger lacks."""
    for stmt in (*SCHEMA, *SUMS_SCHEMA, *CELLS_SCHEMA):
        conn.execute(stmt)
    if drop_outdated_aggregates(conn):
        for stmt in (*SUMS_SCHEMA, *CELLS_SCHEMA):
            conn.execute(stmt)
    if conn.execute("SELECT NOT EXISTS (SELECT 1 FROM pairs)").fetchone()[0]:
        conn.execute("BEGIN IMMEDIATE")
        sums_rebuild(conn)
        conn.execute("COMMIT")
    add_missing_columns(conn)


class Ledger(RowQueries, ReportQueries):
    """Async pair ledger over one SQLite file (or ``":memory:"`` is not supported: WAL needs a
    file).

    The reads are :class:`~specwatch.shadow.ledger.queries.RowQueries`' (rows, tallies, arm
    sums, labelled pairs) and :class:`~specwatch.shadow.ledger.reports.ReportQueries`' (the
    report's), inherited: each is written once, there, on the ledger's read connection.

    Use ``await ledger.open()`` / ``await ledger.close()`` (or ``async with``). ``wall_clock``
    supplies "now" for retention. ``max_age_seconds`` / ``max_rows`` prune old rows after
    writes, at most every ``prune_interval_seconds``. Raises ``ValueError`` unless
    ``synchronous`` is ``OFF``, ``NORMAL``, ``FULL`` or ``EXTRA``.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        store_text: bool = False,
        max_age_seconds: float | None = None,
        max_rows: int | None = None,
        batch_size: int = 1000,
        queue_size: int = 100_000,
        synchronous: str = "NORMAL",
        prune_interval_seconds: float = 60.0,
        wall_clock: WallClock = SYSTEM_WALL,
    ) -> None:
        self._db = Connections(Path(path), synchronous)
        self.path = self._db.path
        self.store_text = store_text
        self._wall_clock = wall_clock
        self._retention = Retention(
            max_age_seconds=max_age_seconds,
            max_rows=max_rows,
            prune_interval_seconds=prune_interval_seconds,
        )
        self._writer = QueueWriter(
            self._db,
            self._retention,
            batch_size=batch_size,
            queue_size=queue_size,
            wall_clock=wall_clock,
        )

    @property
    def listener(self) -> HistoryListener | None:
        """Told about committed and pruned rows (see :class:`HistoryListener`); ``None``: nobody."""
        return self._writer.listener

    @listener.setter
    def listener(self, listener: HistoryListener | None) -> None:
        self._writer.listener = listener

    # -- lifecycle -------------------------------------------------------------------------

    async def open(self) -> None:
        """Create or open the database (schema, WAL), check that it can be written and start
        the writer task. A corrupt file is moved aside (:func:`~.state.move_aside`, logged) and
        a fresh ledger created; any other failure leaves the ledger in that state (see
        :attr:`state`), storing nothing until :meth:`retry` succeeds. Never raises for the
        file's state: only ``ValueError`` for bad settings."""
        state, detail = await asyncio.to_thread(self._open_sync)
        if state == "corrupt":
            stamp = f"{int(self._wall_clock())}"
            try:
                aside = await asyncio.to_thread(move_aside, self.path, stamp)
            except OSError as exc:
                self._writer.mark("corrupt", f"{detail}; not moved aside: {exc}")
                return
            log_event(
                log,
                logging.WARNING,
                "corrupt ledger moved aside, a new one started",
                path=str(self.path),
                moved_to=str(aside),
                error=detail,
            )
            self.moved_aside = aside
            state, detail = await asyncio.to_thread(self._open_sync)
        if state != "ok":
            self._writer.mark(state, detail)
            return
        self._writer.start()

    async def open_read_only(self) -> None:
        """Open the ledger for reads only (SQLite ``mode=ro``): nothing is created, migrated or
        written and no writer runs; what ``specwatch report`` uses. Raises ``sqlite3.Error``
        when the file cannot be read."""
        await asyncio.to_thread(self._db.open_read_only)

    #: Where :meth:`open` moved a corrupt file (``None``: it did not).
    moved_aside: Path | None = None

    def _open_sync(self) -> tuple[LedgerState, str | None]:
        try:
            problem = header_problem(self.path)
        except OSError as exc:
            return state_of_error(exc), f"{type(exc).__name__}: {exc}"
        if problem is not None:  # another format, a cut header, a truncated file
            return "corrupt", problem
        try:
            self._db.open(_prepare)
            self._db.transaction(_probe)
        except (sqlite3.Error, OSError) as exc:
            self._db.close()
            return state_of_error(exc), f"{type(exc).__name__}: {exc}"
        return "ok", None

    @property
    def state(self) -> LedgerState:
        """Whether rows can be stored now (:data:`~specwatch.shadow.values.LedgerState`)."""
        return self._writer.state

    async def retry(self) -> LedgerState:
        """Try again to store rows after a failure: open the file when :meth:`open` could
        not, else one small write; on success the state is ``ok`` again (logged) and the
        writer runs. A ``corrupt`` ledger stays so (the next start moves it aside). Returns the
        state."""
        if self.state in ("ok", "corrupt"):
            return self.state
        if not self._writer.started:
            state, detail = await asyncio.to_thread(self._open_sync)
        else:
            try:
                await asyncio.to_thread(self._db.transaction, _probe)
                state, detail = "ok", None
            except (sqlite3.Error, OSError, ValueError) as exc:
                state, detail = state_of_error(exc), f"{type(exc).__name__}: {exc}"
        self._writer.mark(state, detail)
        if state == "ok":
            self._writer.start()
        return state

    async def quick_check(self) -> str | None:
        """SQLite's quick integrity check of the file (:func:`~.state.quick_check_sync`), in
        a worker thread: ``None`` when sound (or the ledger is not open), else the problem, and
        the state is then ``corrupt``."""
        if not self._writer.started:
            return None
        problem = await asyncio.to_thread(quick_check_sync, self.path)
        if problem is not None:
            self._writer.mark("corrupt", problem)
        return problem

    async def header_check(self) -> str | None:
        """The cheap check run every minute: the file's header and size
        (:func:`~.state.header_problem`, a 100-byte read), confirmed by
        :meth:`quick_check` when it finds a problem (a header read while a checkpoint grows
        the file can look short for a moment). ``None`` when sound (or the ledger is not
        open), else the problem, and the state is then ``corrupt``."""
        if not self._writer.started:
            return None
        try:
            problem = await asyncio.to_thread(header_problem, self.path)
        except OSError as exc:
            problem = f"{type(exc).__name__}: {exc}"
        if problem is None:
            return None
        return await self.quick_check()

    async def close(self) -> None:
        """Write everything queued, stop the writer and close both connections."""
        await self._writer.stop()
        await asyncio.to_thread(self._db.close)

    async def __aenter__(self) -> Ledger:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- writes ----------------------------------------------------------------------------

    def submit(self, outcome: PairOutcome | LedgerRow) -> bool:
        """Queue one pair for writing without blocking; ``False`` (and ``dropped`` + 1) when
        the queue is full. Call from the event loop's thread."""
        row = (
            outcome
            if isinstance(outcome, LedgerRow)
            else LedgerRow.from_outcome(outcome, self.store_text)
        )
        return self._writer.submit(row)

    async def flush(self) -> None:
        """Wait until every row submitted so far has been committed or counted as failed
        (:meth:`QueueWriter.flush`)."""
        await self._writer.flush()

    async def write_many(self, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
        """Insert ``rows`` of ``columns`` in one transaction, bypassing the write queue
        (:meth:`QueueWriter.write_many`)."""
        return await self._writer.write_many(columns, rows)

    async def prune(self, now: float | None = None) -> int:
        """Apply retention now (after flushing); returns the number of rows deleted."""
        await self.flush()
        at = self._wall_clock() if now is None else now
        listener = self.listener
        grouping = listener.grouping() if listener is not None else None
        groups: list[HistoryGroup] = []

        removed, commit = await asyncio.to_thread(
            self._db.numbered_transaction,
            lambda c: self._retention.prune_sync(c, at, groups, grouping),
        )
        if listener is not None and groups and listener is self.listener:
            listener.rows_pruned(groups, commit)
        return removed

    @property
    def health(self) -> LedgerHealth:
        """Write counters for export; cheap, no I/O."""
        return self._writer.health

    # -- the restart rebuild ---------------------------------------------------------------

    async def history(self, grouping: HistoryGrouping) -> tuple[int, list[HistoryGroup]]:
        """Every row's :class:`~specwatch.shadow.tally.HistoryCell` summed per (time bucket,
        category, load band) (see :class:`HistoryGrouping`): what the live statistics are
        rebuilt from after a restart. Returns ``(commit, groups)``: the groups hold exactly the
        write transactions numbered up to ``commit`` (writes wait while it reads), so a
        :class:`HistoryListener` attached before the call knows which later notifications to
        apply. Runs in a worker thread.

        Reads the per-day aggregates stored beside the rows (table ``pair_sums``, kept in the
        same transaction as every write and prune) for the days before the horizon's, and
        groups only the rows from that day on; O(stored groups + recent rows), not O(rows).
        When the aggregates do not describe the rows (a ledger from an older specwatch, rows
        written by another program, another layout) they are rebuilt first from every row (one
        grouped pass, logged as "ledger aggregates rebuilt" with the reason). Raises
        ``ValueError`` when the ledger is closed, ``sqlite3.Error`` from SQLite."""
        groups, commit = await asyncio.to_thread(
            lambda: self._db.numbered_transaction(
                lambda c: stored_history_sync(c, grouping),
                changes_rows=False,
                begin="BEGIN IMMEDIATE",
            )
        )
        return commit, groups
