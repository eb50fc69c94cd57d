"""Reads of the ``pairs`` rows: rows by time and category, per-category and per-load-band
:class:`~specwatch.shadow.tally.PairTally` and arm sums aggregated in SQL, the labelled pairs in
order (listed or folded in chunks, for the e-process), reason counts and the row count. Each
read runs in a worker thread on the read connection."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any, TypeVar

from specwatch.shadow.ledger.connections import Connections
from specwatch.shadow.ledger.predicates import (
    ARM_SPEED,
    ARM_TAU,
    LABELLED_SQL,
    TALLY_SQL,
    band_sql,
    decode_sql,
    fixed_sql,
)
from specwatch.shadow.ledger.rows import COLUMNS, LedgerRow, values_to_row
from specwatch.shadow.tally import ArmSums, ArmTotals, PairTally

S = TypeVar("S")

#: The arms whose per-request speculative-decoding counts the ledger stores.
REPLY_ARMS: tuple[str, ...] = ("standard", "fly", "noise")


#: The :class:`~specwatch.shadow.tally.ArmSums` sums, in field order (τ and seconds in fixed
#: point, so every grouping of the same rows gives the same totals).
_ARM_SQL = (
    f"SUM(CASE WHEN {ARM_TAU} THEN 1 ELSE 0 END)",
    f"SUM(CASE WHEN {ARM_TAU} THEN standard_spec_steps ELSE 0 END)",
    f"SUM(CASE WHEN {ARM_TAU} THEN standard_accepted_tokens ELSE 0 END)",
    f"SUM(CASE WHEN {ARM_TAU} THEN fly_spec_steps ELSE 0 END)",
    f"SUM(CASE WHEN {ARM_TAU} THEN fly_accepted_tokens ELSE 0 END)",
    f"SUM(CASE WHEN {ARM_SPEED} THEN 1 ELSE 0 END)",
    f"SUM(CASE WHEN {ARM_SPEED} THEN standard_tokens ELSE 0 END)",
    f"SUM(CASE WHEN {ARM_SPEED} THEN fly_tokens ELSE 0 END)",
    f"SUM(CASE WHEN {ARM_SPEED} THEN {fixed_sql('standard_latency_seconds')} ELSE 0 END)",
    f"SUM(CASE WHEN {ARM_SPEED} THEN {fixed_sql('fly_latency_seconds')} ELSE 0 END)",
    *(f"SUM({e})" for e in decode_sql(fixed_point=True)),
)


#: Each :class:`ArmTotals` field's type, in field order.
_ARM_TOTALS_KINDS: tuple[type[int] | type[float], ...] = tuple(
    float if f.type in (float, "float") else int for f in fields(ArmTotals)
)

#: The :class:`ArmTotals` sums as plain float sums, in field order.
_ARM_FLOAT_SQL = (
    f"SUM(CASE WHEN {ARM_TAU} THEN 1 ELSE 0 END)",
    f"SUM(CASE WHEN {ARM_TAU} THEN standard_spec_steps ELSE 0 END)",
    f"SUM(CASE WHEN {ARM_TAU} THEN standard_accepted_tokens ELSE 0 END)",
    f"SUM(CASE WHEN {ARM_TAU} THEN fly_spec_steps ELSE 0 END)",
    f"SUM(CASE WHEN {ARM_TAU} THEN fly_accepted_tokens ELSE 0 END)",
    f"SUM(CASE WHEN {ARM_SPEED} THEN 1 ELSE 0 END)",
    f"SUM(CASE WHEN {ARM_SPEED} THEN standard_tokens ELSE 0 END)",
    f"SUM(CASE WHEN {ARM_SPEED} THEN fly_tokens ELSE 0 END)",
    f"SUM(CASE WHEN {ARM_SPEED} THEN standard_latency_seconds ELSE 0 END)",
    f"SUM(CASE WHEN {ARM_SPEED} THEN fly_latency_seconds ELSE 0 END)",
    *(f"SUM({e})" for e in decode_sql(fixed_point=False)),
)


def arm_totals_of(r: Sequence[Any]) -> ArmTotals:
    """The :class:`ArmTotals` of plain sums in its field order (``NULL`` sums as 0; each value
    as its field's type: ``int`` counts and tokens, ``float`` seconds)."""
    values: list[Any] = [kind(v or 0) for kind, v in zip(_ARM_TOTALS_KINDS, r, strict=True)]
    return ArmTotals(*values)


def _arm_sums_of(r: Sequence[Any]) -> ArmSums:
    return ArmSums(*(int(v or 0) for v in r))


class RowQueries:
    """The reads of the ledger connected by ``db``."""

    def __init__(self, db: Connections) -> None:
        self._db = db

    @staticmethod
    def _where(
        since: float | None, until: float | None, category: str | None
    ) -> tuple[str, list[Any]]:
        clauses: list[str] = []
        params: list[Any] = []
        if since is not None:
            clauses.append("time >= ?")
            params.append(since)
        if until is not None:
            clauses.append("time < ?")
            params.append(until)
        if category is not None:
            clauses.append("category = ?")
            params.append(category)
        return (" WHERE " + " AND ".join(clauses)) if clauses else "", params

    async def query(
        self,
        since: float | None = None,
        until: float | None = None,
        category: str | None = None,
        limit: int | None = None,
    ) -> list[LedgerRow]:
        """Rows with ``since <= time < until`` (and the category), oldest first."""
        where, params = self._where(since, until, category)
        sql = f"SELECT id, {', '.join(COLUMNS)} FROM pairs{where} ORDER BY time, id"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        raw = await asyncio.to_thread(self._db.read, sql, params)
        return [values_to_row(v) for v in raw]

    async def tally(
        self, since: float | None = None, until: float | None = None
    ) -> dict[str, PairTally]:
        """Per-category :class:`PairTally` over ``since <= time < until``, aggregated in SQL
        (what the statistics are rebuilt from after a restart)."""
        return await self._tally_by("category", since, until)

    async def tally_by_load(
        self, bands: Sequence[int], since: float | None = None, until: float | None = None
    ) -> dict[str, PairTally]:
        """:class:`PairTally` per running-request band (lower bounds ``bands``, labels from
        :func:`~specwatch.shadow.tally.load_band_labels`; rows without a running count are
        ``unknown``) over ``since <= time < until``, all categories together."""
        return await self._tally_by(band_sql(bands), since, until)

    async def arm_totals(
        self, since: float | None = None, until: float | None = None, *, fixed_point: bool = False
    ) -> dict[str, ArmTotals]:
        """Per-category :class:`~specwatch.shadow.tally.ArmTotals` (τ and speed sums of paired
        rows) over ``since <= time < until``, aggregated in SQL. ``fixed_point``: τ and seconds
        summed as :class:`~specwatch.shadow.tally.ArmSums` (each value rounded to 1e-9, exact
        sums in any order: what the live statistics keep); else plain float sums."""
        where, params = self._where(since, until, None)
        cols = _ARM_SQL if fixed_point else _ARM_FLOAT_SQL
        sql = f"SELECT category, {', '.join(cols)} FROM pairs{where} GROUP BY category"
        raw = await asyncio.to_thread(self._db.read, sql, params)
        if fixed_point:
            return {str(r[0]): _arm_sums_of(r[1:]).totals() for r in raw}
        return {str(r[0]): arm_totals_of(r[1:]) for r in raw}

    async def reply_totals(self) -> dict[tuple[str, str], tuple[int, int, int]]:
        """``{(arm, category): (verify steps, draft tokens, accepted tokens)}`` summed over the
        stored per-request speculative-decoding counts of every row (arms ``standard``,
        ``fly``, ``noise``; an arm with no counted reply in a category is absent): what the
        reply counters of the processes that wrote the ledger counted, so the acceptance gain
        survives a restart."""
        cols = ", ".join(
            f"SUM({arm}_{c})"
            for arm in REPLY_ARMS
            for c in ("spec_steps", "draft_tokens", "accepted_tokens")
        )
        sql = f"SELECT category, {cols} FROM pairs GROUP BY category"
        raw = await asyncio.to_thread(self._db.read, sql, ())
        out: dict[tuple[str, str], tuple[int, int, int]] = {}
        for r in raw:
            for i, arm in enumerate(REPLY_ARMS):
                steps, drafted, accepted = (int(v or 0) for v in r[1 + 3 * i : 4 + 3 * i])
                if steps:
                    out[(arm, str(r[0]))] = (steps, drafted, accepted)
        return out

    async def _tally_by(
        self, group: str, since: float | None, until: float | None
    ) -> dict[str, PairTally]:
        where, params = self._where(since, until, None)
        sums = ", ".join(f"SUM(CASE WHEN {cond} THEN 1 ELSE 0 END)" for cond in TALLY_SQL.values())
        sql = f"SELECT {group} AS grp, {sums} FROM pairs{where} GROUP BY grp"
        raw = await asyncio.to_thread(self._db.read, sql, params)
        names = list(TALLY_SQL)
        return {
            str(r[0]): PairTally(**{k: int(v or 0) for k, v in zip(names, r[1:], strict=True)})
            for r in raw
        }

    async def labelled_outcomes(self) -> list[tuple[bool, bool]]:
        """``(standard_correct, fly_correct)`` of every labelled pair
        (:data:`~specwatch.shadow.tally.LABELLED`),
        oldest first (``ORDER BY time, id``): the input of
        :func:`specwatch.shadow.stats.sequential.run_betting` when an e-process is rebuilt."""
        sql = (
            f"SELECT standard_correct, fly_correct FROM pairs WHERE {LABELLED_SQL} "
            "ORDER BY time, id"
        )
        raw = await asyncio.to_thread(self._db.read, sql, ())
        return [(bool(s), bool(f)) for s, f in raw]

    async def fold_labelled(
        self,
        step: Callable[[S, list[tuple[bool, bool]]], S],
        start: S,
        chunk_rows: int = 65_536,
        written_order: bool = False,
    ) -> S:
        """Fold ``step`` over ``(standard_correct, fly_correct)`` of every labelled pair, oldest
        first (the order of :meth:`labelled_outcomes`), in chunks of at most ``chunk_rows``,
        streamed from one query in a worker thread (never the whole list in memory): e.g. the
        e-process rebuilt with :func:`~specwatch.shadow.stats.sequential.run_betting`.
        ``written_order``: in the order the rows were written (``ORDER BY id``: the order the
        sidecar folded them live, as replays finish), not by request time."""
        sql = f"SELECT standard_correct, fly_correct FROM pairs WHERE {LABELLED_SQL} " + (
            "ORDER BY id" if written_order else "ORDER BY time, id"
        )

        def run() -> S:
            acc = start
            with self._db.reading() as conn:
                cur = conn.execute(sql)
                while raw := cur.fetchmany(chunk_rows):
                    acc = step(acc, [(bool(a), bool(b)) for a, b in raw])
            return acc

        return await asyncio.to_thread(run)

    async def reason_counts(self) -> dict[tuple[str, str], int]:
        """``{(status, reason): rows}`` for unpaired and excluded rows (seeds the counters)."""
        raw = await asyncio.to_thread(
            self._db.read,
            "SELECT status, reason, COUNT(*) FROM pairs WHERE status != 'paired' "
            "GROUP BY status, reason",
            (),
        )
        return {(str(s), str(r)): int(c) for s, r, c in raw}

    async def tau_coverage(self) -> dict[tuple[str, str], tuple[int, int]]:
        """Per-request τ coverage of the paired rows: ``{(arm, finish_reason): (rows, rows with
        τ)}`` for the standard and FLy arms (``"none"`` where no finish reason was sent)."""
        out: dict[tuple[str, str], tuple[int, int]] = {}
        for arm in ("standard", "fly"):
            raw = await asyncio.to_thread(
                self._db.read,
                f"SELECT COALESCE({arm}_finish_reason, 'none'), COUNT(*), COUNT({arm}_tau) "
                f"FROM pairs WHERE status = 'paired' GROUP BY 1",
                (),
            )
            out.update({(arm, str(f)): (int(n), int(k)) for f, n, k in raw})
        return out

    async def row_count(self) -> int:
        """Rows in the ledger."""
        raw = await asyncio.to_thread(self._db.read, "SELECT COUNT(*) FROM pairs", ())
        return int(raw[0][0])
