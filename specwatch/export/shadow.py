"""Prometheus metric families for the shadow / paired statistics (names: docs/architecture.md).

:func:`shadow_families` turns one :class:`ShadowStats` snapshot into prometheus_client metric
families; it does no I/O, so a custom collector can call it from ``collect()``. NaN values
(undefined, e.g. no pairs yet) are left out rather than exported as NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from specwatch.core.config import OVERALL, SINCE_START
from specwatch.core.numbers import exp_or_inf
from specwatch.shadow.compare import EXCLUDED_REASONS
from specwatch.shadow.ledger import WRITE_ERROR_REASONS
from specwatch.shadow.summary import PairedSummary, ShadowStats

_WC = ["window", "category"]

#: (name, help, value of a summary) for the per-window, per-category gauges.
_SUMMARY_GAUGES: tuple[tuple[str, str, Callable[[PairedSummary], float | None]], ...] = (
    (
        "specwatch_paired_lost",
        "Labelled pairs the standard arm got right and FLy wrong.",
        lambda s: s.lost,
    ),
    (
        "specwatch_paired_gained",
        "Labelled pairs the standard arm got wrong and FLy right.",
        lambda s: s.gained,
    ),
    ("specwatch_paired_n", "Labelled pairs (both arms answered, gold known).", lambda s: s.n),
    (
        "specwatch_paired_net_loss_ratio",
        "Paired accuracy difference acc(standard) - acc(FLy) = (lost - gained) / n.",
        lambda s: s.net_loss_ratio,
    ),
    (
        "specwatch_paired_net_loss_ci_lower_ratio",
        "Lower bound of the Tango score interval (level 1 - alpha) for the net loss.",
        lambda s: s.ci_lower,
    ),
    (
        "specwatch_paired_net_loss_ci_upper_ratio",
        "Upper bound of the Tango score interval (level 1 - alpha) for the net loss.",
        lambda s: s.ci_upper,
    ),
    (
        "specwatch_paired_discordant_ratio",
        "Share of labelled pairs whose correctness flipped.",
        lambda s: s.discordant_ratio,
    ),
    (
        "specwatch_paired_non_inferiority_pass",
        "1 when the Tango non-inferiority test shows net loss < margin at level alpha.",
        lambda s: float(s.non_inferiority_pass),
    ),
    (
        "specwatch_paired_questions_needed",
        "Labelled pairs still needed (Connor 1987, power 0.8) to detect the configured net loss "
        "delta at discordant rate max(observed, delta); absent while there are no labelled "
        "pairs.",
        lambda s: s.questions_still_needed,
    ),
    (
        "specwatch_excess_flip_ratio",
        "FLy's answer-flip rate minus the noise arm's, on the same requests.",
        lambda s: s.excess_flip_ratio,
    ),
)


def _ok(v: float | None) -> bool:
    return v is not None and not math.isnan(v)


def shadow_families(state: ShadowStats) -> Iterator[Metric]:
    """Yield the shadow/paired metric families for ``state``.

    Counters (fleet-summable): ``specwatch_shadow_pairs_total{category,arm,outcome}``,
    ``specwatch_shadow_unpaired_total{reason}``, ``specwatch_shadow_excluded_total{reason}``
    (the known :data:`~specwatch.shadow.compare.EXCLUDED_REASONS` exported from 0),
    ``specwatch_ledger_write_errors_total{reason}`` (reason = exception type or ``queue_full``;
    the known :data:`~specwatch.shadow.ledger.WRITE_ERROR_REASONS` exported from 0; other
    reasons are added as they occur) and, when the I/O
    state is present, ``specwatch_shadow_dropped_total{reason}``. Gauges per ``window`` and
    ``category`` (``_all`` = overall): lost, gained, n, net loss and its interval, McNemar p
    (``alternative="two_sided|loss"``), discordant ratio, e-value
    (``hypothesis="no_net_loss"``; the since-start margin e-process adds
    ``hypothesis="margin"``), non-inferiority pass, questions still needed,
    ``specwatch_flip_ratio{arm}``, excess flip ratio; plus ``specwatch_ledger_rows``,
    ``specwatch_shadow_queue_depth``, ``specwatch_shadow_in_flight``,
    ``specwatch_shadow_paused{reason}``.
    """
    pairs = CounterMetricFamily(
        "specwatch_shadow_pairs",
        "Compared shadow pairs by outcome versus the standard arm (correctness outcomes for "
        "labelled pairs, agree/disagree for every paired request).",
        labels=["category", "arm", "outcome"],
    )
    for (cat, arm, outcome), n in sorted(state.pairs_total.items()):
        pairs.add_metric([cat, arm, outcome], n)
    yield pairs
    for name, text, counts, known in (
        (
            "specwatch_shadow_unpaired",
            "Shadow requests where one arm failed.",
            state.unpaired_total,
            (),
        ),
        (
            "specwatch_shadow_excluded",
            "Shadow requests excluded from comparison.",
            state.excluded_total,
            EXCLUDED_REASONS,
        ),
        (
            "specwatch_ledger_write_errors",
            "Ledger rows that failed to write, by exception type (queue_full: dropped unwritten).",
            state.ledger_write_errors,
            WRITE_ERROR_REASONS,
        ),
    ):
        fam = CounterMetricFamily(name, text, labels=["reason"])
        for reason, n in sorted({**dict.fromkeys(known, 0), **counts}.items()):
            fam.add_metric([reason], n)
        yield fam

    for name, text, get in _SUMMARY_GAUGES:
        g = GaugeMetricFamily(name, text, labels=_WC)
        for window, cats in state.windows.items():
            for cat, s in cats.items():
                v = get(s)
                if v is not None and not math.isnan(v):
                    g.add_metric([window, cat], float(v))
        yield g

    p = GaugeMetricFamily(
        "specwatch_paired_mcnemar_p_value",
        "Exact McNemar p-value on the discordant pairs (two-sided, or one-sided for FLy loss).",
        labels=[*_WC, "alternative"],
    )
    e = GaugeMetricFamily(
        "specwatch_paired_e_value",
        "Anytime-valid e-value against 'no net loss' (beta-binomial mixture on discordant "
        "pairs; alarm at >= 1/alpha; anytime-valid for window since_start) and, since start, "
        "against 'net loss <= margin' (betting).",
        labels=[*_WC, "hypothesis"],
    )
    flip = GaugeMetricFamily(
        "specwatch_flip_ratio",
        "Share of paired requests whose answer differs from the standard arm's.",
        labels=[*_WC, "arm"],
    )
    for window, cats in state.windows.items():
        for cat, s in cats.items():
            p.add_metric([window, cat, "two_sided"], s.p_two_sided)
            p.add_metric([window, cat, "loss"], s.p_loss)
            e.add_metric([window, cat, "no_net_loss"], s.e_value)
            if _ok(s.fly_flip_ratio):
                flip.add_metric([window, cat, "fly"], s.fly_flip_ratio)
            if _ok(s.noise_flip_ratio):
                flip.add_metric([window, cat, "noise"], s.noise_flip_ratio)
    if state.betting_log_e_value is not None:
        lw = state.betting_log_e_value
        e.add_metric([SINCE_START, OVERALL, "margin"], exp_or_inf(lw))
    yield p
    yield e
    yield flip

    yield from _scalar_gauges(state)


def _scalar_gauges(state: ShadowStats) -> Iterable[Metric]:
    if state.ledger_rows is not None:
        yield GaugeMetricFamily(
            "specwatch_ledger_rows", "Rows in the pair ledger.", value=state.ledger_rows
        )
    io = state.io
    if io is None:
        return
    yield GaugeMetricFamily(
        "specwatch_shadow_queue_depth", "Sampled requests waiting to replay.", value=io.queue_depth
    )
    yield GaugeMetricFamily(
        "specwatch_shadow_in_flight", "Shadow replays in flight.", value=io.in_flight
    )
    dropped = CounterMetricFamily(
        "specwatch_shadow_dropped", "Sampled shadow requests dropped, by reason.", labels=["reason"]
    )
    for reason, n in sorted(io.dropped_total.items()):
        dropped.add_metric([reason], n)
    yield dropped
    paused = GaugeMetricFamily(
        "specwatch_shadow_paused",
        "1 while shadow replay is paused for this reason.",
        labels=["reason"],
    )
    for reason, on in sorted(io.paused.items()):
        paused.add_metric([reason], float(on))
    yield paused
