"""Focused mixture e-process: supermartingale under H0, hand-worked values, first crossings."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specwatch.shadow.stats.sequential import (
    net_loss_log_e_value,
    net_loss_mixture_grid,
    net_loss_mixture_log_e_values,
)


def _hand_grid() -> list[tuple[float, float]]:
    """The default components written out from the docstring: centre 1/2 + 0.02/(2*0.06) = 2/3,
    core q = 1/2 + (1/6) exp(0.2 z) at z = -2, -1.5, ..., 2 with weights ∝ exp(-z²/2) summing to
    1 - 0.18, tails (0.8, 0.10) and (0.9, 0.08)."""
    zs = [-2.0 + 0.5 * i for i in range(9)]
    raw = [math.exp(-0.5 * z * z) for z in zs]
    core = [
        (0.5 + (1 / 6) * math.exp(0.2 * z), 0.82 * r / sum(raw))
        for z, r in zip(zs, raw, strict=True)
    ]
    return [*core, (0.8, 0.10), (0.9, 0.08)]


def _hand_e(lost: int, gained: int) -> float:
    return sum(w * (2 * q) ** lost * (2 * (1 - q)) ** gained for q, w in _hand_grid())


def test_grid_matches_the_documented_components() -> None:
    """Components and weights equal the hand-built list; weights sum to 1; centre is 2/3."""
    q, w = net_loss_mixture_grid(0.02)
    hand = _hand_grid()
    assert q.tolist() == pytest.approx([h[0] for h in hand], abs=1e-12)
    assert w.tolist() == pytest.approx([h[1] for h in hand], abs=1e-12)
    assert w.sum() == pytest.approx(1.0)
    assert q[4] == pytest.approx(2 / 3)


@pytest.mark.parametrize(("lost", "gained"), [(0, 0), (1, 0), (0, 1), (1, 1), (25, 2), (30, 14)])
def test_e_values_by_hand(lost: int, gained: int) -> None:
    """E(L, G) = Σ w_j (2 q_j)^L (2 (1 - q_j))^G, evaluated with plain floats."""
    assert net_loss_log_e_value(lost, gained) == pytest.approx(
        math.log(_hand_e(lost, gained)), abs=1e-10
    )


def test_eight_losses_in_a_row_cross_twenty() -> None:
    """Hand check: E(8, 0) ≈ 0.08·1.8^8 + 0.10·1.6^8 + core ≈ 8.82 + 4.29 + 9.03 ≈ 22.14 >= 20
    (core: 0.82 times a weighted mean of (2 q)^8 ≈ 11.0 over q in [0.61, 0.75]),
    and E(7, 0) < 20, so a run of losses alarms at the 8th."""
    assert math.exp(net_loss_log_e_value(8, 0)) == pytest.approx(22.14, abs=0.01)
    assert net_loss_log_e_value(7, 0) < math.log(20) <= net_loss_log_e_value(8, 0)
    assert net_loss_log_e_value(0, 0) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("p_lost_given_discordant", [0.5, 0.45, 0.3])
@pytest.mark.parametrize("p_discordant", [1.0, 0.06])
def test_one_step_multiplier_is_at_most_one_under_h0(
    p_lost_given_discordant: float, p_discordant: float
) -> None:
    """Exact one-step expectation E[E_{t+1} | state] / E_t <= 1 at every (L, G) < 200 when
    P(lost) <= P(gained); equal to 1 at q = 1/2 (a martingale on the boundary)."""
    lo = np.arange(200.0)[:, None]
    ga = np.arange(200.0)[None, :]
    now = net_loss_mixture_log_e_values(lo, ga)
    up = net_loss_mixture_log_e_values(lo + 1, ga)
    down = net_loss_mixture_log_e_values(lo, ga + 1)
    q = p_lost_given_discordant
    ratio = (1 - p_discordant) + p_discordant * (
        q * np.exp(up - now) + (1 - q) * np.exp(down - now)
    )
    assert float(ratio.max()) <= 1.0 + 1e-12
    if q == 0.5:
        assert ratio == pytest.approx(np.ones_like(ratio), abs=1e-9)


def test_ville_bound_exact_at_the_boundary() -> None:
    """P(E_t >= 20 for some t <= 400 discordant pairs) at q = 1/2, by dynamic programming over
    (lost, gained), is at most 0.05 (Ville)."""
    horizon = 400
    table = net_loss_mixture_log_e_values(
        np.arange(horizon + 1.0)[:, None], np.arange(horizon + 1.0)[None, :]
    )
    alive = np.zeros(horizon + 1)
    alive[0] = 1.0  # index = lost; gained = t - lost
    crossed = 0.0
    for t in range(1, horizon + 1):
        nxt = np.zeros(horizon + 1)
        nxt[1:] += 0.5 * alive[:-1]
        nxt[:-1] += 0.5 * alive[:-1]
        lost = np.arange(horizon + 1)
        over = (lost <= t) & (table[lost, np.clip(t - lost, 0, horizon)] >= math.log(20))
        crossed += float(nxt[over].sum())
        nxt[over] = 0.0
        alive = nxt
    assert 0.0 < crossed <= 0.05


def test_invalid_arguments() -> None:
    """Bad detect_net_loss, spread, tails and negative counts raise ValueError."""
    with pytest.raises(ValueError, match="detect_net_loss"):
        net_loss_mixture_grid(0.0)
    with pytest.raises(ValueError, match="spread"):
        net_loss_mixture_grid(0.02, spread=0.0)
    with pytest.raises(ValueError, match="tail"):
        net_loss_mixture_grid(0.02, tails=((0.4, 0.1),))
    with pytest.raises(ValueError, match="lost and gained"):
        net_loss_log_e_value(-1, 0)


def test_paired_test_reports_first_crossings(tmp_path: Path) -> None:
    """3 concordant pairs then 12 losses, in file order. Hand-worked crossings at 1/alpha = 20:
    focused mixture at the 8th loss (pair 11, see above); beta-binomial
    ln((2^(L+1) - 1)/(L+1)): 127/7 < 20 <= 255/8 at L = 7 (pair 10); betting (margin 0): the
    bet is 0 until the first loss and then 0.5 (aGRAPA raw bet 1, capped), wealth 1.5^(k-1)
    >= 20 first at k = 9 (pair 12)."""
    base = tmp_path / "base.jsonl"
    cand = tmp_path / "cand.jsonl"
    base.write_text("".join(json.dumps({"id": i, "correct": 1}) + "\n" for i in range(15)))
    cand.write_text("".join(json.dumps({"id": i, "correct": int(i < 3)}) + "\n" for i in range(15)))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "specwatch",
            "paired-test",
            str(base),
            str(cand),
            "--margin",
            "0",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(out.stdout)
    assert report["first_crossing"] == {
        "net_loss_change": None,
        "no_net_loss": 11,
        "no_net_loss_beta_binomial": 10,
        "margin": 12,
        "within_margin": None,
    }
