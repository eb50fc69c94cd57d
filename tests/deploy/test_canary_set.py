"""The canary set both layouts ship (``deploy/canary/canary.jsonl``): it loads as the sidecar
loads it, its gold answers are right (worked out here from each question's own words, not from
the file), its checker reads the answer a model is asked to write, and it fits a ConfigMap."""

from __future__ import annotations

import re
from collections import Counter

from specwatch.shadow.checkers import make_checker
from specwatch.shadow.ingest.canary import load_canary
from tests.fakes import REPO

CANARY = REPO / "deploy" / "canary" / "canary.jsonl"


def worked_out(prompt: str) -> int:
    """The answer to one shipped question, computed from its text."""
    if m := re.match(r"What is (\d+) \+ (\d+)\?", prompt):
        return int(m[1]) + int(m[2])
    if m := re.match(r"What is (\d+) times (\d+)\?", prompt):
        return int(m[1]) * int(m[2])
    if m := re.match(r"How many letters are in the word '([a-z]+)'\?", prompt):
        return len(m[1])
    if m := re.match(r"How many minutes are in (\d+) hours\?", prompt):
        return 60 * int(m[1])
    if m := re.match(r"How many hours are in (\d+) days\?", prompt):
        return 24 * int(m[1])
    raise AssertionError(f"a question this test cannot answer: {prompt!r}")


def test_shipped_canary_set_loads_and_its_gold_answers_are_right() -> None:
    """240 items in four categories, each gold answer equal to the one worked out from its
    question, the served model name filled in, far below a ConfigMap's 1 MiB."""
    loaded = load_canary(str(CANARY), builtin=False, model="llama-3.1-8b-instruct")
    assert loaded.errors == ()
    items = loaded.items
    assert len(items) == 240
    assert Counter(i.category for i in items) == {
        "arithmetic": 60,
        "multiplication": 60,
        "counting": 60,
        "conversion": 60,
    }
    for item in items:
        assert item.body["model"] == "llama-3.1-8b-instruct"
        assert item.gold == str(worked_out(item.body["prompt"])), item.item_id
    # a ConfigMap holds at most 1 MiB; the set stays far below
    assert CANARY.stat().st_size < 100_000


def test_checker_reads_the_answer_line_a_model_writes() -> None:
    """The shipped checker grades the answer the prompt asks for ("answer: <number>"), the last
    one when a model writes several, and a reply without one as wrong."""
    items = load_canary(str(CANARY), builtin=False).items
    assert {i.checker for i in items} == {"regex:answer:\\s*(\\d+)"}
    checker = make_checker(items[0].checker)
    gold = items[0].gold

    def graded(text: str) -> bool:
        return checker.equal_to_gold(gold, text)

    assert graded(f"Let me think. answer: {gold}")
    assert graded(f"answer: 1\nanswer: {gold}")
    assert not graded(f"answer: {gold}1")
    assert not graded(f"I think it is {gold}")
