"""The per-category decision table: is FLy worth it for each kind of request? (pure)

One row per request category (the categories the sampler's category bound keeps,
``shadow.max_categories``; the rest pooled as ``other``) plus ``overall``, built from the
ledger's since-start tallies (:class:`~specwatch.shadow.tally.PairTally`) and speed sums
(:class:`~specwatch.shadow.tally.ArmTotals`). The same rows feed ``/api/v1/snapshot``
(``shadow.decisions``), the ``specwatch_decision_*`` gauges and ``specwatch report``.

Verdicts, first match wins (``alpha``, ``margin`` and ``detect_net_loss`` are the paired
settings):

1. ``costs_quality``, *FLy costs quality here*: the no-net-loss e-value of FLy's net loss
   (:mod:`~specwatch.shadow.stats.eprocess`) reached ``1/alpha`` (anytime valid; the same
   alarm as ``SpecQualityDrift``).
2. ``pays``, *FLy pays here*: the anytime-valid confidence sequence shows the net loss below
   ``margin`` (:mod:`~specwatch.shadow.stats.confseq`, at the since-start counts) and FLy's
   decode throughput (completion tokens per second of replay) is higher
   than the standard arm's over at least :data:`MIN_SPEED_PAIRS` pairs.
3. ``not_faster``, *FLy is not faster here*: non-inferior, but FLy's throughput is not higher.
4. ``not_decided``: otherwise, with "about N more pairs" under the observed effect
   (:func:`~specwatch.shadow.stats.power.pairs_to_decide`, the function the verdict sentence
   uses), or why no number can be given; below
   :data:`~specwatch.shadow.verdict.MIN_VERDICT_PAIRS` labelled pairs, "too few pairs".
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from specwatch.core.config import DEFAULT_MAX_CATEGORIES, OVERALL
from specwatch.shadow.published import DecisionRow, PairedSummary, ShadowIO
from specwatch.shadow.sample import OTHER_CATEGORY
from specwatch.shadow.stats.sequential import e_value_alarm
from specwatch.shadow.summary import Levels, categories_by_volume, summarize
from specwatch.shadow.tally import MIN_SPEED_PAIRS as MIN_SPEED_PAIRS
from specwatch.shadow.tally import ArmTotals, PairTally, arm_decode, arm_decode_intervals
from specwatch.shadow.tally import arm_speeds as arm_speeds
from specwatch.shadow.tally import arm_tau_means as arm_tau_means
from specwatch.shadow.values import Verdict
from specwatch.shadow.verdict import MIN_VERDICT_PAIRS

#: The category the categories beyond the bound are pooled into (the sampler's ``other``).
OTHER = OTHER_CATEGORY

#: Why the acceptance gain (or the reply τ) is empty.
NO_ACCEPTANCE = (
    "no replies with per-request spec-decode counts on both arms "
    "(vLLM --per-request-spec-decode-metrics)"
)


@dataclass(frozen=True, slots=True)
class ReplyCounts:
    """Per-request speculative-decoding counts summed over the replies of one arm (this
    process, from :class:`~specwatch.shadow.published.ShadowIO`): verify ``steps``, ``drafted``
    and ``accepted`` draft tokens."""

    steps: int = 0
    drafted: int = 0
    accepted: int = 0

    def __add__(self, other: ReplyCounts) -> ReplyCounts:
        return ReplyCounts(
            self.steps + other.steps, self.drafted + other.drafted, self.accepted + other.accepted
        )

    @property
    def alpha(self) -> float | None:
        """Accepted / drafted draft tokens, ``None`` without drafts."""
        return self.accepted / self.drafted if self.drafted > 0 else None

    @property
    def tau(self) -> float | None:
        """1 + accepted / verify steps (tokens per step), ``None`` without steps."""
        return 1.0 + self.accepted / self.steps if self.steps > 0 else None


def reply_counts(io: ShadowIO | None) -> dict[tuple[str, str], ReplyCounts]:
    """``{(arm, category): ReplyCounts}`` from the I/O side's reply counters (``{}`` without)."""
    if io is None:
        return {}
    keys = set(io.reply_spec_steps) | set(io.reply_draft_tokens) | set(io.reply_accepted_tokens)
    return {
        k: ReplyCounts(
            io.reply_spec_steps.get(k, 0),
            io.reply_draft_tokens.get(k, 0),
            io.reply_accepted_tokens.get(k, 0),
        )
        for k in keys
    }


def add_replies(
    *parts: Mapping[tuple[str, str], ReplyCounts],
) -> dict[tuple[str, str], ReplyCounts]:
    """The per-key sum of reply counts (e.g. what the ledger stored before this process started
    plus this process's own counters)."""
    out: dict[tuple[str, str], ReplyCounts] = {}
    for part in parts:
        for k, r in part.items():
            out[k] = out.get(k, ReplyCounts()) + r
    return out


