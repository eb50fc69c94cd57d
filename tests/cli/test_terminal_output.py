"""What a command prints depends on where its stdout goes, the same for every command that
prints data: a table on a terminal (a real one: a tmux pane), JSON in a pipe, and ``--format``
overrides both."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.demo.tmux import HAVE_TMUX, pane
from tests.fakes import REPO
from tests.tools.offline.test_replay import zero_spec_timeline

PAGE = "tests/fixtures/vllm-metrics/real-cpu-draft-model.txt"
BENCH = "tests/fixtures/vllm-bench/serve-random-c2-result.json"
CONFIG = "deploy/base/config.yaml"


def _paired(tmp_path: Path) -> list[str]:
    base, cand = tmp_path / "base.jsonl", tmp_path / "cand.jsonl"
    base.write_text("".join(f'{{"id": {i}, "correct": true}}\n' for i in range(30)))
    cand.write_text(
        "".join(f'{{"id": {i}, "correct": {str(i % 5 > 0).lower()}}}\n' for i in range(30))
    )
    return [str(base), str(cand)]


def _commands(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    """command -> (its arguments, a line start its table has)."""
    timeline = zero_spec_timeline(tmp_path / "timeline")
    return {
        "advise": (["advise", PAGE], "model tiny: drafts 2603, K 4"),
        "analyze": (["analyze", PAGE], "model tiny"),
        "power": (["power", "--net-loss", "0.02", "--discordant", "0.1"], "exact_questions_needed"),
        "bench-result": (["bench-result", BENCH], "concurrency / request rate"),
        "paired-test": (["paired-test", *_paired(tmp_path)], "pairs (n)"),
        "replay": (["replay", "--target", f"z={timeline}"], "no alert fired"),
        "doctor": (["doctor", "--config", CONFIG], "OK    config"),
    }


NAMES = ["advise", "analyze", "power", "bench-result", "paired-test", "replay", "doctor"]


@pytest.mark.skipif(not HAVE_TMUX, reason="tmux is not installed")
@pytest.mark.parametrize("name", NAMES)
def test_table_on_a_terminal(name: str, tmp_path: Path) -> None:
    """On a terminal (a 100x150 tmux pane) the command prints its table: a line starting as the
    table does, no JSON document (no line that is only ``{`` or ``[``)."""
    argv, start = _commands(tmp_path)[name]
    shown = pane(
        ["-m", "specwatch", *argv, "; echo END-OF-OUTPUT"], 100, 150, ready="END-OF-OUTPUT"
    )
    text = "\n".join(shown.lines)
    assert "END-OF-OUTPUT" in text, text
    assert not [ln for ln in shown.lines if ln.strip() in ("{", "[")], text
    assert any(ln.startswith(start) for ln in shown.lines), text


@pytest.mark.parametrize("name", NAMES)
def test_json_in_a_pipe_and_format_overrides(name: str, tmp_path: Path) -> None:
    """In a pipe the same command prints one JSON document; ``--format table`` in a pipe prints
    the table."""
    argv, start = _commands(tmp_path)[name]

    def run(*extra: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "specwatch", *argv, *extra],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        assert done.returncode in (0, 1), done.stderr
        return done.stdout

    json.loads(run())
    table = run("--format", "table")
    assert any(ln.startswith(start) for ln in table.splitlines()), table
