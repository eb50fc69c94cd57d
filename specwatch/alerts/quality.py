"""The shadow chain's detectors: the quality page (:class:`PagePolicy`), the change warning, the
non-inferiority warning, the flip rate against the noise floor and the lossless check, each
from :class:`~specwatch.shadow.published.ShadowStats` (pure: values in, alerts out)."""

from __future__ import annotations

import math

from specwatch.alerts.alert import Alert, Severity
from specwatch.alerts.conditions import (
    flip_rate_above_noise,
    lossless_flips,
    quality_drift,
)
from specwatch.alerts.settings import DetectSettings
from specwatch.core.config import OVERALL, SINCE_START, parse_duration
from specwatch.core.numbers import exp_or_inf
from specwatch.shadow.published import PairedSummary, ShadowStats
from specwatch.shadow.stats.policy import MARGIN, NO_NET_LOSS, PagePolicy


def shadow_window(shadow: ShadowStats, name: str) -> dict[str, PairedSummary]:
    got = shadow.windows.get(name)
    return dict(got) if got is not None else {}


def quality_alerts(shadow: ShadowStats, s: DetectSettings) -> list[Alert]:
    """SpecQualityDrift by the alerting policy (:class:`~specwatch.shadow.stats.policy.PagePolicy`:
    every since-start e-value at its own share of alpha, so the page as a whole keeps alpha),
    SpecNonInferiorityNotShown (info) and the change warning SpecQualityChange."""
    out: list[Alert] = []
    policy = shadow.policy
    since = shadow_window(shadow, SINCE_START)
    for category, summ in sorted(since.items()):
        level = policy.test_alpha(category, NO_NET_LOSS)
        found = quality_drift(summ.e_value, summ.non_inferiority_pass, summ.n, level, s)
        if "e_value" in found:
            out.append(_quality_alert(category, NO_NET_LOSS, found["e_value"], summ, policy))
        if "non_inferiority" in found:
            out.append(_non_inferiority_alert(category, found["non_inferiority"], summ, s))
    bet = shadow.betting_log_e_value
    if bet is not None and math.isfinite(bet):
        e = exp_or_inf(bet)
        found = quality_drift(e, None, None, policy.test_alpha(OVERALL, MARGIN), s)
        if "e_value" in found:
            out.append(_quality_alert(OVERALL, MARGIN, e, since.get(OVERALL), policy))
    change = shadow.change_log_value
    if change is not None and policy.change_fires(change):
        out.append(_change_alert(exp_or_inf(change), shadow, policy))
    return out


def pair_rate(shadow: ShadowStats) -> float | None:
    """Labelled pairs per second over the longest rolling window (``None`` without one)."""
    best: tuple[float, int] | None = None
    for name, cats in shadow.windows.items():
        if name == SINCE_START or OVERALL not in cats:
            continue
        seconds = parse_duration(name)
        if best is None or seconds > best[0]:
            best = (seconds, cats[OVERALL].n)
    return best[1] / best[0] if best is not None and best[0] > 0 else None


def _quality_alert(
    category: str, hypothesis: str, value: float, summ: PairedSummary | None, policy: PagePolicy
) -> Alert:
    """Critical: a since-start e-value reached its share of the page's alpha (evidence of a
    loss; the page as a whole is wrong with probability at most alpha)."""
    counts = (
        f"lost {summ.lost}, gained {summ.gained} of {summ.n} labelled pairs"
        if summ is not None
        else "no labelled pairs summary"
    )
    what = (
        "FLy loses more answers than standard"
        if hypothesis == NO_NET_LOSS
        else "FLy's net loss exceeds the non-inferiority margin"
    )
    share = policy.share(category, hypothesis)
    return Alert(
        "SpecQualityDrift",
        Severity.CRITICAL,
        f"Evidence that {what} (category {category}): its since-start e-value reached its "
        "page bound.",
        f"Since start, the paired e-value of FLy against standard (hypothesis {hypothesis}, "
        f"category {category}) is {value:.3g}, at or over its bound "
        f"{policy.level(category, hypothesis):.4g} = 1/(alpha x {share:.3g}) ({counts}). "
        f"Every test of this page has its share of alpha = {policy.alpha:g}, so the page "
        "fires on harmless traffic with probability at most alpha over the sidecar's life: "
        "this is evidence of a loss, not noise.",
        {"check": "e_value", "category": category, "hypothesis": hypothesis},
        value=value,
    )


