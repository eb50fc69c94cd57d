"""How the weights of the no-net-loss mixture (``eprocess.COMPONENTS``) were chosen, and a check.

The e-value bets a fixed lost share θ_j on every discordant pair; a cell of the bench grid
(discordance d, net loss L) is the lost share ``θ = 1/2 + L / (2 d)``. The targets are ratios
of median pairs to the page against Wald's SPRT told the true θ at 20 (the oracle): the overall
test at its bound (1.5x at (6 %, 2 points), 2x elsewhere) and, for the 2-point cells at d > 2 %,
one category's test at the per-category bound (2.5x), with the bounds of the shipped policy
(:class:`specwatch.shadow.stats.policy.PagePolicy`).

``check``: ``--runs`` simulated streams per cell (signs of the discordant pairs, and their pair
indices from geometric gaps at d, or at d / 10 for one category of ten), the median pairs to
the mixture's page and to the oracle on the same streams, and their ratio. A median ratio has a
standard error of about 4 % at 800 runs.

``fit``: simulated medians are too noisy to optimise on, so the fit minimises a smooth proxy:
the first n at which the mixture's log-value along the expected path, ``ln Σ_j w_j
exp(n g_j(θ))`` with ``g_j(θ) = θ ln 2θ_j + (1 - θ) ln 2(1 - θ_j)``, reaches the bound, over
the oracle's ``ln 20 / KL(θ)``, times a per-cell factor (the simulated ratio over the proxy's at
the starting weights, from ``check``). Powell's method on the log-weights minimises a penalty
for every-category cells above 0.95 of their target plus a soft maximum of the one-category
ratios over 2.5. The shipped weights are that fit (at the bounds 30.8 and 647, shares 0.65 and
0.34, beside the shipped 2/3 and 0.3233), then, by hand and checked with ``check``'s simulation
at 2,000 runs on the cells concerned, 0.07 of the weight moved from θ = 0.665 to 0.515, 0.55
and 0.92 and 0.03 more to 0.98 (the cells nearest their 2x target: (30 %, 1 pt), (20 %, 2 pts),
(6 %, 5 pts), (2 %, 2 pts)), and the components left without weight dropped::

    PYTHONPATH=. python bench/mixture_weights.py check --runs 800   # about a minute
    PYTHONPATH=. python bench/mixture_weights.py fit                # a few minutes
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import numpy.typing as npt
from scipy.optimize import brentq, minimize
from scipy.special import logsumexp

from specwatch.core.config import OVERALL
from specwatch.shadow.stats.eprocess import COMPONENTS
from specwatch.shadow.stats.policy import NO_NET_LOSS, PagePolicy

FloatArray = npt.NDArray[np.float64]
CELLS = [(d, loss) for d in (0.02, 0.06, 0.10, 0.20, 0.30) for loss in (0.01, 0.02, 0.05)]
THETAS = np.array([t for t, _ in COMPONENTS])
LOG_W = np.log(np.array([w for _, w in COMPONENTS]))
POLICY = PagePolicy()
LEVEL = {"o": POLICY.level(OVERALL, NO_NET_LOSS), "c": POLICY.level("c", NO_NET_LOSS)}
Key = tuple[float, float, str]


def _kl(th: float) -> float:
    return math.log(2) if th >= 1 else th * math.log(2 * th) + (1 - th) * math.log(2 - 2 * th)


def _keys() -> list[Key]:
    out = []
    for d, loss in CELLS:
        if loss <= d:
            out.append((d, loss, "o"))
            if loss == 0.02 and d > 0.02:
                out.append((d, loss, "c"))
    return out


def _target(k: Key) -> float:
    return 1.5 if k == (0.06, 0.02, "o") else (2.5 if k[2] == "c" else 2.0)


def _median_pairs(log_e: FloatArray, level: float, pos: npt.NDArray[np.int64]) -> float:
    hit = log_e >= math.log(level)
    i = hit.argmax(axis=1)
    at = np.take_along_axis(pos, i[:, None], 1)[:, 0]
    return float(np.median(np.where(hit.any(axis=1), at, np.iinfo(np.int64).max)))


def check(log_w: FloatArray, runs: int, seed: int) -> dict[Key, float]:
    """Simulated median-pairs ratio, page over oracle, per cell (see the module docstring)."""
    rng = np.random.default_rng(seed)
    w = log_w - logsumexp(log_w)
    out: dict[Key, float] = {}
    for d, loss, kind in _keys():
        th = min(0.5 + loss / (2 * d), 1.0)
        k = int(5.0 * math.log(LEVEL[kind]) / _kl(th)) + 40
        s = rng.random((runs, k)) < th
        lost, gained = np.cumsum(s, axis=1), np.cumsum(~s, axis=1)
        pos = np.cumsum(rng.geometric(d if kind == "o" else d / 10, (runs, k)), axis=1)
        if th >= 1:
            oracle = float(np.median(pos[:, math.ceil(math.log(20) / math.log(2)) - 1]))
        else:
            sprt = lost * math.log(2 * th) + gained * math.log(2 - 2 * th)
            oracle = _median_pairs(sprt, 20.0, pos)
        log_e = np.empty((runs, k))
        for a in range(0, k, 1024):
            t = lost[:, a : a + 1024, None] * np.log(2 * THETAS) + gained[
                :, a : a + 1024, None
            ] * np.log(2 - 2 * THETAS)
            log_e[:, a : a + 1024] = logsumexp(t + w, axis=-1)
        out[(d, loss, kind)] = _median_pairs(log_e, LEVEL[kind], pos) / oracle
    return out


def proxy(log_w: FloatArray) -> dict[Key, float]:
    """The smooth proxy of the ratios: expected-path crossing over ``ln 20 / KL``."""
    w = log_w - logsumexp(log_w)
    out: dict[Key, float] = {}
    for d, loss, kind in _keys():
        th = min(0.5 + loss / (2 * d), 1.0)
        g = (
            np.log(2 * THETAS)
            if th >= 1
            else th * np.log(2 * THETAS) + (1 - th) * np.log(2 - 2 * THETAS)
        )
        lv = math.log(LEVEL[kind])
        n = brentq(lambda x, g=g, lv=lv: float(logsumexp(w + x * g)) - lv, 0.0, 1e8)
        out[(d, loss, kind)] = n * _kl(th) / math.log(20)
    return out


def fit(log_w: FloatArray, runs: int, seed: int) -> FloatArray:
    """Powell on the calibrated proxy from ``log_w`` (see the module docstring)."""
    sim, base = check(log_w, runs, seed), proxy(log_w)
    cal = {k: sim[k] / base[k] for k in base}

    def objective(x: FloatArray) -> float:
        r = {k: v * cal[k] / _target(k) for k, v in proxy(x).items()}
        every = np.array([v for k, v in r.items() if k[2] == "o"])
        one = np.array([v for k, v in r.items() if k[2] == "c"])
        soft_max = float(logsumexp(40 * one)) / 40
        return float(
            500 * np.sum(np.maximum(0, every - 0.95) ** 2) + soft_max + 0.05 * every.mean()
        )

    res = minimize(objective, log_w, method="Powell", options={"maxiter": 3000, "xtol": 1e-3})
    out: FloatArray = res.x - logsumexp(res.x)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=("check", "fit"))
    ap.add_argument("--runs", type=int, default=800)
    ap.add_argument("--seed", type=int, default=21)
    a = ap.parse_args()
    log_w = LOG_W
    if a.what == "fit":
        log_w = fit(LOG_W, a.runs, a.seed)
        print([(float(t), round(float(x), 4)) for t, x in zip(THETAS, np.exp(log_w), strict=True)])
    print(f"bounds: all pairs {LEVEL['o']:.4g}, a category {LEVEL['c']:.4g}")
    for k, v in check(log_w, a.runs, a.seed).items():
        print(f"d {k[0]:.2f}  loss {k[1]:.2f}  {'every' if k[2] == 'o' else 'one  '}  {v:.2f}x")


if __name__ == "__main__":
    main()
