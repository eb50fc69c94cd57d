"""Ledger: round trip, SQL tally vs Python tally, retention, restart, failed writes, kill -9."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from specwatch.core.logs import event_fields
from specwatch.shadow.compare import PairOutcome, compare
from specwatch.shadow.ledger.aggregates import HistoryGrouping
from specwatch.shadow.ledger.ledger import Ledger
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.shadow.tally import HistoryCell, row_band, row_cell, tally_rows
from specwatch.shadow.values import Arm, ArmResult, ReplayPair, ShadowRequest, Source
from tests.fakes import REPO, FakeWallClock
from tests.shadow.test_summary import varied_rows

ROOT = REPO


def make_outcome(i: int, *, t: float | None = None, category: str = "math") -> PairOutcome:
    """Deterministic mix: labelled / unlabelled, lost / gained / agree, noise, failures."""
    labelled = i % 2 == 0
    std_text = f"answer {i % 5}"
    fly_text = std_text if i % 7 else f"answer {(i % 5) + 1}"
    noise_text = std_text if i % 11 else "other"
    req = ShadowRequest(
        path="/v1/completions",
        body={"prompt": str(i)},
        request_hash=f"h{i:06d}",
        received_at=1000.0 + i if t is None else t,
        source=Source.CANARY if labelled else Source.PROXY,
        category=category,
        item_id=f"q{i}" if labelled else None,
        gold=(f"answer {i % 5}" if i % 3 else f"answer {(i % 5) + 1}") if labelled else None,
        checker=None,
    )
    fly_ok = i % 13 != 0
    pair = ReplayPair(
        request=req,
        standard=ArmResult(
            Arm.STANDARD, True, 0.5, text=std_text, completion_tokens=10, mean_acceptance_length=2.0
        ),
        fly=ArmResult(
            Arm.FLY,
            fly_ok,
            0.4,
            text=fly_text if fly_ok else "",
            error=None if fly_ok else "timeout",
            completion_tokens=11,
            mean_acceptance_length=2.6,
        ),
        noise=ArmResult(Arm.NOISE, True, 0.45, text=noise_text) if i % 3 == 0 else None,
    )
    return compare(pair)


async def test_round_trip_without_text(tmp_path: Path) -> None:
    """Outcomes written to the ledger read back equal, without text, and filter by time and
    category."""
    async with Ledger(tmp_path / "l.db", wall_clock=FakeWallClock(5000.0)) as ledger:
        outs = [make_outcome(i) for i in range(60)]
        for o in outs:
            assert ledger.submit(o)
        await ledger.flush()
        rows = await ledger.query()
        assert len(rows) == 60
        assert await ledger.row_count() == 60
        expected = [LedgerRow.from_outcome(o) for o in outs]
        assert [dataclasses.replace(r, id=None) for r in rows] == expected
        assert all(r.fly_text is None and r.standard_text is None for r in rows)
        assert rows[0].fly_tau == 2.6
        assert rows[0].labelled is True
        assert rows[13].status == "unpaired"
        assert rows[13].reason == "fly_timeout"
        # Time range and category filters.
        assert [r.request_hash for r in await ledger.query(since=1010, until=1013)] == [
            "h000010",
            "h000011",
            "h000012",
        ]
        assert await ledger.query(category="other") == []
        assert ledger.health.rows_written == 60
        assert ledger.health.write_errors == {}


async def test_store_text(tmp_path: Path) -> None:
    """With store_text the ledger keeps both arms' texts."""
    async with Ledger(tmp_path / "l.db", store_text=True) as ledger:
        ledger.submit(make_outcome(7))
        await ledger.flush()
        (row,) = await ledger.query()
        assert row.standard_text == "answer 2"
        assert row.fly_text == "answer 3"


async def test_sql_tally_matches_python_tally(tmp_path: Path) -> None:
    """The ledger's SQL tally equals the Python tally of the same rows, also for a time range."""
    async with Ledger(tmp_path / "l.db") as ledger:
        outs = [make_outcome(i, category="a" if i % 4 else "b") for i in range(500)]
        for o in outs:
            ledger.submit(o)
        await ledger.flush()
        sql = await ledger.tally()
        py = tally_rows(LedgerRow.from_outcome(o) for o in outs)
        assert sql == py
        assert sql["a"].lost > 0
        assert sql["a"].gained > 0
        assert sql["a"].flip_fly_only > 0
        assert sql["a"].unpaired > 0
        windowed = await ledger.tally(since=1100, until=1200)
        assert windowed == tally_rows(
            LedgerRow.from_outcome(o) for o in outs if 1100 <= o.time < 1200
        )
        reasons = await ledger.reason_counts()
        assert reasons == {
            ("unpaired", "fly_timeout"): sum(1 for o in outs if o.status == "unpaired")
        }


