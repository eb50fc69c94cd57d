"""``specwatch report``: rendered headless from a ledger with known outcomes.

Expected values are worked out from the known counts in this file: lost/gained/net by hand, exact
McNemar p from ``scipy.stats.binomtest``, the interval and the non-inferiority verdict from the
statistics functions applied to the same hand counts, the e-value from the closed form.
"""

from __future__ import annotations

import asyncio
import html
import math
import random
import re
import sqlite3
import struct
import sys
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from scipy.stats import binomtest

from specwatch.__main__ import main
from specwatch.shadow.ledger.ledger import Ledger
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.shadow.stats.paired import PairedCounts, net_loss_ci, non_inferiority_test
from specwatch.tools.report.data import ReportData, build_report, parse_acceptance, read_ledger
from specwatch.tools.report.render import elapsed_axis, evalue_figure, render_html
from tests.fakes.vllm import FakeVllm, Reply
from tests.shadow.stats.eprocess_reference import count_form, reference

T0 = 1_764_460_800.0
#: category → (both_correct, lost, gained, both_wrong)
KNOWN: dict[str, tuple[int, int, int, int]] = {
    "math": (30, 9, 2, 5),
    "code": (40, 3, 3, 4),
}
UNPAIRED = 2
EXCLUDED = 1
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: A saved /api/v1/snapshot document (offline --metrics-url): two arms, K = 2, window 5m.
SNAPSHOT = (
    '{"targets": {"fly-b": {"role": "fly", "windows": {"5m": {"server": '
    '{"per_position_acceptance_rate": [0.9, null]}}}}, "standard": {"role": "standard", '
    '"windows": {"5m": {"server": {"per_position_acceptance_rate": [0.5, 0.25]}}}}}}'
)


def row(t: float, category: str, std: bool | None, fly: bool | None, **kw: object) -> LedgerRow:
    paired = std is not None
    fields: dict[str, object] = {
        "time": t,
        "request_hash": f"{t:.3f}",
        "category": category,
        "source": "canary",
        "item_id": None,
        "status": "paired" if paired else "unpaired",
        "reason": None if paired else "fly_timeout",
        "labelled": True,
        "noise_asked": False,
        "standard_correct": std,
        "fly_correct": fly,
        "noise_correct": None,
        "fly_agrees": (std == fly) if paired else None,
        "noise_agrees": None,
        "fly_divergence_char": None,
        "fly_divergence_token": None,
        "fly_similarity": None,
        "noise_divergence_char": None,
        "noise_similarity": None,
        "standard_latency_seconds": 1.0,
        "fly_latency_seconds": 0.8,
        "noise_latency_seconds": None,
        "standard_tokens": 10,
        "fly_tokens": 10,
        "noise_tokens": None,
        "standard_tau": 2.0,
        "fly_tau": 2.5,
        "noise_tau": None,
    }
    fields.update(kw)
    for arm in ("standard", "fly"):  # the counts behind a τ: two verify steps
        tau = fields[f"{arm}_tau"]
        if f"{arm}_spec_steps" not in kw and isinstance(tau, float):
            fields[f"{arm}_spec_steps"] = 2
            fields[f"{arm}_accepted_tokens"] = round((tau - 1.0) * 2)
            fields[f"{arm}_draft_tokens"] = 8
    return LedgerRow(**fields)  # type: ignore[arg-type]


def known_rows() -> list[LedgerRow]:
    """The outcomes of :data:`KNOWN`, interleaved in time, plus unpaired and excluded rows."""
    cells: list[tuple[str, bool, bool]] = []
    for cat, (bc, lost, gained, bw) in KNOWN.items():
        cells += [(cat, True, True)] * bc + [(cat, True, False)] * lost
        cells += [(cat, False, True)] * gained + [(cat, False, False)] * bw
    random.Random(3).shuffle(cells)  # interleave, the same way every run
    rows = [row(T0 + 60.0 * i, cat, s, f) for i, (cat, s, f) in enumerate(cells)]
    n = len(rows)
    rows += [row(T0 + 60.0 * (n + i), "math", None, None) for i in range(UNPAIRED)]
    rows.append(
        row(
            T0 + 60.0 * (n + UNPAIRED),
            "code",
            None,
            None,
            status="excluded",
            reason="unsupported_parameter",
        )
    )
    return rows


