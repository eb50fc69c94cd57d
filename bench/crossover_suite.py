"""Coverage and bias of the crossover estimate (where speculation stops paying) over a suite of
speed-ratio shapes whose true crossover is known.

Each series: concurrency levels spaced evenly in log from 1 to 128 (``--levels``, 16 by
default), ``points`` scrapes per level on each arm; the reference arm's per-request speed is
100 / (1 + r/40), the candidate's that times the shape's ratio ``ratio(r)``; every point gets
its own log-normal noise (speed × exp(σ·z), σ the noise). The true crossover is the first
concurrency where the ratio falls to 1 (``inf``: never). Per (shape, noise, points) cell, over
``--runs`` series: the share "reached", the share whose interval contains the true crossover
(a "not reached" answer misses a shape that crosses within the levels), the median estimate
and its median relative error, and the median interval; for a shape that never crosses, the
share "not reached". The estimator's ``rng`` is seeded per run.

``--before REV`` runs the ``crossover`` of ``specwatch/core/crossover.py`` at git revision
``REV`` on the same series (e.g. the kernel-smoothed bootstrap it replaced). Run from the
repository root (numpy; about a minute for the default suite on two busy cores)::

    PYTHONPATH=. python bench/crossover_suite.py --runs 200
    PYTHONPATH=. python bench/crossover_suite.py --issue --before d17f23a
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specwatch.core.crossover import crossover

Points = list[tuple[float, float]]
Ratio = Callable[[float], float]

#: ln 2 / ln 40: the power law 2·r^(-b) falls to 1 at r = 40.
_POWER_B = math.log(2.0) / math.log(40.0)


def _hump(r: float) -> float:
    """Rises from 1.1 at 1 running to 1.4 at 4 (linear in log r), then falls by 0.12 a
    doubling: 1 at 4·2^(0.4/0.12) ≈ 40.3, 0.8 at 128."""
    if r <= 4.0:
        return 1.1 + 0.3 * math.log(r) / math.log(4.0)
    return 1.4 - 0.12 * math.log2(r / 4.0)


def _dip(r: float) -> float:
    """1.2 outside a dip to 0.8 at 16 running (width 0.35 in ln r); below 1 between
    16·e^(-w) and 16·e^(+w), w = 0.35·√(2 ln 2) ≈ 0.412: from ≈ 10.6 to ≈ 24.2, then pays
    again."""
    return 1.2 - 0.4 * math.exp(-((math.log(r / 16.0)) ** 2) / (2 * 0.35**2))


@dataclass(frozen=True)
class Shape:
    """A speed ratio (candidate ÷ reference) over concurrency and its true first crossing."""

    name: str
    ratio: Ratio
    truth: float  # math.inf: never crosses


SHAPES: dict[str, Shape] = {
    s.name: s
    for s in (
        Shape("linear 1.3-0.01r", lambda r: 1.3 - 0.01 * r, 30.0),
        Shape("linear 1.2-0.01r", lambda r: 1.2 - 0.01 * r, 20.0),
        Shape("power 2r^-b", lambda r: 2.0 * r**-_POWER_B, 40.0),
        Shape("step at 22 (mid-gap)", lambda r: 1.2 if r < 22.0 else 0.85, 22.0),
        Shape("step at 25 (by a level)", lambda r: 1.2 if r < 25.0 else 0.85, 25.0),
        Shape("hump 1.1-1.4-", _hump, 4.0 * 2.0 ** (0.4 / 0.12)),
        Shape("dip to 0.8 at 16", _dip, 16.0 * math.exp(-0.35 * math.sqrt(2 * math.log(2.0)))),
        Shape("flat +10 %", lambda r: 1.1, math.inf),
    )
}


def check_truths() -> None:
    """Each shape's stated truth against a fine numeric search (the ratio is above 1 just below
    it and at most 1 at it)."""
    grid = np.geomspace(1.0, 128.0, 200_001)
    for s in SHAPES.values():
        below = [r for r in grid if s.ratio(r) <= 1.0]
        found = float(below[0]) if below else math.inf
        if math.isinf(s.truth) != math.isinf(found) or (
            math.isfinite(found) and abs(found / s.truth - 1) > 1e-3
        ):
            raise SystemExit(f"{s.name}: stated truth {s.truth}, numeric {found}")


def series(
    rng: np.random.Generator,
    shape: Shape,
    noise: float,
    points: int,
    levels: int,
    design: str = "levels",
) -> tuple[Points, Points]:
    """One (candidate, reference) pair of series (see the module docstring). ``design``
    ``scattered``: instead of shared levels, each arm's running counts are drawn on their own,
    log-uniform over 1..128 and rounded (as live scrapes see them), as many as the levels
    would give; ``hetero``: shared levels, noise σ·√(16/r) (the same at 16 running, 2.8σ at 1,
    σ/2.8 at 128: a per-request speed averaged over fewer requests scatters more)."""
    n = levels * points
    if design == "scattered":
        rc = np.round(np.exp(rng.uniform(0.0, math.log(128.0), n)))
        rr = np.round(np.exp(rng.uniform(0.0, math.log(128.0), n)))
    else:
        rc = rr = np.repeat(np.geomspace(1.0, 128.0, levels), points)
    sc = noise * np.sqrt(16.0 / rc) if design == "hetero" else noise
    sr = noise * np.sqrt(16.0 / rr) if design == "hetero" else noise
    ratio = np.asarray([shape.ratio(float(r)) for r in rc])
    cand = 100.0 / (1.0 + rc / 40.0) * ratio * np.exp(sc * rng.standard_normal(n))
    ref = 100.0 / (1.0 + rr / 40.0) * np.exp(sr * rng.standard_normal(n))
    return (
        [(float(r), float(v)) for r, v in zip(rc, cand, strict=True)],
        [(float(r), float(v)) for r, v in zip(rr, ref, strict=True)],
    )


Estimator = Callable[..., Any]


def load_before(rev: str) -> Estimator:
    """``crossover`` from ``specwatch/core/crossover.py`` at git revision ``rev``."""
    text = subprocess.run(
        ["git", "show", f"{rev}:specwatch/core/crossover.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / f"crossover_{rev}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(f"crossover_{rev}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    fn: Estimator = module.crossover
    return fn


def cell(
    estimator: Estimator,
    shape: Shape,
    noise: float,
    points: int,
    runs: int,
    levels: int,
    seed: int,
    design: str = "levels",
) -> dict[str, Any]:
    """Run ``runs`` series of one cell through ``estimator``; the summary row."""
    reached = covered = 0
    estimates: list[float] = []
    lows: list[float] = []
    ups: list[float] = []
    for run in range(runs):
        data = np.random.default_rng([seed, run])
        cand, ref = series(data, shape, noise, points, levels, design)
        c = estimator(cand, ref, rng=np.random.default_rng(run))
        if c.status != "reached":
            continue
        reached += 1
        lo = 0.0 if c.lower is None else float(c.lower)
        up = math.inf if c.upper is None else float(c.upper)
        covered += lo <= shape.truth <= up
        estimates.append(float(c.running))
        lows.append(lo)
        ups.append(up)
    row: dict[str, Any] = {
        "shape": shape.name,
        "truth": shape.truth,
        "noise": noise,
        "points": points,
        "runs": runs,
        "design": design,
        "reached": reached,
        "not_reached": runs - reached,
        "covered": covered if math.isfinite(shape.truth) else None,
    }
    if estimates:
        med = float(np.median(estimates))
        row["median_estimate"] = med
        row["median_interval"] = [float(np.median(lows)), float(np.median(ups))]
        if math.isfinite(shape.truth):
            row["median_rel_error"] = med / shape.truth - 1
    return row


def _fmt(row: dict[str, Any]) -> str:
    runs = row["runs"]
    if row["covered"] is None:
        verdict = f"not reached {row['not_reached']}/{runs}"
    else:
        verdict = f"covered {row['covered']}/{runs}"
    est = row.get("median_estimate")
    extra = ""
    if est is not None:
        lo, up = row["median_interval"]
        extra = f"  median {est:6.1f}  interval {lo:5.1f}-{up:5.1f}"
        if "median_rel_error" in row:
            extra += f"  bias {100 * row['median_rel_error']:+5.1f} %"
    return (
        f"{row['shape']:<23} noise {100 * row['noise']:3.0f} %  {row['points']:2d}/level  "
        f"reached {row['reached']:3d}/{runs:<3d} {verdict:<18}{extra}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=200)
    ap.add_argument("--levels", type=int, default=16)
    ap.add_argument("--seed", type=int, default=38)
    ap.add_argument("--noise", type=float, nargs="*", default=[0.05, 0.10, 0.20])
    ap.add_argument("--points", type=int, nargs="*", default=[4, 16])
    ap.add_argument("--shapes", nargs="*", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument(
        "--issue",
        action="store_true",
        help="only the cells of the issue's table (4 points per level; 5 and 15 %% noise)",
    )
    ap.add_argument(
        "--design",
        default="levels",
        choices=["levels", "scattered", "hetero"],
        help="shared levels (default), running counts scattered per arm, or noise growing "
        "at low concurrency (see series())",
    )
    ap.add_argument("--before", metavar="REV", help="also run crossover() as of git REV")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()
    check_truths()
    if args.issue:
        names = ["linear 1.3-0.01r", "linear 1.2-0.01r", "flat +10 %"]
        grid = [(SHAPES[n], nz, 4) for n in names for nz in (0.05, 0.15)]
    else:
        grid = [(SHAPES[n], nz, p) for n in args.shapes for p in args.points for nz in args.noise]
    arms: list[tuple[str, Estimator]] = []
    if args.before:
        arms.append((f"before ({args.before})", load_before(args.before)))
    arms.append(("now", crossover))
    out: dict[str, list[dict[str, Any]]] = {}
    for label, est in arms:
        t0 = time.process_time()
        print(f"# {label}")
        rows = []
        for shape, nz, p in grid:
            row = cell(est, shape, nz, p, args.runs, args.levels, args.seed, args.design)
            rows.append(row)
            print(_fmt(row), flush=True)
        print(f"# {label}: {time.process_time() - t0:.1f} s CPU")
        out[label] = rows
    if args.json:
        lines = ",\n".join(
            f"{json.dumps(label)}: [\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]"
            for label, rows in out.items()
        )
        args.json.write_text("{\n" + lines + "\n}\n")


if __name__ == "__main__":
    main()
