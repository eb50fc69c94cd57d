"""``specwatch paired-test`` on files saved by spreadsheet tools: a UTF-8 byte order mark.

Before: a CSV exported with a BOM (Excel's "CSV UTF-8") was refused with "CSV needs a header with
'id' and 'correct'" (the first header read as ``\\ufeffid``), and a JSONL file with a BOM failed
on its first line.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from specwatch.__main__ import main as cli_main

# 3 items: item 2 lost by the candidate, item 3 gained: b = 1 lost, c = 1 gained.
BASE = {"1": 1, "2": 1, "3": 0}
CAND = {"1": 1, "2": 0, "3": 1}


def _csv(rows: dict[str, int]) -> str:
    return "id,correct\n" + "".join(f"{k},{v}\n" for k, v in rows.items())


def _jsonl(rows: dict[str, int]) -> str:
    return "".join(json.dumps({"id": k, "correct": v}) + "\n" for k, v in rows.items())


def _run(base: Path, cand: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli_main(["paired-test", str(base), str(cand), "--format", "json"])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize(("suffix", "render"), [(".csv", _csv), (".jsonl", _jsonl)])
def test_bom_file_reads_like_the_same_file_without_bom(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    suffix: str,
    render: Callable[[dict[str, int]], str],
) -> None:
    """A file with a UTF-8 byte-order mark gives the same result as the same file without one."""
    plain = tmp_path / f"base{suffix}"
    bom = tmp_path / f"base_bom{suffix}"
    cand = tmp_path / f"cand{suffix}"
    plain.write_text(render(BASE), encoding="utf-8")
    bom.write_text(render(BASE), encoding="utf-8-sig")
    cand.write_text(render(CAND), encoding="utf-8")
    assert bom.read_bytes().startswith(b"\xef\xbb\xbf")
    rc_plain, out_plain, err_plain = _run(plain, cand, capsys)
    rc_bom, out_bom, err_bom = _run(bom, cand, capsys)
    assert (rc_bom, err_bom) == (0, "")
    assert (rc_plain, err_plain) == (0, "")
    assert json.loads(out_bom) == json.loads(out_plain)
    doc = json.loads(out_bom)
    assert (doc["lost"], doc["gained"], doc["n"]) == (1, 1, 3)
