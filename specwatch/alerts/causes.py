"""Why an acceptance or budget alert holds: the causes the page and the configuration leave
open (pure), and the words the alerts and the runbook give each.

:func:`truncation_causes` sorts a mean draft length below K (vllm-metrics.md §6: the token
budget, dynamic K, structured-output invalidation, a proposer without proposals);
:func:`acceptance_causes` an acceptance drop (whole drafts rejected from the first token, as
vLLM's zero-fill at the drafter's context limit does; a drafter change; a FLy threshold
change). :data:`CAUSES` says what each one means and what to do; an alert carries its cause as
the ``cause`` label (``undetermined`` while several remain, all named in its texts).
"""

from __future__ import annotations

import math

from specwatch.observe.values import Health, TargetSnapshot

__all__ = [
    "CAUSES",
    "CONDITIONAL_TOLERANCE",
    "FLY_FLOOR_RATIO",
    "acceptance_cause",
    "acceptance_causes",
    "cause_words",
    "long_prompt_share",
    "truncation_causes",
]


def _f(x: float | None) -> float | None:
    """``x`` when it is a finite number, else ``None``."""
    return x if x is not None and math.isfinite(x) else None


def truncation_causes(
    *,
    designed: tuple[str, ...],
    scheduled_tokens_per_step: float | None,
    max_num_batched_tokens: float | None,
    running: float | None,
    d_full: float | None,
    fill_ratio: float,
) -> tuple[str, ...]:
    """What can make the mean draft length ℓ fall below K (vllm-metrics.md §6), those the page
    and the configuration leave open, the token budget first.

    ``token_budget`` stays a candidate unless the page rules it out: the tokens scheduled per
    engine step (:attr:`~specwatch.observe.values.Health.scheduled_tokens_per_step`) below
    ``fill_ratio`` (``detect.budget_fill_ratio``) × ``max_num_batched_tokens`` (every step had
    room), else, without that, ``running`` at most ``d_full`` (the budget verifies full drafts
    for all). When it is shown (steps filled to the ratio) it is the only cause returned.
    ``designed``: the causes the target is configured with (``dynamic_k``,
    ``structured_output``); when none is configured and the budget is ruled out, both remain
    (the page cannot tell them apart).
    """
    fill, b = _f(scheduled_tokens_per_step), _f(max_num_batched_tokens)
    r, d = _f(running), _f(d_full)
    budget: bool | None = None  # None: the page cannot tell
    if fill is not None and b is not None and b > 0:
        if fill >= fill_ratio * b:
            return ("token_budget",)
        budget = False
    elif r is not None and d is not None:
        budget = r > d
    if designed:  # configured by design: the budget only when the page points at it
        return ("token_budget", *designed) if budget else designed
    by_design = ("dynamic_k", "structured_output")
    return by_design if budget is False else ("token_budget", *by_design)


#: FLy's acceptance at or above this share of the standard arm's (same drafter, same window)
#: still reads as "FLy at least as lenient as the exact rule" (sampling noise allowed for).
FLY_FLOOR_RATIO = 0.95

#: Largest relative change of a conditional per-position rate (positions 1 and up) still read
#: as "the same": a drafter that got worse changes them, whole drafts rejected do not.
CONDITIONAL_TOLERANCE = 0.15


def _conditional_same(
    short: tuple[float | None, ...], base: tuple[float | None, ...]
) -> bool | None:
    """Whether every conditional rate from position 1 on is within :data:`CONDITIONAL_TOLERANCE`
    of the baseline's (``None``: no position 1 rate known on both sides)."""
    ratios: list[float] = []
    for a, b in zip(short[1:], base[1:], strict=False):
        fa, fb = _f(a), _f(b)
        if fa is not None and fb is not None and fb > 0:
            ratios.append(fa / fb)
    if not ratios:
        return None
    return all(abs(r - 1.0) <= CONDITIONAL_TOLERANCE for r in ratios)


def acceptance_causes(
    *,
    conditional_short: tuple[float | None, ...],
    conditional_base: tuple[float | None, ...],
    long_prompts: float | None,
    fly_alone: bool | None,
    restarted: bool,
    fly_above_standard: bool | None = None,
) -> tuple[str, ...]:
    """The causes of an acceptance drop the page leaves open, most specific first.

    - Conditional rates from position 1 on unchanged (within :data:`CONDITIONAL_TOLERANCE`):
      whole drafts were rejected from their first token, the pattern of vLLM zero-filling the
      drafts of steps whose longest sequence plus K exceeds the drafter's ``max_model_len``:
      ``drafter_context_limit`` when ``long_prompts`` (the share of prompts over the drafter's
      limit minus K in the window) is above 0, ``None`` (limit or histogram unknown) keeps it a
      candidate beside ``drafter_change``; 0 leaves ``drafter_change`` and ``traffic_change``.
    - Otherwise the drafter's per-token acceptance changed: on a FLy target whose standard
      partner did not drop (``fly_alone``), ``fly_threshold`` while FLy still accepts at least
      what standard does (``fly_above_standard``: FLy's relaxed verification accepts everything
      the exact rule accepts, so a stricter threshold moves FLy toward standard's level, never
      below it), ``drafter_change`` below it (FLy's own drafter or weights); after a counter reset
      (``restarted``) ``drafter_change`` (new drafter, weights or speculative config); else
      ``drafter_change`` and ``traffic_change`` remain.
    """
    same = _conditional_same(conditional_short, conditional_base)
    share = _f(long_prompts)
    if same:
        if share is not None and share > 0:
            return ("drafter_context_limit",)
        if share is None:
            return ("drafter_context_limit", "drafter_change")
        return ("drafter_change", "traffic_change")
    if fly_alone:
        return ("fly_threshold",) if fly_above_standard else ("drafter_change",)
    if restarted:
        return ("drafter_change",)
    if same is None and share is not None and share > 0:
        return ("drafter_context_limit", "drafter_change", "traffic_change")
    return ("drafter_change", "traffic_change")


