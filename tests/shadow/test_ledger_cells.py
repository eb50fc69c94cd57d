"""The restart rebuild read from the stored per-bucket cells (table ``pair_cells``) gives exactly
what grouping every row gives: the grouped SQL pass over all rows (the rebuild's path before the
cells were stored) and the row-by-row Python sums, after inserts and prunes; cells that disagree
with the rows are rebuilt; other bucket widths still group the rows."""

from __future__ import annotations

import logging
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from specwatch.core.logs import event_fields
from specwatch.shadow.ledger.aggregates import HistoryGrouping, history_sync
from specwatch.shadow.ledger.cells import CELL_SECONDS
from specwatch.shadow.ledger.ledger import Ledger
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.shadow.live import STATS_BUCKET_SECONDS
from specwatch.shadow.tally import HistoryCell, row_band, row_cell
from tests.fakes import FakeWallClock
from tests.shadow.test_summary import varied_rows

NOW = 1_800_000_000.0  # a multiple of 10 s; 30 hours of rows before it cross two UTC days
BANDS = (0, 8, 32)


def _by_row(rows: list[LedgerRow], grouping: HistoryGrouping) -> dict[Any, HistoryCell]:
    """The rebuild worked out row by row in Python: bucket ``floor(time / width)`` from the
    horizon on, else ``None``."""
    out: dict[Any, HistoryCell] = {}
    for r in rows:
        h = grouping.horizon
        bucket = None if h is None or r.time < h else math.floor(r.time / grouping.bucket_seconds)
        key = (bucket, r.category, row_band(r.running_at_replay, grouping.bands))
        out[key] = out.get(key, HistoryCell()) + row_cell(r)
    return out


def _grouped_rows(path: Path, grouping: HistoryGrouping) -> dict[Any, HistoryCell]:
    """The rebuild as one grouped SQL pass over every row (no stored aggregates read)."""
    with sqlite3.connect(path) as conn:
        groups = history_sync(conn, grouping, None, ())
    return {(g.bucket, g.category, g.band): g.cell for g in groups}


async def _history(led: Ledger, grouping: HistoryGrouping) -> dict[Any, HistoryCell]:
    _, groups = await led.history(grouping)
    return {(g.bucket, g.category, g.band): g.cell for g in groups}


def _rebuilt(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        str(event_fields(r).get("reason"))
        for r in caplog.records
        if r.getMessage() == "ledger aggregates rebuilt"
    ]


def test_cells_are_the_statistics_buckets() -> None:
    """The stored cells' bucket is the live statistics' bucket (else every rebuild would group
    the rows again)."""
    assert CELL_SECONDS == STATS_BUCKET_SECONDS


@pytest.mark.parametrize("horizon_hours", [24.0, 1.0, 0.25, 27.0])
async def test_rebuild_from_cells_equals_grouping_every_row(
    tmp_path: Path, horizon_hours: float, caplog: pytest.LogCaptureFixture
) -> None:
    """3,000 varied rows over 30 hours (a tenth on or just before a window edge), written in
    batches while retention prunes by age (28 h): ``history()`` equals the grouped pass over
    every row and the row-by-row sums, for horizons in the last day, the day before and with
    none; the stored cells count every row left, and nothing was rebuilt."""
    caplog.set_level(logging.INFO, logger="specwatch.shadow.ledger")
    path = tmp_path / "l.db"
    led = Ledger(
        path,
        wall_clock=FakeWallClock(NOW),
        prune_interval_seconds=0.0,
        batch_size=113,
        max_age_seconds=28 * 3600.0,
    )
    grouping = HistoryGrouping(10.0, NOW - horizon_hours * 3600.0, BANDS)
    async with led:
        await _history(led, grouping)  # an empty ledger: marks the aggregates current
        for r in varied_rows(21, 3000, now=NOW):
            assert led.submit(r)
        await led.flush()
        await led.prune()
        left = await led.query()
        assert 0 < len(left) < 3000
        got = await _history(led, grouping)
        everything = HistoryGrouping(10.0, None, BANDS)
        assert await _history(led, everything) == _by_row(left, everything)
    assert got == _grouped_rows(path, grouping) == _by_row(left, grouping)
    assert any(b is not None for b, _, _ in got)
    assert any(b is None for b, _, _ in got)
    with sqlite3.connect(path) as conn:
        (stored,) = conn.execute("SELECT SUM(n) FROM pair_cells").fetchone()
    assert stored == len(left)
    assert _rebuilt(caplog) == []


async def test_other_bucket_widths_group_the_rows(tmp_path: Path) -> None:
    """A rebuild asked for 60-second buckets (not the stored cells') equals the row-by-row
    sums."""
    grouping = HistoryGrouping(60.0, NOW - 3600.0, BANDS)
    async with Ledger(tmp_path / "l.db", wall_clock=FakeWallClock(NOW)) as led:
        for r in varied_rows(22, 600, now=NOW):
            led.submit(r)
        await led.flush()
        assert await _history(led, grouping) == _by_row(await led.query(), grouping)


async def test_cells_that_disagree_with_the_rows_are_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stored cell whose count is off by one (as if a write had half happened) is found at
    the next rebuild: the aggregates are rebuilt from the rows (reason ``rows``, logged once)
    and ``history()`` equals the row-by-row sums."""
    caplog.set_level(logging.INFO, logger="specwatch.shadow.ledger")
    path = tmp_path / "l.db"
    grouping = HistoryGrouping(10.0, NOW - 86400.0, BANDS)
    async with Ledger(path, wall_clock=FakeWallClock(NOW)) as led:
        await _history(led, grouping)
        for r in varied_rows(23, 500, now=NOW):
            led.submit(r)
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE pair_cells SET n = n + 1 WHERE bucket = (SELECT MAX(bucket) FROM pair_cells)"
        )
    async with Ledger(path, wall_clock=FakeWallClock(NOW)) as led:
        assert await _history(led, grouping) == _by_row(await led.query(), grouping)
    assert _rebuilt(caplog) == ["rows"]
