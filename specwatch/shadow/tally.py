"""Row → tally: the one table of predicates that turns a stored pair into :class:`PairTally` counts.

:data:`TALLY_RULES` maps every :class:`PairTally` field to a conjunction of column conditions on a
ledger
row. The Python path (:func:`row_tally`, :func:`tally_rows`, :func:`window_tallies`) evaluates the
table
on row objects; :mod:`specwatch.shadow.ledger` renders the same table into SQL (``SUM(CASE WHEN
…)``), so
the two paths cannot drift. :data:`LABELLED` is the rule for a pair that feeds the correctness
statistics
and the e-processes: paired, with both the standard's and FLy's correctness known.
"""

from __future__ import annotations

import enum
import functools
import itertools
import math
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Protocol

from specwatch.shadow.stats.paired import FlipCounts, PairedCounts


class Cell(enum.Enum):
    """A condition value that is not a constant: ``NOT_NULL`` matches any known value."""

    NOT_NULL = "not null"


#: One condition: ``(column, value)``; ``value`` is a status string, a bool, or
#: :attr:`Cell.NOT_NULL`.
Condition = tuple[str, str | bool | Cell]
#: A conjunction of conditions (all must hold).
Rule = tuple[Condition, ...]

_PAIRED: Rule = (("status", "paired"),)

#: Labelled pair: paired, both arms' correctness known (canary items with a gold answer).
LABELLED: Rule = (*_PAIRED, ("standard_correct", Cell.NOT_NULL), ("fly_correct", Cell.NOT_NULL))


def _correctness(prefix: str, other: str) -> dict[str, Rule]:
    cells = {"both_correct": (True, True), "lost": (True, False), "gained": (False, True)}
    cells["both_wrong"] = (False, False)
    return {
        prefix + name: (*_PAIRED, ("standard_correct", s), (other, o))
        for name, (s, o) in cells.items()
    }


#: ``PairTally`` field → the condition a row must meet to count 1 in it (fields not met count 0).
TALLY_RULES: Mapping[str, Rule] = {
    **_correctness("", "fly_correct"),
    **_correctness("noise_", "noise_correct"),
    "agree": (*_PAIRED, ("fly_agrees", True)),
    "disagree": (*_PAIRED, ("fly_agrees", False)),
    "noise_agree": (*_PAIRED, ("noise_agrees", True)),
    "noise_disagree": (*_PAIRED, ("noise_agrees", False)),
    "flip_fly_only": (*_PAIRED, ("fly_agrees", False), ("noise_agrees", True)),
    "flip_noise_only": (*_PAIRED, ("fly_agrees", True), ("noise_agrees", False)),
    "flip_both": (*_PAIRED, ("fly_agrees", False), ("noise_agrees", False)),
    "flip_neither": (*_PAIRED, ("fly_agrees", True), ("noise_agrees", True)),
    "baseline_agree": (*_PAIRED, ("greedy", True), ("baseline_agrees", True)),
    "baseline_disagree": (*_PAIRED, ("greedy", True), ("baseline_agrees", False)),
    **{
        "lossless_" + name: (
            *_PAIRED,
            ("greedy", True),
            ("baseline_agrees", std_agrees),
            ("noise_baseline_agrees", noise_agrees),
        )
        for name, (std_agrees, noise_agrees) in {
            "spec_only": (False, True),
            "noise_only": (True, False),
            "both": (False, False),
            "neither": (True, True),
        }.items()
    },
    "unpaired": (("status", "unpaired"),),
    "excluded": (("status", "excluded"),),
}