async def test_retention_by_age_and_rows(tmp_path: Path) -> None:
    """Retention keeps rows younger than the maximum age and at most the maximum row count."""
    clock = FakeWallClock(2000.0)
    ledger = Ledger(tmp_path / "l.db", max_age_seconds=500.0, max_rows=300, wall_clock=clock)
    await ledger.open()
    for i in range(1000):
        ledger.submit(make_outcome(i))  # times 1000 .. 1999
    await ledger.flush()
    rows = await ledger.query()
    # The batch's own prune: age keeps time >= 1500 (500 rows), max_rows the newest 300.
    assert len(rows) == 300
    assert rows[0].request_hash == "h000700"
    assert rows[-1].request_hash == "h000999"
    clock.t = 2300.0  # cutoff 1800: 100 more rows age out
    assert await ledger.prune() == 100
    assert await ledger.row_count() == 200
    await ledger.close()


async def test_rebuild_after_restart(tmp_path: Path) -> None:
    """A reopened ledger holds every row and the same tally."""
    path = tmp_path / "l.db"
    async with Ledger(path) as first:
        for i in range(120):
            first.submit(make_outcome(i))
        await first.flush()
        before = await first.tally()
        assert before["math"].paired > 0
    async with Ledger(path) as second:  # close() flushed everything
        assert await second.row_count() == 120
        assert await second.tally() == before


async def test_failed_write_is_counted_and_surfaced(tmp_path: Path) -> None:
    """A failing write is counted by exception type and its last error is kept."""
    path = tmp_path / "l.db"
    async with Ledger(path) as ledger:
        ledger.submit(make_outcome(1))
        await ledger.flush()
        other = sqlite3.connect(path)
        other.execute("DROP TABLE pairs")
        other.commit()
        other.close()
        for i in range(5):
            ledger.submit(make_outcome(i))
        await ledger.flush()
        health = ledger.health
        assert health.rows_written == 1
        assert health.write_errors == {"OperationalError": 5}
        assert health.last_error is not None
        assert "no such table" in health.last_error


async def test_full_queue_drops_and_counts(tmp_path: Path) -> None:
    """Submissions beyond the queue size are refused and counted as dropped."""
    ledger = Ledger(tmp_path / "l.db", queue_size=3)
    await ledger.open()
    results = [ledger.submit(make_outcome(i)) for i in range(5)]  # writer has not run yet
    assert results == [True, True, True, False, False]
    assert ledger.health.dropped == 2
    await ledger.close()
    async with Ledger(tmp_path / "l.db") as again:
        assert await again.row_count() == 3


WRITER = textwrap.dedent(
    """
    import asyncio, sys
    sys.path.insert(0, sys.argv[2])
    sys.path.insert(0, sys.argv[3])
    from specwatch.shadow.ledger.ledger import Ledger
    from test_ledger import make_outcome

    async def main() -> None:
        ledger = Ledger(sys.argv[1], batch_size=50)
        await ledger.open()
        i = 0
        while True:
            for _ in range(100):
                ledger.submit(make_outcome(i))
                i += 1
            await ledger.flush()
            print(f"committed {i}", flush=True)

    asyncio.run(main())
    """
)


def test_kill_9_loses_no_committed_pair(tmp_path: Path) -> None:
    """A writer killed with SIGKILL loses no pair it reported as committed."""
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    db = tmp_path / "l.db"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(db), str(ROOT), str(Path(__file__).parent)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    committed = 0
    try:
        while committed < 3000:
            line = proc.stdout.readline()
            assert line, "writer exited early"
            committed = int(line.split()[1])
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    conn = sqlite3.connect(db)
    (count,) = conn.execute("SELECT COUNT(*) FROM pairs").fetchone()
    (integrity,) = conn.execute("PRAGMA integrity_check").fetchone()
    conn.close()
    assert count >= committed
    assert integrity == "ok"