async def write_ledger(path: Path, rows: list[LedgerRow]) -> None:
    async with Ledger(path) as ledger:
        for r in rows:
            assert ledger.submit(r)
        await ledger.flush()


def report_of(path: Path, rows: list[LedgerRow], bins: int = 40, **kw: object) -> ReportData:
    """``rows`` written to a ledger at ``path``, read back and assembled as the command does."""
    asyncio.run(write_ledger(path, rows))
    return build_report(str(path), asyncio.run(read_ledger(path, bins=bins)), **kw)  # type: ignore[arg-type]


class TableParser(HTMLParser):
    """Collects ``<tr data-category>`` / ``<tr data-arm>`` rows' ``data-*`` cell attributes."""

    def __init__(self, keys: tuple[str, ...] = ("data-category", "data-arm")) -> None:
        super().__init__()
        self.rows: dict[str, dict[str, dict[str, str]]] = {}
        self.current: str | None = None
        self.keys = keys

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        found = [a[k] for k in self.keys if k in a]
        if tag == "tr" and found:
            self.current = found[0]
            self.rows[self.current] = {}
        elif tag == "td" and self.current is not None and "data-field" in a:
            self.rows[self.current][a["data-field"]] = a

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self.current = None


def parse_tables(html_text: str, key: str | None = None) -> dict[str, dict[str, dict[str, str]]]:
    """Rows keyed by ``data-category``/``data-arm`` (or by the ``key`` attribute when given)."""
    p = TableParser() if key is None else TableParser((key,))
    p.feed(html_text)
    return p.rows


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)


@pytest.fixture(scope="module")
def ledger_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ledger") / "pairs.db"
    asyncio.run(write_ledger(path, known_rows()))
    return path


