"""What the report shows, computed from the pair ledger and an optional acceptance source.

Statistics come from :mod:`specwatch.shadow.summary` (``summarize``, ``build_shadow_stats``),
:mod:`specwatch.shadow.stats.paired` (``net_loss_ci``) and :mod:`specwatch.shadow.stats.sequential`
(``net_loss_mixture_log_e_values``, ``betting_path``, the one e-process driver); labelled rows are
picked by :func:`specwatch.shadow.tally.labelled_outcome`; this module only orders, bins and
accumulates ledger rows. Ledger reads go through :class:`specwatch.shadow.ledger.Ledger` (SQLite
in a worker thread).
"""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from specwatch.core.config import OVERALL, SINCE_START
from specwatch.shadow.ledger import Ledger, LedgerFileError, LedgerRow, check_ledger_file
from specwatch.shadow.stats.paired import PairedCounts, net_loss_ci, net_loss_ratio
from specwatch.shadow.stats.sequential import (
    alarm,
    betting_path,
    net_loss_mixture_log_e_values,
)
from specwatch.shadow.summary import ShadowStats, build_shadow_stats
from specwatch.shadow.tally import PairTally, labelled_outcome

#: The window name the report's tables use (every row of the ledger).
REPORT_WINDOW = SINCE_START


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
    """The e-processes after each labelled pair, in ledger (time) order.

    ``log_e_no_net_loss``: beta-binomial mixture on the discordant pairs (H0: FLy does not lose
    more than it gains); ``log_e_margin``: the betting e-process (H0: net loss <= margin).
    Natural logs; the alarm threshold is ``ln(1/alpha)``.
    """

    times: tuple[float, ...]
    log_e_no_net_loss: tuple[float, ...]
    log_e_margin: tuple[float, ...]
    alpha: float
    margin: float

    @property
    def threshold(self) -> float:
        """``1/alpha``, the Ville alarm threshold on the e-value."""
        return 1.0 / self.alpha

    def first_alarm(self, path: Sequence[float]) -> int | None:
        """Index of the first pair where ``path`` (one of the two log e-value paths) reaches
        the alarm (``specwatch.shadow.stats.sequential.alarm``), ``None`` if it never does."""
        return next((i for i, v in enumerate(path) if alarm(v, self.alpha)), None)


@dataclass(frozen=True, slots=True)
class Acceptance:
    """Per-position acceptance rate p_i per arm (label: the target name, or ``role (name)``
    when the name is not its role), one window.

    ``arms[label][i]`` is p_i (``None`` when unknown); ``source`` names where it came from.
    """

    source: str
    window: str
    arms: Mapping[str, tuple[float | None, ...]]


@dataclass(frozen=True, slots=True)
class ReportData:
    """Everything :func:`specwatch.report.render.render_report` draws.

    ``first_alarm[category]`` (and :data:`OVERALL`): the 1-based number of the labelled pair of
    that category at which the no-net-loss e-value first reached 1/alpha, ``None`` if it never
    did. An e-process alarm stays valid once raised (Ville's inequality holds at any stopping
    time), so the report uses "ever crossed", not only the current value.
    """

    ledger: str
    rows: int
    first_time: float | None
    last_time: float | None
    stats: ShadowStats
    flips: FlipSeries
    evalue: EValuePath
    acceptance: Acceptance | None
    reasons: Mapping[tuple[str, str], int]
    first_alarm: Mapping[str, int | None]


def _labelled(rows: Sequence[LedgerRow]) -> list[LedgerRow]:
    return [r for r in rows if labelled_outcome(r) is not None]


def _ints(a: Iterable[Any]) -> tuple[int, ...]:
    return tuple(int(v) for v in a)


def flip_series(rows: Sequence[LedgerRow], bins: int = 40, level: float = 0.95) -> FlipSeries:
    """Bin the labelled paired ``rows`` (any order) into ``bins`` equal time bins.

    Raises ValueError for ``bins < 1``. No labelled rows give empty tuples.
    """
    if bins < 1:
        raise ValueError("bins must be >= 1")
    lab = sorted(_labelled(rows), key=lambda r: r.time)
    if not lab:
        return FlipSeries((), (), (), (), (), (), (), (), (), (), level)
    t0, t1 = lab[0].time, lab[-1].time
    nb = 1 if t1 <= t0 else bins
    edges = np.linspace(t0, t1, nb + 1)
    times = np.array([r.time for r in lab])
    idx = np.clip(np.searchsorted(edges, times, side="right") - 1, 0, nb - 1)
    lost = np.zeros(nb, dtype=np.int64)
    gained = np.zeros(nb, dtype=np.int64)
    n = np.bincount(idx, minlength=nb)
    for i, r in zip(idx, lab, strict=True):
        if r.standard_correct and not r.fly_correct:
            lost[i] += 1
        elif r.fly_correct and not r.standard_correct:
            gained[i] += 1
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
        times=tuple(float(v) for v in edges[1:]),
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


