"""The alerting policy on simulated histories: false pages of the whole rule set, and delays.

Every history is replayed through :func:`specwatch.shadow.stats.first_pages`, the function
that applies the shipped policy (the sidecar's evaluator and the rendered rules use the same
thresholds and e-values), with the default ``paired`` settings (the change warning at
``change_arl`` = 500,000 pairs) and the default K = 11 category series.

``false``: the family-wise false-page grid. 10 harmless categories (in each, FLy loses and gains
alike; the categories' discordances spread from 0.5x to 1.5x the base), ``--pairs`` pairs
(100,000 by default) at 1 %, 6 % and 30 % discordance and under drift (the discordance swings
between 2 % and 30 % and back every 25,000 pairs). The share of histories in which any
critical page fires (any category, both hypotheses), with its standard error, and apart from
it the share in which the change warning fires.

``detect``: the delay grid, discordance {2, 6, 10, 20, 30} % x net loss {1, 2, 5} points (loss
<= discordance). ``every``: the loss in every one of 10 categories; the pairs to the first
critical page against, on the same streams, Wald's SPRT told the true rates (the oracle, at
1/alpha = 20: the cost of the page's correction is included in the ratio), the plain
beta-binomial mixture (uniform prior on the lost share in [1/2, 1], at the page's overall
threshold) and the fixed-n exact McNemar test (one-sided alpha = 5 %: the n at which its
power is 50 %, comparable with a median, and Connor's n for 80 %). ``one``: a 2-point loss in
one of 10 categories (at that category's discordance); the pairs (of all categories) to the
first page against the oracle on that category's pairs. ``quiet``: the same loss after 10,000
agreeing pairs, and after 10,000 harmless discordant pairs at the same discordance: delay after
the onset against the fresh start (the page, and the change warning).

``point``: one cell of ``every`` (``--d``, ``--loss``; by default the operating point 6 %, 2
points) with many runs, the ratio with its bootstrap standard error.

``issue``: the quiet-then-loss stream (1,500 agreeing pairs, then 3,000 pairs with 90 lost and
45 gained in a seeded order).

Medians count a run that never pages as never (``inf``). Run from the repository root::

    PYTHONPATH=. python bench/page_grid.py false --runs 400 --json bench/results/page_false.json
    PYTHONPATH=. python bench/page_grid.py detect --runs 200 --json bench/results/page_detect.json
    PYTHONPATH=. python bench/page_grid.py point --runs 2000 --horizon 8000
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy.special import betaincc, betaln

from specwatch.core.config import DEFAULT_CHANGE_ARL, OVERALL
from specwatch.shadow.settings import PairedSettings
from specwatch.shadow.stats.policy import CHANGE, NO_NET_LOSS, PAGE, PagePolicy, first_pages
from specwatch.shadow.stats.power import exact_questions_needed, questions_needed

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

D_GRID = (0.02, 0.06, 0.10, 0.20, 0.30)
L_GRID = (0.01, 0.02, 0.05)
CATEGORIES = 10
SETTINGS = PairedSettings(change_arl=DEFAULT_CHANGE_ARL)
LOG20 = math.log(20.0)
LOG_OVERALL = PagePolicy.of(SETTINGS).log_level(OVERALL, NO_NET_LOSS)
QUIET_CELLS = ((0.02, 0.02), (0.06, 0.02), (0.10, 0.02), (0.30, 0.05))


def _pairs(cat: IntArray, x: IntArray) -> list[tuple[str, int]]:
    names = [f"c{i}" for i in range(CATEGORIES)]
    return [(names[c], v) for c, v in zip(cat.tolist(), x.tolist(), strict=True)]


def _history(
    rng: np.random.Generator,
    n: int,
    disc: Callable[[IntArray], FloatArray],
    lost_share: Callable[[IntArray, IntArray], FloatArray],
) -> tuple[IntArray, IntArray]:
    """Categories (uniform over 10) and outcomes: pair t is discordant with probability
    ``disc(t) x spread[cat]`` and then a loss with probability ``lost_share(t, cat)``."""
    t = np.arange(n, dtype=np.int64)
    cat = rng.integers(0, CATEGORIES, n)
    spread = np.linspace(0.5, 1.5, CATEGORIES)[cat]
    d = np.minimum(disc(t) * spread, 1.0)
    u, v = rng.random(n), rng.random(n)
    x = np.where(u < d, np.where(v < lost_share(t, cat), 1, -1), 0).astype(np.int64)
    return cat, x


def _flat(d: float) -> Callable[[IntArray], FloatArray]:
    def disc(t: IntArray) -> FloatArray:
        return np.full(t.size, d)

    return disc


def _share(theta: float) -> Callable[[IntArray, IntArray], FloatArray]:
    def share(t: IntArray, cat: IntArray) -> FloatArray:
        return np.full(t.size, theta)

    return share


def _drift(t: IntArray) -> FloatArray:
    out: FloatArray = 0.02 + 0.28 * (0.5 - 0.5 * np.cos(2.0 * math.pi * t / 50_000.0))
    return out


def false_pages(runs: int, pairs: int, seed: int) -> list[dict[str, Any]]:
    """Share of harmless histories with any critical page, per discordance scenario."""
    rows = []
    for name, disc in (
        ("1 %", _flat(0.01)),
        ("6 %", _flat(0.06)),
        ("30 %", _flat(0.30)),
        ("drift 2-30 %", _drift),
    ):
        rng = np.random.default_rng(seed)
        t0 = time.perf_counter()
        paged = warned = 0
        by_test: dict[str, int] = {}
        for _ in range(runs):
            cat, x = _history(rng, pairs, disc, _share(0.5))
            got = first_pages(_pairs(cat, x), SETTINGS)
            fired = [k for k, v in got.items() if v is not None and k.startswith(PAGE + "{")]
            paged += bool(fired)
            for k in fired:
                by_test[k] = by_test.get(k, 0) + 1
            warned += got[f"{CHANGE}{{category={OVERALL}}}"] is not None
        share = paged / runs
        rows.append(
            {
                "scenario": name,
                "runs": runs,
                "pairs": pairs,
                "page_share": share,
                "page_se": math.sqrt(max(share * (1 - share), 1.0 / runs) / runs),
                "by_test": by_test,
                "change_warning_share": warned / runs,
                "seconds": round(time.perf_counter() - t0, 1),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def _theta(d: float, loss: float) -> float:
    return 0.5 + loss / (2.0 * d)


def _first_cross(log_path: FloatArray, level: float) -> float:
    hit = np.flatnonzero(log_path >= level)
    return float(hit[0] + 1) if hit.size else math.inf


def _oracle(x: IntArray, theta: float) -> float:
    """Pairs to Wald's SPRT (true lost share against 1/2) reaching 20."""
    up = math.log(2 * theta)
    down = math.log(2 * (1 - theta)) if theta < 1 else -math.inf
    step = np.where(x == 1, up, np.where(x == -1, down, 0.0))
    with np.errstate(invalid="ignore"):
        return _first_cross(np.cumsum(step), LOG20)


