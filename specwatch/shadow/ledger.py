"""Pair ledger: one SQLite row per replayed pair (WAL mode, written off the event loop).

Writes are queued by :meth:`Ledger.submit` (non-blocking) and committed in batches by one
writer task that runs each batch in a worker thread (``asyncio.to_thread``); reads also run in
a thread on a second connection, so nothing blocks the loop. A committed batch survives a
``kill -9`` of the process (WAL, ``synchronous=NORMAL``; use ``FULL`` to survive power loss too).
A failed write is never silent: it is counted per exception type
(:attr:`LedgerHealth.write_errors`, exported as ``specwatch_ledger_write_errors_total``) and
logged as one structured line. No prompt or completion text is stored unless ``store_text``.

Beside the rows, table ``pair_sums`` holds their aggregates per (UTC day, category, running
count, pattern of the tally columns): row count and fixed-point arm sums, updated in the same
transaction as every insert and every retention prune, so the restart rebuild
(:meth:`Ledger.history`) reads O(stored groups + the rows of the last day or two) instead of
grouping every row. ``pair_sums_meta`` records the layout and the newest row id they cover; when
they disagree with the rows (an older specwatch's ledger, rows written by another program) the
next :meth:`Ledger.history` rebuilds them from every row, once, and logs it.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import operator
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from specwatch.core.logs import log_event
from specwatch.shadow.tally import (
    FIXED_POINT,
    LABELLED,
    TALLY_RULES,
    UNKNOWN_BAND,
    ArmSums,
    ArmTotals,
    Cell,
    HistoryCell,
    PairTally,
    Rule,
    load_band_labels,
    row_tally,
)
from specwatch.shadow.values import WRITE_ERROR_REASONS as WRITE_ERROR_REASONS
from specwatch.shadow.values import ArmOutcome, PairOutcome, ToolCall

log = logging.getLogger("specwatch.shadow.ledger")

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """One stored pair (times in unix seconds, latencies in seconds, tokens = completion tokens,
    ``*_tau`` = per-request mean acceptance length). Booleans are ``None`` when not applicable;
    ``noise_*`` are ``None`` when no noise arm was asked. ``request_id`` is the live request's
    ``X-Request-Id``. ``id`` is set on rows read back.

    Per arm, whether it answered or not: ``*_error`` (the arm's failure reason, e.g. ``aborted``,
    ``in_band_5xx``; ``None`` when it answered), ``*_error_code`` (an in-band error's code),
    ``*_finish_reason`` (as the server sent it, unknown values included) and ``*_truncated``
    (``length`` / ``content_filter``). The comparison fields behind ``*_agrees``:
    ``*_content_agrees``, ``*_tool_calls_agree`` and ``*_reasoning_agrees`` (see
    :mod:`specwatch.shadow.compare`). Texts (``*_text``, ``*_reasoning``, and ``*_tool_calls`` as a
    JSON list of ``{"name", "arguments"}``) only with ``store_text``, also of an arm that failed
    (its partial text), so the other side of an unpaired pair can be read back.

    ``greedy`` (temperature 0 or top_k 1), ``running_at_replay`` (running requests on the
    busiest arm's server when replayed), ``baseline_agrees`` (standard arm = no-speculation
    baseline) and ``noise_baseline_agrees`` (noise arm = baseline) are ``None`` in rows written
    before they existed."""

    time: float
    request_hash: str
    category: str
    source: str
    item_id: str | None
    status: str
    reason: str | None
    labelled: bool
    noise_asked: bool
    standard_correct: bool | None
    fly_correct: bool | None
    noise_correct: bool | None
    fly_agrees: bool | None
    noise_agrees: bool | None
    fly_divergence_char: int | None
    fly_divergence_token: int | None
    fly_similarity: float | None
    noise_divergence_char: int | None
    noise_similarity: float | None
    standard_latency_seconds: float | None
    fly_latency_seconds: float | None
    noise_latency_seconds: float | None
    standard_tokens: int | None
    fly_tokens: int | None
    noise_tokens: int | None
    standard_tau: float | None
    fly_tau: float | None
    noise_tau: float | None
    standard_text: str | None = None
    fly_text: str | None = None
    noise_text: str | None = None
    greedy: bool | None = None
    running_at_replay: float | None = None
    baseline_agrees: bool | None = None
    noise_baseline_agrees: bool | None = None
    request_id: str | None = None
    standard_error: str | None = None
    fly_error: str | None = None
    noise_error: str | None = None
    standard_error_code: int | None = None
    fly_error_code: int | None = None
    noise_error_code: int | None = None
    standard_finish_reason: str | None = None
    fly_finish_reason: str | None = None
    noise_finish_reason: str | None = None
    standard_truncated: bool | None = None
    fly_truncated: bool | None = None
    noise_truncated: bool | None = None
    fly_content_agrees: bool | None = None
    noise_content_agrees: bool | None = None
    fly_tool_calls_agree: bool | None = None
    noise_tool_calls_agree: bool | None = None
    fly_reasoning_agrees: bool | None = None
    noise_reasoning_agrees: bool | None = None
    standard_tool_calls: str | None = None
    fly_tool_calls: str | None = None
    noise_tool_calls: str | None = None
    standard_reasoning: str | None = None
    fly_reasoning: str | None = None
    noise_reasoning: str | None = None
    id: int | None = None

    @classmethod
    def from_outcome(cls, o: PairOutcome, store_text: bool = False) -> LedgerRow:
        """Flatten a :class:`PairOutcome`; texts only when ``store_text``."""
        n: ArmOutcome | None = o.noise

        def ok_only(a: ArmOutcome | None, v: Any) -> Any:
            return v if a is not None and a.ok else None

        def noise(get: Callable[[ArmOutcome], Any]) -> Any:
            return get(n) if n is not None else None

        def text(get: Callable[[ArmOutcome], Any]) -> Any:
            return (get(o.standard), get(o.fly), noise(get)) if store_text else (None,) * 3

        texts = text(operator.attrgetter("text"))
        reasonings = text(operator.attrgetter("reasoning"))
        tools = text(lambda a: _tool_calls_json(a.tool_calls) if a.tool_calls else None)

        return cls(
            time=o.time,
            request_hash=o.request_hash,
            category=o.category,
            source=str(o.source),
            item_id=o.item_id,
            status=o.status,
            reason=o.reason,
            labelled=o.labelled,
            noise_asked=n is not None,
            standard_correct=o.standard.correct,
            fly_correct=o.fly.correct,
            noise_correct=n.correct if n is not None else None,
            fly_agrees=o.fly.agrees,
            noise_agrees=n.agrees if n is not None else None,
            fly_divergence_char=o.fly.first_divergence_char,
            fly_divergence_token=o.fly.first_divergence_token,
            fly_similarity=o.fly.similarity,
            noise_divergence_char=n.first_divergence_char if n is not None else None,
            noise_similarity=n.similarity if n is not None else None,
            standard_latency_seconds=o.standard.latency_seconds,
            fly_latency_seconds=o.fly.latency_seconds,
            noise_latency_seconds=n.latency_seconds if n is not None else None,
            standard_tokens=o.standard.completion_tokens,
            fly_tokens=o.fly.completion_tokens,
            noise_tokens=n.completion_tokens if n is not None else None,
            standard_tau=o.standard.mean_acceptance_length,
            fly_tau=o.fly.mean_acceptance_length,
            noise_tau=n.mean_acceptance_length if n is not None else None,
            standard_text=texts[0],
            fly_text=texts[1],
            noise_text=texts[2],
            greedy=o.greedy,
            running_at_replay=o.running,
            baseline_agrees=o.baseline.agrees if o.baseline is not None else None,
            noise_baseline_agrees=o.noise_baseline_agrees,
            standard_error=o.standard.error,
            fly_error=o.fly.error,
            noise_error=noise(operator.attrgetter("error")),
            standard_error_code=o.standard.error_code,
            fly_error_code=o.fly.error_code,
            noise_error_code=noise(operator.attrgetter("error_code")),
            standard_finish_reason=o.standard.finish_reason,
            fly_finish_reason=o.fly.finish_reason,
            noise_finish_reason=noise(operator.attrgetter("finish_reason")),
            standard_truncated=ok_only(o.standard, o.standard.truncated),
            fly_truncated=ok_only(o.fly, o.fly.truncated),
            noise_truncated=ok_only(n, noise(operator.attrgetter("truncated"))),
            fly_content_agrees=o.fly.content_agrees,
            noise_content_agrees=noise(operator.attrgetter("content_agrees")),
            fly_tool_calls_agree=o.fly.tool_calls_agree,
            noise_tool_calls_agree=noise(operator.attrgetter("tool_calls_agree")),
            fly_reasoning_agrees=o.fly.reasoning_agrees,
            noise_reasoning_agrees=noise(operator.attrgetter("reasoning_agrees")),
            standard_tool_calls=tools[0],
            fly_tool_calls=tools[1],
            noise_tool_calls=tools[2],
            standard_reasoning=reasonings[0],
            fly_reasoning=reasonings[1],
            noise_reasoning=reasonings[2],
            request_id=o.request_id,
        )


def _tool_calls_json(calls: Sequence[ToolCall]) -> str:
    return json.dumps(
        [{"name": c.name, "arguments": c.arguments} for c in calls], ensure_ascii=False
    )


_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(LedgerRow) if f.name != "id")
_BOOL_COLUMNS = frozenset(f.name for f in fields(LedgerRow) if f.type in ("bool", "bool | None"))
_SQL_TYPES = {"float": "REAL", "str": "TEXT", "bool": "INTEGER", "int": "INTEGER"}


def _sql_type(annotation: object) -> str:
    base = str(annotation).split(" | ")[0]
    return _SQL_TYPES[base]


_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS pairs (id INTEGER PRIMARY KEY, "
    + ", ".join(f"{f.name} {_sql_type(f.type)}" for f in fields(LedgerRow) if f.name != "id")
    + ")",
    "CREATE INDEX IF NOT EXISTS pairs_time ON pairs(time)",
    "CREATE INDEX IF NOT EXISTS pairs_category_time ON pairs(category, time)",
)


def _add_missing_columns(conn: sqlite3.Connection) -> list[str]:
    """Additive schema migration: ``ALTER TABLE pairs ADD COLUMN`` for every :class:`LedgerRow`
    column a ledger written by an older specwatch lacks (old rows read them as ``NULL``: not
    known). Returns the names added; never drops or changes a column."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(pairs)")}
    added = []
    for f in fields(LedgerRow):
        if f.name != "id" and f.name not in have:
            conn.execute(f"ALTER TABLE pairs ADD COLUMN {f.name} {_sql_type(f.type)}")
            added.append(f.name)
    if added:
        log_event(log, logging.INFO, "ledger columns added", columns=",".join(added))
    return added


