"""``first_alarms``: the pair at which each live alarm first fires, from per-pair outcomes.

Each statistic's own first crossing (the pages and their bounds:
:func:`~specwatch.shadow.stats.policy.first_pages`): the same functions the sidecar folds pair
by pair (and rebuilds from the ledger), applied to a whole sequence, so the statistics can be
checked from outside::

    >>> from specwatch.shadow.stats import first_alarms
    >>> from specwatch.shadow.settings import PairedSettings
    >>> first_alarms([1] * 9, PairedSettings())["no_net_loss"]
    8

Outcomes: ``+1`` the candidate (FLy) lost a point on that pair, ``-1`` it gained one, ``0``
both agree (both right or both wrong).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from specwatch.shadow.stats.confseq import MarginDeclaration, declaration_path, run_declaration
from specwatch.shadow.stats.eprocess import NetLossState, check_outcomes, net_loss_path
from specwatch.shadow.stats.sequential import (
    BettingEProcess,
    betting_log_wealth,
    first_alarm,
    run_betting,
)


class AlarmSettings(Protocol):
    """What :func:`first_alarms` reads (``PairedSettings`` has it): the level ``alpha``, the
    non-inferiority ``margin``, ``detect_net_loss`` (the planning loss of the sample sizes) and
    ``change_arl`` (the detector's mean run length to a false alarm, in labelled pairs)."""

    @property
    def alpha(self) -> float: ...
    @property
    def margin(self) -> float: ...
    @property
    def detect_net_loss(self) -> float: ...
    @property
    def change_arl(self) -> float: ...


#: The alarms, in the order :func:`first_alarms` returns them.
ALARMS = ("net_loss_change", "no_net_loss", "margin", "within_margin")


def first_count_alarm(
    d: npt.NDArray[np.int64],
    log_e: Callable[[npt.NDArray[np.int64], npt.NDArray[np.int64]], npt.NDArray[np.float64]],
    alpha: float,
) -> int | None:
    """:func:`~specwatch.shadow.stats.sequential.first_alarm` of ``log_e(lost, gained)`` along
    the cumulative counts of ``d`` (+1 / -1 / 0 per pair), for an e-value of the counts alone:
    it stays put on concordant pairs, so it is evaluated only before the first pair and after
    each discordant one (the same values at the same counts), not at every pair."""
    if d.size == 0:
        return None
    moved = np.flatnonzero(d)
    lost = np.concatenate(([0], np.cumsum(d[moved] == 1)))
    gained = np.concatenate(([0], np.cumsum(d[moved] == -1)))
    hit = first_alarm(log_e(lost, gained), alpha)
    if hit is None:
        return None
    return 1 if hit == 1 else int(moved[hit - 2]) + 1


def first_alarms(
    outcomes: Sequence[int] | npt.NDArray[np.int64], settings: AlarmSettings
) -> dict[str, int | None]:
    """For each alarm the sidecar raises live, the 1-based pair of ``outcomes`` at which it
    first fires (``None`` if it never does):

    * ``net_loss_change``: the change detector (:mod:`specwatch.shadow.stats.detector`)
      reaches ``change_arl``; the live SpecQualityChange warning;
    * ``no_net_loss``: the since-start e-process
      (:func:`~specwatch.shadow.stats.eprocess.net_loss_path`) reaches ``1/alpha`` (kept for
      the record: it never forgets);
    * ``margin``: the margin e-process (testing by betting, ``net loss <= margin``) reaches
      ``1/alpha``;
    * ``within_margin``: the confidence sequence declares "within ``margin``"
      (:func:`~specwatch.shadow.stats.confseq.declaration_path`; a declaration, not an alarm).

    Raises ``ValueError`` on an outcome outside {-1, 0, 1}."""
    d = check_outcomes(np.asarray(list(outcomes), dtype=np.int64))
    alpha = settings.alpha
    if d.size == 0:
        return dict.fromkeys(ALARMS)
    path = net_loss_path(d)
    bet, _ = betting_log_wealth(d.astype(np.float64), settings.margin)
    return {
        "net_loss_change": first_alarm(path.log_detector, 1.0 / settings.change_arl),
        "no_net_loss": first_alarm(path.log_e, alpha),
        "margin": first_alarm(bet, alpha),
        "within_margin": declaration_path(d, settings.margin, alpha),
    }


@dataclass(frozen=True, slots=True)
class LiveAlarmState:
    """The order-dependent statistics the sidecar folds pair by pair (and rebuilds from the
    ledger in write order): the no-net-loss e-process with its change detector, the margin
    e-process and the "within margin" declaration. Immutable; :meth:`add` returns the state
    after more labelled pairs; ``change_arl`` is the detector's alarm level."""

    betting: BettingEProcess
    net_loss: NetLossState
    declaration: MarginDeclaration
    change_arl: float

    @classmethod
    def fresh(cls, settings: AlarmSettings) -> LiveAlarmState:
        """The state before any labelled pair."""
        return cls(
            BettingEProcess(margin=settings.margin),
            NetLossState(),
            MarginDeclaration(settings.margin, settings.alpha),
            settings.change_arl,
        )

    def add(self, outcomes: Sequence[tuple[bool, bool]]) -> LiveAlarmState:
        """After the labelled pairs ``(standard_correct, fly_correct)``, oldest first."""
        if not outcomes:
            return self
        d = [int(s) - int(f) for s, f in outcomes]
        if len(d) == 1:  # the live path: one pair at a time, scalar updates
            return LiveAlarmState(
                run_betting(outcomes, self.betting.margin, self.betting),
                self.net_loss.update(d[0]),
                self.declaration.update(d[0]),
                self.change_arl,
            )
        return LiveAlarmState(
            run_betting(outcomes, self.betting.margin, self.betting),
            net_loss_path(np.array(d, dtype=np.int64), self.net_loss).last,
            run_declaration(d, self.declaration),
            self.change_arl,
        )
