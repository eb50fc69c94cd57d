"""Immutable values the shadow statistics publish: per-window tallies and the ``ShadowStats``
snapshot read by the exporter (``specwatch.export.prometheus``) and the alert detectors."""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from specwatch.core.config import OVERALL, SINCE_START
from specwatch.core.numbers import exp_or_inf
from specwatch.shadow.ledger.aggregates import HistoryGroup, HistoryGrouping
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.shadow.lossless import LosslessBand
from specwatch.shadow.sample import OTHER_CATEGORY, CategoryBound
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
from specwatch.shadow.tally import (
    ArmSums,
    ArmTotals,
    HistoryCell,
    arm_label_counts,
    row_band,
    row_cell,
    row_tally,
    sum_cells,
)
from specwatch.shadow.tally import PairTally as PairTally
from specwatch.shadow.tally import tally_rows as tally_rows
from specwatch.shadow.tally import window_tallies as window_tallies
from specwatch.shadow.values import Verdict
from specwatch.shadow.windows import WindowedSums


@dataclass(frozen=True, slots=True)
class PairedSummary:
    """Paired statistics for one (window, category); ratios are fractions, NaN when undefined.

    ``net_loss_ratio`` = acc(standard) - acc(FLy) with its Tango score interval
    ``[ci_lower, ci_upper]`` at ``ci_level``; ``p_two_sided`` / ``p_loss`` exact McNemar;
    ``log_e_value`` / ``e_value`` the no-net-loss e-value and ``alarm`` = e >= 1/alpha: for the
    ``since_start`` window of :data:`OVERALL` the ordered e-process the sidecar folds pair by
    pair (:mod:`~specwatch.shadow.stats.eprocess`, anytime valid), elsewhere (rolling windows,
    categories: counts without an order) its count form at the 6 % prior
    (:func:`~specwatch.shadow.stats.eprocess.count_log_e_value`);
    ``non_inferiority_*`` the Tango test against the margin; ``questions_needed`` (Connor 1987)
    for detecting a net loss δ = ``detect_net_loss`` at the planning discordant rate
    p_d = max(observed discordant rate, δ) (a net loss of δ implies at least δ discordance;
    Connor's formula needs p_d >= δ), ``None`` only while there are no labelled pairs (the
    discordant rate is undefined); ``questions_still_needed`` = max(0, needed - n); flip ratios
    from answer agreement.

    The lossless check (greedy pairs with a baseline arm without speculation and a noise arm
    that answered): ``spec_flip_ratio`` = share of them where the standard (speculative) arm's
    answer differs from the baseline's, ``baseline_noise_flip_ratio`` the noise arm's share
    (the floor), ``lossless_excess_flip_ratio`` their difference, ``lossless_p`` the one-sided
    exact McNemar p of standard-only against noise-only flips, ``lossless_e_value`` the
    beta-binomial mixture e-value on the same flips (p0 = 1/2; anytime valid for
    ``since_start``), ``lossless_pairs`` the pairs counted.

    ``within_margin_upper``: the anytime-valid upper confidence sequence on the net loss at these
    counts (:func:`~specwatch.shadow.stats.confseq.net_loss_upper_sequence`, level 1 - alpha);
    ``within_margin_declared``: it is below the margin now (the sidecar also keeps the first
    pair it was, so a declaration is never withdrawn). ``questions_still_needed`` is "about N
    more pairs" under the observed effect (:func:`~specwatch.shadow.stats.power.pairs_to_decide`).
    """

    tally: PairTally
    n: int
    lost: int
    gained: int
    net: int
    net_loss_ratio: float
    ci_lower: float
    ci_upper: float
    ci_level: float
    p_two_sided: float
    p_loss: float
    discordant_ratio: float
    log_e_value: float
    e_value: float
    alarm: bool
    non_inferiority_p: float
    non_inferiority_upper: float
    non_inferiority_pass: bool
    questions_needed: int | None
    questions_still_needed: int | None
    fly_flip_ratio: float
    noise_flip_ratio: float
    excess_flip_ratio: float
    excess_flip_p: float
    noise_pairs: int
    spec_flip_ratio: float = math.nan
    baseline_noise_flip_ratio: float = math.nan
    lossless_excess_flip_ratio: float = math.nan
    lossless_p: float = 1.0
    lossless_e_value: float = 1.0
    lossless_pairs: int = 0
    within_margin_upper: float = math.nan
    within_margin_declared: bool = False


