"""The first crossings computed only where the statistics move (after discordant pairs, in
chunks that stop at the first declaration) are those of the whole paths evaluated at every
pair, as the paths were computed before: the counts-only e-value and the "within margin"
declaration."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest

from specwatch.shadow.stats.alarms import first_count_alarm
from specwatch.shadow.stats.confseq import declaration_path, within_margin_log_e_value
from specwatch.shadow.stats.sequential import (
    beta_binomial_log_e_values,
    first_alarm,
)


def _stream(seed: int, n: int, lost: float, gained: float) -> npt.NDArray[np.int64]:
    """``n`` outcomes: +1 with probability ``lost``, -1 with ``gained``, else 0."""
    u = np.random.default_rng(seed).random(n)
    return np.where(u < lost, 1, np.where(u < lost + gained, -1, 0)).astype(np.int64)


STREAMS = [
    _stream(1, 20_000, 0.03, 0.01),  # a loss: the e-values cross
    _stream(2, 20_000, 0.02, 0.02),  # no loss: they do not
    _stream(3, 30_000, 0.002, 0.004),  # a gain at low discordance: "within margin" declared
    np.array([1, 1, 1, 1, 1, 1, 1, 1, 1, 1], dtype=np.int64),  # crossing on the first pairs
    np.zeros(50, dtype=np.int64),
    np.zeros(0, dtype=np.int64),
]


@pytest.mark.parametrize("d", STREAMS)
@pytest.mark.parametrize("alpha", [0.05, 0.2])
def test_counts_only_crossing_equals_the_whole_path(d: npt.NDArray[np.int64], alpha: float) -> None:
    """:func:`first_count_alarm` gives the first pair at which the whole path at every pair's
    cumulative counts crosses, for the counts-only beta-binomial e-value."""
    lost, gained = np.cumsum(d == 1), np.cumsum(d == -1)
    whole = first_alarm(beta_binomial_log_e_values(lost, gained), alpha) if d.size else None
    assert first_count_alarm(d, beta_binomial_log_e_values, alpha) == whole


@pytest.mark.parametrize("d", STREAMS)
def test_declaration_equals_the_whole_path(d: npt.NDArray[np.int64]) -> None:
    """The chunked declaration (stopping at the first hit) is the first pair of the whole
    ``ln K`` path at the threshold."""
    lost, gained = np.cumsum(d == 1), np.cumsum(d == -1)
    agree = np.arange(1, d.size + 1) - lost - gained
    for margin in (0.01, 0.03):
        log_k = within_margin_log_e_value(lost, gained, agree, margin)
        hit = np.flatnonzero(log_k >= -math.log(0.05))
        want = int(hit[0]) + 1 if hit.size else None
        assert declaration_path(d, margin, 0.05) == want
