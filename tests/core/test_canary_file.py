"""The one canary JSONL format (core/canary_file.py): read by shadow ingest, written by the
simulator."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from specwatch.core.canary_file import (
    CanaryLineError,
    parse_line,
    parse_lines,
    write_items,
)
from specwatch.shadow.ingest.canary import load_canary
from specwatch.simulate.quiz import builtin_items, write_canary_jsonl
from tests.fakes import REPO

PKG = REPO / "specwatch"


def test_a_bad_line_names_file_and_line() -> None:
    """A line without ``gold`` fails as ``<file>:<line>: missing_gold``; blank and ``#`` lines are
    skipped (``None``), and a good line becomes a completions request at temperature 0."""
    with pytest.raises(CanaryLineError) as err:
        parse_line('{"id": 1, "prompt": "p"}', source="set.jsonl", line=3)
    assert str(err.value) == "set.jsonl:3: missing_gold"
    assert (err.value.source, err.value.line, err.value.reason) == ("set.jsonl", 3, "missing_gold")
    with pytest.raises(CanaryLineError, match=r"^set\.jsonl:4: invalid_json$"):
        parse_line("{nope", source="set.jsonl", line=4)
    assert parse_line("   ", source="s", line=1) is None
    assert parse_line("# comment", source="s", line=2) is None
    item = parse_line('{"id": 7, "prompt": "2+2=", "gold": 4}', source="s", line=5)
    assert item is not None
    assert (item.item_id, item.path, item.gold, item.category, item.checker) == (
        "7",
        "/v1/completions",
        "4",
        "canary",
        "exact",
    )
    assert item.body == {"prompt": "2+2=", "temperature": 0}


def test_write_then_parse_round_trip(tmp_path: Path) -> None:
    """``write_items`` writes one JSON object per line (``limit`` respected) that ``parse_lines``
    reads back item for item; a duplicate id is reported on its own line number."""
    rows: list[dict[str, Any]] = [
        {"id": "a", "prompt": "x", "gold": "1"},
        {"id": "b", "messages": [{"role": "user", "content": "y"}], "gold": "2"},
        {"id": "a", "prompt": "z", "gold": "3"},
    ]
    path = tmp_path / "set.jsonl"
    assert write_items(path, rows, limit=2) == 2
    assert path.read_text().splitlines() == [json.dumps(rows[0]), json.dumps(rows[1])]
    assert write_items(path, rows) == 3
    seen: list[str] = []
    load = parse_lines(
        path.read_text().splitlines(), source="set.jsonl", on_bad=lambda e: seen.append(str(e))
    )
    assert [i.item_id for i in load.items] == ["a", "b"]
    assert load.items[1].path == "/v1/chat/completions"
    assert load.errors == ("set.jsonl:3: duplicate_id",) == tuple(seen)


def test_the_simulators_quiz_file_is_read_by_the_canary_ingest(tmp_path: Path) -> None:
    """The simulator's 240 known questions, written with ``write_canary_jsonl``, load through the
    shadow canary ingest with no bad line: ids are ``<id>-v0`` (variant 0), gold answers
    unchanged."""
    path = tmp_path / "quiz.jsonl"
    n = write_canary_jsonl(path, variants=1, temperature=0.0)
    expected = builtin_items()
    assert n == len(expected) == 240
    load = load_canary(str(path), builtin=False)
    assert load.errors == ()
    got = {i.item_id: i.gold for i in load.items}
    assert got == {f"{e['id']}-v0": str(e["gold"]) for e in expected}


def test_canary_item_and_parser_are_defined_once() -> None:
    """Only core/canary_file.py defines ``CanaryItem`` and the line parser; the simulator's own
    item type has its own name (``QuizItem``: a known question with calibration, not a request)."""
    defs = [
        str(p.relative_to(PKG))
        for p in sorted(PKG.rglob("*.py"))
        if re.search(r"^(class CanaryItem\b|def parse_item\()", p.read_text(), re.M)
    ]
    assert defs == ["core/canary_file.py"]


def test_every_sampling_field_reaches_the_body(tmp_path: Path) -> None:
    """``seed``, ``ignore_eos``, ``top_p``, ``top_k``, ``stop`` and the chat-only
    ``max_completion_tokens`` are copied into the request body as written; the simulator's
    ``p_correct`` stays out of it."""
    path = tmp_path / "set.jsonl"
    path.write_text(
        json.dumps(
            {
                "id": "q1",
                "prompt": "2+2=",
                "gold": "4",
                "temperature": 0.7,
                "seed": 11,
                "ignore_eos": True,
                "top_p": 0.9,
                "top_k": 20,
                "stop": ["\n"],
                "max_tokens": 8,
                "p_correct": 0.5,
            }
        )
        + "\n"
        + json.dumps(
            {
                "id": "q2",
                "messages": [{"role": "user", "content": "hi"}],
                "gold": "x",
                "max_completion_tokens": 5,
                "min_p": 0.1,
            }
        )
        + "\n"
    )
    load = load_canary(str(path), builtin=False)
    assert load.errors == ()
    assert load.items[0].body == {
        "prompt": "2+2=",
        "seed": 11,
        "ignore_eos": True,
        "top_p": 0.9,
        "top_k": 20,
        "stop": ["\n"],
        "max_tokens": 8,
        "temperature": 0.7,
    }
    assert load.items[1].body == {
        "messages": [{"role": "user", "content": "hi"}],
        "max_completion_tokens": 5,
        "min_p": 0.1,
        "temperature": 0,
    }


def test_an_unknown_key_fails_its_line_naming_file_line_and_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A typo (``temperatur``) is never a greedy item: line 2 fails as ``unknown_key`` with one
    WARNING line naming the file, the line and the key; line 1 loads; a chat-only field on a
    ``prompt`` item is unknown too; a wrongly typed ``seed`` is ``bad_field``."""
    path = tmp_path / "set.jsonl"
    path.write_text(
        '{"id": 1, "prompt": "a", "gold": "1"}\n'
        '{"id": 2, "prompt": "b", "gold": "2", "temperatur": 0.8}\n'
        '{"id": 3, "prompt": "c", "gold": "3", "max_completion_tokens": 4}\n'
        '{"id": 4, "prompt": "d", "gold": "4", "seed": "7"}\n'
    )
    with caplog.at_level("WARNING", logger="specwatch"):
        load = load_canary(str(path), builtin=False)
    assert [i.item_id for i in load.items] == ["1"]
    assert load.errors == (
        f"{path}:2: unknown_key 'temperatur'",
        f"{path}:3: unknown_key 'max_completion_tokens'",
        f"{path}:4: bad_field",
    )
    assert dict(load.bad_lines) == {"unknown_key": 2, "bad_field": 1}
    lines = [r for r in caplog.records if r.getMessage() == "canary bad line"]
    assert len(lines) == 3
    fields = lines[0].__dict__
    found = [v for v in fields.values() if isinstance(v, dict) and v.get("key") == "temperatur"]
    assert found == [{"file": str(path), "line": 2, "reason": "unknown_key", "key": "temperatur"}]


def test_a_line_nested_too_deep_is_an_invalid_json_line(tmp_path: Path) -> None:
    """A line of 100,000 nested brackets is one ``invalid_json`` bad line at its file:line
    (the JSON parser's RecursionError is caught), and the good lines around it still load."""
    good = {"id": "q1", "prompt": "2+2=", "gold": "4"}
    canary = tmp_path / "set.jsonl"
    canary.write_text(
        json.dumps(good) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n", encoding="utf-8"
    )
    load = load_canary(str(canary), builtin=False)
    assert [item.item_id for item in load.items] == ["q1"]
    assert dict(load.bad_lines) == {"invalid_json": 1}
    assert load.errors == (f"{canary}:2: invalid_json",)
