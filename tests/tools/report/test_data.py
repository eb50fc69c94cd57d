"""``specwatch report`` numbers from SQL aggregates and one streamed read, against a row-by-row
reference.

The reference is the report's earlier full path, kept here: every row read into Python, tallies by
the Python rule table (``tally_rows``), τ and speed sums and load bands by loops, flips binned
with ``numpy.linspace``/``searchsorted``, the margin e-process by ``betting_path`` one pair at a
time and the no-net-loss e-value by its closed form after every pair. The command's page must
carry the same values (counts equal, floats equal up to the summation order of SQLite's ``SUM``).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from specwatch.__main__ import main
from specwatch.core.config import OVERALL
from specwatch.shadow.decision import decision_table
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.shadow.lossless import lossless_by_load, lossless_check
from specwatch.shadow.stats.paired import PairedCounts, net_loss_ci, net_loss_ratio
from specwatch.shadow.stats.sequential import betting_path
from specwatch.shadow.summary import (
    Carried,
    LedgerView,
    Levels,
    OrderedState,
    build_shadow_stats,
    load_bands,
)
from specwatch.shadow.tally import (
    UNKNOWN_BAND,
    ArmTotals,
    PairTally,
    labelled_outcome,
    load_band_labels,
    tally_rows,
)
from specwatch.tools.report.data import (
    MAX_POINTS,
    EValuePath,
    FlipSeries,
    ReportData,
    build_report,
    read_ledger,
)
from specwatch.tools.report.render import render_html
from tests.shadow.stats.eprocess_reference import count_form, reference
from tests.tools.report.test_report import T0, row, write_ledger

BANDS = (0, 8, 32)
CATEGORIES = ("math", "code", "chat", "tools")


def varied_rows(n: int, seed: int = 11) -> list[LedgerRow]:
    """``n`` rows over a day at random times: four categories with different loss rates, a
    noise arm on a third, greedy rows with a baseline, running counts in every band (and
    unknown), unpaired/excluded/failed rows, some without τ or tokens."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        cat = rng.choice(CATEGORIES)
        p_lost = {"math": 0.08, "code": 0.03, "chat": 0.02, "tools": 0.05}[cat]
        u = rng.random()
        status, reason = "paired", None
        if u < 0.03:
            status, reason = "unpaired", rng.choice(["fly_timeout", "standard_http_503"])
        elif u < 0.05:
            status, reason = "excluded", "unsupported_parameter"
        elif u < 0.06:
            status, reason = "failed", None
        paired = status == "paired"
        labelled = paired and rng.random() < 0.9
        v = rng.random()
        std, fly = (True, False) if v < p_lost else (False, True) if v < 0.1 else (v < 0.8, v < 0.8)
        noise = paired and i % 3 == 0
        noise_ok = (std if rng.random() > 0.02 else not std) if noise else None
        greedy = rng.random() < 0.5 if paired else None
        tau = paired and rng.random() < 0.9
        rows.append(
            LedgerRow(
                time=T0 + rng.uniform(0.0, 86400.0),
                request_hash=f"{i:08x}",
                category=cat,
                source="canary",
                item_id=None,
                status=status,
                reason=reason,
                labelled=labelled,
                noise_asked=noise,
                standard_correct=std if labelled else None,
                fly_correct=fly if labelled else None,
                noise_correct=noise_ok if labelled and noise else None,
                fly_agrees=(std == fly) if paired else None,
                noise_agrees=(noise_ok == std) if noise else None,
                fly_divergence_char=None,
                fly_divergence_token=None,
                fly_similarity=None,
                noise_divergence_char=None,
                noise_similarity=None,
                standard_latency_seconds=rng.uniform(0.5, 2.0) if paired else None,
                fly_latency_seconds=rng.uniform(0.4, 1.8) if paired else None,
                noise_latency_seconds=None,
                standard_tokens=rng.randint(10, 300) if paired else None,
                fly_tokens=rng.randint(10, 300) if paired else None,
                noise_tokens=None,
                standard_tau=rng.uniform(2.0, 2.8) if tau else None,
                fly_tau=rng.uniform(2.6, 3.5) if tau else None,
                standard_spec_steps=rng.randint(5, 40) if tau else None,
                standard_accepted_tokens=rng.randint(5, 60) if tau else None,
                fly_spec_steps=rng.randint(5, 40) if tau else None,
                fly_accepted_tokens=rng.randint(10, 90) if tau else None,
                noise_tau=None,
                greedy=greedy,
                running_at_replay=rng.choice([None, 0.0, 3.0, 8.0, 20.0, 32.0, 50.0])
                if paired
                else None,
                baseline_agrees=rng.random() < 0.97 if greedy else None,
                noise_baseline_agrees=rng.random() < 0.97 if greedy and noise else None,
            )
        )
    return rows


