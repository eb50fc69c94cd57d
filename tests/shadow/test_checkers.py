"""Answer checkers: number normalisation (thousands separators, TeX spacing, currency,
``\\boxed{}``), the lm-evaluation-harness GSM8K presets, and a worked example where a naive
extractor turns a real loss into a fake gain."""

from __future__ import annotations

import re

import pytest

import specwatch.shadow.checkers as checkers_mod
from specwatch.shadow.checkers import (
    GSM8K_FLEXIBLE,
    GSM8K_STRICT,
    CheckerError,
    make_checker,
    normalise_numbers,
)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("\\boxed{9{,}500}", "\\boxed{9500}"),
        ("1\\,234 apples", "1234 apples"),
        ("8,000 and 1,234,567.5", "8000 and 1234567.5"),
        ("1~000 or 10\u202f000 or 3\u2009141", "1000 or 10000 or 3141"),
        ("the primes 2, 3, 5 and 1,23", "the primes 2, 3, 5 and 1,23"),
        ("\\$12 or $7 or €3", "12 or 7 or 3"),
        ("x = \\frac{3}{4} \\text{ m}", "x = 3/4  m"),
        ("\u22125 degrees", "-5 degrees"),
        ("a\\,b (TeX space, no digits)", "a\\,b (TeX space, no digits)"),
    ],
)
def test_thousands_separators_and_tex_spacing_are_normalised(text: str, want: str) -> None:
    """Each written form of a number reads as the number a grader means; commas that are not
    thousands separators, and TeX spaces between letters, are left alone."""
    assert normalise_numbers(text) == want


def test_math_answer_boxed_with_balanced_braces() -> None:
    """``\\boxed{}`` with nested braces is read whole, its number normalised."""
    chk = make_checker("math")
    assert chk.extract("so \\boxed{\\$9{,}500} in total") == "9500"
    assert chk.extract("first \\boxed{1} then \\boxed{\\frac{1}{2}}") == "1/2"
    assert chk.extract("We get 1\\,234 apples.") == "1234"


# (gold, standard's reply, FLy's reply), worked by hand:
#   item a: standard right (9 500), FLy wrong (9 000)            -> a real loss
#   item b: both right (1 234 written with a TeX thin space / plain)
#   item c: both right (8,000 with a dollar sign)
ITEMS = [
    ("9500", "The total is \\boxed{9{,}500}.", "The total is \\boxed{9{,}000}."),
    ("1234", "So we get 1\\,234 apples.", "So we get 1234 apples."),
    ("8000", "It costs $8,000.", "It costs \\$8,000."),
]


def _naive(text: str) -> str | None:
    """The extractor this replaces: the last run of digits."""
    found = re.findall(r"-?\d+(?:\.\d+)?", text)
    return found[-1] if found else None


def _lost_gained(grade: object) -> tuple[int, int]:
    lost = gained = 0
    for gold, std, fly in ITEMS:
        s, f = grade(gold, std), grade(gold, fly)  # type: ignore[operator]
        lost += int(s and not f)
        gained += int(f and not s)
    return lost, gained


def test_naive_extractor_hides_a_loss_behind_a_fake_gain() -> None:
    """The naive extractor reads ``9{,}500`` as 500 and ``1\\,234`` as 234: lost 0, gained 1
    (a fake gain). The math checker reads them right: lost 1, gained 0."""
    assert _lost_gained(lambda g, t: _naive(t) == g) == (0, 1)
    chk = make_checker("math")
    assert _lost_gained(chk.equal_to_gold) == (1, 0)


def test_without_math_verify_the_result_is_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """The numeric fallback (no math-verify) gives the same lost 1, gained 0."""
    monkeypatch.setattr(checkers_mod, "_math_verify_equal", lambda: None)
    chk = make_checker("math")
    assert _lost_gained(chk.equal_to_gold) == (1, 0)


def test_with_math_verify_the_sign_does_not_change() -> None:
    """With math-verify installed (the test extra), the same items give lost 1, gained 0."""
    pytest.importorskip("math_verify")
    assert checkers_mod._math_verify_equal() is not None
    assert _lost_gained(make_checker("math").equal_to_gold) == (1, 0)


def test_gsm8k_strict_matches_lm_eval() -> None:
    """lm-eval ``gsm8k`` strict-match: the first ``#### <number>``; commas, ``$``, a trailing
    ``.`` and everything up to ``#### `` in the gold are ignored; no ``####`` → invalid."""
    chk = make_checker("gsm8k_strict")
    assert GSM8K_STRICT.extract("48/2 = 24 in May.\n#### 72") == "72"
    assert chk.equal_to_gold("Natalia sold 48+24 = 72 clips.\n#### 72", "so\n#### 72")
    assert chk.equal_to_gold("1234", "#### 1,234.")
    assert GSM8K_STRICT.extract("The answer is 72.") is None
    assert not chk.equal_to_gold("72", "The answer is 72.")
    assert GSM8K_STRICT.extract("#### 9{,}500") == "9"  # lm-eval's own blind spot, kept
    assert chk.equal_texts("#### 72", "x\n#### 72.")


def test_gsm8k_flexible_matches_lm_eval() -> None:
    """lm-eval ``gsm8k`` flexible-extract: the last match of ``(-?[$0-9.,]{2,})|(-?[0-9]+)``,
    its first non-empty group."""
    chk = make_checker("gsm8k_flexible")
    assert GSM8K_FLEXIBLE.extract("She earns $18.") == "$18."
    assert chk.equal_to_gold("18", "She earns $18.")
    assert GSM8K_FLEXIBLE.extract("so $1,234.50 in all, item 5") == "5"
    assert chk.equal_to_gold("1234", "The total is 1,234")
    assert not chk.equal_to_gold("1234", "The total is 1,235")
    assert GSM8K_FLEXIBLE.extract("no digits") is None


def test_unknown_preset_is_a_checker_error() -> None:
    """A misspelt preset is a bad checker (the pair is excluded as ``bad_checker``)."""
    with pytest.raises(CheckerError):
        make_checker("gsm8k_lenient")
