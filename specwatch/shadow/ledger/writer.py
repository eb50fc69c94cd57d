"""The ledger's writes, off the event loop: rows are queued without blocking
(:meth:`QueueWriter.submit`) and committed in batches by one writer task that runs each batch in a
worker thread (``asyncio.to_thread``), pruning when retention is due, in the same transaction.
A failed write is never silent: it is counted per exception type
(:attr:`LedgerHealth.write_errors`, exported as ``specwatch_ledger_write_errors_total``), sets
the ledger's :data:`~specwatch.shadow.ledger.state.LedgerState` (the shadow component logs
one line when it changes, never one per batch: a full disk would write a line a second); a
committed batch sets it back to ``ok``. A batch holding a value SQLite cannot store (an integer
beyond 64 bits) is counted and lost, the state unchanged; a writer task that stops on an unexpected
error sets ``unavailable`` (and :meth:`QueueWriter.start` runs a new one). A batch is committed
once :data:`COMMIT_LINGER_SECONDS` passed after its first row (sooner when it is full or someone
waits in :meth:`QueueWriter.flush` or :meth:`QueueWriter.stop`): at a few pairs a second that is
one transaction, one worker-thread hand-over and one listener update for several rows. Also the one
bulk insert that bypasses the queue."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specwatch.core.clock import WallClock
from specwatch.shadow.ledger.aggregates import (
    HistoryGroup,
    HistoryGrouping,
    HistoryListener,
    write_rows,
)
from specwatch.shadow.ledger.connections import Connections
from specwatch.shadow.ledger.retention import Retention
from specwatch.shadow.ledger.rows import COLUMNS, INSERT, LedgerRow, row_to_values
from specwatch.shadow.ledger.state import state_of_error
from specwatch.shadow.values import LedgerState

log = logging.getLogger(__name__)

#: The states in which rows are not even queued (nothing could store them until
#: :meth:`~specwatch.shadow.ledger.Ledger.retry` or a restart).
_REFUSING: frozenset[LedgerState] = frozenset({"corrupt", "full", "read_only"})
#: How long the writer gathers rows after the first of a batch before committing them.
COMMIT_LINGER_SECONDS = 0.5


@dataclass(frozen=True, slots=True)
class LedgerHealth:
    """Counters the exporter reads: rows committed since open, failed row writes by exception
    type, rows dropped because the write queue was full, the last error text, queue depth, and
    whether rows can be stored (``state``)."""

    rows_written: int
    write_errors: Mapping[str, int]
    dropped: int
    last_error: str | None
    queue_depth: int
    state: LedgerState = "ok"


class QueueWriter:
    """The write queue (at most ``queue_size`` rows) and the task that commits it in batches of
    at most ``batch_size`` on ``db``, pruning by ``retention`` when due (``wall_clock`` supplies
    "now" for it). Tells :attr:`listener` about every committed batch and pruned rows."""

    def __init__(
        self,
        db: Connections,
        retention: Retention,
        *,
        batch_size: int,
        queue_size: int,
        wall_clock: WallClock,
    ) -> None:
        self._db = db
        self._retention = retention
        self.batch_size = batch_size
        self._wall_clock = wall_clock
        self._queue: asyncio.Queue[LedgerRow | None] = asyncio.Queue(maxsize=queue_size)
        self._task: asyncio.Task[None] | None = None
        self._submitted = 0
        self._processed = 0
        self._progress = asyncio.Condition()
        #: Set when someone waits for the queued rows: the writer commits without lingering.
        self._hurry = asyncio.Event()
        self._rows_written = 0
        self._write_errors: dict[str, int] = {}
        self._dropped = 0
        self._last_error: str | None = None
        self._state: LedgerState = "ok"
        self._ended = False  # the writer task left its loop (flush() waiters stop waiting)
        #: Told about committed and pruned rows (see :class:`HistoryListener`); ``None``: nobody.
        self.listener: HistoryListener | None = None

    def start(self) -> None:
        """Start the writer task (on the running loop; idempotent)."""
        if self._task is None or self._task.done():  # a writer that stopped on a bug restarts
            self._ended = False
            self._task = asyncio.create_task(self._write_loop(), name="ledger-writer")

    @property
    def started(self) -> bool:
        """The writer task runs."""
        return self._task is not None

    @property
    def state(self) -> LedgerState:
        """Whether rows can be stored now."""
        return self._state

    def mark(self, state: LedgerState, detail: str | None = None) -> None:
        """Set the ledger's state (``detail``: the error, kept as ``last_error``)."""
        if detail is not None:
            self._last_error = detail
        self._state = state

    async def stop(self) -> None:
        """Write everything queued, then stop the writer task (if started)."""
        if self._task is not None:
            await self._queue.put(None)
            self._hurry.set()
            await self._task
            self._task = None

    def submit(self, row: LedgerRow) -> bool:
        """Queue one row without blocking; ``False`` (and ``dropped`` + 1) when the queue is
        full; ``False`` (counted in ``write_errors["not_stored"]``) while the ledger is
        ``corrupt``, ``full`` or ``read_only`` (an ``unavailable`` one is tried again with every
        batch). Call from the event loop's thread."""
        if self._state in _REFUSING:
            self._write_errors["not_stored"] = self._write_errors.get("not_stored", 0) + 1
            return False
        try:
            self._queue.put_nowait(row)
        except asyncio.QueueFull:
            self._dropped += 1
            return False
        self._submitted += 1
        return True

    async def flush(self) -> None:
        """Wait until every row submitted so far has been committed, counted as failed or lost
        with a writer that stopped on a bug (the state is then ``unavailable``).

        Raises RuntimeError if the ledger is not open or its writer task stopped before the
        rows were taken.
        """
        writer = self._task
        if writer is None:
            raise RuntimeError("ledger is not open")
        target = self._submitted
        self._hurry.set()
        async with self._progress:
            await self._progress.wait_for(
                lambda: self._processed >= target or self._ended or writer.done()
            )
        if self._processed < target:
            raise RuntimeError("ledger writer stopped") from (
                writer.exception() if writer.done() and not writer.cancelled() else None
            )

    async def _write_loop(self) -> None:
        try:
            await self._write_until_stopped()
        except Exception as exc:  # a bug of ours: nothing is stored until retry() restarts
            kind = type(exc).__name__
            self._write_errors[kind] = self._write_errors.get(kind, 0) + 1
            self.mark("unavailable", f"writer stopped: {kind}: {exc}")
            log.error("ledger writer stopped", exc_info=True)
        finally:  # wake flush() waiters whatever happened
            self._ended = True
            async with self._progress:
                self._progress.notify_all()

    async def _write_until_stopped(self) -> None:
        stop = False
        while not stop:
            first = await self._queue.get()
            if first is not None and not self._hurry.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._hurry.wait(), COMMIT_LINGER_SECONDS)
            self._hurry.clear()
            batch: list[LedgerRow] = []
            if first is None:
                stop = True
            else:
                batch.append(first)
            while len(batch) < self.batch_size and not stop:
                try:
                    item = self._queue.get_nowait()
                except asyncio.QueueEmpty:
                    break
                if item is None:
                    stop = True
                else:
                    batch.append(item)
            try:
                if batch:
                    await self._write_batch(batch)
            finally:  # written, counted as failed, or lost with a writer that stopped
                async with self._progress:
                    self._processed += len(batch)
                    self._progress.notify_all()

    async def _write_batch(self, batch: list[LedgerRow]) -> None:
        now = self._wall_clock()
        prune = self._retention.due(now)
        listener = self.listener
        grouping = listener.grouping() if listener is not None and prune else None
        try:
            pruned, commit = await asyncio.to_thread(
                self._insert_sync, batch, now if prune else None, grouping
            )
        except OverflowError as exc:  # a value SQLite cannot store: the rows, not the file
            kind = type(exc).__name__
            self._write_errors[kind] = self._write_errors.get(kind, 0) + len(batch)
            self._last_error = f"{kind}: {exc}"
            log.warning("ledger rows not stored: %s: %s", kind, exc)
            return
        except (sqlite3.Error, OSError, ValueError) as exc:
            kind = type(exc).__name__
            self._write_errors[kind] = self._write_errors.get(kind, 0) + len(batch)
            self.mark(state_of_error(exc), f"{kind}: {exc}")
            return
        self._rows_written += len(batch)
        if self._state == "unavailable":
            self._state = "ok"
        if prune:
            self._retention.pruned(now)
        if listener is not None and listener is self.listener:
            listener.rows_written(batch, commit)
            if pruned:
                listener.rows_pruned(pruned, commit)

    def _insert_sync(
        self, batch: list[LedgerRow], prune_now: float | None, grouping: HistoryGrouping | None
    ) -> tuple[list[HistoryGroup], int]:
        values = [row_to_values(r) for r in batch]
        groups: list[HistoryGroup] = []

        def work(conn: sqlite3.Connection) -> None:
            write_rows(conn, INSERT, values)
            if prune_now is not None:
                self._retention.prune_sync(conn, prune_now, groups, grouping)

        _, commit = self._db.numbered_transaction(work)
        return groups, commit

    async def write_many(self, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
        """Insert ``rows`` (values in ``columns`` order, booleans as ``bool`` or 0/1; columns not
        named are ``NULL``) in one transaction, bypassing the write queue: bulk import of
        synthetic ledgers for benchmarks and examples. Returns the number of rows written.
        Raises ``ValueError`` for a column that is not a :class:`LedgerRow` field (or a closed
        ledger) and ``sqlite3.Error`` from SQLite; nothing is written on failure."""
        unknown = [c for c in columns if c not in COLUMNS]
        if unknown or not columns:
            raise ValueError(f"write_many: unknown or no columns {unknown!r}")
        sql = f"INSERT INTO pairs ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
        batch = list(rows)
        await asyncio.to_thread(self._db.transaction, lambda c: write_rows(c, sql, batch))
        self._rows_written += len(batch)
        return len(batch)

    @property
    def health(self) -> LedgerHealth:
        """Write counters for export; cheap, no I/O."""
        return LedgerHealth(
            rows_written=self._rows_written,
            write_errors=dict(self._write_errors),
            dropped=self._dropped,
            last_error=self._last_error,
            queue_depth=self._queue.qsize(),
            state=self._state,
        )