@dataclass(frozen=True, slots=True)
class ShadowIO:
    """The shadow I/O side's counters and state, one point-in-time copy (plain values, no I/O).

    Gauges: ``queue_depth`` (sampled requests waiting), ``in_flight`` (replays running),
    ``paused[reason]`` (1 while paused). Counters since process start: ``offered`` /
    ``not_sampled`` / ``admitted`` (sampler decisions), ``dropped[reason]``,
    ``pauses_total[reason]`` (entries into a load pause), ``received[source]`` and
    ``ingest_errors[(source, reason)]`` (requests seen by mirror/proxy/ingest; reasons include
    ``too_large`` and ``invalid_json``), ``arm_errors[(arm, reason)]`` (reasons include
    ``too_large`` and ``invalid_body``), ``sink_errors``, ``proxy_requests``,
    ``proxy_client_disconnects``, ``proxy_offer_lost``, ``proxy_upstream_errors[reason]``,
    ``canary_offered`` and ``canary_bad_lines[reason]``, ``replay_retries[arm]`` (requests sent
    again after a close before any response byte), and from vLLM's per-request
    speculative-decoding metrics in the replies, by ``(arm, category)``: ``reply_spec_steps``
    (verify steps), ``reply_draft_tokens``, ``reply_accepted_tokens`` (replies without a verify
    step add nothing); by ``(arm, finish_reason)`` (``"none"`` when the reply named none):
    ``reply_finishes`` (successful replies) and ``reply_finishes_with_spec`` (those carrying
    the metrics, see :meth:`spec_metrics_coverage`). Pair statuses are not here: the pipeline
    never classifies a pair (the one set of pair counters is :class:`OutcomeCounters`).
    Exported by :mod:`specwatch.export.prometheus`.
    """

    queue_depth: int = 0
    in_flight: int = 0
    offered: int = 0
    not_sampled: int = 0
    admitted: int = 0
    dropped: Mapping[str, int] = field(default_factory=dict)
    paused: Mapping[str, int] = field(default_factory=dict)
    pauses_total: Mapping[str, int] = field(default_factory=dict)
    received: Mapping[str, int] = field(default_factory=dict)
    ingest_errors: Mapping[tuple[str, str], int] = field(default_factory=dict)
    arm_errors: Mapping[tuple[str, str], int] = field(default_factory=dict)
    sink_errors: int = 0
    proxy_requests: int = 0
    proxy_client_disconnects: int = 0
    proxy_offer_lost: int = 0
    proxy_upstream_errors: Mapping[str, int] = field(default_factory=dict)
    canary_offered: int = 0
    canary_bad_lines: Mapping[str, int] = field(default_factory=dict)
    replay_retries: Mapping[str, int] = field(default_factory=dict)
    reply_spec_steps: Mapping[tuple[str, str], int] = field(default_factory=dict)
    reply_draft_tokens: Mapping[tuple[str, str], int] = field(default_factory=dict)
    reply_accepted_tokens: Mapping[tuple[str, str], int] = field(default_factory=dict)
    reply_finishes: Mapping[tuple[str, str], int] = field(default_factory=dict)
    reply_finishes_with_spec: Mapping[tuple[str, str], int] = field(default_factory=dict)

    def spec_metrics_coverage(self) -> dict[tuple[str, str], float]:
        """Per-request τ coverage: the share of successful replies carrying vLLM's per-request
        speculative-decoding metrics, per ``(arm, finish_reason)`` with replies. Real vLLM
        sends none for a stop-string finish, for ``n > 1`` or a batch of prompts, so the
        per-request τ and α stand for the other finishes only."""
        return {
            k: self.reply_finishes_with_spec.get(k, 0) / n
            for k, n in self.reply_finishes.items()
            if n > 0
        }

    def reply_alpha(self) -> dict[tuple[str, str], float]:
        """α (accepted / drafted draft tokens) per ``(arm, category)`` with drafts."""
        return {
            k: self.reply_accepted_tokens.get(k, 0) / d
            for k, d in self.reply_draft_tokens.items()
            if d > 0
        }

    def reply_tau(self) -> dict[tuple[str, str], float]:
        """τ (1 + accepted / verify steps, tokens per step) per ``(arm, category)`` with steps."""
        return {
            k: 1.0 + self.reply_accepted_tokens.get(k, 0) / n
            for k, n in self.reply_spec_steps.items()
            if n > 0
        }


