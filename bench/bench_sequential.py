"""Benchmark: pairs to alarm and false alarms of the no-net-loss e-processes, checked every pair.

Each run is an i.i.d. stream of paired outcomes (lost / gained / concordant) of ``--pairs``
pairs; every design is checked after every pair and alarms the first time ``E >= 1/alpha``
(alpha = 0.05). The e-values here depend only on the counts (lost, gained) and change only on a
discordant pair, so a run is simulated as its sequence of discordant labels (lost w.p.
q = P(lost) / P(discordant)) and the pair index of each discordant pair (geometric gaps with
mean 1 / P(discordant)): the first crossing pair is the index of the discordant pair at which
the e-value first reaches 1/alpha. Same random numbers for every design (common random numbers).

Designs: ``beta_binomial_uniform`` (the mixture with a uniform prior on [1/2, 1], used before),
``focused_mixture`` (:func:`~specwatch.shadow.stats.sequential.net_loss_mixture_log_e_values`
at detect_net_loss 0.02, the design ``specwatch run`` uses), and ``oracle_sprt`` (Wald's SPRT
that knows the true q of each loss scenario, and q = 2/3 under the null, alarm at LR 20: a
reference, not a usable test).

Run: ``PYTHONPATH=. python bench/bench_sequential.py --runs 2000 --pairs 10000 [--json]``.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from specwatch.shadow.stats.sequential import (
    beta_binomial_log_e_values,
    net_loss_mixture_log_e_values,
)

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

ALPHA = 0.05
DEFAULT_DESIGN = "focused_mixture"

#: name -> (P(lost), P(gained)) per pair.
SCENARIOS: dict[str, tuple[float, float]] = {
    "null": (0.03, 0.03),
    "null_disc3": (0.015, 0.015),
    "null_disc10": (0.05, 0.05),
    "loss": (0.04, 0.02),
    "loss_1pt": (0.035, 0.025),
    "loss_4pt": (0.05, 0.01),
    "loss_2pt_disc3": (0.025, 0.005),
    "loss_2pt_disc10": (0.06, 0.04),
}


def _oracle_q(p_lost: float, p_gained: float) -> float:
    q = p_lost / (p_lost + p_gained)
    return q if q > 0.5 else 2.0 / 3.0


DESIGNS: dict[str, Callable[[FloatArray, FloatArray, float], FloatArray]] = {
    "beta_binomial_uniform": lambda lo, ga, q: beta_binomial_log_e_values(lo, ga),
    "focused_mixture": lambda lo, ga, q: net_loss_mixture_log_e_values(lo, ga, 0.02),
    "oracle_sprt": lambda lo, ga, q: lo * math.log(2 * q) + ga * math.log(2 * (1 - q)),
}


def first_crossings(
    runs: int, pairs: int, p_lost: float, p_gained: float, seed: int
) -> dict[str, IntArray]:
    """Pair index (1-based) of the first alarm per run and design; 0 when none in ``pairs``."""
    rng = np.random.default_rng(seed)
    p_d = p_lost + p_gained
    q = p_lost / p_d
    max_d = int(pairs * p_d + 6 * math.sqrt(pairs * p_d) + 50)
    is_lost = rng.random((runs, max_d)) < q
    position = np.cumsum(rng.geometric(p_d, size=(runs, max_d)), axis=1)
    cl = np.cumsum(is_lost, axis=1)
    cg = np.cumsum(~is_lost, axis=1)
    grid = np.arange(max_d + 1, dtype=np.float64)
    threshold = -math.log(ALPHA)
    out: dict[str, IntArray] = {}
    for name, design in DESIGNS.items():
        table = design(grid[:, None], grid[None, :], _oracle_q(p_lost, p_gained))
        hit = table[cl, cg] >= threshold
        any_hit = hit.any(axis=1)
        k = hit.argmax(axis=1)
        pos = np.where(any_hit, position[np.arange(runs), k], 0)
        out[name] = np.where(pos <= pairs, pos, 0).astype(np.int64)
    return out


def _order_stat_se(sorted_x: IntArray, prob: float) -> float:
    """MC standard error of the ``prob`` quantile from the 95% order-statistic interval / 3.92."""
    n = sorted_x.size
    half = 1.96 * math.sqrt(n * prob * (1 - prob))
    lo = int(max(0, math.floor(n * prob - half)))
    hi = int(min(n - 1, math.ceil(n * prob + half)))
    return float(sorted_x[hi] - sorted_x[lo]) / 3.92


def summarise(design: str, scenario: str, hits: IntArray) -> dict[str, object]:
    """One row: alarm rate (binomial SE) and quartiles of pairs to alarm over alarmed runs.

    ``median_pairs_all_runs`` counts runs without an alarm as never alarming (None when fewer
    than half alarm), so a design that alarms less often cannot look faster.
    """
    alarmed = np.sort(hits[hits > 0])
    n = hits.size
    rate = alarmed.size / n

    def q(p: float) -> float | None:
        return float(np.percentile(alarmed, 100 * p)) if alarmed.size else None

    return {
        "design": design,
        "scenario": scenario,
        "p_lost": SCENARIOS[scenario][0],
        "p_gained": SCENARIOS[scenario][1],
        "runs": n,
        "alarm_rate": rate,
        "alarm_rate_se": math.sqrt(rate * (1 - rate) / n),
        "median_pairs_to_alarm": q(0.5),
        "median_se": _order_stat_se(alarmed, 0.5) if alarmed.size >= 20 else None,
        "median_pairs_all_runs": (
            float(np.percentile(alarmed, 100 * 0.5 / rate)) if rate >= 0.5 else None
        ),
        "p25": q(0.25),
        "p75": q(0.75),
        "default": design == DEFAULT_DESIGN,
    }


def run(runs: int, pairs: int, seed: int) -> list[dict[str, object]]:
    """All rows, designs within scenarios."""
    rows: list[dict[str, object]] = []
    for i, (scen, (pl, pg)) in enumerate(SCENARIOS.items()):
        hits = first_crossings(runs, pairs, pl, pg, seed + i)
        rows.extend(summarise(d, scen, h) for d, h in hits.items())
    return rows


def _fmt(x: object, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--pairs", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    rows = run(args.runs, args.pairs, args.seed)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(
        f"runs={args.runs} pairs={args.pairs} seed={args.seed} alpha={ALPHA} "
        f"({time.perf_counter() - t0:.1f} s)\n"
    )
    print(
        "| scenario | design | alarm rate (SE) | median pairs (SE) | p25 | p75 |"
        " median over all runs |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        name = f"**{r['design']}**" if r["default"] else str(r["design"])
        print(
            f"| {r['scenario']} | {name} | {r['alarm_rate']:.3f} ({r['alarm_rate_se']:.3f}) | "
            f"{_fmt(r['median_pairs_to_alarm'], '.0f')} ({_fmt(r['median_se'], '.0f')}) | "
            f"{_fmt(r['p25'], '.0f')} | {_fmt(r['p75'], '.0f')} | "
            f"{_fmt(r['median_pairs_all_runs'], '.0f')} |"
        )


if __name__ == "__main__":
    main()
