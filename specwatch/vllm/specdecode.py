"""Speculative-decoding facts shared by the sidecar and the simulator.

Per-method extra batch slots (S) and KV lookahead slots (L), and the scheduler's
token-budget limits, by vLLM version. Sources (vLLM v0.33.0):
``vllm/config/speculative.py:2058-2096`` (S), ``vllm/config/vllm.py:626-652`` (L),
``vllm/config/vllm.py:_set_max_num_scheduled_tokens`` (dflash/dspark admission cap,
and the static reservation of v0.20-v0.25), ``vllm/v1/core/sched/scheduler.py:700-1080``
(per-request ``input_budget`` accounting).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

#: Methods vLLM V1 accepts (``SpeculativeMethod``); ``*_mtp`` model types normalise to ``mtp``.
SPEC_METHODS: frozenset[str] = frozenset(
    {
        "ngram",
        "ngram_gpu",
        "suffix",
        "draft_model",
        "custom_class",
        "eagle",
        "eagle3",
        "mtp",
        "dflash",
        "dspark",
    }
)

#: Methods whose drafter runs a separate query pass and get the v0.33 admission cap B // L.
ADMISSION_CAPPED_METHODS: frozenset[str] = frozenset({"dflash", "dspark"})

#: Methods that force ``parallel_drafting`` on.
FORCED_PARALLEL_METHODS: frozenset[str] = frozenset({"dflash", "dspark"})


class BudgetRegime(enum.StrEnum):
    """Which scheduler token accounting a vLLM version uses."""

    #: v0.33+: per-request input budget, v0.33 S table, dflash/dspark admission cap.
    V0_33 = "0.33"
    #: v0.26-v0.32: per-request input budget, older S (dflash K, dspark K-1), no admission cap.
    V0_32 = "0.32"
    #: v0.20-v0.25: static reservation T = B - S_old * N.
    STATIC = "static"


_VERSION_RE = re.compile(r"^v?(\d+)\.(\d+)")


def regime_for_version(version: str | None) -> BudgetRegime:
    """Map a vLLM version string (``"0.33.0"``, ``"v0.25.1"``) to its budget regime.

    ``None`` means "current" (v0.33 rules). Raises ``ValueError`` on an unreadable string.
    """
    if version is None:
        return BudgetRegime.V0_33
    if version in {r.value for r in BudgetRegime}:
        return BudgetRegime(version)
    m = _VERSION_RE.match(version.strip())
    if m is None:
        raise ValueError(f"unreadable vLLM version {version!r}")
    major, minor = int(m.group(1)), int(m.group(2))
    if major > 0 or minor >= 33:
        return BudgetRegime.V0_33
    if minor >= 26:
        return BudgetRegime.V0_32
    return BudgetRegime.STATIC


@dataclass(frozen=True, slots=True)
class Slots:
    """Per-request slot costs of one method.

    ``extra_batch_slots`` is S (rows the drafter adds per request inside
    ``max_num_batched_tokens``);
    ``lookahead_slots`` is L (KV slots reserved past the target's query).
    """

    extra_batch_slots: int
    lookahead_slots: int


def method_slots(
    method: str,
    k: int,
    *,
    parallel_drafting: bool = False,
    regime: BudgetRegime = BudgetRegime.V0_33,
    dspark_sample_from_anchor: bool = False,
) -> Slots:
    """S and L for ``method`` with K = ``k`` draft tokens (table in vllm-metrics.md §9).

    dspark defaults to fill-in sampling (``sample_from_anchor=False``: L = K + 1).
    Raises ``ValueError`` for an unknown method or K < 1.
    """
    if method not in SPEC_METHODS:
        raise ValueError(f"unknown speculative method {method!r}")
    if k < 1:
        raise ValueError(f"num_speculative_tokens must be >= 1, got {k}")
    parallel = parallel_drafting or method in FORCED_PARALLEL_METHODS
    if method in {"eagle", "eagle3"}:
        return Slots(k - 1 if parallel else 0, k)
    if method == "mtp":
        return Slots(0, k)
    if method in {"ngram", "ngram_gpu", "suffix", "custom_class"}:
        return Slots(0, 0)
    if method == "draft_model":
        return Slots(k if parallel else 1, k)
    if method == "dflash":
        return Slots(k if regime is not BudgetRegime.V0_33 else 0, k + 1)
    # dspark
    lookahead = k if dspark_sample_from_anchor else k + 1
    return Slots(k - 1 if regime is not BudgetRegime.V0_33 else 0, lookahead)


def static_reservation_slots(method: str, k: int, *, parallel_drafting: bool = False) -> int:
    """S_old of the v0.20-v0.25 static reservation: (K-1 if parallel) + (1 if draft_model).

    dflash reserved K-1 (PR #51256 later made it K); dspark is parallel, so K-1.
    """
    parallel = parallel_drafting or method in FORCED_PARALLEL_METHODS
    return (k - 1 if parallel else 0) + (1 if method == "draft_model" else 0)


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
    d_full = min(a_eff, t // (1 + k), b // (1 + k + s))
    d_any = min(a_eff, b // (1 + s))
    r_max = a_eff if regime is BudgetRegime.V0_33 else min(a_eff, max(d_full, 1))
    return BudgetLimits(
        admission_cap=r_max,
        decode_full_per_step=d_full,
        decode_any_per_step=d_any,
        scheduled_token_budget=t,
        slots_per_request=1 + k + s,
        budget_bound=d_full < n,
    )