@dataclass(frozen=True, slots=True)
class DecisionRow:
    """One category's row of the decision table (built by
    :func:`specwatch.shadow.decision.decision_table`; ratios are fractions; ``None`` = not
    measurable, with a reason).

    ``pairs`` paired requests, ``labelled`` those with a gold answer (the net-loss statistics'
    n); ``tau_gain`` = mean per-request τ of FLy minus the standard arm's over ``tau_pairs``
    requests where both returned it (else from the replies' summed counts: τ = 1 +
    accepted / verify steps per arm); ``acceptance_gain`` = α_FLy − α_standard (accepted /
    drafted draft tokens summed over the replies of this process); ``throughput_gain_ratio`` =
    FLy tokens/s ÷ standard tokens/s − 1 (completion tokens over replay seconds summed over
    ``speed_pairs`` requests);
    ``net_loss_ratio`` with its Tango interval ``[ci_lower, ci_upper]`` (level 1 − alpha);
    ``e_value`` the no-net-loss e-value (since start; see :class:`PairedSummary`);
    ``fly_flip_ratio`` and the noise floor
    ``noise_flip_ratio`` (answer changes against the standard arm); ``verdict`` one of
    :data:`~specwatch.shadow.values.VERDICTS`, ``verdict_text`` the sentence; ``pairs_more``
    the labelled pairs still needed when not decided (``None`` otherwise or when it cannot be
    computed).
    """

    category: str
    pairs: int
    labelled: int
    tau_pairs: int
    tau_gain: float | None
    tau_gain_reason: str | None
    acceptance_gain: float | None
    acceptance_gain_reason: str | None
    speed_pairs: int
    throughput_gain_ratio: float | None
    throughput_gain_reason: str | None
    net_loss_ratio: float
    ci_lower: float
    ci_upper: float
    e_value: float
    fly_flip_ratio: float
    noise_flip_ratio: float
    verdict: Verdict
    verdict_text: str
    pairs_more: int | None


@dataclass(frozen=True, slots=True)
class ShadowStats:
    """One immutable snapshot of the shadow chain's statistics.

    ``windows[window][category]`` (category :data:`OVERALL` = all categories);
    ``pairs_total[(category, arm, outcome)]``, ``unpaired_total[reason]``,
    ``excluded_total[reason]`` and ``replays_total[status]`` are monotonic counters of this
    process's pairs (:class:`OutcomeCounters`: they start at 0 with the process and never fall
    while it runs; never recomputed from the pruned ledger);
    ``ledger_pairs[(category, arm, outcome)]`` the same counts over the rows the ledger holds
    now (a gauge: retention pruning lowers it); ``categories_folded`` requests whose
    category was counted as ``other`` (the category bound), ``category_takeovers`` the times a
    slot changed hands;
    ``betting_log_e_value`` is the since-start margin e-process (``None`` if not run);
    ``change_log_value`` the change detector's ``ln M`` and ``change_threshold`` its alarm level
    (:mod:`~specwatch.shadow.stats.detector`; ``None`` if not run); ``within_margin_declared_at``
    the labelled pair at which the confidence sequence declared "within margin" (never
    withdrawn; ``None`` while not declared);
    ``ledger_rows`` the rows in the ledger, ``ledger_write_errors[exception type]`` failed row
    writes; ``io`` the I/O side's queue/pause state when known; ``decisions`` the per-category
    decision table (:func:`specwatch.shadow.decision.decision_table`, since start, bounded
    categories); ``by_load`` flip rates per running-request band (since start);
    ``ledger_state`` whether the ledger can store rows
    (:data:`~specwatch.shadow.ledger.state.LedgerState`; pairing stops while it is not ``ok``).
    """

    generated_at: float
    alpha: float
    margin: float
    detect_net_loss: float
    windows: Mapping[str, Mapping[str, PairedSummary]]
    pairs_total: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    unpaired_total: Mapping[str, int] = field(default_factory=dict)
    excluded_total: Mapping[str, int] = field(default_factory=dict)
    betting_log_e_value: float | None = None
    change_log_value: float | None = None
    change_threshold: float | None = None
    within_margin_declared_at: int | None = None
    ledger_rows: int | None = None
    ledger_write_errors: Mapping[str, int] = field(default_factory=dict)
    io: ShadowIO | None = None
    decisions: tuple[DecisionRow, ...] = ()
    by_load: tuple[LoadBand, ...] = ()
    ledger_pairs: Mapping[tuple[str, str, str], int] = field(default_factory=dict)
    categories_folded: int = 0
    category_takeovers: int = 0
    replays_total: Mapping[str, int] = field(default_factory=dict)
    ledger_state: str = "ok"
    arm_totals: ArmTotals | None = None


