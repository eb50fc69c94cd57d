"""Builds the published snapshot from tallies (pure): :func:`summarize` one tally,
:func:`build_shadow_stats` a whole :class:`~specwatch.shadow.published.ShadowStats`."""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from specwatch.core.config import DEFAULT_MAX_CATEGORIES, OVERALL, SINCE_START
from specwatch.core.numbers import exp_or_inf
from specwatch.shadow.lossless import LosslessBand
from specwatch.shadow.published import DecisionRow, LoadBand, PairedSummary, ShadowIO, ShadowStats
from specwatch.shadow.sample import OTHER_CATEGORY
from specwatch.shadow.stats.confseq import net_loss_upper_sequence, within_margin_log_e_value
from specwatch.shadow.stats.eprocess import count_log_e_value
from specwatch.shadow.stats.paired import (
    discordant_ratio,
    excess_flip,
    mcnemar_exact_p,
    net_loss_ci,
    net_loss_ratio,
    non_inferiority_test,
)
from specwatch.shadow.stats.power import pairs_to_decide, questions_needed
from specwatch.shadow.stats.sequential import alarm, beta_binomial_e_value
from specwatch.shadow.tally import ArmTotals, PairTally, arm_label_counts


def load_bands(tallies: Mapping[str, PairTally], labels: Sequence[str]) -> tuple[LoadBand, ...]:
    """One :class:`LoadBand` per label in ``labels`` (from ``Ledger.tally_by_load``; absent bands
    count 0), then ``unknown`` when some pairs had no running count. Pure."""
    names = [*labels, *(["unknown"] if tallies.get("unknown", PairTally()).paired else [])]
    out = []
    for name in names:
        t = tallies.get(name, PairTally())
        nn = t.noise_agree + t.noise_disagree
        lossless = LosslessBand.of(name, t.lossless_flip_counts())
        out.append(
            LoadBand(
                band=name,
                pairs=t.paired,
                fly_flip_ratio=t.disagree / t.paired if t.paired else math.nan,
                noise_pairs=nn,
                noise_flip_ratio=t.noise_disagree / nn if nn else math.nan,
                lossless_pairs=lossless.pairs,
                lossless_standard_flip_ratio=lossless.spec_flip_ratio,
                lossless_noise_flip_ratio=lossless.noise_flip_ratio,
            )
        )
    return tuple(out)


# -- building snapshots (pure) ------------------------------------------------------------------


def summarize(
    tally: PairTally,
    *,
    alpha: float = 0.05,
    margin: float = 0.01,
    detect_net_loss: float = 0.02,
    power: float = 0.8,
    log_e_value: float | None = None,
) -> PairedSummary:
    """All paired statistics for one tally (see :class:`PairedSummary`).

    ``log_e_value``: the ordered no-net-loss e-process's ``ln E`` for these pairs when the caller
    folded them in order (the sidecar's live state, ``paired-test``, the report); ``None``: the
    count form (:func:`~specwatch.shadow.stats.eprocess.count_log_e_value`).

    Sources: exact McNemar (McNemar 1947), Tango (1998) score interval and non-inferiority test,
    the no-net-loss e-process (Waudby-Smith & Ramdas 2024; Ville 1939;
    :mod:`~specwatch.shadow.stats.eprocess`), Connor (1987)
    sample size, excess flip test (one-sided exact McNemar on the FLy/noise discordant flips).
    Pure and remembered: the same tally and settings give the same (immutable) summary without
    computing it again (the last 4,096 kept).
    """
    return _summarize(tally, alpha, margin, detect_net_loss, power, log_e_value)


