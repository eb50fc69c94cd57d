"""Answer checkers: extract an answer from generated text and decide whether two answers are equal.

Checkers (``ShadowRequest.checker``): ``None``/``exact`` (whitespace-normalised text),
``regex:<pattern>`` (last match; group 1 when the pattern has groups), ``json:<path>``
(``$.a.b[0]`` or ``a.b.0`` into the first JSON value of the text), ``math`` (the last
``\\boxed{}`` with balanced braces, else the last number, after :func:`normalise_numbers`;
math-verify, when the ``math`` extra is installed, reads the same normalised text), and the
lm-evaluation-harness GSM8K presets ``gsm8k_strict`` and ``gsm8k_flexible`` (:data:`GSM8K_STRICT`,
:data:`GSM8K_FLEXIBLE`: the same extraction regexes, match selection and ``exact_match``
normalisation as lm-eval's ``gsm8k`` task, so a score matches the one users get from lm-eval,
including its blind spots: ``#### 9{,}500`` reads as ``9``; use ``math`` for TeX output).
An unknown or invalid spec raises :class:`CheckerError` (the pair is excluded as ``bad_checker``).
Math checking can be slow on adversarial text: call it off the event loop.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

_MATH_MAX_CHARS = 4000


class CheckerError(ValueError):
    """The checker spec is unknown or invalid (the pair is excluded, reason ``bad_checker``)."""


def norm_ws(text: str) -> str:
    """``text`` with every run of whitespace replaced by one space, ends stripped."""
    return " ".join(text.split())


_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?(?:/\d+)?|[-+]?\.\d+")

# TeX and typographic spacing between digit groups: "1\,234", "1\;234", "1~234", "1 234" (thin
# or no-break space) -> "1234"; only when exactly three digits follow (a digit group).
_GROUP_SPACE = re.compile(r"(?<=\d)(?:\\[,;:! ]|~|[\u2009\u202f\u00a0])(?=\d{3}(?!\d))")
# "9{,}500" (TeX's way to stop a comma adding space) -> "9,500"
_TEX_COMMA = re.compile(r"\{,\}")
# "8,000" / "1,234,567" -> digits; "2, 3" and "1,23" are left alone
_THOUSANDS = re.compile(r"(?<![\d,.])\d{1,3}(?:,\d{3})+(?![\d]|,\d)")
_CURRENCY = re.compile(r"\\\$|[$€£¥]|\\(?:euro|pounds?|yen)\b\s*")
_FRAC = re.compile(r"\\[dt]?frac\{\s*(-?\d+)\s*\}\{\s*(-?\d+)\s*\}")
_TEXT_WRAP = re.compile(r"\\(?:text|mathrm|textbf|mathbf)\{([^{}]*)\}")


def normalise_numbers(text: str) -> str:
    """``text`` with numbers written the way a grader reads them (pure).

    ``9{,}500`` → ``9500``, ``8,000`` → ``8000``, ``1\\,234`` / ``1~234`` / thin-space groups →
    ``1234``, currency signs (``$``, ``\\$``, ``€``, ``£``, ``¥``) dropped, ``\\frac{3}{4}`` →
    ``3/4``, ``\\text{...}`` unwrapped, the minus sign U+2212 → ``-``. A comma that is not a
    thousands separator (``2, 3``; ``1,23``) is kept.
    """
    t = text.replace("\u2212", "-")
    t = _TEX_COMMA.sub(",", t)
    t = _GROUP_SPACE.sub("", t)
    t = _THOUSANDS.sub(lambda m: m.group(0).replace(",", ""), t)
    t = _CURRENCY.sub("", t)
    t = _TEXT_WRAP.sub(lambda m: m.group(1), t)
    return _FRAC.sub(lambda m: f"{m.group(1)}/{m.group(2)}", t)


def _to_fraction(text: str) -> Fraction | None:
    s = normalise_numbers(text).strip().replace(",", "").rstrip(".").strip()
    try:
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


def answers_equal(a: str | None, b: str | None) -> bool:
    """Answer equality: whitespace-normalised strings, or equal numbers when both parse
    (``1,000`` = ``1000.0`` = ``$1000``; fractions ``3/4`` allowed). ``None`` equals nothing."""
    if a is None or b is None:
        return False
    if norm_ws(a) == norm_ws(b):
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
    """The first JSON value in ``text``; LookupError when there is none, or when a value nests
    too deep for the parser (a model's output can: the parser would raise RecursionError)."""
    stripped = text.strip()
    try:
        return json.loads(stripped)
    except json.JSONDecodeError:
        pass
    except RecursionError:
        raise LookupError("JSON nested too deep") from None
    decoder = json.JSONDecoder()
    for m in re.finditer(r"[\[{]", text):
        try:
            return decoder.raw_decode(text, m.start())[0]
        except json.JSONDecodeError:
            continue
        except RecursionError:
            raise LookupError("JSON nested too deep") from None
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
    """The last ``\\boxed{}`` (balanced braces; its number when it holds one), else the last
    number of ``text``, after :func:`normalise_numbers`."""
    boxed = _last_boxed(text)
    if boxed is not None:
        inner = normalise_numbers(boxed).strip()
        nums = _NUMBER.fullmatch(inner.rstrip("."))
        return nums.group(0) if nums else inner
    found = _NUMBER.findall(normalise_numbers(text[-_MATH_MAX_CHARS:]))
    return found[-1] if found else None


@dataclass(frozen=True, slots=True)
class LmEvalPreset:
    """One lm-evaluation-harness answer filter: ``pattern`` (``regex`` filter), ``select`` (its
    ``group_select``: 0 first match, -1 last; a match with several groups gives its first
    non-empty group) and the ``exact_match`` settings of the ``gsm8k`` task
    (``ignore_case``, ``regexes_to_ignore``), applied to the extracted answer and to the gold
    answer alike (so a gold of ``... #### 72`` or ``72`` both read ``72``)."""

    pattern: str
    select: int
    regexes_to_ignore: tuple[str, ...] = (",", "\\$", "(?s).*#### ", "\\.$")
    ignore_case: bool = True

    def extract(self, text: str) -> str | None:
        """The filtered answer, ``None`` where lm-eval gives its ``[invalid]`` fallback."""
        matches = re.findall(self.pattern, text)
        if not matches:
            return None
        m = matches[self.select]
        if isinstance(m, tuple):
            m = next((g for g in m if g), "")
        return str(m).strip()

    def normalise(self, answer: str) -> str:
        """lm-eval's ``exact_match`` normalisation: ignored regexes removed, case folded,
        ends stripped."""
        for rx in self.regexes_to_ignore:
            answer = re.sub(rx, "", answer)
        return (answer.lower() if self.ignore_case else answer).strip()


#: lm-eval ``gsm8k`` "strict-match": ``#### <number>``, first match.
GSM8K_STRICT = LmEvalPreset(r"#### (\-?[0-9\.\,]+)", 0)
#: lm-eval ``gsm8k`` "flexible-extract": the last number-like run (``$``, ``,`` and ``.`` allowed).
GSM8K_FLEXIBLE = LmEvalPreset(r"(-?[$0-9.,]{2,})|(-?[0-9]+)", -1)
PRESETS: dict[str, LmEvalPreset] = {"gsm8k_strict": GSM8K_STRICT, "gsm8k_flexible": GSM8K_FLEXIBLE}


def _preset_checker(kind: str, preset: LmEvalPreset) -> Checker:
    def gold_eq(gold: str, text: str) -> bool:
        got = preset.extract(text)
        return got is not None and preset.normalise(got) == preset.normalise(gold)

    def texts_eq(a: str, b: str) -> bool:
        ea, eb = preset.extract(a), preset.extract(b)
        if ea is None or eb is None:
            return ea is None and eb is None and norm_ws(a) == norm_ws(b)
        return preset.normalise(ea) == preset.normalise(eb)

    return Checker(kind, preset.extract, gold_eq, texts_eq)


def make_checker(spec: str | None) -> Checker:
    """Parse a checker spec (see module docstring). Raises :class:`CheckerError` if invalid."""
    if spec is None or spec == "exact":

        def exact(text: str) -> str | None:
            return norm_ws(text)

        return Checker(
            "exact",
            exact,
            lambda g, t: norm_ws(g) == norm_ws(t),
            lambda a, b: norm_ws(a) == norm_ws(b),
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
            except (json.JSONDecodeError, RecursionError):
                gold_c = gold.strip()
            got = js(text)
            return got is not None and (got == gold_c or answers_equal(got, gold_c))

        def js_texts(a: str, b: str) -> bool:
            ea, eb = js(a), js(b)
            return ea == eb if ea is not None or eb is not None else a == b

        return Checker("json", js, js_gold, js_texts)
    if spec in PRESETS:
        return _preset_checker(spec, PRESETS[spec])
    if spec == "math":
        verifier = _math_verify_equal()
        if verifier is not None:
            mv = verifier

            def mv_gold(gold: str, text: str) -> bool:
                return mv(normalise_numbers(gold), normalise_numbers(text))

            def mv_texts(a: str, b: str) -> bool:
                return mv(normalise_numbers(a), normalise_numbers(b)) or answers_equal(
                    _numeric_math_answer(a), _numeric_math_answer(b)
                )

            return Checker("math", _numeric_math_answer, mv_gold, mv_texts)

        def num_gold(gold: str, text: str) -> bool:
            return answers_equal(_numeric_math_answer(gold) or gold, _numeric_math_answer(text))

        def num_texts(a: str, b: str) -> bool:
            return answers_equal(_numeric_math_answer(a), _numeric_math_answer(b))

        return Checker("math", _numeric_math_answer, num_gold, num_texts)
    raise CheckerError(f"unknown checker {spec!r}")
