"""Canary JSONL parsing, bad-line accounting and the rate-driven runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwatch.shadow.ingest.canary import (
    BUILTIN_ITEMS,
    CanaryFileError,
    CanaryRunner,
    load_canary,
    parse_lines,
    to_request,
)
from specwatch.shadow.sample import request_hash
from specwatch.shadow.values import ShadowRequest, Source
from tests.fakes import FakeWallClock

GOOD = [
    {"id": "a", "prompt": "2+2=", "gold": "4", "category": "math", "checker": "regex:\\d+"},
    {"id": 7, "messages": [{"role": "user", "content": "hi"}], "gold": 1.5},
]


def test_parse_good_lines() -> None:
    """Good canary lines parse into items with path, category, checker, gold and the served
    model."""
    load = parse_lines((json.dumps(o) for o in GOOD), source="t", model="served")
    a, b = load.items
    assert (a.item_id, a.path, a.category, a.checker, a.gold) == (
        "a",
        "/v1/completions",
        "math",
        "regex:\\d+",
        "4",
    )
    assert a.body == {"prompt": "2+2=", "model": "served", "temperature": 0}
    assert (b.item_id, b.path, b.category, b.checker, b.gold) == (
        "7",
        "/v1/chat/completions",
        "canary",
        "exact",
        "1.5",
    )
    assert load.bad_lines == {}


def test_bad_lines_are_counted_with_file_and_line(caplog: pytest.LogCaptureFixture) -> None:
    """Each kind of bad canary line is skipped, counted by reason and logged with file and line."""
    lines = [
        json.dumps(GOOD[0]),
        "",
        "# a comment",
        "{not json",
        "[1, 2]",
        json.dumps({"prompt": "p", "gold": "g"}),
        json.dumps({"id": "a", "prompt": "p", "gold": "g"}),
        json.dumps({"id": "b", "gold": "g"}),
        json.dumps({"id": "c", "prompt": "p", "messages": [], "gold": "g"}),
        json.dumps({"id": "d", "messages": [{"role": "user"}], "gold": "g"}),
        json.dumps({"id": "e", "prompt": "p", "gold": "g", "checker": "fuzzy"}),
        json.dumps({"id": "f", "prompt": "p"}),
        json.dumps({"id": "g", "prompt": "p", "gold": "x", "max_tokens": 0}),
    ]
    with caplog.at_level("WARNING", logger="specwatch.shadow.ingest.canary"):
        load = parse_lines(lines, source="set.jsonl")
    assert [i.item_id for i in load.items] == ["a"]
    assert load.bad_lines == {
        "invalid_json": 1,
        "not_object": 1,
        "missing_id": 1,
        "duplicate_id": 1,
        "missing_prompt": 2,
        "bad_messages": 1,
        "bad_checker": 1,
        "missing_gold": 1,
        "bad_field": 1,
    }
    assert load.errors[0] == "set.jsonl:4: invalid_json"
    assert load.errors[-1] == "set.jsonl:13: bad_field"
    assert len([r for r in caplog.records if r.message == "canary bad line"]) == 10


def test_load_file_builtin_and_errors(tmp_path: Path) -> None:
    """load_canary adds the built-in set; an unreadable file or one with no usable item raises
    CanaryFileError."""
    f = tmp_path / "set.jsonl"
    f.write_text(json.dumps(GOOD[0]) + "\nbroken\n", encoding="utf-8")
    load = load_canary(str(f), builtin=True)
    assert len(load.items) == len(BUILTIN_ITEMS) + 1
    assert load.bad_lines == {"invalid_json": 1}
    with pytest.raises(CanaryFileError, match="cannot read"):
        load_canary(str(tmp_path / "missing.jsonl"), builtin=False)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("broken\n", encoding="utf-8")
    with pytest.raises(CanaryFileError, match=r"no usable item; first error: .*:1: invalid_json"):
        load_canary(str(bad), builtin=False)


def test_to_request() -> None:
    """to_request turns a canary item into a canary ShadowRequest with its hash, gold and
    checker."""
    item = parse_lines([json.dumps(GOOD[0])], source="t").items[0]
    req = to_request(item, received_at=5.0, salt="s")
    assert req.source is Source.CANARY
    assert req.request_hash == request_hash("/v1/completions", item.body, "s")
    assert (req.item_id, req.gold, req.checker, req.category) == ("a", "4", "regex:\\d+", "math")


async def test_runner_paces_and_loops() -> None:
    """CanaryRunner offers items at its rate, counts offer results and rejects a zero rate."""
    items = parse_lines((json.dumps(o) for o in GOOD), source="t").items
    got: list[ShadowRequest] = []
    sleeps: list[float] = []

    def offer(r: ShadowRequest) -> str:
        got.append(r)
        return "admitted" if len(got) % 2 else "queue_full"

    async def sleep(d: float) -> None:
        sleeps.append(d)

    once = CanaryRunner(
        items, offer, rate_per_second=4.0, wall_clock=FakeWallClock(0.0), sleep=sleep, loop=False
    )
    await once.run()
    assert [r.item_id for r in got] == ["a", "7"]
    assert sleeps == [0.25, 0.25]
    assert once.offered == {"admitted": 1, "queue_full": 1}
    assert once.passes == 1
    with pytest.raises(ValueError, match="rate"):
        CanaryRunner(items, offer, rate_per_second=0.0, wall_clock=FakeWallClock(0.0))
