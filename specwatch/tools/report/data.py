"""What the report shows, computed from the pair ledger and an optional acceptance source.

Three SQLite scans, run at once on three connections, and no row objects: one ordered read of
every row as one packed integer (:meth:`Ledger.report_stream`: category, status, running-request
band, the tally rules' columns and the row's time bin, joined by SQLite and parsed by numpy),
from which come the tallies per category and per band, the labelled pairs per time bin and the
order-dependent e-value inputs (category and ``d = standard_correct - fly_correct`` of each
labelled pair); the τ sums and the speed sums (:meth:`Ledger.report_arm_totals`, the float sums
of ``Ledger.arm_totals`` in halves); and the unpaired/excluded reasons. So the cost of a report
grows with the ledger only through SQLite scans and O(n) array passes. Statistics come from
:mod:`specwatch.shadow.summary` (``build_shadow_stats``), :mod:`specwatch.shadow.stats.paired`
(``net_loss_ci``), :mod:`specwatch.shadow.stats.eprocess` (``net_loss_path``, the no-net-loss
e-process the sidecar folds) and :mod:`specwatch.shadow.stats.sequential`
(``betting_log_wealth``, the one betting driver). The
e-value paths are downsampled to at most :data:`MAX_POINTS` points for the plot; the final
values and the first alarms are exact.
"""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from specwatch.core.config import DEFAULT_LOAD_BANDS, DEFAULT_MAX_CATEGORIES, OVERALL
from specwatch.core.crossover import (
    CANDIDATE_NAME,
    CROSSOVER_STATUSES,
    REFERENCE_NAMES,
    limit_headline,
    limit_sentence,
)
from specwatch.shadow.decision import decision_table, stored_replies
from specwatch.shadow.ledger.files import LedgerFileError, check_ledger_file
from specwatch.shadow.ledger.ledger import Ledger
from specwatch.shadow.ledger.reports import BinCounts, LabelledStream, ReportSpan, ReportStream
from specwatch.shadow.lossless import LosslessCheck, lossless_by_load, lossless_check
from specwatch.shadow.published import ShadowStats
from specwatch.shadow.stats.confseq import declaration_path
from specwatch.shadow.stats.eprocess import count_log_e_path, net_loss_log_e_values
from specwatch.shadow.stats.paired import PairedCounts, net_loss_ci, net_loss_ratio
from specwatch.shadow.stats.sequential import betting_log_wealth, first_alarm
from specwatch.shadow.summary import (
    Carried,
    LedgerView,
    Levels,
    OrderedState,
    build_shadow_stats,
)
from specwatch.shadow.summary import load_bands as load_bands_of
from specwatch.shadow.tally import ArmTotals, PairTally, load_band_labels
from specwatch.tools.report import MAX_POINTS, REPORT_WINDOW

#: The running-request bands and category bound the report uses: the live defaults
#: (:data:`specwatch.core.config.DEFAULT_LOAD_BANDS`, ``DEFAULT_MAX_CATEGORIES``).

# REPORT_WINDOW and MAX_POINTS live in the package (the CLI's parser reads them without this
# module's numpy and statistics imports).


class ReportInputError(ValueError):
    """The ledger or the acceptance source cannot be read; ``str()`` is one line."""


@dataclass(frozen=True, slots=True)
class FlipSeries:
    """Labelled pairs binned by time (bin ``i`` ends at ``times[i]``, unix seconds).

    ``lost``/``gained``/``n`` per bin; ``cum_*`` cumulative up to the bin end; ``net_loss`` the
    cumulative net loss ratio ``(lost - gained) / n`` and ``[ci_lower, ci_upper]`` its Tango score
    interval at ``ci_level`` (``specwatch.shadow.stats.paired.net_loss_ci``); NaN where n = 0.
    """

    times: tuple[float, ...]
    lost: tuple[int, ...]
    gained: tuple[int, ...]
    n: tuple[int, ...]
    cum_lost: tuple[int, ...]
    cum_gained: tuple[int, ...]
    cum_n: tuple[int, ...]
    net_loss: tuple[float, ...]
    ci_lower: tuple[float, ...]
    ci_upper: tuple[float, ...]
    ci_level: float


