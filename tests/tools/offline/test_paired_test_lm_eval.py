"""``specwatch paired-test`` on lm-evaluation-harness samples files.

The fixture ``tests/fixtures/lm-eval/samples_specwatch_tiny_quiz_*.jsonl`` was written by
lm-eval 0.4.13 itself (``lm_eval --model local-completions --log_samples``) against
``specwatch simulate`` on a 20-question local task with two filters (``strict-match``,
``flexible-extract``); under both, every document scored ``exact_match`` 1.0 except doc 13
(0.0). The real run itself is repeated in ``tests/e2e/real_vllm/test_real_clients.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwatch.__main__ import main

FIXTURE = next(Path(__file__).parents[2].joinpath("fixtures/lm-eval").glob("samples_*.jsonl"))


def _rows() -> list[dict[str, object]]:
    return [json.loads(line) for line in FIXTURE.read_text().splitlines() if line.strip()]


def _write(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["paired-test", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_samples_recognised_by_content_and_joined_on_doc_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CAND = the real file with doc 13 now right and doc 2 now wrong (strict-match only), under
    a name that says nothing: 20 pairs, 18 both right, lost 1 (doc 2), gained 1 (doc 13); exact
    McNemar two-sided p = 1 for 1 vs 1."""
    rows = _rows()
    for r in rows:
        if r["filter"] == "strict-match" and r["doc_id"] == 13:
            r["exact_match"] = 1.0
        if r["filter"] == "strict-match" and r["doc_id"] == 2:
            r["exact_match"] = 0.0
    cand = _write(tmp_path / "fly-run.jsonl", list(reversed(rows)))  # order does not matter
    rc, out, err = _run(
        capsys, str(FIXTURE), str(cand), "--filter", "strict-match", "--format", "json"
    )
    assert rc == 0, err
    got = json.loads(out)
    assert (got["n"], got["both_correct"], got["lost"], got["gained"], got["both_wrong"]) == (
        20, 18, 1, 1, 0,
    )  # fmt: skip
    assert got["exact_p"] == pytest.approx(1.0)
    # under the other filter nothing changed: 19 both right, doc 13 both wrong
    rc, out, _ = _run(
        capsys, str(FIXTURE), str(cand), "--filter", "flexible-extract", "--format", "json"
    )
    assert rc == 0
    got = json.loads(out)
    assert (got["both_correct"], got["lost"], got["gained"], got["both_wrong"]) == (19, 0, 0, 1)


def test_several_filters_need_filter(capsys: pytest.CaptureFixture[str]) -> None:
    """Without --filter, two filters in the file are an error naming both (exit 2)."""
    rc, _, err = _run(capsys, str(FIXTURE), str(FIXTURE))
    assert rc == 2
    assert err.strip().endswith(
        "lm-eval samples with several filters (flexible-extract, strict-match); pick one with "
        "--filter"
    )


def test_unknown_filter_and_metric(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown --filter or --metric names what the file has."""
    rc, _, err = _run(capsys, str(FIXTURE), str(FIXTURE), "--filter", "maj@8")
    assert rc == 2
    assert "no lm-eval samples for filter 'maj@8' (filters: flexible-extract, strict-match)" in err
    rc, _, err = _run(
        capsys, str(FIXTURE), str(FIXTURE), "--filter", "strict-match", "--metric", "acc"
    )
    assert rc == 2
    assert "metric 'acc' not scored (metrics: exact_match)" in err


def test_non_binary_metric_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A score that is not 0/1 (e.g. a BLEU-like 0.5) cannot enter a McNemar table (exit 2)."""
    rows = [r for r in _rows() if r["filter"] == "strict-match"]
    rows[3]["exact_match"] = 0.5
    bad = _write(tmp_path / "bad.jsonl", rows)
    rc, _, err = _run(capsys, str(FIXTURE), str(bad), "--filter", "strict-match")
    assert rc == 2
    assert f"{bad}:4: metric 'exact_match' is 0.5; paired-test needs a 0/1 score per item" in err


def test_filter_flag_on_plain_rows_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--filter on a plain id/correct file is a mistake, not silently ignored."""
    plain = _write(tmp_path / "plain.jsonl", [{"id": "a", "correct": 1}])
    rc, _, err = _run(capsys, str(plain), str(plain), "--filter", "strict-match")
    assert rc == 2
    assert "--filter/--metric apply to lm-eval samples files only" in err
