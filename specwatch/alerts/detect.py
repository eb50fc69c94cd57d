"""Built-in detectors: the conditions of ``deploy/prometheus/specwatch.rules.yaml``, in Python.

The thresholds (:class:`DetectSettings`, defaults equal to the rules file, checked by
``tests/alerts/test_detect.py``), the pure conditions over plain numbers, the test statistics they
use, :class:`ForTracker` (Prometheus' ``for:``), and :func:`evaluate` / :class:`Detector`, which
read :class:`specwatch.observe.values.Snapshot` (and the shadow chain's
:class:`~specwatch.shadow.summary.ShadowStats` when present) and call the conditions per target,
model, engine, window and category.

Every condition takes ``None`` for an undefined input (no drafts, stale target, too few pairs)
and then returns ``None``: undefined inputs never fire a quality or acceptance alert.
Conditions return the alert's value (what Prometheus calls ``$value``) when they hold.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specwatch.alerts.alertmanager import Alert, AlertKey, Severity
from specwatch.alerts.settings import DetectSettings
from specwatch.core.config import OVERALL, SINCE_START
from specwatch.core.numbers import exp_or_inf
from specwatch.observe.values import Health, ModelWindow, Snapshot, TargetSnapshot
from specwatch.shadow.stats.paired import mcnemar_z, two_proportion_z
from specwatch.shadow.summary import PairedSummary, ShadowStats
from specwatch.vllm.specdecode import method_slots, regime_for_version

__all__ = [
    "SINCE_START",
    "BudgetInputs",
    "DetectSettings",
    "Detector",
    "ForTracker",
    "acceptance_drop",
    "admission_stall",
    "budget_starvation",
    "candidates",
    "decode_inactive",
    "evaluate",
    "flip_rate_above_noise",
    "fly_gain_lost",
    "for_seconds",
    "mcnemar_z",
    "quality_drift",
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
    s: DetectSettings,
) -> float | None:
    """SpecDecodeInactive: tokens flow but zero drafts. ``drafts_per_second`` is ``None`` when
    the server has no speculative decoding (no drafts counter): then nothing fires."""
    gen, dps = _f(generation_tokens_per_second), _f(drafts_per_second)
    if gen is None or dps is None:
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
    running: float | None,
    kv_cache_usage: float | None,
    generation_tokens_per_second: float | None,
    s: DetectSettings,
) -> float | None:
    """SpecAdmissionStall: many waiting, few running, KV mostly free, no generation → waiting."""
    w, r, kv, gen = _f(waiting), _f(running), _f(kv_cache_usage), _f(generation_tokens_per_second)
    if w is None or r is None or kv is None or gen is None:
        return None
    if (
        w >= s.stall_min_waiting
        and r <= s.stall_max_running
        and kv < s.stall_max_kv_cache_usage
        and gen < s.stall_max_generation_tokens_per_second
    ):
        return w
    return None


def quality_drift(
    e_value: float | None,
    non_inferiority_pass: bool | None,
    n_pairs: float | None,
    s: DetectSettings,
) -> dict[str, float]:
    """SpecQualityDrift by ``check`` → value: ``e_value`` when the e-value reaches 1/α
    (anytime-valid by Ville's inequality); ``non_inferiority`` when non-inferiority is not
    shown after ``quality_min_pairs`` pairs (value = pairs)."""
    out: dict[str, float] = {}
    e = _f(e_value)
    if e is not None and e >= s.quality_e_value_bound:
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


class ForTracker:
    """Prometheus' ``for:``: a candidate alert fires once it has held continuously for its
    duration. A candidate missing from one update starts over (pending state is dropped), as a
    rule whose expression returns nothing for one evaluation does.
    """

    def __init__(self, for_seconds: Callable[[Alert], float]) -> None:
        self._for = for_seconds
        self._since: dict[AlertKey, float] = {}

    def update(self, candidates: Sequence[Alert], now: float) -> list[Alert]:
        """Candidates true now → those that have been true for their ``for`` (input order)."""
        seen: dict[AlertKey, float] = {}
        firing: list[Alert] = []
        for alert in candidates:
            key = tuple(sorted(alert.identity().items()))
            since = seen.get(key, self._since.get(key, now))
            seen[key] = since
            if now - since >= self._for(alert):
                firing.append(alert)
        self._since = seen
        return firing

    def pending(self) -> int:
        """Candidates currently tracked (pending or firing)."""
        return len(self._since)


# -- evaluation over the snapshot ---------------------------------------------------------------


#: Proposers whose drafts are short by design: ``draft_truncation`` is not judged for them.
_SHORT_DRAFT_METHODS = frozenset({"ngram", "ngram_gpu", "suffix"})


def for_seconds(s: DetectSettings) -> Callable[[Alert], float]:
    """The ``for`` duration of an alert (by name; ``SpecQualityDrift`` by its ``check``)."""
    by_name = {
        "SpecAcceptanceDrop": s.acceptance_drop_for,
        "SpecFLyGainLost": s.fly_gain_for,
        "SpecDecodeInactive": s.inactive_for,
        "SpecBudgetStarvation": s.budget_for,
        "SpecAdmissionStall": s.stall_for,
        "SpecFlipRateAboveNoise": s.flip_for,
        "SpecwatchTargetDown": s.target_down_for,
        "SpecwatchShadowStalled": s.shadow_stalled_for,
        "SpecwatchLedgerFailing": s.ledger_failing_for,
    }

    def get(alert: Alert) -> float:
        if alert.alertname == "SpecQualityDrift":
            if alert.labels.get("check") == "non_inferiority":
                return s.quality_non_inferiority_for
            return s.quality_e_value_for
        return by_name.get(alert.alertname, 0.0)

    return get


def _fmt(x: float | None, spec: str = ".3g") -> str:
    return "n/a" if x is None else format(x, spec)


def _usable(t: TargetSnapshot) -> bool:
    """Values are current: the last scrape succeeded and nothing seen before is missing."""
    return t.up and t.ready and not t.stale


def _window(t: TargetSnapshot, name: str, *, fallback: bool = False) -> dict[str, ModelWindow]:
    """The target's models in window ``name`` (``since_start`` when ``fallback`` and absent)."""
    got = t.windows.get(name)
    if got is None and fallback:
        got = t.windows.get(SINCE_START)
    return dict(got) if got is not None else {}


def _base(t: TargetSnapshot, model: str) -> dict[str, str]:
    return {"target": t.name, "role": t.role.value, "model_name": model}


def _target_down(t: TargetSnapshot) -> list[Alert]:
    if t.up or t.scrapes_total == 0:
        return []
    reasons = ", ".join(f"{r}={n}" for r, n in sorted(t.scrape_errors.items()) if n) or "unknown"
    return [
        Alert(
            "SpecwatchTargetDown",
            Severity.WARNING,
            f"specwatch cannot scrape {t.name}.",
            f"The last scrape of target {t.name} (role {t.role.value}, {t.url}) failed "
            f"(errors so far: {reasons}); its values are stale and its detectors are silent.",
            {"target": t.name, "role": t.role.value},
        )
    ]


def _acceptance(t: TargetSnapshot, s: DetectSettings) -> list[Alert]:
    short = _window(t, s.acceptance_short_window)
    base = _window(t, s.acceptance_baseline_window, fallback=True)
    out: list[Alert] = []
    for model, mw in sorted(short.items()):
        bw = base.get(model)
        if bw is None:
            continue
        h, b = mw.server, bw.server
        v = acceptance_drop(
            h.acceptance_rate,
            b.acceptance_rate,
            h.mean_acceptance_length,
            b.mean_acceptance_length,
            h.drafts_per_second,
            s,
        )
        if v is not None:
            out.append(_drop_alert(t, model, None, v, h, b, s))
            continue  # the rule's `unless`: engines are reported only when the server is fine
        for engine, eh in sorted(mw.engines.items()):
            ebh = bw.engines.get(engine)
            if ebh is None:
                continue
            ev = acceptance_drop(
                eh.acceptance_rate,
                ebh.acceptance_rate,
                eh.mean_acceptance_length,
                ebh.mean_acceptance_length,
                eh.drafts_per_second,
                s,
            )
            if ev is not None:
                out.append(_drop_alert(t, model, engine, ev, eh, ebh, s))
    return out


def _drop_alert(
    t: TargetSnapshot,
    model: str,
    engine: str | None,
    value: float,
    h: Health,
    b: Health,
    s: DetectSettings,
) -> Alert:
    labels = _base(t, model)
    where = t.name
    if engine is None:
        labels["scope"] = "server"
    else:
        labels["scope"] = "engine"
        labels["engine"] = engine
        where = f"engine {engine} of {t.name}"
    return Alert(
        "SpecAcceptanceDrop",
        Severity.WARNING,
        f"Speculative-decoding acceptance dropped on {where}.",
        f"Over {s.acceptance_short_window} the acceptance rate of {where} (role "
        f"{t.role.value}, model {model}) is {_fmt(h.acceptance_rate)} and the mean acceptance "
        f"length {_fmt(h.mean_acceptance_length)}, against {_fmt(b.acceptance_rate)} and "
        f"{_fmt(b.mean_acceptance_length)} in the baseline: {value:.0%} of it (threshold "
        f"{s.acceptance_drop_ratio:.0%}).",
        labels,
    )


def _inactive(t: TargetSnapshot, s: DetectSettings) -> list[Alert]:
    out: list[Alert] = []
    for model, mw in sorted(_window(t, s.rate_window).items()):
        h = mw.server
        v = decode_inactive(h.generation_tokens_per_second, h.drafts_per_second, s)
        if v is not None:
            out.append(
                Alert(
                    "SpecDecodeInactive",
                    Severity.WARNING,
                    f"{t.name} generates tokens but drafts nothing.",
                    f"{t.name} (role {t.role.value}, model {model}) generated {v:.3g} tokens/s "
                    f"over {s.rate_window} with speculative decoding configured, but not one "
                    "draft was verified.",
                    _base(t, model),
                )
            )
    return out


def _budget(t: TargetSnapshot, s: DetectSettings) -> list[Alert]:
    out: list[Alert] = []
    cap = t.capacity
    for i, (model, mw) in enumerate(sorted(_window(t, s.rate_window).items())):
        h = mw.server
        found = budget_starvation(
            BudgetInputs(
                running_most_loaded=cap.num_requests_running,
                d_full=cap.decode_full_per_step_requests,
                max_num_seqs=cap.max_num_seqs,
                waiting=h.num_requests_waiting,
                drafts_per_second=h.drafts_per_second,
                mean_draft_length=h.mean_draft_length,
                running=h.num_requests_running,
                k=h.num_speculative_tokens,
                engines=tuple(
                    (e, eh.drafts_per_step, eh.num_requests_running)
                    for e, eh in sorted(mw.engines.items())
                ),
                short_draft_method=t.limits.method in _SHORT_DRAFT_METHODS,
            ),
            s,
        )
        for key, value in found.items():
            reason, _, engine = key.partition(":")
            if reason == "budget_cap" and i > 0:
                continue  # capacity is per target: reported once, with its first model
            labels = {**_base(t, model), "reason": reason}
            if engine:
                labels["engine"] = engine
            out.append(_budget_alert(t, model, reason, engine, value, h, s, labels))
    return out


def _budget_finding(t: TargetSnapshot, k: int | None) -> str:
    """The configuration finding: the budget that would verify every running request's drafts."""
    lim, cap = t.limits, t.capacity
    if cap.max_num_seqs is None or k is None or lim.method is None:
        return ""
    slots = method_slots(
        lim.method,
        k,
        parallel_drafting=lim.parallel_drafting,
        regime=regime_for_version(lim.vllm_version),
    )
    need = cap.max_num_seqs * (1 + k + slots.extra_batch_slots)
    return (
        f" Configuration finding, not a stall: raise --max-num-batched-tokens to at least "
        f"{need} (max_num_seqs {cap.max_num_seqs} x (1 + K {k} + S {slots.extra_batch_slots})),"
        f" lower num_speculative_tokens, or lower --max-num-seqs to "
        f"{cap.decode_full_per_step_requests}."
    )


def _budget_alert(
    t: TargetSnapshot,
    model: str,
    reason: str,
    engine: str,
    value: float,
    h: Health,
    s: DetectSettings,
    labels: dict[str, str],
) -> Alert:
    cap = t.capacity
    k = h.num_speculative_tokens or t.limits.num_speculative_tokens
    if reason == "budget_cap":
        summary = f"{t.name} is limited by max_num_batched_tokens, not max_num_seqs."
        text = (
            f"The most-loaded engine of {t.name} runs {value:g} requests with "
            f"{_fmt(h.num_requests_waiting, 'g')} waiting; max_num_batched_tokens "
            f"{cap.max_num_batched_tokens} verifies full drafts for only "
            f"{cap.decode_full_per_step_requests} requests per step (D_full), below "
            f"max_num_seqs {cap.max_num_seqs}."
        )
    elif reason == "drafts_per_step":
        summary = f"{t.name} verifies drafts for under half of its running requests."
        text = (
            f"Over {s.rate_window}, engine {engine} of {t.name} verified {value:.3g} drafts per "
            "step while at least twice as many requests run: running requests are skipped by "
            "the token budget or not drafting."
        )
    else:
        summary = f"{t.name} drafts are truncated below K."
        text = (
            f"Over {s.rate_window} the mean draft length of {t.name} is {value:.3g}, under "
            f"{s.budget_draft_length_ratio:.0%} of num_speculative_tokens {_fmt(k, 'g')}: the "
            "token budget cuts drafts short."
        )
    return Alert(
        "SpecBudgetStarvation",
        Severity.WARNING,
        summary,
        text + _budget_finding(t, k),
        labels,
    )


def _stall(t: TargetSnapshot, s: DetectSettings) -> list[Alert]:
    out: list[Alert] = []
    for model, mw in sorted(_window(t, s.rate_window).items()):
        h = mw.server
        v = admission_stall(
            h.num_requests_waiting,
            h.num_requests_running,
            h.kv_cache_usage,
            h.generation_tokens_per_second,
            s,
        )
        if v is not None:
            out.append(
                Alert(
                    "SpecAdmissionStall",
                    Severity.CRITICAL,
                    f"{t.name} admits nothing: requests wait, KV cache is free.",
                    f"{v:g} requests wait on {t.name} (model {model}) while "
                    f"{_fmt(h.num_requests_running, 'g')} run, KV-cache usage is "
                    f"{_fmt(h.kv_cache_usage, '.0%')} and generation is "
                    f"{_fmt(h.generation_tokens_per_second)} tokens/s.",
                    _base(t, model),
                )
            )
    return out


def _first_model(t: TargetSnapshot, window: str) -> tuple[str, Health] | None:
    models = _window(t, window)
    if not models:
        return None
    name = min(models)
    return name, models[name].server


def _fly_gain(snap: Snapshot, s: DetectSettings) -> list[Alert]:
    pv = snap.pair.get(s.fly_gain_window)
    if pv is None:
        return []
    std, fly = snap.targets.get(pv.standard), snap.targets.get(pv.fly)
    if std is None or fly is None or not (_usable(std) and _usable(fly)):
        return []
    a, b = _first_model(std, s.fly_gain_window), _first_model(fly, s.fly_gain_window)
    if a is None or b is None:
        return []
    v = fly_gain_lost(pv.acceptance_gain_ratio, a[1].drafts_per_second, b[1].drafts_per_second, s)
    if v is None:
        return []
    return [
        Alert(
            "SpecFLyGainLost",
            Severity.WARNING,
            f"FLy no longer raises acceptance over standard for {b[0]}.",
            f"Over {s.fly_gain_window}, FLy target {fly.name} accepts {_fmt(b[1].acceptance_rate)}"
            f" of draft tokens and standard target {std.name} {_fmt(a[1].acceptance_rate)}: a "
            f"gain of {v:+.3f} (threshold {s.fly_gain_min:g}); FLy is lossy for almost no "
            "speed-up.",
            {"model_name": b[0], "standard": std.name, "fly": fly.name},
        )
    ]


def _shadow_window(shadow: ShadowStats, name: str) -> dict[str, PairedSummary]:
    got = shadow.windows.get(name)
    return dict(got) if got is not None else {}


def _quality(shadow: ShadowStats, s: DetectSettings) -> list[Alert]:
    out: list[Alert] = []
    since = _shadow_window(shadow, SINCE_START)
    for category, summ in sorted(since.items()):
        found = quality_drift(summ.e_value, summ.non_inferiority_pass, summ.n, s)
        if "e_value" in found:
            out.append(_quality_alert("e_value", category, "no_net_loss", found["e_value"], summ))
        if "non_inferiority" in found:
            out.append(
                _quality_alert("non_inferiority", category, None, found["non_inferiority"], summ)
            )
    bet = shadow.betting_log_e_value
    if bet is not None and math.isfinite(bet):
        e = exp_or_inf(bet)
        found = quality_drift(e if math.isfinite(e) else 1e308, None, None, s)
        if "e_value" in found:
            out.append(_quality_alert("e_value", OVERALL, "margin", e, since.get(OVERALL)))
    return out


def _quality_alert(
    check: str, category: str, hypothesis: str | None, value: float, summ: PairedSummary | None
) -> Alert:
    labels = {"check": check, "category": category}
    counts = (
        f"lost {summ.lost}, gained {summ.gained} of {summ.n} labelled pairs"
        if summ is not None
        else "no labelled pairs summary"
    )
    if check == "e_value":
        labels["hypothesis"] = hypothesis or "no_net_loss"
        text = (
            f"Since start, the paired e-value of FLy against standard (hypothesis "
            f"{labels['hypothesis']}, category {category}) is {value:.3g}, over its 1/alpha "
            f"bound ({counts})."
        )
    else:
        text = (
            f"After {value:g} labelled pairs since start (category {category}), the upper "
            f"confidence bound of FLy's net loss is still above the non-inferiority margin "
            f"({counts})."
        )
    return Alert(
        "SpecQualityDrift",
        Severity.CRITICAL,
        f"FLy loses answers against standard (category {category}, check {check}).",
        text,
        labels,
    )


def _flip(shadow: ShadowStats, s: DetectSettings) -> list[Alert]:
    window = s.flip_window if s.flip_window in shadow.windows else SINCE_START
    summ = _shadow_window(shadow, window).get(OVERALL)
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
        )
    ]


