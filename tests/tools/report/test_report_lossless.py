"""``specwatch report``'s lossless section, driven as a user: flips against the no-speculation
baseline by load band, the noise floor and the verdict, on a ledger with hand-counted cells."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from specwatch.__main__ import main
from specwatch.core.config import DEFAULT_LOAD_BANDS
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.shadow.lossless import lossless_by_load, lossless_check
from specwatch.shadow.tally import PairTally, load_band_labels
from tests.tools.report.test_report import T0, parse_tables, row, write_ledger

#: running at replay → [(standard agrees with the baseline, noise agrees, count)]
CELLS: dict[float | None, list[tuple[bool, bool, int]]] = {
    2.0: [(False, True, 1), (True, False, 1), (True, True, 8)],
    16.0: [(False, True, 2), (False, False, 1), (True, True, 7)],
    40.0: [(False, True, 12), (True, False, 1), (True, True, 7)],
    None: [(True, True, 2)],
}


def _rows() -> list[LedgerRow]:
    out: list[LedgerRow] = []
    i = 0
    for running, cells in CELLS.items():
        for std_agrees, noise_agrees, n in cells:
            for _ in range(n):
                out.append(
                    row(T0 + i, "math", True, True, greedy=True, noise_asked=True,
                        baseline_agrees=std_agrees, noise_baseline_agrees=noise_agrees,
                        running_at_replay=running)
                )  # fmt: skip
                i += 1
    # sampled (not greedy) requests never count, however they flip
    for _ in range(3):
        out.append(
            row(T0 + i, "math", True, True, greedy=False, noise_asked=True,
                baseline_agrees=False, noise_baseline_agrees=True, running_at_replay=40.0)
        )  # fmt: skip
        i += 1
    return out


def test_report_has_a_lossless_section_by_load_band(tmp_path: Path) -> None:
    """By hand: band 0-7 has 10 pairs (standard only 1, noise only 1), 8-31 has 10 (2, 0, both
    1), 32+ has 20 (12, 1), ``unknown`` 2 (none); the 3 sampled rows are left out. All bands:
    42 pairs, the standard arm flips (15 + 1)/42 = 38.10 %, the noise floor (2 + 1)/42 =
    7.14 %, excess 30.95 points. 12 of the 15 standard-only flips sit in the 32+ band. The
    e-value on 15 standard-only against 2 noise-only flips is past 1/α = 20, so the verdict is
    "not lossless"."""
    ledger = tmp_path / "pairs.db"
    asyncio.run(write_ledger(ledger, _rows()))
    out = tmp_path / "out"
    assert main(["report", "--ledger", str(ledger), "--out", str(out)]) == 0
    page = (out / "index.html").read_text(encoding="utf-8")
    assert "<h2>Lossless check</h2>" in page
    table = parse_tables(page, key="data-lossless-band")
    want = {
        "0-7": (10, 1, 1, 0),
        "8-31": (10, 2, 0, 1),
        "32+": (20, 12, 1, 0),
        "unknown": (2, 0, 0, 0),
        "all": (42, 15, 2, 1),
    }
    for band, (pairs, spec, noise, both) in want.items():
        cells = table[band]
        got = tuple(
            int(cells[f]["data-value"]) for f in ("pairs", "spec_only", "noise_only", "both")
        )
        assert got == (pairs, spec, noise, both), band
    assert float(table["all"]["spec_flip_ratio"]["data-value"]) == pytest.approx(16 / 42)
    assert float(table["all"]["noise_flip_ratio"]["data-value"]) == pytest.approx(3 / 42)
    assert float(table["32+"]["spec_flip_ratio"]["data-value"]) == pytest.approx(12 / 20)
    assert 'data-field="lossless_verdict" data-value="not_lossless"' in page
    assert "the standard arm flips 38.1 % of 42 greedy answers" in page
    assert "the noise floor 7.1 %" in page
    assert '<span data-field="lossless_noise_floor">7.14</span>' in page
    assert '<span data-field="lossless_excess">30.95</span>' in page


def test_lossless_verdicts_without_pairs_and_with_too_few() -> None:
    """No lossless pairs: "no lossless check"; 4 pairs (< 10): "too few pairs" whatever the
    e-value; 40 agreeing pairs with e-value 0.5: no evidence against lossless."""
    labels = load_band_labels(DEFAULT_LOAD_BANDS)
    none = lossless_check(PairTally(), 1.0, lossless_by_load({}, labels), alpha=0.05)
    assert none.verdict == "no_pairs"
    assert none.text.startswith("no lossless check")
    assert [b.band for b in none.bands] == ["0-7", "8-31", "32+"]
    assert all(b.pairs == 0 and math.isnan(b.spec_flip_ratio) for b in none.bands)
    few = lossless_check(PairTally(lossless_spec_only=4), 1e6, (), alpha=0.05)
    assert few.verdict == "too_few_pairs"
    assert few.text.startswith("too few pairs: 4 greedy pairs (need 10)")
    calm = lossless_check(PairTally(lossless_neither=40), 0.5, (), alpha=0.05)
    assert calm.verdict == "no_evidence"
    assert "e-value 0.5 < 1/α = 20" in calm.text


def test_live_load_bands_carry_the_lossless_split_to_the_metrics() -> None:
    """The live per-band view (``load_bands``, what ``shadow.by_load`` and the gauges show) has
    the same split: band 32+ of the ledger above, 20 greedy pairs, standard 12/20 = 0.6, noise
    1/20 = 0.05; the gauges carry it and skip a band without lossless pairs."""
    from prometheus_client import CollectorRegistry, generate_latest

    from specwatch.export.prometheus import ShadowCollector
    from specwatch.shadow.summary import Carried, build_shadow_stats, load_bands
    from specwatch.shadow.tally import tally_rows

    busy = tally_rows([r for r in _rows() if r.running_at_replay == 40.0])["math"]
    bands = load_bands({"32+": busy}, load_band_labels(DEFAULT_LOAD_BANDS))
    top = bands[-1]
    assert (top.band, top.lossless_pairs) == ("32+", 20)
    assert top.lossless_standard_flip_ratio == pytest.approx(0.6)
    assert top.lossless_noise_flip_ratio == pytest.approx(0.05)
    assert bands[0].lossless_pairs == 0
    stats = build_shadow_stats(
        {"since_start": {"math": busy}}, now=0.0, carried=Carried(by_load=bands)
    )
    registry = CollectorRegistry()
    registry.register(ShadowCollector(lambda: stats))
    text = generate_latest(registry).decode()
    assert 'specwatch_lossless_load_band_flip_ratio{arm="standard",band="32+"} 0.6' in text
    assert 'specwatch_lossless_load_band_pairs{band="32+"} 20.0' in text
    assert 'specwatch_lossless_load_band_pairs{band="0-7"}' not in text