@functools.lru_cache(maxsize=4096)
def _summarize(
    tally: PairTally,
    alpha: float,
    margin: float,
    detect_net_loss: float,
    power: float,
    log_e_value: float | None,
) -> PairedSummary:
    pc = tally.paired_counts()
    ci = net_loss_ci(pc, level=1.0 - alpha)
    ni = non_inferiority_test(pc, margin=margin, alpha=alpha)
    log_e = count_log_e_value(pc.lost, pc.gained) if log_e_value is None else log_e_value
    disc = discordant_ratio(pc)
    needed: int | None = None
    if math.isfinite(disc) and 0.0 < detect_net_loss <= 1.0:
        # A net loss of δ implies a discordant rate of at least δ, so below δ the planning
        # discordance is δ itself (Connor's formula needs p_d >= δ).
        needed = questions_needed(
            detect_net_loss, max(disc, detect_net_loss), alpha=alpha, power=power
        )
    agree = pc.n - pc.lost - pc.gained
    ex = excess_flip(tally.flip_counts())
    lf = tally.lossless_flip_counts()
    lex = excess_flip(lf)
    fly_flip = tally.disagree / tally.paired if tally.paired else math.nan
    noise_n = tally.noise_agree + tally.noise_disagree
    noise_flip = tally.noise_disagree / noise_n if noise_n else math.nan
    return PairedSummary(
        tally=tally,
        n=pc.n,
        lost=pc.lost,
        gained=pc.gained,
        net=pc.net,
        net_loss_ratio=net_loss_ratio(pc),
        ci_lower=ci.lower,
        ci_upper=ci.upper,
        ci_level=ci.level,
        p_two_sided=mcnemar_exact_p(pc.lost, pc.gained, "two-sided"),
        p_loss=mcnemar_exact_p(pc.lost, pc.gained, "loss"),
        discordant_ratio=disc,
        log_e_value=log_e,
        e_value=exp_or_inf(log_e),
        alarm=alarm(log_e, alpha),
        non_inferiority_p=ni.p_value,
        non_inferiority_upper=ni.upper_bound,
        non_inferiority_pass=ni.passed,
        questions_needed=needed,
        questions_still_needed=pairs_to_decide(net_loss_ratio(pc), disc, pc.n, margin, alpha),
        fly_flip_ratio=fly_flip,
        noise_flip_ratio=noise_flip,
        excess_flip_ratio=ex.excess_flip_ratio,
        excess_flip_p=ex.p_value,
        noise_pairs=tally.flip_counts().n,
        spec_flip_ratio=lex.fly_flip_ratio,
        baseline_noise_flip_ratio=lex.noise_flip_ratio,
        lossless_excess_flip_ratio=lex.excess_flip_ratio,
        lossless_p=lex.p_value,
        lossless_e_value=beta_binomial_e_value(lf.fly_only, lf.noise_only),
        lossless_pairs=lf.n,
        within_margin_upper=(
            net_loss_upper_sequence(pc.lost, pc.gained, agree, alpha) if pc.n else math.nan
        ),
        within_margin_declared=bool(
            pc.n
            and margin > 0.0
            and alarm(float(within_margin_log_e_value(pc.lost, pc.gained, agree, margin)), alpha)
        ),
    )


@dataclass(frozen=True, slots=True)
class Levels:
    """The levels every statistic is computed at: ``alpha`` (error rate), ``margin`` (the
    non-inferiority margin), ``detect_net_loss`` (the net loss the sample size plans for) and
    ``categories`` (K, the category series the page's category share is divided by)."""

    alpha: float = 0.05
    margin: float = 0.01
    detect_net_loss: float = 0.02
    categories: int = DEFAULT_MAX_CATEGORIES + 1


@dataclass(frozen=True, slots=True)
class OrderedState:
    """The statistics folded pair by pair in order (the sidecar's live state; ``None``: not
    run): the no-net-loss e-process's ``net_loss_log_e_value`` (``None``: its count form), the
    margin e-process's ``betting_log_e_value``, the change detector's ``change_log_value``
    and ``change_threshold``, and ``within_margin_declared_at``."""

    net_loss_log_e_value: float | None = None
    betting_log_e_value: float | None = None
    change_log_value: float | None = None
    change_threshold: float | None = None
    within_margin_declared_at: int | None = None


@dataclass(frozen=True, slots=True)
class ProcessCounts:
    """This process's monotonic pair counters (:class:`~specwatch.shadow.live.OutcomeCounters`)
    and the category bound: ``kept`` categories (the tallies of any other are folded into
    ``other``; ``None``: no folding), requests ``folded`` into ``other`` and slot
    ``takeovers``."""

    pairs_total: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    unpaired_total: Mapping[str, int] = field(default_factory=dict)
    excluded_total: Mapping[str, int] = field(default_factory=dict)
    replays_total: Mapping[str, int] = field(default_factory=dict)
    kept: Collection[str] | None = None
    folded: int = 0
    takeovers: int = 0


@dataclass(frozen=True, slots=True)
class LedgerView:
    """The ledger as the snapshot shows it: ``rows`` held, ``write_errors[exception type]``
    and ``state`` (:data:`~specwatch.shadow.ledger.state.LedgerState`)."""

    rows: int | None = None
    write_errors: Mapping[str, int] = field(default_factory=dict)
    state: str = "ok"


