"""Immutable values the shadow statistics publish: per-window tallies and the ``ShadowStats``
snapshot read by the exporter (``shadow_families``) and the alert detectors."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Protocol

from specwatch.shadow.compare import PairOutcome
from specwatch.shadow.stats.paired import (
    FlipCounts,
    PairedCounts,
    discordant_ratio,
    excess_flip,
    mcnemar_exact_p,
    net_loss_ci,
    net_loss_ratio,
    non_inferiority_test,
)
from specwatch.shadow.stats.power import questions_needed
from specwatch.shadow.stats.sequential import (
    BettingEProcess,
    alarm,
    net_loss_log_e_value,
)
from specwatch.shadow.values import Arm

#: Category label used for the overall (all categories) summary.
OVERALL = "_all"


@dataclass(frozen=True, slots=True)
class PairTally:
    """Counts over a set of ledger rows (one window and category).

    FLy versus standard on labelled pairs: ``both_correct, lost, gained, both_wrong``; the noise
    arm versus standard on labelled pairs: ``noise_*``; answer agreement with the standard arm on
    all paired rows: ``agree, disagree`` (FLy) and ``noise_agree, noise_disagree``; the paired
    flip table on rows where the noise arm answered: ``flip_fly_only, flip_noise_only,
    flip_both, flip_neither``; plus ``unpaired`` and ``excluded`` rows.
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
    unpaired: int = 0
    excluded: int = 0

    def __add__(self, other: PairTally) -> PairTally:
        return PairTally(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )

    def paired_counts(self) -> PairedCounts:
        """FLy vs standard correctness table."""
        return PairedCounts(self.both_correct, self.lost, self.gained, self.both_wrong)

    def noise_paired_counts(self) -> PairedCounts:
        """Noise arm vs standard correctness table (an A/A comparison)."""
        return PairedCounts(
            self.noise_both_correct, self.noise_lost, self.noise_gained, self.noise_both_wrong
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


@dataclass(frozen=True, slots=True)
class PairedSummary:
    """Paired statistics for one (window, category); ratios are fractions, NaN when undefined.

    ``net_loss_ratio`` = acc(standard) - acc(FLy) with its Tango score interval
    ``[ci_lower, ci_upper]`` at ``ci_level``; ``p_two_sided`` / ``p_loss`` exact McNemar;
    ``log_e_value`` / ``e_value`` the focused mixture e-process on the discordant pairs (anytime
    valid only for the ``since_start`` window) and ``alarm`` = e >= 1/alpha;
    ``non_inferiority_*`` the Tango test against the margin; ``questions_needed`` (Connor 1987)
    for detecting a net loss δ = ``detect_net_loss`` at the planning discordant rate
    p_d = max(observed discordant rate, δ) (a net loss of δ implies at least δ discordance;
    Connor's formula needs p_d >= δ), ``None`` only while there are no labelled pairs (the
    discordant rate is undefined); ``questions_still_needed`` = max(0, needed - n); flip ratios
    from answer agreement.
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


@dataclass(frozen=True, slots=True)
class ShadowIO:
    """Shadow I/O health the ingest/sampler side reports (filled in by the app).

    ``dropped_total`` and ``paused`` are keyed by reason.
    """

    queue_depth: int = 0
    in_flight: int = 0
    dropped_total: Mapping[str, int] = field(default_factory=dict)
    paused: Mapping[str, bool] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ShadowStats:
    """One immutable snapshot of the shadow chain's statistics.

    ``windows[window][category]`` (category :data:`OVERALL` = all categories);
    ``pairs_total[(category, arm, outcome)]``, ``unpaired_total[reason]`` and
    ``excluded_total[reason]`` are monotonic counters since process start (seeded from the ledger
    at start); ``betting_log_e_value`` is the since-start margin e-process (``None`` if not run);
    ``ledger_rows`` the rows in the ledger, ``ledger_write_errors[exception type]`` failed row
    writes; ``io`` the I/O side's queue/pause state when known.
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
    ledger_rows: int | None = None
    ledger_write_errors: Mapping[str, int] = field(default_factory=dict)
    io: ShadowIO | None = None


# -- building snapshots (pure) ------------------------------------------------------------------


class TallyRow(Protocol):
    """What :func:`tally_rows` reads from a row (``LedgerRow`` has all of it)."""

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


def _row_tally(r: TallyRow) -> PairTally:
    if r.status == "unpaired":
        return PairTally(unpaired=1)
    if r.status != "paired":
        return PairTally(excluded=1)
    c: dict[str, int] = {}
    s, f, z = r.standard_correct, r.fly_correct, r.noise_correct
    table = {
        (True, True): "both_correct",
        (True, False): "lost",
        (False, True): "gained",
        (False, False): "both_wrong",
    }
    if s is not None and f is not None:
        c[table[(s, f)]] = 1
    if s is not None and z is not None:
        c["noise_" + table[(s, z)]] = 1
    if r.fly_agrees is not None:
        c["agree" if r.fly_agrees else "disagree"] = 1
    if r.noise_agrees is not None:
        c["noise_agree" if r.noise_agrees else "noise_disagree"] = 1
    if r.fly_agrees is not None and r.noise_agrees is not None:
        flip = {
            (False, True): "flip_fly_only",
            (True, False): "flip_noise_only",
            (False, False): "flip_both",
            (True, True): "flip_neither",
        }
        c[flip[(r.fly_agrees, r.noise_agrees)]] = 1
    return PairTally(**c)


def tally_rows(rows: Iterable[TallyRow]) -> dict[str, PairTally]:
    """Per-category :class:`PairTally` of ``rows`` (same rules as ``Ledger.tally``'s SQL)."""
    out: dict[str, PairTally] = {}
    for r in rows:
        out[r.category] = out.get(r.category, PairTally()) + _row_tally(r)
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


def summarize(
    tally: PairTally,
    *,
    alpha: float = 0.05,
    margin: float = 0.01,
    detect_net_loss: float = 0.02,
    power: float = 0.8,
) -> PairedSummary:
    """All paired statistics for one tally (see :class:`PairedSummary`).

    Sources: exact McNemar (McNemar 1947), Tango (1998) score interval and non-inferiority test,
    focused mixture e-value centred on ``detect_net_loss`` (Robbins 1970; Ville 1939;
    :func:`~specwatch.shadow.stats.sequential.net_loss_mixture_log_e_values`), Connor (1987)
    sample size, excess flip test (one-sided exact McNemar on the FLy/noise discordant flips).
    """
    pc = tally.paired_counts()
    ci = net_loss_ci(pc, level=1.0 - alpha)
    ni = non_inferiority_test(pc, margin=margin, alpha=alpha)
    log_e = net_loss_log_e_value(pc.lost, pc.gained, detect_net_loss)
    disc = discordant_ratio(pc)
    needed: int | None = None
    if math.isfinite(disc) and 0.0 < detect_net_loss <= 1.0:
        # A net loss of δ implies a discordant rate of at least δ, so below δ the planning
        # discordance is δ itself (Connor's formula needs p_d >= δ).
        needed = questions_needed(
            detect_net_loss, max(disc, detect_net_loss), alpha=alpha, power=power
        )
    ex = excess_flip(tally.flip_counts())
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
        e_value=math.inf if log_e > 709.0 else math.exp(log_e),
        alarm=alarm(log_e, alpha),
        non_inferiority_p=ni.p_value,
        non_inferiority_upper=ni.upper_bound,
        non_inferiority_pass=ni.passed,
        questions_needed=needed,
        questions_still_needed=None if needed is None else max(0, needed - pc.n),
        fly_flip_ratio=fly_flip,
        noise_flip_ratio=noise_flip,
        excess_flip_ratio=ex.excess_flip_ratio,
        excess_flip_p=ex.p_value,
        noise_pairs=tally.flip_counts().n,
    )


