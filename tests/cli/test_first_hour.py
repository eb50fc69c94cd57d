"""The mistakes and surprises of a new user's first hour, each driven through the CLI as a real
process (pipes) or in a real terminal (a tmux pane): a boolean where a number belongs, an
unwritable demo ledger, recording a server that is down, a string for ``correct``, the demo's
port from the environment, and the first line ``specwatch run`` writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.demo.tmux import HAVE_TMUX, pane
from tests.fakes import REPO, free_port


def _specwatch(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specwatch", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize("command", ["run", "doctor"])
def test_toml_boolean_is_not_one_second(command: str, tmp_path: Path) -> None:
    """``interval_seconds = true`` in a TOML file is a config error naming the field (one line,
    exit 2), not a 1-second scrape interval."""
    config = tmp_path / "specwatch.toml"
    config.write_text("[scrape]\ninterval_seconds = true\n", encoding="utf-8")
    args = ["--config", str(config)]
    if command == "run":
        args += ["--target", "standard=http://127.0.0.1:1", "--port", str(free_port())]
    done = _specwatch(command, *args, timeout=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1
    assert "scrape.interval_seconds: true is a boolean; a number is expected" in done.stderr


def test_demo_unwritable_ledger_is_one_line_and_exit_2() -> None:
    """``demo --ledger`` where no file can be created (under /proc, even for root) stops before
    anything starts: exit 2, one line naming the flag, nothing claims the ledger was kept."""
    ledger = "/proc/specwatch-first-hour-ledger.sqlite"
    done = _specwatch("demo", "--no-ui", "--port", "0", "--duration", "4", "--ledger", ledger)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(f"specwatch demo: --ledger {ledger}: ")
    assert done.stderr.count("\n") == 1
    assert "kept" not in done.stdout


def test_record_of_a_server_that_is_down(tmp_path: Path) -> None:
    """``record`` against a port nobody listens on says so while it records (one line on the
    first failure) and at the end (no body recorded, why), and exits 1, not 0."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    out = tmp_path / "timeline"
    done = _specwatch(
        "record", "--target", f"standard=http://127.0.0.1:{port}", "--out", str(out),
        "--duration", "2",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        f"specwatch record: standard: {url}: connection refused; still trying every 1 s",
        f"specwatch record: standard: no body recorded from {url} (connection refused)",
    ]
    assert "standard 0" in done.stdout
    assert "replay them" not in done.stdout  # nothing to replay
    assert list((out / "standard").iterdir()) == []


@pytest.mark.parametrize("value", ['"yes"', '"no"', '"true"', '"1"', '"correct"'])
def test_paired_test_refuses_a_string_for_correct(value: str, tmp_path: Path) -> None:
    """In JSONL, ``correct`` is true/false or 0/1: the string ``"yes"`` (or any string) on line 2
    is one line naming the file, the line and the value, exit 2."""
    base, cand = tmp_path / "base.jsonl", tmp_path / "cand.jsonl"
    base.write_text('{"id": 1, "correct": true}\n{"id": 2, "correct": false}\n')
    cand.write_text(f'{{"id": 1, "correct": true}}\n{{"id": 2, "correct": {value}}}\n')
    done = _specwatch("paired-test", str(base), str(cand))
    assert done.returncode == 2, done.stdout
    shown = json.loads(value)
    assert done.stderr == (
        f"specwatch paired-test: {cand}:2: 'correct' must be 0/1 or true/false, got {shown!r}\n"
    )


def test_paired_test_csv_words_stay_0_1_true_false(tmp_path: Path) -> None:
    """A CSV cell is text: ``1``/``0``/``true``/``false`` are read, ``yes`` is not."""
    base, cand = tmp_path / "base.csv", tmp_path / "cand.csv"
    base.write_text("id,correct\n1,1\n2,true\n3,0\n")
    cand.write_text("id,correct\n1,TRUE\n2,false\n3,yes\n")
    done = _specwatch("paired-test", str(base), str(cand))
    assert done.returncode == 2
    assert done.stderr == (
        f"specwatch paired-test: {cand}:4: 'correct' must be 0/1 or true/false, got 'yes'\n"
    )


def test_demo_takes_its_port_from_the_environment() -> None:
    """``SPECWATCH_SERVER__PORT`` (what ``run`` reads) sets the demo's sidecar port; a value
    that is not a port is one line and exit 2."""
    port = free_port()
    done = _specwatch(
        "demo", "--no-ui", "--duration", "2", "--no-shadow", "--no-alerts",
        env={"SPECWATCH_SERVER__PORT": str(port)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == f"specwatch demo: sidecar on http://127.0.0.1:{port}"
    bad = _specwatch("demo", "--no-ui", "--duration", "2", env={"SPECWATCH_SERVER__PORT": "abc"})
    assert (bad.returncode, bad.stderr) == (
        2,
        "specwatch demo: SPECWATCH_SERVER__PORT='abc': not a port number (0..65535)\n",
    )


@pytest.mark.skipif(not HAVE_TMUX, reason="tmux is not installed")
def test_run_on_a_terminal_writes_human_lines() -> None:
    """On a terminal (a 200-column tmux pane) ``specwatch run`` writes plain lines, each within
    the pane: one says where it serves and what it scrapes; no JSON object, no configuration
    dump."""
    port = free_port()
    args = ["-m", "specwatch", "run", "--host", "127.0.0.1", "--port", str(port)]
    args += ["--target", "standard=http://127.0.0.1:1"]
    shown = pane(args, 200, 40, ready="scrape failed", timeout_s=60)
    text = "\n".join(shown.lines)
    assert shown.history == 0, text
    assert shown.lines, text
    assert not [ln for ln in shown.lines if ln.lstrip().startswith("{")], text
    assert all(len(ln) <= 200 for ln in shown.lines), text
    serving = [ln for ln in shown.lines if f"serving on http://127.0.0.1:{port}/metrics" in ln]
    assert len(serving) == 1, text
    assert "scraping=standard=http://127.0.0.1:1/metrics" in serving[0]


def test_run_in_a_pipe_writes_json_logs() -> None:
    """With stderr a pipe (a log collector) every line ``specwatch run`` writes is one JSON object,
    one of the first carrying the effective configuration."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "specwatch", "run", "--host", "127.0.0.1", "--port", str(port),
         "--target", "standard=http://127.0.0.1:1", "--log-level", "INFO"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        lines = [proc.stderr.readline() for _ in range(3)]
    finally:
        proc.terminate()
        proc.communicate(timeout=60)
    events = [json.loads(line)["event"] for line in lines]
    assert "effective config" in events