def _shadow_stalled(snap: Snapshot, shadow: ShadowStats, s: DetectSettings) -> list[Alert]:
    summ = _shadow_window(shadow, s.shadow_stalled_window).get(OVERALL)
    if summ is None or summ.tally.paired > 0:
        return []
    rates = [
        mw.server.generation_tokens_per_second
        for t in snap.targets.values()
        if _usable(t)
        for mw in _window(t, s.rate_window).values()
    ]
    known = [r for r in rates if r is not None and math.isfinite(r)]
    if not known or sum(known) <= s.shadow_min_generation_tokens_per_second:
        return []
    return [
        Alert(
            "SpecwatchShadowStalled",
            Severity.WARNING,
            "specwatch sees traffic but completes no shadow pairs.",
            f"The watched servers generate {sum(known):.3g} tokens/s but specwatch completed "
            f"no shadow pair over {s.shadow_stalled_window}; quality drift cannot be detected.",
            {},
        )
    ]


def candidates(
    snapshot: Snapshot,
    shadow: ShadowStats | None,
    settings: DetectSettings,
    *,
    ledger_errors_increase: float | None = None,
) -> list[Alert]:
    """Every condition that holds now, before ``for`` (pure).

    Per target: ``SpecwatchTargetDown`` (scraped at least once, last scrape failed); for usable
    targets only (up, not stale): ``SpecAcceptanceDrop`` (server, else per engine),
    ``SpecDecodeInactive``, ``SpecBudgetStarvation`` (``reason``), ``SpecAdmissionStall``. Pair:
    ``SpecFLyGainLost``. From ``shadow`` when given: ``SpecQualityDrift`` (``check``,
    ``category``, ``hypothesis``), ``SpecFlipRateAboveNoise``, ``SpecwatchShadowStalled``.
    ``ledger_errors_increase``: ledger write errors over the last ``ledger_errors_window``
    (``SpecwatchLedgerFailing`` when > 0). Windows missing from the snapshot give nothing.
    """
    out: list[Alert] = []
    for t in snapshot.targets.values():
        out += _target_down(t)
        if not _usable(t):
            continue
        out += _acceptance(t, settings)
        out += _inactive(t, settings)
        out += _budget(t, settings)
        out += _stall(t, settings)
    out += _fly_gain(snapshot, settings)
    if shadow is not None:
        out += _quality(shadow, settings)
        out += _flip(shadow, settings)
        out += _shadow_stalled(snapshot, shadow, settings)
    if ledger_errors_increase is not None and ledger_errors_increase > 0:
        out.append(
            Alert(
                "SpecwatchLedgerFailing",
                Severity.WARNING,
                "specwatch cannot write its paired ledger.",
                f"{ledger_errors_increase:g} ledger writes failed in the last "
                f"{settings.ledger_errors_window:g} s; paired statistics stop advancing.",
                {},
            )
        )
    return out


