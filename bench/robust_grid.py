"""The no-net-loss statistics on the discordance x loss grid: since-start e-value and detector.

Grid: discordance d in {2, 6, 10, 20, 30} % x net loss L in {1, 2, 5} points (L <= d). Per run,
the discordant pairs arrive after Geometric(d) gaps and each is lost with probability
q = 1/2 + L / (2 d). Everything is checked after every pair.

``grid`` (the sequential test): pairs to the first alarm of the shipped since-start e-value
(``net_loss_mixture_log_e_values``, count-only, so its first crossing is the first discordant
pair whose count reaches a boundary computed once) against Wald's SPRT told the true q (the
oracle); median pairs (a run that never alarms counts as never) and the share alarming within
10,000 pairs. Null rows (q = 1/2) give the false-alarm share within ``--null-pairs``.

``change`` (the detector, ``specwatch.shadow.stats.detector``): a loss that starts after
``--change-at`` harmless pairs; the detector's delay after the change, the share of runs with a
false alarm before it, the since-start e-value's delay, and the fresh-start delay of the
since-start e-value (what "1.5x the fresh-start delay" compares with); ``arl`` rows: mean run
length of the detector under no loss, in discordant pairs (censored at ``--arl-cap``).

Run from the repository root (one core, numpy; common random numbers across designs)::

    PYTHONPATH=. python bench/robust_grid.py grid --runs 500
    PYTHONPATH=. python bench/robust_grid.py change --runs 500
"""

from __future__ import annotations

import argparse
import json
import math
import time

import numpy as np
import numpy.typing as npt

from specwatch.shadow.stats.detector import DEFAULT_ARL, detector_components
from specwatch.shadow.stats.sequential import net_loss_mixture_log_e_values

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

D_GRID = (0.02, 0.06, 0.10, 0.20, 0.30)
L_GRID = (0.01, 0.02, 0.05)
LOG20 = math.log(20.0)


def _q(d: float, loss: float) -> float:
    return 0.5 + loss / (2.0 * d)


def _kl(q: float) -> float:
    return q * math.log(2 * q) + (1 - q) * math.log(2 * (1 - q)) if q < 1 else math.log(2)


def _boundary(log_e: object, k_max: int, thr: float) -> IntArray:
    """Smallest lost count S in [0, k] with log E(S, k - S) >= thr, per k = 1..k_max (k + 1 when
    none); log E increases in S for every design here (all components q >= 1/2)."""
    f = log_e  # callable (lost, gained) -> log E
    k = np.arange(1, k_max + 1, dtype=np.int64)
    lo, hi = np.zeros(k_max, dtype=np.int64), k + 1
    while np.any(lo < hi):
        act = lo < hi
        mid = (lo + hi) // 2
        val = np.full(k_max, -np.inf)
        val[act] = f(mid[act], k[act] - mid[act])  # type: ignore[operator]
        ok = val >= thr
        hi = np.where(act & ok, mid, hi)
        lo = np.where(act & ~ok, mid + 1, lo)
    return lo


def _first_pair(s: IntArray, b: IntArray, n: IntArray) -> FloatArray:
    """Pair index of the first discordant k with S_k >= b_k (inf when none)."""
    hit = s >= b[None, : s.shape[1]]
    any_ = hit.any(axis=1)
    k = hit.argmax(axis=1)
    out = np.full(s.shape[0], np.inf)
    out[any_] = n[np.nonzero(any_)[0], k[any_]]
    return out


def _oracle(q: float) -> object:
    a = math.log(2 * q)
    if q >= 1.0:  # every discordant pair lost: one gain ends the run's evidence
        return lambda lost, gained: np.where(gained > 0, -np.inf, lost * a)
    b = math.log(2 * (1 - q))
    return lambda lost, gained: lost * a + gained * b


def grid(runs: int, seed: int, null_pairs: int, threshold: float) -> list[dict[str, float]]:
    rng = np.random.default_rng(seed)
    rows: list[dict[str, float]] = []
    shipped = net_loss_mixture_log_e_values
    for d in D_GRID:
        for loss in (0.0, *L_GRID):
            if loss > d + 1e-12:
                continue
            q = _q(d, loss)
            horizon = null_pairs if loss == 0 else 10_000
            k_max = int(1.3 * horizon * d + 80)
            if loss > 0:  # long enough for the median past 10,000 pairs
                k_max = max(k_max, int(4 * LOG20 / _kl(q) + 80))
            x = rng.random((runs, k_max)) < q
            s = np.cumsum(x, axis=1, dtype=np.int64)
            n = np.cumsum(rng.geometric(d, size=(runs, k_max)), axis=1, dtype=np.int64)
            got = _first_pair(s, _boundary(shipped, k_max, LOG20), n)
            share = float(np.mean(got <= horizon))
            row = {"d": d, "loss": loss, "runs": runs, "alarm_share": share}
            first, _ = _detector_runs(np.where(x, 1, -1).astype(np.int8), threshold, 0.02)
            idx = np.maximum(first - 1, 0)
            det = np.where(first > 0, n[np.arange(runs), idx], np.inf).astype(np.float64)
            row["detector_alarm_share"] = float(np.mean(det <= horizon))
            if loss > 0:
                orc = _first_pair(s, _boundary(_oracle(q), k_max, LOG20), n)
                row.update(
                    median=float(np.median(got)),
                    oracle_median=float(np.median(orc)),
                    ratio=float(np.median(got) / np.median(orc)),
                    oracle_share=float(np.mean(orc <= horizon)),
                    detector_median=float(np.median(det)),
                    detector_ratio=float(np.median(det) / np.median(orc)),
                )
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def _detector_runs(
    x: npt.NDArray[np.int8], threshold: float, detect: float
) -> tuple[IntArray, FloatArray]:
    """First discordant index (1-based, 0 = never) at which the detector alarms, per run, for
    discordant outcomes ``x`` (+1 / -1, shape (runs, K)); vectorised over runs and components,
    the same recursion as :func:`~specwatch.shadow.stats.detector.detector_log_path`."""
    q, w = detector_components(detect)
    up, down, lw = np.log(2 * q), np.log(2 * (1 - q)), np.log(w)
    r = np.full((x.shape[0], q.size), -np.inf)
    first = np.zeros(x.shape[0], dtype=np.int64)
    lt = math.log(threshold)
    with np.errstate(divide="ignore"):
        for k in range(x.shape[1]):
            r = np.where(x[:, k : k + 1] == 1, up, down) + np.logaddexp(r, 0.0)
            m = np.logaddexp.reduce(lw + r, axis=1)
            new = (first == 0) & (m >= lt)
            first[new] = k + 1
    return first, r


