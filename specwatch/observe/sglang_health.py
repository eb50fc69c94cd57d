"""α, τ and the draft length of an SGLang engine from its counters or interval gauges (pure).

SGLang's speculative gauges are *interval averages*: at each decode report (every
``--decode-log-interval`` decode batches, 40 by default) the scheduler writes
``spec_accept_length`` = accepted tokens / verifies over the batches since the last report
(bonus token included: τ) and zeroes its counts. So a gauge read says what τ was over the last
logging interval before the scrape, on the stats-logging rank, weighted by verifies; it cannot
say what τ was over a specwatch window (1m, 5m ...), and it keeps its last value after traffic
stops. Two routes, the first that applies:

1. ``sglang_counters`` (0.5.13 on): the parser's vLLM-shaped counters from
   ``sglang:spec_verify_calls_total`` (:mod:`specwatch.observe.sglang_parse`) give τ =
   Δgeneration tokens / Δverify calls, exact over the window like vLLM's.
2. ``sglang_interval`` (0.4.3 on): τ is the latest ``spec_accept_length`` gauge, the same in
   every window; withheld (``None``) when ``generation_tokens_total`` did not move over the
   window (the gauge may be an older interval's; the counter moves when a request finishes)
   or when it is below 1 (0 is written without speculation). Drafts per second is then
   estimated as generated tokens per second / τ (no verify count exists), so the acceptance
   detectors can judge their floor; drafts and draft tokens stay unknown.
   What such a window can say: α and τ of the latest logging interval, and over time (the
   best-sustained level of the decay detector) a change between intervals; it cannot compare
   two windows' averages (a short window and its baseline read the same gauge).

Either way α = (τ − 1) / (N − 1) and ℓ = N − 1, N the draft tokens verified per step: the
page's ``spec_num_draft_tokens`` (0.5.13 on), else the configured K + 1, else N implied by the
accept-rate gauge and τ (:func:`specwatch.vllm.sglang.draft_tokens_from_rate`). The engine's own
``spec_accept_rate`` is never published: it exceeds 1 on some versions (NGRAM up to
0.5.5.post2, builds before the late-2025 fix) and is biased up to 0.5.10.post1; one above 1 is
recorded in ``withheld`` as ``acceptance_above_one`` (the rate was dropped, α is τ's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from specwatch.observe.values import (
    Capacity,
    Delta,
    Health,
    Limits,
    PageReading,
    SpeculativeTokensSource,
)
from specwatch.vllm.sglang import (
    RATE_FORMULA_CODES,
    RateFormula,
    alpha_from_tau,
    budget,
    draft_tokens_from_rate,
)


def is_sglang(gauges: Mapping[str, float]) -> bool:
    """True when an engine's gauges are an SGLang page's (keys ``sglang_*``)."""
    return any(key.startswith("sglang_") for key in gauges)


def _era(code: float | None) -> RateFormula | None:
    for era, value in RATE_FORMULA_CODES.items():
        if code == value:
            return era
    return None


def draft_tokens(
    gauges: Mapping[str, float], configured_k: int | None, tau: float | None
) -> int | None:
    """N by the precedence rule: the page's gauge, the configured K + 1, the rate's N."""
    shown = gauges.get("sglang_num_draft_tokens")
    if shown is not None and shown >= 2:
        return round(shown)
    if configured_k is not None:
        return configured_k + 1
    rate = gauges.get("sglang_accept_rate")
    if tau is None or rate is None:
        return None
    return draft_tokens_from_rate(tau, rate, _era(gauges.get("sglang_rate_formula")))


def sglang_health(h: Health, delta: Delta, *, configured_k: int | None) -> Health:
    """``h`` (derived from ``delta`` by the generic rules) with SGLang's τ, α, ℓ, K and schema."""
    g = delta.gauges
    schema: str | None
    if h.drafts is not None:
        schema = "sglang_counters"
        tau = h.mean_acceptance_length
    else:
        gauge = g.get("sglang_accept_length")
        generated = delta.counters.get("generation_tokens")
        stale = generated is not None and generated <= 0
        tau = gauge if gauge is not None and gauge >= 1 and not stale else None
        schema = "sglang_interval" if tau is not None else None
    n = draft_tokens(g, configured_k, tau)
    alpha = h.acceptance_rate
    if alpha is None and tau is not None and n is not None:
        alpha = alpha_from_tau(tau, n)
    rate = g.get("sglang_accept_rate")
    withheld = ("acceptance_above_one",) if rate is not None and rate > 1 else ()
    drafts_per_second = h.drafts_per_second
    if schema == "sglang_interval" and tau is not None and h.generation_tokens_per_second:
        # no verify count before 0.5.13: verifies ≈ generated tokens / τ (an estimate, so the
        # acceptance detectors' drafts-per-second floor can be judged)
        drafts_per_second = h.generation_tokens_per_second / tau
    return replace(
        h,
        drafts_per_second=drafts_per_second,
        acceptance_rate=alpha,
        mean_acceptance_length=tau,
        mean_draft_length=h.mean_draft_length if n is None else float(n - 1),
        num_speculative_tokens=None if n is None else n - 1,
        spec_decode_schema=schema,
        withheld=withheld,
    )


def sglang_observed_k(page: PageReading) -> int | None:
    """K = N − 1 shown by an SGLang page (``sglang:spec_num_draft_tokens``, 0.5.13 on; 0 without
    speculation): the largest over its engines, ``None`` when no engine shows N ≥ 2."""
    shown = [
        round(e.gauges["sglang_num_draft_tokens"]) - 1
        for e in page.engines.values()
        if e.gauges.get("sglang_num_draft_tokens", 0.0) >= 2
    ]
    return max(shown) if shown else None


def sglang_capacity(
    limits: Limits, running: float | None, k: int | None, source: SpeculativeTokensSource | None
) -> Capacity:
    """Running vs ``max_running_requests`` (the target's ``max_num_seqs``) and SGLang's budget
    rule (:func:`specwatch.vllm.sglang.budget`): every running request verifies N = K + 1 tokens
    per decode step, with no per-step token budget, so the admission cap and the requests
    verified in full per step are both ``max_running_requests`` and the batch is never
    budget-bound; ``slots_per_request`` = N and ``required_batched_tokens`` = the verify forward
    of a full batch. ``limits_configured`` needs ``max_running_requests`` and K."""
    n = limits.max_num_seqs
    base = Capacity(
        limits_configured=False,
        max_num_seqs=n,
        max_num_batched_tokens=limits.max_num_batched_tokens,
        num_requests_running=running,
        running_to_max_seqs_ratio=None if n is None or running is None else running / n,
        running_gap_requests=None if n is None or running is None else n - running,
        num_speculative_tokens=k,
        num_speculative_tokens_source=source,
        extra_batch_slots=None if k is None else 0,
        slots_per_request=None if k is None else k + 1,
    )
    if n is None or k is None:
        return base
    plan = budget(n, k + 1, k, 1)
    return replace(
        base,
        limits_configured=True,
        admission_cap_requests=plan.admission_cap,
        decode_full_per_step_requests=plan.admission_cap,
        budget_bound=False,
        required_batched_tokens=plan.verify_tokens_per_step,
    )
