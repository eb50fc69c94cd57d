"""``specwatch analyze``: offline derivations from saved bodies, JSON shape, bad files."""

from __future__ import annotations

import json
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
        """The table prints one row per key: α 184/1828 = 0.1007 (4 significant digits),
        counts of 1,000 or more with thousands separators; the engine column, which does not
        fit beside the server's in 80 columns, is a block of its own below."""
        rc, out, _ = _run(capsys, NGRAM, "--format", "table")
        assert rc == 0
        rows = [line.split() for line in out.splitlines() if line.startswith("acceptance_rate")]
        assert rows == [["acceptance_rate", "0.1007"], ["acceptance_rate", "0.1007"]]
        assert any(line.split() == ["draft_tokens", "1,828"] for line in out.splitlines())
        assert max(len(line) for line in out.splitlines()) <= 80

    def test_table_columns_align(self, capsys: pytest.CaptureFixture[str]) -> None:
        """In every block, every row, list-valued rows (per-position rates) included, ends
        each cell where the header's column name ends."""
        rc, out, _ = _run(capsys, NGRAM, "--format", "table")
        assert rc == 0
        blocks = out.split("\n\n")
        assert len(blocks) == 2
        for i, block in enumerate(blocks):
            lines = block.splitlines()[1 if i == 0 else 0 :]
            header, rows = lines[0], lines[1:]
            name = "server" if i == 0 else "engine 0"
            assert header.strip() == name
            assert {len(line) for line in rows} == {len(header)}
            assert all(line[-1] != " " for line in rows)

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


def test_format_defaults_to_a_table_on_a_terminal_and_json_in_a_pipe() -> None:
    """No ``--format``: a table on a terminal, JSON in a pipe; a given format always wins."""
    from specwatch.cli.args import output_format

    assert output_format(None, tty=True) == "table"
    assert output_format(None, tty=False) == "json"
    assert output_format("json", tty=True) == "json"
    assert output_format("table", tty=False) == "table"