def evalue_path(
    rows: Sequence[LedgerRow], alpha: float, margin: float, detect_net_loss: float = 0.02
) -> EValuePath:
    """Both e-processes after every labelled pair of ``rows`` in time order (see
    :class:`EValuePath`); the no-net-loss one is the focused mixture at ``detect_net_loss``."""
    lab = sorted(_labelled(rows), key=lambda r: (r.time, r.id or 0))
    lost = np.cumsum([1 if r.standard_correct and not r.fly_correct else 0 for r in lab])
    gained = np.cumsum([1 if r.fly_correct and not r.standard_correct else 0 for r in lab])
    bb = net_loss_mixture_log_e_values(lost, gained, detect_net_loss) if lab else np.zeros(0)
    outcomes = [(bool(r.standard_correct), bool(r.fly_correct)) for r in lab]
    margin_path = [state.log_wealth for state in betting_path(outcomes, margin)]
    return EValuePath(
        times=tuple(r.time for r in lab),
        log_e_no_net_loss=tuple(float(v) for v in bb),
        log_e_margin=tuple(margin_path),
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
    path: Path,
) -> tuple[list[LedgerRow], dict[str, PairTally], dict[tuple[str, str], int]]:
    """Rows (oldest first), per-category tallies and unpaired/excluded reason counts.

    Raises :class:`ReportInputError` (one line) when the file is missing or not a ledger.
    """
    await asyncio.to_thread(_check_ledger_file, path)
    ledger = Ledger(path)
    try:
        await ledger.open()
        try:
            rows = await ledger.query()
            tallies = await ledger.tally()
            reasons = await ledger.reason_counts()
        finally:
            await ledger.close()
    except (sqlite3.Error, OSError, ValueError, TypeError) as exc:
        raise ReportInputError(f"ledger {path}: cannot read ({exc})") from None
    return rows, dict(tallies), reasons


def build_report(
    ledger: str,
    rows: Sequence[LedgerRow],
    tallies: Mapping[str, PairTally],
    reasons: Mapping[tuple[str, str], int],
    *,
    alpha: float = 0.05,
    margin: float = 0.01,
    detect_net_loss: float = 0.02,
    bins: int = 40,
    acceptance: Acceptance | None = None,
    now: float = 0.0,
) -> ReportData:
    """Assemble :class:`ReportData` from ledger contents (pure)."""
    evalue = evalue_path(rows, alpha, margin, detect_net_loss)
    first_alarm: dict[str, int | None] = {}
    for cat in [OVERALL, *sorted({r.category for r in rows})]:
        path = (
            evalue
            if cat == OVERALL
            else evalue_path([r for r in rows if r.category == cat], alpha, margin, detect_net_loss)
        )
        idx = path.first_alarm(path.log_e_no_net_loss)
        first_alarm[cat] = None if idx is None else idx + 1
    stats = build_shadow_stats(
        {REPORT_WINDOW: tallies},
        now=now,
        alpha=alpha,
        margin=margin,
        detect_net_loss=detect_net_loss,
        betting_log_e_value=evalue.log_e_margin[-1] if evalue.log_e_margin else None,
        ledger_rows=len(rows),
    )
    return ReportData(
        ledger=ledger,
        rows=len(rows),
        first_time=rows[0].time if rows else None,
        last_time=rows[-1].time if rows else None,
        stats=stats,
        flips=flip_series(rows, bins=bins, level=1.0 - alpha),
        evalue=evalue,
        acceptance=acceptance,
        reasons=dict(reasons),
        first_alarm=first_alarm,
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
    return Acceptance(source=source, window=window, arms=_arm_labels(found))


def acceptance_from_exposition(text: str, window: str, source: str) -> Acceptance:
    """Per-position acceptance per target from specwatch's ``/metrics`` text
    (``specwatch_per_position_acceptance_ratio`` server-wide series, i.e. without ``engine``).
    Raises :class:`ReportInputError` when the text does not parse."""
    found: dict[tuple[str, str], dict[int, float]] = {}
    try:
        for fam in text_string_to_metric_families(text):
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
    return Acceptance(source=source, window=window, arms=_arm_labels(arms))


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
        try:
            async with (
                aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=timeout_seconds)
                ) as session,
                session.get(source) as resp,
            ):
                if resp.status != 200:
                    raise ReportInputError(f"{source}: HTTP {resp.status}")
                return await resp.text()
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError) as exc:
            raise ReportInputError(f"{source}: {type(exc).__name__}: {exc}") from None
    try:
        return await asyncio.to_thread(Path(source).read_text, encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportInputError(f"{source}: {exc}") from None


__all__ = [
    "OVERALL",
    "REPORT_WINDOW",
    "Acceptance",
    "EValuePath",
    "FlipSeries",
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