@dataclass(frozen=True, slots=True)
class PairTally:
    """Counts over a set of ledger rows (one window and category).

    FLy versus standard on labelled pairs: ``both_correct, lost, gained, both_wrong``; the noise
    arm versus standard on labelled pairs: ``noise_*``; answer agreement with the standard arm on
    all paired rows: ``agree, disagree`` (FLy) and ``noise_agree, noise_disagree``; the paired
    flip table on rows where the noise arm answered: ``flip_fly_only, flip_noise_only,
    flip_both, flip_neither``; the lossless check on greedy paired rows with a baseline arm
    (no speculation): the standard arm's agreement with it ``baseline_agree, baseline_disagree``
    and the paired flip table against the baseline, standard arm versus noise arm,
    ``lossless_spec_only, lossless_noise_only, lossless_both, lossless_neither``; plus
    ``unpaired`` and ``excluded`` rows.
    """

    both_correct: int = 0
    lost: int = 0
    gained: int = 0
    both_wrong: int = 0
    noise_both_correct: int = 0
    noise_lost: int = 0
    noise_gained: int = 0
    noise_both_wrong: int = 0
    agree: int = 0
    disagree: int = 0
    noise_agree: int = 0
    noise_disagree: int = 0
    flip_fly_only: int = 0
    flip_noise_only: int = 0
    flip_both: int = 0
    flip_neither: int = 0
    baseline_agree: int = 0
    baseline_disagree: int = 0
    lossless_spec_only: int = 0
    lossless_noise_only: int = 0
    lossless_both: int = 0
    lossless_neither: int = 0
    unpaired: int = 0
    excluded: int = 0

    def __add__(self, other: PairTally) -> PairTally:
        return PairTally(*map(operator.add, _pair_values(self), _pair_values(other)))

    def __sub__(self, other: PairTally) -> PairTally:
        return PairTally(*map(operator.sub, _pair_values(self), _pair_values(other)))

    def paired_counts(self) -> PairedCounts:
        """FLy vs standard correctness table."""
        return PairedCounts(self.both_correct, self.lost, self.gained, self.both_wrong)

    def noise_paired_counts(self) -> PairedCounts:
        """Noise arm vs standard correctness table (an A/A comparison)."""
        return PairedCounts(
            self.noise_both_correct, self.noise_lost, self.noise_gained, self.noise_both_wrong
        )

    def lossless_flip_counts(self) -> FlipCounts:
        """Standard-arm and noise-arm flips against the no-speculation baseline, paired (greedy
        requests only): ``fly_only`` here counts the standard (speculative) arm's flips."""
        return FlipCounts(
            self.lossless_spec_only,
            self.lossless_noise_only,
            self.lossless_both,
            self.lossless_neither,
        )

    def flip_counts(self) -> FlipCounts:
        """FLy and noise flips on the same requests."""
        return FlipCounts(
            self.flip_fly_only, self.flip_noise_only, self.flip_both, self.flip_neither
        )

    @property
    def paired(self) -> int:
        """Rows where standard and FLy both answered."""
        return self.agree + self.disagree


_pair_values: Callable[[PairTally], tuple[int, ...]] = operator.attrgetter(
    *(f.name for f in fields(PairTally))
)


#: The ``specwatch_shadow_pairs_total{outcome}`` labels per arm, each with the tally field it
#: counts: correctness outcomes on labelled pairs, agreement outcomes on every paired row.
ARM_LABELS: Mapping[str, Mapping[str, str]] = {
    arm: {
        label: (label if arm == "fly" else "noise_" + label)
        for label in ("both_correct", "lost", "gained", "both_wrong", "agree", "disagree")
    }
    for arm in ("fly", "noise")
}


def arm_label_counts(tally: PairTally) -> Iterator[tuple[str, str, int]]:
    """``(arm, outcome label, count)`` for every non-zero per-arm count of ``tally``."""
    for arm, labels in ARM_LABELS.items():
        for label, name in labels.items():
            n: int = getattr(tally, name)
            if n:
                yield arm, label, n


