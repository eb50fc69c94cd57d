"""The engine that aggregates while the sidecar runs (mutable, owned by the event loop's thread):
:class:`OutcomeCounters` (the monotonic pair counters) and :class:`LiveTallies` (the ledger's
tallies kept in memory per time bucket)."""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from specwatch.core.config import SINCE_START
from specwatch.core.logs import log_event
from specwatch.shadow.compare import CompareConfig, compare
from specwatch.shadow.decision import (
    ReplyCounts,
    add_replies,
    decision_table,
    reply_counts,
    stored_replies,
)
from specwatch.shadow.ledger.aggregates import HistoryGroup, HistoryGrouping
from specwatch.shadow.ledger.ledger import Ledger
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.shadow.published import DecisionRow, LoadBand, ShadowIO, ShadowStats
from specwatch.shadow.sample import OTHER_CATEGORY, CategoryBound
from specwatch.shadow.settings import PairedSettings
from specwatch.shadow.stats.alarms import LiveAlarmState
from specwatch.shadow.summary import (
    Carried,
    LedgerView,
    Levels,
    OrderedState,
    ProcessCounts,
    build_shadow_stats,
    categories_by_volume,
    load_bands,
)
from specwatch.shadow.tally import (
    ArmSums,
    ArmTotals,
    HistoryCell,
    PairTally,
    arm_label_counts,
    labelled_outcome,
    load_band_labels,
    row_band,
    row_cell,
    row_tally,
    sum_cells,
)
from specwatch.shadow.values import PairOutcome, ReplayPair
from specwatch.shadow.windows import WindowedSums

logger = logging.getLogger("specwatch.shadow.live")


class OutcomeCounters:
    """The one set of monotonic pair counters: ``specwatch_shadow_pairs_total``,
    ``..._unpaired_total``, ``..._excluded_total`` and ``..._replays_total`` (mutable; owned by
    the one task that consumes outcomes).

    Per paired outcome and arm (``fly``, ``noise``): a correctness outcome when the pair is
    labelled (``both_correct|both_wrong|lost|gained``) and an agreement outcome
    (``agree|disagree``) always, so ``sum(outcome=~"agree|disagree")`` counts paired requests and
    ``sum(outcome=~"both_.*|lost|gained")`` labelled ones. ``paired`` counts paired requests,
    ``unpaired`` / ``excluded`` the others by reason; :meth:`by_status` sums them per status.
    """

    def __init__(self, categories: CategoryBound | None = None) -> None:
        self._categories = categories
        self.pairs: dict[tuple[str, str, str], int] = {}
        self.paired = 0
        self.unpaired: dict[str, int] = {}
        self.excluded: dict[str, int] = {}

    def _inc(self, key: tuple[str, str, str], n: int = 1) -> None:
        if n:
            self.pairs[key] = self.pairs.get(key, 0) + n

    def add(self, row: LedgerRow) -> None:
        """Count one compared pair, given as its ledger row, by the same table as :meth:`seed`
        (:func:`row_tally`), so counters rebuilt from the ledger equal counters kept live."""
        reasons: dict[tuple[str, str], int] = (
            {} if row.status == "paired" else {(row.status, row.reason or "unknown"): 1}
        )
        self.seed({row.category: row_tally(row)}, reasons)

    def fold(self) -> None:
        """Count the pairs of every category the bound no longer keeps as ``other`` (a slot
        that changed hands): the sum over categories is unchanged and the series stay at most
        the kept categories and ``other``."""
        bound = self._categories
        if bound is None:
            return
        for key in [k for k in self.pairs if bound.map(k[0]) != k[0]]:
            self._inc((OTHER_CATEGORY, key[1], key[2]), self.pairs.pop(key))

    def by_status(self) -> dict[str, int]:
        """Pairs per status (``paired``, ``unpaired``, ``excluded``; each present from 0)."""
        return {
            "paired": self.paired,
            "unpaired": sum(self.unpaired.values()),
            "excluded": sum(self.excluded.values()),
        }

    def seed(
        self, by_category: Mapping[str, PairTally], reasons: Mapping[tuple[str, str], int]
    ) -> None:
        """Add a ledger's totals (``Ledger.tally()`` and ``Ledger.reason_counts()``); with a
        category bound, a category it cannot keep is counted as ``other``."""
        for cat, t in by_category.items():
            if self._categories is not None:
                cat = self._categories.map(cat)
            self.paired += t.paired
            for arm, label, n in arm_label_counts(t):
                self._inc((cat, arm, label), n)
        for (status, reason), n in reasons.items():
            target = self.unpaired if status == "unpaired" else self.excluded
            target[reason] = target.get(reason, 0) + n