_INSERT = f"INSERT INTO pairs ({', '.join(_COLUMNS)}) VALUES ({', '.join('?' * len(_COLUMNS))})"


def _condition_sql(column: str, want: str | bool | Cell) -> str:
    if column not in _COLUMNS:
        raise ValueError(f"tally rule names an unknown column {column!r}")
    if want is Cell.NOT_NULL:
        return f"{column} IS NOT NULL"
    if isinstance(want, bool):
        return f"{column} = {int(want)}"
    return f"{column} = '{want}'"


def rule_sql(rule: Rule) -> str:
    """One :mod:`specwatch.shadow.tally` rule as an SQL condition over the ``pairs`` table."""
    return " AND ".join(_condition_sql(c, v) for c, v in rule)


# SQL aggregate per PairTally field, rendered from the one table in shadow/tally.py.
_TALLY_SQL: Mapping[str, str] = {name: rule_sql(rule) for name, rule in TALLY_RULES.items()}
_LABELLED_SQL = rule_sql(LABELLED)


_GET_VALUES = operator.attrgetter(*_COLUMNS)


def _row_to_values(row: LedgerRow) -> tuple[Any, ...]:
    values: tuple[Any, ...] = _GET_VALUES(row)
    return values


def _values_to_row(values: Sequence[Any]) -> LedgerRow:
    kw: dict[str, Any] = {"id": values[0]}
    for name, v in zip(_COLUMNS, values[1:], strict=True):
        kw[name] = bool(v) if (name in _BOOL_COLUMNS and v is not None) else v
    return LedgerRow(**kw)


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