def _beta_binomial(x: IntArray) -> float:
    """Pairs to the uniform-prior beta-binomial mixture on [1/2, 1] reaching the overall bound."""
    lo, ga = np.cumsum(x == 1).astype(float), np.cumsum(x == -1).astype(float)
    with np.errstate(divide="ignore"):
        log_e = (
            betaln(lo + 1, ga + 1)
            + np.log(betaincc(lo + 1, ga + 1, 0.5))
            + math.log(2.0)
            + (lo + ga) * math.log(2.0)
        )
    return _first_cross(log_e, LOG_OVERALL)


def _med(v: list[float]) -> float:
    return float(np.median(np.array(v)))


def _page(got: dict[str, int | None]) -> float:
    hits = [v for k, v in got.items() if k.startswith(PAGE + "{") and v is not None]
    return float(min(hits)) if hits else math.inf


def _change(got: dict[str, int | None]) -> float:
    v = got[f"{CHANGE}{{category={OVERALL}}}"]
    return math.inf if v is None else float(v)


def detect(runs: int, seed: int, horizon: int) -> dict[str, Any]:
    """The delay grid: loss in every category, in one category, and after a quiet stretch."""
    every, one, quiet = [], [], []
    for d in D_GRID:
        for loss in L_GRID:
            if loss > d:
                continue
            th = _theta(d, loss)
            rng = np.random.default_rng(seed)
            t0 = time.perf_counter()
            page, orc, bb = [], [], []
            for _ in range(runs):
                cat, x = _history(rng, horizon, _flat(d), _share(th))
                page.append(_page(first_pages(_pairs(cat, x), SETTINGS)))
                orc.append(_oracle(x, th))
                bb.append(_beta_binomial(x))
            mc50 = exact_questions_needed(loss, d, 0.05, 0.5, two_sided=False)
            mc80 = questions_needed(loss, d, 0.05, 0.8, two_sided=False)
            row = {
                "d": d,
                "loss": loss,
                "runs": runs,
                "oracle_median": _med(orc),
                "page_median": _med(page),
                "page_ratio": _med(page) / _med(orc),
                "beta_binomial_median": _med(bb),
                "beta_binomial_ratio": _med(bb) / _med(orc),
                "mcnemar_n50": mc50,
                "mcnemar_n50_ratio": mc50 / _med(orc),
                "connor_n80": mc80,
                "page_share": float(np.mean(np.isfinite(page))),
                "seconds": round(time.perf_counter() - t0, 1),
            }
            every.append(row)
            print(json.dumps(row), flush=True)
    for d in D_GRID:
        loss = 0.02
        if loss > d:
            continue
        th = _theta(d, loss)
        rng = np.random.default_rng(seed + 1)
        page, orc = [], []
        for _ in range(runs):
            # category c0's discordance is d (spread 0.5x-1.5x is off here: all at d)
            t = np.arange(horizon * 4)
            cat = rng.integers(0, CATEGORIES, t.size)
            u, v = rng.random(t.size), rng.random(t.size)
            share = np.where(cat == 0, th, 0.5)
            x = np.where(u < d, np.where(v < share, 1, -1), 0).astype(np.int64)
            got = first_pages(_pairs(cat, x), SETTINGS)
            page.append(_page(got))
            idx = np.flatnonzero(cat == 0)
            k = _oracle(x[idx], th)
            orc.append(float(idx[int(k) - 1] + 1) if math.isfinite(k) else math.inf)
        row = {
            "d": d,
            "loss": loss,
            "runs": runs,
            "oracle_median": _med(orc),
            "page_median": _med(page),
            "page_ratio": _med(page) / _med(orc),
        }
        one.append(row)
        print(json.dumps({"one": row}), flush=True)
    for d in D_GRID:
        for loss in L_GRID:
            if (d, loss) not in QUIET_CELLS:
                continue
            th = _theta(d, loss)
            rng = np.random.default_rng(seed + 2)
            fresh, after_quiet, after_harmless, warn_harmless = [], [], [], []
            pre = 10_000
            for _ in range(runs):
                cat, x = _history(rng, horizon, _flat(d), _share(th))
                fresh.append(_page(first_pages(_pairs(cat, x), SETTINGS)))
                qcat = rng.integers(0, CATEGORIES, pre)
                got = first_pages(
                    _pairs(
                        np.concatenate([qcat, cat]),
                        np.concatenate([np.zeros(pre, dtype=np.int64), x]),
                    ),
                    SETTINGS,
                )
                after_quiet.append(_page(got) - pre)
                hcat, hx = _history(rng, pre, _flat(d), _share(0.5))
                got = first_pages(
                    _pairs(np.concatenate([hcat, cat]), np.concatenate([hx, x])), SETTINGS
                )
                after_harmless.append(_page(got) - pre)
                warn_harmless.append(_change(got) - pre)
            row = {
                "d": d,
                "loss": loss,
                "runs": runs,
                "fresh_median": _med(fresh),
                "after_10k_agreeing_median": _med(after_quiet),
                "after_10k_agreeing_ratio": _med(after_quiet) / _med(fresh),
                "after_10k_harmless_page_median": _med(after_harmless),
                "after_10k_harmless_warning_median": _med(warn_harmless),
            }
            quiet.append(row)
            print(json.dumps({"quiet": row}), flush=True)
    return {"every": every, "one": one, "quiet": quiet}


