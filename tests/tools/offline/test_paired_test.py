"""``specwatch paired-test`` and ``specwatch power`` end to end through the CLI dispatcher."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scipy.stats import binomtest

from specwatch.__main__ import main


def _write_jsonl(path: Path, rows: list[tuple[str, int]]) -> Path:
    path.write_text("".join(json.dumps({"id": i, "correct": c}) + "\n" for i, c in rows))
    return path


def _seed_example(tmp_path: Path) -> tuple[Path, Path]:
    # 428 items: 354 both right, 25 lost, 2 gained, 47 both wrong (the seed's synthetic run).
    cells = [(1, 1)] * 354 + [(1, 0)] * 25 + [(0, 1)] * 2 + [(0, 0)] * 47
    base = [(f"q{i}", b) for i, (b, _) in enumerate(cells)]
    cand = [(f"q{i}", c) for i, (_, c) in enumerate(cells)]
    return _write_jsonl(tmp_path / "base.jsonl", base), _write_jsonl(
        tmp_path / "cand.jsonl", list(reversed(cand))
    )


def test_paired_test_seed_example_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """paired-test on the seed example gives the hand-checked counts, exact McNemar p-values and
    CI in JSON."""
    base, cand = _seed_example(tmp_path)
    assert main(["paired-test", str(base), str(cand), "--margin", "0.01", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["n"], out["lost"], out["gained"], out["net"]) == (428, 25, 2, -23)
    assert out["exact_p"] == pytest.approx(5.6e-6, rel=0.01)
    assert out["exact_p"] == pytest.approx(binomtest(2, 27, 0.5).pvalue, rel=1e-9)
    assert out["exact_p_loss"] == pytest.approx(binomtest(25, 27, 0.5, "greater").pvalue)
    assert out["ci"]["lower"] < 23 / 428 < out["ci"]["upper"]
    assert out["ci"]["lower"] > 0.01
    assert out["non_inferiority"]["verdict"] == "not_shown"


def test_paired_test_csv_table_and_non_inferior(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """CSV files in any column order are read; 20 lost / 22 gained is non-inferior at 2 points,
    in JSON and table."""
    # 2,000 items, 20 lost, 22 gained: non-inferior at a 2-point margin.
    cells = [(1, 1)] * 1700 + [(1, 0)] * 20 + [(0, 1)] * 22 + [(0, 0)] * 258
    base = tmp_path / "b.csv"
    cand = tmp_path / "c.csv"
    base.write_text("id,correct\n" + "".join(f"{i},{b}\n" for i, (b, _) in enumerate(cells)))
    cand.write_text(
        "correct,id\n"
        + "".join(f"{'true' if c else 'false'},{i}\n" for i, (_, c) in enumerate(cells))
    )
    assert main(["paired-test", str(base), str(cand), "--margin", "0.02", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["lost"], out["gained"], out["n"]) == (20, 22, 2000)
    assert out["non_inferiority"]["verdict"] == "non_inferior"
    assert main(["paired-test", str(base), str(cand), "--margin", "0.02", "--format", "table"]) == 0
    table = capsys.readouterr().out
    # the verdict first: net gain (22 - 20) / 2000 = 0.1 points, in points like everywhere
    assert table.splitlines()[0].startswith("FLy: net gain 0.1 pts (95 % CI, one-look ")
    assert "of 30 needed; shown within 2 pts over pairs 1-" in table.splitlines()[0]
    assert table.splitlines()[0].endswith("(confidence sequence)")
    assert "fixed-n McNemar p (two-sided)" in table
    assert "non_inferior" in table
    assert "20 / 22 / +2" in table


def test_paired_test_unmatched_ids_are_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ids missing from either file are left out and reported (count and an example on each
    side); the two shared pairs are tested (a both right, b gained). Nothing shared: exit 2."""
    base = _write_jsonl(tmp_path / "b.jsonl", [("a", 1), ("b", 0), ("c", 1)])
    cand = _write_jsonl(tmp_path / "c.jsonl", [("a", 1), ("b", 1), ("d", 1)])
    assert main(["paired-test", str(base), str(cand), "--format", "json"]) == 0
    out, err = capsys.readouterr()
    got = json.loads(out)
    assert (got["n"], got["both_correct"], got["gained"]) == (2, 1, 1)
    assert "left out 1 item only in BASE (e.g. c)" in err
    assert "left out 1 item only in CAND (e.g. d)" in err
    other = _write_jsonl(tmp_path / "o.jsonl", [("x", 1)])
    assert main(["paired-test", str(base), str(other)]) == 2
    assert "no item is in both runs" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"id": 1, "correct": 1}\n{"id": 1, "correct": 0}\n', "duplicate id"),
        ('{"id": 1}\n', "needs 'id' and 'correct'"),
        ('{"id": 1, "correct": 2}\n', "must be 0/1"),
        ("not json\n", "invalid JSON"),
        ("", "no rows"),
    ],
)
def test_paired_test_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    """Each malformed input file exits 2 with its message in one line."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    good = _write_jsonl(tmp_path / "good.jsonl", [("1", 1)])
    assert main(["paired-test", str(bad), str(good)]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    ("net_loss", "discordant", "expected"),
    [("0.02", "0.06", 1175), ("0.01", "0.06", 4708), ("0.02", "0.08", 1568)],
)
def test_power_cli(
    capsys: pytest.CaptureFixture[str], net_loss: str, discordant: str, expected: int
) -> None:
    """`specwatch power` prints the Connor sample size for the given net loss and discordant
    rate."""
    argv = ["power", "--net-loss", net_loss, "--discordant", discordant, "--format", "json"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["questions_needed"] == expected


def test_power_cli_exact(capsys: pytest.CaptureFixture[str]) -> None:
    """2 points at 6 % discordance: Connor's 1,175 pairs give the exact test only 77.6 % power;
    the exact test first reaches 80 % at 1,244 pairs (both checked against scipy.stats in
    tests/shadow/stats/test_exact_power.py)."""
    argv = ["power", "--net-loss", "0.02", "--discordant", "0.06", "--format", "json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["exact_questions_needed"] == 1244
    assert doc["exact_power_at_questions_needed"] == pytest.approx(0.776, abs=5e-4)


def test_power_cli_bad_range(capsys: pytest.CaptureFixture[str]) -> None:
    """A discordant rate below the net loss exits 2 naming the discordant rate."""
    assert main(["power", "--net-loss", "0.1", "--discordant", "0.05"]) == 2
    assert "discordant" in capsys.readouterr().err


def test_quiet_then_loss_file_pages_and_signs_nothing_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """1,500 agreeing pairs, then 3,000 with 90 lost and 45 gained in a seeded order (exact
    McNemar p about 1e-4): the e-value reaches the page's 30 (the old bets peaked at 3.8
    here), the sentence ends "net loss shown" and no "within 1 pt" sign-off stands beside it,
    although the confidence sequence did declare it for the quiet pairs at the start."""
    import numpy as np

    rng = np.random.default_rng(20261206)
    x = np.zeros(3000, dtype=np.int64)
    pos = rng.permutation(3000)[:135]
    x[pos[:90]], x[pos[90:]] = 1, -1
    stream = [0] * 1500 + x.tolist()
    base = [(f"q{i}", 0 if v == -1 else 1) for i, v in enumerate(stream)]
    cand = [(f"q{i}", 0 if v == 1 else 1) for i, v in enumerate(stream)]
    b = _write_jsonl(tmp_path / "base.jsonl", base)
    c = _write_jsonl(tmp_path / "cand.jsonl", cand)
    assert main(["paired-test", str(b), str(c), "--margin", "0.01", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["lost"], out["gained"], out["n"]) == (90, 45, 4500)
    assert out["e_value"] >= 30.0
    assert out["verdict"].endswith("net loss shown (e-value reached the threshold)")
    assert "within" not in out["verdict"]
    assert 1500 < out["first_crossing"]["no_net_loss"] <= 4500
    assert out["first_crossing"]["within_margin"] is not None
    # the page (bound 30 over all pairs) comes no sooner than the crossing of 20, and it is the
    # pair the sidecar's policy (first_pages) names for the same pairs in the same order
    from specwatch.shadow.settings import PairedSettings
    from specwatch.shadow.stats import first_pages

    page = out["first_page"]["SpecQualityDrift{category=_all,hypothesis=no_net_loss}"]
    assert out["first_crossing"]["no_net_loss"] <= page <= 4500
    want = first_pages([("x", v) for v in stream], PairedSettings(margin=0.01))
    assert page == want["SpecQualityDrift{category=_all,hypothesis=no_net_loss}"]