def stored_replies(
    totals: Mapping[tuple[str, str], tuple[int, int, int]],
) -> dict[tuple[str, str], ReplyCounts]:
    """:class:`ReplyCounts` from the ledger's sums (``Ledger.reply_totals``)."""
    return {k: ReplyCounts(*v) for k, v in totals.items()}


def bound_categories(
    tallies: Mapping[str, PairTally],
    max_categories: int,
    kept: Collection[str] | None = None,
) -> dict[str, str]:
    """Category → the name it is shown under. With ``kept`` (the live
    :class:`~specwatch.shadow.sample.CategoryBound`'s admitted set) those keep their name;
    without it the ``max_categories`` with the most rows
    (:func:`~specwatch.shadow.summary.categories_by_volume`, the order the bound is seeded in)
    do. Every other category becomes :data:`OTHER`. Raises ``ValueError`` for
    ``max_categories < 0``."""
    if max_categories < 0:
        raise ValueError("max_categories must be >= 0")
    cats = {c: t for c, t in tallies.items() if c != OVERALL}
    keep = set(kept) if kept is not None else set(categories_by_volume(cats)[:max_categories])
    return {c: (c if c in keep else OTHER) for c in cats}


def _tau(t: ArmTotals, std: ReplyCounts, fly: ReplyCounts) -> tuple[float | None, str | None]:
    means = arm_tau_means(t)
    if means is not None:
        return means[1] - means[0], None
    if std.tau is not None and fly.tau is not None:
        return fly.tau - std.tau, None
    return None, NO_ACCEPTANCE


def _acceptance(std: ReplyCounts, fly: ReplyCounts) -> tuple[float | None, str | None]:
    if std.alpha is not None and fly.alpha is not None:
        return fly.alpha - std.alpha, None
    return None, NO_ACCEPTANCE


def _speed(t: ArmTotals) -> tuple[float | None, str | None]:
    if t.speed_pairs < MIN_SPEED_PAIRS:
        return None, f"{t.speed_pairs} pairs with tokens and latency (need {MIN_SPEED_PAIRS})"
    speeds = arm_speeds(t)
    if speeds is None:
        return None, "the standard arm generated no tokens"
    std, fly = speeds
    return fly / std - 1.0, None


def _verdict(
    s: PairedSummary, speed_gain: float | None, alpha: float
) -> tuple[Verdict, str, int | None]:
    if e_value_alarm(s.e_value, alpha):
        return "costs_quality", "FLy costs quality here", None
    if 0 < s.n < MIN_VERDICT_PAIRS:
        return (
            "not_decided",
            f"not decided: too few pairs ({s.n} labelled, need {MIN_VERDICT_PAIRS})",
            s.questions_still_needed,
        )
    if s.within_margin_declared:
        if speed_gain is None:
            return (
                "not_decided",
                "not decided: quality is within the margin but FLy's speed is not measured",
                None,
            )
        if speed_gain > 0:
            return "pays", "FLy pays here", None
        return "not_faster", "FLy is not faster here", None
    if s.questions_still_needed is None:
        return "not_decided", "not decided: no labelled pairs yet", None
    if s.questions_still_needed == 0:
        return (
            "not_decided",
            "not decided: the planned sample size is reached but neither test has decided",
            0,
        )
    more = s.questions_still_needed
    return "not_decided", f"not decided: about {more} more pairs", more


def tau_coverage_by_category(
    rows: Sequence[DecisionRow],
) -> tuple[tuple[str, int, int], ...]:
    """Per-request τ coverage per category of a decision table: ``(category, paired requests,
    those where both arms carried a per-request τ)``, the overall row first, then the
    categories in table order (real vLLM sends no τ on some finishes, e.g. a stop string, so a
    category answered that way has a τ gain from few of its pairs)."""
    ordered = sorted(rows, key=lambda r: r.category != OVERALL)
    return tuple((r.category, r.pairs, r.tau_pairs) for r in ordered)