def evaluate(
    snapshot: Snapshot,
    shadow: ShadowStats | None,
    settings: DetectSettings,
    now: float,
    *,
    tracker: ForTracker | None = None,
    ledger_errors_increase: float | None = None,
) -> list[Alert]:
    """The alerts firing at ``now``: :func:`candidates` that have held for their ``for``
    duration according to ``tracker`` (keep one :class:`ForTracker` built with
    :func:`for_seconds` across calls; :class:`Detector` does). Without a tracker, every
    candidate is returned (``for`` = 0)."""
    found = candidates(snapshot, shadow, settings, ledger_errors_increase=ledger_errors_increase)
    return tracker.update(found, now) if tracker is not None else found


class Detector:
    """Stateful wrapper: one :class:`ForTracker` and the ledger-error history across calls.

    ``evaluate(snapshot, shadow, now)`` → firing alerts (not thread-safe; call from one task).
    """

    def __init__(self, settings: DetectSettings) -> None:
        self.settings = settings
        self.tracker = ForTracker(for_seconds(settings))
        self._ledger: deque[tuple[float, float]] = deque()

    def _ledger_increase(self, shadow: ShadowStats | None, now: float) -> float | None:
        if shadow is None:
            return None
        total = float(sum(shadow.ledger_write_errors.values()))
        self._ledger.append((now, total))
        while (
            len(self._ledger) > 1 and self._ledger[1][0] <= now - self.settings.ledger_errors_window
        ):
            self._ledger.popleft()
        return max(0.0, total - self._ledger[0][1])

    def evaluate(self, snapshot: Snapshot, shadow: ShadowStats | None, now: float) -> list[Alert]:
        """Firing alerts now (see :func:`evaluate`)."""
        return evaluate(
            snapshot,
            shadow,
            self.settings,
            now,
            tracker=self.tracker,
            ledger_errors_increase=self._ledger_increase(shadow, now),
        )
