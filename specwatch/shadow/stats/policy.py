"""The alerting policy of the paired quality tests, and ``first_pages`` that replays it.

Many tests share the one critical page ``SpecQualityDrift``: the since-start no-net-loss
e-value of all pairs, the same e-value per category, and the margin e-process ("the net loss
exceeds the margin"). Each is an e-process under its null (Ville: ``P(sup_t E_t >= c) <= 1/c``),
so giving test i the page threshold ``1 / (alpha s_i)`` with shares ``Σ s_i = 1`` keeps the
chance that the page *ever* fires on harmless traffic, over the sidecar's whole life and
however often it is evaluated, at most ``alpha`` (Bonferroni on e-values; Vovk & Wang 2021,
"E-values: calibration, combination and applications", Ann. Statist. 49:1736-1754):

* ``category=_all, hypothesis=no_net_loss``: share :data:`SHARE_OVERALL` = 2/3, threshold
  ``1 / (alpha 2/3)`` = 30 at alpha = 5 %;
* ``category=<c>, hypothesis=no_net_loss``: share :data:`SHARE_CATEGORIES` / K = 0.3233 / K
  each, threshold ``K / (alpha 0.3233)`` = 680.4 at K = 11;
* ``category=_all, hypothesis=margin``: share :data:`SHARE_MARGIN` = 0.01, threshold 2000.

K is the number of category series a sidecar keeps (``shadow.max_categories`` + ``other``;
11 by default: each category series doubles as a test, so K is what the per-category page
costs, ``ln(K / (0.3233 alpha)) / ln(1 / alpha)`` of an uncorrected test's delay, 2.18x at
K = 11 and 2.39x at K = 21). The shares are set for the delays of the bench grid
(``bench/page_grid.py``, ``docs/benchmarks.md``); the margin test keeps a hundredth, as any
loss it shows (over the margin) is a net loss the no-net-loss tests page on too. The change detector
(:mod:`specwatch.shadow.stats.detector`) is not an
e-process: its false alarms come at a rate, not once. It is the warning ``SpecQualityChange``
at ``paired.change_arl`` (its mean run length to a false alarm, in labelled pairs, stated in
days at the pair rate by :meth:`PagePolicy.change_interval_days`), outside the page's budget.
The fleet page (Prometheus only) pages on the mean of the sidecars' overall e-values
(:func:`fleet_log_e_value`: a mean of e-values is an e-value) at the overall threshold.

:func:`first_pages` applies the policy to a whole sequence of ``(category, outcome)`` pairs
with the functions the sidecar folds (:mod:`specwatch.shadow.stats.eprocess`, the margin
e-process of :mod:`specwatch.shadow.stats.sequential`) and the thresholds of
:class:`PagePolicy`, the same the sidecar's evaluator and the rendered Prometheus rules use::

    >>> from specwatch.shadow.stats import first_pages
    >>> from specwatch.shadow.settings import PairedSettings
    >>> first_pages([("math", 1)] * 12, PairedSettings())[
    ...     "SpecQualityDrift{category=_all,hypothesis=no_net_loss}"]
    9
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, cast

import numpy as np

from specwatch.core.config import (
    DEFAULT_ALPHA,
    DEFAULT_CHANGE_ARL,
    DEFAULT_MARGIN,
    DEFAULT_MAX_CATEGORIES,
    OVERALL,
)
from specwatch.shadow.stats.detector import detector_alarm
from specwatch.shadow.stats.eprocess import check_outcomes, net_loss_log_e_values, net_loss_path
from specwatch.shadow.stats.sequential import alarm, betting_log_wealth, first_alarm

#: The critical page and the change warning (alert names).
PAGE = "SpecQualityDrift"
CHANGE = "SpecQualityChange"
#: The two hypotheses of the page (label ``hypothesis``).
NO_NET_LOSS = "no_net_loss"
MARGIN = "margin"

#: Shares of alpha (sum 1): the overall no-net-loss e-value, all categories together, margin.
SHARE_OVERALL = 2.0 / 3.0
SHARE_MARGIN = 0.01
SHARE_CATEGORIES = 1.0 - SHARE_OVERALL - SHARE_MARGIN

SECONDS_PER_DAY = 86_400.0


class PolicySettings(Protocol):
    """What the policy reads from the ``paired`` settings group: ``alpha`` (the page's
    family-wise level), ``margin`` and ``change_arl``."""

    @property
    def alpha(self) -> float: ...
    @property
    def margin(self) -> float: ...
    @property
    def change_arl(self) -> float: ...


@dataclass(frozen=True, slots=True)
class PagePolicy:
    """The thresholds of every page and warning (see the module docstring). ``categories``
    is K, the category series one sidecar keeps (``shadow.max_categories + 1``)."""

    alpha: float = DEFAULT_ALPHA
    margin: float = DEFAULT_MARGIN
    categories: int = DEFAULT_MAX_CATEGORIES + 1
    change_arl: float = DEFAULT_CHANGE_ARL

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 1.0:
            raise ValueError("alpha must be in (0, 1)")
        if self.categories < 1:
            raise ValueError("categories must be >= 1")
        if not self.change_arl > 1.0:
            raise ValueError("change_arl must be > 1")

    @classmethod
    def of(cls, settings: object) -> PagePolicy:
        """The policy of the ``paired`` settings group, or of a whole ``Settings`` (whose
        ``shadow.max_categories`` sets K; the default K without it)."""
        paired = cast(PolicySettings, getattr(settings, "paired", settings))
        shadow = getattr(settings, "shadow", None)
        k = getattr(shadow, "max_categories", DEFAULT_MAX_CATEGORIES) + 1
        return cls(paired.alpha, paired.margin, int(k), float(paired.change_arl))

    def share(self, category: str, hypothesis: str) -> float:
        """Test (category, hypothesis)'s share of alpha; ``ValueError`` for a test that does
        not page (the margin hypothesis pages for all pairs only)."""
        if hypothesis == NO_NET_LOSS:
            return SHARE_OVERALL if category == OVERALL else SHARE_CATEGORIES / self.categories
        if hypothesis == MARGIN and category == OVERALL:
            return SHARE_MARGIN
        raise ValueError(f"no page for hypothesis {hypothesis!r} in category {category!r}")

    def test_alpha(self, category: str, hypothesis: str) -> float:
        """The test's own level ``alpha x share``: it pages at ``E >= 1 / test_alpha``."""
        return self.alpha * self.share(category, hypothesis)

    def level(self, category: str, hypothesis: str) -> float:
        """The e-value at or over which the test pages: ``1 / (alpha share)``."""
        return 1.0 / self.test_alpha(category, hypothesis)

    def log_level(self, category: str, hypothesis: str) -> float:
        """``ln`` of :meth:`level`."""
        return -math.log(self.test_alpha(category, hypothesis))

    def pages(self, category: str, hypothesis: str, log_e: float) -> bool:
        """Whether a since-start e-value ``ln E = log_e`` fires the page (NaN never does)."""
        return alarm(log_e, self.test_alpha(category, hypothesis))

    def change_fires(self, log_detector: float) -> bool:
        """Whether the change detector's ``ln M`` reaches ``change_arl`` (the warning)."""
        return detector_alarm(log_detector, self.change_arl)

    def change_interval_days(self, pairs_per_second: float) -> float | None:
        """The change warning's mean interval between false alarms in days at a labelled-pair
        rate (at least this long: ``change_arl`` pairs); ``None`` without pairs."""
        if not pairs_per_second > 0.0:
            return None
        return self.change_arl / pairs_per_second / SECONDS_PER_DAY


