"""Simulation: false-alarm rate and time to alarm of the paired sequential tests.

Each run is a stream of paired outcomes (lost / gained / concordant, i.i.d.), checked after
every pair for ``--pairs`` pairs:

* null: no true loss, discordance 6% (lost 3%, gained 3%);
* loss: a 2-point net loss at 6% discordance (lost 4%, gained 2%).

Compared rules: the beta-binomial mixture e-process (alarm at e >= 1/alpha), the betting
e-process for ``net loss <= margin`` (margins 0 and 0.01), and "peeking" fixed-n exact
McNemar (alarm the first time p < alpha, one-sided for loss and two-sided). Also one look at
the end and one look at n = 1,175 (the Connor sample size for this loss) as calibration.

Run: ``PYTHONPATH=. python bench/sequential_sim.py --runs 2000 --pairs 10000``.
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import numpy.typing as npt
from scipy.stats import binom

from specwatch.shadow.stats.power import questions_needed
from specwatch.shadow.stats.sequential import beta_binomial_log_e_values

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def _tables(size: int, prior_a: float, prior_b: float) -> dict[str, FloatArray]:
    lost = np.arange(size)[:, None]
    gained = np.arange(size)[None, :]
    n = lost + gained
    with np.errstate(divide="ignore", invalid="ignore"):
        p_loss = np.where(n > 0, binom.sf(lost - 1, n, 0.5), 1.0)
        p_two = np.where(
            n > 0, np.minimum(1.0, 2 * binom.cdf(np.minimum(lost, gained), n, 0.5)), 1.0
        )
    log_e = beta_binomial_log_e_values(lost, gained, 0.5, prior_a, prior_b)
    return {"p_loss": p_loss, "p_two": p_two, "log_e": log_e}


def _first_true(mask: BoolArray) -> IntArray:
    """Index (1-based pair count) of the first True per row, 0 when none."""
    any_hit = mask.any(axis=1)
    first = mask.argmax(axis=1) + 1
    out: IntArray = np.where(any_hit, first, 0).astype(np.int64)
    return out


def _betting(d: npt.NDArray[np.int8], margin: float, cap: float = 0.5) -> IntArray:
    """Vectorised aGRAPA betting e-process (same rule as sequential.BettingEProcess);
    returns the first pair count at which wealth >= 1/alpha (0 = never)."""
    runs, pairs = d.shape
    threshold = math.log(20.0)
    s1 = np.zeros(runs)
    s2 = np.zeros(runs)
    log_w = np.zeros(runs)
    hit = np.zeros(runs, dtype=np.int64)
    lam_max = cap / (1.0 + margin)
    for t in range(pairs):
        mean = (s1 + margin) / (t + 1)
        var = (s2 + margin**2) / (t + 1) - mean * mean
        edge = mean - margin
        with np.errstate(divide="ignore", invalid="ignore"):
            raw = np.where(edge > 0, edge / (np.maximum(var, 0.0) + edge * edge), 0.0)
        lam = np.clip(raw, 0.0, lam_max)
        x = d[:, t].astype(np.float64)
        log_w += np.log1p(lam * (x - margin))
        s1 += x
        s2 += x * x
        newly = (hit == 0) & (log_w >= threshold)
        hit[newly] = t + 1
    return hit


def simulate(
    runs: int,
    pairs: int,
    p_lost: float,
    p_gained: float,
    seed: int,
    chunk: int,
    prior: tuple[float, float],
    with_betting: bool,
) -> dict[str, IntArray]:
    """First-alarm pair counts per run and per rule (0 = no alarm within ``pairs``)."""
    rng = np.random.default_rng(seed)
    size = int(pairs * max(p_lost, p_gained) * 1.5 + 200)
    tab = _tables(size, *prior)
    alpha = 0.05
    conn_n = questions_needed(0.02, 0.06)
    out: dict[str, list[IntArray]] = {}
    for start in range(0, runs, chunk):
        r = min(chunk, runs - start)
        u = rng.random((r, pairs))
        lost = (u < p_lost).astype(np.int8)
        gained = ((u >= p_lost) & (u < p_lost + p_gained)).astype(np.int8)
        cl = np.minimum(np.cumsum(lost, axis=1), size - 1)
        cg = np.minimum(np.cumsum(gained, axis=1), size - 1)
        rules: dict[str, IntArray] = {
            "e_process": _first_true(tab["log_e"][cl, cg] >= -math.log(alpha)),
            "peek_mcnemar_loss": _first_true(tab["p_loss"][cl, cg] < alpha),
            "peek_mcnemar_two_sided": _first_true(tab["p_two"][cl, cg] < alpha),
        }
        end = tab["p_loss"][cl[:, -1], cg[:, -1]] < alpha
        rules["single_look_end_loss"] = np.where(end, pairs, 0).astype(np.int64)
        at = min(conn_n, pairs) - 1
        two_at = tab["p_two"][cl[:, at], cg[:, at]] < alpha
        rules["single_look_n1175_two_sided"] = np.where(two_at, at + 1, 0).astype(np.int64)
        if with_betting:
            d = (lost - gained).astype(np.int8)
            rules["betting_margin_0"] = _betting(d, 0.0)
            rules["betting_margin_0.01"] = _betting(d, 0.01)
        for k, v in rules.items():
            out.setdefault(k, []).append(v)
    return {k: np.concatenate(v) for k, v in out.items()}


def summarise(hits: dict[str, IntArray]) -> dict[str, dict[str, float | None]]:
    """Alarm rate and median/quartile pairs to alarm (over alarmed runs) per rule."""
    res: dict[str, dict[str, float | None]] = {}
    for k, v in hits.items():
        alarmed = v[v > 0]
        res[k] = {
            "alarm_rate": float(alarmed.size / v.size),
            "median_pairs_to_alarm": float(np.median(alarmed)) if alarmed.size else None,
            "p25": float(np.percentile(alarmed, 25)) if alarmed.size else None,
            "p75": float(np.percentile(alarmed, 75)) if alarmed.size else None,
        }
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--pairs", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--chunk", type=int, default=250)
    ap.add_argument("--prior", type=float, nargs=2, default=(1.0, 1.0))
    ap.add_argument("--no-betting", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report: dict[str, object] = {
        "runs": args.runs,
        "pairs": args.pairs,
        "seed": args.seed,
        "prior": list(args.prior),
    }
    t0 = time.perf_counter()
    for name, (pl, pg) in {
        "null (lost 3%, gained 3%)": (0.03, 0.03),
        "loss (lost 4%, gained 2%)": (0.04, 0.02),
    }.items():
        hits = simulate(
            args.runs,
            args.pairs,
            pl,
            pg,
            args.seed,
            args.chunk,
            (float(args.prior[0]), float(args.prior[1])),
            not args.no_betting,
        )
        report[name] = summarise(hits)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"runs={args.runs} pairs={args.pairs} seed={args.seed} prior=Beta{tuple(args.prior)} "
        f"({report['seconds']} s)"
    )
    for scen in ("null (lost 3%, gained 3%)", "loss (lost 4%, gained 2%)"):
        print(
            f"\n{scen}\n| rule | alarm rate | median pairs to alarm | p25 | p75 |\n"
            "|---|---|---|---|---|"
        )
        for rule, s in report[scen].items():  # type: ignore[attr-defined]
            med = "-" if s["median_pairs_to_alarm"] is None else f"{s['median_pairs_to_alarm']:.0f}"
            p25 = "-" if s["p25"] is None else f"{s['p25']:.0f}"
            p75 = "-" if s["p75"] is None else f"{s['p75']:.0f}"
            print(f"| {rule} | {s['alarm_rate']:.3f} | {med} | {p25} | {p75} |")


if __name__ == "__main__":
    main()