#: What each cause means and what to do, as the alert texts say it (the runbook has the same
#: actions under each alert's "Causes").
CAUSES: dict[str, str] = {
    "token_budget": "the token budget cuts drafts short (steps are filled to "
    "max_num_batched_tokens): raise --max-num-batched-tokens or lower num_speculative_tokens",
    "dynamic_k": "the server shortens drafts as the batch grows "
    "(num_speculative_tokens_per_batch_size): by design, nothing to fix",
    "structured_output": "grammar-constrained requests: vLLM subtracts the draft tokens the "
    "grammar invalidates: by design, nothing to fix",
    "no_proposal": "the proposer (ngram, suffix) found nothing to propose for many steps; "
    "those steps draft nothing (see specwatch_speculation_coverage): by design, nothing to fix",
    "drafter_context_limit": "steps whose longest sequence plus K exceeds the drafter's "
    "max_model_len get zero-filled drafts, counted as drafted and rejected (the conditional "
    "per-position rates stay, long prompts are on the page): raise the drafter's max_model_len "
    "or route long prompts to a server without speculation",
    "drafter_change": "the drafter, its weights or the speculative config changed: compare the "
    "deployed drafter and --speculative-config with the last good ones, roll back",
    "traffic_change": "the traffic changed (prompts the drafter predicts worse): compare the "
    "request mix with the baseline period",
    "fly_threshold": "FLy's verification (entropy threshold or window) changed while the "
    "standard arm with the same drafter kept its acceptance: check the FLy server's "
    "--speculative-config",
    "disaggregation": "the decode server accepts far less than its monolithic baseline with the "
    "same drafter: with prefill/decode disaggregation the drafter's KV (or hidden states) is "
    "likely not transferred from the prefill server; check the KV connector carries the draft "
    "model's layers",
}


def cause_words(causes: tuple[str, ...]) -> tuple[str, str, str]:
    """The ``cause`` label (one cause, or ``undetermined``), the summary's words for it (``cause:
    X`` or ``cause undetermined: X or Y``) and the description's sentence naming it, or the
    candidates that remain, with what to do."""
    if len(causes) == 1:
        return causes[0], f"cause: {causes[0]}", f" Cause: {causes[0]}: {CAUSES[causes[0]]}."
    return (
        "undetermined",
        "cause undetermined: " + " or ".join(causes),
        (
            " Cause undetermined from the page; candidates: "
            + "; ".join(f"{c} ({CAUSES[c]})" for c in causes)
            + "."
        ),
    )


def long_prompt_share(h: Health, limit: int | None, k: int | None) -> float | None:
    """Share of the window's prompts longer than the largest prompt-length bucket bound within
    the drafter's ``limit`` minus ``k`` (an upper bound: sequences grow while they decode);
    ``None`` when the limit or the histogram is unknown or no prompt finished."""
    hist = h.prompt_length
    if limit is None or hist is None or not hist.buckets:
        return None
    total = hist.buckets[-1][1]
    if total <= 0:
        return None
    room = limit - (k or 0)
    below = max((c for le, c in hist.buckets if le <= room), default=0.0)
    return max(total - below, 0.0) / total


def acceptance_cause(
    t: TargetSnapshot, h: Health, b: Health | None, standard_alpha: float | None
) -> tuple[str, str, str]:
    """The ``cause`` label and sentence of an acceptance alert (:func:`acceptance_causes`)."""
    return cause_words(
        acceptance_causes(
            conditional_short=h.per_position_conditional_acceptance_rate,
            conditional_base=() if b is None else b.per_position_conditional_acceptance_rate,
            long_prompts=long_prompt_share(
                h, t.drafter_max_model_len, t.capacity.num_speculative_tokens
            ),
            fly_alone=None if standard_alpha is None else True,
            fly_above_standard=None
            if standard_alpha is None or h.acceptance_rate is None
            else h.acceptance_rate >= FLY_FLOOR_RATIO * standard_alpha,
            restarted=sum(t.counter_resets.values()) > 0,
        )
    )