def change(
    runs: int, seed: int, change_at: int, threshold: float, arl_cap: int
) -> list[dict[str, float]]:
    rng = np.random.default_rng(seed)
    rows: list[dict[str, float]] = []
    detect = 0.02
    for d in D_GRID:
        for loss in L_GRID:
            if loss > d + 1e-12:
                continue
            q = _q(d, loss)
            post = int(4 * LOG20 / _kl(q) + 80) + int(3 * math.log(threshold) / _kl(q))
            post = min(post, 30_000)
            k_max = int(1.3 * change_at * d + 80) + post
            n = np.cumsum(rng.geometric(d, size=(runs, k_max)), axis=1, dtype=np.int64)
            p = np.where(n > change_at, q, 0.5)
            xb = rng.random((runs, k_max)) < p
            x = np.where(xb, 1, -1).astype(np.int8)
            first, _ = _detector_runs(x, threshold, detect)
            idx = np.maximum(first - 1, 0)
            at = np.where(first > 0, n[np.arange(runs), idx], np.iinfo(np.int64).max)
            pre = (first > 0) & (at <= change_at)
            delay = np.where((first > 0) & ~pre, at - change_at, np.inf).astype(np.float64)
            s = np.cumsum(xb, axis=1, dtype=np.int64)
            b = _boundary(net_loss_mixture_log_e_values, k_max, LOG20)
            hit = (s >= b[None, :]) & (n > change_at)
            any_ = hit.any(axis=1)
            since = np.full(runs, np.inf)
            since[any_] = n[np.nonzero(any_)[0], hit.argmax(axis=1)[any_]] - change_at
            # fresh start: the same post-change stream from pair 0
            kf = min(30_000, max(post, int(8 * LOG20 / _kl(q) + 80)))
            nf = np.cumsum(rng.geometric(d, size=(runs, kf)), axis=1, dtype=np.int64)
            sf = np.cumsum(rng.random((runs, kf)) < q, axis=1, dtype=np.int64)
            fresh = _first_pair(sf, b[:kf], nf)
            xf = np.where(np.diff(sf, axis=1, prepend=0) == 1, 1, -1).astype(np.int8)
            ff, _ = _detector_runs(xf, threshold, detect)
            fi = np.maximum(ff - 1, 0)
            det_fresh = np.where(ff > 0, nf[np.arange(runs), fi], np.inf).astype(np.float64)
            ok = ~pre
            row = {
                "d": d,
                "loss": loss,
                "runs": runs,
                "threshold": threshold,
                "pre_change_false_alarm": float(pre.mean()),
                "detector_delay": float(np.median(delay[ok])),
                "since_start_delay": float(np.median(since)),
                "fresh_since_start": float(np.median(fresh)),
                "fresh_detector": float(np.median(det_fresh)),
            }
            row["ratio_to_fresh_detector"] = row["detector_delay"] / row["fresh_detector"]
            row["ratio_to_fresh_since_start"] = row["detector_delay"] / row["fresh_since_start"]
            rows.append(row)
            print(json.dumps(row), flush=True)
    for d in (0.06, 0.30):
        x = np.where(rng.random((runs, arl_cap)) < 0.5, 1, -1).astype(np.int8)
        first, _ = _detector_runs(x, threshold, detect)
        rl = np.where(first > 0, first, arl_cap)
        row = {
            "arl_d": d,
            "threshold": threshold,
            "runs": runs,
            "mean_run_length_disc_lower_bound": float(rl.mean()),
            "censored": float(np.mean(first == 0)),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("grid", "change"))
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--null-pairs", type=int, default=10_000)
    ap.add_argument("--change-at", type=int, default=10_000)
    ap.add_argument("--threshold", type=float, default=DEFAULT_ARL)
    ap.add_argument("--arl-cap", type=int, default=20_000)
    a = ap.parse_args()
    t = time.time()
    if a.what == "grid":
        grid(a.runs, a.seed, a.null_pairs, a.threshold)
    else:
        change(a.runs, a.seed, a.change_at, a.threshold, a.arl_cap)
    print(json.dumps({"seconds": round(time.time() - t, 1)}))


if __name__ == "__main__":
    main()