class TallyRow(Protocol):
    """What the rules read from a row (``LedgerRow`` has all of it)."""

    @property
    def time(self) -> float: ...
    @property
    def category(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def standard_correct(self) -> bool | None: ...
    @property
    def fly_correct(self) -> bool | None: ...
    @property
    def noise_correct(self) -> bool | None: ...
    @property
    def fly_agrees(self) -> bool | None: ...
    @property
    def noise_agrees(self) -> bool | None: ...
    @property
    def greedy(self) -> bool | None: ...
    @property
    def baseline_agrees(self) -> bool | None: ...
    @property
    def noise_baseline_agrees(self) -> bool | None: ...


def matches(row: TallyRow, rule: Rule) -> bool:
    """True when every condition of ``rule`` holds for ``row`` (a bool condition needs exactly that
    bool, so ``None`` never matches ``True`` or ``False``)."""
    for column, want in rule:
        got = getattr(row, column)
        if want is Cell.NOT_NULL:
            if got is None:
                return False
        elif got is None or got != want:
            return False
    return True


def row_tally(row: TallyRow) -> PairTally:
    """The :class:`PairTally` of one row: 1 in every field whose rule in :data:`TALLY_RULES` it
    meets (remembered per combination of the columns the rules read)."""
    return _pattern_tally(_rule_values(row))


#: The columns :data:`TALLY_RULES` read, in a fixed order.
_RULE_COLUMNS: tuple[str, ...] = tuple(
    dict.fromkeys(c for rule in TALLY_RULES.values() for c, _ in rule)
)
_rule_values: Callable[[TallyRow], tuple[object, ...]] = operator.attrgetter(*_RULE_COLUMNS)


@functools.lru_cache(maxsize=4096)
def _pattern_tally(values: tuple[object, ...]) -> PairTally:
    got = dict(zip(_RULE_COLUMNS, values, strict=True))
    return PairTally(
        **{
            name: 1
            for name, rule in TALLY_RULES.items()
            if all(_holds(got[c], want) for c, want in rule)
        }
    )


def _holds(got: object, want: str | bool | Cell) -> bool:
    if want is Cell.NOT_NULL:
        return got is not None
    return got is not None and got == want


def labelled_outcome(row: TallyRow) -> tuple[bool, bool] | None:
    """``(standard_correct, fly_correct)`` for a :data:`LABELLED` row, else ``None``."""
    if not matches(row, LABELLED):
        return None
    return bool(row.standard_correct), bool(row.fly_correct)


def tally_rows(rows: Iterable[TallyRow]) -> dict[str, PairTally]:
    """Per-category :class:`PairTally` of ``rows`` (the same table ``Ledger.tally`` renders as
    SQL)."""
    out: dict[str, PairTally] = {}
    for r in rows:
        out[r.category] = out.get(r.category, PairTally()) + row_tally(r)
    return out


def window_tallies(
    rows: Sequence[TallyRow], now: float, windows: Mapping[str, float | None]
) -> dict[str, dict[str, PairTally]]:
    """``{window: {category: tally}}`` for rows with ``now - seconds <= time <= now``
    (``None`` seconds = every row, e.g. ``since_start``)."""
    return {
        name: tally_rows(r for r in rows if secs is None or now - secs <= r.time <= now)
        for name, secs in windows.items()
    }


def load_band_labels(bands: Sequence[int]) -> tuple[str, ...]:
    """Labels of the running-request bands with lower bounds ``bands`` (``0, 8, 32`` ->
    ``0-7``, ``8-31``, ``32+``)."""
    out = [f"{lo}-{hi - 1}" for lo, hi in itertools.pairwise(bands)]
    return (*out, f"{bands[-1]}+")


#: The band of a pair whose running count was not known at replay time.
UNKNOWN_BAND = "unknown"


@dataclass(frozen=True, slots=True)
class ArmTotals:
    """Per-request speed and speculation sums over paired rows (one window and category).

    ``tau_pairs`` rows where both the standard and FLy arm returned per-request
    speculative-decoding counts with at least one verify step, with each arm's summed verify
    steps and accepted draft tokens (``standard_steps`` / ``standard_accepted``, ``fly_steps`` /
    ``fly_accepted``: τ is summed, never averaged); ``speed_pairs`` rows
    where both arms reported completion tokens and a latency, with token sums and latency sums
    (seconds); ``decode_pairs`` rows both arms streamed, with per arm the tokens after the
    first ``T``, the seconds after the first output ``S`` and the time to it, summed, and the
    spread sums ``ΣT²`` (``*_decode_tokens_sq``), ``ΣT·S`` (``*_decode_cross``) and ``ΣS²``
    (``*_decode_seconds_sq``) the decode interval needs (:func:`arm_decode_intervals`).
    Additive, so categories can be pooled.
    """

    tau_pairs: int = 0
    standard_steps: int = 0
    standard_accepted: int = 0
    fly_steps: int = 0
    fly_accepted: int = 0
    speed_pairs: int = 0
    standard_tokens: int = 0
    fly_tokens: int = 0
    standard_seconds: float = 0.0
    fly_seconds: float = 0.0
    decode_pairs: int = 0
    standard_decode_tokens: int = 0
    fly_decode_tokens: int = 0
    standard_decode_seconds: float = 0.0
    fly_decode_seconds: float = 0.0
    standard_ttft_seconds: float = 0.0
    fly_ttft_seconds: float = 0.0
    standard_decode_tokens_sq: int = 0
    fly_decode_tokens_sq: int = 0
    standard_decode_cross: float = 0.0
    fly_decode_cross: float = 0.0
    standard_decode_seconds_sq: float = 0.0
    fly_decode_seconds_sq: float = 0.0

    def __add__(self, other: ArmTotals) -> ArmTotals:
        return ArmTotals(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )


#: Paired requests with tokens and latency on both arms needed before a throughput gain is
#: reported (fewer: the gain is ``None`` with a reason).
MIN_SPEED_PAIRS = 5


def arm_tau_means(t: ArmTotals) -> tuple[float, float] | None:
    """``(standard, FLy)`` acceptance length τ over the pairs where both arms reported verify
    steps: per arm ``1 + accepted / steps`` of the summed counts (a long reply weighs by its
    steps; the per-request τ values are never averaged); ``None`` without such pairs."""
    if t.tau_pairs <= 0 or t.standard_steps <= 0 or t.fly_steps <= 0:
        return None
    return 1.0 + t.standard_accepted / t.standard_steps, 1.0 + t.fly_accepted / t.fly_steps


def arm_speeds(t: ArmTotals) -> tuple[float, float] | None:
    """``(standard, FLy)`` generation speed per request, tokens ÷ latency summed over the pairs
    where both arms reported tokens and a latency (so equal requests on both arms); ``None``
    below :data:`MIN_SPEED_PAIRS` such pairs or when an arm generated nothing in no time."""
    if t.speed_pairs < MIN_SPEED_PAIRS:
        return None
    if t.standard_tokens <= 0 or t.fly_seconds <= 0 or t.standard_seconds <= 0:
        return None
    return t.standard_tokens / t.standard_seconds, t.fly_tokens / t.fly_seconds


class ArmRow(TallyRow, Protocol):
    """What :func:`row_arm_sums` and :func:`row_band` read from a row (``LedgerRow`` has it)."""

    @property
    def standard_spec_steps(self) -> int | None: ...
    @property
    def standard_accepted_tokens(self) -> int | None: ...
    @property
    def fly_spec_steps(self) -> int | None: ...
    @property
    def fly_accepted_tokens(self) -> int | None: ...
    @property
    def standard_tokens(self) -> int | None: ...
    @property
    def fly_tokens(self) -> int | None: ...
    @property
    def standard_first_token_seconds(self) -> float | None: ...
    @property
    def standard_last_token_seconds(self) -> float | None: ...
    @property
    def fly_first_token_seconds(self) -> float | None: ...
    @property
    def fly_last_token_seconds(self) -> float | None: ...
    @property
    def standard_latency_seconds(self) -> float | None: ...
    @property
    def fly_latency_seconds(self) -> float | None: ...
    @property
    def running_at_replay(self) -> float | None: ...


#: Fixed-point scale of the float sums the live statistics keep (τ, seconds): each value is
#: counted as ``int(value * 1e9 + 0.5)`` (SQL: ``CAST(value * 1e9 + 0.5 AS INTEGER)``, the same
#: IEEE operations), so sums are exact integers whatever order or grouping they are added in.
FIXED_POINT = 1e9


def fixed(value: float) -> int:
    """``value`` in units of ``1 / FIXED_POINT`` (truncating ``value * 1e9 + 0.5``, as SQLite's
    ``CAST … AS INTEGER`` does)."""
    return int(value * FIXED_POINT + 0.5)


@dataclass(frozen=True, slots=True)
class ArmSums:
    """:class:`ArmTotals` kept exactly: the counts and token sums as they are, the seconds
    sums in fixed point (:data:`FIXED_POINT`). Additive and subtractable."""

    tau_pairs: int = 0
    standard_steps: int = 0
    standard_accepted: int = 0
    fly_steps: int = 0
    fly_accepted: int = 0
    speed_pairs: int = 0
    standard_tokens: int = 0
    fly_tokens: int = 0
    standard_seconds: int = 0
    fly_seconds: int = 0
    decode_pairs: int = 0
    standard_decode_tokens: int = 0
    fly_decode_tokens: int = 0
    standard_decode_seconds: int = 0
    fly_decode_seconds: int = 0
    standard_ttft_seconds: int = 0
    fly_ttft_seconds: int = 0
    standard_decode_tokens_sq: int = 0
    fly_decode_tokens_sq: int = 0
    standard_decode_cross: int = 0
    fly_decode_cross: int = 0
    standard_decode_seconds_sq: int = 0
    fly_decode_seconds_sq: int = 0

    def __add__(self, other: ArmSums) -> ArmSums:
        return ArmSums(*map(operator.add, _arm_values(self), _arm_values(other)))

    def __sub__(self, other: ArmSums) -> ArmSums:
        return ArmSums(*map(operator.sub, _arm_values(self), _arm_values(other)))

    def totals(self) -> ArmTotals:
        """The :class:`ArmTotals` (fixed-point sums divided back to floats)."""
        return ArmTotals(
            tau_pairs=self.tau_pairs,
            standard_steps=self.standard_steps,
            standard_accepted=self.standard_accepted,
            fly_steps=self.fly_steps,
            fly_accepted=self.fly_accepted,
            speed_pairs=self.speed_pairs,
            standard_tokens=self.standard_tokens,
            fly_tokens=self.fly_tokens,
            standard_seconds=self.standard_seconds / FIXED_POINT,
            fly_seconds=self.fly_seconds / FIXED_POINT,
            decode_pairs=self.decode_pairs,
            standard_decode_tokens=self.standard_decode_tokens,
            fly_decode_tokens=self.fly_decode_tokens,
            standard_decode_seconds=self.standard_decode_seconds / FIXED_POINT,
            fly_decode_seconds=self.fly_decode_seconds / FIXED_POINT,
            standard_ttft_seconds=self.standard_ttft_seconds / FIXED_POINT,
            fly_ttft_seconds=self.fly_ttft_seconds / FIXED_POINT,
            standard_decode_tokens_sq=self.standard_decode_tokens_sq,
            fly_decode_tokens_sq=self.fly_decode_tokens_sq,
            standard_decode_cross=self.standard_decode_cross / FIXED_POINT,
            fly_decode_cross=self.fly_decode_cross / FIXED_POINT,
            standard_decode_seconds_sq=self.standard_decode_seconds_sq / FIXED_POINT,
            fly_decode_seconds_sq=self.fly_decode_seconds_sq / FIXED_POINT,
        )


_arm_values: Callable[[ArmSums], tuple[int, ...]] = operator.attrgetter(
    *(f.name for f in fields(ArmSums))
)


def row_arm_sums(row: ArmRow) -> ArmSums:
    """The :class:`ArmSums` of one row: the same conditions ``Ledger.arm_totals`` renders as
    SQL (τ counts on paired rows with verify steps on both arms; speed on paired rows with both
    arms' tokens and a latency above 0 on both)."""
    if row.status != "paired":
        return ArmSums()
    tau: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)
    ss, fs = row.standard_spec_steps, row.fly_spec_steps
    sa, fa = row.standard_accepted_tokens, row.fly_accepted_tokens
    if ss is not None and fs is not None and sa is not None and fa is not None and ss > 0 < fs:
        tau = (1, ss, sa, fs, fa)
    speed = (0, 0, 0, 0, 0)
    st, ft = row.standard_tokens, row.fly_tokens
    sl, fl = row.standard_latency_seconds, row.fly_latency_seconds
    if st is not None and ft is not None and sl is not None and fl is not None and sl > 0 < fl:
        speed = (1, st, ft, fixed(sl), fixed(fl))
    return ArmSums(*tau, *speed) + _decode_sums(row)


