"""The live alarms: the change detector, the "within margin" confidence sequence, and
``first_alarms`` (the public function that replays them on a sequence of outcomes)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from specwatch.shadow.settings import PairedSettings
from specwatch.shadow.stats import first_alarms
from specwatch.shadow.stats.alarms import LiveAlarmState
from specwatch.shadow.stats.confseq import (
    BET_FRACTIONS,
    MarginDeclaration,
    declaration_path,
    net_loss_upper_sequence,
    run_declaration,
    within_margin_log_e_value,
)
from specwatch.shadow.stats.eprocess import COMPONENTS, NetLossState, net_loss_path, run_net_loss


def test_detector_is_shiryaev_roberts_on_the_pair_clock_by_hand() -> None:
    """Lost, agree, lost, gained: per component (lost share θ), the pair clock credits
    min(gap, 50) new starts at each discordant pair: R_1 = 1 * 2θ, R_3 = (R_1 + 2) 2θ,
    R_4 = (R_3 + 1) 2 (1 - θ); the detector is Σ w_j R_j and an agreeing pair leaves it alone."""
    total = sum(w for _, w in COMPONENTS)
    hand = [0.0, 0.0, 0.0, 0.0]
    for theta, w in COMPONENTS:
        r1 = 2 * theta
        r3 = (r1 + 2) * 2 * theta
        r4 = (r3 + 1) * 2 * (1 - theta)
        for i, r in enumerate((r1, r1, r3, r4)):
            hand[i] += w / total * r
    path = net_loss_path([1, 0, 1, -1])
    assert np.exp(path.log_detector) == pytest.approx(hand, rel=1e-12)
    state = NetLossState().update(1).update(0).update(1).update(-1)
    assert state.log_detector == pytest.approx(path.log_detector[-1], rel=1e-12)
    assert state.reset_detector().log_detector == -math.inf
    assert state.reset_detector().log_e_value == state.log_e_value


def test_detector_mean_grows_by_at_most_one_per_pair_under_no_loss() -> None:
    """Under no net loss on every discordant pair (lost and gained equally likely), E[M_n] = n
    when no gap is capped: the average of M_8 over all 2^8 all-discordant sequences is 8, which
    is what bounds the mean run length to a false alarm by the threshold (in pairs)."""
    total = 0.0
    for seq in itertools.product((1, -1), repeat=8):
        total += math.exp(run_net_loss(seq).log_detector)
    assert total / 2**8 == pytest.approx(8.0, rel=1e-12)


def test_confidence_sequence_values_by_hand() -> None:
    """One gained pair at m = 0: K = mean over the bet fractions c of (1 + c); one lost pair:
    mean of (1 - c); agreements at m = 0 multiply by 1."""
    c = BET_FRACTIONS
    assert float(within_margin_log_e_value(0, 1, 5, 0.0)) == pytest.approx(math.log(np.mean(1 + c)))
    assert float(within_margin_log_e_value(1, 0, 0, 0.0)) == pytest.approx(math.log(np.mean(1 - c)))


def test_declaration_is_never_withdrawn_under_null_consistent_continuation() -> None:
    """FLy loses nothing for a while (one lost and one gained every 50 pairs) until "within 1
    pt" is declared; then it loses exactly 1 point net (a continuation consistent with the null
    "net loss >= margin"). The confidence sequence's bound at the current counts climbs back
    above the margin (a one-look reading would withdraw the verdict) but the declaration stays
    at the pair it was made, folded pair by pair, in one fold, or found on the whole path."""
    quiet = ([1, -1] + [0] * 48) * 200  # net 0 over 10,000 pairs
    start = MarginDeclaration(margin=0.01, alpha=0.05)
    state = run_declaration(quiet, start)
    assert state.declared_at is not None
    declared = state.declared_at
    lossy = ([1, 1, -1] + [0] * 97) * 400  # net loss 1 point over 40,000 more pairs
    bounds_above = 0
    for chunk in range(0, len(lossy), 2000):
        state = run_declaration(lossy[chunk : chunk + 2000], state)
        assert state.declared_at == declared
        if net_loss_upper_sequence(state.lost, state.gained, state.agree, 0.05) > 0.01:
            bounds_above += 1
    assert bounds_above > 0
    assert declaration_path(quiet + lossy, 0.01, 0.05) == declared
    folded = start
    for x in quiet[: declared + 10]:
        folded = folded.update(x)
    assert folded.declared_at == declared


def test_confidence_sequence_covers_the_true_loss_on_simulated_streams() -> None:
    """300 streams of 5,000 pairs at a true net loss of 1 point (2 % lost, 1 % gained): the
    running bound stays above 0.01 in at least 95 % of them at every pair (anytime coverage);
    checked on the cumulative counts in one vectorised pass."""
    rng = np.random.default_rng(7)
    u = rng.random((300, 5000))
    x = np.where(u < 0.02, 1, np.where(u < 0.03, -1, 0))
    lost, gained = np.cumsum(x == 1, axis=1), np.cumsum(x == -1, axis=1)
    agree = np.arange(1, 5001) - lost - gained
    wrong = (within_margin_log_e_value(lost, gained, agree, 0.01) >= math.log(20)).any(axis=1)
    assert wrong.mean() <= 0.05


def test_first_alarms_is_the_live_fold() -> None:
    """6,000 harmless pairs (3 % lost, 3 % gained), then a 4-point loss: ``first_alarms`` gives
    the pair at which each alarm first fires, and the state the sidecar folds pair by pair
    (:class:`LiveAlarmState`) is alarmed exactly from those pairs on."""
    rng = np.random.default_rng(3)
    u = rng.random(9000)
    lost_p = np.where(np.arange(9000) < 6000, 0.03, 0.05)
    gained_p = np.where(np.arange(9000) < 6000, 0.03, 0.01)
    d = np.where(u < lost_p, 1, np.where(u < lost_p + gained_p, -1, 0)).tolist()
    settings = PairedSettings()
    got = first_alarms(d, settings)
    assert got["net_loss_change"] is not None
    assert got["net_loss_change"] > 6000
    state = LiveAlarmState.fresh(settings)
    seen: dict[str, int] = {}
    for i, x in enumerate(d, start=1):
        state = state.add([(x == 1, x == -1)] if x else [(True, True)])
        if state.net_loss.log_detector >= math.log(settings.change_arl):
            seen.setdefault("net_loss_change", i)
        if state.net_loss.log_e_value >= math.log(20):
            seen.setdefault("no_net_loss", i)
        if state.betting.log_wealth >= math.log(20):
            seen.setdefault("margin", i)
        if state.declaration.declared_at is not None:
            seen.setdefault("within_margin", i)
    for key in ("net_loss_change", "no_net_loss", "margin", "within_margin"):
        assert seen.get(key) == got[key], key
    assert first_alarms([], settings) == dict.fromkeys(got)
    with pytest.raises(ValueError, match="outcomes"):
        first_alarms([2], settings)
