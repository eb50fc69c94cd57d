"""The one-line verdict "what is FLy costing me?", in words and accuracy points.

One pure function, :func:`verdict_line`, builds the sentence shown by the demo's live view,
``/api/v1/snapshot`` (``"verdict"``) and ``specwatch report``, e.g.::

    FLy: τ +13 %, speed per request +9 %, net loss 3.5 pts (95 % CI 0.7 to 6.5) on
    351 labelled pairs; e-value 8.3 of 30 needed; not yet shown within 1 pt: about 2,100 more
    pairs

Units: accuracy differences in points (1 pt = 1 % of the questions), rates and ratios as ``%``
changes. The decision signal is the anytime-valid e-value (at the overall page's bound
``1/(alpha x 2/3)``, 30 at alpha = 5 %: "net loss shown" exactly when the page fires; Ville 1939);
no fixed-n p-value decides it. The interval is always on the scale of the printed number
(a net gain is printed with the interval of the gain). "Shown within M pt" comes from the
anytime-valid confidence sequence (:mod:`specwatch.shadow.stats.confseq`): once declared it is
never withdrawn; the one-look Tango test is shown beside it, labelled "one-look". Below
:data:`MIN_VERDICT_PAIRS` labelled pairs the sentence says "too few pairs" instead of a
verdict. "About N more pairs" is :func:`specwatch.shadow.stats.power.pairs_to_decide`, under
the observed effect (the same function as the decision table).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from specwatch.core.config import OVERALL
from specwatch.shadow.stats.policy import NO_NET_LOSS, PagePolicy
from specwatch.shadow.stats.power import pairs_to_decide
from specwatch.shadow.stats.sequential import e_value_alarm
from specwatch.shadow.tally import (
    Z_95,
    ArmTotals,
    arm_decode,
    arm_decode_intervals,
    arm_speeds,
    arm_tau_means,
)

if TYPE_CHECKING:  # annotations only
    from specwatch.shadow.published import PairedSummary


class DecodeRatios(NamedTuple):
    """FLy / standard on the pairs both arms streamed: ``decode`` tokens/s, mean ``ttft``, and
    ``decode_interval`` the decode ratio's 95 % interval (``None`` each when unknown)."""

    decode: float | None = None
    ttft: float | None = None
    decode_interval: tuple[float, float] | None = None


@dataclass(frozen=True, slots=True)
class Verdict:
    """The numbers the verdict sentence reads (all optional parts ``None`` when unknown).

    ``tau_ratio``: τ FLy / τ standard; ``throughput_ratio``: FLy / standard per-request
    generation speed (equal traffic, TTFT included); ``decode_ratio`` / ``ttft_ratio``: FLy /
    standard decode tokens/s (TTFT left out) and mean TTFT on the pairs both arms streamed
    (:func:`decode_ratios`; when known they replace the per-request speed), ``decode_interval``
    the decode ratio's 95 % interval; ``n``: labelled
    pairs; ``net_loss``, ``ci_lower``,
    ``ci_upper``: fractions (0.035 = 3.5 pts) at ``ci_level``; ``e_value`` the since-start
    no-net-loss e-value, alarm at ``1 / alpha``; ``margin`` the non-inferiority margin (fraction);
    ``non_inferior``: "within margin" declared by the confidence sequence (never withdrawn);
    ``declared_at``: the labelled pair at which it was declared when known (the sign-off is
    about pairs 1 to it; ``None``: about all ``n`` pairs);
    ``one_look_within``: the one-look Tango test passes at these counts; ``discordant``: share of
    labelled pairs that flip; ``lost`` / ``gained``: the discordant counts.
    """

    tau_ratio: float | None = None
    throughput_ratio: float | None = None
    decode_ratio: float | None = None
    ttft_ratio: float | None = None
    decode_interval: tuple[float, float] | None = None
    n: int = 0
    net_loss: float = math.nan
    ci_lower: float = math.nan
    ci_upper: float = math.nan
    ci_level: float = 0.95
    e_value: float = math.nan
    alpha: float = 0.05
    margin: float = 0.01
    non_inferior: bool = False
    declared_at: int | None = None
    discordant: float = math.nan
    one_look_within: bool = False
    lost: int = 0
    gained: int = 0


#: Labelled pairs below which the verdict says "too few pairs" instead of a conclusion.
MIN_VERDICT_PAIRS = 30