def _decode_sums(row: ArmRow) -> ArmSums:
    """The decode part of :func:`row_arm_sums` (``ARM_DECODE`` in SQL): both arms streamed at
    least two tokens with a last output after the first; tokens after the first, the seconds
    after the first output and the time to it, per arm."""
    st, ft = row.standard_tokens, row.fly_tokens
    s1, sn = row.standard_first_token_seconds, row.standard_last_token_seconds
    f1, fn = row.fly_first_token_seconds, row.fly_last_token_seconds
    if st is None or ft is None or s1 is None or sn is None or f1 is None or fn is None:
        return ArmSums()
    if st < 2 or ft < 2 or not (sn > s1 and fn > f1):
        return ArmSums()
    s_tok, f_tok, s_sec, f_sec = st - 1, ft - 1, sn - s1, fn - f1
    return ArmSums(
        decode_pairs=1,
        standard_decode_tokens=s_tok,
        fly_decode_tokens=f_tok,
        standard_decode_seconds=fixed(s_sec),
        fly_decode_seconds=fixed(f_sec),
        standard_ttft_seconds=fixed(s1),
        fly_ttft_seconds=fixed(f1),
        standard_decode_tokens_sq=s_tok * s_tok,
        fly_decode_tokens_sq=f_tok * f_tok,
        standard_decode_cross=fixed(s_tok * s_sec),
        fly_decode_cross=fixed(f_tok * f_sec),
        standard_decode_seconds_sq=fixed(s_sec * s_sec),
        fly_decode_seconds_sq=fixed(f_sec * f_sec),
    )