@pytest.fixture(scope="module")
def rendered(ledger_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("report")
    snap = work / "snapshot.json"
    snap.write_text(SNAPSHOT, encoding="utf-8")
    out = work / "out"
    argv = ["report", "--ledger", str(ledger_file), "--out", str(out), "--window", "5m"]
    assert main([*argv, "--metrics-url", str(snap)]) == 0
    return out


def expected_counts() -> Iterator[tuple[str, PairedCounts]]:
    total = [0, 0, 0, 0]
    for cat, cells in KNOWN.items():
        yield cat, PairedCounts(*cells)
        total = [a + b for a, b in zip(total, cells, strict=True)]
    yield "_all", PairedCounts(*total)


def _d(rows: list[LedgerRow]) -> list[int]:
    """+1 lost, -1 gained, 0 agree per labelled pair, in time order."""
    lab = [r for r in rows if r.status == "paired"]
    return [int(bool(r.standard_correct)) - int(bool(r.fly_correct)) for r in lab]


def expected_first_alarms() -> dict[str, int | None]:
    """Per category (and ``_all``): the first labelled pair, in time order, after which the
    no-net-loss e-value is >= 1/0.05: for ``_all`` the ordered e-process worked pair by pair
    from its formulas, for a category its count form on the running (lost, gained)."""
    out: dict[str, int | None] = {}
    lab = [r for r in known_rows() if r.status == "paired"]
    e_all, _ = reference(_d(lab))
    out["_all"] = next((n for n, e in enumerate(e_all, start=1) if e >= 20.0), None)
    for cat in KNOWN:
        lost = gained = 0
        out[cat] = None
        for n, r in enumerate((r for r in lab if r.category == cat), start=1):
            lost += int(bool(r.standard_correct) and not r.fly_correct)
            gained += int(bool(r.fly_correct) and not r.standard_correct)
            if count_form(lost, gained) >= 20.0:
                out[cat] = n
                break
    return out


class TestHtml:
    def test_first_alarm_per_category(self, rendered: Path) -> None:
        """The "alarm reached" column matches a replay of the closed form in time order."""
        tables = parse_tables((rendered / "index.html").read_text(encoding="utf-8"))
        for cat, first in expected_first_alarms().items():
            shown = tables[cat]["first_alarm"]["data-value"]
            assert shown == ("" if first is None else repr(first)), cat

    def test_category_tables_match_independent_statistics(self, rendered: Path) -> None:
        """n, lost, gained, net, exact p (scipy binomtest), interval and verdict per category."""
        tables = parse_tables((rendered / "index.html").read_text(encoding="utf-8"))
        for cat, pc in expected_counts():
            got = tables[cat]
            assert int(got["n"]["data-value"]) == pc.n
            assert int(got["lost"]["data-value"]) == pc.lost
            assert int(got["gained"]["data-value"]) == pc.gained
            assert int(got["net"]["data-value"]) == pc.gained - pc.lost
            assert float(got["net_loss_ratio"]["data-value"]) == pytest.approx(
                (pc.lost - pc.gained) / pc.n
            )
            d = pc.lost + pc.gained
            p2 = binomtest(pc.lost, d, 0.5).pvalue
            p_loss = binomtest(pc.lost, d, 0.5, alternative="greater").pvalue
            assert float(got["p_two_sided"]["data-value"]) == pytest.approx(p2, rel=1e-9)
            assert float(got["p_loss"]["data-value"]) == pytest.approx(p_loss, rel=1e-9)
            ci = net_loss_ci(pc, level=0.95)
            assert float(got["ci"]["data-lower"]) == pytest.approx(ci.lower, abs=1e-9)
            assert float(got["ci"]["data-upper"]) == pytest.approx(ci.upper, abs=1e-9)
            ni = non_inferiority_test(pc, margin=0.01, alpha=0.05)
            assert got["non_inferiority_pass"]["data-value"] == ("true" if ni.passed else "false")
            # _all: the ordered e-process; a category: its count form
            e = (
                reference(_d(known_rows()))[0][-1]
                if cat == "_all"
                else count_form(pc.lost, pc.gained)
            )
            assert float(got["e_value"]["data-value"]) == pytest.approx(e, rel=1e-9)

    def test_hand_worked_values(self, rendered: Path) -> None:
        """math: 9 lost, 2 gained of 46 → net −7, p = 2·P[X ≤ 2 | 11, ½] = 2·67/2048."""
        got = parse_tables((rendered / "index.html").read_text(encoding="utf-8"))["math"]
        assert int(got["net"]["data-value"]) == -7
        assert float(got["p_two_sided"]["data-value"]) == pytest.approx(2 * 67 / 2048)
        html_text = (rendered / "index.html").read_text(encoding="utf-8")
        assert f">{2 * 67 / 2048:.3g}<" in html_text

    def test_decision_table_and_flips_by_load(self, rendered: Path) -> None:
        """Every paired row has τ 2.0 (standard) and 2.5 (FLy) and 10 tokens in 1.0 s against
        0.8 s: τ gain 0.5, throughput gain 12.5/10 − 1 = 0.25 in every category. code (3 lost,
        3 gained of 50, discordance 0.12) is not decided: at the observed net loss 0 the question
        is "within 1 pt", forecast along the confidence sequence's expected path (3 lost, 3 gained,
        44 agreeing plus 6 %, 6 % and 88 % of each further pair) to its 1/alpha = 20: 11,478 more
        (a plain scan of within_margin_log_e_value gives the same k). No row
        has a running count, so the load bands hold 0 pairs and `unknown` all 96."""
        text = (rendered / "index.html").read_text(encoding="utf-8")
        rows = parse_tables(text, key="data-decision")
        assert list(rows) == ["code", "math", "_all"]
        assert [int(rows[c]["pairs"]["data-value"]) for c in rows] == [50, 46, 96]
        for got in rows.values():
            assert float(got["tau_gain"]["data-value"]) == pytest.approx(0.5)
            assert float(got["throughput_gain_ratio"]["data-value"]) == pytest.approx(0.25)
            # every row's counts: standard 2 of 8 drafts accepted, FLy 3 of 8
            assert float(got["acceptance_gain"]["data-value"]) == pytest.approx(0.125)
        assert rows["code"]["verdict"]["data-value"] == "not_decided"
        assert "not decided: about 11478 more pairs" in text
        bands = parse_tables(text, key="data-band")
        assert list(bands) == ["0-7", "8-31", "32+", "unknown"]
        assert [int(b["pairs"]["data-value"]) for b in bands.values()] == [0, 0, 0, 96]

    def test_page_summary_and_reasons(self, rendered: Path, ledger_file: Path) -> None:
        """Row count, ledger path, the verdict line, the unpaired/excluded reasons and the
        acceptance table from the saved snapshot appear."""
        text = (rendered / "index.html").read_text(encoding="utf-8")
        tables = parse_tables(text)
        assert float(tables["standard"]["p2"]["data-value"]) == 0.25
        assert tables["fly (fly-b)"]["p2"]["data-value"] == ""
        total_rows = sum(sum(c) for c in KNOWN.values()) + UNPAIRED + EXCLUDED
        assert f'<span data-field="rows">{total_rows}</span>' in text
        assert str(ledger_file) in text
        assert (
            f'data-alarm="{"true" if any(expected_first_alarms().values()) else "false"}"' in text
        )
        assert "fly_timeout" in text
        assert "unsupported_parameter" in text
        for name in ("flips.png", "evalue.png", "net_loss.png", "per_position.png"):
            assert f'src="{name}"' in text

    def test_verdict_line_in_points(self, rendered: Path) -> None:
        """The one verdict sentence: every paired row has τ 2.0 standard and 2.5 FLy (τ +25 %)
        and 10 tokens in 1.0 s against 0.8 s (10 and 12.5 tok/s, speed +25 %); math + code = 96
        labelled pairs, 12 lost and 5 gained, so a net loss of 7/96 = 7.3 points; the e-value is
        read against 1/α = 20."""
        text = (rendered / "index.html").read_text(encoding="utf-8")
        line = re.search(r'<p class="verdict-line" data-field="verdict">([^<]*)</p>', text)
        assert line is not None
        assert line.group(1).startswith(
            "FLy: τ +25 %, speed per request +25 %, net loss 7.3 pts (95 % CI, one-look "
        )
        assert "on 96 labelled pairs; e-value " in line.group(1)
        assert " of 30 needed; " in line.group(1)

    def test_tau_and_speed_parts_per_arm(self, rendered: Path) -> None:
        """Beside the verdict, each arm's mean τ and speed over the 96 paired rows (the unpaired
        and excluded rows carry none): τ 2.00 and 2.50, 10.0 and 12.5 tok/s, mean latency 1 s
        and 0.8 s (-20 %)."""
        text = (rendered / "index.html").read_text(encoding="utf-8")
        tau = re.search(r"<span data-field='tau'[^>]*>([^<]*)</span>", text)
        speed = re.search(r"<span data-field='speed'[^>]*>([^<]*)</span>", text)
        assert tau is not None
        assert speed is not None
        assert tau.group(1) == (
            "Mean acceptance length τ: standard 2.00, FLy 2.50 (+25 %) over 96 pairs where both "
            "arms reported verify steps (1 + accepted ÷ steps, summed over the pairs)."
        )
        assert speed.group(1) == (
            "Speed per request (tokens ÷ latency): standard 10.0 tok/s, FLy 12.5 tok/s (+25 %); "
            "mean latency standard 1 s, FLy 0.8 s (-20 %) over 96 pairs."
        )

    def test_plots_are_valid_non_trivial_pngs(self, rendered: Path) -> None:
        """Each plot is a PNG with real pixels: decodes, sensible size, not one flat colour."""
        from matplotlib.image import imread

        for name in ("flips.png", "evalue.png", "net_loss.png", "per_position.png"):
            path = rendered / name
            width, height = png_size(path)
            assert width >= 600
            assert height >= 250
            assert path.stat().st_size > 10_000
            pixels = imread(path)
            assert pixels.shape[:2] == (height, width)
            assert float(pixels.std()) > 0.01


class TestSeries:
    def test_flip_series_accumulates_to_the_totals(self, tmp_path: Path) -> None:
        """Cumulative lost/gained/n end at the totals; the last interval is the overall one."""
        s = report_of(tmp_path / "l.db", known_rows(), bins=10).flips
        overall_pc = dict(expected_counts())["_all"]
        assert len(s.times) == 10
        assert sum(s.lost) == s.cum_lost[-1] == overall_pc.lost
        assert sum(s.gained) == s.cum_gained[-1] == overall_pc.gained
        assert s.cum_n[-1] == overall_pc.n
        ci = net_loss_ci(overall_pc, level=0.95)
        assert s.ci_lower[-1] == pytest.approx(ci.lower)
        assert s.ci_upper[-1] == pytest.approx(ci.upper)
        assert s.net_loss[-1] == pytest.approx(7 / 96)

    def test_evalue_path_ends_at_the_closed_form(self, tmp_path: Path) -> None:
        """One point per labelled pair (96, fewer than the plot's point bound); the last equals
        the e-process worked pair by pair over the 96 labelled pairs in time order."""
        path = report_of(tmp_path / "l.db", known_rows()).evalue
        assert path.pairs == 96
        assert path.pair == tuple(range(1, 97))
        assert path.log_e_no_net_loss[-1] == pytest.approx(
            math.log(reference(_d(known_rows()))[0][-1]), abs=1e-9
        )
        assert path.first_alarm_no_net_loss == expected_first_alarms()["_all"]

    def test_evalue_alarm_index(self, tmp_path: Path) -> None:
        """30 losses in a row: the first alarm is the first n with the e-value (read from its
        formulas, Σ_j w_j (2 θ_j)^n) >= 20: its 8th loss."""
        rows = [row(T0 + i, "x", True, False) for i in range(30)]
        path = report_of(tmp_path / "l.db", rows).evalue
        e, _ = reference([1] * 30)
        first = next(n for n, v in enumerate(e, start=1) if v >= 20)
        assert path.first_alarm_no_net_loss == first == 8

    def test_alarm_stands_after_the_e_value_falls(self, tmp_path: Path) -> None:
        """12 losses then 30 gains: the e-value crossed 20 early and is now tiny; the page still
        reports the alarm, at the pair where it was first reached."""
        rows = [row(T0 + i, "x", True, False) for i in range(12)]
        rows += [row(T0 + 12 + i, "x", False, True) for i in range(30)]
        pc = PairedCounts(0, 12, 30, 0)
        assert count_form(pc.lost, pc.gained) < 20.0  # a category's e-value: the count form
        first = next(n for n in range(1, 13) if count_form(n, 0) >= 20.0)
        page = render_html(report_of(tmp_path / "l.db", rows))
        assert 'data-alarm="true"' in page
        tables = parse_tables(page)
        assert tables["x"]["first_alarm"]["data-value"] == repr(first)
        e_all, _ = reference([1] * 12 + [-1] * 30)  # _all: the ordered e-process
        assert tables["_all"]["first_alarm"]["data-value"] == repr(
            next(n for n, v in enumerate(e_all, start=1) if v >= 20)
        )

    def test_empty_ledger_renders(self, tmp_path: Path) -> None:
        """A ledger with no rows still renders a page and four images, saying so."""
        ledger = tmp_path / "empty.db"
        asyncio.run(write_ledger(ledger, []))
        out = tmp_path / "out"
        assert main(["report", "--ledger", str(ledger), "--out", str(out)]) == 0
        text = (out / "index.html").read_text(encoding="utf-8")
        assert '<span data-field="rows">0</span>' in text
        assert int(parse_tables(text)["_all"]["n"]["data-value"]) == 0
        assert "No acceptance source given" in text
        for name in ("flips.png", "evalue.png", "net_loss.png"):
            assert png_size(out / name)[0] > 0

    def test_no_metrics_url_writes_no_per_position_plot(
        self, ledger_file: Path, tmp_path: Path
    ) -> None:
        """Without --metrics-url: no per_position.png and no image for it; the page says that
        per-position acceptance needs --metrics-url and how to save a /metrics file."""
        out = tmp_path / "out"
        assert main(["report", "--ledger", str(ledger_file), "--out", str(out)]) == 0
        assert sorted(p.name for p in out.iterdir()) == [
            "evalue.png",
            "flips.png",
            "index.html",
            "net_loss.png",
        ]
        text = (out / "index.html").read_text(encoding="utf-8")
        assert "per_position.png" not in text
        assert "Per-position acceptance needs <code>--metrics-url</code>" in text
        assert "curl -s localhost:9477/metrics &gt; metrics.txt" in text
        assert "/api/v1/snapshot" in text


class TestPlotLayout:
    @pytest.mark.parametrize(
        ("span", "unit", "scale"),
        [
            (40.0, "seconds", 1.0),
            (120.0, "seconds", 1.0),
            (1800.0, "minutes", 60.0),
            (6 * 3600.0, "hours", 3600.0),
            (30 * 86400.0, "days", 86400.0),
        ],
    )
    def test_elapsed_axis_one_unit(self, span: float, unit: str, scale: float) -> None:
        """The over-time x axis is elapsed time in one unit picked from the span (no mix of
        seconds and HH:MM ticks), labelled with the unit and the UTC start."""
        x, got_scale, label = elapsed_axis([T0, T0 + span / 2, T0 + span], T0)
        assert got_scale == scale
        assert x == [0.0, span / 2 / scale, span / scale]
        assert label == f"{unit} since the first labelled pair (2025-11-30 00:00:00 UTC)"

    def test_evalue_legend_clear_of_the_alarm_line(self, tmp_path: Path) -> None:
        """The e-value legend is drawn outside the axes, so it cannot cover the alarm line."""
        rows = [row(T0 + i, "x", True, False) for i in range(30)]
        data = report_of(tmp_path / "l.db", rows)
        fig = evalue_figure(data)
        fig.draw_without_rendering()
        (ax,) = fig.axes
        (legend,) = fig.legends
        assert not ax.legend_
        box, axes_box = legend.get_window_extent(), ax.get_window_extent()
        assert box.y1 < axes_box.y0
        (alarm_line,) = [ln for ln in ax.get_lines() if str(ln.get_label()).startswith("alarm")]
        assert float(np.asarray(alarm_line.get_ydata())[0]) == pytest.approx(math.log10(20.0))


def exposition() -> str:
    reg = CollectorRegistry()
    g = Gauge(
        "specwatch_per_position_acceptance_ratio",
        "p_i",
        ["target", "role", "model_name", "window", "position"],
        registry=reg,
    )
    for target, values in (("standard", [0.7, 0.5, 0.3]), ("fly", [0.8, 0.6, 0.45])):
        for i, v in enumerate(values):
            g.labels(target, target, "m", "since_start", str(i)).set(v)
            g.labels(target, target, "m", "5m", str(i)).set(v / 2)
    return generate_latest(reg).decode()


class TestAcceptance:
    def test_snapshot_json(self) -> None:
        """Server view of the window, standard first; role added when the name differs."""
        acc = parse_acceptance(SNAPSHOT, "5m", "snap.json")
        assert list(acc.arms.items()) == [("standard", (0.5, 0.25)), ("fly (fly-b)", (0.9, None))]

    def test_exposition_text(self) -> None:
        """The since_start series of each target, in position order."""
        acc = parse_acceptance(exposition(), "since_start", "metrics")
        assert acc.arms == {"standard": (0.7, 0.5, 0.3), "fly": (0.8, 0.6, 0.45)}

    async def test_metrics_url_end_to_end(self, ledger_file: Path, tmp_path: Path) -> None:
        """--metrics-url against a live /metrics server: the table lists both arms' p_i."""
        out = tmp_path / "out"
        async with FakeVllm() as target:
            target.push(Reply(exposition()))
            argv = ["report", "--ledger", str(ledger_file), "--out", str(out)]
            argv += ["--metrics-url", target.url]
            rc = await asyncio.to_thread(main, argv)
            bad = [*argv[:-1], target.url.replace("/metrics", "/nope")]
            rc_bad = await asyncio.to_thread(main, bad)
        assert rc == 0
        tables = parse_tables((out / "index.html").read_text(encoding="utf-8"))
        assert float(tables["fly"]["p3"]["data-value"]) == 0.45
        assert float(tables["standard"]["p1"]["data-value"]) == 0.7
        assert rc_bad == 2


class TestSpeculationLimit:
    async def test_the_sidecars_sentence_on_the_page(
        self, ledger_file: Path, tmp_path: Path
    ) -> None:
        """A live server answers a snapshot document, then specwatch's /metrics text, for a
        snapshot whose limit (FLy 150 vs 100 per request at 1 running, 75 vs 100 at 4) is
        reached at 4^(ln 1.5 / ln 2) = 2.25 running, interval 1-4. With the snapshot the report
        shows the sentence the view and advise show, verbatim; with /metrics its first part,
        rebuilt from the gauges in the same words; without a source it says what it needs."""
        import json

        from specwatch.export.json import snapshot_json
        from specwatch.export.prometheus import SpecwatchCollector
        from tests.export.test_prometheus import _full_snapshot

        snap = _full_snapshot()
        limit = snap.observe.speculation_limit
        assert limit is not None
        reg = CollectorRegistry()
        reg.register(SpecwatchCollector(lambda: snap))
        pages = []
        async with FakeVllm() as sidecar:
            sidecar.push(
                Reply(json.dumps(snapshot_json(snap)), content_type="application/json"),
                Reply(generate_latest(reg).decode()),
            )
            for n, url in enumerate([sidecar.url, sidecar.url, None]):
                out = tmp_path / f"out{n}"
                argv = ["report", "--ledger", str(ledger_file), "--out", str(out)]
                if url is not None:
                    argv += ["--metrics-url", url]
                assert await asyncio.to_thread(main, argv) == 0
                pages.append((out / "index.html").read_text(encoding="utf-8"))
        headline = (
            "FLy vs standard speculation: stops paying from about 2 running requests (95 % "
            "interval 1-4)"
        )
        assert limit.text.startswith(f"{headline}; per-request decode speed at 4 running")
        field = re.compile(r'<p data-field="speculation_limit">([^<]*)</p>')
        assert [field.findall(page) for page in pages] == [
            [html.escape(limit.text)],
            [html.escape(headline)],
            [],
        ]
        assert "needs <code>--metrics-url</code> from a sidecar" in pages[2]


class TestErrors:
    def run(self, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
        rc = main(argv)
        err = capsys.readouterr().err
        return rc, err

    def test_missing_ledger(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A missing ledger exits 2 with one "no such file" line and is not created."""
        rc, err = self.run(
            ["report", "--ledger", str(tmp_path / "nope.db"), "--out", str(tmp_path / "o")],
            capsys,
        )
        assert rc == 2
        assert err.count("\n") == 1
        assert "no such file" in err
        assert not (tmp_path / "nope.db").exists()  # not created by the report

    def test_corrupt_ledger(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A file that is not SQLite exits 2 with one line saying so."""
        bad = tmp_path / "bad.db"
        bad.write_bytes(b"this is not sqlite" * 100)
        rc, err = self.run(["report", "--ledger", str(bad), "--out", str(tmp_path / "o")], capsys)
        assert rc == 2
        assert err.count("\n") == 1
        assert "not a readable SQLite database" in err

    def test_sqlite_without_pairs(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A SQLite file without a pairs table exits 2 naming the missing table."""
        other = tmp_path / "other.db"
        conn = sqlite3.connect(other)
        conn.execute("CREATE TABLE t (x)")
        conn.close()
        rc, err = self.run(["report", "--ledger", str(other), "--out", str(tmp_path / "o")], capsys)
        assert rc == 2
        assert "no 'pairs' table" in err

    def test_missing_metrics_file(
        self, ledger_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A --metrics-url file that does not exist exits 2 with one line."""
        argv = ["report", "--ledger", str(ledger_file), "--out", str(tmp_path / "o")]
        rc, err = self.run([*argv, "--metrics-url", str(tmp_path / "none.json")], capsys)
        assert rc == 2
        assert err.count("\n") == 1

    def test_matplotlib_missing(
        self,
        ledger_file: Path,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """Without matplotlib: one line naming the 'report' extra, exit 2, nothing written."""
        monkeypatch.setitem(sys.modules, "matplotlib", None)
        monkeypatch.delitem(sys.modules, "specwatch.tools.report.render", raising=False)
        out = tmp_path / "o"
        rc, err = self.run(["report", "--ledger", str(ledger_file), "--out", str(out)], capsys)
        assert rc == 2
        assert err.count("\n") == 1
        assert "'report' extra" in err
        assert "specwatch[report]" in err
        assert not out.exists()


def test_tau_coverage_by_finish_reason_beside_the_decision_table(tmp_path: Path) -> None:
    """Four paired rows: FLy finished two by a stop string (no per-request τ, as vLLM sends
    none there) and two by length (τ 2.5); the standard arm all four by length with τ. The
    report's coverage table: fly/length 2 of 2 (100 %), fly/stop 0 of 2 (0 %), standard/length
    4 of 4; unpaired rows are left out."""
    rows = [
        row(T0 + i, "math", True, True, standard_finish_reason="length",
            fly_finish_reason="stop" if i < 2 else "length", fly_tau=None if i < 2 else 2.5)
        for i in range(4)
    ]  # fmt: skip
    rows.append(row(T0 + 9, "math", None, None, fly_finish_reason="stop", fly_tau=None))
    data = report_of(tmp_path / "ledger.sqlite", rows)
    assert dict(data.tau_coverage) == {
        ("fly", "length"): (2, 2),
        ("fly", "stop"): (2, 0),
        ("standard", "length"): (4, 4),
    }
    table = parse_tables(render_html(data, plots=()), key="data-coverage")
    assert {k: float(v["coverage"]["data-value"]) for k, v in table.items()} == {
        "fly/length": 1.0,
        "fly/stop": 0.0,
        "standard/length": 1.0,
    }


def test_tau_coverage_per_category(tmp_path: Path) -> None:
    """Per category, the share of pairs whose both arms carried a per-request τ: math 5 pairs,
    one finished by a stop string on FLy (no τ), so 4 of 5 = 80 %; code 2 of 2; all 6 of 7
    (85.71 %), the overall row first; unpaired rows are no pairs."""
    rows = [
        row(T0 + i, "math", True, True, fly_finish_reason="stop" if i == 0 else "length",
            fly_tau=None if i == 0 else 2.5)
        for i in range(5)
    ] + [row(T0 + 10 + i, "code", True, False) for i in range(2)]  # fmt: skip
    rows.append(row(T0 + 20, "code", None, None))
    data = report_of(tmp_path / "ledger.sqlite", rows)
    table = parse_tables(render_html(data, plots=()), key="data-coverage-category")
    got = {
        c: (int(v["pairs"]["data-value"]), int(v["tau_pairs"]["data-value"]), v["coverage"])
        for c, v in table.items()
    }
    assert {c: (n, k) for c, (n, k, _) in got.items()} == {
        "_all": (7, 6),
        "code": (2, 2),
        "math": (5, 4),
    }
    assert float(got["math"][2]["data-value"]) == 0.8
    assert next(iter(table)) == "_all"