def band_of(running: float | None) -> str:
    labels = load_band_labels(BANDS)
    if running is None:
        return UNKNOWN_BAND
    return next(lab for lo, lab in reversed(list(zip(BANDS, labels, strict=True))) if running >= lo)


def reference_totals(rows: list[LedgerRow]) -> dict[str, ArmTotals]:
    """τ and speed sums per category, the conditions of ``Ledger.arm_totals`` as Python."""
    out: dict[str, ArmTotals] = {}
    for r in rows:
        if r.status != "paired":
            continue
        add = ArmTotals()
        ss, fs = r.standard_spec_steps, r.fly_spec_steps
        sa, fa = r.standard_accepted_tokens, r.fly_accepted_tokens
        if ss and fs and sa is not None and fa is not None:
            add = add + ArmTotals(1, ss, sa, fs, fa)
        sl, fl = r.standard_latency_seconds, r.fly_latency_seconds
        if (
            r.standard_tokens is not None
            and r.fly_tokens is not None
            and sl is not None
            and fl is not None
            and sl > 0
            and fl > 0
        ):
            add = add + ArmTotals(0, 0, 0, 0, 0, 1, r.standard_tokens, r.fly_tokens, sl, fl)
        out[r.category] = out.get(r.category, ArmTotals()) + add
    return out


def reference_flips(rows: list[LedgerRow], bins: int, level: float) -> FlipSeries:
    """The earlier ``flip_series``: equal bins from ``numpy.linspace`` over the labelled pairs'
    time range, pairs placed by ``searchsorted``."""
    lab = sorted((r for r in rows if labelled_outcome(r)), key=lambda r: r.time)
    t0, t1 = lab[0].time, lab[-1].time
    edges = np.linspace(t0, t1, bins + 1)
    idx = np.clip(np.searchsorted(edges, [r.time for r in lab], side="right") - 1, 0, bins - 1)
    lost, gained, n = [0] * bins, [0] * bins, [0] * bins
    for i, r in zip(idx, lab, strict=True):
        n[i] += 1
        lost[i] += int(bool(r.standard_correct) and not r.fly_correct)
        gained[i] += int(bool(r.fly_correct) and not r.standard_correct)
    cl, cg, cn = (tuple(int(v) for v in np.cumsum(a)) for a in (lost, gained, n))
    pcs = [PairedCounts(m - a - b, a, b, 0) for a, b, m in zip(cl, cg, cn, strict=True)]
    cis = [net_loss_ci(pc, level=level) for pc in pcs]
    return FlipSeries(
        times=tuple(float(v) for v in edges[1:]),
        lost=tuple(lost),
        gained=tuple(gained),
        n=tuple(n),
        cum_lost=cl,
        cum_gained=cg,
        cum_n=cn,
        net_loss=tuple(net_loss_ratio(pc) for pc in pcs),
        ci_lower=tuple(c.lower for c in cis),
        ci_upper=tuple(c.upper for c in cis),
        ci_level=level,
    )


