"""Compare the arms of one replayed request: ``ReplayPair -> PairOutcome`` (pure).

Per arm other than the standard (lossless reference): exact match, first divergence (characters,
and tokens when both arms returned token ids), a normalised similarity (rapidfuzz Indel
similarity, 1 - InDel distance / (len a + len b)), the extracted answer, correctness against the
gold answer (canary items) and agreement with the standard arm (all traffic). Latency, tokens and
per-request τ (mean acceptance length) are carried through.

A reply is three comparison fields, each compared on its own and kept separately
(:class:`ArmOutcome`):

* ``content``: ``message.content`` (chat) or ``text`` (completions), judged by the request's
  checker (``content_agrees``);
* ``tool_calls``: function names and JSON-normalised arguments, in order (``tool_calls_agree``;
  ``None`` when neither arm made a tool call);
* ``reasoning``: ``reasoning_content`` / ``reasoning`` text, whitespace-normalised
  (``reasoning_agrees``; ``None`` when neither arm sent any).

``agrees`` (what the flip and agreement counts use) is: when neither arm has content or tool calls
(a reasoning model cut at the token cap returns only reasoning) the reasoning comparison, so two
empty answers never agree for free; otherwise content and tool calls must both agree, and without
a checker (live traffic, exact comparison) the reasoning text too. A checker grades the final
answer, so with a checker differing reasoning alone is not a disagreement. ``exact_match`` is
all three fields identical; divergence and similarity are over the content text, or over the
reasoning text when both contents are empty.

Truncated answers (``finish_reason`` ``length`` / ``content_filter``, see
:mod:`specwatch.shadow.classify`) are compared like any other, but a pair in which the standard or
FLy arm was truncated is never graded: ``correct`` is ``None`` on every arm, so it never enters
the lost / gained table. A noise arm that was truncated is likewise not graded.

Answers are extracted and judged by the request's checker (:mod:`specwatch.shadow.checkers`);
the pair's status by :mod:`specwatch.shadow.classify`. Math checking can be slow on adversarial
text: run :func:`compare` off the event loop
(``asyncio.to_thread``) when ``math`` is used.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rapidfuzz.distance import Indel

from specwatch.shadow.checkers import Checker, CheckerError, make_checker, norm_ws
from specwatch.shadow.classify import EXCLUDED_REASONS as EXCLUDED_REASONS
from specwatch.shadow.classify import classify_pair, truncated
from specwatch.shadow.values import ArmOutcome, ArmResult, PairOutcome, ReplayPair

__all__ = [
    "AGREEMENT_OUTCOMES",
    "CORRECTNESS_OUTCOMES",
    "EXCLUDED_REASONS",
    "ArmOutcome",
    "CompareConfig",
    "PairOutcome",
    "compare",
    "first_divergence",
    "is_greedy",
    "similarity",
]

#: Outcome labels (``specwatch_shadow_pairs_total{outcome}``): correctness outcomes for labelled
#: pairs (gold known), agreement outcomes for unlabelled live traffic.
CORRECTNESS_OUTCOMES = ("both_correct", "both_wrong", "lost", "gained")
AGREEMENT_OUTCOMES = ("agree", "disagree")


@dataclass(frozen=True, slots=True)
class CompareConfig:
    """How answers are compared.

    ``similarity_threshold``: when set (0..1), unlabelled text without a checker agrees when the
    normalised similarity reaches it; otherwise agreement is whitespace-normalised equality.
    """

    similarity_threshold: float | None = None


def first_divergence(a: str | tuple[int, ...], b: str | tuple[int, ...]) -> int | None:
    """Index of the first position where ``a`` and ``b`` differ; ``None`` when equal.

    When one is a prefix of the other the answer is the shorter length.
    """
    if a == b:
        return None
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def similarity(a: str, b: str) -> float:
    """Normalised Indel similarity in [0, 1] (rapidfuzz ``Indel.normalized_similarity``);
    1.0 for two empty strings."""
    return float(Indel.normalized_similarity(a, b))


def _compared_text(r: ArmResult, other: ArmResult) -> str:
    """Content, or the reasoning text when both arms' contents are empty."""
    if r.text or other.text:
        return r.text
    return r.reasoning or ""