def betting_from_rows(rows: Iterable[TallyRow], margin: float) -> BettingEProcess:
    """Run the margin e-process (``H0: net loss <= margin``) over labelled paired rows in the
    given (time) order; ``d = +1`` lost, ``-1`` gained, ``0`` concordant."""
    state = BettingEProcess(margin=margin)
    for r in rows:
        if r.status != "paired" or r.standard_correct is None or r.fly_correct is None:
            continue
        state = state.update(int(r.standard_correct) - int(r.fly_correct))
    return state


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
    ledger_rows: int | None = None,
    ledger_write_errors: Mapping[str, int] | None = None,
    io: ShadowIO | None = None,
) -> ShadowStats:
    """Summarise ``{window: {category: tally}}`` (from ``Ledger.tally`` per window or
    :func:`window_tallies`) into a :class:`ShadowStats`, adding the :data:`OVERALL` category."""
    windows: dict[str, dict[str, PairedSummary]] = {}
    for wname, by_cat in tallies.items():
        total = PairTally()
        out: dict[str, PairedSummary] = {}
        for cat, t in sorted(by_cat.items()):
            if cat == OVERALL:
                continue
            total = total + t
            out[cat] = summarize(t, alpha=alpha, margin=margin, detect_net_loss=detect_net_loss)
        out[OVERALL] = summarize(total, alpha=alpha, margin=margin, detect_net_loss=detect_net_loss)
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
        ledger_rows=ledger_rows,
        ledger_write_errors=dict(ledger_write_errors or {}),
        io=io,
    )