def decision_row(
    category: str,
    tally: PairTally,
    totals: ArmTotals,
    *,
    levels: Levels,
    power: float = 0.8,
    replies: tuple[ReplyCounts, ReplyCounts] | None = None,
    log_e_value: float | None = None,
) -> DecisionRow:
    """The :class:`DecisionRow` of one category's since-start tally and speed sums, and the
    arms' reply counts ``replies`` = (standard, FLy) (τ gain from the ledger's per-pair τ when
    it has them, else from the reply counts; acceptance gain from the reply counts) at
    ``levels``. ``log_e_value``: the ordered no-net-loss e-process when the pairs were folded
    in order (see :func:`~specwatch.shadow.summary.summarize`)."""
    s = summarize(
        tally,
        alpha=levels.alpha,
        margin=levels.margin,
        detect_net_loss=levels.detect_net_loss,
        power=power,
        log_e_value=log_e_value,
    )
    std_r, fly_r = replies or (ReplyCounts(), ReplyCounts())
    tau, tau_why = _tau(totals, std_r, fly_r)
    acc, acc_why = _acceptance(std_r, fly_r)
    speed, speed_why = _speed(totals)
    verdict, text, more = _verdict(s, speed, levels.alpha)
    decode = arm_decode(totals)
    s_ci, f_ci = arm_decode_intervals(totals)
    return DecisionRow(
        category=category,
        pairs=tally.paired,
        labelled=s.n,
        tau_pairs=totals.tau_pairs,
        tau_gain=tau,
        tau_gain_reason=tau_why,
        acceptance_gain=acc,
        acceptance_gain_reason=acc_why,
        speed_pairs=totals.speed_pairs,
        throughput_gain_ratio=speed,
        throughput_gain_reason=speed_why,
        net_loss_ratio=s.net_loss_ratio,
        ci_lower=s.ci_lower,
        ci_upper=s.ci_upper,
        e_value=s.e_value,
        fly_flip_ratio=s.fly_flip_ratio,
        noise_flip_ratio=s.noise_flip_ratio,
        verdict=verdict,
        verdict_text=text,
        pairs_more=more,
        decode_pairs=totals.decode_pairs,
        standard_decode_tokens_per_second=decode[0][0] if decode is not None else None,
        fly_decode_tokens_per_second=decode[0][1] if decode is not None else None,
        standard_ttft_seconds=decode[1][0] if decode is not None else None,
        fly_ttft_seconds=decode[1][1] if decode is not None else None,
        standard_decode_ci_lower=s_ci[0] if s_ci is not None else None,
        standard_decode_ci_upper=s_ci[1] if s_ci is not None else None,
        fly_decode_ci_lower=f_ci[0] if f_ci is not None else None,
        fly_decode_ci_upper=f_ci[1] if f_ci is not None else None,
    )


def decision_table(
    tallies: Mapping[str, PairTally],
    totals: Mapping[str, ArmTotals],
    *,
    levels: Levels,
    power: float = 0.8,
    max_categories: int = DEFAULT_MAX_CATEGORIES,
    replies: Mapping[tuple[str, str], ReplyCounts] | None = None,
    kept: Collection[str] | None = None,
    overall_log_e_value: float | None = None,
) -> tuple[DecisionRow, ...]:
    """The decision table: one row per bounded category (sorted, :data:`OTHER` last) and an
    ``overall`` row, from since-start per-category tallies (``Ledger.tally()``), speed sums
    (``Ledger.arm_totals()``) and the reply counts ``{(arm, category): ReplyCounts}``
    (:func:`reply_counts` of this process plus what the ledger stored, :func:`add_replies`).
    Categories with no row in ``totals`` have no
    speed data. ``kept``/``max_categories``: the category bound (:func:`bound_categories`).
    ``overall_log_e_value``: the ordered no-net-loss e-process of all pairs (the sidecar's live
    state), the ``overall`` row's e-value (``None``: the count form). Pure; raises
    ``ValueError`` for ``max_categories < 0``."""
    names = bound_categories(tallies, max_categories, kept)
    got = replies or {}
    pooled_t: dict[str, PairTally] = {}
    pooled_a: dict[str, ArmTotals] = {}
    pooled_r: dict[tuple[str, str], ReplyCounts] = {}
    for cat, shown in names.items():
        pooled_t[shown] = pooled_t.get(shown, PairTally()) + tallies[cat]
        pooled_a[shown] = pooled_a.get(shown, ArmTotals()) + totals.get(cat, ArmTotals())
        for arm in ("standard", "fly"):
            key = (arm, shown)
            pooled_r[key] = pooled_r.get(key, ReplyCounts()) + got.get((arm, cat), ReplyCounts())
    order = sorted(pooled_t, key=lambda c: (c == OTHER, c))
    all_t = sum(pooled_t.values(), PairTally())
    all_a = sum(pooled_a.values(), ArmTotals())

    def arm_total(arm: str) -> ReplyCounts:
        return sum((r for (a, _), r in pooled_r.items() if a == arm), ReplyCounts())

    rows = [
        decision_row(
            c,
            pooled_t[c],
            pooled_a[c],
            levels=levels,
            power=power,
            replies=(
                pooled_r.get(("standard", c), ReplyCounts()),
                pooled_r.get(("fly", c), ReplyCounts()),
            ),
        )
        for c in order
    ]
    rows.append(
        decision_row(
            OVERALL,
            all_t,
            all_a,
            levels=levels,
            power=power,
            replies=(arm_total("standard"), arm_total("fly")),
            log_e_value=overall_log_e_value,
        )
    )
    return tuple(rows)
