"""Pure conditions of the built-in detectors over plain numbers (no snapshot, no I/O).

Each condition is one alert of ``deploy/prometheus/specwatch.rules.yaml`` in Python; the
thresholds come from :class:`~specwatch.alerts.settings.DetectSettings` (defaults equal the rules
file, checked by ``tests/alerts/test_detect.py``). Every condition takes ``None`` for an
undefined input (no drafts, stale target, too few pairs) and then returns ``None`` (or an empty
dict): undefined inputs never fire. Conditions return the alert's value (what Prometheus calls
``$value``) when they hold. :mod:`specwatch.alerts.rules` calls them per target, model, engine,
window and category.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specwatch.alerts.settings import DetectSettings
from specwatch.shadow.stats.paired import mcnemar_z, two_proportion_z
from specwatch.shadow.stats.sequential import e_value_alarm

__all__ = [
    "BudgetInputs",
    "acceptance_decay",
    "acceptance_drop",
    "admission_stall",
    "budget_starvation",
    "decode_inactive",
    "flip_rate_above_noise",
    "fly_gain_lost",
    "mcnemar_z",
    "quality_drift",
    "token_budget_bound",
    "two_proportion_z",
]


def _f(x: float | None) -> float | None:
    """``x`` when it is a finite number, else ``None`` (NaN and ±inf are undefined)."""
    return x if x is not None and math.isfinite(x) else None


def acceptance_drop(
    alpha_short: float | None,
    alpha_baseline: float | None,
    tau_short: float | None,
    tau_baseline: float | None,
    drafts_per_second: float | None,
    s: DetectSettings,
) -> float | None:
    """SpecAcceptanceDrop for one server or one engine.

    Fires when drafts/s ≥ ``acceptance_min_drafts_per_second`` and α_short/α_baseline or
    (τ_short − 1)/(τ_baseline − 1) is below ``acceptance_drop_ratio``; returns that ratio
    (the α one when both hold, like the rule's ``or``). Callers judge the server first and
    report an engine only when the server as a whole does not fire (the rule's ``unless``).
    """
    dps = _f(drafts_per_second)
    if dps is None or dps < s.acceptance_min_drafts_per_second:
        return None
    a_s, a_b = _f(alpha_short), _f(alpha_baseline)
    if a_s is not None and a_b is not None and a_b > 0 and a_s / a_b < s.acceptance_drop_ratio:
        return a_s / a_b
    t_s, t_b = _f(tau_short), _f(tau_baseline)
    if t_s is not None and t_b is not None and t_b > 1:
        ratio = (t_s - 1) / (t_b - 1)
        if ratio < s.acceptance_drop_ratio:
            return ratio
    return None


def acceptance_decay(
    alpha_short: float | None,
    alpha_best: float | None,
    drafts_per_second: float | None,
    s: DetectSettings,
) -> float | None:
    """SpecAcceptanceDecay: α over the short window below ``acceptance_drop_ratio`` × the best
    sustained α (the highest ``acceptance_sustained_window`` value over the last
    ``acceptance_decay_lookback`` seconds), drafts/s ≥ ``acceptance_min_drafts_per_second`` →
    the ratio α_short / α_best. The baseline is a maximum, so a slow decay does not drag it
    down, and it spans restarts, so an engine that comes back lower after a restart fires."""
    dps, a_s, a_b = _f(drafts_per_second), _f(alpha_short), _f(alpha_best)
    if dps is None or dps < s.acceptance_min_drafts_per_second:
        return None
    if a_s is None or a_b is None or a_b <= 0:
        return None
    ratio = a_s / a_b
    return ratio if ratio < s.acceptance_drop_ratio else None


def fly_gain_lost(
    gain: float | None,
    drafts_per_second_standard: float | None,
    drafts_per_second_fly: float | None,
    s: DetectSettings,
) -> float | None:
    """SpecFLyGainLost: α_fly − α_standard (15m) below ``fly_gain_min`` with both sides drafting."""
    g, d_std, d_fly = _f(gain), _f(drafts_per_second_standard), _f(drafts_per_second_fly)
    if g is None or d_std is None or d_fly is None:
        return None
    if min(d_std, d_fly) < s.fly_gain_min_drafts_per_second:
        return None
    return g if g < s.fly_gain_min else None


def decode_inactive(
    generation_tokens_per_second: float | None,
    drafts_per_second: float | None,
    num_speculative_tokens: float | None,
    s: DetectSettings,
) -> float | None:
    """SpecDecodeInactive: speculation is configured (K > 0, from configuration or the page's
    ``position`` labels), tokens flow, and zero drafts. ``drafts_per_second`` is ``None`` when
    the server has no drafts counter, K ``None`` or 0 when it does not speculate: then nothing
    fires."""
    gen, dps, k = (
        _f(generation_tokens_per_second),
        _f(drafts_per_second),
        _f(num_speculative_tokens),
    )
    if gen is None or dps is None or k is None or k <= 0:
        return None
    return gen if dps == 0 and gen > s.inactive_min_generation_tokens_per_second else None


@dataclass(frozen=True, slots=True)
class BudgetInputs:
    """What :func:`budget_starvation` reads for one target (``None`` = unknown).

    ``running_most_loaded``: the most-loaded engine's running requests; ``d_full`` /
    ``max_num_seqs`` from the configured limits; ``waiting`` server-wide;
    ``drafts_per_second`` / ``mean_draft_length`` / ``running`` server-wide over 5m;
    ``engines``: per engine ``(engine, drafts_per_step, running)``; ``k``:
    num_speculative_tokens; ``short_draft_method``: the proposer returns short drafts by design
    (ngram, suffix), so ``draft_truncation`` is not judged.
    """

    running_most_loaded: float | None = None
    d_full: float | None = None
    max_num_seqs: float | None = None
    waiting: float | None = None
    drafts_per_second: float | None = None
    mean_draft_length: float | None = None
    running: float | None = None
    k: float | None = None
    engines: tuple[tuple[str, float | None, float | None], ...] = ()
    short_draft_method: bool = False


def budget_starvation(b: BudgetInputs, s: DetectSettings) -> dict[str, float]:
    """SpecBudgetStarvation by ``reason`` → value (empty when nothing holds).

    - ``budget_cap``: D_full < max_num_seqs, drafts > 0, and running (most-loaded engine) > D_full
      or = D_full with requests waiting; value = running.
    - ``drafts_per_step:<engine>``: 0 < drafts per step < ratio × running, running ≥ min.
    - ``draft_truncation``: 0 < ℓ < ratio × K, running ≥ min (not for short-draft methods).
    """
    out: dict[str, float] = {}
    dps = _f(b.drafts_per_second)
    r, d, n = _f(b.running_most_loaded), _f(b.d_full), _f(b.max_num_seqs)
    if dps is not None and dps > 0 and r is not None and d is not None and n is not None:
        waiting = _f(b.waiting) or 0.0
        if d < n and (r > d or (r >= d and waiting > 0)):
            out["budget_cap"] = r
    for engine, per_step_raw, running_raw in b.engines:
        per_step, running = _f(per_step_raw), _f(running_raw)
        if per_step is None or running is None or running < s.budget_min_running:
            continue
        if 0 < per_step < s.budget_drafts_per_step_ratio * running:
            out[f"drafts_per_step:{engine}"] = per_step
    ell, k, running = _f(b.mean_draft_length), _f(b.k), _f(b.running)
    if (
        not b.short_draft_method
        and ell is not None
        and k is not None
        and running is not None
        and running >= s.budget_min_running
        and 0 < ell < s.budget_draft_length_ratio * k
    ):
        out["draft_truncation"] = ell
    return out


def admission_stall(
    waiting: float | None,
    running_most_loaded: float | None,
    ceiling: float | None,
    kv_cache_usage: float | None,
    requests_finished: float | None,
    generation_tokens_per_second: float | None,
    s: DetectSettings,
) -> float | None:
    """SpecAdmissionStall → running / ceiling (a ratio 0..1) when it holds.

    Holds when ``waiting`` ≥ ``stall_min_waiting``, the most-loaded engine's running requests are
    at most ``stall_max_running_ratio`` of ``ceiling`` (min of max_num_seqs and the token
    budget's R_max), KV-cache usage (0..1) is below ``stall_max_kv_cache_usage`` (not
    saturated), not one request finished over the window and generation is below
    ``stall_max_generation_tokens_per_second``. Relative to capacity, never an absolute running
    count. Any input unknown (``ceiling`` when max_num_seqs is not configured) → ``None``.
    """
    w, r, cap = _f(waiting), _f(running_most_loaded), _f(ceiling)
    kv, done, gen = _f(kv_cache_usage), _f(requests_finished), _f(generation_tokens_per_second)
    if w is None or r is None or cap is None or kv is None or done is None or gen is None:
        return None
    if cap <= 0:
        return None
    ratio = r / cap
    if (
        w >= s.stall_min_waiting
        and ratio <= s.stall_max_running_ratio
        and kv < s.stall_max_kv_cache_usage
        and done == 0
        and gen < s.stall_max_generation_tokens_per_second
    ):
        return ratio
    return None


def token_budget_bound(
    max_num_seqs: float | None, decode_full_per_step: float | None
) -> float | None:
    """SpecTokenBudgetBound: the token budget lets fewer requests decode with full drafts per
    step (D_full) than ``max_num_seqs`` admits → D_full; ``None`` when either is unknown."""
    n, d = _f(max_num_seqs), _f(decode_full_per_step)
    if n is None or d is None:
        return None
    return d if d < n else None


def quality_drift(
    e_value: float | None,
    non_inferiority_pass: bool | None,
    n_pairs: float | None,
    alpha: float,
    s: DetectSettings,
) -> dict[str, float]:
    """SpecQualityDrift by ``check`` → value: ``e_value`` when the e-value reaches ``1/alpha``
    (``alpha`` is ``paired.alpha``, the same bound as ``PairedSummary.alarm``; anytime-valid by
    Ville's inequality); ``non_inferiority`` when non-inferiority is not shown after
    ``quality_min_pairs`` pairs (value = pairs). ``+inf`` counts as reaching the bound.
    Raises ``ValueError`` unless 0 < ``alpha`` < 1."""
    if not 0.0 < alpha < 1.0:
        raise ValueError("alpha must be in (0, 1)")
    out: dict[str, float] = {}
    e = e_value if e_value is not None and not math.isnan(e_value) else None
    if e is not None and e_value_alarm(e, alpha):
        out["e_value"] = e
    n = _f(n_pairs)
    if non_inferiority_pass is False and n is not None and n >= s.quality_min_pairs:
        out["non_inferiority"] = n
    return out


def flip_rate_above_noise(
    disagree_fly: float,
    compared_fly: float,
    disagree_noise: float,
    compared_noise: float,
    s: DetectSettings,
) -> float | None:
    """SpecFlipRateAboveNoise: pooled two-proportion z of FLy's flip rate over the noise arm's
    ≥ ``flip_z``, each arm with ≥ ``flip_min_compared`` compared pairs → z."""
    if min(compared_fly, compared_noise) < s.flip_min_compared:
        return None
    z = two_proportion_z(disagree_fly, compared_fly, disagree_noise, compared_noise)
    return z if z is not None and z >= s.flip_z else None


def lossless_flips(
    e_value: float | None, pairs: float | None, alpha: float, s: DetectSettings
) -> float | None:
    """SpecLosslessFlips: the since-start lossless e-value (standard-only against noise-only
    flips of greedy answers versus the no-speculation baseline) reaches ``1/alpha`` on at least
    ``lossless_min_pairs`` pairs → the e-value (``+inf`` counts). Raises ``ValueError`` unless
    0 < ``alpha`` < 1."""
    if not 0.0 < alpha < 1.0:
        raise ValueError("alpha must be in (0, 1)")
    n = _f(pairs)
    if e_value is None or math.isnan(e_value) or n is None or n < s.lossless_min_pairs:
        return None
    return e_value if e_value_alarm(e_value, alpha) else None