@dataclass(frozen=True, slots=True)
class EValuePath:
    """The e-processes over the labelled pairs in ledger (time) order, downsampled.

    ``pair[i]`` is the 1-based number of the labelled pair after which ``log_e_no_net_loss[i]``
    and ``log_e_margin[i]`` hold (at most :data:`MAX_POINTS` points; always the last pair and the
    first alarms). ``log_e_no_net_loss``: the no-net-loss e-process
    (:mod:`~specwatch.shadow.stats.eprocess`; H0: FLy does not lose more than it gains), the
    sidecar's own statistic on the same ordered pairs; ``log_e_margin``: the betting
    e-process (H0: net loss <= margin). Natural logs; the alarm threshold is ``ln(1/alpha)``.
    ``pairs``: labelled pairs in all; ``first_alarm_*``: the exact 1-based pair at which each
    path first reached 1/alpha, ``None`` if never.
    """

    pairs: int
    pair: tuple[int, ...]
    log_e_no_net_loss: tuple[float, ...]
    log_e_margin: tuple[float, ...]
    first_alarm_no_net_loss: int | None
    first_alarm_margin: int | None
    alpha: float
    margin: float

    @property
    def threshold(self) -> float:
        """``1/alpha``, the Ville alarm threshold on the e-value."""
        return 1.0 / self.alpha


@dataclass(frozen=True, slots=True)
class Acceptance:
    """Per-position acceptance rate p_i per arm (label: the target name, or ``role (name)``
    when the name is not its role), one window.

    ``arms[label][i]`` is p_i (``None`` when unknown); ``source`` names where it came from.
    ``speculation_limit``: where speculation stops paying, the sidecar's sentence (from a
    snapshot verbatim; from ``/metrics`` its first part per comparison, rebuilt from the
    ``specwatch_speculation_limit_*`` gauges by :func:`~specwatch.core.crossover.limit_headline`);
    ``None`` when the source has none.
    """

    source: str
    window: str
    arms: Mapping[str, tuple[float | None, ...]]
    speculation_limit: str | None = None