def reference_report(
    ledger: str, rows: list[LedgerRow], bins: int, alpha: float = 0.05, margin: float = 0.01
) -> ReportData:
    """The whole report from the rows, one pair at a time (see the module docstring)."""
    written = list(rows)  # the order the ledger was written: the order-dependent statistics
    rows = sorted(rows, key=lambda r: r.time)
    threshold = math.log(1.0 / alpha)
    outcomes = [o for r in written if (o := labelled_outcome(r)) is not None]
    # all categories: the ordered e-process worked pair by pair; a category: its count form
    e_all, _ = reference([int(s) - int(f) for s, f in outcomes])
    first_alarm: dict[str, int | None] = {
        OVERALL: next((k for k, e in enumerate(e_all, start=1) if e >= 1.0 / alpha), None)
    }
    for cat in sorted({r.category for r in rows}):
        lost = gained = k = 0
        first_alarm[cat] = None
        for r in written:
            out = labelled_outcome(r)
            if out is None or cat != r.category:
                continue
            k += 1
            lost += int(out == (True, False))
            gained += int(out == (False, True))
            if math.log(count_form(lost, gained)) >= threshold:
                first_alarm[cat] = k
                break
    log_e_all = math.log(e_all[-1]) if e_all else None
    margin_states = list(betting_path(outcomes, margin))
    tallies = tally_rows(rows)
    by_band: dict[str, PairTally] = {}
    for r in rows:
        by_band[band_of(r.running_at_replay)] = (
            by_band.get(band_of(r.running_at_replay), PairTally()) + tally_rows([r])[r.category]
        )
    reasons = Counter((r.status, str(r.reason)) for r in rows if r.status != "paired")
    stats = build_shadow_stats(
        {"since_start": tallies},
        now=0.0,
        levels=Levels(alpha=alpha, margin=margin),
        ordered=OrderedState(
            betting_log_e_value=margin_states[-1].log_wealth, net_loss_log_e_value=log_e_all
        ),
        ledger=LedgerView(rows=len(rows)),
        carried=Carried(
            decisions=decision_table(
                tallies,
                reference_totals(rows),
                levels=Levels(alpha=alpha, margin=margin, detect_net_loss=0.02),
                overall_log_e_value=log_e_all,
            ),
            by_load=load_bands(by_band, load_band_labels(BANDS)),
        ),
    )
    lab_times = [r.time for r in rows if labelled_outcome(r) is not None]
    lossless = lossless_check(
        sum(tallies.values(), PairTally()),
        stats.windows["since_start"][OVERALL].lossless_e_value,
        lossless_by_load(by_band, load_band_labels(BANDS)),
        alpha=alpha,
    )
    return ReportData(
        ledger=ledger,
        rows=len(rows),
        first_time=rows[0].time,
        last_time=rows[-1].time,
        first_labelled_time=lab_times[0],
        stats=stats,
        flips=reference_flips(rows, bins, 1.0 - alpha),
        evalue=EValuePath(0, (), (), (), None, None, alpha, margin),
        acceptance=None,
        reasons=dict(reasons),
        first_alarm=first_alarm,
        tau_coverage=reference_tau_coverage(rows),
        arm_totals=sum(reference_totals(rows).values(), ArmTotals()),
        lossless=lossless,
    )


def reference_tau_coverage(rows: list[LedgerRow]) -> dict[tuple[str, str], tuple[int, int]]:
    """Per-request τ coverage row by row: ``{(arm, finish_reason): (paired rows, rows with τ)}``."""
    seen: Counter[tuple[str, str]] = Counter()
    with_tau: Counter[tuple[str, str]] = Counter()
    for r in rows:
        if r.status != "paired":
            continue
        for arm, finish, tau in (
            ("standard", r.standard_finish_reason, r.standard_tau),
            ("fly", r.fly_finish_reason, r.fly_tau),
        ):
            key = (arm, finish or "none")
            seen[key] += 1
            with_tau[key] += int(tau is not None)
    return {k: (n, with_tau[k]) for k, n in seen.items()}


