"""What the shadow side publishes: immutable values read by the exporter, the alert detectors, the
server and the tools (no behaviour; built by :mod:`specwatch.shadow.summary`)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from specwatch.core.config import DEFAULT_CHANGE_ARL, DEFAULT_MAX_CATEGORIES
from specwatch.shadow.stats.policy import PagePolicy
from specwatch.shadow.tally import ArmTotals, PairTally
from specwatch.shadow.values import Verdict


@dataclass(frozen=True, slots=True)
class PairedSummary:
    """Paired statistics for one (window, category); ratios are fractions, NaN when undefined.

    ``net_loss_ratio`` = acc(standard) - acc(FLy) with its Tango score interval
    ``[ci_lower, ci_upper]`` at ``ci_level``; ``p_two_sided`` / ``p_loss`` exact McNemar;
    ``log_e_value`` / ``e_value`` the no-net-loss e-value and ``alarm`` = e >= 1/alpha: a
    function of the lost and gained counts
    (:func:`~specwatch.shadow.stats.eprocess.count_log_e_value`), anytime valid since start
    (overall and per category; the page reads it at its policy's bounds); a rolling window's
    is the same function of its counts, not anytime valid, so no surface shows it as an
    e-value;
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
    ``paused[reason]`` (1 while paused), ``pause_text`` (why, naming the arm and its numbers:
    ``"paused: standard has 12 requests waiting"``; ``""`` while not), ``trickled`` (canary
    requests admitted through a pause specwatch chose, so the verdict keeps moving). Counters
    since process start: ``offered`` /
    ``not_sampled`` / ``admitted`` (sampler decisions), ``dropped[reason]``,
    ``pauses_total[reason]`` (entries into a load pause), ``received[source]`` and
    ``ingest_errors[(source, reason)]`` (requests seen by mirror/proxy/ingest; reasons include
    ``too_large`` and ``invalid_json``), ``arm_errors[(arm, reason)]`` (reasons include
    ``too_large`` and ``invalid_body``), ``sink_errors``, ``proxy_requests``,
    ``proxy_client_disconnects``, ``proxy_upstream_errors[reason]``,
    ``canary_offered`` and ``canary_bad_lines[reason]``, ``replay_retries[arm]`` (requests sent
    again after a close before any response byte), ``token_count_failures[(arm, reason)]``
    (replies without usage whose text the arm's ``/tokenize`` did not count; see
    :mod:`specwatch.shadow.replay`), and from vLLM's per-request
    speculative-decoding metrics in the replies, by ``(arm, category)``: ``reply_spec_steps``
    (verify steps), ``reply_draft_tokens``, ``reply_accepted_tokens`` (replies without a verify
    step add nothing); by ``(arm, finish_reason)`` (``"none"`` when the reply named none):
    ``reply_finishes`` (successful replies) and ``reply_finishes_with_spec`` (those carrying
    the metrics, see :meth:`spec_metrics_coverage`); by ``(arm, reason)``:
    ``reply_spec_refused`` (replies whose counts were inconsistent, refused and not counted
    above; reasons: :data:`specwatch.vllm.request_metrics.SPEC_PROBLEMS`). Pair statuses are
    not here: the pipeline never classifies a pair (the one set of pair counters is
    :class:`OutcomeCounters`). Exported by :mod:`specwatch.export.prometheus`.
    """

    queue_depth: int = 0
    in_flight: int = 0
    offered: int = 0
    not_sampled: int = 0
    admitted: int = 0
    dropped: Mapping[str, int] = field(default_factory=dict)
    paused: Mapping[str, int] = field(default_factory=dict)
    pause_text: str = ""
    trickled: int = 0
    pauses_total: Mapping[str, int] = field(default_factory=dict)
    received: Mapping[str, int] = field(default_factory=dict)
    ingest_errors: Mapping[tuple[str, str], int] = field(default_factory=dict)
    arm_errors: Mapping[tuple[str, str], int] = field(default_factory=dict)
    sink_errors: int = 0
    proxy_requests: int = 0
    proxy_client_disconnects: int = 0
    proxy_upstream_errors: Mapping[str, int] = field(default_factory=dict)
    canary_offered: int = 0
    canary_bad_lines: Mapping[str, int] = field(default_factory=dict)
    replay_retries: Mapping[str, int] = field(default_factory=dict)
    token_count_failures: Mapping[tuple[str, str], int] = field(default_factory=dict)
    reply_spec_steps: Mapping[tuple[str, str], int] = field(default_factory=dict)
    reply_draft_tokens: Mapping[tuple[str, str], int] = field(default_factory=dict)
    reply_accepted_tokens: Mapping[tuple[str, str], int] = field(default_factory=dict)
    reply_finishes: Mapping[tuple[str, str], int] = field(default_factory=dict)
    reply_finishes_with_spec: Mapping[tuple[str, str], int] = field(default_factory=dict)
    reply_spec_refused: Mapping[tuple[str, str], int] = field(default_factory=dict)

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
    n); ``tau_gain`` = τ of FLy minus the standard arm's, each ``1 + accepted / verify steps``
    summed over the ``tau_pairs`` requests where both returned counts (never an average of
    per-request τ; else from the replies' summed counts of this process);
    ``acceptance_gain`` = α_FLy − α_standard (accepted / drafted draft tokens summed over the
    replies of this process); ``throughput_gain_ratio`` = FLy tokens/s ÷ standard tokens/s − 1
    (completion tokens over replay seconds summed over
    ``speed_pairs`` requests, time to first token included); per arm, over the
    ``decode_pairs`` requests both arms streamed (from the first), ``*_decode_tokens_per_second``
    (tokens after the first ÷ seconds after the first output, summed: TTFT left out) and
    ``*_ttft_seconds`` (mean time to the first output), ``None`` without such a pair, and
    ``*_decode_ci_lower`` / ``*_decode_ci_upper`` the decode speed's 95 % interval
    (:func:`~specwatch.shadow.tally.arm_decode_intervals`; ``None`` below 2 such pairs);
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
    decode_pairs: int = 0
    standard_decode_tokens_per_second: float | None = None
    fly_decode_tokens_per_second: float | None = None
    standard_ttft_seconds: float | None = None
    fly_ttft_seconds: float | None = None
    standard_decode_ci_lower: float | None = None
    standard_decode_ci_upper: float | None = None
    fly_decode_ci_lower: float | None = None
    fly_decode_ci_upper: float | None = None


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
    (:data:`~specwatch.shadow.ledger.state.LedgerState`; pairing stops while it is not ``ok``);
    ``page_categories`` K, the category series the alerting policy divides its category share
    by (``shadow.max_categories`` + ``other``; :attr:`policy`).
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
    page_categories: int = DEFAULT_MAX_CATEGORIES + 1

    @property
    def policy(self) -> PagePolicy:
        """The alerting policy these statistics are paged by (its thresholds)."""
        return PagePolicy(
            alpha=self.alpha,
            margin=self.margin,
            categories=self.page_categories,
            change_arl=self.change_threshold
            if self.change_threshold is not None
            else DEFAULT_CHANGE_ARL,
        )


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