#: The two-sided 95 % normal quantile (the decode intervals' ``z``).
Z_95 = 1.959963984540054


def ratio_interval(
    n: int, t: float, s: float, tt: float, ts: float, ss: float, z: float = Z_95
) -> tuple[float, float] | None:
    """The two-sided interval (normal, ``z`` = 1.96: 95 %) of the ratio of sums ``R = t / s``
    over ``n`` pairs (decode tokens ÷ decode seconds), by the delta method: the variance of
    ``R`` is ``Σ(T_i − R·S_i)² / ((n − 1) · n · S̄²)``, from the sums ``t = ΣT``, ``s = ΣS``,
    ``tt = ΣT²``, ``ts = ΣT·S``, ``ss = ΣS²``. ``None`` below 2 pairs or without seconds."""
    if n < 2 or s <= 0:
        return None
    r = t / s
    resid = max(tt - 2.0 * r * ts + r * r * ss, 0.0)
    mean_s = s / n
    half = z * math.sqrt(resid / ((n - 1) * n)) / mean_s
    return r - half, r + half


def arm_decode(t: ArmTotals) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """``((standard, FLy) decode tokens/s, (standard, FLy) mean TTFT seconds)`` over the pairs
    where both arms streamed (:func:`row_arm_sums`' decode condition): tokens after the first ÷
    seconds after the first output, summed, so TTFT is never in the speed; from the first such
    pair. ``None`` without one."""
    if t.decode_pairs <= 0 or t.standard_decode_seconds <= 0 or t.fly_decode_seconds <= 0:
        return None
    speeds = (
        t.standard_decode_tokens / t.standard_decode_seconds,
        t.fly_decode_tokens / t.fly_decode_seconds,
    )
    ttft = (t.standard_ttft_seconds / t.decode_pairs, t.fly_ttft_seconds / t.decode_pairs)
    return speeds, ttft