@dataclass(frozen=True, slots=True)
class Carried:
    """Parts the snapshot carries as given: the I/O side's ``io``, the ``decisions`` table,
    the ``by_load`` bands and the since-start ``arm_totals`` of every category together."""

    io: ShadowIO | None = None
    decisions: tuple[DecisionRow, ...] = ()
    by_load: tuple[LoadBand, ...] = ()
    arm_totals: ArmTotals | None = None


def build_shadow_stats(
    tallies: Mapping[str, Mapping[str, PairTally]],
    *,
    now: float,
    levels: Levels = Levels(),
    ordered: OrderedState = OrderedState(),
    counts: ProcessCounts = ProcessCounts(),
    ledger: LedgerView = LedgerView(),
    carried: Carried = Carried(),
) -> ShadowStats:
    """Summarise ``{window: {category: tally}}`` (from ``Ledger.tally`` per window or
    :func:`~specwatch.shadow.tally.window_tallies`) into a :class:`ShadowStats`, adding the
    :data:`OVERALL` category.

    With ``counts.kept`` (the kept categories of
    :class:`~specwatch.shadow.sample.CategoryBound`) the tallies of any other category (rows
    written before the bound, or by another configuration) are added into ``other``, so a
    ledger with thousands of categories still gives at most ``len(kept) + 2`` categories per
    window. ``ledger_pairs`` is built from the ``since_start`` window (the whole ledger) when
    it is present. ``ordered.net_loss_log_e_value`` is the e-value of ``since_start`` /
    :data:`OVERALL` (``None``: its count form); ``carried.arm_totals`` the verdict's τ and
    speed (:func:`specwatch.shadow.verdict.arm_ratios`)."""
    alpha, margin, detect = levels.alpha, levels.margin, levels.detect_net_loss
    windows: dict[str, dict[str, PairedSummary]] = {}
    if counts.kept is not None:
        kept = counts.kept
        tallies = {w: fold_categories(by_cat, kept) for w, by_cat in tallies.items()}
    ledger_pairs: dict[tuple[str, str, str], int] = {}
    for cat, t in tallies.get(SINCE_START, {}).items():
        if cat == OVERALL:
            continue
        for arm, label, n in arm_label_counts(t):
            ledger_pairs[(cat, arm, label)] = n
    for wname, by_cat in tallies.items():
        total = PairTally()
        out: dict[str, PairedSummary] = {}
        for cat, t in sorted(by_cat.items()):
            if cat == OVERALL:
                continue
            total = total + t
            out[cat] = summarize(t, alpha=alpha, margin=margin, detect_net_loss=detect)
        out[OVERALL] = summarize(
            total,
            alpha=alpha,
            margin=margin,
            detect_net_loss=detect,
            log_e_value=ordered.net_loss_log_e_value if wname == SINCE_START else None,
        )
        windows[wname] = out
    return ShadowStats(
        generated_at=now,
        alpha=alpha,
        margin=margin,
        detect_net_loss=detect,
        windows=windows,
        pairs_total=dict(counts.pairs_total),
        unpaired_total=dict(counts.unpaired_total),
        excluded_total=dict(counts.excluded_total),
        betting_log_e_value=ordered.betting_log_e_value,
        change_log_value=ordered.change_log_value,
        change_threshold=ordered.change_threshold,
        within_margin_declared_at=ordered.within_margin_declared_at,
        page_categories=levels.categories,
        ledger_rows=ledger.rows,
        ledger_write_errors=dict(ledger.write_errors),
        io=carried.io,
        decisions=carried.decisions,
        by_load=carried.by_load,
        ledger_pairs=ledger_pairs,
        categories_folded=counts.folded,
        category_takeovers=counts.takeovers,
        replays_total=dict(counts.replays_total),
        ledger_state=ledger.state,
        arm_totals=carried.arm_totals,
    )


def fold_categories(
    by_category: Mapping[str, PairTally], keep: Collection[str]
) -> dict[str, PairTally]:
    """``by_category`` with every category not in ``keep`` (nor ``other``) added into
    ``other`` (pure)."""
    out: dict[str, PairTally] = {}
    for cat, t in by_category.items():
        name = cat if cat in keep or cat in (OTHER_CATEGORY, OVERALL) else OTHER_CATEGORY
        out[name] = out[name] + t if name in out else t
    return out


def categories_by_volume(by_category: Mapping[str, PairTally]) -> list[str]:
    """Category names, most rows first (ties by name): the order a
    :class:`~specwatch.shadow.sample.CategoryBound` is seeded in from the ledger."""

    def rows(t: PairTally) -> int:
        return t.paired + t.unpaired + t.excluded

    return [c for c, _ in sorted(by_category.items(), key=lambda kv: (-rows(kv[1]), kv[0]))]