@pytest.mark.parametrize("bad", ["WAL", "sometimes"])
def test_bad_synchronous(tmp_path: Path, bad: str) -> None:
    """An unknown synchronous mode is rejected."""
    with pytest.raises(ValueError, match="synchronous"):
        Ledger(tmp_path / "x.db", synchronous=bad)


async def test_flush_before_open_raises(tmp_path: Path) -> None:
    """Flushing a ledger that is not open raises."""
    ledger = Ledger(tmp_path / "l.db")
    ledger.submit(make_outcome(1))
    with pytest.raises(RuntimeError, match="not open"):
        await ledger.flush()


# The pairs table as an older specwatch wrote it (before per-arm errors, finish reasons and the
# comparison fields): the additive migration must open it, keep its rows and add the columns.
OLD_COLUMNS = (
    "time REAL, request_hash TEXT, category TEXT, source TEXT, item_id TEXT, status TEXT, "
    "reason TEXT, labelled INTEGER, noise_asked INTEGER, standard_correct INTEGER, "
    "fly_correct INTEGER, noise_correct INTEGER, fly_agrees INTEGER, noise_agrees INTEGER, "
    "fly_divergence_char INTEGER, fly_divergence_token INTEGER, fly_similarity REAL, "
    "noise_divergence_char INTEGER, noise_similarity REAL, standard_latency_seconds REAL, "
    "fly_latency_seconds REAL, noise_latency_seconds REAL, standard_tokens INTEGER, "
    "fly_tokens INTEGER, noise_tokens INTEGER, standard_tau REAL, fly_tau REAL, noise_tau REAL, "
    "standard_text TEXT, fly_text TEXT, noise_text TEXT"
)


async def test_old_ledger_gets_the_new_columns_and_keeps_its_rows(tmp_path: Path) -> None:
    """A ledger written before the per-arm failure columns opens: the old row reads back with
    the new columns ``None``, and a new unpaired pair keeps both arms' failure reason, finish
    reason and (with ``store_text``) the answering arm's text."""
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute(f"CREATE TABLE pairs (id INTEGER PRIMARY KEY, {OLD_COLUMNS})")
        conn.execute(
            "INSERT INTO pairs (time, request_hash, category, source, status, labelled, "
            "noise_asked) VALUES (1.0, 'old', 'c', 'mirror', 'paired', 0, 0)"
        )
    std = ArmResult(Arm.STANDARD, True, 0.2, status=200, text="Yes.", finish_reason="stop")
    fly = ArmResult(
        Arm.FLY, False, 0.1, status=200, error="aborted", text="Ye", finish_reason="abort"
    )
    req = ShadowRequest("/v1/completions", {"prompt": "q"}, "new", 2.0, Source.MIRROR)
    async with Ledger(path, store_text=True) as led:
        led.submit(compare(ReplayPair(req, std, fly)))
        await led.flush()
        rows = await led.query()
    old, new = rows
    assert (old.request_hash, old.fly_error, old.standard_finish_reason) == ("old", None, None)
    assert (new.status, new.reason) == ("unpaired", "fly_aborted")
    assert (new.fly_error, new.fly_finish_reason, new.fly_truncated) == ("aborted", "abort", None)
    assert (new.standard_error, new.standard_finish_reason, new.standard_truncated) == (
        None,
        "stop",
        False,
    )
    assert (new.standard_text, new.fly_text) == ("Yes.", "Ye")


