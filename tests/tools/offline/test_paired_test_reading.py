"""``paired-test``'s reading of ``{"id", "correct"}`` JSONL files: the one-pass reading of plain
rows gives what :func:`json.loads` of each line gives, and every other file (other shapes, a
repeated id, a bad line) is read line by line with the same results and errors as before."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwatch.tools.offline.paired_test import (
    InputError,
    pair_outcomes,
    pair_sequence,
    read_outcomes,
)

#: Lines in the plain shape (spacing, integer ids, 0/1 and true/false, non-ASCII ids, CRLF).
PLAIN = [
    '{"id": "q1", "correct": true}',
    '{"id":"q2","correct":false}',
    ' { "id" : 7 , "correct" : 1 }\t',
    '{"id": -12, "correct": 0}\r',
    '{"id": "", "correct": 1}',
    '{"id": "naïve ünïcode", "correct": false}',
    '{"id": 0, "correct": true}',
]
#: Valid rows that are not in the plain shape (read by ``json.loads``).
OTHER = [
    '{"correct": true, "id": "k1"}',
    '{"id": "esc\\"aped", "correct": 1}',
    '{"id": 3.5, "correct": true}',
    '{"id": "x", "correct": 1.0, "extra": [1, 2]}',
]


def _reference(lines: list[str]) -> dict[str, bool]:
    """What the reading must give, from ``json.loads`` of each line (independent of the code)."""
    out: dict[str, bool] = {}
    for line in lines:
        rec = json.loads(line)
        out[str(rec["id"])] = rec["correct"] is True or rec["correct"] == 1  # 1.0 too
    return out


@pytest.mark.parametrize(
    "lines", [PLAIN, PLAIN + OTHER, OTHER[:1] + PLAIN, [*PLAIN[:2], "", *PLAIN[2:]]]
)
def test_reading_equals_json_loads_per_line(tmp_path: Path, lines: list[str]) -> None:
    """Plain files (one pass), mixed files and files with a blank line read as ``json.loads`` of
    each line does, in file order."""
    path = tmp_path / "rows.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8", newline="")
    got = read_outcomes(path)
    want = _reference([line for line in lines if line.strip()])
    assert got == want
    assert list(got) == list(want)


def test_repeated_id_names_its_line(tmp_path: Path) -> None:
    """A repeated id in an all-plain file is still the line-numbered error."""
    path = tmp_path / "rows.jsonl"
    path.write_text(
        '{"id": "a", "correct": 1}\n{"id": "b", "correct": 0}\n{"id": "a", "correct": 0}\n'
    )
    with pytest.raises(InputError, match=r"rows.jsonl:3: duplicate id 'a'"):
        read_outcomes(path)


def test_a_broken_line_among_plain_rows_is_named(tmp_path: Path) -> None:
    """A malformed line among plain rows is reported with its line number, as json reports it."""
    path = tmp_path / "rows.jsonl"
    path.write_text('{"id": "a", "correct": 1}\n{"id": "b", "correct": tru}\n')
    with pytest.raises(InputError, match=r"rows.jsonl:2: invalid JSON: Expecting value"):
        read_outcomes(path)


def test_counts_and_sequence_of_a_hand_worked_pairing() -> None:
    """Four pairs, one of each cell: the 2x2 table and the per-pair d = lost - gained in BASE
    order."""
    base = {"a": True, "b": True, "c": False, "d": False}
    cand = {"d": False, "c": True, "b": False, "a": True}
    counts = pair_outcomes(base, cand)
    assert (counts.both_correct, counts.lost, counts.gained, counts.both_wrong) == (1, 1, 1, 1)
    assert pair_sequence(base, cand) == [0, 1, -1, 0]


@pytest.mark.parametrize(
    "text", ["", "a", "a\n", "a\nb", "a\n\nb\n", "a\r\nb", "a\rb", "\n", "x\u2028y", "p\x0cq\n"]
)
def test_line_count_is_splitlines(text: str) -> None:
    """The one-pass reading counts lines as :meth:`str.splitlines` does, whatever the line
    boundaries (only ``\\n`` counted fast, any other boundary by splitting)."""
    from specwatch.tools.offline.paired_test import _line_count

    assert _line_count(text) == len(text.splitlines())
