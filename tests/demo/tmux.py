"""Run a command in a private tmux server's pane of a given size and read what it shows.

A test helper: :func:`pane` starts ``tmux -L <unique socket>`` (no other session is touched)
with a detached session of exactly ``cols`` × ``rows``, polls ``capture-pane -p -J`` until
``ready`` is on screen (or ``timeout_s`` passes), and returns the screen's lines and the pane's
scrollback length (``#{history_size}``: lines that scrolled off the top).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
HAVE_TMUX = shutil.which("tmux") is not None


@dataclass(frozen=True, slots=True)
class Pane:
    """What a pane showed: its ``lines`` (trailing spaces cut) and ``history`` (scrolled off)."""

    lines: list[str]
    history: int


def _tmux(sock: str, *args: str) -> str:
    done = subprocess.run(
        ["tmux", "-L", sock, *args], capture_output=True, text=True, check=False, timeout=20
    )
    return done.stdout


def pane(args: list[str], cols: int, rows: int, ready: str, timeout_s: float = 30.0) -> Pane:
    """Run ``python args...`` from the checkout in a ``cols`` × ``rows`` pane; the screen once
    ``ready`` shows (else when ``timeout_s`` passed)."""
    sock = f"specwatch-test-{uuid.uuid4().hex[:8]}"
    cmd = " ".join([sys.executable, *args, "; sleep 30"])
    env = f"cd {ROOT} && unset COLUMNS LINES TMUX && TERM=xterm-256color PYTHONPATH={ROOT} "
    new = ["-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", str(cols), "-y", str(rows)]
    _tmux(sock, *new, env + cmd)
    try:
        deadline = time.monotonic() + timeout_s
        text = ""
        while time.monotonic() < deadline:
            text = _tmux(sock, "capture-pane", "-p", "-J", "-t", "t")
            if ready in text:
                time.sleep(0.5)  # let the frame finish drawing
                text = _tmux(sock, "capture-pane", "-p", "-J", "-t", "t")
                break
            time.sleep(0.5)
        hist = _tmux(sock, "display-message", "-p", "-t", "t", "#{history_size}").strip()
    finally:
        _tmux(sock, "kill-server")
    lines = [line.rstrip() for line in text.splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return Pane(lines=lines, history=int(hist or 0))