def _change_alert(value: float, shadow: ShadowStats, policy: PagePolicy) -> Alert:
    """Warning: the change detector reached ``change_arl`` (a loss that may have started)."""
    rate = pair_rate(shadow)
    days = policy.change_interval_days(rate) if rate is not None else None
    interval = (
        f"about one false warning per {days:.3g} days at the current {rate * 86400:.4g} "
        "labelled pairs a day"
        if days is not None and rate is not None
        else "no pair rate yet to state it in days"
    )
    return Alert(
        "SpecQualityChange",
        Severity.WARNING,
        "FLy may have started losing more answers than standard (change detector).",
        f"The change detector (Shiryaev-Roberts on the pair clock) is {value:.3g}, at or over "
        f"paired.change_arl = {policy.change_arl:g}: under no loss its false warnings come at "
        f"most once per {policy.change_arl:g} labelled pairs on average ({interval}). A "
        "warning, not a page: the since-start SpecQualityDrift decides.",
        {"check": "change", "category": OVERALL},
        value=value,
    )


def _non_inferiority_alert(
    category: str, value: float, summ: PairedSummary | None, s: DetectSettings
) -> Alert:
    """Info: non-inferiority is not shown yet; a lack of evidence, never a loss by itself."""
    counts = (
        f"lost {summ.lost}, gained {summ.gained} of {summ.n} labelled pairs"
        if summ is not None
        else "no labelled pairs summary"
    )
    return Alert(
        "SpecNonInferiorityNotShown",
        Severity.INFO,
        f"FLy is not yet shown non-inferior to standard (category {category}).",
        f"After {value:g} labelled pairs since start (at least {s.quality_min_pairs}), the upper "
        f"confidence bound of FLy's net loss is still above the non-inferiority margin "
        f"({counts}). This is a lack of evidence, not evidence of a loss: more pairs may show "
        "non-inferiority; SpecQualityDrift fires on evidence of a loss.",
        {"category": category},
        value=value,
    )


def flip_alerts(shadow: ShadowStats, s: DetectSettings) -> list[Alert]:
    window = s.flip_window if s.flip_window in shadow.windows else SINCE_START
    summ = shadow_window(shadow, window).get(OVERALL)
    if summ is None:
        return []
    t = summ.tally
    noise_n = t.noise_agree + t.noise_disagree
    z = flip_rate_above_noise(t.disagree, t.paired, t.noise_disagree, noise_n, s)
    if z is None:
        return []
    return [
        Alert(
            "SpecFlipRateAboveNoise",
            Severity.WARNING,
            "FLy changes answers more often than sampling noise does.",
            f"Over {window}, FLy's answers differ from standard's in {t.disagree} of "
            f"{t.paired} pairs and the noise arm's in {t.noise_disagree} of {noise_n}: "
            f"two-proportion z {z:.3g} (threshold {s.flip_z:g}).",
            {"category": OVERALL},
            value=z,
        )
    ]


def lossless_alerts(shadow: ShadowStats, s: DetectSettings) -> list[Alert]:
    summ = shadow_window(shadow, SINCE_START).get(OVERALL)
    if summ is None:
        return []
    e = lossless_flips(summ.lossless_e_value, summ.lossless_pairs, shadow.alpha, s)
    if e is None:
        return []
    lf = summ.tally.lossless_flip_counts()
    return [
        Alert(
            "SpecLosslessFlips",
            Severity.WARNING,
            "Speculation on the standard arm changes greedy answers beyond the noise floor.",
            f"Since start, on {lf.n} greedy requests the standard (speculative) arm's answer "
            f"differs from the no-speculation baseline's in {lf.fly_only + lf.both} and the "
            f"noise arm's in {lf.noise_only + lf.both} ({lf.fly_only} standard-only, "
            f"{lf.noise_only} noise-only flips): e-value {e:.3g}, over its 1/alpha bound. "
            f"The standard arm is not lossless here.",
            {"category": OVERALL},
        )
    ]