def arm_decode_intervals(
    t: ArmTotals,
) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
    """``(standard, FLy)`` 95 % intervals of the decode tokens/s of :func:`arm_decode`, each by
    :func:`ratio_interval` over the pairs both arms streamed (the delta method on the ratio of
    sums); ``None`` each below 2 such pairs. The one computation the report, the decision
    table (snapshot, view, ``/metrics``) and the verdict read."""
    n = t.decode_pairs
    return (
        ratio_interval(
            n,
            t.standard_decode_tokens,
            t.standard_decode_seconds,
            t.standard_decode_tokens_sq,
            t.standard_decode_cross,
            t.standard_decode_seconds_sq,
        ),
        ratio_interval(
            n,
            t.fly_decode_tokens,
            t.fly_decode_seconds,
            t.fly_decode_tokens_sq,
            t.fly_decode_cross,
            t.fly_decode_seconds_sq,
        ),
    )


def row_band(running: float | None, bands: Sequence[int]) -> str:
    """The running-request band label of a row (the same ``CASE`` as ``Ledger.tally_by_load``):
    the highest lower bound of ``bands`` at or below ``running``; :data:`UNKNOWN_BAND` when the
    count is not known (or below the first bound)."""
    if running is None:
        return UNKNOWN_BAND
    for lo, label in _bands_high_first(tuple(bands)):
        if running >= lo:
            return label
    return UNKNOWN_BAND


