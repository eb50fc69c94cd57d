"""The built-in detectors' walkers and alert texts: :func:`candidates` over what they read.

:func:`candidates` takes the observe chain's :class:`~specwatch.observe.values.ObserveView`
(targets and FLy/standard pair views) and the shadow chain's
:class:`~specwatch.shadow.published.ShadowStats` (or ``None``), never the published snapshot, and
calls the pure conditions of :mod:`specwatch.alerts.conditions` per target, model, engine,
window and category. It is pure: values in, :class:`~specwatch.alerts.alert.Alert` list out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from specwatch.alerts.alert import Alert, Severity
from specwatch.alerts.causes import acceptance_cause, cause_words, truncation_causes
from specwatch.alerts.conditions import (
    BudgetInputs,
    acceptance_decay,
    acceptance_drop,
    admission_stall,
    budget_starvation,
    decode_inactive,
    fly_gain_lost,
    token_budget_bound,
)
from specwatch.alerts.quality import (
    flip_alerts,
    lossless_alerts,
    quality_alerts,
    shadow_window,
)
from specwatch.alerts.settings import DetectSettings
from specwatch.core.config import OVERALL, SINCE_START
from specwatch.core.roles import Role
from specwatch.observe.values import Health, ModelWindow, ObserveView, TargetSnapshot
from specwatch.shadow.published import ShadowStats
from specwatch.shadow.sample import CHOSEN_PAUSES

__all__ = ["SustainedKey", "candidates", "sustained_levels"]

#: Proposers whose drafts are short by design: ``draft_truncation`` is not judged for them.
_SHORT_DRAFT_METHODS = frozenset({"ngram", "ngram_gpu", "suffix"})


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
            f"Target {t.name} cannot be scraped by specwatch.",
            f"The last scrape of target {t.name} (role {t.role.value}, {t.url}) failed "
            f"(errors so far: {reasons}); its values are stale and its detectors are silent.",
            {"target": t.name, "role": t.role.value},
        )
    ]


#: The window of ``SpecwatchTargetNotOneServer``: a ``counters_alternate`` refusal within it
#: keeps the condition true (the mixin's rule reads ``increase(...[10m]) > 0``).
NOT_ONE_SERVER_WINDOW_SECONDS = 600.0


def _not_one_server(t: TargetSnapshot, increase: float | None) -> list[Alert]:
    if increase is None or increase <= 0:
        return []
    return [
        Alert(
            "SpecwatchTargetNotOneServer",
            Severity.WARNING,
            "A specwatch target URL answers with counters of more than one vLLM server.",
            f"The counters read from target {t.name} ({t.url}) fell and rose in turn "
            f"{increase:g} times over the last {NOT_ONE_SERVER_WINDOW_SECONDS / 60:g}m (several "
            "vLLM servers behind one URL: a load balancer or a cache); specwatch refuses those "
            "pages, so the target's values are stale.",
            {"target": t.name},
            value=increase,
        )
    ]


def _acceptance(t: TargetSnapshot, s: DetectSettings, standard_alpha: float | None) -> list[Alert]:
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
            out.append(_drop_alert(t, model, None, v, h, b, s, standard_alpha))
        if len(mw.engines) < 2:
            continue  # one engine is the server: its alert is the server's
        # every engine that dropped keeps its own alert, also when the server dropped too;
        # only when every engine dropped is the server alert alone enough
        found: list[Alert] = []
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
                found.append(_drop_alert(t, model, engine, ev, eh, ebh, s, standard_alpha))
        if len(found) < len(mw.engines):
            out += found
    return out


#: Key of a best-sustained-level series: (target, model_name, engine; "" = the server).
SustainedKey = tuple[str, str, str]


def _decay(
    t: TargetSnapshot,
    s: DetectSettings,
    best: Mapping[SustainedKey, float],
    standard_alpha: float | None = None,
) -> list[Alert]:
    out: list[Alert] = []
    base = _window(t, s.acceptance_baseline_window, fallback=True)
    for model, mw in sorted(_window(t, s.acceptance_short_window).items()):
        bw = base.get(model)
        rows: list[tuple[str, Health]] = [("", mw.server)]
        if len(mw.engines) > 1:
            rows += sorted(mw.engines.items())
        for engine, h in rows:
            peak = best.get((t.name, model, engine))
            v = acceptance_decay(h.acceptance_rate, peak, h.drafts_per_second, s)
            if v is None or peak is None:
                continue
            labels = _base(t, model)
            where = t.name
            labels["scope"] = "engine" if engine else "server"
            if engine:
                labels["engine"] = engine
                where = f"engine {engine} of {t.name}"
            restarts = sum(t.counter_resets.values())
            bh = None if bw is None else (bw.engines.get(engine) if engine else bw.server)
            labels["cause"], short, because = acceptance_cause(t, h, bh, standard_alpha)
            out.append(
                Alert(
                    "SpecAcceptanceDecay",
                    Severity.WARNING,
                    f"Acceptance on {where} is below {s.acceptance_drop_ratio:.0%} of its best "
                    f"sustained level in the last {s.acceptance_decay_lookback / 3600:g}h "
                    f"({short}).",
                    f"Over {s.acceptance_short_window} the acceptance rate of {where} (role "
                    f"{t.role.value}, model {model}) is {_fmt(h.acceptance_rate)}, {v:.0%} of the "
                    f"best {s.acceptance_sustained_window} level {_fmt(peak)} seen in the last "
                    f"{s.acceptance_decay_lookback / 3600:g}h (threshold "
                    f"{s.acceptance_drop_ratio:.0%}); engine restarts seen so far: "
                    f"{restarts}.{because}",
                    labels,
                    value=v,
                )
            )
    return out


def sustained_levels(observe: ObserveView, s: DetectSettings) -> dict[SustainedKey, float]:
    """α in ``acceptance_sustained_window`` (``since_start`` when not configured) per usable
    target, model and engine ("" = server;
    engines only on multi-engine servers): what :class:`~specwatch.alerts.pending.Detector`
    keeps the maximum of over ``acceptance_decay_lookback``."""
    out: dict[SustainedKey, float] = {}
    for t in observe.targets.values():
        if not _usable(t):
            continue
        for model, mw in _window(t, s.acceptance_sustained_window, fallback=True).items():
            rows: list[tuple[str, Health]] = [("", mw.server)]
            if len(mw.engines) > 1:
                rows += list(mw.engines.items())
            for engine, h in rows:
                a = h.acceptance_rate
                if a is not None and math.isfinite(a):
                    out[(t.name, model, engine)] = a
    return out


def _drop_alert(
    t: TargetSnapshot,
    model: str,
    engine: str | None,
    value: float,
    h: Health,
    b: Health,
    s: DetectSettings,
    standard_alpha: float | None = None,
) -> Alert:
    labels = _base(t, model)
    labels["cause"], short, because = acceptance_cause(t, h, b, standard_alpha)
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
        f"Speculative-decoding acceptance dropped on {where} ({short}).",
        f"Over {s.acceptance_short_window} the acceptance rate of {where} (role "
        f"{t.role.value}, model {model}) is {_fmt(h.acceptance_rate)} and the mean acceptance "
        f"length {_fmt(h.mean_acceptance_length)}, against {_fmt(b.acceptance_rate)} and "
        f"{_fmt(b.mean_acceptance_length)} in the baseline: {value:.0%} of it (threshold "
        f"{s.acceptance_drop_ratio:.0%}).{because}",
        labels,
        value=value,
    )


def _speculation_k(t: TargetSnapshot) -> int | None:
    """The K a target is meant to speculate with, or ``None`` when it is not meant to.

    K configured for the target counts, and so does K observed on the page (the ``position``
    labels, :attr:`Capacity.num_speculative_tokens_source` ``"observed"``) on a standard or FLy
    target. A ``baseline`` target does not speculate by definition, and a page that carries the
    spec-decode families all at zero (vLLM exports them so even with speculation off) is no sign
    that it does: there an observed K counts only once the server has drafted since specwatch
    started watching it.
    """
    cap = t.capacity
    k = cap.num_speculative_tokens
    if k is None or k <= 0 or t.role is Role.PREFILL:
        return None
    if t.limits.num_speculative_tokens is not None or t.role.speculates:
        return k
    drafted = any((mw.server.drafts or 0.0) > 0 for mw in _window(t, SINCE_START).values())
    return k if drafted else None


def _inactive(t: TargetSnapshot, s: DetectSettings) -> list[Alert]:
    out: list[Alert] = []
    k = _speculation_k(t)
    for model, mw in sorted(_window(t, s.rate_window).items()):
        h = mw.server
        v = decode_inactive(h.generation_tokens_per_second, h.drafts_per_second, k, s)
        if v is not None:
            out.append(
                Alert(
                    "SpecDecodeInactive",
                    Severity.WARNING,
                    f"Target {t.name} generates tokens but drafts nothing.",
                    f"{t.name} (role {t.role.value}, model {model}) generated {v:.3g} tokens/s "
                    f"over {s.rate_window} with speculative decoding configured (K {k}), but "
                    "not one draft was verified.",
                    _base(t, model),
                    value=v,
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
                k=cap.num_speculative_tokens,
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
            because = ""
            short_method = t.limits.method in _SHORT_DRAFT_METHODS
            if reason == "draft_truncation" or (reason == "drafts_per_step" and short_method):
                # drafts_per_step on ngram/suffix: steps without a proposal draft nothing
                designed = ("no_proposal",) if short_method else t.designed_short_drafts
                causes = truncation_causes(
                    designed=designed,
                    scheduled_tokens_per_step=h.scheduled_tokens_per_step,
                    max_num_batched_tokens=cap.max_num_batched_tokens,
                    running=cap.num_requests_running,
                    d_full=cap.decode_full_per_step_requests,
                    fill_ratio=s.budget_fill_ratio,
                )
                if "token_budget" not in causes:
                    continue  # shorter drafts by design: the budget does not starve them
                labels["cause"], _short, because = cause_words(causes)
            out.append(_budget_alert(t, model, reason, value, h, s, labels, because))
    return out


def _budget_finding(t: TargetSnapshot) -> str:
    """The configuration finding: the budget that would verify every running request's drafts
    (N, K, S and the need as :class:`~specwatch.observe.values.Capacity` has them)."""
    cap = t.capacity
    need = cap.required_batched_tokens
    if need is None:
        return ""
    return (
        f" Configuration finding, not a stall: raise --max-num-batched-tokens to at least "
        f"{need} (max_num_seqs {cap.max_num_seqs} x (1 + K {cap.num_speculative_tokens} + S "
        f"{cap.extra_batch_slots})), lower num_speculative_tokens, or lower --max-num-seqs to "
        f"{cap.decode_full_per_step_requests}."
    )


def _budget_alert(
    t: TargetSnapshot,
    model: str,
    reason: str,
    value: float,
    h: Health,
    s: DetectSettings,
    labels: dict[str, str],
    because: str = "",
) -> Alert:
    cap = t.capacity
    engine = labels.get("engine", "")
    k = cap.num_speculative_tokens
    if reason == "budget_cap":
        summary = f"Target {t.name} is limited by max_num_batched_tokens, not max_num_seqs."
        text = (
            f"The most-loaded engine of {t.name} runs {value:g} requests with "
            f"{_fmt(h.num_requests_waiting, 'g')} waiting; max_num_batched_tokens "
            f"{cap.max_num_batched_tokens} verifies full drafts for only "
            f"{cap.decode_full_per_step_requests} requests per step (D_full), below "
            f"max_num_seqs {cap.max_num_seqs}."
        )
    elif reason == "drafts_per_step":
        summary = (
            f"Target {t.name} verifies drafts for under "
            f"{s.budget_drafts_per_step_ratio:.0%} of its running requests per step."
        )
        text = (
            f"Over {s.rate_window}, engine {engine} of {t.name} verified {value:.3g} drafts per "
            "step while at least twice as many requests run: running requests are skipped by "
            "the token budget or not drafting." + because
        )
    else:
        cause = labels.get("cause", "token_budget")
        by = "by the token budget" if cause == "token_budget" else "(cause undetermined)"
        summary = f"The drafts of target {t.name} are truncated below K {by}."
        text = (
            f"Over {s.rate_window} the mean draft length of {t.name} is {value:.3g}, under "
            f"{s.budget_draft_length_ratio:.0%} of num_speculative_tokens {_fmt(k, 'g')}; "
            f"{_fmt(h.scheduled_tokens_per_step, '.4g')} tokens scheduled per engine step "
            f"(max_num_batched_tokens {_fmt(cap.max_num_batched_tokens, 'g')})."
            + because
            + (_budget_finding(t) if cause == "token_budget" else "")
        )
        return Alert("SpecBudgetStarvation", Severity.WARNING, summary, text, labels, value=value)
    return Alert(
        "SpecBudgetStarvation",
        Severity.WARNING,
        summary,
        text + _budget_finding(t),
        labels,
        value=value,
    )


def _stall_ceiling(t: TargetSnapshot) -> float | None:
    """Most requests one engine can run: min(max_num_seqs, R_max) (``None``: N unknown)."""
    cap = t.capacity
    if cap.max_num_seqs is None:
        return None
    if cap.admission_cap_requests is None:
        return float(cap.max_num_seqs)
    return float(min(cap.max_num_seqs, cap.admission_cap_requests))


def _stall(t: TargetSnapshot, s: DetectSettings) -> list[Alert]:
    out: list[Alert] = []
    ceiling = _stall_ceiling(t)
    running = t.capacity.num_requests_running
    for model, mw in sorted(_window(t, s.rate_window).items()):
        h = mw.server
        v = admission_stall(
            h.num_requests_waiting,
            running,
            ceiling,
            h.kv_cache_usage,
            h.requests_finished,
            h.generation_tokens_per_second,
            s,
        )
        if v is not None:
            out.append(
                Alert(
                    "SpecAdmissionStall",
                    Severity.CRITICAL,
                    f"Target {t.name} admits no work: requests wait, running is far below capacity "
                    "and nothing finishes.",
                    f"{_fmt(h.num_requests_waiting, 'g')} requests wait on {t.name} (model "
                    f"{model}) while its most-loaded engine runs {_fmt(running, 'g')} of the "
                    f"{_fmt(ceiling, 'g')} its limits allow ({v:.2%}), KV-cache usage is "
                    f"{_fmt(h.kv_cache_usage, '.0%')}, no request finished over "
                    f"{s.rate_window} and generation is "
                    f"{_fmt(h.generation_tokens_per_second)} tokens/s.",
                    _base(t, model),
                    value=v,
                )
            )
    return out


def _budget_bound(t: TargetSnapshot, s: DetectSettings) -> list[Alert]:
    """The token-budget configuration finding, as soon as the limits are known (no traffic):
    N, K, S, D_full and the need N · (1 + K + S) as :class:`~specwatch.observe.values.Capacity`
    has them."""
    cap = t.capacity
    d_full = token_budget_bound(cap.max_num_seqs, cap.decode_full_per_step_requests)
    n, k, slots, need = (
        cap.max_num_seqs,
        cap.num_speculative_tokens,
        cap.extra_batch_slots,
        cap.required_batched_tokens,
    )
    if d_full is None or n is None or k is None or slots is None or need is None:
        return []
    return [
        Alert(
            "SpecTokenBudgetBound",
            Severity.INFO,
            f"The token budget max_num_batched_tokens {cap.max_num_batched_tokens} is below "
            f"N {n} x "
            f"(1 + K {k} + S {slots}) = {need}, so at most {d_full:g} requests can decode per "
            f"step on {t.name}.",
            f"Configuration finding for {t.name} (role {t.role.value}, method {t.limits.method}): "
            f"with max_num_seqs {n} and num_speculative_tokens {k}, the token budget verifies "
            f"full drafts for only {d_full:g} requests per step. Raise "
            f"--max-num-batched-tokens to at least {need}, lower num_speculative_tokens, or "
            f"lower --max-num-seqs to {d_full:g}.",
            {"target": t.name, "role": t.role.value},
            value=d_full,
        )
    ]


def _standard_alpha(observe: ObserveView, s: DetectSettings) -> float | None:
    """The standard target's acceptance rate over ``acceptance_short_window`` when it held (no
    drop against its own baseline): a FLy-only drop is then judged against it
    (:func:`~specwatch.alerts.causes.acceptance_causes`). ``None`` when the standard target
    dropped too, or without a usable standard target with values in both windows."""
    std = next((t for t in observe.targets.values() if t.role is Role.STANDARD), None)
    if std is None or not _usable(std):
        return None
    got = _first_model(std, s.acceptance_short_window)
    base = _first_model(std, s.acceptance_baseline_window) or _first_model(std, SINCE_START)
    if got is None or base is None or got[1].acceptance_rate is None:
        return None
    h, b = got[1], base[1]
    dropped = acceptance_drop(
        h.acceptance_rate,
        b.acceptance_rate,
        h.mean_acceptance_length,
        b.mean_acceptance_length,
        h.drafts_per_second,
        s,
    )
    return h.acceptance_rate if dropped is None else None


def _decode_vs_baseline(observe: ObserveView, s: DetectSettings) -> list[Alert]:
    """SpecAcceptanceDrop ``scope="baseline"``: a ``decode`` target (disaggregated serving)
    against the first ``baseline`` target serving the same model and speculating (a monolithic
    server with the same drafter), both over ``acceptance_short_window``, by the drop ratio. A
    baseline without drafts gives nothing here (its comparison is the speed one)."""
    base = next((t for t in observe.targets.values() if t.role is Role.BASELINE), None)
    if base is None or not _usable(base):
        return []
    reference = _window(base, s.acceptance_short_window)
    out: list[Alert] = []
    for t in observe.targets.values():
        if t.role is not Role.DECODE or not _usable(t):
            continue
        for model, mw in sorted(_window(t, s.acceptance_short_window).items()):
            bw = reference.get(model)
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
            if v is None:
                continue
            labels = {**_base(t, model), "scope": "baseline", "baseline": base.name}
            labels["cause"], short, because = cause_words(("disaggregation",))
            out.append(
                Alert(
                    "SpecAcceptanceDrop",
                    Severity.WARNING,
                    f"Decode server {t.name} accepts far fewer drafts than baseline "
                    f"{base.name} ({short}).",
                    f"Over {s.acceptance_short_window} decode server {t.name} (model {model}) "
                    f"has acceptance rate {_fmt(h.acceptance_rate)} and mean acceptance length "
                    f"{_fmt(h.mean_acceptance_length)}, against {_fmt(b.acceptance_rate)} and "
                    f"{_fmt(b.mean_acceptance_length)} on baseline {base.name}: {v:.0%} of it "
                    f"(threshold {s.acceptance_drop_ratio:.0%}).{because}",
                    labels,
                    value=v,
                )
            )
    return out


def _first_model(t: TargetSnapshot, window: str) -> tuple[str, Health] | None:
    models = _window(t, window)
    if not models:
        return None
    name = min(models)
    return name, models[name].server


def _fly_gain(snap: ObserveView, s: DetectSettings) -> list[Alert]:
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
            f"gain of {v:+.3f} (threshold {s.fly_gain_min:g}): FLy's relaxed verification buys "
            "almost no extra acceptance.",
            {"model_name": b[0], "standard": std.name, "fly": fly.name},
            value=v,
        )
    ]


def _shadow_stalled(snap: ObserveView, shadow: ShadowStats, s: DetectSettings) -> list[Alert]:
    summ = shadow_window(shadow, s.shadow_stalled_window).get(OVERALL)
    if summ is None or summ.tally.paired > 0:
        return []
    if shadow.io is not None and any(shadow.io.paused.get(r) for r in CHOSEN_PAUSES):
        return []  # specwatch chose to pause (live requests wait): not a stall
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
            "The watched servers see traffic but specwatch completes no shadow pairs.",
            f"The watched servers generate {sum(known):.3g} tokens/s but specwatch completed "
            f"no shadow pair over {s.shadow_stalled_window}; quality drift cannot be detected.",
            {},
            value=sum(known),
        )
    ]


def candidates(
    observe: ObserveView,
    shadow: ShadowStats | None,
    settings: DetectSettings,
    *,
    ledger_errors_increase: float | None = None,
    sustained_best: Mapping[SustainedKey, float] | None = None,
    alternations: Mapping[str, float] | None = None,
) -> list[Alert]:
    """Every condition that holds now, before ``for`` (pure).

    The Python detector's check set (the rules file has the same alerts on the same evidence):

    - per target: ``SpecwatchTargetDown`` (scraped at least once, last scrape failed);
      ``SpecwatchTargetNotOneServer`` (``alternations[target]``, the target's
      ``counters_alternate`` refusals over the last :data:`NOT_ONE_SERVER_WINDOW_SECONDS`, is
      > 0: several servers behind its URL);
      ``SpecTokenBudgetBound`` (info, from configuration alone: D_full < max_num_seqs); for
      usable targets only (up, ready, not stale): ``SpecAcceptanceDrop`` (server, and each
      engine that dropped on a multi-engine server, also when the server dropped too),
      ``SpecAcceptanceDecay`` (short-window α below the ratio × ``sustained_best``, the best
      sustained α over the lookback that :class:`~specwatch.alerts.pending.Detector` keeps),
      ``SpecDecodeInactive``, ``SpecBudgetStarvation`` (``reason``: ``budget_cap``,
      ``drafts_per_step``, ``draft_truncation``), ``SpecAdmissionStall``;
    - pair (``observe.pair``): ``SpecFLyGainLost``;
    - from ``shadow`` when given: ``SpecQualityDrift`` with ``check="e_value"`` (the
      since-start paired e-value, per category with ``hypothesis="no_net_loss"`` and the
      overall margin e-process with ``hypothesis="margin"``, reaching ``1/shadow.alpha``) and
      ``SpecNonInferiorityNotShown`` (info: not shown after ``quality_min_pairs`` pairs, a
      lack of evidence, never critical);
      ``SpecFlipRateAboveNoise``; ``SpecLosslessFlips`` (the since-start lossless e-value of
      the standard arm against the no-speculation baseline reaching ``1/shadow.alpha`` on at
      least ``lossless_min_pairs`` greedy pairs); ``SpecwatchShadowStalled``;
    - ``SpecwatchLedgerFailing`` when ``ledger_errors_increase`` (ledger write errors over the
      last ``ledger_errors_window``) is > 0, or while the ledger's state is not ``ok`` (corrupt,
      full, read-only: pairing stopped, so no new write errors come to keep it firing).

    Not here: the fleet-wide McNemar check. Only Prometheus sees several sidecars, so it is the
    rules-only alert ``SpecQualityDriftFleet``. Windows missing from ``observe`` give nothing.
    """
    out: list[Alert] = []
    standard_alpha = _standard_alpha(observe, settings)
    for t in observe.targets.values():
        out += _target_down(t)
        out += _not_one_server(t, (alternations or {}).get(t.name))
        out += _budget_bound(t, settings)
        if not _usable(t):
            continue
        alone = standard_alpha if t.role is Role.FLY else None
        out += _acceptance(t, settings, alone)
        out += _decay(t, settings, sustained_best or {}, alone)
        out += _inactive(t, settings)
        out += _budget(t, settings)
        out += _stall(t, settings)
    out += _decode_vs_baseline(observe, settings)
    out += _fly_gain(observe, settings)
    shadow_found: list[Alert] = []
    if shadow is not None:
        shadow_found += quality_alerts(shadow, settings)
        shadow_found += flip_alerts(shadow, settings)
        shadow_found += lossless_alerts(shadow, settings)
        shadow_found += _shadow_stalled(observe, shadow, settings)
    if ledger_errors_increase is not None and ledger_errors_increase > 0:
        shadow_found.append(
            Alert(
                "SpecwatchLedgerFailing",
                Severity.WARNING,
                "Writes to the paired ledger of specwatch fail.",
                f"{ledger_errors_increase:g} ledger writes failed in the last "
                f"{settings.ledger_errors_window:g} s; paired statistics stop advancing.",
                {},
                value=ledger_errors_increase,
            )
        )
    elif shadow is not None and shadow.ledger_state != "ok":
        shadow_found.append(
            Alert(
                "SpecwatchLedgerFailing",
                Severity.WARNING,
                "Writes to the paired ledger of specwatch fail.",
                f"The ledger is {shadow.ledger_state}; pairing is stopped until it can store "
                "rows again (see the runbook).",
                {},
                value=1.0,
            )
        )
    out += [
        replace(a, labels={**_pair_labels(observe, _about(a.alertname)), **a.labels})
        for a in shadow_found
    ]
    return out


def _about(alert: str) -> str:
    """The server a shadow alert is about: SpecLosslessFlips is about the standard arm (its
    speculation is meant to be lossless), every other shadow alert about FLy."""
    return "standard" if alert == "SpecLosslessFlips" else "fly"


def _pair_labels(observe: ObserveView, about: str = "fly") -> dict[str, str]:
    """Where a shadow alert comes from: the target it is about (``target``, ``role``, that
    target's first model's ``model_name``) and the other side of the pair (``standard`` for a
    FLy alert, ``fly`` for a standard one); empty without a pair."""
    pv = next(iter(observe.pair.values()), None)
    if pv is None:
        return {}
    if about == "standard":
        target, out = pv.standard, {"target": pv.standard, "role": "standard", "fly": pv.fly}
    else:
        target, out = pv.fly, {"target": pv.fly, "role": "fly", "standard": pv.standard}
    snap = observe.targets.get(target)
    models = sorted({m for w in snap.windows.values() for m in w}) if snap is not None else []
    if models:
        out["model_name"] = models[0]
    return out