class Values(HTMLParser):
    """Every ``data-*`` attribute of the page, in document order, as ``(name, value)``."""

    def __init__(self) -> None:
        super().__init__()
        self.values: list[tuple[str, str]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.values += [(k, v or "") for k, v in attrs if k.startswith("data-")]


def page_values(text: str) -> list[tuple[str, str]]:
    p = Values()
    p.feed(text)
    return p.values


def same_value(a: str, b: str) -> bool:
    """Equal text, or floats equal to 1e-12 relative (SQLite sums in its own order)."""
    if a == b:
        return True
    try:
        fa, fb = float(a), float(b)
    except ValueError:
        return False
    return fa == pytest.approx(fb, rel=1e-12, abs=1e-15)


@pytest.fixture(scope="module")
def varied(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[LedgerRow]]:
    path = tmp_path_factory.mktemp("varied") / "pairs.db"
    rows = varied_rows(3000)
    asyncio.run(write_ledger(path, rows))
    return path, rows


class TestSameNumbers:
    def test_page_values_equal_the_row_by_row_reference(
        self, varied: tuple[Path, list[LedgerRow]], tmp_path: Path
    ) -> None:
        """Every table value of the command's page (per-category counts, p-values, intervals,
        e-values, first alarms, decision table, flips by load band, unpaired/excluded/failed
        reasons, row count) equals the reference page's, on 3,000 varied rows."""
        path, rows = varied
        out = tmp_path / "out"
        assert main(["report", "--ledger", str(path), "--out", str(out), "--bins", "25"]) == 0
        got = page_values((out / "index.html").read_text(encoding="utf-8"))
        want = page_values(render_html(reference_report(str(path), rows, bins=25)))
        assert len(got) == len(want) > 300
        diff = [(w, g) for w, g in zip(want, got, strict=True) if not same_value(w[1], g[1])]
        assert [w[0] for w, _ in zip(want, got, strict=True)] == [g[0] for g in got]
        assert diff == []
        reasons = Counter((r.status, str(r.reason)) for r in rows if r.status != "paired")
        assert {s for s, _ in reasons} == {"unpaired", "excluded", "failed"}

    def test_series_and_e_values_equal_the_reference(
        self, varied: tuple[Path, list[LedgerRow]]
    ) -> None:
        """The flip series equals the linspace/searchsorted binning of the raw rows; the
        e-value paths, at every plotted pair, equal the closed form of the running counts and
        ``betting_path`` pair by pair (within 1e-10: numpy's and libm's log1p may differ by one ulp
        per pair); the last pair is always plotted."""
        path, rows = varied
        data = build_report(str(path), asyncio.run(read_ledger(path, bins=25)))
        ref = reference_report(str(path), rows, bins=25)
        assert data.flips == ref.flips
        outcomes = [o for r in rows if (o := labelled_outcome(r)) is not None]
        assert data.evalue.pairs == len(outcomes) > MAX_POINTS
        assert len(data.evalue.pair) <= MAX_POINTS
        assert data.evalue.pair[-1] == len(outcomes)
        states = list(betting_path(outcomes, 0.01))
        e_all, _ = reference([int(s) - int(f) for s, f in outcomes])
        for k, bb, bet in zip(
            data.evalue.pair, data.evalue.log_e_no_net_loss, data.evalue.log_e_margin, strict=True
        ):
            assert bet == pytest.approx(states[k - 1].log_wealth, rel=0, abs=1e-10)
            assert bb == pytest.approx(math.log(e_all[k - 1]), abs=1e-9)
        assert data.first_alarm == ref.first_alarm


class TestDownsampledSeries:
    def test_bins_are_hand_computed_bucket_sums(self, tmp_path: Path) -> None:
        """12 labelled pairs at t0 + 0, 10, …, 110 s in 4 bins of 27.5 s: bins hold the pairs at
        0-20, 30-50, 60-80 and 90-110 s (3 each). Lost at 0, 10, 60 s; gained at 30, 100 s; an
        unpaired row at 5 s counts nowhere. So lost = (2, 0, 1, 0), gained = (0, 1, 0, 1),
        n = (3, 3, 3, 3), bins ending at 27.5, 55, 82.5 and 110 s."""
        lost_at, gained_at = {0, 10, 60}, {30, 100}
        rows = []
        for t in range(0, 120, 10):
            std, fly = (
                (True, False) if t in lost_at else (False, True) if t in gained_at else (True, True)
            )
            rows.append(row(T0 + t, "x", std, fly))
        rows.append(row(T0 + 5, "x", None, None))
        path = tmp_path / "l.db"
        asyncio.run(write_ledger(path, rows))
        flips = build_report(str(path), asyncio.run(read_ledger(path, bins=4))).flips
        assert flips.lost == (2, 0, 1, 0)
        assert flips.gained == (0, 1, 0, 1)
        assert flips.n == (3, 3, 3, 3)
        assert flips.cum_lost == (2, 2, 3, 3)
        assert flips.cum_n == (3, 6, 9, 12)
        assert flips.times == (T0 + 27.5, T0 + 55.0, T0 + 82.5, T0 + 110.0)
        assert flips.net_loss[-1] == pytest.approx((3 - 2) / 12)

    def test_evalue_points_bounded_with_exact_last_and_alarm(self, tmp_path: Path) -> None:
        """40 lost pairs drawn on at most 6 points: pairs 1 and 40 are there, and so is the
        first pair whose e-value (worked pair by pair) reaches 20 (the alarm marker stays
        exact); the
        page says the path is drawn at fewer points than pairs."""
        rows = [row(T0 + i, "x", True, False) for i in range(40)]
        path = tmp_path / "l.db"
        asyncio.run(write_ledger(path, rows))
        data = build_report(str(path), asyncio.run(read_ledger(path)), points=6)
        e = data.evalue
        e_ref, _ = reference([1] * 40)
        first = next(n for n, v in enumerate(e_ref, start=1) if v >= 20.0)
        assert len(e.pair) <= 6
        assert e.pair[0] == 1
        assert e.pair[-1] == 40
        assert first in e.pair
        assert e.first_alarm_no_net_loss == first
        assert e.log_e_no_net_loss[-1] == pytest.approx(math.log(e_ref[-1]), abs=1e-9)
        assert f"Drawn at {len(e.pair)} of the 40 labelled pairs" in render_html(data)

    @pytest.mark.parametrize("bins", ["0", str(MAX_POINTS + 1)])
    def test_bins_outside_the_point_bound_are_refused(
        self,
        varied: tuple[Path, list[LedgerRow]],
        tmp_path: Path,
        bins: str,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """--bins must be between 1 and the point bound: exit 2, one line, nothing written."""
        path, _ = varied
        out = tmp_path / "o"
        assert main(["report", "--ledger", str(path), "--out", str(out), "--bins", bins]) == 2
        err = capsys.readouterr().err
        assert err == f"specwatch report: --bins must be in [1, {MAX_POINTS}]\n"
        assert not out.exists()


class TestOnePassRead:
    def test_report_sums_and_bins_equal_the_live_queries_exactly(self, tmp_path: Path) -> None:
        """On 3,000 varied rows written at random times (so time order is not insertion order),
        the report's τ/speed sums (two filtered queries) are bit-for-bit ``Ledger.arm_totals()``
        (the live path's float sums, one ``CASE`` per column), and the time bins carried by the
        one ordered read are ``Ledger.labelled_bins`` (its own ``GROUP BY``), for 1, 7 and 40
        bins."""
        from specwatch.shadow.ledger.ledger import Ledger

        path = tmp_path / "l.db"
        asyncio.run(write_ledger(path, varied_rows(3000)))

        async def live(count: int, width: float, start: float) -> tuple[object, object]:
            async with Ledger(path) as ledger:
                totals = await ledger.arm_totals()
                return totals, await ledger.labelled_bins(start, width, count)

        for bins in (1, 7, 40):
            digest = asyncio.run(read_ledger(path, bins=bins))
            start = digest.span.labelled_first_time or 0.0
            totals, want_bins = asyncio.run(live(digest.bin_count, digest.bin_width, start))
            assert isinstance(totals, dict)
            nonzero = {c: t for c, t in totals.items() if t != ArmTotals()}
            assert dict(digest.totals) == nonzero
            assert list(digest.bins) == want_bins
            assert sum(b.n for b in digest.bins) == digest.stream.d.size