@functools.lru_cache(maxsize=64)
def _bands_high_first(bands: tuple[int, ...]) -> tuple[tuple[int, str], ...]:
    return tuple(reversed(list(zip(bands, load_band_labels(bands), strict=True))))


@dataclass(frozen=True, slots=True)
class HistoryCell:
    """What the live statistics keep per (time bucket, category, load band): the
    :class:`PairTally`, the :class:`ArmSums` and the number of ledger ``rows``. Additive and
    subtractable (a window is a running sum of cells)."""

    tally: PairTally = PairTally()
    arms: ArmSums = ArmSums()
    rows: int = 0

    def __add__(self, other: HistoryCell) -> HistoryCell:
        return HistoryCell(self.tally + other.tally, self.arms + other.arms, self.rows + other.rows)

    def __sub__(self, other: HistoryCell) -> HistoryCell:
        return HistoryCell(self.tally - other.tally, self.arms - other.arms, self.rows - other.rows)


def sum_cells(cells: Sequence[HistoryCell]) -> HistoryCell:
    """The sum of ``cells`` (``HistoryCell()`` for none), equal to adding them one by one with
    ``+`` (exact integers), in one ``sum`` per field instead of one object per addition."""
    tallies = [c.tally for c in cells]
    arms = [c.arms for c in cells]
    return HistoryCell(
        PairTally(*(sum(map(get, tallies)) for get in _PAIR_FIELDS)),
        ArmSums(*(sum(map(get, arms)) for get in _ARM_FIELDS)),
        sum(c.rows for c in cells),
    )


_PAIR_FIELDS = tuple(operator.attrgetter(f.name) for f in fields(PairTally))
_ARM_FIELDS = tuple(operator.attrgetter(f.name) for f in fields(ArmSums))


def row_cell(row: ArmRow) -> HistoryCell:
    """The :class:`HistoryCell` of one ledger row (:func:`row_tally`, :func:`row_arm_sums`,
    one row)."""
    return HistoryCell(row_tally(row), row_arm_sums(row), 1)
