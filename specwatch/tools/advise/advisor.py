"""Speculation advisor math (pure): τ for every smaller K and the token budget per K.

From vLLM's per-position acceptance counters, the mean acceptance length with only the first
K' <= K draft positions is exact: a draft token at position i is accepted only when every
earlier one was, so ``rate[i] = Δaccepted_per_pos[i] / Δdrafts`` is already the probability
that the first i+1 tokens are all accepted, and ``τ(K') = 1 + Σ_{i<K'} rate[i]`` (vLLM
``SpecDecodingLogging``: τ = 1 + Δaccepted / Δdrafts). The token-budget limits per K' come from
:func:`specwatch.vllm.budget.budget_limits` (vllm-metrics.md §9).

Throughput model (stated with every recommendation): steady pure decode; each running request
drafts K tokens per step; per-position rates do not change when K shrinks (the drafter proposes
left to right, so the first K' proposals are the same); requests the budget cannot serve with
full drafts count as 1 token per step (a lower bound); step time does not depend on K (drafter
and verify cost ignored), so tokens per step stand for throughput.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specwatch.vllm.budget import BudgetLimits, budget_limits
from specwatch.vllm.methods import BudgetRegime

#: Fewest drafts for per-position rates to support a claim (binomial SE <= 0.025 per rate).
MIN_DRAFTS: int = 400

#: Smallest relative gain in tokens per step worth recommending a change for.
MIN_GAIN: float = 0.02

ASSUMPTIONS: tuple[str, ...] = (
    "steady pure decode: every running request takes one step each engine step, and the share "
    "of those steps that draft (the step coverage) stays as observed; a step without a "
    "proposal emits 1 token",
    "per-position acceptance rates stay the same when K shrinks (left-to-right drafting)",
    "requests the token budget cannot serve with full drafts count as 1 token per step "
    "(a lower bound)",
    "engine step time does not depend on K: drafter and verification cost are not modelled",
)


def mean_acceptance_length(per_position: Sequence[float], k: int) -> float:
    """τ(K') = 1 + Σ of the first ``k`` per-position acceptance rates (tokens per verify step).

    ``per_position[i]`` is Δaccepted_per_pos[i] / Δdrafts (0..1). Raises ``ValueError`` when
    ``k`` is not in ``1..len(per_position)``.
    """
    if not 1 <= k <= len(per_position):
        raise ValueError(f"k must be in 1..{len(per_position)}, got {k}")
    return 1.0 + float(sum(per_position[:k]))


def step_coverage(
    drafts: float | None, accepted: float | None, generation: float | None
) -> float | None:
    """The share of request steps that verified a draft: Δdrafts / (Δgeneration − Δaccepted).

    vLLM adds 1 + accepted to ``generation_tokens`` per request and step, so Δgeneration −
    Δaccepted counts request steps (and each request's first token, from its prefill); a draft
    is counted only for a step that scheduled a draft token. The token share exported as
    ``specwatch_speculation_coverage``, (Δaccepted + Δdrafts) / Δgeneration, comes from the same
    counters. ``None`` when a count is unknown or no step was taken; at most 1."""
    if drafts is None or accepted is None or generation is None:
        return None
    steps = generation - accepted
    if steps <= 0:
        return None
    return min(drafts / steps, 1.0)


def tokens_per_request_step(tau: float, coverage: float | None) -> float:
    """Tokens a running request emits per engine step: τ on the covered share of steps, 1 on
    the rest (``coverage`` ``None``: every step drafts, τ)."""
    return tau if coverage is None else 1.0 + coverage * (tau - 1.0)


def budget_for_full_decode(
    max_num_seqs: int,
    k: int,
    method: str,
    *,
    parallel_drafting: bool = False,
    regime: BudgetRegime = BudgetRegime.V0_33,
) -> int:
    """Smallest ``max_num_batched_tokens`` B (tokens) at which all ``max_num_seqs`` requests are
    admitted and decoded with all K drafts per step (``admission_cap`` and
    ``decode_full_per_step`` both reach N under :func:`budget_limits`).

    Closed forms it reproduces: v0.33 ``N · max(1 + K + S, L)`` for dflash/dspark,
    ``N · (1 + K + S)`` otherwise; static ``N · (1 + K + S_old)``. Found by bisection on the
    (monotone) limits. Raises ``ValueError`` as :func:`budget_limits`.
    """
    lo, hi = 1, max_num_seqs * (2 * k + 4)

    def ok(b: int) -> bool:
        lim = budget_limits(
            max_num_batched_tokens=b,
            max_num_seqs=max_num_seqs,
            num_speculative_tokens=k,
            method=method,
            parallel_drafting=parallel_drafting,
            regime=regime,
        )
        return lim.decode_full_per_step >= max_num_seqs and lim.admission_cap >= max_num_seqs

    if not ok(hi):
        raise ValueError("no budget serves max_num_seqs in full")  # pragma: no cover
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass(frozen=True, slots=True)
class KRow:
    """One candidate K: ``k``, ``mean_acceptance_length`` τ(K) (tokens per verify step).

    With limits (else ``None``): ``admission_cap_requests`` (most requests RUNNING),
    ``decode_full_per_step_requests`` (requests served with all K drafts per step),
    ``served_full_requests`` = min(concurrency, decode_full_per_step),
    ``tokens_per_request_step`` = 1 + coverage · (τ(K) − 1) (:func:`tokens_per_request_step`),
    ``expected_tokens_per_step`` = served_full · that + (requests served below full drafts) · 1,
    ``budget_for_max_num_seqs`` (tokens; see :func:`budget_for_full_decode`),
    ``expected_tokens_per_step_at_max_num_seqs`` the same expectation with all ``max_num_seqs``
    running under the configured budget (what a larger budget is weighed against at full load).
    """

    k: int
    mean_acceptance_length: float
    tokens_per_request_step: float | None = None
    admission_cap_requests: int | None = None
    decode_full_per_step_requests: int | None = None
    served_full_requests: int | None = None
    expected_tokens_per_step: float | None = None
    budget_for_max_num_seqs: int | None = None
    expected_tokens_per_step_at_max_num_seqs: float | None = None


def _tokens_per_step(want: float, lim: BudgetLimits, max_num_seqs: int, tau: float) -> float:
    """Expected tokens per step with ``want`` requests wanting a step under ``lim``: those
    served with full drafts give τ each, the rest that still get a step 1 each."""
    running = min(want, float(lim.admission_cap), float(max_num_seqs))
    full = min(running, float(lim.decode_full_per_step))
    partial = max(0.0, min(running, float(lim.decode_any_per_step)) - full)
    return full * tau + partial


def rows_by_k(
    per_position: Sequence[float],
    *,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    method: str | None = None,
    regime: BudgetRegime = BudgetRegime.V0_33,
    parallel_drafting: bool = False,
    concurrency: float | None = None,
    coverage: float | None = None,
) -> list[KRow]:
    """One :class:`KRow` per K' in ``1..len(per_position)``.

    ``coverage``: the step coverage (:func:`step_coverage`) the tokens per step are planned at
    (``None``: every step drafts).

    Budget columns need ``max_num_seqs``, ``max_num_batched_tokens`` and ``method``;
    ``concurrency`` (requests wanting a step) defaults to ``max_num_seqs`` and is capped by the
    admission cap. Requests past ``decode_full_per_step`` but within ``decode_any_per_step``
    count 1 token each. Raises ``ValueError`` from :func:`budget_limits`.
    """
    out: list[KRow] = []
    for k in range(1, len(per_position) + 1):
        tau = mean_acceptance_length(per_position, k)
        eff = tokens_per_request_step(tau, coverage)
        if max_num_seqs is None or max_num_batched_tokens is None or method is None:
            out.append(KRow(k, tau, eff))
            continue
        lim = budget_limits(
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            num_speculative_tokens=k,
            method=method,
            parallel_drafting=parallel_drafting,
            regime=regime,
        )
        want = float(max_num_seqs) if concurrency is None else float(concurrency)
        running = min(want, float(lim.admission_cap), float(max_num_seqs))
        full = min(running, float(lim.decode_full_per_step))
        out.append(
            KRow(
                k,
                tau,
                eff,
                admission_cap_requests=lim.admission_cap,
                decode_full_per_step_requests=lim.decode_full_per_step,
                served_full_requests=int(full),
                expected_tokens_per_step=_tokens_per_step(want, lim, max_num_seqs, eff),
                budget_for_max_num_seqs=budget_for_full_decode(
                    max_num_seqs, k, method, parallel_drafting=parallel_drafting, regime=regime
                ),
                expected_tokens_per_step_at_max_num_seqs=_tokens_per_step(
                    float(max_num_seqs), lim, max_num_seqs, eff
                ),
            )
        )
    return out


def advice(
    rows: Sequence[KRow],
    *,
    drafts: float | None,
    configured_k: int | None,
    max_num_seqs: int | None = None,
    max_num_batched_tokens: int | None = None,
    concurrency: float | None = None,
    concurrency_label: str | None = None,
) -> list[str]:
    """Recommendations in words (or why none can be made) for the rows of :func:`rows_by_k`.

    No claim below :data:`MIN_DRAFTS` drafts or without per-position data; a smaller K or a
    larger budget is recommended only when it raises expected tokens per step by at least
    :data:`MIN_GAIN` under the model in :data:`ASSUMPTIONS`; when several K are within
    :data:`MIN_GAIN` of the best, the smallest of them is named (:func:`smallest_k_within`) and,
    when the configured K is among them, the line says "no K pays". The budget line quotes the gain
    at ``concurrency`` (the rows' concurrency; ``concurrency_label`` names it, e.g. "the 100
    running requests now") and at ``max_num_seqs``, each labelled
    (:func:`budget_gains`); it recommends the larger budget when the gain at ``concurrency``
    reaches :data:`MIN_GAIN`, and says it pays only under more load when only the gain at
    ``max_num_seqs`` does.
    """
    if not rows or configured_k is None:
        return [
            "K unknown: the page has no per-position acceptance counters, so τ for a smaller K "
            "cannot be computed; no recommendation."
        ]
    if drafts is None or drafts < MIN_DRAFTS:
        n = 0 if drafts is None else int(drafts)
        return [
            f"only {n} drafts in the window (< {MIN_DRAFTS}): per-position rates are too noisy "
            "to compare K values; collect a longer window before changing K."
        ]
    cur = next((r for r in rows if r.k == configured_k), rows[-1])
    lines: list[str] = []
    if cur.expected_tokens_per_step is None:
        lines.append(
            f"without --max-num-seqs, --max-num-batched-tokens and --method a smaller K only "
            f"lowers τ (K={cur.k}: τ={cur.mean_acceptance_length:.3f}); whether it still pays "
            "depends on drafter cost, which /metrics does not show."
        )
        tail = [r for r in rows if r.k > 1]
        for r in tail:
            prev = rows[r.k - 2]
            gain = r.mean_acceptance_length - prev.mean_acceptance_length
            if gain < 0.01:
                lines.append(
                    f"position {r.k} onward adds under 0.01 tokens per step each: "
                    f"K={r.k - 1} keeps τ={prev.mean_acceptance_length:.3f}."
                )
                break
        return lines
    best_tok = max(r.expected_tokens_per_step or 0.0 for r in rows)
    pick = smallest_k_within(rows, best_tok)
    cur_tok = cur.expected_tokens_per_step or 0.0
    pick_tok = pick.expected_tokens_per_step or 0.0
    if pick.k < cur.k and best_tok > cur_tok * (1 + MIN_GAIN):
        lines.append(
            f"K={pick.k} should give more throughput than K={cur.k}: "
            f"{pick_tok:.1f} vs {cur_tok:.1f} expected tokens per step "
            f"({100 * (pick_tok / cur_tok - 1):+.1f}%) because the token budget serves "
            f"{pick.served_full_requests} instead of {cur.served_full_requests} requests with "
            "full drafts."
            if cur_tok > 0
            else f"K={pick.k} should give more throughput than K={cur.k}."
        )
    elif pick.k < cur.k:
        lines.append(
            f"no K pays: every K from {pick.k} to {cur.k} gives within {100 * MIN_GAIN:g} % of "
            f"the best {best_tok:.1f} expected tokens per step (K={cur.k}: {cur_tok:.1f}), so "
            f"K={pick.k} is enough; a larger K costs drafter compute this model leaves out."
        )
    else:
        lines.append(
            f"K={cur.k} is the best K up to {rows[-1].k} under this model "
            f"({cur_tok:.1f} expected tokens per step)."
        )
    budget = budget_line(
        cur,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        concurrency=concurrency,
        concurrency_label=concurrency_label,
    )
    if budget is not None:
        lines.append(budget)
    return lines


def smallest_k_within(rows: Sequence[KRow], best_tokens: float) -> KRow:
    """The smallest K whose expected tokens per step is within :data:`MIN_GAIN` of
    ``best_tokens`` (at least ``best_tokens / (1 + MIN_GAIN)``): a tie, within that tolerance,
    goes to the smaller K, whose drafter costs less (the model leaves drafter compute out).
    ``rows`` non-empty, ascending K."""
    floor = best_tokens / (1 + MIN_GAIN)
    return next((r for r in rows if (r.expected_tokens_per_step or 0.0) >= floor), rows[-1])


@dataclass(frozen=True, slots=True)
class BudgetGain:
    """The relative gain in expected tokens per step of a budget that serves every request
    with full drafts over the configured one, at one concurrency: ``label`` names it
    (``at the 100 running requests now``, ``at max_num_seqs=256``), ``running`` the requests
    counted, ``now`` and ``full`` the tokens per step under each budget, ``gain`` = full / now −
    1 (a fraction)."""

    label: str
    running: float
    now: float
    full: float
    gain: float

    def text(self) -> str:
        """``at max_num_seqs=256: +50.6 % (385.6 vs 256.0 tokens per step)``."""
        return (
            f"{self.label}: {100 * self.gain:+.1f} % ({self.full:.1f} vs {self.now:.1f} tokens "
            "per step)"
        )


def budget_gains(
    row: KRow,
    *,
    max_num_seqs: int,
    concurrency: float | None,
    concurrency_label: str | None,
) -> list[BudgetGain]:
    """The gains of :attr:`KRow.budget_for_max_num_seqs` over the configured budget for
    ``row`` (a row of :func:`rows_by_k` with limits): first at ``concurrency`` (left out when
    it is ``None`` or ``max_num_seqs`` itself), then at ``max_num_seqs``. Empty when the row
    has no budget columns or a concurrency's tokens per step is 0."""
    tau = row.tokens_per_request_step or row.mean_acceptance_length
    out: list[BudgetGain] = []
    points: list[tuple[str, float, float | None]] = []
    if concurrency is not None and concurrency != max_num_seqs:
        label = concurrency_label or f"{concurrency:g} running requests"
        points.append((f"at {label}", concurrency, row.expected_tokens_per_step))
    points.append(
        (
            f"at max_num_seqs={max_num_seqs}",
            float(max_num_seqs),
            row.expected_tokens_per_step_at_max_num_seqs,
        )
    )
    for label, running, now in points:
        if now is None or now <= 0:
            continue
        full = min(running, float(max_num_seqs)) * tau
        out.append(BudgetGain(label, running, now, full, full / now - 1.0))
    return out


def budget_line(
    cur: KRow,
    *,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    concurrency: float | None,
    concurrency_label: str | None,
) -> str | None:
    """The larger-budget sentence for the configured K's row (``None`` when the budget
    already serves ``max_num_seqs`` in full or no gain reaches :data:`MIN_GAIN`)."""
    if (
        max_num_seqs is None
        or max_num_batched_tokens is None
        or cur.budget_for_max_num_seqs is None
        or cur.budget_for_max_num_seqs <= max_num_batched_tokens
    ):
        return None
    gains = budget_gains(
        cur,
        max_num_seqs=max_num_seqs,
        concurrency=concurrency,
        concurrency_label=concurrency_label,
    )
    if not gains or all(g.gain < MIN_GAIN for g in gains):
        return None
    quoted = "; ".join(g.text() for g in gains)
    what = (
        f"max_num_batched_tokens={cur.budget_for_max_num_seqs} (now {max_num_batched_tokens}) "
        f"lets all {max_num_seqs} max_num_seqs decode with K={cur.k} full drafts"
    )
    if gains[0].gain >= MIN_GAIN:
        return f"a larger budget should give more throughput: {what}; {quoted}."
    return f"a larger budget pays only under more load: {what}; {quoted}."
