"""``specwatch paired-test`` input checks: lm-eval hashes, output directories, unshared items.

Built from the real lm-eval 0.4.13 samples file in ``tests/fixtures/lm-eval`` (20 documents,
filters ``strict-match`` and ``flexible-extract``, every document right except doc 13), edited
by hand the way a mixed-up or tampered run would be.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwatch.__main__ import main

FIXTURE = next(Path(__file__).parents[2].joinpath("fixtures/lm-eval").glob("samples_*.jsonl"))
STAMP = "2026-12-01T14-11-42"


def _rows() -> list[dict[str, object]]:
    return [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["paired-test", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def _tampered(tmp_path: Path) -> Path:
    """CAND with two rows changed: doc 5 was sent another prompt, doc 9 was scored against
    another reference answer (only the hashes changed, as lm-eval would write them)."""
    rows = _rows()
    for r in rows:
        if r["doc_id"] == 5:
            r["prompt_hash"] = "0" * 64
        if r["doc_id"] == 9:
            r["target_hash"] = "f" * 64
    return _write(tmp_path / "cand.jsonl", rows)


def test_two_tampered_rows_are_refused_naming_doc_ids(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two documents whose prompt_hash / target_hash differ between the runs: exit 2, the
    message counts 2 and names doc 5 (prompt_hash) and doc 9, and says how to go on."""
    cand = _tampered(tmp_path)
    rc, out, err = _run(capsys, str(FIXTURE), str(cand), "--filter", "strict-match")
    assert (rc, out) == (2, "")
    assert err.strip() == (
        "specwatch paired-test: 2 documents were not asked the same in both runs (doc_id 5: "
        "prompt_hash differs; doc_ids 5, 9); fix the runs, or pass --exclude-mismatched to "
        "leave them out"
    )


def test_exclude_mismatched_leaves_them_out_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --exclude-mismatched the two documents are left out: 18 pairs, 17 both right,
    doc 13 both wrong; the JSON counts them and stderr says so."""
    cand = _tampered(tmp_path)
    rc, out, err = _run(
        capsys,
        str(FIXTURE),
        str(cand),
        "--filter",
        "strict-match",
        "--exclude-mismatched",
        "--format",
        "json",
    )
    assert rc == 0, err
    got = json.loads(out)
    assert (got["n"], got["both_correct"], got["both_wrong"], got["lost"], got["gained"]) == (
        18, 17, 1, 0, 0,
    )  # fmt: skip
    assert got["excluded"] == {"hash_mismatch": {"count": 2, "ids": ["5", "9"]}}
    assert "left out 2 items with differing prompt_hash/target_hash (e.g. 5, 9)" in err


def test_same_hashes_pass_untouched(capsys: pytest.CaptureFixture[str]) -> None:
    """The file against itself: nothing left out, no ``excluded`` key, nothing on stderr."""
    rc, out, err = _run(
        capsys, str(FIXTURE), str(FIXTURE), "--filter", "strict-match", "--format", "json"
    )
    assert (rc, err) == (0, "")
    got = json.loads(out)
    assert got["n"] == 20
    assert "excluded" not in got


def test_output_directories_are_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--output_path std`` and ``fly`` as lm-eval lays them out (``<dir>/<model>/samples_...``,
    next to a results file): given the directories, the same 20 pairs as given the files."""
    for arm in ("std", "fly"):
        _write(tmp_path / arm / "M" / f"samples_specwatch_tiny_quiz_{STAMP}.jsonl", _rows())
        (tmp_path / arm / "M" / f"results_{STAMP}.json").write_text("{}")
    rc, out, err = _run(
        capsys, str(tmp_path / "std"), str(tmp_path / "fly"), "--filter", "strict-match",
        "--format", "json",
    )  # fmt: skip
    assert rc == 0, err
    got = json.loads(out)
    assert (got["n"], got["both_correct"], got["both_wrong"]) == (20, 19, 1)


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ([], "no lm-eval samples_<task>_<time>.jsonl files"),
        (
            [f"samples_gsm8k_{STAMP}.jsonl", f"samples_arc_easy_{STAMP}.jsonl"],
            "several tasks (arc_easy, gsm8k) in 2 samples files",
        ),
        (
            [f"samples_gsm8k_{STAMP}.jsonl", "samples_gsm8k_2026-12-02T09-00-00.123456.jsonl"],
            "several runs of task gsm8k in 2 samples files",
        ),
    ],
)
def test_directory_without_one_samples_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], names: list[str], message: str
) -> None:
    """A directory with no samples file, or with several tasks or runs, is exit 2 naming what
    it found."""
    run = tmp_path / "run"
    run.mkdir()
    for name in names:
        _write(run / "M" / name, _rows())
    rc, _, err = _run(capsys, str(run), str(FIXTURE), "--filter", "strict-match")
    assert rc == 2
    assert err.startswith(f"specwatch paired-test: {run}: {message}")


def test_unshared_doc_ids_are_reported_not_fatal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CAND lacks docs 3 and 7 and has an extra doc 20: the 18 shared pairs are tested
    (17 both right, doc 13 both wrong); the counts and ids of the others are reported."""
    rows = [r for r in _rows() if r["doc_id"] not in (3, 7)]
    extra = dict(next(r for r in rows if r["filter"] == "strict-match"), doc_id=20)
    cand = _write(tmp_path / "cand.jsonl", [*rows, extra])
    rc, out, err = _run(
        capsys, str(FIXTURE), str(cand), "--filter", "strict-match", "--format", "json"
    )
    assert rc == 0, err
    got = json.loads(out)
    assert (got["n"], got["both_correct"], got["both_wrong"]) == (18, 17, 1)
    assert got["excluded"] == {
        "only_base": {"count": 2, "ids": ["3", "7"]},
        "only_cand": {"count": 1, "ids": ["20"]},
    }
    assert "left out 2 items only in BASE (e.g. 3, 7)" in err
    assert "left out 1 item only in CAND (e.g. 20)" in err
