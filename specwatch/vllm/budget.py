"""The scheduler's token-budget limits: the one home of the ``N·(1+K+S)`` rule.

Sources (vLLM v0.33.0): ``vllm/config/vllm.py:_set_max_num_scheduled_tokens`` (dflash/dspark
admission cap, static reservation of v0.20-v0.25) and ``vllm/v1/core/sched/scheduler.py:700-1080``
(per-request ``input_budget`` accounting). Slot counts come from :mod:`specwatch.vllm.methods`.
"""

from __future__ import annotations

from dataclasses import dataclass

from specwatch.vllm.methods import (
    ADMISSION_CAPPED_METHODS,
    BudgetRegime,
    method_slots,
    static_reservation_slots,
)


def required_batched_tokens(n: int, k: int, s: int) -> int:
    """Tokens one engine step needs to verify full drafts of ``n`` running requests.

    ``n``: requests (``max_num_seqs`` for the configuration check), ``k``: draft tokens per
    request (num_speculative_tokens), ``s``: the method's extra batch slots
    (:attr:`specwatch.vllm.methods.Slots.extra_batch_slots`). Returns ``n · (1 + k + s)``
    tokens: each request's one target token, its K drafts and S drafter rows. Raises
    ``ValueError`` on a negative argument.
    """
    if n < 0 or k < 0 or s < 0:
        raise ValueError("n, k and s must be >= 0")
    return n * (1 + k + s)


@dataclass(frozen=True, slots=True)
class BudgetLimits:
    """Scheduler limits for pure decode with full drafts (requests, per engine step).

    ``admission_cap``: R_max, the most requests that can be RUNNING.
    ``decode_full_per_step``: D_full, decode requests whose K drafts are all verified per step.
    ``decode_any_per_step``: D_any, requests that get at least one token per step.
    ``scheduled_token_budget``: T actually in force (B minus any static reservation).
    ``budget_bound``: True when D_full < max_num_seqs, i.e. the token budget, not
    ``max_num_seqs``, limits how many decode requests are served in full.
    """

    admission_cap: int
    decode_full_per_step: int
    decode_any_per_step: int
    scheduled_token_budget: int
    slots_per_request: int
    budget_bound: bool


def budget_limits(
    *,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    num_speculative_tokens: int,
    method: str,
    parallel_drafting: bool = False,
    regime: BudgetRegime = BudgetRegime.V0_33,
    max_num_scheduled_tokens: int | None = None,
    max_num_active_seqs: int | None = None,
) -> BudgetLimits:
    """Closed-form budget limits (vllm-metrics.md §9).

    v0.33: A_eff = min(A, B // L) for dflash/dspark; D_full = min(R_max, T // (1+K), B // (1+K+S)).
    v0.32: no admission cap; R_max is also bounded by D_full because a waiting request is only
    admitted with leftover budget (the walk stops when input_budget <= S).
    static: T = B - S_old * N; D_full = min(N, T // (1+K)).

    Example: dspark, K=5, B=512, N=128 gives D_full 85 (v0.33) and 51 (v0.32).
    Raises ``ValueError`` on non-positive limits.
    """
    b, n, k = max_num_batched_tokens, max_num_seqs, num_speculative_tokens
    if b <= 0 or n <= 0 or k < 1:
        raise ValueError("max_num_batched_tokens, max_num_seqs must be > 0 and K >= 1")
    slots = method_slots(method, k, parallel_drafting=parallel_drafting, regime=regime)
    a = max_num_active_seqs if max_num_active_seqs is not None else n
    if regime is BudgetRegime.STATIC:
        s_old = static_reservation_slots(method, k, parallel_drafting=parallel_drafting)
        t = max(b - s_old * n, 0) if max_num_scheduled_tokens is None else max_num_scheduled_tokens
        d_full = min(n, t // (1 + k))
        d_any = min(n, t)
        return BudgetLimits(
            admission_cap=min(a, max(d_full, 0)) if d_full < n else a,
            decode_full_per_step=d_full,
            decode_any_per_step=d_any,
            scheduled_token_budget=t,
            slots_per_request=1 + k,
            budget_bound=d_full < n,
        )
    t = b if max_num_scheduled_tokens is None else max_num_scheduled_tokens
    s = slots.extra_batch_slots
    a_eff = a
    if (
        regime is BudgetRegime.V0_33
        and method in ADMISSION_CAPPED_METHODS
        and slots.lookahead_slots
    ):
        a_eff = min(a_eff, b // slots.lookahead_slots)
    d_full = min(a_eff, t // (1 + k), b // required_batched_tokens(1, k, s))
    d_any = min(a_eff, b // (1 + s))
    r_max = a_eff if regime is BudgetRegime.V0_33 else min(a_eff, max(d_full, 1))
    return BudgetLimits(
        admission_cap=r_max,
        decode_full_per_step=d_full,
        decode_any_per_step=d_any,
        scheduled_token_budget=t,
        slots_per_request=required_batched_tokens(1, k, s),
        budget_bound=d_full < n,
    )
