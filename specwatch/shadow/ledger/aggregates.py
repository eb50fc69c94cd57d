"""Table ``pair_sums``: the ``pairs`` rows' aggregates per (UTC day, category, running count,
pattern of the tally columns), row count and fixed-point arm sums, updated in the same
transaction as every insert and every retention prune; and the restart rebuild
(:meth:`Ledger.history <specwatch.shadow.ledger.ledger.Ledger.history>`) read from them in
O(stored groups + the rows of the last day or two) instead of grouping every row.
``pair_sums_meta`` records the layout and the newest row id they cover; when they disagree with
the rows (an older specwatch's ledger, rows written by another program) the next rebuild
recomputes them from every row, once, and logs it. Blocking functions over a connection, run
inside the caller's transaction."""

from __future__ import annotations

import functools
import logging
import operator
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any, Protocol

from specwatch.core.logs import log_event
from specwatch.shadow.ledger.cells import (
    CELL_SECONDS,
    CELLS_COLUMNS,
    CELLS_LAYOUT,
    cells_history_sync,
    cells_rebuild,
    cells_rows,
    cells_upsert_sql,
)
from specwatch.shadow.ledger.predicates import (
    ARM_SPEED,
    ARM_TAU,
    STATUSES,
    TRI_COLUMNS,
    band_sql,
    decode_sql,
    fixed_sql,
)
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.shadow.tally import FIXED_POINT, ArmSums, HistoryCell, PairTally, row_tally

log = logging.getLogger("specwatch.shadow.ledger")


@dataclass(frozen=True, slots=True)
class HistoryGrouping:
    """How :meth:`Ledger.history` groups rows: time buckets of ``bucket_seconds`` (bucket index
    ``CAST(time / bucket_seconds AS INTEGER)``), rows before ``horizon`` (unix seconds; ``None``:
    every row, when no finite window needs buckets) pooled into one bucket ``None``,
    running-request bands with lower bounds ``bands``."""

    bucket_seconds: float
    horizon: float | None
    bands: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class HistoryGroup:
    """One group of :meth:`Ledger.history`: the :class:`~specwatch.shadow.tally.HistoryCell` of
    the rows of one (``bucket``, ``category``, load ``band``)."""

    bucket: int | None
    category: str
    band: str
    cell: HistoryCell


class HistoryListener(Protocol):
    """What a ledger tells the statistics that mirror it (called on the event loop's thread):
    the rows of each committed batch, and the groups of the rows retention deleted, each with
    the number of the write transaction that did it (:meth:`Ledger.history` says which
    transactions it already holds)."""

    def grouping(self) -> HistoryGrouping:
        """How deleted rows are to be grouped."""
        ...

    def rows_written(self, rows: Sequence[LedgerRow], commit: int) -> None:
        """A batch committed as the ledger's ``commit``-th write transaction."""
        ...

    def rows_pruned(self, groups: Sequence[HistoryGroup], commit: int) -> None:
        """Rows deleted by retention in write transaction ``commit``, grouped by
        :meth:`grouping`."""
        ...


_TRI_BASE = len(STATUSES) + 1
_FLAG_BASE = _TRI_BASE * 3 ** len(TRI_COLUMNS)


def _pattern_sql() -> str:
    """One integer per distinct combination of what the tally rules and the arm-sum conditions
    read: the status, each rule column as 0 / 1 / 2 (unknown), and whether the τ and speed sums
    apply. Grouping by it instead of by each column keeps the grouped pass to four keys."""
    status = " ".join(f"WHEN '{st}' THEN {i}" for i, st in enumerate(STATUSES))
    parts = [f"(CASE status {status} ELSE {len(STATUSES)} END)"]
    parts += [f"{_TRI_BASE * 3**k} * COALESCE({c}, 2)" for k, c in enumerate(TRI_COLUMNS)]
    parts.append(f"{_FLAG_BASE} * COALESCE(({ARM_TAU}), 0)")
    parts.append(f"{_FLAG_BASE * 2} * COALESCE(({ARM_SPEED}), 0)")
    return " + ".join(parts)


@dataclass(frozen=True, slots=True)
class _Pattern:
    """A stand-in row for one pattern code (what :func:`row_tally` reads)."""

    time: float
    category: str
    status: str
    standard_correct: bool | None
    fly_correct: bool | None
    noise_correct: bool | None
    fly_agrees: bool | None
    noise_agrees: bool | None
    greedy: bool | None
    baseline_agrees: bool | None
    noise_baseline_agrees: bool | None


