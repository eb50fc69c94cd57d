"""The no-net-loss e-process and its change detector on the discordance x loss grid.

Grid: discordance d in {2, 6, 10, 20, 30} % x net loss L in {1, 2, 5} points (L <= d). Per run,
the discordant pairs arrive after Geometric(d) gaps (so the pair index is exact) and each is a
loss with probability p = 1/2 + L / (2 d). Everything is checked after every pair.

``grid``: pairs to the first alarm (E >= 1/alpha = 20) of the shipped e-process
(:mod:`specwatch.shadow.stats.eprocess`) against Wald's SPRT told the true rates (the oracle: its
likelihood ratio is 2p / 2(1-p) / 1 per pair), on the **same streams**; median pairs (a run
that never alarms counts as never) and the share alarming within 10,000 pairs.

``null``: the share of runs with p = 1/2 whose e-process ever reaches 20 within
``--null-pairs`` pairs (continuous monitoring), at every d, with a one-sided 95 % Clopper-Pearson
upper bound and the p-value of an exact one-sided binomial test of "rate <= alpha" (Ville's
inequality bounds the true share by alpha = 5 %; with small bets the wealth path barely
overshoots 20, so the point estimate sits near 5 % and only a test can check it).

``change``: a loss that starts after ``--change-at`` harmless pairs; the detector's median delay
after the change (runs with no earlier alarm), the share of runs that alarm during the harmless
stretch, the since-start e-value's delay, and the fresh-start median of the since-start e-value
(the "1.5x the fresh-start delay" compares with it). ``arl`` rows: the detector's mean run
length under no loss, in pairs, censored at ``--arl-pairs`` (a lower bound on the mean).

The bench folds many runs at once with the module's own bets and the same recursions; it first
checks that its batch form equals :func:`~specwatch.shadow.stats.eprocess.net_loss_path` on one
stream. Run from the repository root (numpy; about 15 minutes on two busy cores)::

    PYTHONPATH=. python bench/robust_grid.py all --runs 500 --null-runs 5000 \\
        --json bench/results/robust_grid.json
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
from scipy.stats import beta, binom

from specwatch.shadow.stats.detector import DEFAULT_ARL, GAP_CAP
from specwatch.shadow.stats.eprocess import LOG_WEIGHTS, bets, discordance_estimate, net_loss_path

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

D_GRID = (0.02, 0.06, 0.10, 0.20, 0.30)
L_GRID = (0.01, 0.02, 0.05)
LOG20 = math.log(20.0)
HORIZON = 10_000
CHUNK_CELLS = 4_000_000  # runs x discordant pairs folded per pass (x 21 components)


def _p(d: float, loss: float) -> float:
    return 0.5 + loss / (2.0 * d)


def _kl(p: float) -> float:
    if p >= 1.0:
        return math.log(2.0)
    return p * math.log(2 * p) + (1 - p) * math.log(2 * (1 - p))


def _mix(a: FloatArray) -> FloatArray:
    t = a + LOG_WEIGHTS
    m = np.max(t, axis=-1, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    out: FloatArray = (m + np.log(np.sum(np.exp(t - m), axis=-1, keepdims=True)))[..., 0]
    return out


def batch(loss: BoolArray, pair: IntArray, detector: bool) -> tuple[FloatArray, FloatArray | None]:
    """``ln E`` (and ``ln M``) at every discordant pair of every run: ``loss[r, k]`` whether the
    k-th discordant pair of run r is a loss, ``pair[r, k]`` its 1-based pair index."""
    k = np.arange(loss.shape[1], dtype=np.float64)[None, :]
    q = bets(discordance_estimate(pair - 1.0, k))
    lf = np.where(loss[..., None], np.log(2.0 * q), np.log(2.0 - 2.0 * q))
    lp = np.cumsum(lf, axis=1)
    log_e = _mix(lp)
    if not detector:
        return log_e, None
    gap = np.minimum(np.diff(pair, axis=1, prepend=0), GAP_CAP).astype(np.float64)
    lsr = lp + np.logaddexp.accumulate(np.log(gap)[..., None] - (lp - lf), axis=1)
    return log_e, _mix(lsr)


def self_check(seed: int) -> float:
    """Largest difference between :func:`batch` and the shipped fold on one stream."""
    rng = np.random.default_rng(seed)
    x = rng.choice(np.array([-1, 0, 0, 0, 0, 0, 0, 1, 1]), size=4000)
    shipped = net_loss_path(x)
    idx = np.flatnonzero(x)
    log_e, log_m = batch((x[idx] == 1)[None, :], (idx + 1)[None, :].astype(np.int64), True)
    assert log_m is not None
    diff = max(
        float(np.max(np.abs(log_e[0] - shipped.log_e[idx]))),
        float(np.max(np.abs(log_m[0] - shipped.log_detector[idx]))),
    )
    if diff > 1e-9:
        raise SystemExit(f"bench batch form differs from the shipped e-process by {diff}")
    return diff


def _streams(
    rng: np.random.Generator, runs: int, k: int, d: float, p: Callable[[IntArray], Any]
) -> tuple[BoolArray, IntArray]:
    pair = np.cumsum(rng.geometric(d, size=(runs, k)), axis=1, dtype=np.int64)
    loss = rng.random((runs, k)) < p(pair)
    return loss, pair


def _const(p: float) -> Callable[[IntArray], Any]:
    return lambda n: p


def _after(change_at: int, p: float) -> Callable[[IntArray], Any]:
    return lambda n: np.where(n > change_at, p, 0.5)


def _first(hit: BoolArray, pair: IntArray) -> FloatArray:
    """Pair index of the first hit per run (inf when none)."""
    any_ = hit.any(axis=1)
    k = hit.argmax(axis=1)
    out = np.full(hit.shape[0], np.inf)
    out[any_] = pair[np.nonzero(any_)[0], k[any_]]
    return out


def _oracle(loss: BoolArray, p: float) -> FloatArray:
    """Wald's SPRT (true p against p = 1/2) log likelihood ratio at each discordant pair."""
    up = math.log(2 * p)
    if p >= 1.0:
        gained = np.cumsum(~loss, axis=1)
        return np.where(gained > 0, -np.inf, np.cumsum(loss, axis=1) * up)
    down = math.log(2 * (1 - p))
    return np.cumsum(np.where(loss, up, down), axis=1)


