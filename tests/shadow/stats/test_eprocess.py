"""The no-net-loss e-process (``specwatch.shadow.stats.eprocess``): hand-worked values, the
plain-Python reading of its formulas, the martingale property, the false-alarm guarantee on a
simulated null, and one value however the pairs are folded."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from specwatch.shadow.stats.eprocess import (
    NetLossState,
    count_log_e_value,
    net_loss_path,
    run_net_loss,
)
from tests.shadow.stats.eprocess_reference import bet, reference

#: At a discordance estimate in the 6-8 % plateau, the components' target losses grouped:
#: (target loss, summed weight), read off the knot table at 6 % (weights sum to 1).
PLATEAU = [
    (0.00976, 0.0158),
    (0.01, 0.0802 + 0.0405 + 0.0345),
    (0.01316, 0.0131),
    (0.02, 0.1869 + 0.1111 + 0.0845 + 0.0157 + 0.0309 + 0.0103 + 0.0113),
    (0.02395, 0.0320 + 0.0119 + 0.0214 + 0.0406 + 0.0428),
    (0.05, 0.1801 + 0.0125 + 0.0131),
    (0.0588, 0.0108),
]


def _q(loss: float, d: float) -> float:
    return min(max(0.5 + loss / (2 * d), 0.5), 0.98)


def test_one_loss_by_hand() -> None:
    """One lost pair first: the estimate is the prior 3/50 = 6 %, so each group bets
    q = 1/2 + L/0.12 (0.5813, 0.5833, 0.6097, 0.6667, 0.6996, 0.9167, and 0.99 capped at 0.98)
    and E = Σ w 2q = 1 + 2 Σ w (q - 1/2) = 1 + 2 (0.001285 + 0.012933 + 0.001437 + 0.075117
    + 0.029678 + 0.085708 + 0.005184) = 1.42268."""
    assert math.exp(NetLossState().update(1).log_e_value) == pytest.approx(1.42268, abs=1e-5)
    assert NetLossState().update(0).log_e_value == 0.0  # no discordant pair: E = 1 exactly


def test_loss_then_gain_by_hand() -> None:
    """Lost then gained: the second bet uses the estimate (1 + 3)/(1 + 50) = 4/51, still in the
    6-8 % plateau, so E = Σ w (2 q(6 %)) (2 (1 - q(4/51)))."""
    hand = math.fsum(w * 2 * _q(loss, 0.06) * 2 * (1 - _q(loss, 4 / 51)) for loss, w in PLATEAU)
    got = run_net_loss([1, -1]).e_value
    assert got == pytest.approx(hand, rel=1e-3)  # the grouped knots are rounded to 4 digits
    assert got == pytest.approx(reference([1, -1])[0][-1], rel=1e-12)


def test_vectorised_fold_equals_the_formulas_pair_by_pair() -> None:
    """On 3,000 pairs whose discordance moves from 4 % to 30 % with a loss in the middle, the
    vectorised fold equals the plain-Python reading of the formulas after every pair, for the
    e-value and the detector."""
    rng = np.random.default_rng(11)
    disc = np.repeat([0.04, 0.3, 0.12], 1000)
    lost = np.where(np.arange(3000) // 1000 == 1, 0.6, 0.5)
    u, v = rng.random(3000), rng.random(3000)
    x = np.where(u < disc, np.where(v < lost, 1, -1), 0)
    e_ref, m_ref = reference(x.tolist())
    path = net_loss_path(x)
    assert np.exp(path.log_e) == pytest.approx(e_ref, rel=1e-9)
    assert np.exp(path.log_detector) == pytest.approx(m_ref, rel=1e-9)


def test_same_value_however_the_pairs_are_folded() -> None:
    """Pair by pair, in one pass, and in uneven chunks: the same e-value and detector to 1e-12
    (the same code and order of operations, but numpy may run arrays of other lengths through
    other SIMD loops, so no bit-for-bit claim)."""
    rng = np.random.default_rng(5)
    x = rng.choice([-1, 0, 0, 0, 0, 1, 1], size=600)
    whole = run_net_loss(x)
    one = NetLossState()
    for v in x.tolist():
        one = one.update(v)
    chunked = NetLossState()
    for a, b in ((0, 7), (7, 300), (300, 599), (599, 600)):
        chunked = run_net_loss(x[a:b], chunked)
    assert one.log_wealth == pytest.approx(whole.log_wealth, rel=0, abs=1e-12)
    assert chunked.log_wealth == pytest.approx(whole.log_wealth, rel=0, abs=1e-12)
    assert (one.pairs, one.discordant) == (whole.pairs, whole.discordant) == (600, whole.discordant)
    assert one.log_detector == pytest.approx(whole.log_detector, abs=1e-12)
    assert chunked.log_detector == pytest.approx(whole.log_detector, abs=1e-12)


def test_mean_is_one_on_the_null_boundary() -> None:
    """With P(lost) = P(gained) = 1/4 and P(agree) = 1/2, E[E_6] over all 3^6 sequences is
    exactly 1 (a martingale for every bet), and the detector's mean is at most 6 (E[M_n] <= n,
    which bounds its mean run length to a false alarm by the threshold)."""
    prob = {1: 0.25, -1: 0.25, 0: 0.5}
    mean_e = mean_m = 0.0
    for seq in itertools.product((1, -1, 0), repeat=6):
        p = math.prod(prob[s] for s in seq)
        path = net_loss_path(np.array(seq))
        mean_e += p * math.exp(path.log_e[-1])
        mean_m += p * math.exp(path.log_detector[-1])
    assert mean_e == pytest.approx(1.0, abs=1e-12)
    assert 0.0 < mean_m <= 6.0


def test_false_alarms_stay_below_alpha_on_a_simulated_null() -> None:
    """400 null streams of 3,000 pairs (FLy loses and gains alike), half at 6 % and half with
    the discordance jumping from 2 % to 30 % mid-way: the share that ever reaches 1/alpha = 20
    is below 0.10 (alpha = 0.05 by Ville's inequality; 0.10 is over 4 standard errors above,
    and the seed is fixed)."""
    rng = np.random.default_rng(2026)
    hits = 0
    for run in range(400):
        disc = 0.06 if run % 2 else np.where(np.arange(3000) < 1500, 0.02, 0.3)
        u, v = rng.random(3000), rng.random(3000)
        x = np.where(u < disc, np.where(v < 0.5, 1, -1), 0)
        hits += bool(np.max(net_loss_path(x).log_e) >= math.log(20))
    assert hits / 400 < 0.10


def test_bets_stay_in_range_and_follow_the_estimate() -> None:
    """Every bet is in [1/2, 0.98]; at 30 % discordance a 2-point target bets 1/2 + 0.02/0.6."""
    for d in (0.001, 0.02, 0.05, 0.07, 0.15, 0.3, 0.9):
        for knots in ((0.01,) * 6, (0.02, 0.05, 0.05, 0.1, 0.1077, 0.0658)):
            assert 0.5 <= bet(knots, d) <= 0.98
    assert bet((0.02,) * 6, 0.3) == pytest.approx(0.5 + 0.02 / 0.6)


def test_count_form_by_hand() -> None:
    """The count form (windows, categories) holds the estimate at 6 %:
    E(L, G) = Σ w (2 q)^L (2 (1 - q))^G with the 6 % bets; E(0, 0) = 1."""
    hand = math.fsum(
        w * (2 * _q(loss, 0.06)) ** 25 * (2 * (1 - _q(loss, 0.06))) ** 2 for loss, w in PLATEAU
    )
    assert math.exp(count_log_e_value(25, 2)) == pytest.approx(hand, rel=1e-3)
    assert count_log_e_value(0, 0) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="lost and gained"):
        count_log_e_value(-1, 0)
    with pytest.raises(ValueError, match="outcomes"):
        net_loss_path([2])