@functools.lru_cache(maxsize=8192)
def _decode(code: int) -> tuple[PairTally, bool, bool]:
    """``(tally of one row, τ sums apply, speed sums apply)`` of a :func:`_pattern_sql` code."""
    status_i = code % _TRI_BASE
    values: dict[str, Any] = {}
    for k, c in enumerate(TRI_COLUMNS):
        v = (code // (_TRI_BASE * 3**k)) % 3
        values[c] = None if v == 2 else bool(v)
    flags = code // _FLAG_BASE
    status = STATUSES[status_i] if status_i < len(STATUSES) else "other"
    row = _Pattern(time=0.0, category="", status=status, **values)
    return row_tally(row), bool(flags & 1), bool(flags & 2)


_PATTERN_SQL = _pattern_sql()


#: The fixed-point sums every grouped pass reads, in :class:`ArmSums` order after the counts.
_SUM_EXPRS = (
    "SUM(standard_spec_steps)",
    "SUM(standard_accepted_tokens)",
    "SUM(fly_spec_steps)",
    "SUM(fly_accepted_tokens)",
    "SUM(standard_tokens)",
    "SUM(fly_tokens)",
    f"SUM({fixed_sql('standard_latency_seconds')})",
    f"SUM({fixed_sql('fly_latency_seconds')})",
    *(f"SUM({e})" for e in decode_sql(fixed_point=True)),
)
_SUMS_SQL = ", ".join(_SUM_EXPRS)

#: Width of a stored aggregate's time slot (``pair_sums.day``: ``CAST(time / 86400 AS
#: INTEGER)``, UTC days).
SUMS_DAY_SECONDS = 86400.0
_DAY_SQL = f"CAST(time / {SUMS_DAY_SECONDS!r} AS INTEGER)"
#: What ``pair_sums`` is keyed and summed by; a ledger whose stored layout differs (written by
#: a specwatch with other tally rules or another fixed point) has its aggregates rebuilt.
_SUMS_LAYOUT = f"v4|{SUMS_DAY_SECONDS!r}|{FIXED_POINT!r}|{_PATTERN_SQL}|{CELLS_LAYOUT}"
_SUM_COLUMNS = (
    *("n", "s_steps", "s_acc", "f_steps", "f_acc", "s_tok", "f_tok", "s_sec", "f_sec"),
    *("d_n", "s_dtok", "f_dtok", "s_dsec", "f_dsec", "s_ttft", "f_ttft"),
    *("s_dtok2", "f_dtok2", "s_dts", "f_dts", "s_dsec2", "f_dsec2"),
)
SUMS_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS pair_sums (day INTEGER NOT NULL, category TEXT NOT NULL, "
    "running_at_replay REAL NOT NULL, code INTEGER NOT NULL, "
    + ", ".join(f"{c} INTEGER NOT NULL" for c in _SUM_COLUMNS)
    + ", PRIMARY KEY (day, category, running_at_replay, code)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS pair_sums_meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID",
)
#: ``pair_sums`` keys never hold NULL (NULLs never conflict in an UPSERT): a row without a
#: running count is stored at -inf (every band condition false: band "unknown", as NULL), a
#: row without a category under ``'None'`` (the name a NULL category is reported under).
#: Where the decode sums start among the :class:`ArmSums` fields (they are its last ones).
_DECODE_FIRST = [f.name for f in fields(ArmSums)].index("decode_pairs")

_SUMS_KEY_SQL = (
    f"{_DAY_SQL} AS d, IFNULL(category, 'None') AS c, IFNULL(running_at_replay, -9e999) AS r, "
    f"{_PATTERN_SQL} AS k"
)


def sums_upsert_sql(where: str, sign: int) -> str:
    """Add (``sign`` 1) or take back (-1) the groups of the ``pairs`` rows matching ``where``
    into ``pair_sums``, in one statement."""
    values = ", ".join([f"{sign} * COUNT(*)"] + [f"{sign} * IFNULL({s}, 0)" for s in _SUM_EXPRS])
    update = ", ".join(f"{c} = {c} + excluded.{c}" for c in _SUM_COLUMNS)
    return (
        "INSERT INTO pair_sums (day, category, running_at_replay, code, "
        f"{', '.join(_SUM_COLUMNS)}) "
        f"SELECT {_SUMS_KEY_SQL}, {values} FROM pairs WHERE {where} GROUP BY d, c, r, k "
        f"ON CONFLICT (day, category, running_at_replay, code) DO UPDATE SET {update}"
    )


_SUMS_ADD_NEW = sums_upsert_sql("id > ?", 1)
_CELLS_ADD_NEW = cells_upsert_sql("id > ?", 1)
_SUMS_REBUILD = sums_upsert_sql("1", 1)


def _sums_mark(conn: sqlite3.Connection, *, layout: bool = False) -> None:
    """Record in ``pair_sums_meta`` the newest row id ``pair_sums`` covers (and, after a full
    rebuild, its layout: only a rebuild vouches for the rows before)."""
    last = conn.execute("SELECT IFNULL(MAX(id), 0) FROM pairs").fetchone()[0]
    marks: list[tuple[str, Any]] = [("last_id", last)]
    if layout:
        marks.append(("layout", _SUMS_LAYOUT))
    conn.executemany("INSERT OR REPLACE INTO pair_sums_meta (key, value) VALUES (?, ?)", marks)


def _sums_stale(conn: sqlite3.Connection) -> str | None:
    """Why ``pair_sums`` and ``pair_cells`` do not describe ``pairs`` (``None``: they do):
    ``layout`` (missing or another layout), ``rows`` (their counts do not add up to the rows),
    ``last_id`` (rows written by something that did not update them)."""
    meta = dict(conn.execute("SELECT key, value FROM pair_sums_meta").fetchall())
    if meta.get("layout") != _SUMS_LAYOUT:
        return "layout"
    (stored,) = conn.execute("SELECT IFNULL(SUM(n), 0) FROM pair_sums").fetchone()
    count, last = conn.execute("SELECT COUNT(*), IFNULL(MAX(id), 0) FROM pairs").fetchone()
    if int(stored) != int(count) or cells_rows(conn) != int(count):
        return "rows"
    if count and meta.get("last_id") != last:
        return "last_id"
    return None


def drop_outdated_aggregates(conn: sqlite3.Connection) -> list[str]:
    """Drop ``pair_sums`` / ``pair_cells`` when a ledger written by an older specwatch stored
    them without a column they now sum (they are derived data: created again and rebuilt from
    the rows, their layout mark being gone). Returns the tables dropped."""
    dropped = []
    for table, columns in (("pair_sums", _SUM_COLUMNS), ("pair_cells", CELLS_COLUMNS)):
        have = {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}
        if have and not set(columns) <= have:
            conn.execute(f"DROP TABLE {table}")
            dropped.append(table)
    if dropped:
        conn.execute("DELETE FROM pair_sums_meta WHERE key = 'layout'")
        log_event(log, logging.INFO, "ledger aggregates dropped", tables=",".join(dropped))
    return dropped


def sums_rebuild(conn: sqlite3.Connection) -> None:
    """Recompute ``pair_sums`` and ``pair_cells`` from every row (inside the caller's
    transaction)."""
    conn.execute("DELETE FROM pair_sums")
    conn.execute(_SUMS_REBUILD)
    cells_rebuild(conn)
    _sums_mark(conn, layout=True)


def write_rows(conn: sqlite3.Connection, sql: str, values: Sequence[Sequence[Any]]) -> None:
    """Insert ``values`` with ``sql`` and add their groups to ``pair_sums`` and their cells to
    ``pair_cells`` (inside the caller's transaction, so the aggregates never miss a committed
    row)."""
    (before,) = conn.execute("SELECT IFNULL(MAX(id), 0) FROM pairs").fetchone()
    conn.executemany(sql, values)
    conn.execute(_SUMS_ADD_NEW, (before,))
    conn.execute(_CELLS_ADD_NEW, (before,))
    _sums_mark(conn)


def _add_cells(
    cells: dict[tuple[int | None, str, str], HistoryCell], rows: Iterable[Sequence[Any]]
) -> None:
    """Add grouped rows ``(bucket, category, band, pattern code, count, six fixed-point
    sums)`` into ``cells`` per (bucket, category, band)."""
    for b, cat, band, code, n, s_st, s_acc, f_st, f_acc, s_tok, f_tok, s_sec, f_sec, *dec in rows:
        n = int(n)
        if not n:
            continue
        one, tau, speed = _decode(int(code))
        tally = one if n == 1 else PairTally(*(n * v for v in _tally_values(one)))
        arms = ArmSums(
            tau_pairs=n if tau else 0,
            standard_steps=int(s_st) if tau else 0,
            standard_accepted=int(s_acc) if tau else 0,
            fly_steps=int(f_st) if tau else 0,
            fly_accepted=int(f_acc) if tau else 0,
            speed_pairs=n if speed else 0,
            standard_tokens=int(s_tok) if speed else 0,
            fly_tokens=int(f_tok) if speed else 0,
            standard_seconds=int(s_sec) if speed else 0,
            fly_seconds=int(f_sec) if speed else 0,
        ) + ArmSums(
            # the decode sums are not in the pattern code: summed per group as they are
            *(0,) * _DECODE_FIRST,
            *(int(v or 0) for v in dec),
        )
        key = (None if b is None else int(b), str(cat), str(band))
        cell = HistoryCell(tally, arms, n)
        old = cells.get(key)
        cells[key] = cell if old is None else old + cell


def history_sync(
    conn: sqlite3.Connection,
    grouping: HistoryGrouping,
    where: str | None,
    params: tuple[Any, ...],
    cells: dict[tuple[int | None, str, str], HistoryCell] | None = None,
) -> list[HistoryGroup]:
    """One grouped pass over the ``pairs`` rows matching ``where`` (the pruned rows' groups, the
    recent rows of a rebuild): per (bucket, category, band, pattern code) the row count and the
    arm sums, added into ``cells`` and returned as :class:`HistoryGroup` per (bucket, category,
    band)."""
    width = float(grouping.bucket_seconds)
    bucket = f"CAST(time / {width!r} AS INTEGER)"
    if grouping.horizon is not None:
        bucket = f"CASE WHEN time >= {float(grouping.horizon)!r} THEN {bucket} END"
    else:
        bucket = "NULL"
    sql = (
        f"SELECT {bucket} AS b, IFNULL(category, 'None') AS c, "
        f"{band_sql(grouping.bands)} AS band, {_PATTERN_SQL} AS code, COUNT(*), {_SUMS_SQL} "
        f"FROM pairs{'' if where is None else ' WHERE ' + where} GROUP BY b, c, band, code"
    )
    cells = {} if cells is None else cells
    _add_cells(cells, conn.execute(sql, params))
    return [HistoryGroup(b, cat, band, cell) for (b, cat, band), cell in cells.items()]


def stored_history_sync(conn: sqlite3.Connection, grouping: HistoryGrouping) -> list[HistoryGroup]:
    """:meth:`Ledger.history` from ``pair_sums`` (made right first if stale): the whole days
    before the horizon's day from the stored aggregates, pooled, and the rows from that day on
    grouped from ``pairs`` (through the ``time`` index). Inside the caller's transaction."""
    why = _sums_stale(conn)
    if why is not None:
        sums_rebuild(conn)
        log_event(log, logging.INFO, "ledger aggregates rebuilt", reason=why)
    cells: dict[tuple[int | None, str, str], HistoryCell] = {}
    stored = (
        f"SELECT NULL, category, {band_sql(grouping.bands)} AS band, code, "
        f"{', '.join(f'SUM({c})' for c in _SUM_COLUMNS)} FROM pair_sums"
    )
    if grouping.horizon is None:
        _add_cells(cells, conn.execute(f"{stored} GROUP BY category, band, code"))
        return [HistoryGroup(b, cat, band, cell) for (b, cat, band), cell in cells.items()]
    day = int(grouping.horizon // SUMS_DAY_SECONDS)
    _add_cells(cells, conn.execute(f"{stored} WHERE day < ? GROUP BY category, band, code", (day,)))
    if grouping.bucket_seconds == CELL_SECONDS:
        # the horizon's day from the stored cells: one row per (bucket, category, band)
        first = round(grouping.horizon / CELL_SECONDS)
        pooled_from = round(day * SUMS_DAY_SECONDS / CELL_SECONDS)
        cells_history_sync(conn, grouping.bands, pooled_from, first, cells)
        return [HistoryGroup(b, cat, band, cell) for (b, cat, band), cell in cells.items()]
    # the time bound (a day's slack below) uses the index; the day test is the stored one's
    where = f"time >= ? AND {_DAY_SQL} >= ?"
    return history_sync(conn, grouping, where, (day * SUMS_DAY_SECONDS - 1.0, day), cells)


_tally_values = operator.attrgetter(*(f.name for f in fields(PairTally)))
