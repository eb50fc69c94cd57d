"""Table ``pair_cells``: the ``pairs`` rows' :class:`~specwatch.shadow.tally.HistoryCell` per
(time bucket of :data:`CELL_SECONDS`, category, running count), every tally field and arm sum
already counted, kept beside ``pair_sums`` (:mod:`.aggregates`: same transaction as every insert
and prune, same staleness checks and rebuild). The restart rebuild reads the recent buckets from
here, one stored row per cell, instead of grouping every recent row of ``pairs``.

Blocking functions over a connection, run inside the caller's transaction."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from specwatch.shadow.ledger.predicates import (
    ARM_SPEED,
    ARM_TAU,
    TALLY_SQL,
    band_sql,
    decode_sql,
    fixed_sql,
)
from specwatch.shadow.tally import ArmSums, HistoryCell, PairTally

#: Width of a stored cell's time bucket (``CAST(time / CELL_SECONDS AS INTEGER)``): the live
#: statistics' bucket (``specwatch.shadow.live.STATS_BUCKET_SECONDS``, a test keeps them
#: equal). A rebuild asked for other buckets groups the rows instead.
CELL_SECONDS = 10.0

_TALLY_COLUMNS = tuple(f.name for f in fields(PairTally))
_ARM_COLUMNS = tuple(f"arm_{f.name}" for f in fields(ArmSums))
_COLUMNS = ("n", *_TALLY_COLUMNS, *_ARM_COLUMNS)
_N_TALLY = len(_TALLY_COLUMNS)
#: The columns ``pair_cells`` sums (a stored table lacking one is dropped and rebuilt).
CELLS_COLUMNS = _COLUMNS

#: Per row of ``pairs``, what each stored column adds (in :data:`_COLUMNS` order): the row,
#: each tally rule as 0/1, and the arm sums under their conditions (τ and seconds in fixed
#: point, as every grouped read sums them).
_ROW_VALUES = (
    "1",
    *(f"CASE WHEN {TALLY_SQL[name]} THEN 1 ELSE 0 END" for name in _TALLY_COLUMNS),
    f"CASE WHEN {ARM_TAU} THEN 1 ELSE 0 END",
    f"CASE WHEN {ARM_TAU} THEN standard_spec_steps ELSE 0 END",
    f"CASE WHEN {ARM_TAU} THEN standard_accepted_tokens ELSE 0 END",
    f"CASE WHEN {ARM_TAU} THEN fly_spec_steps ELSE 0 END",
    f"CASE WHEN {ARM_TAU} THEN fly_accepted_tokens ELSE 0 END",
    f"CASE WHEN {ARM_SPEED} THEN 1 ELSE 0 END",
    f"CASE WHEN {ARM_SPEED} THEN standard_tokens ELSE 0 END",
    f"CASE WHEN {ARM_SPEED} THEN fly_tokens ELSE 0 END",
    f"CASE WHEN {ARM_SPEED} THEN {fixed_sql('standard_latency_seconds')} ELSE 0 END",
    f"CASE WHEN {ARM_SPEED} THEN {fixed_sql('fly_latency_seconds')} ELSE 0 END",
    *decode_sql(fixed_point=True),
)
if len(_ROW_VALUES) != len(_COLUMNS):  # pragma: no cover - a field added to ArmSums
    raise RuntimeError("pair_cells columns and their row values disagree")

#: What ``pair_cells`` is keyed and summed by (part of the stored aggregates' layout: another
#: layout is rebuilt from the rows).
CELLS_LAYOUT = f"cells|{CELL_SECONDS!r}|" + "|".join(_ROW_VALUES)

CELLS_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS pair_cells (bucket INTEGER NOT NULL, category TEXT NOT NULL, "
    "running_at_replay REAL NOT NULL, "
    + ", ".join(f"{c} INTEGER NOT NULL" for c in _COLUMNS)
    + ", PRIMARY KEY (bucket, category, running_at_replay)) WITHOUT ROWID",
)

#: ``pair_cells`` keys never hold NULL (as ``pair_sums``'): no running count is -inf (band
#: "unknown"), no category is ``'None'``.
_KEY_SQL = (
    f"CAST(time / {CELL_SECONDS!r} AS INTEGER) AS b, IFNULL(category, 'None') AS c, "
    "IFNULL(running_at_replay, -9e999) AS r"
)


def cells_upsert_sql(where: str, sign: int) -> str:
    """Add (``sign`` 1) or take back (-1) the cells of the ``pairs`` rows matching ``where``
    into ``pair_cells``, in one statement."""
    values = ", ".join(f"{sign} * IFNULL(SUM({v}), 0)" for v in _ROW_VALUES)
    update = ", ".join(f"{c} = {c} + excluded.{c}" for c in _COLUMNS)
    return (
        f"INSERT INTO pair_cells (bucket, category, running_at_replay, {', '.join(_COLUMNS)}) "
        f"SELECT {_KEY_SQL}, {values} FROM pairs WHERE {where} GROUP BY b, c, r "
        f"ON CONFLICT (bucket, category, running_at_replay) DO UPDATE SET {update}"
    )


def cells_rebuild(conn: sqlite3.Connection) -> None:
    """Recompute ``pair_cells`` from every row (inside the caller's transaction)."""
    conn.execute("DELETE FROM pair_cells")
    conn.execute(cells_upsert_sql("1", 1))


def cells_drop_empty(conn: sqlite3.Connection) -> None:
    """Delete the cells a prune emptied."""
    conn.execute("DELETE FROM pair_cells WHERE n = 0")


def cells_rows(conn: sqlite3.Connection) -> int:
    """The rows ``pair_cells`` counts (equal to the rows of ``pairs`` when current)."""
    (stored,) = conn.execute("SELECT IFNULL(SUM(n), 0) FROM pair_cells").fetchone()
    return int(stored)


def _cell(values: Sequence[Any]) -> HistoryCell:
    """The :class:`HistoryCell` of ``(rows, *tally fields, *arm sums)``."""
    tally = PairTally(*values[1 : 1 + _N_TALLY])
    return HistoryCell(tally, ArmSums(*values[1 + _N_TALLY :]), values[0])


def cells_history_sync(
    conn: sqlite3.Connection,
    bands: Sequence[int],
    pooled_from: int,
    first: int,
    cells: dict[tuple[int | None, str, str], HistoryCell],
) -> None:
    """Add into ``cells`` the stored cells of the buckets from ``pooled_from`` on, per (bucket,
    category, load band with lower bounds ``bands``): buckets before ``first`` pooled into
    bucket ``None``, the others kept."""
    sums = ", ".join(f"SUM({c})" for c in _COLUMNS)
    sql = (
        f"SELECT CASE WHEN bucket >= {int(first)} THEN bucket END AS b, category, "
        f"{band_sql(bands)} AS band, {sums} FROM pair_cells WHERE bucket >= ? "
        "GROUP BY b, category, band"
    )
    for row in conn.execute(sql, (int(pooled_from),)):
        b, category, band = row[0], str(row[1]), str(row[2])
        cell = _cell(row[3:])
        if not cell.rows:
            continue
        key = (None if b is None else int(b), category, band)
        old = cells.get(key)
        cells[key] = cell if old is None else old + cell