def page_key(alert: str, labels: dict[str, str]) -> str:
    """``Alert{name=value,...}`` with the labels sorted (the keys of :func:`first_pages`)."""
    inner = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return f"{alert}{{{inner}}}"


def fleet_log_e_value(log_e_values: Iterable[float]) -> float | None:
    """``ln`` of the mean of the sidecars' e-values (each sidecar once): an e-value for the
    fleet (a mean of e-values is one, whatever their dependence); ``None`` without any."""
    v = np.asarray(list(log_e_values), dtype=np.float64)
    if v.size == 0:
        return None
    m = float(np.max(v))
    if not math.isfinite(m):
        return m
    return m + math.log(float(np.mean(np.exp(v - m))))


def first_pages(
    pairs: Sequence[tuple[str, int]] | Iterable[tuple[str, int]], settings: object
) -> dict[str, int | None]:
    """For each page and warning the policy raises on ``pairs``, the 1-based index of the pair
    at which it first fires (``None`` if it never does).

    ``pairs``: ``(category, outcome)`` in arrival order, outcome ``+1`` FLy lost a point on
    that pair, ``-1`` it gained one, ``0`` both agree. ``settings``: the ``paired`` settings
    group or a whole ``Settings`` (:meth:`PagePolicy.of`). Keys (:func:`page_key`):
    ``SpecQualityDrift{category=_all,hypothesis=no_net_loss}``, one
    ``SpecQualityDrift{category=<c>,hypothesis=no_net_loss}`` per category in ``pairs``,
    ``SpecQualityDrift{category=_all,hypothesis=margin}`` and
    ``SpecQualityChange{category=_all}``. Categories are taken as given (at most K of them keep
    the policy's bound). Raises ``ValueError`` on an outcome outside {-1, 0, 1} or a category
    named ``_all``."""
    policy = PagePolicy.of(settings)
    got = list(pairs)
    cats = [str(c) for c, _ in got]
    if OVERALL in cats:
        raise ValueError(f"category {OVERALL!r} is the sum of all categories, not one")
    x = check_outcomes(np.fromiter((int(v) for _, v in got), dtype=np.int64, count=len(got)))
    out: dict[str, int | None] = {}
    all_key = {"category": OVERALL, "hypothesis": NO_NET_LOSS}
    margin_key = {"category": OVERALL, "hypothesis": MARGIN}
    change_key = {"category": OVERALL}
    if x.size == 0:
        for alert, labels in ((PAGE, all_key), (PAGE, margin_key), (CHANGE, change_key)):
            out[page_key(alert, labels)] = None
        return out
    path = net_loss_path(x)
    out[page_key(PAGE, all_key)] = first_alarm(path.log_e, policy.test_alpha(OVERALL, NO_NET_LOSS))
    names = np.array(cats, dtype=object)
    for cat in sorted(set(cats)):
        idx = np.flatnonzero(names == cat)
        hit = first_alarm(net_loss_log_e_values(x[idx]), policy.test_alpha(cat, NO_NET_LOSS))
        key = page_key(PAGE, {"category": cat, "hypothesis": NO_NET_LOSS})
        out[key] = None if hit is None else int(idx[hit - 1]) + 1
    bet, _ = betting_log_wealth(x.astype(np.float64), policy.margin)
    out[page_key(PAGE, margin_key)] = first_alarm(bet, policy.test_alpha(OVERALL, MARGIN))
    out[page_key(CHANGE, change_key)] = first_alarm(path.log_detector, 1.0 / policy.change_arl)
    return out