async def test_fold_labelled_streams_the_labelled_pairs_in_ledger_order(tmp_path: Path) -> None:
    """Folding in chunks of 7 sees every labelled pair once, oldest first, exactly as
    ``labelled_outcomes`` lists them (400 varied rows, about a quarter labelled with both
    correctness values known), in ceil(n / 7) chunks."""
    rows = varied_rows(21, 400)
    chunks: list[int] = []

    def step(
        acc: list[tuple[bool, bool]], chunk: list[tuple[bool, bool]]
    ) -> list[tuple[bool, bool]]:
        chunks.append(len(chunk))
        return acc + chunk

    async with Ledger(tmp_path / "l.db") as led:
        for r in rows:
            led.submit(r)
        await led.flush()
        start: list[tuple[bool, bool]] = []
        folded = await led.fold_labelled(step, start, chunk_rows=7)
        listed = await led.labelled_outcomes()
    expected = [
        (bool(r.standard_correct), bool(r.fly_correct))
        for r in sorted(rows, key=lambda r: r.time)
        if r.status == "paired" and r.standard_correct is not None and r.fly_correct is not None
    ]
    assert folded == listed == expected
    assert len(expected) > 50
    assert sum(chunks) == len(expected)
    assert len(chunks) == -(-len(expected) // 7)


@pytest.mark.parametrize("categories", [3, 70])
async def test_report_stream_tallies_equal_the_sql_tallies(tmp_path: Path, categories: int) -> None:
    """The report's one streamed read gives the same per-category and per-band tallies as
    ``Ledger.tally`` / ``tally_by_load`` (the CASE-sum SQL) and as the Python rule table, and its
    labelled part lists the labelled pairs in write order (the order the sidecar folded them;
    here the reverse of time order) with d = standard - fly; with 3
    categories (codes by CASE) and with 70 (codes by a lookup table)."""
    outcomes = [make_outcome(i, t=2000.0 - i, category=f"c{i % categories}") for i in range(300)]
    async with Ledger(tmp_path / "l.db") as ledger:
        for o in outcomes:
            ledger.submit(o)
        await ledger.flush()
        stream = await ledger.report_stream((0, 8, 32))
        by_cat = await ledger.tally()
        by_band = await ledger.tally_by_load((0, 8, 32))
        rows = await ledger.query()
    cells = stream.tallies()
    for cat, want in by_cat.items():
        assert sum((t for (c, _), t in cells.items() if c == cat), start=type(want)()) == want
    for band, want in by_band.items():
        assert sum((t for (_, b), t in cells.items() if b == band), start=type(want)()) == want
    assert by_cat == tally_rows(rows)
    lab = stream.labelled()
    want_d = [
        int(bool(r.standard_correct)) - int(bool(r.fly_correct))
        for r in rows[::-1]  # query() is in time order; t = 2000 - i makes write order its reverse
        if r.status == "paired" and r.standard_correct is not None and r.fly_correct is not None
    ]
    assert lab.d.tolist() == want_d
    assert len(want_d) > 50


async def test_write_many_refuses_unknown_columns(tmp_path: Path) -> None:
    """Bulk import names columns of the ledger only; a wrong name writes nothing."""
    async with Ledger(tmp_path / "l.db") as ledger:
        with pytest.raises(ValueError, match="unknown or no columns"):
            await ledger.write_many(("time", "no_such_column"), [(1.0, 2)])
        assert await ledger.write_many(("time", "category", "status"), [(1.0, "x", "paired")]) == 1
        assert await ledger.row_count() == 1


# -- the per-day aggregates stored beside the rows (the restart rebuild reads them) ----------

SUMS_NOW = 1_800_000_000.0  # a multiple of 10 s; 30 hours of rows before it cross two UTC days
SUMS_GROUPING = HistoryGrouping(10.0, SUMS_NOW - 86400.0, (0, 8, 32))


def _reference_history(
    rows: list[LedgerRow], grouping: HistoryGrouping
) -> dict[tuple[int | None, str, str], HistoryCell]:
    """:meth:`Ledger.history` worked out row by row in Python (:func:`row_cell`, the live
    path's own per-row function): bucket ``floor(time / 10)`` from the horizon on, else
    ``None``."""
    out: dict[tuple[int | None, str, str], HistoryCell] = {}
    for r in rows:
        h = grouping.horizon
        bucket = None if h is None or r.time < h else math.floor(r.time / grouping.bucket_seconds)
        key = (bucket, r.category, row_band(r.running_at_replay, grouping.bands))
        out[key] = out.get(key, HistoryCell()) + row_cell(r)
    return out


async def _history_of(led: Ledger, grouping: HistoryGrouping) -> dict[Any, HistoryCell]:
    _, groups = await led.history(grouping)
    return {(g.bucket, g.category, g.band): g.cell for g in groups}


def _rebuilt_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        str(event_fields(r).get("reason"))
        for r in caplog.records
        if r.getMessage() == "ledger aggregates rebuilt"
    ]