class LiveTallies:
    """The ledger's tallies kept in memory, updated per row and per window expiry (mutable;
    owned by the event loop's thread).

    Holds a :class:`~specwatch.shadow.windows.WindowedSums` of
    :class:`~specwatch.shadow.tally.HistoryCell` per ``(category, load band)`` over ``windows``
    (``{name: seconds}``, :data:`SINCE_START` = every row is always added), with buckets of
    ``bucket_seconds`` (the windows' edge granularity, see :mod:`specwatch.shadow.windows`).
    Fed by the ledger as a :class:`~specwatch.shadow.ledger.aggregates.HistoryListener`
    (committed rows, pruned groups) and rebuilt from :meth:`Ledger.history
    <specwatch.shadow.ledger.Ledger.history>` with :meth:`add_groups`. ``version`` grows on
    every change, so derived statistics are computed again only when it moved.
    """

    def __init__(
        self,
        windows: Mapping[str, float | None],
        bands: Sequence[int],
        *,
        now: float,
        bucket_seconds: float = 10.0,
    ) -> None:
        self.windows: dict[str, float | None] = {**windows, SINCE_START: None}
        self.bands = tuple(bands)
        self.sums: WindowedSums[tuple[str, str], HistoryCell] = WindowedSums(
            self.windows, zero=HistoryCell(), now=now, bucket_seconds=bucket_seconds
        )
        #: Grows by one on every change of any window's sums.
        self.version = 0
        # Until start(): ledger notifications are held back (the rebuild is being read).
        self._as_of: int | None = None
        self._held: list[tuple[int, Sequence[LedgerRow] | None, Sequence[HistoryGroup]]] = []

    # -- HistoryListener ----------------------------------------------------------------------

    def grouping(self) -> HistoryGrouping:
        """How the ledger groups rows for :meth:`add_groups` / :meth:`rows_pruned`."""
        return HistoryGrouping(self.sums.bucket_seconds, self.sums.horizon(), self.bands)

    def rows_written(self, rows: Sequence[LedgerRow], commit: int) -> None:
        """Add committed rows (O(1) each); before :meth:`start`, held back; ignored when
        ``commit`` is already in the rebuild."""
        if self._as_of is None:
            self._held.append((commit, rows, ()))
            return
        if commit <= self._as_of:
            return
        for r in rows:
            self.sums.add(
                r.time, (r.category, row_band(r.running_at_replay, self.bands)), row_cell(r)
            )
        if rows:
            self.version += 1

    def rows_pruned(self, groups: Sequence[HistoryGroup], commit: int) -> None:
        """Take back the groups of rows retention deleted (held back / ignored as
        :meth:`rows_written`)."""
        if self._as_of is None:
            self._held.append((commit, None, groups))
            return
        if commit <= self._as_of:
            return
        for g in groups:
            self.sums.remove_bucket(g.bucket, (g.category, g.band), g.cell)
        if groups:
            self.version += 1

    # -- rebuild and time ---------------------------------------------------------------------

    def start(self, as_of: int) -> None:
        """Apply the notifications held back since the listener was attached whose write
        transaction is after ``as_of`` (the rebuild's, :meth:`Ledger.history
        <specwatch.shadow.ledger.Ledger.history>`), then apply every later one as it comes."""
        self._as_of = as_of
        held, self._held = self._held, []
        for commit, rows, groups in held:
            if rows is not None:
                self.rows_written(rows, commit)
            else:
                self.rows_pruned(groups, commit)

    def add_groups(self, groups: Sequence[HistoryGroup]) -> None:
        """Add grouped rows read back from the ledger (the restart rebuild; before
        :meth:`start`)."""
        self.sums.add_buckets(((g.bucket, (g.category, g.band), g.cell) for g in groups), sum_cells)
        if groups:
            self.version += 1

    def advance(self, now: float) -> bool:
        """Expire buckets that left a window at ``now``; ``True`` when some sums changed."""
        changed = self.sums.advance(now)
        if changed:
            self.version += 1
        return changed

    # -- reading ------------------------------------------------------------------------------

    def tallies(self) -> dict[str, dict[str, PairTally]]:
        """``{window: {category: PairTally}}`` (what ``Ledger.tally(since=now - seconds)`` per
        window gives, to the bucket edge), categories sorted as SQL's ``GROUP BY`` returns them
        (float sums pooled over categories then add up in the same order)."""
        out: dict[str, dict[str, PairTally]] = {}
        for name in self.windows:
            by_cat: dict[str, PairTally] = {}
            for (cat, _band), cell in self.sums.sums(name).items():
                old = by_cat.get(cat)
                by_cat[cat] = cell.tally if old is None else old + cell.tally
            out[name] = dict(sorted(by_cat.items()))
        return out

    def by_load(self) -> dict[str, PairTally]:
        """``{band: PairTally}`` since start (``Ledger.tally_by_load``)."""
        out: dict[str, PairTally] = {}
        for (_cat, band), cell in self.sums.sums(SINCE_START).items():
            out[band] = out.get(band, PairTally()) + cell.tally
        return dict(sorted(out.items()))

    def arm_totals(self) -> dict[str, ArmTotals]:
        """``{category: ArmTotals}`` since start (``Ledger.arm_totals``)."""
        out: dict[str, ArmSums] = {}
        for (cat, _band), cell in self.sums.sums(SINCE_START).items():
            out[cat] = out.get(cat, ArmSums()) + cell.arms
        return {cat: sums.totals() for cat, sums in sorted(out.items())}

    def rows(self) -> int:
        """Rows in the ledger (``Ledger.row_count``)."""
        return sum(c.rows for c in self.sums.sums(SINCE_START).values())


