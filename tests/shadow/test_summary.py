"""Live tallies against the full recomputation from the ledger's SQL (the reference).

A real SQLite ledger is filled with varied rows (five categories, paired/unpaired/excluded,
labelled or not, with and without a noise and a baseline arm, running counts in every load band
and unknown, τ and latencies with arbitrary decimals, times spread over 30 hours before ``now``
and a few after it). ``now`` is a multiple of the 10-second bucket and every window a multiple
of it, so the bucket-granular edges and the per-row ``time >= now - seconds`` rule select the
same rows; the two paths must then agree exactly, field for field.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path

from specwatch.core.config import SINCE_START
from specwatch.shadow.ledger.ledger import Ledger
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.shadow.live import LiveTallies, StatsInputs, ledger_inputs
from specwatch.shadow.settings import PairedSettings
from specwatch.shadow.summary import Carried, LedgerView, build_shadow_stats
from specwatch.shadow.tally import PairTally
from tests.fakes import FakeWallClock

NOW = 1_800_000_000.0  # a multiple of 10 s
PAIRED = PairedSettings.model_validate({"windows": ["15m", "1h", "24h"], "load_bands": [0, 8, 32]})


def _bool(rng: random.Random) -> bool | None:
    return rng.choice([True, False, None])


def varied_row(rng: random.Random, time: float) -> LedgerRow:
    """One ledger row with every tally-relevant column drawn at random."""
    status = rng.choices(["paired", "unpaired", "excluded"], [8, 1, 1])[0]
    noise = rng.random() < 0.6
    labelled = rng.random() < 0.5
    paired = status == "paired"
    return LedgerRow(
        time=time,
        request_hash=f"{rng.getrandbits(64):016x}",
        category=rng.choice(["arith", "code", "chat", "zz", "ünï"]),
        source="proxy",
        item_id=None,
        status=status,
        reason=None if paired else rng.choice(["timeout", "arm_error"]),
        labelled=labelled,
        noise_asked=noise,
        standard_correct=_bool(rng) if labelled else None,
        fly_correct=_bool(rng) if labelled else None,
        noise_correct=_bool(rng) if labelled and noise else None,
        fly_agrees=_bool(rng) if paired else None,
        noise_agrees=_bool(rng) if paired and noise else None,
        fly_divergence_char=None,
        fly_divergence_token=None,
        fly_similarity=None,
        noise_divergence_char=None,
        noise_similarity=None,
        standard_latency_seconds=rng.choice([None, 0.0, rng.uniform(0.01, 3.0)]),
        fly_latency_seconds=rng.choice([None, rng.uniform(0.01, 3.0)]),
        noise_latency_seconds=None,
        standard_tokens=rng.choice([None, rng.randint(1, 400)]),
        fly_tokens=rng.choice([None, rng.randint(1, 400)]),
        noise_tokens=None,
        standard_tau=rng.choice([None, rng.uniform(1.0, 4.0)]),
        fly_tau=rng.choice([None, rng.uniform(1.0, 4.0)]),
        noise_tau=None,
        greedy=_bool(rng),
        running_at_replay=rng.choice([None, 0.0, 7.9, 8.0, 31.0, 32.0, 100.0, rng.uniform(0, 50)]),
        baseline_agrees=_bool(rng),
        noise_baseline_agrees=_bool(rng),
    )


def varied_rows(seed: int, n: int, now: float = NOW) -> list[LedgerRow]:
    """``n`` rows, times uniform over the 30 hours before ``now`` (every window's edge and
    beyond) plus a few up to a minute after it, in time order; a tenth land exactly on a
    window edge (``now - 15 min``, ``- 1 h``, ``- 24 h``) or one millisecond before it."""
    rng = random.Random(seed)
    times = [now - rng.uniform(-60.0, 30 * 3600.0) for _ in range(n)]
    for i in range(0, n, 10):
        times[i] = now - rng.choice([900.0, 3600.0, 86400.0]) - rng.choice([0.0, 0.001])
    return [varied_row(rng, t) for t in sorted(times)]


async def _filled(path: Path, rows: list[LedgerRow]) -> Ledger:
    led = Ledger(path, wall_clock=FakeWallClock(NOW))
    await led.open()
    for r in rows:
        assert led.submit(r)
    await led.flush()
    return led


def _stats(inputs: StatsInputs) -> object:
    return build_shadow_stats(
        inputs.tallies, now=NOW, carried=Carried(by_load=inputs.by_load), ledger=LedgerView(rows=0)
    )


async def test_rebuilt_and_pair_by_pair_equal_the_sql_recomputation(tmp_path: Path) -> None:
    """2,000 varied rows: the live tallies rebuilt from one grouped pass, and the live tallies
    fed one committed row at a time while the clock walks from the first row's time to ``now``
    (so every bucket also leaves its windows on the way), equal the per-window SQL tallies, the
    SQL arm totals, load bands and row count; the :class:`ShadowStats` built from each are
    equal too."""
    rows = varied_rows(7, 2000)
    led = await _filled(tmp_path / "l.db", rows)
    try:
        ref = await ledger_inputs(led, PAIRED, NOW)
        rebuilt = LiveTallies(PAIRED.window_seconds, PAIRED.load_bands, now=NOW)
        as_of, groups = await led.history(rebuilt.grouping())
        rebuilt.add_groups(groups)
        rebuilt.start(as_of)
    finally:
        await led.close()
    walked = LiveTallies(PAIRED.window_seconds, PAIRED.load_bands, now=rows[0].time)
    walked.start(0)
    for i, r in enumerate(rows, start=1):
        walked.advance(min(r.time, NOW))
        walked.rows_written([r], i)
    walked.advance(NOW)
    # the reference really has rows outside the short windows and in every category
    assert ref.rows == 2000
    assert sum(t.paired for t in ref.tallies["15m"].values()) < sum(
        t.paired for t in ref.tallies["24h"].values()
    )
    assert len(ref.tallies[SINCE_START]) == 5
    for live in (rebuilt, walked):
        got = StatsInputs.from_live(live)
        assert got.tallies == ref.tallies
        assert list(got.tallies[SINCE_START]) == list(ref.tallies[SINCE_START])  # SQL order
        assert got.arm_totals == ref.arm_totals
        assert got.by_load == ref.by_load
        assert got.rows == ref.rows
        assert _stats(got) == _stats(ref)


async def test_listener_follows_commits_and_retention(tmp_path: Path) -> None:
    """Attached to the ledger, the live tallies follow each committed batch and each
    retention prune: after ``max_rows = 500`` pruned the oldest rows, they equal the SQL
    recomputation over the 500 rows left."""
    rows = varied_rows(11, 1200)
    led = Ledger(
        tmp_path / "l.db", wall_clock=FakeWallClock(NOW), max_rows=500, prune_interval_seconds=0.0
    )
    await led.open()
    try:
        live = LiveTallies(PAIRED.window_seconds, PAIRED.load_bands, now=NOW)
        led.listener = live
        as_of, groups = await led.history(live.grouping())
        live.add_groups(groups)
        live.start(as_of)
        for r in rows:
            led.submit(r)
        await led.flush()
        ref = await ledger_inputs(led, PAIRED, NOW)
    finally:
        await led.close()
    assert ref.rows == 500
    got = StatsInputs.from_live(live)
    assert got == ref


async def test_rows_committed_while_rebuilding_are_counted_once(tmp_path: Path) -> None:
    """Notifications that arrive before :meth:`LiveTallies.start` are held back: those of
    write transactions the rebuild already read are dropped, later ones applied: 300 rows in
    the ledger plus 40 committed after the read give 340, not 300 or 380."""
    rows = varied_rows(3, 340)
    led = await _filled(tmp_path / "l.db", rows[:300])
    try:
        live = LiveTallies(PAIRED.window_seconds, PAIRED.load_bands, now=NOW)
        led.listener = live
        # a notification of an already-read transaction (number 1) arrives late
        live.rows_written(rows[:5], 1)
        as_of, groups = await led.history(live.grouping())
        assert as_of >= 1
        for r in rows[300:]:
            led.submit(r)
        await led.flush()
        live.add_groups(groups)
        live.start(as_of)
        ref = await ledger_inputs(led, PAIRED, NOW)
    finally:
        await led.close()
    assert ref.rows == 340
    assert StatsInputs.from_live(live) == ref


def test_a_bucket_leaving_changes_the_window_counts_by_hand() -> None:
    """Two paired rows in ``arith`` (one agreeing, one not) at ``now - 890`` s and one
    disagreeing at ``now - 10`` s: the 15-minute window holds 3 paired rows with 2 disagreeing.
    Twenty seconds later with no new row, the first bucket (``now - 890``) has left it: 1
    paired, 1 disagreeing; the 1-hour window and ``since_start`` still hold 3."""
    rng = random.Random(0)
    base = varied_row(rng, 0.0)
    mk = [
        (NOW - 890.0, True),
        (NOW - 890.0, False),
        (NOW - 10.0, False),
    ]
    rows = [
        replace(
            base,
            time=t,
            category="arith",
            status="paired",
            labelled=False,
            standard_correct=None,
            fly_correct=None,
            noise_correct=None,
            fly_agrees=agrees,
            noise_agrees=None,
            greedy=False,
        )
        for t, agrees in mk
    ]
    live = LiveTallies(PAIRED.window_seconds, PAIRED.load_bands, now=NOW)
    live.start(0)
    live.rows_written(rows, 1)
    assert live.tallies()["15m"]["arith"] == PairTally(agree=1, disagree=2)
    version = live.version
    assert live.advance(NOW + 10.0) is False  # first bucket of 15m: floor((now-890)/10) still
    assert live.advance(NOW + 20.0) is True
    assert live.version == version + 1
    t = live.tallies()
    assert t["15m"]["arith"] == PairTally(disagree=1)
    assert t["1h"]["arith"] == PairTally(agree=1, disagree=2)
    assert t[SINCE_START]["arith"] == PairTally(agree=1, disagree=2)
