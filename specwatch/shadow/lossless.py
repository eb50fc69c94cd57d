"""The lossless check in one place: the standard (speculative) arm's answer flips against the
no-speculation baseline, against the noise floor, overall and by load band (pure).

Counted on greedy paired requests where the baseline and the noise arm both answered (the
``lossless_*`` cells of :class:`~specwatch.shadow.tally.PairTally`): ``spec_only`` the standard
arm differs from the baseline and the noise arm does not, ``noise_only`` the reverse, ``both``
and ``neither``. The flip rate of an arm is the share of those pairs where it differs from the
baseline; the noise arm's rate is the floor (what a second lossless replay flips by itself).
Split by the running requests at replay, a check that flips only when the server is busy (batch
shape changing the numerics) shows where. The verdict reads the since-start e-value the
statistics already compute (``PairedSummary.lossless_e_value``) at ``1/alpha`` on at least
:data:`MIN_PAIRS` pairs, the rule of the ``SpecLosslessFlips`` alert.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from specwatch.shadow.stats.paired import FlipCounts
from specwatch.shadow.stats.sequential import e_value_alarm
from specwatch.shadow.tally import PairTally

#: Fewest lossless pairs before a verdict (the ``detect.lossless_min_pairs`` default).
MIN_PAIRS = 10

#: What the lossless verdict says (:attr:`LosslessCheck.verdict`).
LosslessVerdict = Literal["not_lossless", "no_evidence", "too_few_pairs", "no_pairs"]


def _ratio(k: int, n: int) -> float:
    return k / n if n else math.nan


@dataclass(frozen=True, slots=True)
class LosslessBand:
    """One running-request band: ``pairs`` lossless pairs, the paired flip cells, and each
    arm's flip rate against the baseline (NaN without pairs)."""

    band: str
    pairs: int
    spec_only: int
    noise_only: int
    both: int
    spec_flip_ratio: float
    noise_flip_ratio: float

    @classmethod
    def of(cls, band: str, f: FlipCounts) -> LosslessBand:
        """The band ``band`` of the cells ``f`` (``fly_only`` = the standard arm's flips)."""
        return cls(
            band=band,
            pairs=f.n,
            spec_only=f.fly_only,
            noise_only=f.noise_only,
            both=f.both,
            spec_flip_ratio=_ratio(f.fly_only + f.both, f.n),
            noise_flip_ratio=_ratio(f.noise_only + f.both, f.n),
        )


def lossless_by_load(
    tallies: Mapping[str, PairTally], labels: Sequence[str]
) -> tuple[LosslessBand, ...]:
    """One :class:`LosslessBand` per label in ``labels`` (tallies per band, as
    ``Ledger.tally_by_load`` or the report's stream gives them; absent bands count 0), then
    ``unknown`` when some lossless pairs had no running count. Pure."""
    unknown = tallies.get("unknown", PairTally()).lossless_flip_counts()
    names = [*labels, *(["unknown"] if unknown.n else [])]
    return tuple(
        LosslessBand.of(name, tallies.get(name, PairTally()).lossless_flip_counts())
        for name in names
    )


@dataclass(frozen=True, slots=True)
class LosslessCheck:
    """The check overall: ``overall`` (all bands), the noise floor ``noise_flip_ratio``,
    ``excess_flip_ratio`` = standard − floor, ``e_value`` (since start), ``alpha``, the
    ``verdict`` with its sentence ``text``, and ``bands`` (:func:`lossless_by_load`)."""

    overall: LosslessBand
    excess_flip_ratio: float
    e_value: float
    alpha: float
    min_pairs: int
    verdict: LosslessVerdict
    text: str
    bands: tuple[LosslessBand, ...]


def _pct(v: float) -> str:
    return "n/a" if math.isnan(v) else f"{100 * v:.1f} %"


def lossless_check(
    tally: PairTally,
    e_value: float,
    bands: tuple[LosslessBand, ...],
    *,
    alpha: float,
    min_pairs: int = MIN_PAIRS,
) -> LosslessCheck:
    """The :class:`LosslessCheck` of the since-start ``tally`` (all categories), its lossless
    ``e_value`` and the per-band split. Raises ``ValueError`` unless 0 < ``alpha`` < 1."""
    o = LosslessBand.of("all", tally.lossless_flip_counts())
    excess = o.spec_flip_ratio - o.noise_flip_ratio
    rates = (
        f"the standard arm flips {_pct(o.spec_flip_ratio)} of {o.pairs} greedy answers against "
        f"the baseline, the noise floor {_pct(o.noise_flip_ratio)}"
    )
    bound = f"1/α = {1 / alpha:g}"
    verdict: LosslessVerdict
    if o.pairs == 0:
        verdict = "no_pairs"
        text = (
            "no lossless check: no greedy pairs where a no-speculation baseline and the noise "
            "arm both answered (shadow.baseline and shadow.noise)"
        )
    elif o.pairs < min_pairs:
        verdict = "too_few_pairs"
        text = f"too few pairs: {o.pairs} greedy pairs (need {min_pairs}); {rates}"
    elif e_value_alarm(e_value, alpha):
        verdict = "not_lossless"
        text = f"speculation is not lossless here: {rates} (e-value {e_value:.3g} ≥ {bound})"
    else:
        verdict = "no_evidence"
        text = f"no evidence against lossless: {rates} (e-value {e_value:.3g} < {bound})"
    return LosslessCheck(o, excess, e_value, alpha, min_pairs, verdict, text, bands)
