"""The no-net-loss e-process (``specwatch.shadow.stats.eprocess``): hand-worked values, the
plain-Python reading of its formulas, the martingale property, the false-alarm guarantee on a
simulated null, one value however the pairs are folded, and bets that survive quiet stretches."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from specwatch.shadow.stats.eprocess import (
    COMPONENTS,
    NetLossState,
    count_log_e_value,
    count_log_e_values,
    net_loss_log_e_values,
    net_loss_path,
    run_net_loss,
)
from tests.shadow.stats.eprocess_reference import count_form, reference


def test_one_loss_and_one_gain_by_hand() -> None:
    """One lost pair: E = Σ w 2θ = 1 + Σ w (2θ - 1); lost then gained: E = Σ w 4 θ (1 - θ),
    below 1 (every θ > 1/2); an agreeing pair alone leaves E = 1 exactly."""
    total = sum(w for _, w in COMPONENTS)
    one = math.fsum(w / total * 2 * t for t, w in COMPONENTS)
    both = math.fsum(w / total * 4 * t * (1 - t) for t, w in COMPONENTS)
    assert math.exp(NetLossState().update(1).log_e_value) == pytest.approx(one, rel=1e-12)
    assert run_net_loss([1, -1]).e_value == pytest.approx(both, rel=1e-12)
    assert both < 1.0 < one
    assert NetLossState().update(0).log_e_value == 0.0


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
    assert net_loss_log_e_values(x) == pytest.approx(path.log_e, rel=0, abs=1e-12)


def test_same_value_however_the_pairs_are_folded() -> None:
    """Pair by pair, in one pass, and in uneven chunks: the same counts, so the same e-value
    (one scalar call on them), and the detector to 1e-12."""
    rng = np.random.default_rng(5)
    x = rng.choice([-1, 0, 0, 0, 0, 1, 1], size=600)
    whole = run_net_loss(x)
    one = NetLossState()
    for v in x.tolist():
        one = one.update(v)
    chunked = NetLossState()
    for a, b in ((0, 7), (7, 300), (300, 599), (599, 600)):
        chunked = run_net_loss(x[a:b], chunked)
    assert one.log_e_value == whole.log_e_value == chunked.log_e_value
    assert (one.lost, one.gained, one.pairs) == (whole.lost, whole.gained, 600)
    assert (chunked.lost, chunked.gained, chunked.pairs) == (whole.lost, whole.gained, 600)
    assert one.log_detector == pytest.approx(whole.log_detector, abs=1e-12)
    assert chunked.log_detector == pytest.approx(whole.log_detector, abs=1e-12)


def test_the_order_of_the_pairs_does_not_matter() -> None:
    """The e-value is a function of (lost, gained): any permutation of the pairs ends at the same
    value, and it equals the count form of the same counts."""
    rng = np.random.default_rng(8)
    x = rng.choice([-1, 0, 0, 1, 1], size=400)
    end = run_net_loss(x).log_e_value
    assert run_net_loss(rng.permutation(x)).log_e_value == end
    lost, gained = int(np.sum(x == 1)), int(np.sum(x == -1))
    assert end == count_log_e_value(lost, gained)
    assert math.exp(end) == pytest.approx(count_form(lost, gained), rel=1e-12)


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
    the discordance jumping from 2 % to 30 % mid-way: the share that ever reaches 20 is below
    0.10 (at most 0.05 by Ville's inequality; 0.10 is over 4 standard errors above, and the
    seed is fixed)."""
    rng = np.random.default_rng(2026)
    hits = 0
    for run in range(400):
        disc = 0.06 if run % 2 else np.where(np.arange(3000) < 1500, 0.02, 0.3)
        u, v = rng.random(3000), rng.random(3000)
        x = np.where(u < disc, np.where(v < 0.5, 1, -1), 0)
        hits += bool(np.max(net_loss_path(x).log_e) >= math.log(20))
    assert hits / 400 < 0.10


def test_agreeing_pairs_never_move_the_bets() -> None:
    """Bets that survive quiet stretches: 1,500 agreeing pairs, then 3,000 pairs with 90 lost
    and 45 gained in a seeded order, gives after every pair of the second part exactly the
    e-value of the second part alone (the old design, which bet from a discordance estimate
    that collapsed in the quiet stretch, peaked at 3.8 here); it ends above 100."""
    rng = np.random.default_rng(33)
    x = np.zeros(3000, dtype=np.int64)
    pos = rng.permutation(3000)[:135]
    x[pos[:90]], x[pos[90:]] = 1, -1
    quiet_first = net_loss_path(np.concatenate([np.zeros(1500, dtype=np.int64), x]))
    assert quiet_first.log_e[1500:] == pytest.approx(net_loss_path(x).log_e, rel=0, abs=1e-12)
    assert quiet_first.log_e[-1] == pytest.approx(count_log_e_value(90, 45), rel=0, abs=1e-12)
    assert math.exp(quiet_first.log_e[-1]) > 100.0


def test_count_form_errors_and_broadcasting() -> None:
    """E(0, 0) = 1; arrays broadcast; negative counts and outcomes outside {-1, 0, 1} fail."""
    assert count_log_e_value(0, 0) == 0.0
    got = count_log_e_values(np.array([[0], [3]]), np.array([0, 1, 2]))
    assert got.shape == (2, 3)
    assert math.exp(got[1, 2]) == pytest.approx(count_form(3, 2), rel=1e-12)
    with pytest.raises(ValueError, match="lost and gained"):
        count_log_e_value(-1, 0)
    with pytest.raises(ValueError, match="outcomes"):
        net_loss_path([2])