class OutcomeCounters:
    """Monotonic pair counters for ``specwatch_shadow_pairs_total`` and friends (mutable; owned
    by the one task that consumes outcomes).

    Per paired outcome and arm (``fly``, ``noise``): a correctness outcome when the pair is
    labelled (``both_correct|both_wrong|lost|gained``) and an agreement outcome
    (``agree|disagree``) always, so ``sum(outcome=~"agree|disagree")`` counts paired requests and
    ``sum(outcome=~"both_.*|lost|gained")`` labelled ones.
    """

    def __init__(self) -> None:
        self.pairs: dict[tuple[str, str, str], int] = {}
        self.unpaired: dict[str, int] = {}
        self.excluded: dict[str, int] = {}

    def _inc(self, key: tuple[str, str, str], n: int = 1) -> None:
        if n:
            self.pairs[key] = self.pairs.get(key, 0) + n

    def add(self, o: PairOutcome) -> None:
        """Count one compared pair."""
        if o.status == "unpaired":
            self.unpaired[o.reason or "unknown"] = self.unpaired.get(o.reason or "unknown", 0) + 1
            return
        if o.status == "excluded":
            self.excluded[o.reason or "unknown"] = self.excluded.get(o.reason or "unknown", 0) + 1
            return
        for arm in (Arm.FLY, Arm.NOISE):
            for label in (o.correctness_outcome(arm), o.agreement_outcome(arm)):
                if label is not None:
                    self._inc((o.category, str(arm), label))

    def seed(
        self, by_category: Mapping[str, PairTally], reasons: Mapping[tuple[str, str], int]
    ) -> None:
        """Start from a ledger's totals (``Ledger.tally()`` and ``Ledger.reason_counts()``)."""
        for cat, t in by_category.items():
            for label in ("both_correct", "lost", "gained", "both_wrong", "agree", "disagree"):
                self._inc((cat, "fly", label), getattr(t, label))
                self._inc((cat, "noise", label), getattr(t, "noise_" + label))
        for (status, reason), n in reasons.items():
            target = self.unpaired if status == "unpaired" else self.excluded
            target[reason] = target.get(reason, 0) + n


def _json_num(v: object) -> object:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def shadow_stats_json(stats: ShadowStats) -> dict[str, Any]:
    """JSON-safe dict of a snapshot for ``/api/v1/snapshot``'s ``"shadow"`` key.

    Non-finite numbers (NaN, an overflowed e-value) become ``null`` (``log_e_value`` and
    ``betting_log_e_value`` stay finite); ``pairs_total`` becomes a
    list of ``{"category", "arm", "outcome", "count"}``.
    """

    def summary(s: PairedSummary) -> dict[str, object]:
        d: dict[str, object] = {
            f.name: _json_num(getattr(s, f.name)) for f in fields(s) if f.name != "tally"
        }
        d["tally"] = asdict(s.tally)
        return d

    io = stats.io
    bet = stats.betting_log_e_value
    return {
        "generated_at": stats.generated_at,
        "alpha": stats.alpha,
        "margin": stats.margin,
        "detect_net_loss": stats.detect_net_loss,
        "windows": {
            w: {cat: summary(s) for cat, s in cats.items()} for w, cats in stats.windows.items()
        },
        "pairs_total": [
            {"category": c, "arm": a, "outcome": o, "count": n}
            for (c, a, o), n in sorted(stats.pairs_total.items())
        ],
        "unpaired_total": dict(stats.unpaired_total),
        "excluded_total": dict(stats.excluded_total),
        "betting_e_value": None if bet is None or bet > 709.0 else math.exp(bet),
        "betting_log_e_value": bet,
        "ledger_rows": stats.ledger_rows,
        "ledger_write_errors": dict(stats.ledger_write_errors),
        "io": None
        if io is None
        else {
            "queue_depth": io.queue_depth,
            "in_flight": io.in_flight,
            "dropped_total": dict(io.dropped_total),
            "paused": dict(io.paused),
        },
    }