@dataclass(frozen=True, slots=True)
class LedgerDigest:
    """What :func:`read_ledger` reads from a ledger, all but ``stream`` aggregated in SQL.

    ``span``: row count and time ranges; ``tallies``: :class:`PairTally` per category (from
    :meth:`Ledger.report_stream`, the same counts as :meth:`Ledger.tally`);
    ``reasons``: ``{(status, reason): rows}`` of unpaired and excluded rows; ``totals``: τ and
    speed sums per category; ``load_tallies``: :class:`PairTally` per running-request band;
    ``bins``: labelled pairs per time bin (non-empty bins, the counts of
    :meth:`Ledger.labelled_bins`, from the streamed read) of ``bin_count`` bins of
    ``bin_width`` seconds from ``span.labelled_first_time``; ``stream``: category and outcome of
    every labelled pair in ledger (write) order; ``tau_coverage``: ``{(arm, finish_reason):
    (paired rows, rows with a per-request τ)}``; ``replies``: the stored per-request
    speculative-decoding counts per ``(arm, category)`` (``Ledger.reply_totals``, for the
    acceptance gain).
    """

    span: ReportSpan
    tallies: Mapping[str, PairTally]
    reasons: Mapping[tuple[str, str], int]
    totals: Mapping[str, ArmTotals]
    load_tallies: Mapping[str, PairTally]
    bins: Sequence[BinCounts]
    bin_count: int
    bin_width: float
    stream: LabelledStream
    tau_coverage: Mapping[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    replies: Mapping[tuple[str, str], tuple[int, int, int]] = field(default_factory=dict)


def split_tallies(
    cells: Mapping[tuple[str, str], PairTally],
) -> tuple[dict[str, PairTally], dict[str, PairTally]]:
    """``{(category, band): tally}`` → (tally per category, tally per band)."""
    by_cat: dict[str, PairTally] = {}
    by_band: dict[str, PairTally] = {}
    for (cat, band), t in cells.items():
        by_cat[cat] = by_cat.get(cat, PairTally()) + t
        by_band[band] = by_band.get(band, PairTally()) + t
    return by_cat, by_band


@dataclass(frozen=True, slots=True)
class ReportData:
    """Everything :func:`specwatch.tools.report.render.render_report` draws.

    ``first_alarm[category]`` (and :data:`OVERALL`): the 1-based number of the labelled pair of
    that category at which the no-net-loss e-value first reached 1/alpha, ``None`` if it never
    did. An e-process alarm stays valid once raised (Ville's inequality holds at any stopping
    time), so the report uses "ever crossed", not only the current value.
    ``first_labelled_time``: unix time of the first labelled pair (the plots' time origin).
    ``arm_totals``: the τ and speed sums of every category together (the verdict's τ and speed
    parts).
    """

    ledger: str
    rows: int
    first_time: float | None
    last_time: float | None
    first_labelled_time: float | None
    stats: ShadowStats
    flips: FlipSeries
    evalue: EValuePath
    acceptance: Acceptance | None
    reasons: Mapping[tuple[str, str], int]
    first_alarm: Mapping[str, int | None]
    tau_coverage: Mapping[tuple[str, str], tuple[int, int]] = field(default_factory=dict)
    arm_totals: ArmTotals = field(default_factory=ArmTotals)
    lossless: LosslessCheck | None = None


def _ints(a: npt.NDArray[np.int64]) -> tuple[int, ...]:
    return tuple(int(v) for v in a)


def bin_width(span: ReportSpan, bins: int) -> tuple[int, float]:
    """``(bin count, bin width in seconds)`` for ``bins`` equal time bins over the labelled
    pairs of ``span``: one bin of width 0 when they all share one time (or there are none).
    Raises ValueError unless ``1 <= bins <= MAX_POINTS``."""
    if not 1 <= bins <= MAX_POINTS:
        raise ValueError(f"bins must be in [1, {MAX_POINTS}]")
    t0, t1 = span.labelled_first_time, span.labelled_last_time
    if t0 is None or t1 is None or t1 <= t0:
        return 1, 0.0
    return bins, (t1 - t0) / bins


def flip_series(
    span: ReportSpan,
    counts: Sequence[BinCounts],
    bin_count: int,
    level: float = 0.95,
) -> FlipSeries:
    """The flip series from per-bin counts (:meth:`Ledger.labelled_bins`, or
    :meth:`ReportStream.labelled_bins`, over the ``bin_count``
    bins of :func:`bin_width`): bins without pairs count 0, bin ``i`` ends at
    ``linspace(first, last, bin_count + 1)[i + 1]`` of the labelled pairs' time range. No
    labelled pairs give empty tuples."""
    t0, t1 = span.labelled_first_time, span.labelled_last_time
    if t0 is None or t1 is None or not counts:
        return FlipSeries((), (), (), (), (), (), (), (), (), (), level)
    lost = np.zeros(bin_count, dtype=np.int64)
    gained = np.zeros(bin_count, dtype=np.int64)
    n = np.zeros(bin_count, dtype=np.int64)
    for c in counts:
        lost[c.bin], gained[c.bin], n[c.bin] = c.lost, c.gained, c.n
    cl, cg, cn = np.cumsum(lost), np.cumsum(gained), np.cumsum(n)
    net: list[float] = []
    lo: list[float] = []
    hi: list[float] = []
    for a, b, m in zip(cl, cg, cn, strict=True):
        pc = PairedCounts(int(m - a - b), int(a), int(b), 0)
        ci = net_loss_ci(pc, level=level)
        net.append(net_loss_ratio(pc))
        lo.append(ci.lower)
        hi.append(ci.upper)
    return FlipSeries(
        times=tuple(float(v) for v in np.linspace(t0, t1, bin_count + 1)[1:]),
        lost=_ints(lost),
        gained=_ints(gained),
        n=_ints(n),
        cum_lost=_ints(cl),
        cum_gained=_ints(cg),
        cum_n=_ints(cn),
        net_loss=tuple(net),
        ci_lower=tuple(lo),
        ci_upper=tuple(hi),
        ci_level=level,
    )


def downsample_index(n: int, keep: Sequence[int | None], points: int = MAX_POINTS) -> list[int]:
    """At most ``points`` 0-based indices into a path of ``n`` values, evenly spread, always
    with the first and the last and the 1-based positions in ``keep`` (``None`` ignored)."""
    if n <= 0:
        return []
    extra = sorted({k - 1 for k in keep if k is not None and 1 <= k <= n})
    even = np.unique(np.linspace(0, n - 1, max(points - len(extra), 2)).round().astype(np.int64))
    return sorted({*(int(v) for v in even), *extra, n - 1})


def evalue_path(
    d: npt.NDArray[np.int8],
    alpha: float,
    margin: float,
    points: int = MAX_POINTS,
) -> EValuePath:
    """Both e-processes after every labelled pair ``d`` in ledger (write) order (see
    :class:`EValuePath`), downsampled to ``points``; the no-net-loss one is
    :func:`~specwatch.shadow.stats.eprocess.net_loss_log_e_values`, the margin one
    :func:`betting_log_wealth`."""
    bb = net_loss_log_e_values(d) if d.size else np.zeros(0)
    bet, _ = betting_log_wealth(d, margin)
    first_bb, first_bet = first_alarm(bb, alpha), first_alarm(bet, alpha)
    idx = downsample_index(int(d.size), (first_bb, first_bet), points)
    return EValuePath(
        pairs=int(d.size),
        pair=tuple(i + 1 for i in idx),
        log_e_no_net_loss=tuple(float(bb[i]) for i in idx),
        log_e_margin=tuple(float(bet[i]) for i in idx),
        first_alarm_no_net_loss=first_bb,
        first_alarm_margin=first_bet,
        alpha=alpha,
        margin=margin,
    )


def _check_ledger_file(path: Path) -> None:
    """Fail with one line unless ``path`` is an SQLite file holding a ``pairs`` table."""
    try:
        check_ledger_file(path)
    except LedgerFileError as exc:
        raise ReportInputError(str(exc)) from None


async def read_ledger(
    path: Path, bins: int = 40, load_bands: Sequence[int] = DEFAULT_LOAD_BANDS
) -> LedgerDigest:
    """Read everything the report needs from the ledger at ``path`` (see :class:`LedgerDigest`),
    with ``bins`` time bins for the flips plot (1 to :data:`MAX_POINTS`).

    Raises :class:`ReportInputError` (one line) when the file is missing or not a ledger.
    """
    await asyncio.to_thread(_check_ledger_file, path)
    # Three connections, so the three scans run at once (SQLite releases the GIL while it
    # steps) and a second core shortens the wall time: the streamed read (tallies, time bins,
    # e-value inputs), the τ sums, and the speed sums with the small queries.
    ledgers = [Ledger(path) for _ in range(3)]
    opened: list[Ledger] = []
    try:
        try:
            for ledger in ledgers:
                opened.append(ledger)
                await ledger.open_read_only()
            first, second, third = ledgers

            async def streamed() -> tuple[ReportSpan, int, float, ReportStream]:
                span = await first.report_span()
                count, width = bin_width(span, bins)
                stream = await first.report_stream(
                    load_bands,
                    bin_start=span.labelled_first_time or 0.0,
                    bin_width=width,
                    bins=count,
                )
                return span, count, width, stream

            async def speed() -> tuple[
                dict[str, ArmTotals],
                dict[tuple[str, str], int],
                dict[tuple[str, str], tuple[int, int, int]],
            ]:
                return (
                    await third.report_arm_totals("speed"),
                    await third.reason_counts(),
                    await third.reply_totals(),
                )

            async def tau_part() -> tuple[
                dict[str, ArmTotals], dict[tuple[str, str], tuple[int, int]]
            ]:
                return await second.report_arm_totals("tau"), await second.tau_coverage()

            (
                (span, count, width, stream),
                (tau, coverage),
                (speeds, reasons, replies),
            ) = await asyncio.gather(streamed(), tau_part(), speed())
            tallies, load_tallies = split_tallies(stream.tallies())
            totals = {
                cat: tau.get(cat, ArmTotals()) + speeds.get(cat, ArmTotals())
                for cat in sorted({*tau, *speeds})
            }
            digest = LedgerDigest(
                span=span,
                tallies=tallies,
                reasons=reasons,
                totals=totals,
                load_tallies=load_tallies,
                bins=stream.labelled_bins(),
                bin_count=count,
                bin_width=width,
                stream=stream.labelled(),
                tau_coverage=coverage,
                replies=replies,
            )
        finally:
            for ledger in opened:
                await ledger.close()
    except (sqlite3.Error, OSError, ValueError, TypeError) as exc:
        raise ReportInputError(f"ledger {path}: cannot read ({exc})") from None
    return digest


def build_report(
    ledger: str,
    digest: LedgerDigest,
    *,
    levels: Levels = Levels(),
    acceptance: Acceptance | None = None,
    now: float = 0.0,
    load_bands: Sequence[int] = DEFAULT_LOAD_BANDS,
    max_categories: int = DEFAULT_MAX_CATEGORIES,
    points: int = MAX_POINTS,
) -> ReportData:
    """Assemble :class:`ReportData` from a :class:`LedgerDigest` (pure): the per-category
    statistics (``build_shadow_stats``), the decision table
    (:func:`specwatch.shadow.decision.decision_table`), flips by running-request band, the flip
    series, the e-value paths (overall, and per category for the first alarms) and the
    lossless check (:func:`specwatch.shadow.lossless.lossless_check`, by load band too), each
    at ``levels``' alpha, margin and planned net loss."""
    alpha, margin = levels.alpha, levels.margin
    stream = digest.stream
    evalue = evalue_path(stream.d, alpha, margin, points)
    log_e = evalue.log_e_no_net_loss[-1] if evalue.pairs else None
    first_alarms: dict[str, int | None] = {OVERALL: evalue.first_alarm_no_net_loss}
    # each category's pairs in ledger (write) order: one stable sort, then contiguous slices
    order = np.argsort(stream.category, kind="stable")
    by_cat = stream.d[order]
    edges = np.searchsorted(stream.category[order], np.arange(len(stream.categories) + 1))
    for code, cat in enumerate(stream.categories):
        d = by_cat[edges[code] : edges[code + 1]]
        if d.size:
            # a category's e-value is the count form (the live alarm's), pair by pair
            first_alarms[cat] = first_alarm(count_log_e_path(d), alpha)
    for cat in digest.tallies:  # categories without labelled pairs never alarm
        first_alarms.setdefault(cat, None)
    stats = build_shadow_stats(
        {REPORT_WINDOW: dict(digest.tallies)},
        now=now,
        levels=levels,
        ordered=OrderedState(
            net_loss_log_e_value=log_e,
            betting_log_e_value=evalue.log_e_margin[-1] if evalue.pairs else None,
            within_margin_declared_at=declaration_path(stream.d, margin, alpha),
        ),
        ledger=LedgerView(rows=digest.span.rows),
        carried=Carried(
            decisions=decision_table(
                digest.tallies,
                digest.totals,
                levels=levels,
                max_categories=max_categories,
                replies=stored_replies(digest.replies),
                overall_log_e_value=log_e,
            ),
            by_load=load_bands_of(digest.load_tallies, load_band_labels(load_bands)),
        ),
    )
    overall = stats.windows[REPORT_WINDOW].get(OVERALL)
    lossless = lossless_check(
        sum(digest.tallies.values(), PairTally()),
        overall.lossless_e_value if overall is not None else 1.0,
        lossless_by_load(digest.load_tallies, load_band_labels(load_bands)),
        alpha=alpha,
    )
    return ReportData(
        ledger=ledger,
        rows=digest.span.rows,
        first_time=digest.span.first_time,
        last_time=digest.span.last_time,
        first_labelled_time=digest.span.labelled_first_time,
        stats=stats,
        flips=flip_series(digest.span, digest.bins, digest.bin_count, level=1.0 - alpha),
        evalue=evalue,
        acceptance=acceptance,
        reasons=dict(digest.reasons),
        first_alarm=first_alarms,
        tau_coverage=dict(digest.tau_coverage),
        arm_totals=sum(digest.totals.values(), ArmTotals()),
        lossless=lossless,
    )


# -- per-position acceptance per arm ------------------------------------------------------------


def _num(v: Any) -> float | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


_ROLE_ORDER = {"standard": 0, "fly": 1, "baseline": 2}


def _arm_labels(
    found: Mapping[tuple[str, str], tuple[float | None, ...]],
) -> dict[str, tuple[float | None, ...]]:
    """``{(role, target): values}`` → ``{label: values}``, standard first; the label is the
    target name, with the role added when it differs (``fly (fly-b)``)."""
    out: dict[str, tuple[float | None, ...]] = {}
    for (role, name), values in sorted(
        found.items(), key=lambda kv: (_ROLE_ORDER.get(kv[0][0], 9), kv[0][1])
    ):
        out[name if name == role else f"{role} ({name})"] = values
    return out


def acceptance_from_snapshot(doc: Mapping[str, Any], window: str, source: str) -> Acceptance:
    """Per-position acceptance per target from an ``/api/v1/snapshot`` document (server view of
    the window). Raises :class:`ReportInputError` when the document has no ``targets``."""
    targets = doc.get("targets")
    if not isinstance(targets, Mapping):
        raise ReportInputError(f"{source}: not a specwatch snapshot (no 'targets')")
    found: dict[tuple[str, str], tuple[float | None, ...]] = {}
    for name, t in targets.items():
        if not isinstance(t, Mapping):
            continue
        server = ((t.get("windows") or {}).get(window) or {}).get("server") or {}
        values = server.get("per_position_acceptance_rate") or []
        if values:
            found[(str(t.get("role", "?")), str(name))] = tuple(_num(v) for v in values)
    limit = doc.get("speculation_limit")
    text = limit.get("text") if isinstance(limit, Mapping) else None
    return Acceptance(
        source=source,
        window=window,
        arms=_arm_labels(found),
        speculation_limit=text if isinstance(text, str) and text else None,
    )


#: The ``specwatch_speculation_limit_*`` gauges a ``/metrics`` text gives the sentence from.
_LIMIT_GAUGES = {
    "specwatch_speculation_limit_running": "running",
    "specwatch_speculation_limit_running_lower": "lower",
    "specwatch_speculation_limit_running_upper": "upper",
    "specwatch_speculation_limit_highest_running": "highest",
}


def _limit_sentence(found: Mapping[str, Mapping[str, Any]]) -> str | None:
    """The speculation-limit sentence (:func:`~specwatch.core.crossover.limit_sentence`) from
    the gauges read per ``reference`` label: each comparison's headline; ``None`` without any."""
    heads = {
        reference: limit_headline(
            f"{CANDIDATE_NAME} vs {name}",
            g["state"],
            g.get("running"),
            g.get("lower"),
            g.get("upper"),
            g.get("highest"),
        )
        for reference, name in REFERENCE_NAMES.items()
        if (g := found.get(reference)) is not None and g.get("state") in CROSSOVER_STATUSES
    }
    return limit_sentence(heads)


def acceptance_from_exposition(text: str, window: str, source: str) -> Acceptance:
    """Per-position acceptance per target from specwatch's ``/metrics`` text
    (``specwatch_per_position_acceptance_ratio`` server-wide series, i.e. without ``engine``).
    Raises :class:`ReportInputError` when the text does not parse."""
    from prometheus_client.parser import text_string_to_metric_families  # only with a source

    found: dict[tuple[str, str], dict[int, float]] = {}
    limits: dict[str, dict[str, Any]] = {}
    try:
        for fam in text_string_to_metric_families(text):
            if fam.name in _LIMIT_GAUGES or fam.name == "specwatch_speculation_limit_state":
                for s in fam.samples:
                    one = limits.setdefault(s.labels.get("reference", ""), {})
                    if fam.name in _LIMIT_GAUGES:
                        one[_LIMIT_GAUGES[fam.name]] = _num(s.value)
                    elif s.value == 1:
                        one["state"] = s.labels.get("state")
                continue
            if fam.name != "specwatch_per_position_acceptance_ratio":
                continue
            for s in fam.samples:
                lb = s.labels
                if lb.get("window") != window or "engine" in lb:
                    continue
                key = (lb.get("role", "?"), lb.get("target", "?"))
                found.setdefault(key, {})[int(lb["position"])] = float(s.value)
    except (ValueError, KeyError, IndexError) as exc:
        raise ReportInputError(f"{source}: not Prometheus text ({exc})") from None
    arms = {key: tuple(_num(pos.get(i)) for i in range(max(pos) + 1)) for key, pos in found.items()}
    return Acceptance(
        source=source,
        window=window,
        arms=_arm_labels(arms),
        speculation_limit=_limit_sentence(limits),
    )


def parse_acceptance(text: str, window: str, source: str) -> Acceptance:
    """A snapshot JSON document or Prometheus exposition text, whichever ``text`` is."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            doc = json.loads(stripped)
        except json.JSONDecodeError as exc:
            raise ReportInputError(f"{source}: invalid JSON ({exc.msg})") from None
        if not isinstance(doc, dict):
            raise ReportInputError(f"{source}: not a specwatch snapshot")
        return acceptance_from_snapshot(doc, window, source)
    return acceptance_from_exposition(text, window, source)


async def fetch_text(source: str, timeout_seconds: float = 10.0) -> str:
    """Body of an ``http(s)://`` URL (aiohttp) or the contents of a local file (in a thread).

    Raises :class:`ReportInputError` (one line) on any failure.
    """
    if source.startswith(("http://", "https://")):
        import aiohttp  # only for a URL: a fixed 0.2-0.5 s import the ledger-only report skips

        try:
            async with (
                aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=timeout_seconds)
                ) as session,
                session.get(source) as resp,
            ):
                if resp.status != 200:
                    raise ReportInputError(f"{source}: HTTP {resp.status}")
                raw = await resp.read()
        except TimeoutError:
            raise ReportInputError(f"{source}: no answer within {timeout_seconds:g} s") from None
        except aiohttp.ClientError as exc:
            raise ReportInputError(f"{source}: {type(exc).__name__}: {exc}") from None
        return _utf8(raw, source)
    try:
        raw = await asyncio.to_thread(Path(source).read_bytes)
    except OSError as exc:
        raise ReportInputError(f"{source}: {exc.strerror or exc}") from None
    return _utf8(raw, source)


def _utf8(raw: bytes, source: str) -> str:
    """``raw`` decoded as UTF-8; raises :class:`ReportInputError` naming ``source``, the line
    and the byte offset of the first byte that is not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ReportInputError(
            f"{source}:{line}: not UTF-8 (byte {exc.start}: {raw[exc.start : exc.start + 1]!r})"
        ) from None


__all__ = [
    "MAX_POINTS",
    "OVERALL",
    "REPORT_WINDOW",
    "Acceptance",
    "EValuePath",
    "FlipSeries",
    "LedgerDigest",
    "ReportData",
    "ReportInputError",
    "acceptance_from_exposition",
    "acceptance_from_snapshot",
    "build_report",
    "evalue_path",
    "fetch_text",
    "flip_series",
    "parse_acceptance",
    "read_ledger",
]
