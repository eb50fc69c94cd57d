"""How every command ends, driven as a user does: a reader that closes the pipe
(``specwatch analyze ... | head``) ends the command silently, and Ctrl-C (SIGINT to the whole
foreground process group, as the terminal sends it) at a chosen moment prints one line and
exits 130, never a traceback."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fakes import REPO
from tests.tools.offline.test_replay import zero_spec_timeline
from tests.tools.report.test_report import known_rows, write_ledger

PAGE = REPO / "tests" / "fixtures" / "vllm-metrics" / "real-cpu-draft-model.txt"


def _spawn(args: list[str], *, stdout: int, stdin: int | None = None) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "specwatch", *args],
        cwd=REPO,
        stdin=stdin if stdin is not None else subprocess.DEVNULL,
        stdout=stdout,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: killpg is what Ctrl-C does
    )


def _paired_files(tmp_path: Path, n: int = 400) -> tuple[Path, Path]:
    base, cand = tmp_path / "base.jsonl", tmp_path / "cand.jsonl"
    base.write_text("".join(f'{{"id": {i}, "correct": {i % 3 != 0}}}\n'.lower() for i in range(n)))
    cand.write_text("".join(f'{{"id": {i}, "correct": {i % 4 != 0}}}\n'.lower() for i in range(n)))
    return base, cand


def _closed_pipe_commands(tmp_path: Path) -> dict[str, list[str]]:
    base, cand = _paired_files(tmp_path)
    timeline = zero_spec_timeline(tmp_path / "timeline")
    return {
        "paired-test": ["paired-test", str(base), str(cand), "--format", "table"],
        "advise": ["advise", str(PAGE)],
        "replay-json": ["replay", "--target", f"z={timeline}", "--format", "json"],
        "doctor": ["doctor", "--config", str(REPO / "deploy" / "base" / "config.yaml")],
        "analyze": ["analyze", str(PAGE), "--format", "json"],
        "demo": ["demo", "--no-shadow", "--duration", "60", "--port", "0"],
    }


@pytest.mark.parametrize(
    "name", ["paired-test", "advise", "replay-json", "doctor", "analyze", "demo"]
)
def test_closed_pipe_ends_silently(name: str, tmp_path: Path) -> None:
    """stdout is a pipe whose reader is already gone (``| head`` that has read its lines): the
    command writes nothing on stderr (no BrokenPipeError traceback, no "Exception ignored")
    and exits 1, as Python's documentation advises for EPIPE."""
    argv = _closed_pipe_commands(tmp_path)[name]
    read_end, write_end = os.pipe()
    os.close(read_end)  # no reader: the first write that reaches the pipe gets EPIPE
    try:
        proc = _spawn(argv, stdout=write_end)
    finally:
        os.close(write_end)
    _, err = proc.communicate(timeout=120)
    assert err.decode() == ""
    assert proc.returncode == 1


def test_demo_view_into_head_ends_silently_and_cleans_up() -> None:
    """``specwatch demo | head -12``: the reader takes the intro and the first view, then
    closes; the demo stops at once (well before its 60 s), silently, exit 1, with its servers
    and tasks shut down (no "error occurred during closing of asynchronous generator")."""
    proc = _spawn(
        ["demo", "--no-shadow", "--duration", "60", "--port", "0"], stdout=subprocess.PIPE
    )
    assert proc.stdout is not None
    started = time.monotonic()
    lines = [proc.stdout.readline() for _ in range(12)]
    proc.stdout.close()
    _, err = proc.communicate(timeout=50)
    assert lines[0].startswith(b"specwatch demo: sidecar on http://127.0.0.1:")
    assert err.decode() == ""
    assert proc.returncode == 1
    assert time.monotonic() - started < 50


def _interrupt(
    argv: list[str], moment: Callable[[subprocess.Popen[bytes]], None], **spawn: int
) -> tuple[int, str]:
    """Start ``argv``, wait for ``moment(proc)`` to return, SIGINT its process group; (exit
    code, stderr)."""
    proc = _spawn(argv, stdout=spawn.get("stdout", subprocess.DEVNULL), stdin=spawn.get("stdin"))
    try:
        moment(proc)
        assert proc.poll() is None, "the command ended before the chosen moment"
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, err.decode()


def _after(seconds: float) -> Callable[[subprocess.Popen[bytes]], None]:
    return lambda _proc: time.sleep(seconds)


def _until(path_ready: Callable[[], bool]) -> Callable[[subprocess.Popen[bytes]], None]:
    def wait(proc: subprocess.Popen[bytes]) -> None:
        for _ in range(6000):  # at most 60 s
            if path_ready() or proc.poll() is not None:
                return
            time.sleep(0.01)

    return wait


@pytest.mark.parametrize("seconds", [0.15, 0.4])
def test_ctrl_c_while_run_starts(seconds: float, tmp_path: Path) -> None:
    """Ctrl-C in the first second of ``run`` (importing, reading its settings): one line
    ``specwatch run: interrupted`` and exit 130."""
    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)  # nobody writes it: run waits in reading its config until the signal
    rc, err = _interrupt(["run", "--config", str(fifo)], _after(seconds))
    assert (rc, err) == (130, "specwatch run: interrupted\n")


def test_ctrl_c_while_demo_starts() -> None:
    """Ctrl-C in the first half second of ``demo``: one line and exit 130."""
    rc, err = _interrupt(["demo", "--no-ui", "--port", "0"], _after(0.3))
    assert (rc, err) == (130, "specwatch demo: interrupted\n")


def test_ctrl_c_while_paired_test_reads(tmp_path: Path) -> None:
    """Ctrl-C while ``paired-test`` waits for its input (a named pipe nobody writes yet):
    one line and exit 130."""
    base, _ = _paired_files(tmp_path)
    fifo = tmp_path / "candidate-fifo.jsonl"
    os.mkfifo(fifo)
    rc, err = _interrupt(["paired-test", str(base), str(fifo)], _after(0.6))
    assert (rc, err) == (130, "specwatch paired-test: interrupted\n")


def test_ctrl_c_while_report_draws(tmp_path: Path) -> None:
    """Ctrl-C once ``report`` has drawn its first figure (more are still to come): one line and
    exit 130."""
    pytest.importorskip("matplotlib")
    ledger = tmp_path / "ledger.sqlite"
    asyncio.run(write_ledger(ledger, known_rows()))
    out = tmp_path / "report"
    rc, err = _interrupt(
        ["report", "--ledger", str(ledger), "--out", str(out)],
        _until(lambda: out.is_dir() and any(out.glob("*.png"))),
    )
    assert (rc, err) == (130, "specwatch report: interrupted\n")