S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class LedgerHealth:
    """Counters the exporter reads: rows committed since open, failed row writes by exception
    type, rows dropped because the write queue was full, the last error text, queue depth."""

    rows_written: int
    write_errors: Mapping[str, int]
    dropped: int
    last_error: str | None
    queue_depth: int


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


#: What one packed row carries, for both packed forms (the report stream's key and the stored
#: sums' pattern code): its status among these (any other value is one more code), and the
#: columns the tally rules read besides ``status``, each true, false or unknown.
_STATUSES: tuple[str, ...] = ("paired", "unpaired", "excluded")
_TRI_COLUMNS: tuple[str, ...] = tuple(
    dict.fromkeys(c for rule in (*TALLY_RULES.values(), LABELLED) for c, _ in rule if c != "status")
)
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
        for _ in _TRI_COLUMNS:
            trits.append(rest % 3)
            rest = rest // 3
        trits.reverse()
        statuses = len(_STATUSES) + 1
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
                status=_STATUSES[s] if s < len(_STATUSES) else "",
                values={c: _TRITS[int(t[i])] for c, t in zip(_TRI_COLUMNS, trits, strict=True)},
            )
            one = row_tally(cell)
            scaled = PairTally(**{f.name: getattr(one, f.name) * n for f in fields(one)})
            at = (cell.category, labels[int(band[i])])
            out[at] = out.get(at, PairTally()) + scaled
        return out

    def _labelled_columns(self) -> tuple[npt.NDArray[np.bool_], _Ints, _Ints, _Ints]:
        """``(mask of labelled rows, standard trit, fly trit, key above the bool digits)``."""
        bands = len(self.band_labels) + 1
        m = len(_TRI_COLUMNS)

        def trit(col: str) -> _Ints:
            place = bands * 3 ** (m - 1 - _TRI_COLUMNS.index(col))
            out: _Ints = (self.key // place) % 3
            return out

        std, fly = trit("standard_correct"), trit("fly_correct")
        upper = self.key // (bands * 3**m)
        statuses = len(_STATUSES) + 1
        mask = (upper % statuses == _STATUSES.index("paired")) & (std != 2) & (fly != 2)
        return mask, std, fly, upper

    def labelled(self) -> LabelledStream:
        """The labelled pairs (:data:`~specwatch.shadow.tally.LABELLED`), in time order."""
        mask, std, fly, upper = self._labelled_columns()
        return LabelledStream(
            categories=self.categories,
            category=upper[mask] // (len(_STATUSES) + 1),
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


class Ledger:
    """Async pair ledger over one SQLite file (or ``":memory:"`` is not supported: WAL needs a
    file).

    Use ``await ledger.open()`` / ``await ledger.close()`` (or ``async with``). ``clock``
    supplies "now" for retention. ``max_age_seconds`` / ``max_rows`` prune old rows after
    writes, at most every ``prune_interval_seconds``.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        store_text: bool = False,
        max_age_seconds: float | None = None,
        max_rows: int | None = None,
        batch_size: int = 1000,
        queue_size: int = 100_000,
        synchronous: str = "NORMAL",
        prune_interval_seconds: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if synchronous not in ("OFF", "NORMAL", "FULL", "EXTRA"):
            raise ValueError("synchronous must be OFF|NORMAL|FULL|EXTRA")
        self.path = Path(path)
        self.store_text = store_text
        self.max_age_seconds = max_age_seconds
        self.max_rows = max_rows
        self.batch_size = batch_size
        self.synchronous = synchronous
        self.prune_interval_seconds = prune_interval_seconds
        self._clock = clock
        self._queue: asyncio.Queue[LedgerRow | None] = asyncio.Queue(maxsize=queue_size)
        self._writer: asyncio.Task[None] | None = None
        self._wconn: sqlite3.Connection | None = None
        self._rconn: sqlite3.Connection | None = None
        self._rlock = threading.Lock()
        self._wlock = threading.Lock()
        self._submitted = 0
        self._processed = 0
        self._progress = asyncio.Condition()
        self._rows_written = 0
        self._write_errors: dict[str, int] = {}
        self._dropped = 0
        self._last_error: str | None = None
        self._last_prune = -float("inf")
        #: Told about committed and pruned rows (see :class:`HistoryListener`); ``None``: nobody.
        self.listener: HistoryListener | None = None
        self._commits = 0  # write transactions committed (under _wlock)

    # -- lifecycle -------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        conn.execute("PRAGMA busy_timeout=5000")
        return conn

    def _open_sync(self) -> None:
        self._wconn = self._connect()
        for stmt in (*_SCHEMA, *_SUMS_SCHEMA):
            self._wconn.execute(stmt)
        if self._wconn.execute("SELECT NOT EXISTS (SELECT 1 FROM pairs)").fetchone()[0]:
            # no rows: the (empty) aggregates are current (before any numbered write)
            self._wconn.execute("BEGIN IMMEDIATE")
            _sums_rebuild(self._wconn)
            self._wconn.execute("COMMIT")
        _add_missing_columns(self._wconn)
        self._rconn = self._connect()

    async def open(self) -> None:
        """Create or open the database (schema, WAL) and start the writer task.

        Raises ``sqlite3.Error`` / ``OSError`` when the file cannot be opened.
        """
        await asyncio.to_thread(self._open_sync)
        self._writer = asyncio.create_task(self._write_loop(), name="ledger-writer")

    async def close(self) -> None:
        """Write everything queued, stop the writer and close both connections."""
        if self._writer is not None:
            await self._queue.put(None)
            await self._writer
            self._writer = None
        await asyncio.to_thread(self._close_sync)

    def _close_sync(self) -> None:
        for conn in (self._wconn, self._rconn):
            if conn is not None:
                conn.close()
        self._wconn = self._rconn = None

    async def __aenter__(self) -> Ledger:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- writes ----------------------------------------------------------------------------

    def submit(self, outcome: PairOutcome | LedgerRow) -> bool:
        """Queue one pair for writing without blocking; ``False`` (and ``dropped`` + 1) when
        the queue is full. Call from the event loop's thread."""
        row = (
            outcome
            if isinstance(outcome, LedgerRow)
            else LedgerRow.from_outcome(outcome, self.store_text)
        )
        try:
            self._queue.put_nowait(row)
        except asyncio.QueueFull:
            self._dropped += 1
            return False
        self._submitted += 1
        return True

    async def flush(self) -> None:
        """Wait until every row submitted so far has been committed or counted as failed.

        Raises RuntimeError if the ledger is not open or its writer task has stopped.
        """
        writer = self._writer
        if writer is None:
            raise RuntimeError("ledger is not open")
        target = self._submitted
        async with self._progress:
            await self._progress.wait_for(lambda: self._processed >= target or writer.done())
        if self._processed < target:
            raise RuntimeError("ledger writer stopped") from (
                writer.exception() if not writer.cancelled() else None
            )

    async def _write_loop(self) -> None:
        try:
            await self._write_until_stopped()
        finally:  # wake flush() waiters whatever happened
            async with self._progress:
                self._progress.notify_all()

    async def _write_until_stopped(self) -> None:
        stop = False
        while not stop:
            first = await self._queue.get()
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
            if batch:
                await self._write_batch(batch)
            async with self._progress:
                self._processed += len(batch)
                self._progress.notify_all()

    async def _write_batch(self, batch: list[LedgerRow]) -> None:
        now = self._clock()
        prune = (self.max_age_seconds is not None or self.max_rows is not None) and (
            now - self._last_prune >= self.prune_interval_seconds
        )
        listener = self.listener
        grouping = listener.grouping() if listener is not None and prune else None
        try:
            pruned, commit = await asyncio.to_thread(
                self._insert_sync, batch, now if prune else None, grouping
            )
        except (sqlite3.Error, OSError, ValueError) as exc:
            kind = type(exc).__name__
            self._write_errors[kind] = self._write_errors.get(kind, 0) + len(batch)
            self._last_error = f"{kind}: {exc}"
            log_event(
                log,
                logging.ERROR,
                "ledger write failed",
                error_type=kind,
                rows=len(batch),
                error=str(exc),
            )
            return
        self._rows_written += len(batch)
        if prune:
            self._last_prune = now
        if listener is not None and listener is self.listener:
            listener.rows_written(batch, commit)
            if pruned:
                listener.rows_pruned(pruned, commit)

    def _insert_sync(
        self, batch: list[LedgerRow], prune_now: float | None, grouping: HistoryGrouping | None
    ) -> tuple[list[HistoryGroup], int]:
        values = [_row_to_values(r) for r in batch]
        groups: list[HistoryGroup] = []

        def work(conn: sqlite3.Connection) -> None:
            _write_rows(conn, _INSERT, values)
            if prune_now is not None:
                self._prune_sync(conn, prune_now, groups, grouping)

        _, commit = self._numbered_transaction(work)
        return groups, commit

    def _prune_sync(
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
                groups.extend(_history_sync(conn, grouping, where, params))
            conn.execute(_sums_upsert_sql(where, -1), params)
            removed += conn.execute(f"DELETE FROM pairs WHERE {where}", params).rowcount
        if removed:
            conn.execute("DELETE FROM pair_sums WHERE n = 0")
        return removed

    async def prune(self, now: float | None = None) -> int:
        """Apply retention now (after flushing); returns the number of rows deleted."""
        await self.flush()
        at = self._clock() if now is None else now
        listener = self.listener
        grouping = listener.grouping() if listener is not None else None
        groups: list[HistoryGroup] = []

        removed, commit = await asyncio.to_thread(
            self._numbered_transaction, lambda c: self._prune_sync(c, at, groups, grouping)
        )
        if listener is not None and groups and listener is self.listener:
            listener.rows_pruned(groups, commit)
        return removed

    def _in_transaction(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run ``work`` on the write connection in one transaction (rolled back if it raises);
        blocking: call from a worker thread. Raises ``ValueError`` when the ledger is closed."""
        return self._numbered_transaction(work)[0]

    def _numbered_transaction(
        self,
        work: Callable[[sqlite3.Connection], _T],
        *,
        changes_rows: bool = True,
        begin: str = "BEGIN",
    ) -> tuple[_T, int]:
        """:meth:`_in_transaction`, also returning the number of the write transaction
        committed (1, 2, ... since open; what a :class:`HistoryListener` is told). A
        transaction that changes no row (``changes_rows=False``: a read that may repair the
        stored sums) is not numbered: it returns the number of the last one that did."""
        conn = self._wconn
        if conn is None:
            raise ValueError("ledger is closed")
        with self._wlock:
            conn.execute(begin)
            try:
                result = work(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            if changes_rows:
                self._commits += 1
            return result, self._commits

    # -- reads -----------------------------------------------------------------------------

    def _read(self, sql: str, params: Iterable[Any]) -> list[tuple[Any, ...]]:
        conn = self._rconn
        if conn is None:
            raise ValueError("ledger is closed")
        with self._rlock:
            return list(conn.execute(sql, tuple(params)).fetchall())

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
        sql = f"SELECT id, {', '.join(_COLUMNS)} FROM pairs{where} ORDER BY time, id"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        raw = await asyncio.to_thread(self._read, sql, params)
        return [_values_to_row(v) for v in raw]

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
        return await self._tally_by(_band_sql(bands), since, until)

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
        raw = await asyncio.to_thread(self._read, sql, params)
        if fixed_point:
            return {str(r[0]): _arm_sums_of(r[1:]).totals() for r in raw}
        return {
            str(r[0]): ArmTotals(
                tau_pairs=int(r[1] or 0),
                standard_tau_sum=float(r[2] or 0.0),
                fly_tau_sum=float(r[3] or 0.0),
                speed_pairs=int(r[4] or 0),
                standard_tokens=int(r[5] or 0),
                fly_tokens=int(r[6] or 0),
                standard_seconds=float(r[7] or 0.0),
                fly_seconds=float(r[8] or 0.0),
            )
            for r in raw
        }

    async def _tally_by(
        self, group: str, since: float | None, until: float | None
    ) -> dict[str, PairTally]:
        where, params = self._where(since, until, None)
        sums = ", ".join(f"SUM(CASE WHEN {cond} THEN 1 ELSE 0 END)" for cond in _TALLY_SQL.values())
        sql = f"SELECT {group} AS grp, {sums} FROM pairs{where} GROUP BY grp"
        raw = await asyncio.to_thread(self._read, sql, params)
        names = list(_TALLY_SQL)
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
            f"SELECT standard_correct, fly_correct FROM pairs WHERE {_LABELLED_SQL} "
            "ORDER BY time, id"
        )
        raw = await asyncio.to_thread(self._read, sql, ())
        return [(bool(s), bool(f)) for s, f in raw]

    async def history(self, grouping: HistoryGrouping) -> tuple[int, list[HistoryGroup]]:
        """Every row's :class:`~specwatch.shadow.tally.HistoryCell` summed per (time bucket,
        category, load band) (see :class:`HistoryGrouping`): what the live statistics are
        rebuilt from after a restart. Returns ``(commit, groups)``: the groups hold exactly the
        write transactions numbered up to ``commit`` (writes wait while it reads), so a
        :class:`HistoryListener` attached before the call knows which later notifications to
        apply. Runs in a worker thread.

        Reads the per-day aggregates stored beside the rows (table ``pair_sums``, kept in the
        same transaction as every write and prune) for the days before the horizon's, and
        groups only the rows from that day on; O(stored groups + recent rows), not O(rows).
        When the aggregates do not describe the rows (a ledger from an older specwatch, rows
        written by another program, another layout) they are rebuilt first from every row (one
        grouped pass, logged as "ledger aggregates rebuilt" with the reason). Raises
        ``ValueError`` when the ledger is closed, ``sqlite3.Error`` from SQLite."""
        groups, commit = await asyncio.to_thread(
            lambda: self._numbered_transaction(
                lambda c: _stored_history_sync(c, grouping),
                changes_rows=False,
                begin="BEGIN IMMEDIATE",
            )
        )
        return commit, groups

    async def fold_labelled(
        self,
        step: Callable[[S, list[tuple[bool, bool]]], S],
        start: S,
        chunk_rows: int = 65_536,
    ) -> S:
        """Fold ``step`` over ``(standard_correct, fly_correct)`` of every labelled pair, oldest
        first (the order of :meth:`labelled_outcomes`), in chunks of at most ``chunk_rows``,
        streamed from one query in a worker thread (never the whole list in memory): e.g. the
        e-process rebuilt with :func:`~specwatch.shadow.stats.sequential.run_betting`."""
        sql = (
            f"SELECT standard_correct, fly_correct FROM pairs WHERE {_LABELLED_SQL} "
            "ORDER BY time, id"
        )

        def run() -> S:
            conn = self._rconn
            if conn is None:
                raise ValueError("ledger is closed")
            acc = start
            with self._rlock:
                cur = conn.execute(sql)
                while raw := cur.fetchmany(chunk_rows):
                    acc = step(acc, [(bool(a), bool(b)) for a, b in raw])
            return acc

        return await asyncio.to_thread(run)

    async def reason_counts(self) -> dict[tuple[str, str], int]:
        """``{(status, reason): rows}`` for unpaired and excluded rows (seeds the counters)."""
        raw = await asyncio.to_thread(
            self._read,
            "SELECT status, reason, COUNT(*) FROM pairs WHERE status != 'paired' "
            "GROUP BY status, reason",
            (),
        )
        return {(str(s), str(r)): int(c) for s, r, c in raw}

    async def row_count(self) -> int:
        """Rows in the ledger."""
        raw = await asyncio.to_thread(self._read, "SELECT COUNT(*) FROM pairs", ())
        return int(raw[0][0])

    # -- report queries (``specwatch report``: aggregates in SQL, one streamed read) ---------

    async def write_many(self, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
        """Insert ``rows`` (values in ``columns`` order, booleans as ``bool`` or 0/1; columns not
        named are ``NULL``) in one transaction, bypassing the write queue: bulk import of
        synthetic ledgers for benchmarks and examples. Returns the number of rows written.
        Raises ``ValueError`` for a column that is not a :class:`LedgerRow` field (or a closed
        ledger) and ``sqlite3.Error`` from SQLite; nothing is written on failure."""
        unknown = [c for c in columns if c not in _COLUMNS]
        if unknown or not columns:
            raise ValueError(f"write_many: unknown or no columns {unknown!r}")
        sql = f"INSERT INTO pairs ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
        batch = list(rows)
        await asyncio.to_thread(self._in_transaction, lambda c: _write_rows(c, sql, batch))
        self._rows_written += len(batch)
        return len(batch)

    async def report_arm_totals(self, part: Literal["tau", "speed"]) -> dict[str, ArmTotals]:
        """One half of :meth:`arm_totals` (its float sums) for the report: the same sums in
        the same row order (the category index). ``"tau"`` fills the τ fields, ``"speed"`` the
        speed fields, the rest stay 0, so ``tau[c] + speed[c]`` equals ``arm_totals()[c]``
        (categories without such pairs are absent: zero sums). Each half reads only the paired
        rows it sums (a ``WHERE`` instead of a ``CASE`` per row and column: about 30 % less CPU
        at a million rows), and the report runs the two on two connections at once. Raises
        ``sqlite3.Error`` / ``ValueError`` (closed ledger)."""
        if part == "tau":
            sql = (
                "SELECT category, COUNT(*), SUM(standard_tau), SUM(fly_tau) FROM pairs "
                f"WHERE {_ARM_TAU} GROUP BY category"
            )
            raw = await asyncio.to_thread(self._read, sql, ())
            return {
                str(c): ArmTotals(tau_pairs=int(n), standard_tau_sum=float(a), fly_tau_sum=float(b))
                for c, n, a, b in raw
            }
        sql = (
            "SELECT category, COUNT(*), SUM(standard_tokens), SUM(fly_tokens), "
            "SUM(standard_latency_seconds), SUM(fly_latency_seconds) FROM pairs "
            f"WHERE {_ARM_SPEED} GROUP BY category"
        )
        raw = await asyncio.to_thread(self._read, sql, ())
        return {
            str(c): ArmTotals(
                speed_pairs=int(n),
                standard_tokens=int(st),
                fly_tokens=int(ft),
                standard_seconds=float(ss),
                fly_seconds=float(fs),
            )
            for c, n, st, ft, ss, fs in raw
        }

    async def report_span(self) -> ReportSpan:
        """Row count and time range of the whole ledger and of its labelled pairs
        (:data:`~specwatch.shadow.tally.LABELLED`); the times come from the ``time`` index."""
        lab = _LABELLED_SQL
        sql = (
            "SELECT (SELECT COUNT(*) FROM pairs), (SELECT MIN(time) FROM pairs), "
            "(SELECT MAX(time) FROM pairs), "
            f"(SELECT time FROM pairs WHERE {lab} ORDER BY time LIMIT 1), "
            f"(SELECT time FROM pairs WHERE {lab} ORDER BY time DESC LIMIT 1)"
        )
        (r,) = await asyncio.to_thread(self._read, sql, ())
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
            f"FROM pairs WHERE {_LABELLED_SQL} GROUP BY b ORDER BY b"
        )
        raw = await asyncio.to_thread(self._read, sql, params)
        return [BinCounts(int(b), int(n), int(lo or 0), int(ga or 0)) for b, n, lo, ga in raw]

    async def report_stream(
        self,
        bands: Sequence[int],
        *,
        bin_start: float = 0.0,
        bin_width: float = 0.0,
        bins: int = 1,
    ) -> ReportStream:
        """Every row in time order (``ORDER BY time, id``) as one packed integer: its category,
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
        conn = self._rconn
        if conn is None:
            raise ValueError("ledger is closed")
        with self._rlock:
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
            whens = " ".join("WHEN ? THEN ?" for _ in _STATUSES)
            key = f"({key} * {len(_STATUSES) + 1} + (CASE status {whens} ELSE ? END))"
            params += [v for i, st in enumerate(_STATUSES) for v in (st, i)]
            params.append(len(_STATUSES))
            for col in _TRI_COLUMNS:
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
                f"SELECT group_concat(k) FROM (SELECT {key} AS k FROM pairs ORDER BY time, id)",
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

    # -- health ----------------------------------------------------------------------------

    @property
    def health(self) -> LedgerHealth:
        """Write counters for export; cheap, no I/O."""
        return LedgerHealth(
            rows_written=self._rows_written,
            write_errors=dict(self._write_errors),
            dropped=self._dropped,
            last_error=self._last_error,
            queue_depth=self._queue.qsize(),
        )


_ARM_TAU = "status = 'paired' AND standard_tau IS NOT NULL AND fly_tau IS NOT NULL"
_ARM_SPEED = (
    "status = 'paired' AND standard_tokens IS NOT NULL AND fly_tokens IS NOT NULL "
    "AND standard_latency_seconds > 0 AND fly_latency_seconds > 0"
)


def _fixed_sql(column: str) -> str:
    # the same IEEE operations as specwatch.shadow.tally.fixed
    return f"CAST({column} * {FIXED_POINT!r} + 0.5 AS INTEGER)"


#: The :class:`~specwatch.shadow.tally.ArmSums` sums, in field order (τ and seconds in fixed
#: point, so every grouping of the same rows gives the same totals).
_ARM_SQL = (
    f"SUM(CASE WHEN {_ARM_TAU} THEN 1 ELSE 0 END)",
    f"SUM(CASE WHEN {_ARM_TAU} THEN {_fixed_sql('standard_tau')} ELSE 0 END)",
    f"SUM(CASE WHEN {_ARM_TAU} THEN {_fixed_sql('fly_tau')} ELSE 0 END)",
    f"SUM(CASE WHEN {_ARM_SPEED} THEN 1 ELSE 0 END)",
    f"SUM(CASE WHEN {_ARM_SPEED} THEN standard_tokens ELSE 0 END)",
    f"SUM(CASE WHEN {_ARM_SPEED} THEN fly_tokens ELSE 0 END)",
    f"SUM(CASE WHEN {_ARM_SPEED} THEN {_fixed_sql('standard_latency_seconds')} ELSE 0 END)",
    f"SUM(CASE WHEN {_ARM_SPEED} THEN {_fixed_sql('fly_latency_seconds')} ELSE 0 END)",
)


#: The :class:`ArmTotals` sums as plain float sums, in field order.
_ARM_FLOAT_SQL = (
    f"SUM(CASE WHEN {_ARM_TAU} THEN 1 ELSE 0 END)",
    f"SUM(CASE WHEN {_ARM_TAU} THEN standard_tau ELSE 0 END)",
    f"SUM(CASE WHEN {_ARM_TAU} THEN fly_tau ELSE 0 END)",
    f"SUM(CASE WHEN {_ARM_SPEED} THEN 1 ELSE 0 END)",
    f"SUM(CASE WHEN {_ARM_SPEED} THEN standard_tokens ELSE 0 END)",
    f"SUM(CASE WHEN {_ARM_SPEED} THEN fly_tokens ELSE 0 END)",
    f"SUM(CASE WHEN {_ARM_SPEED} THEN standard_latency_seconds ELSE 0 END)",
    f"SUM(CASE WHEN {_ARM_SPEED} THEN fly_latency_seconds ELSE 0 END)",
)


def _arm_sums_of(r: Sequence[Any]) -> ArmSums:
    return ArmSums(*(int(v or 0) for v in r))


def _band_sql(bands: Sequence[int]) -> str:
    labels = load_band_labels(bands)
    cases = " ".join(
        f"WHEN running_at_replay >= {float(lo)!r} THEN '{label}'"
        for lo, label in reversed(list(zip(bands, labels, strict=True)))
    )
    return f"CASE {cases} ELSE '{UNKNOWN_BAND}' END"


_TRI_BASE = len(_STATUSES) + 1
_FLAG_BASE = _TRI_BASE * 3 ** len(_TRI_COLUMNS)


def _pattern_sql() -> str:
    """One integer per distinct combination of what the tally rules and the arm-sum conditions
    read: the status, each rule column as 0 / 1 / 2 (unknown), and whether the τ and speed sums
    apply. Grouping by it instead of by each column keeps the grouped pass to four keys."""
    status = " ".join(f"WHEN '{st}' THEN {i}" for i, st in enumerate(_STATUSES))
    parts = [f"(CASE status {status} ELSE {len(_STATUSES)} END)"]
    parts += [f"{_TRI_BASE * 3**k} * COALESCE({c}, 2)" for k, c in enumerate(_TRI_COLUMNS)]
    parts.append(f"{_FLAG_BASE} * COALESCE(({_ARM_TAU}), 0)")
    parts.append(f"{_FLAG_BASE * 2} * COALESCE(({_ARM_SPEED}), 0)")
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
    for k, c in enumerate(_TRI_COLUMNS):
        v = (code // (_TRI_BASE * 3**k)) % 3
        values[c] = None if v == 2 else bool(v)
    flags = code // _FLAG_BASE
    status = _STATUSES[status_i] if status_i < len(_STATUSES) else "other"
    row = _Pattern(time=0.0, category="", status=status, **values)
    return row_tally(row), bool(flags & 1), bool(flags & 2)


_PATTERN_SQL = _pattern_sql()


#: The fixed-point sums every grouped pass reads, in :class:`ArmSums` order after the counts.
_SUM_EXPRS = (
    f"SUM({_fixed_sql('standard_tau')})",
    f"SUM({_fixed_sql('fly_tau')})",
    "SUM(standard_tokens)",
    "SUM(fly_tokens)",
    f"SUM({_fixed_sql('standard_latency_seconds')})",
    f"SUM({_fixed_sql('fly_latency_seconds')})",
)
_SUMS_SQL = ", ".join(_SUM_EXPRS)

#: Width of a stored aggregate's time slot (``pair_sums.day``: ``CAST(time / 86400 AS
#: INTEGER)``, UTC days).
SUMS_DAY_SECONDS = 86400.0
_DAY_SQL = f"CAST(time / {SUMS_DAY_SECONDS!r} AS INTEGER)"
#: What ``pair_sums`` is keyed and summed by; a ledger whose stored layout differs (written by
#: a specwatch with other tally rules or another fixed point) has its aggregates rebuilt.
_SUMS_LAYOUT = f"v1|{SUMS_DAY_SECONDS!r}|{FIXED_POINT!r}|{_PATTERN_SQL}"
_SUM_COLUMNS = ("n", "s_tau", "f_tau", "s_tok", "f_tok", "s_sec", "f_sec")
_SUMS_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS pair_sums (day INTEGER NOT NULL, category TEXT NOT NULL, "
    "running_at_replay REAL NOT NULL, code INTEGER NOT NULL, "
    + ", ".join(f"{c} INTEGER NOT NULL" for c in _SUM_COLUMNS)
    + ", PRIMARY KEY (day, category, running_at_replay, code)) WITHOUT ROWID",
    "CREATE TABLE IF NOT EXISTS pair_sums_meta (key TEXT PRIMARY KEY, value) WITHOUT ROWID",
)
#: ``pair_sums`` keys never hold NULL (NULLs never conflict in an UPSERT): a row without a
#: running count is stored at -inf (every band condition false: band "unknown", as NULL), a
#: row without a category under ``'None'`` (the name a NULL category is reported under).
_SUMS_KEY_SQL = (
    f"{_DAY_SQL} AS d, IFNULL(category, 'None') AS c, IFNULL(running_at_replay, -9e999) AS r, "
    f"{_PATTERN_SQL} AS k"
)


def _sums_upsert_sql(where: str, sign: int) -> str:
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


_SUMS_ADD_NEW = _sums_upsert_sql("id > ?", 1)
_SUMS_REBUILD = _sums_upsert_sql("1", 1)


def _sums_mark(conn: sqlite3.Connection, *, layout: bool = False) -> None:
    """Record in ``pair_sums_meta`` the newest row id ``pair_sums`` covers (and, after a full
    rebuild, its layout: only a rebuild vouches for the rows before)."""
    last = conn.execute("SELECT IFNULL(MAX(id), 0) FROM pairs").fetchone()[0]
    marks: list[tuple[str, Any]] = [("last_id", last)]
    if layout:
        marks.append(("layout", _SUMS_LAYOUT))
    conn.executemany("INSERT OR REPLACE INTO pair_sums_meta (key, value) VALUES (?, ?)", marks)


def _sums_stale(conn: sqlite3.Connection) -> str | None:
    """Why ``pair_sums`` does not describe ``pairs`` (``None``: it does): ``layout`` (missing
    or another layout), ``rows`` (its counts do not add up to the rows), ``last_id`` (rows
    written by something that did not update it)."""
    meta = dict(conn.execute("SELECT key, value FROM pair_sums_meta").fetchall())
    if meta.get("layout") != _SUMS_LAYOUT:
        return "layout"
    (stored,) = conn.execute("SELECT IFNULL(SUM(n), 0) FROM pair_sums").fetchone()
    count, last = conn.execute("SELECT COUNT(*), IFNULL(MAX(id), 0) FROM pairs").fetchone()
    if int(stored) != int(count):
        return "rows"
    if count and meta.get("last_id") != last:
        return "last_id"
    return None


def _sums_rebuild(conn: sqlite3.Connection) -> None:
    """Recompute ``pair_sums`` from every row (inside the caller's transaction)."""
    conn.execute("DELETE FROM pair_sums")
    conn.execute(_SUMS_REBUILD)
    _sums_mark(conn, layout=True)


def _write_rows(conn: sqlite3.Connection, sql: str, values: Sequence[Sequence[Any]]) -> None:
    """Insert ``values`` with ``sql`` and add their groups to ``pair_sums`` (inside the
    caller's transaction, so the aggregates never miss a committed row)."""
    (before,) = conn.execute("SELECT IFNULL(MAX(id), 0) FROM pairs").fetchone()
    conn.executemany(sql, values)
    conn.execute(_SUMS_ADD_NEW, (before,))
    _sums_mark(conn)


def _add_cells(
    cells: dict[tuple[int | None, str, str], HistoryCell], rows: Iterable[Sequence[Any]]
) -> None:
    """Add grouped rows ``(bucket, category, band, pattern code, count, six fixed-point
    sums)`` into ``cells`` per (bucket, category, band)."""
    for b, cat, band, code, n, s_tau, f_tau, s_tok, f_tok, s_sec, f_sec in rows:
        n = int(n)
        if not n:
            continue
        one, tau, speed = _decode(int(code))
        tally = one if n == 1 else PairTally(*(n * v for v in _tally_values(one)))
        arms = ArmSums(
            tau_pairs=n if tau else 0,
            standard_tau=int(s_tau) if tau else 0,
            fly_tau=int(f_tau) if tau else 0,
            speed_pairs=n if speed else 0,
            standard_tokens=int(s_tok) if speed else 0,
            fly_tokens=int(f_tok) if speed else 0,
            standard_seconds=int(s_sec) if speed else 0,
            fly_seconds=int(f_sec) if speed else 0,
        )
        key = (None if b is None else int(b), str(cat), str(band))
        cell = HistoryCell(tally, arms, n)
        old = cells.get(key)
        cells[key] = cell if old is None else old + cell


def _history_sync(
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
        f"{_band_sql(grouping.bands)} AS band, {_PATTERN_SQL} AS code, COUNT(*), {_SUMS_SQL} "
        f"FROM pairs{'' if where is None else ' WHERE ' + where} GROUP BY b, c, band, code"
    )
    cells = {} if cells is None else cells
    _add_cells(cells, conn.execute(sql, params))
    return [HistoryGroup(b, cat, band, cell) for (b, cat, band), cell in cells.items()]


def _stored_history_sync(conn: sqlite3.Connection, grouping: HistoryGrouping) -> list[HistoryGroup]:
    """:meth:`Ledger.history` from ``pair_sums`` (made right first if stale): the whole days
    before the horizon's day from the stored aggregates, pooled, and the rows from that day on
    grouped from ``pairs`` (through the ``time`` index). Inside the caller's transaction."""
    why = _sums_stale(conn)
    if why is not None:
        _sums_rebuild(conn)
        log_event(log, logging.INFO, "ledger aggregates rebuilt", reason=why)
    cells: dict[tuple[int | None, str, str], HistoryCell] = {}
    stored = (
        f"SELECT NULL, category, {_band_sql(grouping.bands)} AS band, code, "
        f"{', '.join(f'SUM({c})' for c in _SUM_COLUMNS)} FROM pair_sums"
    )
    if grouping.horizon is None:
        _add_cells(cells, conn.execute(f"{stored} GROUP BY category, band, code"))
        return [HistoryGroup(b, cat, band, cell) for (b, cat, band), cell in cells.items()]
    day = int(grouping.horizon // SUMS_DAY_SECONDS)
    _add_cells(cells, conn.execute(f"{stored} WHERE day < ? GROUP BY category, band, code", (day,)))
    # the time bound (a day's slack below) uses the index; the day test is the stored one's
    where = f"time >= ? AND {_DAY_SQL} >= ?"
    return _history_sync(conn, grouping, where, (day * SUMS_DAY_SECONDS - 1.0, day), cells)


_tally_values = operator.attrgetter(*(f.name for f in fields(PairTally)))


class LedgerFileError(Exception):
    """A file that is not a readable specwatch ledger; the message is one line naming the file."""


#: Columns every specwatch ledger has had since its first schema: a ``pairs`` table without them
#: is some other program's table (newer columns are added on open, see ``_add_missing_columns``).
_CORE_COLUMNS: tuple[str, ...] = ("time", "category", "status")


def check_ledger_file(path: Path) -> None:
    """Fail unless ``path`` is an SQLite file holding a specwatch ``pairs`` table (one with the
    ledger's core columns ``time``, ``category``, ``status``), opened read-only, blocking: call
    from a thread. Raises :class:`LedgerFileError` with one line naming ``path``: a directory,
    no such file, not a readable SQLite database, or not a specwatch ledger (no ``pairs``
    table, or one without the core columns, which it names)."""
    if path.is_dir():
        raise LedgerFileError(f"ledger {path}: is a directory, not a ledger file")
    if not path.is_file():
        raise LedgerFileError(f"ledger {path}: no such file")
    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            found = conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'pairs'"
            ).fetchone()
            have = {str(r[1]) for r in conn.execute("PRAGMA table_info(pairs)")}
        finally:
            conn.close()
    except sqlite3.Error as exc:
        raise LedgerFileError(f"ledger {path}: not a readable SQLite database ({exc})") from None
    if found is None:
        raise LedgerFileError(f"ledger {path}: no 'pairs' table (not a specwatch ledger)")
    missing = [c for c in _CORE_COLUMNS if c not in have]
    if missing:
        raise LedgerFileError(
            f"ledger {path}: its 'pairs' table has no {', '.join(missing)} column "
            "(not a specwatch ledger)"
        )


def check_openable(path: Path | str) -> None:
    """Open (or create) ``path`` as SQLite and read its schema version (blocking, start-up only).

    Raises ``sqlite3.Error`` when the file cannot be opened or is not a database."""
    conn = sqlite3.connect(path, timeout=5.0)
    try:
        conn.execute("PRAGMA schema_version").fetchone()
    finally:
        conn.close()