def verdict_from_summary(
    s: PairedSummary,
    *,
    alpha: float,
    margin: float,
    tau_ratio: float | None = None,
    throughput_ratio: float | None = None,
    declared_at: int | None = None,
    decode: DecodeRatios | None = None,
) -> Verdict:
    """A :class:`Verdict` from one :class:`PairedSummary` (use the ``since_start`` overall one:
    its e-value is the anytime-valid one) and the optional speed ratios. ``declared_at``: the
    pair at which the live confidence sequence declared "within margin" (the sidecar keeps it);
    without it the declaration is read from the summary's counts. ``decode``: the
    :func:`decode_ratios`."""
    return Verdict(
        tau_ratio=tau_ratio,
        throughput_ratio=throughput_ratio,
        decode_ratio=decode.decode if decode is not None else None,
        ttft_ratio=decode.ttft if decode is not None else None,
        decode_interval=decode.decode_interval if decode is not None else None,
        n=s.n,
        net_loss=s.net_loss_ratio,
        ci_lower=s.ci_lower,
        ci_upper=s.ci_upper,
        ci_level=s.ci_level,
        e_value=s.e_value,
        alpha=alpha,
        margin=margin,
        non_inferior=declared_at is not None or s.within_margin_declared,
        declared_at=declared_at,
        discordant=s.discordant_ratio,
        one_look_within=s.non_inferiority_pass,
        lost=s.lost,
        gained=s.gained,
    )


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def change_percent(ratio: float | None) -> str:
    """``1.13`` → ``"+13 %"``, ``0.91`` → ``"-9 %"``, ``None``/NaN → ``"n/a"``."""
    if ratio is None or not math.isfinite(ratio):
        return "n/a"
    pct = round(100.0 * (ratio - 1.0))
    return f"{pct:+d} %" if pct else "±0 %"


def points(x: float) -> str:
    """A fraction as accuracy points with one decimal: ``0.035`` → ``"3.5"``."""
    return f"{100.0 * x:.1f}"


def e_value_text(e: float) -> str:
    """An e-value for people: 2 significant digits below 10, whole above, ``1.2e+05`` beyond
    1000, ``"inf"`` when it overflowed."""
    if math.isnan(e):
        return "n/a"
    if math.isinf(e):
        return "inf"
    if e < 10:
        return f"{e:.2g}"
    if e < 1000:
        return f"{e:.0f}"
    return f"{e:.1e}"


def _about(n: int) -> str:
    """``2094`` → ``"2,100"``: two significant digits, thousands separated."""
    if n < 100:
        return str(n)
    digits = len(str(n)) - 2
    return f"{round(n, -digits):,}"


def more_pairs_needed(v: Verdict) -> int | None:
    """Labelled pairs still needed, under the observed effect
    (:func:`~specwatch.shadow.stats.power.pairs_to_decide`); ``None`` without labelled pairs."""
    if v.n <= 0:
        return None
    return pairs_to_decide(v.net_loss, v.discordant, v.n, v.margin, alpha=v.alpha)


def signed_interval(v: Verdict) -> tuple[float, float, float]:
    """``(value, lower, upper)`` on the scale of the printed word: the net loss and its interval
    when ``net_loss >= 0``, else the net gain ``-net_loss`` with the interval
    ``(-ci_upper, -ci_lower)``; so the interval always runs low to high around the number."""
    if v.net_loss >= 0:
        return v.net_loss, v.ci_lower, v.ci_upper
    return -v.net_loss, -v.ci_upper, -v.ci_lower


def verdict_line(v: Verdict) -> str:
    """The verdict sentence (one line, no trailing period; see the module docstring).

    Parts, in order: τ and throughput changes (``%``, omitted when both unknown); the net loss
    (or net gain) in points with its interval and the labelled pairs; the e-value against the
    overall page's bound; the conclusion: "net loss shown" once the e-value reached it (the
    page fires), "shown within M pt over pairs 1-N" once the confidence sequence declared it
    (at pair N; with "not signed off for later pairs" when the current interval lies above
    the margin, so a sign-off never stands beside a contradicting interval or alarm: the alarm
    comes first), else "net loss not yet shown" (the
    observed loss is at least the margin) or "not yet shown within M pt" (with the one-look
    test's result when it passes), and the pairs still needed. Below
    :data:`MIN_VERDICT_PAIRS` labelled pairs: "too few pairs" and no conclusion.
    """
    speed: list[str] = []
    if _finite(v.tau_ratio):
        speed.append(f"τ {change_percent(v.tau_ratio)}")
    if _finite(v.decode_ratio):
        dci = v.decode_interval
        shown = (
            f" (95 % interval {change_percent(dci[0])} to {change_percent(dci[1])})"
            if dci is not None
            else ""
        )
        speed.append(f"decode tokens/s {change_percent(v.decode_ratio)}{shown}")
        if _finite(v.ttft_ratio):
            speed.append(f"TTFT {change_percent(v.ttft_ratio)}")
    elif _finite(v.throughput_ratio):
        speed.append(f"speed per request {change_percent(v.throughput_ratio)}")
    head = "FLy: " + (", ".join(speed) + ", " if speed else "")
    if v.n <= 0 or not math.isfinite(v.net_loss):
        return head + "no labelled pairs yet (quality unknown)"
    pairs = "pair" if v.n == 1 else "pairs"
    if v.n < MIN_VERDICT_PAIRS:
        return head + (
            f"too few pairs: {v.n:,} labelled {pairs}, a verdict needs {MIN_VERDICT_PAIRS}"
        )
    word = "net loss" if v.net_loss >= 0 else "net gain"
    value, low, high = signed_interval(v)
    level = f"{100.0 * v.ci_level:.0f} % CI, one-look"
    ci = (
        f" ({level} {points(low)} to {points(high)})"
        if math.isfinite(low) and math.isfinite(high)
        else ""
    )
    quality = f"{word} {points(value)} pts{ci} on {v.n:,} labelled {pairs}"
    # the overall page's bound (the alerting policy): "net loss shown" exactly when it pages
    page_alpha = PagePolicy(alpha=v.alpha).test_alpha(OVERALL, NO_NET_LOSS)
    evidence = f"e-value {e_value_text(v.e_value)} of {1.0 / page_alpha:g} needed"
    margin_pts = 100.0 * v.margin
    margin = f"{margin_pts:g} pt" + ("" if margin_pts == 1 else "s")
    if e_value_alarm(v.e_value, page_alpha):
        end = "net loss shown (e-value reached the threshold)"
    elif v.non_inferior:
        over = v.declared_at if v.declared_at is not None else v.n
        end = f"shown within {margin} over pairs 1-{over:,} (confidence sequence)"
        if _finite(v.ci_lower) and v.ci_lower > v.margin:
            # a sign-off never stands beside an interval that contradicts it now
            end += f"; the interval now lies above {margin}: not signed off for later pairs"
    else:
        more = more_pairs_needed(v)
        one_look = " (one-look test: within)" if v.one_look_within else ""
        question = (
            "net loss not yet shown"
            if v.net_loss >= v.margin
            else f"not yet shown within {margin}{one_look}"
        )
        end = question + (f": about {_about(more)} more pairs" if more else "")
    return f"{head}{quality}; {evidence}; {end}"


