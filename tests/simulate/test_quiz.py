"""Quality that can flip: calibrated canaries; standard == baseline; FLy's waivers flip answers."""

from __future__ import annotations

import math
import re

from scipy import stats

from specwatch.simulate.config import Role, SimConfig
from specwatch.simulate.engine_core import Simulation
from specwatch.simulate.quiz import (
    ANSWER_PATTERN,
    builtin_items,
    extract_answer,
    is_correct,
    item_for_prompt,
)

ITEMS = builtin_items()


def _answers(role: Role, prompts: list[str], temperature: float, seeds: list[int],
             **kw: object) -> list[str]:  # fmt: skip
    sim = Simulation(SimConfig(role=role, **kw))  # type: ignore[arg-type]
    reqs = [sim.submit(p, max_tokens=120, temperature=temperature, seed=s)
            for p, s in zip(prompts, seeds, strict=True)]  # fmt: skip
    sim.run_until(math.inf)
    return [r.text for r in reqs]


def test_builtin_items_shape() -> None:
    """The built-in quiz has at least 200 unique items, each with digit gold and the answer regex
    checker."""
    assert len(ITEMS) >= 200
    assert len({i["id"] for i in ITEMS}) == len(ITEMS)
    assert len({i["prompt"] for i in ITEMS}) == len(ITEMS)
    assert {i["category"] for i in ITEMS} == {"arithmetic", "multiplication", "counting",
                                              "conversion"}  # fmt: skip
    for item in ITEMS:
        assert set(item) >= {"id", "prompt", "gold", "category", "checker"}
        assert item["checker"] == "regex:" + ANSWER_PATTERN
        assert item["gold"].isdigit()
    add = next(i for i in ITEMS if i["id"] == "arithmetic-000")
    assert add["prompt"].startswith("What is 11 + 7?")
    assert add["gold"] == "18"
    assert extract_answer(" so the answer: 42 . done") == "42"
    assert extract_answer("no answer here") is None
    assert re.search(ANSWER_PATTERN, "answer: 7") is not None


def test_greedy_standard_and_baseline_answer_alike_and_only_hard_items_fail() -> None:
    """Greedy standard and baseline answer alike, and fail exactly the hard items."""
    prompts = [i["prompt"] for i in ITEMS]
    seeds = list(range(len(ITEMS)))
    base = _answers(Role.BASELINE, prompts, 0.0, seeds)
    std = _answers(Role.STANDARD, prompts, 0.0, seeds)
    assert base == std
    for item, text in zip(ITEMS, std, strict=True):
        hard = item_for_prompt(item["prompt"])
        assert hard is not None
        assert is_correct(text, item["gold"]) is (not hard.hard), item["id"]


def test_fly_waivers_flip_answers_and_a_lower_threshold_flips_more() -> None:
    """FLy waivers flip some answers, more at a lower threshold, only on items with draft
    confusion."""
    prompts = [i["prompt"] for i in ITEMS]
    seeds = list(range(len(ITEMS)))
    std_texts = _answers(Role.STANDARD, prompts, 0.0, seeds)
    fly_texts = _answers(Role.FLY, prompts, 0.0, seeds)
    std = [is_correct(t, i["gold"]) for t, i in zip(std_texts, ITEMS, strict=True)]
    fly = [is_correct(t, i["gold"]) for t, i in zip(fly_texts, ITEMS, strict=True)]
    fly_low = [
        is_correct(t, i["gold"])
        for t, i in zip(_answers(Role.FLY, prompts, 0.0, seeds, fly_entropy_threshold=0.02),
                        ITEMS, strict=True)
    ]  # fmt: skip
    lost = sum(s and not f for s, f in zip(std, fly, strict=True))
    lost_low = sum(s and not f for s, f in zip(std, fly_low, strict=True))
    assert 0 < lost < len(ITEMS) // 5
    assert lost_low > lost
    # flips only happen on items whose draft is pulled to a distractor
    for item, s, f in zip(ITEMS, std, fly_low, strict=True):
        if s != f:
            assert item["draft_confusion"] > 0, item["id"]


def test_per_item_calibration_at_temperature_one() -> None:
    """At temperature 1 an item is answered correctly at its calibrated rate."""
    item = next(i for i in ITEMS if 0.6 < i["p_correct"] < 0.8)
    n = 300
    for role in (Role.BASELINE, Role.STANDARD):
        texts = _answers(role, [item["prompt"]] * n, 1.0, list(range(1000, 1000 + n)))
        k = sum(is_correct(t, item["gold"]) for t in texts)
        assert stats.binomtest(k, n, item["p_correct"]).pvalue > 1e-3, (role, k)


def test_standard_and_baseline_agree_in_distribution_over_the_set() -> None:
    """At temperature 1 standard and baseline score the set's expected total within 4 sd."""
    prompts = [i["prompt"] for i in ITEMS]
    expected = sum(i["p_correct"] for i in ITEMS)
    sd = math.sqrt(sum(i["p_correct"] * (1 - i["p_correct"]) for i in ITEMS))
    for role in (Role.BASELINE, Role.STANDARD):
        texts = _answers(role, prompts, 1.0, list(range(50, 50 + len(ITEMS))))
        k = sum(is_correct(t, i["gold"]) for t, i in zip(texts, ITEMS, strict=True))
        assert abs(k - expected) < 4 * sd, (role, k, expected)
