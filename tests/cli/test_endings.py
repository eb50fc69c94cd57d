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
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fakes import REPO, free_port
from tests.fakes.http import canned_json_server, canned_page_server
from tests.sidecar_process import run_config
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
    argv: list[str],
    moment: Callable[[subprocess.Popen[bytes]], None],
    sig: int = signal.SIGINT,
    **spawn: int,
) -> tuple[int, str]:
    """Start ``argv``, wait for ``moment(proc)`` to return, send ``sig`` (SIGINT: Ctrl-C) to
    its process group; (exit code, stderr)."""
    proc = _spawn(argv, stdout=spawn.get("stdout", subprocess.DEVNULL), stdin=spawn.get("stdin"))
    try:
        moment(proc)
        assert proc.poll() is None, "the command ended before the chosen moment"
        os.killpg(proc.pid, sig)
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


# Ctrl-C while a command serves: the same orderly stop as SIGTERM (servers drained and closed,
# summaries printed), then the one line and exit 130 that Ctrl-C gives at any other moment.


def _answers(url: str) -> Callable[[subprocess.Popen[bytes]], None]:
    """Wait (at most 60 s) until ``url`` answers at all (the command is serving)."""

    def ready() -> bool:
        try:
            with urllib.request.urlopen(url, timeout=1):
                return True
        except OSError:  # refused, reset, or an HTTP error status (serving all the same)
            return False

    return _until(ready)


def _first_line(start: bytes) -> Callable[[subprocess.Popen[bytes]], None]:
    """Wait until the command's first stdout line, which must start with ``start``."""

    def wait(proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith(start), line

    return wait


def _ended_by_ctrl_c(err: str, command: str) -> list[str]:
    """The stderr lines, checked: the last is ``specwatch COMMAND: interrupted``, the only such
    line, and no traceback or "Exception ignored" anywhere."""
    lines = err.splitlines()
    assert lines, "nothing on stderr"
    assert lines[-1] == f"specwatch {command}: interrupted", err[-2000:]
    assert err.count("interrupted") == 1, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert "Exception ignored" not in err, err[-2000:]
    return lines


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_while_run_serves(sig: int, tmp_path: Path) -> None:
    """``specwatch run`` scraping a stand-in vLLM page, serving on its port: Ctrl-C drains and
    stops it in order (its ``stopped`` log line) and then ends it with exit 130 and the one
    line last on stderr; SIGTERM, what Kubernetes sends, still ends it with exit 0 and no such
    line."""
    port = free_port()
    with canned_page_server(PAGE.read_bytes()) as vllm:
        cfg = run_config(tmp_path, port, targets=[{"name": "fly", "url": vllm + "/metrics"}])
        rc, err = _interrupt(
            ["run", "--config", str(cfg)], _answers(f"http://127.0.0.1:{port}/healthz"), sig
        )
    assert '"event":"stopped"' in err, err[-2000:]
    if sig == signal.SIGINT:
        assert rc == 130
        _ended_by_ctrl_c(err, "run")
    else:
        assert rc == 0, err[-2000:]
        assert "interrupted" not in err
        assert "Traceback" not in err


def test_ctrl_c_while_demo_serves() -> None:
    """``specwatch demo --no-ui --port 0`` once it printed where its sidecar serves: Ctrl-C
    stops the demo in order (its ``stopped; N requests sent`` summary on stdout) and ends it with
    exit 130 and the one line on stderr."""
    proc = _spawn(["demo", "--no-ui", "--port", "0"], stdout=subprocess.PIPE)
    try:
        _first_line(b"specwatch demo: sidecar on http://127.0.0.1:")(proc)
        time.sleep(1.0)  # load is flowing
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, err.decode()[-2000:]
    assert out.decode().rstrip().splitlines()[-1].startswith("specwatch demo: stopped;")
    _ended_by_ctrl_c(err.decode(), "demo")


def test_ctrl_c_while_simulate_serves() -> None:
    """``specwatch simulate --port 0`` once it printed ``listening on``: Ctrl-C stops the server
    in order and ends it with exit 130 and the one line on stderr."""
    rc, err = _interrupt(
        ["simulate", "--host", "127.0.0.1", "--port", "0"],
        _first_line(b"specwatch simulate: listening on http://127.0.0.1:"),
        stdout=subprocess.PIPE,
    )
    assert rc == 130
    assert _ended_by_ctrl_c(err, "simulate") == ["specwatch simulate: interrupted"]


def test_ctrl_c_while_record_records(tmp_path: Path) -> None:
    """``specwatch record`` (no ``--duration``: Ctrl-C is how it stops) once a body is written:
    it counts the bodies and gives the replay command on stdout as before, then ends with exit
    130 and the one line on stderr."""
    out_dir = tmp_path / "timeline"
    with canned_page_server(PAGE.read_bytes()) as vllm:
        proc = _spawn(
            ["record", "--target", f"std={vllm}", "--out", str(out_dir), "--interval", "0.2"],
            stdout=subprocess.PIPE,
        )
        try:
            _until(lambda: any(out_dir.glob("std/*.prom")))(proc)
            assert proc.poll() is None
            os.killpg(proc.pid, signal.SIGINT)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 130, err.decode()[-2000:]
    assert "specwatch record: bodies written: std " in out.decode()
    assert "replay them: specwatch replay --target std=" in out.decode()
    assert _ended_by_ctrl_c(err.decode(), "record") == ["specwatch record: interrupted"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ctrl_c_while_fleet_listens(sig: int) -> None:
    """``specwatch fleet --listen`` serving its gauges (a stand-in Prometheus with no series):
    Ctrl-C stops the server and ends it with exit 130 and the one line; SIGTERM with exit 0
    and nothing on stderr."""
    empty = b'{"status": "success", "data": {"resultType": "vector", "result": []}}'
    port = free_port()
    with canned_json_server(empty) as prom:
        rc, err = _interrupt(
            ["fleet", "--prometheus-url", prom, "--listen", f"127.0.0.1:{port}"],
            _answers(f"http://127.0.0.1:{port}/healthz"),
            sig,
        )
    if sig == signal.SIGINT:
        assert rc == 130
        _ended_by_ctrl_c(err, "fleet")
    else:
        assert (rc, err) == (0, "")