def point(runs: int, seed: int, d: float, loss: float, horizon: int) -> dict[str, Any]:
    """One cell of the every-category grid with many runs: the median ratio, page over oracle,
    and its bootstrap standard error (the grid's 200 runs leave about 0.07 on a ratio)."""
    th = _theta(d, loss)
    rng = np.random.default_rng(seed)
    page, orc = [], []
    for _ in range(runs):
        cat, x = _history(rng, horizon, _flat(d), _share(th))
        page.append(_page(first_pages(_pairs(cat, x), SETTINGS)))
        orc.append(_oracle(x, th))
    p, o = np.array(page), np.array(orc)
    boot = [np.median(rng.choice(p, runs)) / np.median(rng.choice(o, runs)) for _ in range(400)]
    row = {
        "d": d,
        "loss": loss,
        "runs": runs,
        "oracle_median": _med(orc),
        "page_median": _med(page),
        "page_ratio": _med(page) / _med(orc),
        "page_ratio_se": float(np.std(boot)),
        "page_share": float(np.mean(np.isfinite(p))),
    }
    print(json.dumps(row), flush=True)
    return row


def issue_stream(seed: int) -> dict[str, Any]:
    """1,500 agreeing pairs, then 3,000 with 90 lost and 45 gained in a seeded order."""
    rng = np.random.default_rng(seed)
    x = np.zeros(3000, dtype=np.int64)
    pos = rng.permutation(3000)[:135]
    x[pos[:90]], x[pos[90:]] = 1, -1
    stream = np.concatenate([np.zeros(1500, dtype=np.int64), x])
    got = first_pages([("all", int(v)) for v in stream], SETTINGS)
    return {"first_pages": got, "beta_binomial": _beta_binomial(stream)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("false", "detect", "point", "issue"))
    ap.add_argument("--d", type=float, default=0.06, help="point: the discordance")
    ap.add_argument("--loss", type=float, default=0.02, help="point: the net loss")
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--pairs", type=int, default=100_000)
    ap.add_argument("--horizon", type=int, default=40_000)
    ap.add_argument("--seed", type=int, default=20261206)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    t0 = time.perf_counter()
    out: dict[str, Any]
    if a.what == "false":
        out = {"false_pages": false_pages(a.runs, a.pairs, a.seed)}
    elif a.what == "point":
        out = point(a.runs, a.seed, a.d, a.loss, a.horizon)
    elif a.what == "detect":
        out = detect(a.runs, a.seed, a.horizon)
    else:
        out = issue_stream(a.seed)
        print(json.dumps(out))
    out["seconds"] = round(time.perf_counter() - t0, 1)
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
