"""Retention: which rows the ledger deletes (older than ``max_age_seconds``, beyond the newest
``max_rows``), when it is due after a write (at most every ``prune_interval_seconds``), and the
delete itself, which takes the rows' groups back out of ``pair_sums`` and ``pair_cells`` in the
same transaction."""

from __future__ import annotations

import sqlite3
from typing import Any

from specwatch.shadow.ledger.aggregates import (
    HistoryGroup,
    HistoryGrouping,
    history_sync,
    sums_upsert_sql,
)
from specwatch.shadow.ledger.cells import cells_drop_empty, cells_upsert_sql


class Retention:
    """The retention limits of one ledger (``None``: no such limit) and when it last pruned."""

    def __init__(
        self,
        *,
        max_age_seconds: float | None,
        max_rows: int | None,
        prune_interval_seconds: float,
    ) -> None:
        self.max_age_seconds = max_age_seconds
        self.max_rows = max_rows
        self.prune_interval_seconds = prune_interval_seconds
        self._last_prune = -float("inf")

    def due(self, now: float) -> bool:
        """Whether a write at ``now`` also prunes: a limit is set and the last prune after a
        write is at least ``prune_interval_seconds`` old."""
        return (self.max_age_seconds is not None or self.max_rows is not None) and (
            now - self._last_prune >= self.prune_interval_seconds
        )

    def pruned(self, now: float) -> None:
        """Record that a write at ``now`` pruned (the next is due an interval later)."""
        self._last_prune = now

    def prune_sync(
        self,
        conn: sqlite3.Connection,
        now: float,
        groups: list[HistoryGroup] | None = None,
        grouping: HistoryGrouping | None = None,
    ) -> int:
        """Delete what retention drops; with ``grouping``, first append the groups of the rows
        about to go to ``groups`` (same transaction, so they are exactly the rows deleted)."""
        removed = 0
        drops: list[tuple[str, tuple[Any, ...]]] = []
        if self.max_age_seconds is not None:
            drops.append(("time < ?", (now - self.max_age_seconds,)))
        if self.max_rows is not None:
            drops.append(
                (
                    "id < (SELECT id FROM pairs ORDER BY id DESC LIMIT 1 OFFSET ?)",
                    (self.max_rows - 1,),
                )
            )
        for where, params in drops:
            if grouping is not None and groups is not None:
                groups.extend(history_sync(conn, grouping, where, params))
            conn.execute(sums_upsert_sql(where, -1), params)
            conn.execute(cells_upsert_sql(where, -1), params)
            removed += conn.execute(f"DELETE FROM pairs WHERE {where}", params).rowcount
        if removed:
            conn.execute("DELETE FROM pair_sums WHERE n = 0")
            cells_drop_empty(conn)
        return removed
