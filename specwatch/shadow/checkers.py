"""Answer checkers: extract an answer from generated text and decide whether two answers are equal.

Checkers (``ShadowRequest.checker``): ``None``/``exact`` (whitespace-normalised text),
``regex:<pattern>`` (last match; group 1 when the pattern has groups), ``json:<path>``
(``$.a.b[0]`` or ``a.b.0`` into the first JSON value of the text), ``math`` (math-verify when the
``math`` extra is installed, else exact rational comparison of the last number or ``\\boxed{}``).
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