#: Width of the live statistics' time buckets: every finite window reaches back between its
#: length and its length plus this (see :mod:`specwatch.shadow.windows`).
STATS_BUCKET_SECONDS = 10.0


class RowSink(Protocol):
    """Where :class:`ShadowStatistics` hands each pair's ledger row: :meth:`Ledger.submit
    <specwatch.shadow.ledger.ledger.Ledger.submit>` (queues it for writing, never waits)."""

    def submit(self, row: LedgerRow, /) -> bool: ...


@dataclass(frozen=True, slots=True)
class StatsInputs:
    """What :class:`ShadowStats` is built from, however it was counted: ``tallies[window]
    [category]``, since-start ``arm_totals[category]`` and load bands ``by_load``, and the
    ledger's ``rows``."""

    tallies: Mapping[str, Mapping[str, PairTally]]
    arm_totals: Mapping[str, ArmTotals]
    by_load: tuple[LoadBand, ...]
    rows: int

    @classmethod
    def from_live(cls, live: LiveTallies) -> StatsInputs:
        """From the in-memory tallies (no I/O)."""
        return cls(
            live.tallies(),
            live.arm_totals(),
            load_bands(live.by_load(), load_band_labels(live.bands)),
            live.rows(),
        )


async def ledger_inputs(ledger: Ledger, paired: PairedSettings, now: float) -> StatsInputs:
    """The full recomputation from the ledger's SQL tallies (one query per window, plus arm
    totals in fixed point, load bands and the row count): exact per-row window edges ``time >=
    now - seconds``; the reference :class:`LiveTallies` is checked against."""
    tallies = {
        name: await ledger.tally(since=None if secs is None else now - secs)
        for name, secs in paired.window_seconds.items()
    }
    if SINCE_START not in tallies:
        tallies[SINCE_START] = await ledger.tally()
    by_load = load_bands(
        await ledger.tally_by_load(paired.load_bands), load_band_labels(paired.load_bands)
    )
    totals = await ledger.arm_totals(fixed_point=True)
    return StatsInputs(tallies, totals, by_load, await ledger.row_count())


