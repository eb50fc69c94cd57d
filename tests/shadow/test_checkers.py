"""Answer checkers: number normalisation (thousands separators, TeX spacing, currency,
``\\boxed{}``), the lm-evaluation-harness GSM8K presets, and a worked example where a naive
extractor turns a real loss into a fake gain."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

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


# -- independent reference: lm-evaluation-harness itself ----------------------------------------

_LM_EVAL_PROBE = r"""
import json, os, sys
import yaml
import lm_eval
from lm_eval.api.metrics import exact_match_hf_evaluate
from lm_eval.filters.extraction import RegexFilter

task = os.path.join(os.path.dirname(lm_eval.__file__), "tasks", "gsm8k", "gsm8k.yaml")
cfg = yaml.safe_load(open(task))
metric = cfg["metric_list"][0]
items = json.load(sys.stdin)
out = {}
for f in cfg["filter_list"]:
    rx = f["filter"][0]
    filt = RegexFilter(rx["regex_pattern"], rx.get("group_select", 0))
    preds = [r[0] for r in filt.apply([[resp] for _, resp in items], [{} for _ in items])]
    out[f["name"]] = [
        float(exact_match_hf_evaluate(
            [p], [gold], regexes_to_ignore=metric["regexes_to_ignore"],
            ignore_case=metric["ignore_case"], ignore_punctuation=metric["ignore_punctuation"],
        )["exact_match"])
        for p, (gold, _) in zip(preds, items)
    ]
print(json.dumps(out))
"""

# (gold as GSM8K stores it or as a user writes it, a model reply)
GSM8K_CASES = [
    ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "48 + 24 = 72.\n#### 72"),
    ("72", "The answer is 72."),
    ("1234", "so the total is\n#### 1,234."),
    ("1234", "I get $1,234 in the end"),
    ("18", "She earns $18."),
    ("-5", "The change is -5 degrees, so #### -5"),
    ("9500", "#### 9{,}500"),
    ("3", "first 3 then #### 4 and #### 3"),
    ("0.5", "half: 0.5"),
    ("12", "no number here"),
    ("100", "It costs \\$100 per unit, 7 units"),
]


def _lm_eval_python() -> Path | None:
    env = os.environ.get("SPECWATCH_TEST_LM_EVAL_PYTHON")
    path = Path(env) if env else Path.home() / ".cache/specwatch/venv-lm-eval/bin/python"
    return path if path.exists() else None


def test_gsm8k_presets_agree_with_lm_eval_itself() -> None:
    """Every case is scored by lm-evaluation-harness (its installed ``gsm8k.yaml`` filters and
    ``exact_match`` settings, run in its own venv) and by the presets: the same 0/1 per case and
    filter. Skipped when no lm-eval venv is available (``SPECWATCH_TEST_LM_EVAL_PYTHON``)."""
    python = _lm_eval_python()
    if python is None:
        if os.environ.get("CI"):  # scripts/test.sh always provides it: in CI a skip is a failure
            pytest.fail("no lm-evaluation-harness venv (set SPECWATCH_TEST_LM_EVAL_PYTHON)")
        pytest.skip("no lm-evaluation-harness venv (set SPECWATCH_TEST_LM_EVAL_PYTHON)")
    done = subprocess.run(
        [str(python), "-c", _LM_EVAL_PROBE],
        input=json.dumps(GSM8K_CASES),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    ref = json.loads(done.stdout)
    for name, spec in (("strict-match", "gsm8k_strict"), ("flexible-extract", "gsm8k_flexible")):
        chk = make_checker(spec)
        ours = [float(chk.equal_to_gold(gold, reply)) for gold, reply in GSM8K_CASES]
        assert ours == ref[name], name
    assert 0.0 < sum(ref["strict-match"]) < len(GSM8K_CASES)  # the cases tell right from wrong


def test_json_checker_on_an_answer_nested_too_deep_finds_no_answer() -> None:
    """A model answer of 100,000 nested brackets (past the JSON parser's recursion limit) has no
    extractable answer for a ``json:`` checker: ``extract`` gives None, it does not equal the
    gold, and two such identical texts compare equal as raw texts. Before: each call raised
    RecursionError out of the pair's scoring."""
    checker = make_checker("json:$.a")
    deep = "answer: " + "[" * 100_000 + "]" * 100_000
    assert checker.extract(deep) is None
    assert checker.equal_to_gold('{"a": 1}', deep) is False
    assert checker.equal_texts(deep, deep) is True
    assert checker.equal_texts(deep, '{"a": 1}') is False
