"""Compare the arms of one replayed request: ``ReplayPair -> PairOutcome`` (pure).

Per arm other than the standard (lossless reference): exact match, first divergence (characters,
and tokens when both arms returned token ids), a normalised similarity (rapidfuzz Indel
similarity, 1 - InDel distance / (len a + len b)), the extracted answer, correctness against the
gold answer (canary items) and agreement with the standard arm (all traffic). Latency, tokens and
per-request τ (mean acceptance length) are carried through.

Checkers (``ShadowRequest.checker``): ``None``/``exact`` (whitespace-normalised text),
``regex:<pattern>`` (last match; group 1 when the pattern has groups), ``json:<path>``
(``$.a.b[0]`` or ``a.b.0`` into the first JSON value of the text), ``math`` (math-verify when the
``math`` extra is installed, else exact rational comparison of the last number or ``\\boxed{}``).
Math checking can be slow on adversarial text: run :func:`compare` off the event loop
(``asyncio.to_thread``) when ``math`` is used.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from rapidfuzz.distance import Indel

from specwatch.shadow.classify import EXCLUDED_REASONS as EXCLUDED_REASONS
from specwatch.shadow.classify import PairStatus, classify
from specwatch.shadow.values import Arm, ArmResult, ReplayPair, Source

#: Outcome labels (``specwatch_shadow_pairs_total{outcome}``): correctness outcomes for labelled
#: pairs (gold known), agreement outcomes for unlabelled live traffic.
CORRECTNESS_OUTCOMES = ("both_correct", "both_wrong", "lost", "gained")
AGREEMENT_OUTCOMES = ("agree", "disagree")

_MATH_MAX_CHARS = 4000


@dataclass(frozen=True, slots=True)
class CompareConfig:
    """How answers are compared.

    ``similarity_threshold``: when set (0..1), unlabelled text without a checker agrees when the
    normalised similarity reaches it; otherwise agreement is whitespace-normalised equality.
    """

    similarity_threshold: float | None = None


@dataclass(frozen=True, slots=True)
class ArmOutcome:
    """One arm's result after comparison with the standard arm.

    ``exact_match``, ``first_divergence_*``, ``similarity`` and ``agrees`` are ``None`` for the
    standard arm itself and whenever either side failed. ``first_divergence_char`` is the index of
    the first differing character (``None`` when identical; the shorter length when one text is
    a prefix of the other), likewise ``first_divergence_token`` over token ids. ``correct`` is
    ``None`` when there is no gold answer. ``text`` is kept only so a ledger with ``store_text``
    can save it.
    """

    arm: Arm
    ok: bool
    error: str | None
    status: int | None
    latency_seconds: float
    prompt_tokens: int | None
    completion_tokens: int | None
    mean_acceptance_length: float | None
    finish_reason: str | None
    answer: str | None
    correct: bool | None
    exact_match: bool | None
    agrees: bool | None
    first_divergence_char: int | None
    first_divergence_token: int | None
    similarity: float | None
    text: str


@dataclass(frozen=True, slots=True)
class PairOutcome:
    """Everything the ledger and the statistics need about one replayed request.

    ``status``: ``paired`` (standard and FLy both answered), ``unpaired`` (one side failed;
    never counted as a mismatch), ``excluded`` (e.g. a 400 for an unsupported parameter, or a
    checker that cannot run); ``reason`` says why for the last two. ``noise`` is ``None`` when no
    noise arm was asked; a failed noise arm leaves the pair paired with ``noise.ok`` False.
    """

    time: float
    request_hash: str
    category: str
    source: Source
    item_id: str | None
    seed: int | None
    labelled: bool
    status: PairStatus
    reason: str | None
    standard: ArmOutcome
    fly: ArmOutcome
    noise: ArmOutcome | None

    def arm(self, arm: Arm) -> ArmOutcome | None:
        """The outcome of ``arm`` (``None`` for a noise arm that was not asked)."""
        return {Arm.STANDARD: self.standard, Arm.FLY: self.fly, Arm.NOISE: self.noise}[arm]

    def correctness_outcome(self, arm: Arm) -> str | None:
        """``both_correct|both_wrong|lost|gained`` of ``arm`` versus standard, labelled pairs only.

        ``lost`` = standard correct and ``arm`` wrong. ``None`` when not paired, not labelled, or
        the arm is missing/failed.
        """
        other = self.arm(arm)
        if self.status != "paired" or arm is Arm.STANDARD or other is None or not other.ok:
            return None
        s, o = self.standard.correct, other.correct
        if s is None or o is None:
            return None
        if s and o:
            return "both_correct"
        if not s and not o:
            return "both_wrong"
        return "lost" if s else "gained"

    def agreement_outcome(self, arm: Arm) -> str | None:
        """``agree|disagree`` of ``arm``'s answer with the standard arm's (``None`` if n/a)."""
        other = self.arm(arm)
        if self.status != "paired" or arm is Arm.STANDARD or other is None or other.agrees is None:
            return None
        return "agree" if other.agrees else "disagree"

    def outcome(self, arm: Arm) -> str | None:
        """The exported outcome label: correctness when labelled, else agreement."""
        return self.correctness_outcome(arm) if self.labelled else self.agreement_outcome(arm)


class CheckerError(ValueError):
    """The checker spec is unknown or invalid (the pair is excluded, reason ``bad_checker``)."""


def _norm_ws(text: str) -> str:
    return " ".join(text.split())


_NUMBER = re.compile(r"[-+]?\$?\d[\d,]*(?:\.\d+)?(?:/\d+)?|[-+]?\.\d+")


def _to_fraction(text: str) -> Fraction | None:
    s = text.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def answers_equal(a: str | None, b: str | None) -> bool:
    """Answer equality: whitespace-normalised strings, or equal numbers when both parse
    (``1,000`` = ``1000.0`` = ``$1000``; fractions ``3/4`` allowed). ``None`` equals nothing."""
    if a is None or b is None:
        return False
    if _norm_ws(a) == _norm_ws(b):
        return True
    fa, fb = _to_fraction(a), _to_fraction(b)
    return fa is not None and fa == fb


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth = start + len("\\boxed{"), 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def _first_json_value(text: str) -> Any:
    stripped = text.strip()
    try:
        return json.loads(stripped)
    except json.JSONDecodeError:
        pass
    decoder = json.JSONDecoder()
    for m in re.finditer(r"[\[{]", text):
        try:
            return decoder.raw_decode(text, m.start())[0]
        except json.JSONDecodeError:
            continue
    raise LookupError("no JSON value")


_PATH_TOKEN = re.compile(r"\[(\d+)\]|\[\"([^\"]*)\"\]|\.?([^.\[\]]+)")


def json_path_get(value: Any, path: str) -> Any:
    """Follow ``$.a.b[0]`` / ``a.b.0`` / ``$["k"]`` into ``value``; LookupError if absent."""
    path = path.strip()
    path = path.removeprefix("$")
    for m in _PATH_TOKEN.finditer(path):
        index, quoted, name = m.groups()
        key: str | int = (
            int(index) if index is not None else (quoted if quoted is not None else name)
        )
        if isinstance(value, list):
            if isinstance(key, str) and not key.isdigit():
                raise LookupError(key)
            value = value[int(key)]  # IndexError is a LookupError
        elif isinstance(value, dict):
            value = value[str(key)]
        else:
            raise LookupError(str(key))
    return value


def _canonical_json(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


@dataclass(frozen=True, slots=True)
class Checker:
    """A parsed checker: ``extract(text) -> answer | None`` and ``equal(a, b)``.

    ``equal`` compares two raw texts (arm vs arm) or an arm's text with the gold answer.
    """

    kind: str
    extract: Callable[[str], str | None]
    equal_to_gold: Callable[[str, str], bool]
    equal_texts: Callable[[str, str], bool]


def _math_verify_equal() -> Callable[[str, str], bool] | None:
    try:
        from math_verify import parse, verify  # optional extra "math"
    except ImportError:
        return None

    def eq(gold: str, text: str) -> bool:
        # No signal-based timeouts (they break inside an event loop or worker thread);
        # inputs are length-capped instead.
        g = parse(gold[-_MATH_MAX_CHARS:], parsing_timeout=None)
        t = parse(text[-_MATH_MAX_CHARS:], parsing_timeout=None)
        if not g or not t:
            return False
        return bool(verify(g, t, timeout_seconds=None))

    return eq


def _numeric_math_answer(text: str) -> str | None:
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    nums = _NUMBER.findall(text[-_MATH_MAX_CHARS:])
    return nums[-1] if nums else None


def make_checker(spec: str | None) -> Checker:
    """Parse a checker spec (see module docstring). Raises :class:`CheckerError` if invalid."""
    if spec is None or spec == "exact":

        def exact(text: str) -> str | None:
            return _norm_ws(text)

        return Checker(
            "exact",
            exact,
            lambda g, t: _norm_ws(g) == _norm_ws(t),
            lambda a, b: _norm_ws(a) == _norm_ws(b),
        )
    if spec.startswith("regex:"):
        try:
            pattern = re.compile(spec[len("regex:") :])
        except re.error as exc:
            raise CheckerError(f"bad regex: {exc}") from exc

        def rx(text: str) -> str | None:
            matches = list(pattern.finditer(text))
            if not matches:
                return None
            last = matches[-1]
            return (last.group(1) if pattern.groups else last.group(0)).strip()

        def rx_gold(gold: str, text: str) -> bool:
            return answers_equal(gold.strip(), rx(text))

        def rx_texts(a: str, b: str) -> bool:
            ea, eb = rx(a), rx(b)
            return answers_equal(ea, eb) if ea is not None or eb is not None else a == b

        return Checker("regex", rx, rx_gold, rx_texts)
    if spec.startswith("json:"):
        path = spec[len("json:") :]

        def js(text: str) -> str | None:
            try:
                return _canonical_json(json_path_get(_first_json_value(text), path))
            except (LookupError, TypeError, ValueError):
                return None

        def js_gold(gold: str, text: str) -> bool:
            try:
                gold_c = _canonical_json(json.loads(gold))
            except json.JSONDecodeError:
                gold_c = gold.strip()
            got = js(text)
            return got is not None and (got == gold_c or answers_equal(got, gold_c))

        def js_texts(a: str, b: str) -> bool:
            ea, eb = js(a), js(b)
            return ea == eb if ea is not None or eb is not None else a == b

        return Checker("json", js, js_gold, js_texts)
    if spec == "math":
        verifier = _math_verify_equal()
        if verifier is not None:
            mv = verifier

            def mv_texts(a: str, b: str) -> bool:
                return mv(a, b) or answers_equal(_numeric_math_answer(a), _numeric_math_answer(b))

            return Checker("math", _numeric_math_answer, mv, mv_texts)

        def num_gold(gold: str, text: str) -> bool:
            return answers_equal(_numeric_math_answer(gold) or gold, _numeric_math_answer(text))

        def num_texts(a: str, b: str) -> bool:
            return answers_equal(_numeric_math_answer(a), _numeric_math_answer(b))

        return Checker("math", _numeric_math_answer, num_gold, num_texts)
    raise CheckerError(f"unknown checker {spec!r}")


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
    if std is not None and std.ok and r.ok:
        exact = r.text == std.text
        sim = similarity(std.text, r.text)
        div_c = first_divergence(std.text, r.text)
        if std.token_ids is not None and r.token_ids is not None:
            div_t = first_divergence(std.token_ids, r.token_ids)
        if has_checker:
            agrees = checker.equal_texts(std.text, r.text)
        elif cfg.similarity_threshold is not None:
            agrees = sim >= cfg.similarity_threshold
        else:
            agrees = _norm_ws(std.text) == _norm_ws(r.text)
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
    )


def compare(pair: ReplayPair, config: CompareConfig | None = None) -> PairOutcome:
    """Compare every arm of ``pair`` with the standard arm; never raises on bad content.

    Status and reason come from :func:`specwatch.shadow.classify.classify` (the one rule: invalid
    checker → ``excluded/bad_checker``; a 400/422 on the standard or FLy arm → ``excluded``; any
    other
    standard/FLy failure → ``unpaired/<arm>_<class>``, e.g. ``standard_http_5xx``, ``fly_timeout``;
    a
    failed noise arm never changes the status). Math answers are compared without math-verify's
    signal timeout, so call
    from a worker thread when the ``math`` checker is used.
    """
    cfg = config or CompareConfig()
    req = pair.request
    checker_ok = True
    try:
        checker = make_checker(req.checker)
    except CheckerError:
        checker = make_checker(None)
        checker_ok = False
    status, reason = classify(pair.standard, pair.fly, checker_ok=checker_ok)
    gold = req.gold
    has_checker = req.checker is not None and checker_ok
    std_gold = gold if status == "paired" else None
    std_out = _arm_outcome(pair.standard, None, checker, std_gold, cfg, has_checker)
    fly_out = _arm_outcome(pair.fly, pair.standard, checker, std_gold, cfg, has_checker)
    noise_out = (
        _arm_outcome(pair.noise, pair.standard, checker, std_gold, cfg, has_checker)
        if pair.noise is not None
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
    )