def _arm_outcome(
    r: ArmResult,
    std: ArmResult | None,
    checker: Checker,
    gold: str | None,
    cfg: CompareConfig,
    has_checker: bool,
) -> ArmOutcome:
    answer = checker.extract(r.text) if r.ok else None
    correct = checker.equal_to_gold(gold, r.text) if (r.ok and gold is not None) else None
    exact = agrees = sim = div_c = div_t = None
    content = tools = reasoning = None
    if std is not None and std.ok and r.ok:
        a, b = _compared_text(std, r), _compared_text(r, std)
        exact = (
            r.text == std.text
            and r.tool_calls == std.tool_calls
            and (norm_ws(r.reasoning or "") == norm_ws(std.reasoning or ""))
        )
        sim = similarity(a, b)
        div_c = first_divergence(a, b)
        if std.token_ids is not None and r.token_ids is not None:
            div_t = first_divergence(std.token_ids, r.token_ids)
        if has_checker:
            content = checker.equal_texts(std.text, r.text)
        elif cfg.similarity_threshold is not None:
            content = similarity(std.text, r.text) >= cfg.similarity_threshold
        else:
            content = norm_ws(std.text) == norm_ws(r.text)
        if r.tool_calls or std.tool_calls:
            tools = r.tool_calls == std.tool_calls
        if r.reasoning is not None or std.reasoning is not None:
            reasoning = norm_ws(r.reasoning or "") == norm_ws(std.reasoning or "")
        if not (r.text.strip() or std.text.strip() or r.tool_calls or std.tool_calls):
            agrees = reasoning if reasoning is not None else content
        else:
            agrees = content and tools is not False
            if not has_checker:
                agrees = agrees and reasoning is not False
    return ArmOutcome(
        arm=r.arm,
        ok=r.ok,
        error=r.error,
        status=r.status,
        latency_seconds=r.latency_seconds,
        prompt_tokens=r.prompt_tokens,
        completion_tokens=r.completion_tokens,
        mean_acceptance_length=r.mean_acceptance_length,
        finish_reason=r.finish_reason,
        answer=answer,
        correct=correct,
        exact_match=exact,
        agrees=agrees,
        first_divergence_char=div_c,
        first_divergence_token=div_t,
        similarity=sim,
        text=r.text,
        truncated=truncated(r.finish_reason),
        tool_calls=r.tool_calls,
        reasoning=r.reasoning,
        error_code=r.error_code,
        content_agrees=content,
        tool_calls_agree=tools,
        reasoning_agrees=reasoning,
        spec_decode=r.spec_decode,
        first_token_seconds=r.first_token_seconds,
        last_token_seconds=r.last_token_seconds,
    )


def is_greedy(body: Mapping[str, Any]) -> bool:
    """True when the request body asks for greedy decoding: ``temperature`` given as 0, or
    ``top_k`` 1. An absent temperature is not greedy (OpenAI and vLLM default to sampling)."""
    t = body.get("temperature")
    k = body.get("top_k")
    num = (int, float)
    return (isinstance(t, num) and not isinstance(t, bool) and t == 0) or (
        isinstance(k, int) and not isinstance(k, bool) and k == 1
    )


def compare(pair: ReplayPair, config: CompareConfig | None = None) -> PairOutcome:
    """Compare every arm of ``pair`` with the standard arm; never raises on bad content.

    Status and reason come from :func:`specwatch.shadow.classify.classify_pair`, called here
    once per pair and nowhere else (the one rule: invalid checker → ``excluded/bad_checker``;
    ``n > 1`` → ``excluded/multiple_choices``; a 400/422 on the standard or FLy arm →
    ``excluded``; any other standard/FLy failure → ``unpaired/<arm>_<class>``, e.g.
    ``standard_http_5xx``, ``fly_aborted``; a failed noise arm never changes the status). Math
    answers are compared without math-verify's signal timeout, so call from a worker thread
    when the ``math`` checker is used.
    """
    cfg = config or CompareConfig()
    req = pair.request
    checker_ok = True
    try:
        checker = make_checker(req.checker)
    except CheckerError:
        checker = make_checker(None)
        checker_ok = False
    status, reason = classify_pair(pair, checker_ok=checker_ok)
    gold = req.gold
    has_checker = req.checker is not None and checker_ok
    graded = (
        status == "paired"
        and not truncated(pair.standard.finish_reason)
        and not truncated(pair.fly.finish_reason)
    )
    std_gold = gold if graded else None
    std_out = _arm_outcome(pair.standard, None, checker, std_gold, cfg, has_checker)
    fly_out = _arm_outcome(pair.fly, pair.standard, checker, std_gold, cfg, has_checker)
    noise_out = None
    if pair.noise is not None:
        noise_gold = None if truncated(pair.noise.finish_reason) else std_gold
        noise_out = _arm_outcome(pair.noise, pair.standard, checker, noise_gold, cfg, has_checker)
    base_out = (
        _arm_outcome(pair.baseline, pair.standard, checker, std_gold, cfg, has_checker)
        if pair.baseline is not None
        else None
    )
    noise_base = (
        _arm_outcome(pair.noise, pair.baseline, checker, None, cfg, has_checker).agrees
        if pair.noise is not None and pair.baseline is not None
        else None
    )
    return PairOutcome(
        time=req.received_at,
        request_hash=req.request_hash,
        category=req.category,
        source=req.source,
        item_id=req.item_id,
        seed=pair.seed,
        labelled=gold is not None,
        status=status,
        reason=reason,
        standard=std_out,
        fly=fly_out,
        noise=noise_out,
        baseline=base_out,
        noise_baseline_agrees=noise_base,
        greedy=is_greedy(req.body),
        running=pair.running,
        request_id=req.request_id,
    )
