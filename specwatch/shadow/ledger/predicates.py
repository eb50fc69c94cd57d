"""The row predicates of :mod:`specwatch.shadow.tally` as SQL over the ``pairs`` table: each
tally rule as a condition, the labelled-pair rule, the conditions of the τ and speed arm sums,
fixed-point rounding, running-request bands, and the status and columns a packed row carries
(the report stream's key and the stored sums' pattern code)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from specwatch.shadow.ledger.rows import COLUMNS
from specwatch.shadow.tally import (
    FIXED_POINT,
    LABELLED,
    TALLY_RULES,
    UNKNOWN_BAND,
    Cell,
    Rule,
    load_band_labels,
)


def _condition_sql(column: str, want: str | bool | Cell) -> str:
    if column not in COLUMNS:
        raise ValueError(f"tally rule names an unknown column {column!r}")
    if want is Cell.NOT_NULL:
        return f"{column} IS NOT NULL"
    if isinstance(want, bool):
        return f"{column} = {int(want)}"
    return f"{column} = '{want}'"


def rule_sql(rule: Rule) -> str:
    """One :mod:`specwatch.shadow.tally` rule as an SQL condition over the ``pairs`` table."""
    return " AND ".join(_condition_sql(c, v) for c, v in rule)


#: SQL condition per PairTally field, rendered from the one table in shadow/tally.py.
TALLY_SQL: Mapping[str, str] = {name: rule_sql(rule) for name, rule in TALLY_RULES.items()}
#: The labelled-pair rule (:data:`~specwatch.shadow.tally.LABELLED`) as an SQL condition.
LABELLED_SQL = rule_sql(LABELLED)


#: What one packed row carries, for both packed forms (the report stream's key and the stored
#: sums' pattern code): its status among these (any other value is one more code), and the
#: columns the tally rules read besides ``status``, each true, false or unknown.
STATUSES: tuple[str, ...] = ("paired", "unpaired", "excluded")
TRI_COLUMNS: tuple[str, ...] = tuple(
    dict.fromkeys(c for rule in (*TALLY_RULES.values(), LABELLED) for c, _ in rule if c != "status")
)


#: The rows the τ sums of :class:`~specwatch.shadow.tally.ArmSums` add up, and those the speed
#: sums add up.
ARM_TAU = (
    "status = 'paired' AND standard_spec_steps > 0 AND fly_spec_steps > 0 "
    "AND standard_accepted_tokens IS NOT NULL AND fly_accepted_tokens IS NOT NULL"
)
ARM_SPEED = (
    "status = 'paired' AND standard_tokens IS NOT NULL AND fly_tokens IS NOT NULL "
    "AND standard_latency_seconds > 0 AND fly_latency_seconds > 0"
)


#: The rows the decode sums add up: both arms streamed two tokens or more, the last output
#: after the first (TTFT and decode time told apart).
ARM_DECODE = (
    "status = 'paired' AND standard_tokens >= 2 AND fly_tokens >= 2 "
    "AND standard_last_token_seconds > standard_first_token_seconds "
    "AND fly_last_token_seconds > fly_first_token_seconds"
)
_S_TOK = "(standard_tokens - 1)"
_F_TOK = "(fly_tokens - 1)"
_S_SEC = "(standard_last_token_seconds - standard_first_token_seconds)"
_F_SEC = "(fly_last_token_seconds - fly_first_token_seconds)"
#: What the decode sums add per row, in :class:`~specwatch.shadow.tally.ArmSums` order, each
#: with whether it is in seconds (put in fixed point, or summed as floats) or a token count.
#: The products keep :func:`specwatch.shadow.tally.fixed`'s operation order (``T * S``, then
#: ``* 1e9``).
DECODE_TERMS: tuple[tuple[str, bool], ...] = (
    (_S_TOK, False),
    (_F_TOK, False),
    (_S_SEC, True),
    (_F_SEC, True),
    ("standard_first_token_seconds", True),
    ("fly_first_token_seconds", True),
    (f"{_S_TOK} * {_S_TOK}", False),
    (f"{_F_TOK} * {_F_TOK}", False),
    (f"{_S_TOK} * {_S_SEC}", True),
    (f"{_F_TOK} * {_F_SEC}", True),
    (f"{_S_SEC} * {_S_SEC}", True),
    (f"{_F_SEC} * {_F_SEC}", True),
)


def decode_sql(*, fixed_point: bool, when: bool = True) -> tuple[str, ...]:
    """The decode expressions (count, then :data:`DECODE_TERMS`), each ``CASE WHEN
    ARM_DECODE``; seconds in fixed point when ``fixed_point``; without the ``SUM``."""
    out = [f"CASE WHEN {ARM_DECODE} THEN 1 ELSE 0 END"]
    for term, seconds in DECODE_TERMS:
        value = fixed_sql(term) if fixed_point and seconds else term
        out.append(f"CASE WHEN {ARM_DECODE} THEN {value} ELSE 0 END")
    return tuple(out)


def fixed_sql(column: str) -> str:
    """``column`` in fixed point, the same IEEE operations as
    :func:`specwatch.shadow.tally.fixed`."""
    return f"CAST({column} * {FIXED_POINT!r} + 0.5 AS INTEGER)"


def band_sql(bands: Sequence[int]) -> str:
    """A row's running-request band label (lower bounds ``bands``, labels from
    :func:`~specwatch.shadow.tally.load_band_labels`; ``unknown`` without a running count)."""
    labels = load_band_labels(bands)
    cases = " ".join(
        f"WHEN running_at_replay >= {float(lo)!r} THEN '{label}'"
        for lo, label in reversed(list(zip(bands, labels, strict=True)))
    )
    return f"CASE {cases} ELSE '{UNKNOWN_BAND}' END"