class ShadowStatistics:
    """The pair path after replay, one hop per method: :meth:`take_pair` (a
    :class:`ReplayPair`, from the pipeline) compares it into a :class:`PairOutcome`,
    :meth:`take_outcome` turns that into its one :class:`LedgerRow`, hands it to :attr:`rows`
    (the ledger), counts it (:class:`OutcomeCounters`) and folds it into the order-dependent
    e-processes (:attr:`alarms`); :meth:`snapshot` builds the published :class:`ShadowStats`.

    ``paired``: the settings group; ``categories``: the category bound (shared with the
    sampler); ``store_text``: rows keep the answers' text. Mutable, owned by the event loop's
    thread; the component rebuilds it from the ledger at start (:meth:`rebuild`).
    """

    def __init__(self, paired: PairedSettings, categories: CategoryBound, store_text: bool) -> None:
        self.paired = paired
        self.categories = categories
        self.store_text = store_text
        self.counters = OutcomeCounters(categories)
        #: The no-net-loss e-process and its change detector, the margin e-process and the
        #: "within margin" declaration (folded pair by pair; replayed from the ledger at start).
        self.alarms = LiveAlarmState.fresh(paired)
        #: The in-memory tallies, built by :meth:`rebuild` (``None`` before).
        self.live: LiveTallies | None = None
        #: Where rows go (the open ledger; ``None``: rows are counted, not stored).
        self.rows: RowSink | None = None
        self._compare_config = CompareConfig()
        self._inputs: tuple[int, StatsInputs] | None = None
        self._decisions: tuple[tuple[Any, ...], tuple[DecisionRow, ...]] | None = None
        #: Reply counts the ledger held when this process started (added to its own counters).
        self._stored_replies: dict[tuple[str, str], ReplyCounts] = {}

    # -- the hops -----------------------------------------------------------------------------

    async def take_pair(self, pair: ReplayPair) -> None:
        """Compare one replayed pair (:func:`~specwatch.shadow.compare.compare`; in a worker
        thread for the ``math`` checker) and take its outcome."""
        if pair.request.checker == "math":
            outcome = await asyncio.to_thread(compare, pair, self._compare_config)
        else:
            outcome = compare(pair, self._compare_config)
        self.take_outcome(outcome)

    def take_outcome(self, outcome: PairOutcome) -> LedgerRow:
        """Store and count one compared pair: its one ledger row is handed to :attr:`rows`,
        counted and fed to the order-dependent statistics (:attr:`alarms`); returns the row."""
        row = LedgerRow.from_outcome(outcome, self.store_text)
        if self.rows is not None:
            self.rows.submit(row)
        self.counters.add(row)
        labelled = labelled_outcome(row)
        if labelled is not None:
            self.alarms = self.alarms.add([labelled])
        return row

    def current_inputs(self, now: float) -> tuple[int, StatsInputs]:
        """Expire the buckets that left a window at ``now`` and read :attr:`live` (reused
        while its version is unchanged): ``(version, inputs)``. Raises ``RuntimeError`` before
        :meth:`rebuild`."""
        live = self.live
        if live is None:
            raise RuntimeError("shadow statistics are not built")
        live.advance(now)
        if self._inputs is None or self._inputs[0] != live.version:
            self._inputs = (live.version, StatsInputs.from_live(live))
        return self._inputs

    def snapshot(self, inputs: StatsInputs, now: float, side: SnapshotSide) -> ShadowStats:
        """The published :class:`ShadowStats` of ``inputs`` with these counters, e-processes
        and category bound, and what ``side`` brings (no I/O)."""
        p = self.paired
        replies = add_replies(self._stored_replies, reply_counts(side.io))
        kept = tuple(self.categories.kept)
        log_e = self.alarms.net_loss.log_e_value
        dkey = (side.version, p.alpha, p.margin, p.detect_net_loss, p.power, replies, kept, log_e)
        if side.version is None or self._decisions is None or self._decisions[0] != dkey:
            decisions = decision_table(
                inputs.tallies[SINCE_START],
                inputs.arm_totals,
                levels=Levels(alpha=p.alpha, margin=p.margin, detect_net_loss=p.detect_net_loss),
                power=p.power,
                replies=replies,
                kept=self.categories.kept,
                overall_log_e_value=log_e,
            )
            self._decisions = (dkey, decisions)
        self.counters.fold()
        c, a = self.counters, self.alarms
        return build_shadow_stats(
            inputs.tallies,
            now=now,
            levels=Levels(p.alpha, p.margin, p.detect_net_loss, self.categories.limit + 1),
            ordered=OrderedState(
                net_loss_log_e_value=log_e,
                betting_log_e_value=a.betting.log_wealth,
                change_log_value=a.net_loss.log_detector,
                change_threshold=a.change_arl,
                within_margin_declared_at=a.declaration.declared_at,
            ),
            counts=ProcessCounts(
                pairs_total=c.pairs,
                unpaired_total=c.unpaired,
                excluded_total=c.excluded,
                replays_total=c.by_status(),
                kept=self.categories.kept,
                folded=self.categories.overflowed,
                takeovers=self.categories.demoted,
            ),
            ledger=replace(side.ledger, rows=inputs.rows),
            carried=Carried(
                io=side.io,
                decisions=self._decisions[1],
                by_load=inputs.by_load,
                arm_totals=sum(inputs.arm_totals.values(), ArmTotals()),
            ),
        )

    # -- start --------------------------------------------------------------------------------

    async def rebuild(self, ledger: Ledger, now: float) -> None:
        """Build :attr:`live` from the ledger (one grouped SQL pass, worker threads) and replay
        its labelled pairs in write order into :attr:`alarms`; seed the category bound with
        the ledger's categories, most rows first. The counters start at 0 with the process (a
        restart is a true counter reset)."""
        p = self.paired
        live = LiveTallies(
            p.window_seconds, p.load_bands, now=now, bucket_seconds=STATS_BUCKET_SECONDS
        )
        ledger.listener = live  # holds back what is committed meanwhile (see LiveTallies.start)
        as_of = 0  # nothing to read (the ledger cannot be read): the statistics start empty
        if ledger.state == "ok":
            try:
                as_of, groups = await ledger.history(live.grouping())
            except sqlite3.DatabaseError:
                # a damaged page the open did not touch: the integrity check marks the ledger
                # corrupt (the next start moves it aside); anything else is raised
                if await ledger.quick_check() is None:
                    raise
            else:
                await asyncio.to_thread(live.add_groups, groups)
        live.start(as_of)
        since_start = live.tallies()[SINCE_START]
        self.categories.seed(categories_by_volume(since_start))
        if ledger.state == "ok":
            # in write order: the order the live fold saw the pairs (as replays finished)
            self.alarms = await ledger.fold_labelled(
                lambda state, chunk: state.add(chunk), LiveAlarmState.fresh(p), written_order=True
            )
            self._stored_replies = stored_replies(await ledger.reply_totals())
        self.live = live
        log_event(
            logger,
            logging.INFO,
            "shadow statistics rebuilt from the ledger",
            labelled_pairs=sum(t.paired_counts().n for t in since_start.values()),
            rows=live.rows(),
            path=str(ledger.path),
        )

    def reset(self) -> None:
        """Forget the in-memory tallies and cached tables (the component stopped)."""
        self.live = None
        self.rows = None
        self._inputs = self._decisions = None


@dataclass(frozen=True, slots=True)
class SnapshotSide:
    """What a snapshot takes besides the tallies: the I/O side's ``io`` (``None``: unknown),
    the ``ledger``'s state and errors, and the :attr:`LiveTallies.version` the inputs were read
    at (the decision table is reused while it, the settings, the reply counts and the kept
    categories are unchanged; ``None``: computed afresh)."""

    io: ShadowIO | None = None
    ledger: LedgerView = field(default_factory=LedgerView)
    version: int | None = None