def per_request_speed_ratio(
    fly_tau: float | None,
    fly_step_gap_seconds: float | None,
    standard_tau: float | None,
    standard_step_gap_seconds: float | None,
) -> float | None:
    """FLy / standard generation speed of one request: τ (tokens per step) ÷ the median gap
    between a request's output events (``vllm:inter_token_latency_seconds``, one event per step
    with speculative decoding) for each server. A per-request rate, so a server that receives
    more traffic (e.g. the noise arm's replays to the standard server) does not look faster for
    it, as total tokens/s would. ``None`` when a value is missing or not positive."""
    vals: list[float] = []
    for x in (fly_tau, fly_step_gap_seconds, standard_tau, standard_step_gap_seconds):
        if x is None or not math.isfinite(x) or x <= 0:
            return None
        vals.append(x)
    fly_t, fly_gap, std_t, std_gap = vals
    return (fly_t / fly_gap) / (std_t / std_gap)


def decode_ratios(t: ArmTotals) -> DecodeRatios:
    """The :class:`DecodeRatios` over the pairs both arms streamed
    (:func:`~specwatch.shadow.tally.arm_decode`), from the first such pair; ``None`` each
    without one (or a standard value of 0). The interval, from 2 pairs on, is the delta method
    on the log of the ratio with each arm's standard error from its own interval
    (:func:`~specwatch.shadow.tally.arm_decode_intervals`) and the two variances added (the
    pairing's covariance left out: the interval is wider when the arms' speeds move together
    from request to request, as they do on the same requests)."""
    d = arm_decode(t)
    if d is None:
        return DecodeRatios()
    (s_speed, f_speed), (s_ttft, f_ttft) = d
    ratio = f_speed / s_speed if s_speed > 0 else None
    return DecodeRatios(
        ratio,
        f_ttft / s_ttft if s_ttft > 0 else None,
        _ratio_interval(ratio, (s_speed, f_speed), arm_decode_intervals(t)),
    )


def _ratio_interval(
    ratio: float | None,
    speeds: tuple[float, float],
    intervals: tuple[tuple[float, float] | None, tuple[float, float] | None],
) -> tuple[float, float] | None:
    s_ci, f_ci = intervals
    if ratio is None or ratio <= 0 or s_ci is None or f_ci is None:
        return None
    # each arm's relative standard error: its 95 % half-width ÷ z ÷ its speed
    rel = [(hi - lo) / 2.0 / Z_95 / v for (lo, hi), v in zip((s_ci, f_ci), speeds, strict=True)]
    half = Z_95 * math.hypot(*rel)
    return ratio * math.exp(-half), ratio * math.exp(half)


def arm_ratios(t: ArmTotals) -> tuple[float | None, float | None]:
    """``(τ ratio, speed ratio)`` FLy / standard from the paired rows' per-request sums
    (:func:`arm_tau_means`, :func:`arm_speeds`): the verdict sentence's τ and speed parts, the
    same numbers for the live view, ``/api/v1/snapshot`` and ``specwatch report``. ``None``
    where the pairs carry no τ (or too few speeds), or the standard arm's value is 0."""
    taus, speeds = arm_tau_means(t), arm_speeds(t)
    tau = taus[1] / taus[0] if taus is not None and taus[0] > 0 else None
    speed = speeds[1] / speeds[0] if speeds is not None and speeds[0] > 0 else None
    return tau, speed