def _chunks(runs: int, k: int) -> list[int]:
    size = max(1, CHUNK_CELLS // max(k, 1))
    return [min(size, runs - a) for a in range(0, runs, size)]


def _cp_upper(hits: int, n: int, level: float = 0.95) -> float:
    return 1.0 if hits >= n else float(beta.ppf(level, hits + 1, n - hits))


def grid(runs: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for d in D_GRID:
        for loss_pts in L_GRID:
            if loss_pts > d + 1e-12:
                continue
            p = _p(d, loss_pts)
            k = int(max(1.15 * HORIZON * d + 60, 2.5 * LOG20 / _kl(p) + 30))
            des, orc = [], []
            for r in _chunks(runs, k):
                loss, pair = _streams(rng, r, k, d, _const(p))
                log_e, _ = batch(loss, pair, False)
                des.append(_first(log_e >= LOG20, pair))
                orc.append(_first(_oracle(loss, p) >= LOG20, pair))
            a, o = np.concatenate(des), np.concatenate(orc)
            bound = 1.10 if (d, loss_pts) == (0.06, 0.02) else 1.5
            row: dict[str, Any] = {
                "d": d,
                "loss": loss_pts,
                "runs": runs,
                "oracle_median": float(np.median(o)),
                "median": float(np.median(a)),
                "ratio": float(np.median(a) / np.median(o)),
                "ratio_bound": bound,
                "oracle_share": float(np.mean(o <= HORIZON)),
                "share": float(np.mean(a <= HORIZON)),
            }
            row["share_diff_pts"] = 100.0 * (row["share"] - row["oracle_share"])
            row["meets_ratio"] = bool(row["ratio"] <= bound)
            row["meets_share"] = bool(row["share_diff_pts"] >= -5.0)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def null(runs: int, pairs: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for d in D_GRID:
        k = int(pairs * d * 1.15 + 60)
        hits = 0
        for r in _chunks(runs, k):
            loss, pair = _streams(rng, r, k, d, _const(0.5))
            log_e, _ = batch(loss, pair, False)
            hits += int(np.sum(((log_e >= LOG20) & (pair <= pairs)).any(axis=1)))
        row = {
            "null_d": d,
            "runs": runs,
            "pairs": pairs,
            "false_alarm_share": hits / runs,
            "cp95_upper": _cp_upper(hits, runs),
            # one-sided exact binomial test of "the false-alarm rate is at most alpha = 5 %"
            "p_rate_exceeds_alpha": float(binom.sf(hits - 1, runs, 0.05)),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def change(
    runs: int,
    change_at: int,
    threshold: float,
    arl_runs: int,
    arl_pairs: int,
    rng: np.random.Generator,
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    lt = math.log(threshold)
    for d in D_GRID:
        for loss_pts in L_GRID:
            if loss_pts > d + 1e-12:
                continue
            p = _p(d, loss_pts)
            fresh_disc = LOG20 / _kl(p)  # oracle's mean discordant pairs to 20
            post = int(min(4.0 * (fresh_disc + lt / _kl(p)) + 100, 60_000 * d))
            k = int(1.15 * change_at * d + 60) + post
            kf = int(min(4.0 * fresh_disc * 2.5 + 100, 60_000 * d))
            pre_n, delays, since, fresh = 0, [], [], []
            for r in _chunks(runs, k):
                loss, pair = _streams(rng, r, k, d, _after(change_at, p))
                log_e, log_m = batch(loss, pair, True)
                assert log_m is not None
                at = _first(log_m >= lt, pair)
                pre = at <= change_at
                pre_n += int(pre.sum())
                delays.append((at - change_at)[~pre])
                since.append(_first((log_e >= LOG20) & (pair > change_at), pair) - change_at)
                lf, pf = _streams(rng, r, kf, d, _const(p))
                fresh.append(_first(batch(lf, pf, False)[0] >= LOG20, pf))
            fr = float(np.median(np.concatenate(fresh)))
            dl = float(np.median(np.concatenate(delays)))
            row: dict[str, Any] = {
                "change_d": d,
                "loss": loss_pts,
                "runs": runs,
                "change_at": change_at,
                "threshold": threshold,
                "false_alarm_before_change": pre_n / runs,
                "detector_delay": dl,
                "since_start_delay": float(np.median(np.concatenate(since))),
                "fresh_since_start": fr,
                "ratio_to_fresh": dl / fr,
            }
            row["meets"] = bool(row["ratio_to_fresh"] <= 1.5)
            rows.append(row)
            print(json.dumps(row), flush=True)
    for d in (0.06, 0.30):
        k = int(arl_pairs * d * 1.15 + 60)
        lengths = []
        for r in _chunks(arl_runs, k):
            loss, pair = _streams(rng, r, k, d, _const(0.5))
            _, log_m = batch(loss, pair, True)
            assert log_m is not None
            at = _first(log_m >= lt, pair)
            lengths.append(np.minimum(at, arl_pairs))
        rl = np.concatenate(lengths)
        row = {
            "arl_d": d,
            "runs": arl_runs,
            "threshold": threshold,
            "censored_at_pairs": arl_pairs,
            "mean_run_length_lower_bound": float(rl.mean()),
            "censored_share": float(np.mean(rl >= arl_pairs)),
            "alarm_share_within_threshold_pairs": float(np.mean(rl <= threshold)),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("what", choices=("grid", "null", "change", "all"))
    ap.add_argument("--runs", type=int, default=500)
    ap.add_argument("--null-runs", type=int, default=5000)
    ap.add_argument("--null-pairs", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--change-at", type=int, default=10_000)
    ap.add_argument("--threshold", type=float, default=DEFAULT_ARL)
    ap.add_argument("--arl-runs", type=int, default=200)
    ap.add_argument("--arl-pairs", type=int, default=200_000)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    t = time.time()
    rng = np.random.default_rng(a.seed)
    out: dict[str, Any] = {"self_check_max_diff": self_check(a.seed), "seed": a.seed}
    if a.what in ("grid", "all"):
        out["grid"] = grid(a.runs, rng)
    if a.what in ("null", "all"):
        out["null"] = null(a.null_runs, a.null_pairs, rng)
    if a.what in ("change", "all"):
        out["change"] = change(a.runs, a.change_at, a.threshold, a.arl_runs, a.arl_pairs, rng)
    out["seconds"] = round(time.time() - t, 1)
    print(json.dumps({"seconds": out["seconds"]}))
    if a.json is not None:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