@pytest.mark.parametrize("retention", [{"max_age_seconds": 28 * 3600.0}, {"max_rows": 700}])
async def test_stored_aggregates_follow_inserts_and_prunes(
    tmp_path: Path, retention: dict[str, float], caplog: pytest.LogCaptureFixture
) -> None:
    """1,500 varied rows over the 30 hours before ``now`` written in batches while retention
    prunes (by age: 28 h; by count: 700 rows): ``history()`` (stored per-day aggregates for the
    days before the horizon's, grouped rows after) equals the row-by-row Python sums of the rows
    left, with the 24-hour horizon and with none, and the stored counts add up to the rows left
    per UTC day, without any rebuild of the aggregates."""
    caplog.set_level(logging.INFO, logger="specwatch.shadow.ledger")
    rows = varied_rows(5, 1500, now=SUMS_NOW)
    led = Ledger(
        tmp_path / "l.db",
        wall_clock=FakeWallClock(SUMS_NOW),
        prune_interval_seconds=0.0,
        batch_size=97,
        **retention,  # type: ignore[arg-type]
    )
    async with led:
        await _history_of(led, SUMS_GROUPING)  # an empty ledger: marks the aggregates current
        for r in rows:
            assert led.submit(r)
        await led.flush()
        await led.prune()
        left = await led.query()
        assert 0 < len(left) < 1500  # retention really deleted rows
        assert await _history_of(led, SUMS_GROUPING) == _reference_history(left, SUMS_GROUPING)
        everything = HistoryGrouping(10.0, None, (0, 8, 32))
        assert await _history_of(led, everything) == _reference_history(left, everything)
    with sqlite3.connect(tmp_path / "l.db") as conn:
        per_day = dict(conn.execute("SELECT day, SUM(n) FROM pair_sums GROUP BY day"))
    by_hand: dict[int, int] = {}
    for r in left:
        by_hand[int(r.time // 86400)] = by_hand.get(int(r.time // 86400), 0) + 1
    assert per_day == by_hand
    assert len(by_hand) == 2  # the rows left really span two days
    assert _rebuilt_logs(caplog) == []


async def test_old_ledger_without_aggregates_gets_them(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A ledger written by a specwatch without the aggregate tables (dropped here from a filled
    one) opens; the first ``history()`` builds the aggregates from every row (logged once, reason
    ``layout``) and equals the row-by-row sums; the next one reads them without a rebuild."""
    caplog.set_level(logging.INFO, logger="specwatch.shadow.ledger")
    rows = varied_rows(6, 800, now=SUMS_NOW)
    path = tmp_path / "old.db"
    async with Ledger(path, wall_clock=FakeWallClock(SUMS_NOW)) as led:
        for r in rows:
            led.submit(r)
    with sqlite3.connect(path) as conn:
        conn.execute("DROP TABLE pair_sums")
        conn.execute("DROP TABLE pair_sums_meta")
    async with Ledger(path, wall_clock=FakeWallClock(SUMS_NOW)) as led:
        ref = _reference_history(await led.query(), SUMS_GROUPING)
        assert await _history_of(led, SUMS_GROUPING) == ref
        assert _rebuilt_logs(caplog) == ["layout"]
        assert await _history_of(led, SUMS_GROUPING) == ref
    assert _rebuilt_logs(caplog) == ["layout"]


async def test_aggregates_of_an_older_layout_are_dropped_and_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Aggregate tables written before they kept the decode spread sums (their columns dropped
    here from a filled ledger) are dropped on open and rebuilt from every row: ``history()``
    equals the row-by-row sums, spread sums included."""
    caplog.set_level(logging.INFO, logger="specwatch.shadow.ledger")
    rows = [
        dataclasses.replace(
            r,
            standard_tokens=10 + i % 7,
            fly_tokens=12 + i % 5,
            standard_first_token_seconds=0.1,
            standard_last_token_seconds=0.3 + 0.01 * (i % 3),
            fly_first_token_seconds=0.1,
            fly_last_token_seconds=0.25 + 0.02 * (i % 4),
        )
        for i, r in enumerate(varied_rows(7, 400, now=SUMS_NOW))
    ]
    path = tmp_path / "older.db"
    async with Ledger(path, wall_clock=FakeWallClock(SUMS_NOW)) as led:
        for r in rows:
            led.submit(r)
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE pair_sums DROP COLUMN s_dsec2")
        conn.execute("ALTER TABLE pair_cells DROP COLUMN arm_fly_decode_seconds_sq")
    async with Ledger(path, wall_clock=FakeWallClock(SUMS_NOW)) as led:
        left = await led.query()
        ref = _reference_history(left, SUMS_GROUPING)
        assert sum(c.arms.fly_decode_seconds_sq for c in ref.values()) > 0
        assert await _history_of(led, SUMS_GROUPING) == _reference_history(left, SUMS_GROUPING)
    assert _rebuilt_logs(caplog) == ["layout"]


def _insert_behind(conn: sqlite3.Connection) -> None:
    # another program adds a row without touching the aggregates
    conn.execute(
        "INSERT INTO pairs (time, request_hash, category, source, status, labelled, "
        f"noise_asked) VALUES ({SUMS_NOW - 5.0}, 'x', 'zz', 'proxy', 'paired', 0, 0)"
    )


def _swap_behind(conn: sqlite3.Connection) -> None:
    # one row deleted and one added behind its back: the count is unchanged
    conn.execute("DELETE FROM pairs WHERE id = (SELECT MIN(id) FROM pairs)")
    _insert_behind(conn)


def _torn_sums(conn: sqlite3.Connection) -> None:
    # aggregates that disagree with the rows (as if a write had half happened)
    conn.execute("UPDATE pair_sums SET n = n + 1 WHERE code = (SELECT MIN(code) FROM pair_sums)")


@pytest.mark.parametrize(
    ("tamper", "reason"),
    [(_insert_behind, "rows"), (_swap_behind, "last_id"), (_torn_sums, "rows")],
)
async def test_aggregates_that_disagree_with_the_rows_are_rebuilt(
    tmp_path: Path,
    tamper: Callable[[sqlite3.Connection], None],
    reason: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Aggregates that no longer describe the rows (rows written or deleted by another program,
    a stored count off by one) are detected when the ledger is next read for a rebuild: they are
    rebuilt (one log line with the reason) and ``history()`` equals the row-by-row sums of the
    rows as they are."""
    caplog.set_level(logging.INFO, logger="specwatch.shadow.ledger")
    path = tmp_path / "l.db"
    async with Ledger(path, wall_clock=FakeWallClock(SUMS_NOW)) as led:
        await _history_of(led, SUMS_GROUPING)
        for r in varied_rows(8, 400, now=SUMS_NOW):
            led.submit(r)
    with sqlite3.connect(path) as conn:
        tamper(conn)
    async with Ledger(path, wall_clock=FakeWallClock(SUMS_NOW)) as led:
        got = await _history_of(led, SUMS_GROUPING)
        assert got == _reference_history(await led.query(), SUMS_GROUPING)
    assert _rebuilt_logs(caplog) == [reason]


def test_packed_rows_name_every_status_and_column_the_rules_read() -> None:
    """Both packed forms (report stream key, stored pattern code) carry one status digit from
    ``STATUSES`` and one digit per rule column: every status a tally rule names is among them,
    and every column a rule reads besides ``status`` is a digit."""
    from specwatch.shadow.ledger import predicates
    from specwatch.shadow.tally import LABELLED, TALLY_RULES

    named = {str(v) for rule in TALLY_RULES.values() for c, v in rule if c == "status"}
    read = {c for rule in (*TALLY_RULES.values(), LABELLED) for c, _ in rule} - {"status"}
    assert named <= set(predicates.STATUSES) == {"paired", "unpaired", "excluded"}
    assert set(predicates.TRI_COLUMNS) == read
    assert len(predicates.TRI_COLUMNS) == len(read) == 8


def test_reads_have_one_home() -> None:
    """Every read of the ledger is written once, in ``queries.py`` or ``reports.py``: the
    ledger inherits them and defines none of them again (no forwarding copies whose signatures
    and docstrings could drift apart)."""
    from specwatch.shadow.ledger.queries import RowQueries
    from specwatch.shadow.ledger.reports import ReportQueries

    reads = {
        name
        for cls in (RowQueries, ReportQueries)
        for name, value in vars(cls).items()
        if callable(value) and not name.startswith("__")
    }
    assert {"query", "tally", "tau_coverage", "report_stream"} <= reads
    from specwatch.shadow.ledger.ledger import Ledger as LedgerClass

    assert reads & set(vars(LedgerClass)) == set()
    assert all(callable(getattr(LedgerClass, name)) for name in reads)
