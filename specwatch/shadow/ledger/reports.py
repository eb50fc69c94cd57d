"""The reads ``specwatch report`` makes (aggregates in SQL, one streamed read): the two halves of
the arm sums, the ledger's row count and time span, labelled pairs per time bin, and every row
in time order packed into one integer (:class:`ReportStream`), from which the report's tallies,
flip bins and order-dependent e-processes are computed without a Python object per row."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from specwatch.shadow.ledger.connections import Connections
from specwatch.shadow.ledger.predicates import (
    ARM_DECODE,
    ARM_SPEED,
    ARM_TAU,
    LABELLED_SQL,
    STATUSES,
    TRI_COLUMNS,
    decode_sql,
)
from specwatch.shadow.ledger.queries import arm_totals_of
from specwatch.shadow.tally import UNKNOWN_BAND, ArmTotals, PairTally, load_band_labels, row_tally


@dataclass(frozen=True, slots=True)
class ReportSpan:
    """Whole-ledger and labelled-pair counts and time ranges (unix seconds; ``None`` when there
    are no such rows), from :meth:`Ledger.report_span`."""

    rows: int
    first_time: float | None
    last_time: float | None
    labelled_first_time: float | None
    labelled_last_time: float | None


@dataclass(frozen=True, slots=True)
class BinCounts:
    """Labelled pairs in one time bin (:meth:`Ledger.labelled_bins`): ``n`` pairs, ``lost``
    (standard right, FLy wrong) and ``gained`` (FLy right, standard wrong)."""

    bin: int
    n: int
    lost: int
    gained: int


_TRITS: tuple[bool | None, ...] = (False, True, None)
#: Up to this many categories the stream maps names to codes with a CASE, beyond with a lookup.
_CASE_CATEGORIES = 64
_Ints = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class LabelledStream:
    """Labelled pairs in time order as columns: shape ``(n,)`` each; ``category[i]`` indexes
    ``categories``, ``d[i]`` is +1 lost (standard right, FLy wrong), −1 gained, 0 concordant."""

    categories: tuple[str, ...]
    category: npt.NDArray[np.int64]
    d: npt.NDArray[np.int8]


@dataclass(frozen=True, slots=True)
class ReportStream:
    """Every ledger row in time order as one integer (:meth:`Ledger.report_stream`), shape
    ``(rows,)``.

    ``key = ((category * (S + 1) + status) * 3**m + trits) * (len(bands) + 1) + band`` with
    ``category`` an index into ``categories`` (sorted), ``status`` an index into the statuses
    the tally rules name (``S`` = their number; ``S`` for any other), ``trits`` the base-3 digits
    (0 false, 1 true, 2 unknown) of the ``m`` boolean columns the rules read, in sorted order,
    and ``band`` 0 for an unknown running count, ``i + 1`` for band ``bands[i]`` (labels
    ``band_labels``, from :func:`~specwatch.shadow.tally.load_band_labels`).
    """

    categories: tuple[str, ...]
    band_labels: tuple[str, ...]
    key: npt.NDArray[np.int64]
    #: time bin of every row (see :meth:`Ledger.report_stream`), shape ``(rows,)``; empty when
    #: the stream was read without bins
    bin: npt.NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))

    def _split(
        self, key: npt.NDArray[np.int64]
    ) -> tuple[
        npt.NDArray[np.int64],
        npt.NDArray[np.int64],
        list[npt.NDArray[np.int64]],
        npt.NDArray[np.int64],
    ]:
        band = key % (len(self.band_labels) + 1)
        rest = key // (len(self.band_labels) + 1)
        trits: list[npt.NDArray[np.int64]] = []
        for _ in TRI_COLUMNS:
            trits.append(rest % 3)
            rest = rest // 3
        trits.reverse()
        statuses = len(STATUSES) + 1
        return rest // statuses, rest % statuses, trits, band

    def tallies(self) -> dict[tuple[str, str], PairTally]:
        """:class:`PairTally` per ``(category, band label)`` (``unknown`` band for rows without a
        running count), by the rules of :data:`~specwatch.shadow.tally.TALLY_RULES` applied to
        each distinct key once and weighted by its row count."""
        keys, counts = np.unique(self.key, return_counts=True)
        cat, status, trits, band = self._split(keys)
        labels = (UNKNOWN_BAND, *self.band_labels)
        out: dict[tuple[str, str], PairTally] = {}
        for i, n in enumerate(counts.tolist()):
            s = int(status[i])
            cell = _Cell(
                category=self.categories[int(cat[i])],
                status=STATUSES[s] if s < len(STATUSES) else "",
                values={c: _TRITS[int(t[i])] for c, t in zip(TRI_COLUMNS, trits, strict=True)},
            )
            one = row_tally(cell)
            scaled = PairTally(**{f.name: getattr(one, f.name) * n for f in fields(one)})
            at = (cell.category, labels[int(band[i])])
            out[at] = out.get(at, PairTally()) + scaled
        return out

    def _labelled_columns(self) -> tuple[npt.NDArray[np.bool_], _Ints, _Ints, _Ints]:
        """``(mask of labelled rows, standard trit, fly trit, key above the bool digits)``."""
        bands = len(self.band_labels) + 1
        m = len(TRI_COLUMNS)

        def trit(col: str) -> _Ints:
            place = bands * 3 ** (m - 1 - TRI_COLUMNS.index(col))
            out: _Ints = (self.key // place) % 3
            return out

        std, fly = trit("standard_correct"), trit("fly_correct")
        upper = self.key // (bands * 3**m)
        statuses = len(STATUSES) + 1
        mask = (upper % statuses == STATUSES.index("paired")) & (std != 2) & (fly != 2)
        return mask, std, fly, upper

    def labelled(self) -> LabelledStream:
        """The labelled pairs (:data:`~specwatch.shadow.tally.LABELLED`), in time order."""
        mask, std, fly, upper = self._labelled_columns()
        return LabelledStream(
            categories=self.categories,
            category=upper[mask] // (len(STATUSES) + 1),
            d=(std[mask] - fly[mask]).astype(np.int8),
        )

    def labelled_bins(self) -> list[BinCounts]:
        """Labelled pairs per time bin (the bins the stream was read with), the same counts as
        :meth:`Ledger.labelled_bins`: :class:`BinCounts` of non-empty bins, by bin. Raises
        ``ValueError`` when the stream was read without bins."""
        if self.bin.size != self.key.size:
            raise ValueError("the stream was read without time bins")
        mask, std, fly, _ = self._labelled_columns()
        b, s, f = self.bin[mask], std[mask], fly[mask]
        size = int(b.max()) + 1 if b.size else 0
        n = np.bincount(b, minlength=size)
        lost = np.bincount(b[(s == 1) & (f == 0)], minlength=size)
        gained = np.bincount(b[(s == 0) & (f == 1)], minlength=size)
        return [
            BinCounts(int(i), int(n[i]), int(lost[i]), int(gained[i])) for i in np.flatnonzero(n)
        ]


@dataclass(frozen=True, slots=True)
class _Cell:
    """One distinct :attr:`ReportStream.key`, read by the tally rules like a ledger row."""

    category: str
    status: str
    values: Mapping[str, bool | None]
    time: float = 0.0

    def __getattr__(self, name: str) -> bool | None:
        try:
            return self.values[name]
        except KeyError:
            raise AttributeError(name) from None


class ReportQueries:
    """The report's reads of the ledger connected by ``db``."""

    def __init__(self, db: Connections) -> None:
        self._db = db

    async def report_arm_totals(self, part: Literal["tau", "speed"]) -> dict[str, ArmTotals]:
        """One half of :meth:`Ledger.arm_totals` (its float sums) for the report: the same sums in
        the same row order (the category index). ``"tau"`` fills the τ fields, ``"speed"`` the
        speed fields, the rest stay 0, so ``tau[c] + speed[c]`` equals ``arm_totals()[c]``
        (categories without such pairs are absent: zero sums). Each half reads only the paired
        rows it sums (a ``WHERE`` instead of a ``CASE`` per row and column: about 30 % less CPU
        at a million rows), and the report runs the two on two connections at once. Raises
        ``sqlite3.Error`` / ``ValueError`` (closed ledger)."""
        if part == "tau":
            sql = (
                "SELECT category, COUNT(*), SUM(standard_spec_steps), "
                "SUM(standard_accepted_tokens), SUM(fly_spec_steps), SUM(fly_accepted_tokens) "
                f"FROM pairs WHERE {ARM_TAU} GROUP BY category"
            )
            raw = await asyncio.to_thread(self._db.read, sql, ())
            return {
                str(c): ArmTotals(
                    tau_pairs=int(n),
                    standard_steps=int(a),
                    standard_accepted=int(b),
                    fly_steps=int(d),
                    fly_accepted=int(e),
                )
                for c, n, a, b, d, e in raw
            }
        speed = (
            "1",
            "standard_tokens",
            "fly_tokens",
            "standard_latency_seconds",
            "fly_latency_seconds",
        )
        cols = [f"SUM(CASE WHEN {ARM_SPEED} THEN {c} ELSE 0 END)" for c in speed]
        cols += [f"SUM({e})" for e in decode_sql(fixed_point=False)]
        sql = (
            f"SELECT category, {', '.join(cols)} FROM pairs "
            f"WHERE ({ARM_SPEED}) OR ({ARM_DECODE}) GROUP BY category"
        )
        raw = await asyncio.to_thread(self._db.read, sql, ())
        # the τ fields (5) stay 0: the speed and decode sums follow in ArmTotals' field order
        return {str(r[0]): arm_totals_of((0,) * 5 + tuple(r[1:])) for r in raw}

    async def report_span(self) -> ReportSpan:
        """Row count and time range of the whole ledger and of its labelled pairs
        (:data:`~specwatch.shadow.tally.LABELLED`); the times come from the ``time`` index."""
        lab = LABELLED_SQL
        sql = (
            "SELECT (SELECT COUNT(*) FROM pairs), (SELECT MIN(time) FROM pairs), "
            "(SELECT MAX(time) FROM pairs), "
            f"(SELECT time FROM pairs WHERE {lab} ORDER BY time LIMIT 1), "
            f"(SELECT time FROM pairs WHERE {lab} ORDER BY time DESC LIMIT 1)"
        )
        (r,) = await asyncio.to_thread(self._db.read, sql, ())
        return ReportSpan(int(r[0]), r[1], r[2], r[3], r[4])

    async def labelled_bins(self, start: float, width: float, bins: int) -> list[BinCounts]:
        """Labelled pairs per time bin, ``GROUP BY`` in SQL: bin ``i`` holds
        ``start + i * width <= time < start + (i + 1) * width`` (``floor((time - start) / width)``,
        clamped to ``[0, bins - 1]``, so the last bin also holds its end; ``width <= 0`` puts
        every pair in bin 0). Returns :class:`BinCounts` of non-empty bins, by bin. Raises
        ``ValueError`` for ``bins < 1``."""
        if bins < 1:
            raise ValueError("bins must be >= 1")
        expr = "0" if width <= 0.0 else "MIN(?, MAX(0, CAST((time - ?) / ? AS INTEGER)))"
        params: list[Any] = [] if width <= 0.0 else [bins - 1, start, width]
        sql = (
            f"SELECT {expr} AS b, COUNT(*), "
            "SUM(CASE WHEN standard_correct = 1 AND fly_correct = 0 THEN 1 ELSE 0 END), "
            "SUM(CASE WHEN standard_correct = 0 AND fly_correct = 1 THEN 1 ELSE 0 END) "
            f"FROM pairs WHERE {LABELLED_SQL} GROUP BY b ORDER BY b"
        )
        raw = await asyncio.to_thread(self._db.read, sql, params)
        return [BinCounts(int(b), int(n), int(lo or 0), int(ga or 0)) for b, n, lo, ga in raw]

    async def report_stream(
        self,
        bands: Sequence[int],
        *,
        bin_start: float = 0.0,
        bin_width: float = 0.0,
        bins: int = 1,
    ) -> ReportStream:
        """Every row in write order (``ORDER BY id``: the order the sidecar folded the pairs live,
        as replays finished, so the order-dependent e-processes equal the sidecar's) as one
        packed integer: its category,
        status, running-request band (lower bounds ``bands``) and the value of every column the
        :data:`~specwatch.shadow.tally.TALLY_RULES` read (see :class:`ReportStream`), plus its
        time bin (the bins of :meth:`labelled_bins`: ``floor((time - bin_start) / bin_width)``
        clamped to ``[0, bins - 1]``; all 0 when ``bin_width <= 0``). One read in a worker thread:
        SQLite joins the integers into one text value (``group_concat`` over the ordered rows)
        that numpy parses, so no Python object is made per row; what the report's tallies,
        flip bins and order-dependent e-processes are computed from. Raises ``sqlite3.Error`` /
        ``ValueError`` (closed ledger, ``bins < 1``)."""
        if bins < 1:
            raise ValueError("bins must be >= 1")
        return await asyncio.to_thread(
            self._report_stream_sync, tuple(bands), bin_start, bin_width, bins
        )

    def _report_stream_sync(
        self, bands: tuple[int, ...], bin_start: float, bin_width: float, bins: int
    ) -> ReportStream:
        with self._db.reading() as conn:
            cats = tuple(
                str(c) for (c,) in conn.execute("SELECT DISTINCT category FROM pairs ORDER BY 1")
            )
            params: list[Any] = []
            key = "0"
            if 0 < len(cats) <= _CASE_CATEGORIES:
                key = f"(CASE category {' '.join('WHEN ? THEN ?' for _ in cats)} ELSE 0 END)"
                params += [v for i, c in enumerate(cats) for v in (c, i)]
            elif cats:  # many categories: one indexed lookup per row instead of a long CASE
                conn.execute(
                    "CREATE TEMP TABLE IF NOT EXISTS report_categories "
                    "(name TEXT PRIMARY KEY, code INTEGER)"
                )
                conn.execute("DELETE FROM temp.report_categories")
                conn.executemany(
                    "INSERT INTO temp.report_categories VALUES (?, ?)",
                    [(c, i) for i, c in enumerate(cats)],
                )
                key = "(SELECT code FROM temp.report_categories WHERE name = category)"
            whens = " ".join("WHEN ? THEN ?" for _ in STATUSES)
            key = f"({key} * {len(STATUSES) + 1} + (CASE status {whens} ELSE ? END))"
            params += [v for i, st in enumerate(STATUSES) for v in (st, i)]
            params.append(len(STATUSES))
            for col in TRI_COLUMNS:
                key = f"({key} * 3 + (CASE {col} WHEN 0 THEN 0 WHEN 1 THEN 1 ELSE 2 END))"
            band = " ".join(
                f"WHEN running_at_replay >= {float(lo)!r} THEN {i + 1}"
                for i, lo in reversed(list(enumerate(bands)))
            )
            key = f"({key} * {len(bands) + 1} + (CASE {band} ELSE 0 END))"
            if bins > 1 and bin_width > 0.0:  # the bin as the lowest digit (labelled_bins' rule)
                key = f"({key} * ? + IFNULL(MIN(?, MAX(0, CAST((time - ?) / ? AS INTEGER))), 0))"
                params += [bins, bins - 1, bin_start, bin_width]
            # group_concat keeps the order of the ordered subquery (SQLite does not flatten an
            # ORDER BY subquery into an aggregate); the key is never NULL, so none is skipped
            (text,) = conn.execute(
                f"SELECT group_concat(k) FROM (SELECT {key} AS k FROM pairs ORDER BY id)",
                params,
            ).fetchone()
        packed = np.fromstring(text or "", dtype=np.int64, sep=",")
        binned = bins > 1 and bin_width > 0.0
        return ReportStream(
            cats,
            load_band_labels(bands) if bands else (),
            packed // bins if binned else packed,
            packed % bins if binned else np.zeros(packed.size, np.int64),
        )
