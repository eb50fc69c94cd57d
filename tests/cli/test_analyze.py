"""``specwatch analyze``: offline derivations from saved bodies, JSON shape, bad files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specwatch.__main__ import main as cli_main
from tests.fixture_files import FIXTURES

NGRAM = str(FIXTURES / "vllm-metrics/real-cpu-ngram.txt")


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = cli_main(["analyze", *argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


class TestAnalyze:
    def test_one_body_json(self, capsys: pytest.CaptureFixture[str]) -> None:
        """One body = since server start: α 184/1828, τ 1 + 184/488; no rates without interval."""
        rc, out, _ = _run(capsys, NGRAM)
        assert rc == 0
        doc = json.loads(out)
        assert set(doc) == {"model_name", "server", "engines"}
        s = doc["server"]
        assert s["acceptance_rate"] == pytest.approx(184 / 1828)
        assert s["mean_acceptance_length"] == pytest.approx(1 + 184 / 488)
        assert s["per_position_acceptance_rate"] == pytest.approx(
            [146 / 488, 18 / 488, 12 / 488, 8 / 488]
        )
        assert s["num_requests_running"] == 0
        assert s["kv_cache_usage"] == 0
        assert s["generation_tokens_per_second"] is None
        assert doc["engines"]["0"]["drafts"] == 488

    def test_two_bodies_with_interval(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """Two bodies: the window between them, rates over --interval."""
        text = Path(NGRAM).read_text()
        before = tmp_path / "before.txt"
        before.write_text(
            text.replace("} 488.0", "} 388.0")
            .replace("} 1828.0", "} 1428.0")
            .replace('model_name="tiny"} 184.0', 'model_name="tiny"} 134.0')
        )
        rc, out, _ = _run(capsys, str(before), NGRAM, "--interval", "10")
        assert rc == 0
        s = json.loads(out)["server"]
        assert s["drafts"] == 100
        assert s["acceptance_rate"] == pytest.approx(50 / 400)
        assert s["mean_acceptance_length"] == pytest.approx(1.5)
        assert s["drafts_per_second"] == pytest.approx(10.0)

    def test_several_models(self, capsys: pytest.CaptureFixture[str]) -> None:
        """C11: several models → one entry per model; --model picks one."""
        path = str(FIXTURES / "cases/C11_escaped_labels_valid.prom")
        rc, out, _ = _run(capsys, path)
        assert rc == 0
        models = json.loads(out)["models"]
        assert models["plain-model"]["server"]["acceptance_rate"] == pytest.approx(0.7)
        rc, out, _ = _run(capsys, path, "--model", "plain-model")
        assert json.loads(out)["server"]["acceptance_rate"] == pytest.approx(0.7)

    def test_table(self, capsys: pytest.CaptureFixture[str]) -> None:
        """The table format prints one row per key with server and engine columns."""
        rc, out, _ = _run(capsys, NGRAM, "--format", "table")
        assert rc == 0
        row = next(line for line in out.splitlines() if line.startswith("acceptance_rate"))
        assert row.split()[1:] == ["0.100656", "0.100656"]

    def test_table_columns_align(self, capsys: pytest.CaptureFixture[str]) -> None:
        """Every row, list-valued rows (per-position rates) included, ends each cell where the
        header's column name ends: right edges of the server and engine columns line up."""
        rc, out, _ = _run(capsys, NGRAM, "--format", "table")
        assert rc == 0
        lines = out.splitlines()
        header = lines[1]
        edges = [m.end() for m in re.finditer(r"server|engine 0", header)]
        assert len(edges) == 2
        rows = lines[2:]
        assert len({len(line) for line in [header, *rows]}) == 1
        for line in rows:
            for edge in edges:
                assert line[edge - 1] != " "
                assert edge == len(line) or line[edge : edge + 2] == "  "
        per_pos = next(r for r in rows if r.startswith("per_position_acceptance_rate "))
        expected = "[" + ", ".join(f"{c / 488:.6g}" for c in (146, 18, 12, 8)) + "]"
        assert re.split(r"\s{2,}", per_pos)[1:] == [expected, expected]

    def test_malformed_names_file_and_line(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A malformed body: exit 2, one line with file and line number."""
        path = str(FIXTURES / "cases/C11_escaped_labels_malformed.prom")
        rc, out, err = _run(capsys, path)
        assert rc == 2
        assert out == ""
        assert err.count("\n") == 1
        assert f"{path}:4:" in err

    def test_missing_file(self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        """An unreadable file: exit 2 naming the file."""
        rc, _, err = _run(capsys, str(tmp_path / "nope.txt"))
        assert rc == 2
        assert "nope.txt" in err
        assert err.count("\n") == 1