@dataclass(frozen=True, slots=True)
class LoadBand:
    """Flip rates of the pairs replayed while ``band`` requests were running (since start, all
    categories): ``pairs`` paired requests, ``fly_flip_ratio`` share where FLy's answer differs
    from the standard's; ``noise_pairs`` those with a noise answer, ``noise_flip_ratio`` the
    noise arm's share (NaN when there are none). The lossless check in the band
    (:mod:`specwatch.shadow.lossless`): ``lossless_pairs`` greedy pairs where the no-speculation
    baseline and the noise arm answered, the standard arm's and the noise arm's flip rates
    against the baseline (NaN without such pairs)."""

    band: str
    pairs: int
    fly_flip_ratio: float
    noise_pairs: int
    noise_flip_ratio: float
    lossless_pairs: int = 0
    lossless_standard_flip_ratio: float = math.nan
    lossless_noise_flip_ratio: float = math.nan


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
        questions_still_needed=pairs_to_decide(
            net_loss_ratio(pc), disc, pc.n, margin, alpha, power
        ),
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


def build_shadow_stats(
    tallies: Mapping[str, Mapping[str, PairTally]],
    *,
    now: float,
    alpha: float = 0.05,
    margin: float = 0.01,
    detect_net_loss: float = 0.02,
    pairs_total: Mapping[tuple[str, str, str], int] | None = None,
    unpaired_total: Mapping[str, int] | None = None,
    excluded_total: Mapping[str, int] | None = None,
    betting_log_e_value: float | None = None,
    change_log_value: float | None = None,
    change_threshold: float | None = None,
    within_margin_declared_at: int | None = None,
    ledger_rows: int | None = None,
    ledger_write_errors: Mapping[str, int] | None = None,
    io: ShadowIO | None = None,
    decisions: tuple[DecisionRow, ...] = (),
    by_load: tuple[LoadBand, ...] = (),
    categories: Collection[str] | None = None,
    categories_folded: int = 0,
    category_takeovers: int = 0,
    replays_total: Mapping[str, int] | None = None,
    ledger_state: str = "ok",
    net_loss_log_e_value: float | None = None,
    arm_totals: ArmTotals | None = None,
) -> ShadowStats:
    """Summarise ``{window: {category: tally}}`` (from ``Ledger.tally`` per window or
    :func:`window_tallies`) into a :class:`ShadowStats`, adding the :data:`OVERALL` category.

    ``categories``: the kept categories (:class:`~specwatch.shadow.sample.CategoryBound`); the
    tallies of any other category (rows written before the bound, or by another configuration)
    are added into ``other``, so a ledger with thousands of categories still gives at most
    ``len(categories) + 2`` categories per window. ``None``: no folding. ``ledger_pairs`` is
    built from the ``since_start`` window (the whole ledger) when it is present.
    ``net_loss_log_e_value``: the ordered e-process's ``ln E`` (the sidecar's live state), the
    e-value of ``since_start`` / :data:`OVERALL`; ``None``: its count form. ``arm_totals``:
    the since-start per-request τ and speed sums of every category together (the verdict's τ
    and speed, :func:`specwatch.shadow.verdict.arm_ratios`)."""
    windows: dict[str, dict[str, PairedSummary]] = {}
    if categories is not None:
        tallies = {w: fold_categories(by_cat, categories) for w, by_cat in tallies.items()}
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
            out[cat] = summarize(t, alpha=alpha, margin=margin, detect_net_loss=detect_net_loss)
        out[OVERALL] = summarize(
            total,
            alpha=alpha,
            margin=margin,
            detect_net_loss=detect_net_loss,
            log_e_value=net_loss_log_e_value if wname == SINCE_START else None,
        )
        windows[wname] = out
    return ShadowStats(
        generated_at=now,
        alpha=alpha,
        margin=margin,
        detect_net_loss=detect_net_loss,
        windows=windows,
        pairs_total=dict(pairs_total or {}),
        unpaired_total=dict(unpaired_total or {}),
        excluded_total=dict(excluded_total or {}),
        betting_log_e_value=betting_log_e_value,
        change_log_value=change_log_value,
        change_threshold=change_threshold,
        within_margin_declared_at=within_margin_declared_at,
        ledger_rows=ledger_rows,
        ledger_write_errors=dict(ledger_write_errors or {}),
        io=io,
        decisions=decisions,
        by_load=by_load,
        ledger_pairs=ledger_pairs,
        categories_folded=categories_folded,
        category_takeovers=category_takeovers,
        replays_total=dict(replays_total or {}),
        ledger_state=ledger_state,
        arm_totals=arm_totals,
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


class OutcomeCounters:
    """The one set of monotonic pair counters: ``specwatch_shadow_pairs_total``,
    ``..._unpaired_total``, ``..._excluded_total`` and ``..._replays_total`` (mutable; owned by
    the one task that consumes outcomes).

    Per paired outcome and arm (``fly``, ``noise``): a correctness outcome when the pair is
    labelled (``both_correct|both_wrong|lost|gained``) and an agreement outcome
    (``agree|disagree``) always, so ``sum(outcome=~"agree|disagree")`` counts paired requests and
    ``sum(outcome=~"both_.*|lost|gained")`` labelled ones. ``paired`` counts paired requests,
    ``unpaired`` / ``excluded`` the others by reason; :meth:`by_status` sums them per status.
    """

    def __init__(self, categories: CategoryBound | None = None) -> None:
        self._categories = categories
        self.pairs: dict[tuple[str, str, str], int] = {}
        self.paired = 0
        self.unpaired: dict[str, int] = {}
        self.excluded: dict[str, int] = {}

    def _inc(self, key: tuple[str, str, str], n: int = 1) -> None:
        if n:
            self.pairs[key] = self.pairs.get(key, 0) + n

    def add(self, row: LedgerRow) -> None:
        """Count one compared pair, given as its ledger row, by the same table as :meth:`seed`
        (:func:`row_tally`), so counters rebuilt from the ledger equal counters kept live."""
        reasons: dict[tuple[str, str], int] = (
            {} if row.status == "paired" else {(row.status, row.reason or "unknown"): 1}
        )
        self.seed({row.category: row_tally(row)}, reasons)

    def fold(self) -> None:
        """Count the pairs of every category the bound no longer keeps as ``other`` (a slot
        that changed hands): the sum over categories is unchanged and the series stay at most
        the kept categories and ``other``."""
        bound = self._categories
        if bound is None:
            return
        for key in [k for k in self.pairs if bound.map(k[0]) != k[0]]:
            self._inc((OTHER_CATEGORY, key[1], key[2]), self.pairs.pop(key))

    def by_status(self) -> dict[str, int]:
        """Pairs per status (``paired``, ``unpaired``, ``excluded``; each present from 0)."""
        return {
            "paired": self.paired,
            "unpaired": sum(self.unpaired.values()),
            "excluded": sum(self.excluded.values()),
        }

    def seed(
        self, by_category: Mapping[str, PairTally], reasons: Mapping[tuple[str, str], int]
    ) -> None:
        """Add a ledger's totals (``Ledger.tally()`` and ``Ledger.reason_counts()``); with a
        category bound, a category it cannot keep is counted as ``other``."""
        for cat, t in by_category.items():
            if self._categories is not None:
                cat = self._categories.map(cat)
            self.paired += t.paired
            for arm, label, n in arm_label_counts(t):
                self._inc((cat, arm, label), n)
        for (status, reason), n in reasons.items():
            target = self.unpaired if status == "unpaired" else self.excluded
            target[reason] = target.get(reason, 0) + n


class LiveTallies:
    """The ledger's tallies kept in memory, updated per row and per window expiry (mutable;
    owned by the event loop's thread).

    Holds a :class:`~specwatch.shadow.windows.WindowedSums` of
    :class:`~specwatch.shadow.tally.HistoryCell` per ``(category, load band)`` over ``windows``
    (``{name: seconds}``, :data:`SINCE_START` = every row is always added), with buckets of
    ``bucket_seconds`` (the windows' edge granularity, see :mod:`specwatch.shadow.windows`).
    Fed by the ledger as a :class:`~specwatch.shadow.ledger.aggregates.HistoryListener`
    (committed rows, pruned groups) and rebuilt from :meth:`Ledger.history
    <specwatch.shadow.ledger.Ledger.history>` with :meth:`add_groups`. ``version`` grows on
    every change, so derived statistics are computed again only when it moved.
    """

    def __init__(
        self,
        windows: Mapping[str, float | None],
        bands: Sequence[int],
        *,
        now: float,
        bucket_seconds: float = 10.0,
    ) -> None:
        self.windows: dict[str, float | None] = {**windows, SINCE_START: None}
        self.bands = tuple(bands)
        self.sums: WindowedSums[tuple[str, str], HistoryCell] = WindowedSums(
            self.windows, zero=HistoryCell(), now=now, bucket_seconds=bucket_seconds
        )
        #: Grows by one on every change of any window's sums.
        self.version = 0
        # Until start(): ledger notifications are held back (the rebuild is being read).
        self._as_of: int | None = None
        self._held: list[tuple[int, Sequence[LedgerRow] | None, Sequence[HistoryGroup]]] = []

    # -- HistoryListener ----------------------------------------------------------------------

    def grouping(self) -> HistoryGrouping:
        """How the ledger groups rows for :meth:`add_groups` / :meth:`rows_pruned`."""
        return HistoryGrouping(self.sums.bucket_seconds, self.sums.horizon(), self.bands)

    def rows_written(self, rows: Sequence[LedgerRow], commit: int) -> None:
        """Add committed rows (O(1) each); before :meth:`start`, held back; ignored when
        ``commit`` is already in the rebuild."""
        if self._as_of is None:
            self._held.append((commit, rows, ()))
            return
        if commit <= self._as_of:
            return
        for r in rows:
            self.sums.add(
                r.time, (r.category, row_band(r.running_at_replay, self.bands)), row_cell(r)
            )
        if rows:
            self.version += 1

    def rows_pruned(self, groups: Sequence[HistoryGroup], commit: int) -> None:
        """Take back the groups of rows retention deleted (held back / ignored as
        :meth:`rows_written`)."""
        if self._as_of is None:
            self._held.append((commit, None, groups))
            return
        if commit <= self._as_of:
            return
        for g in groups:
            self.sums.remove_bucket(g.bucket, (g.category, g.band), g.cell)
        if groups:
            self.version += 1

    # -- rebuild and time ---------------------------------------------------------------------

    def start(self, as_of: int) -> None:
        """Apply the notifications held back since the listener was attached whose write
        transaction is after ``as_of`` (the rebuild's, :meth:`Ledger.history
        <specwatch.shadow.ledger.Ledger.history>`), then apply every later one as it comes."""
        self._as_of = as_of
        held, self._held = self._held, []
        for commit, rows, groups in held:
            if rows is not None:
                self.rows_written(rows, commit)
            else:
                self.rows_pruned(groups, commit)

    def add_groups(self, groups: Sequence[HistoryGroup]) -> None:
        """Add grouped rows read back from the ledger (the restart rebuild; before
        :meth:`start`)."""
        self.sums.add_buckets(((g.bucket, (g.category, g.band), g.cell) for g in groups), sum_cells)
        if groups:
            self.version += 1

    def advance(self, now: float) -> bool:
        """Expire buckets that left a window at ``now``; ``True`` when some sums changed."""
        changed = self.sums.advance(now)
        if changed:
            self.version += 1
        return changed

    # -- reading ------------------------------------------------------------------------------

    def tallies(self) -> dict[str, dict[str, PairTally]]:
        """``{window: {category: PairTally}}`` (what ``Ledger.tally(since=now - seconds)`` per
        window gives, to the bucket edge), categories sorted as SQL's ``GROUP BY`` returns them
        (float sums pooled over categories then add up in the same order)."""
        out: dict[str, dict[str, PairTally]] = {}
        for name in self.windows:
            by_cat: dict[str, PairTally] = {}
            for (cat, _band), cell in self.sums.sums(name).items():
                old = by_cat.get(cat)
                by_cat[cat] = cell.tally if old is None else old + cell.tally
            out[name] = dict(sorted(by_cat.items()))
        return out

    def by_load(self) -> dict[str, PairTally]:
        """``{band: PairTally}`` since start (``Ledger.tally_by_load``)."""
        out: dict[str, PairTally] = {}
        for (_cat, band), cell in self.sums.sums(SINCE_START).items():
            out[band] = out.get(band, PairTally()) + cell.tally
        return dict(sorted(out.items()))

    def arm_totals(self) -> dict[str, ArmTotals]:
        """``{category: ArmTotals}`` since start (``Ledger.arm_totals``)."""
        out: dict[str, ArmSums] = {}
        for (cat, _band), cell in self.sums.sums(SINCE_START).items():
            out[cat] = out.get(cat, ArmSums()) + cell.arms
        return {cat: sums.totals() for cat, sums in sorted(out.items())}

    def rows(self) -> int:
        """Rows in the ledger (``Ledger.row_count``)."""
        return sum(c.rows for c in self.sums.sums(SINCE_START).values())
