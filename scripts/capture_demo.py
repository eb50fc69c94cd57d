"""Run ``specwatch demo`` in a real tmux pane of a given size and capture what a user sees.

Usage: ``python scripts/capture_demo.py --size 80x24 --duration 40 --out DIR [--png FILE]
[--inject SECONDS:ROLE:JSON ...] [-- DEMO FLAGS]``

Starts a private tmux server (its own socket, so no other session is touched), runs the demo in
a detached session of exactly that size, and every ``--every`` seconds until the demo exits
writes ``DIR/frame-NNN.txt`` (``tmux capture-pane -p -J``: wrapped lines joined, so a line
wider than the pane shows that it wrapped) and records the pane's scrollback length
(``#{history_size}``: frames piling up in the scrollback make it grow). ``DIR/frames.json``
lists ``{"file", "history_size"}`` per frame and the pane size. With ``--png`` the last frame
that shows the verdict is rendered to a PNG (matplotlib, monospace; the README screenshot).
``--inject 30:standard:'{"draft_noise_multiplier":3,"draft_noise_engine":1}'`` posts that
fault to the ``standard`` (or ``fly``) simulator's ``/admin/faults`` once the demo has run that
many seconds (the URLs are read from the view). The README image:
``--size 80x24 --duration 100 --inject '30:standard:{"draft_noise_multiplier":3,
"draft_noise_engine":1}' --png docs/img/demo-80x24.png -- --fly-entropy-threshold 0`` (four alerts
firing). Exit 0 when at least one frame was captured; 2 with one line when tmux is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _tmux(sock: str, *args: str) -> str:
    done = subprocess.run(
        ["tmux", "-L", sock, *args], capture_output=True, text=True, check=False, timeout=20
    )
    return done.stdout


_URLS = re.compile(r"standard (http://\S+)  fly (http://\S+)")


def _inject(urls: dict[str, str], role: str, body: str) -> None:
    req = urllib.request.Request(urls[role] + "/admin/faults", data=body.encode(), method="POST")
    with urllib.request.urlopen(req, timeout=5) as r:
        r.read()


def capture(
    size: str,
    duration: float,
    out: Path,
    every: float,
    extra: list[str],
    inject: list[tuple[float, str, str]] | None = None,
) -> list[dict[str, object]]:
    """Run the demo in tmux at ``size`` (``COLSxROWS``) for ``duration`` s; frames into ``out``."""
    cols, rows = (int(x) for x in size.lower().split("x"))
    out.mkdir(parents=True, exist_ok=True)
    sock = f"specwatch-capture-{uuid.uuid4().hex[:8]}"
    cmd = " ".join(
        [
            sys.executable,
            "-m",
            "specwatch",
            "demo",
            "--duration",
            f"{duration:g}",
            *extra,
            "; sleep 3",  # keep the pane (and its last frame) for a final capture
        ]
    )
    env_prefix = f"cd {ROOT} && unset COLUMNS LINES && TERM=xterm-256color "
    _tmux(
        sock,
        "-f",
        "/dev/null",
        "new-session",
        "-d",
        "-s",
        "demo",
        "-x",
        str(cols),
        "-y",
        str(rows),
        env_prefix + cmd,
    )
    _tmux(sock, "set-option", "-t", "demo", "remain-on-exit", "off")
    frames: list[dict[str, object]] = []
    started = time.monotonic()
    deadline = started + duration + 60
    urls: dict[str, str] = {}
    todo = sorted(inject or [])
    try:
        while time.monotonic() < deadline:
            text = _tmux(sock, "capture-pane", "-p", "-J", "-t", "demo")
            m = _URLS.search(text)
            if m is not None and not urls:
                urls = {"standard": m.group(1), "fly": m.group(2)}
            while todo and urls and time.monotonic() - started >= todo[0][0]:
                _, role, body = todo.pop(0)
                _inject(urls, role, body)
            if not text and not _tmux(sock, "list-sessions"):
                break
            hist = _tmux(sock, "display-message", "-p", "-t", "demo", "#{history_size}").strip()
            name = f"frame-{len(frames):03d}.txt"
            (out / name).write_text(text, encoding="utf-8")
            frames.append({"file": name, "history_size": int(hist or 0)})
            time.sleep(every)
    finally:
        _tmux(sock, "kill-server")
    (out / "frames.json").write_text(
        json.dumps({"cols": cols, "rows": rows, "frames": frames}, indent=1), encoding="utf-8"
    )
    return frames


def render_png(text: str, cols: int, rows: int, path: Path) -> None:
    """Draw ``text`` as a ``cols`` × ``rows`` terminal (light on dark, monospace) to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = (text.splitlines() + [""] * rows)[:rows]
    char_w, line_h = 0.6, 1.25  # in font-size units (DejaVu Sans Mono)
    size = 11.0
    fig_w = cols * char_w * size / 72 + 0.4
    fig_h = rows * line_h * size / 72 + 0.4
    fig = plt.figure(figsize=(fig_w, fig_h), dpi=130)
    fig.patch.set_facecolor("#1e1e1e")
    for i, line in enumerate(lines):
        y = 1.0 - (0.2 + (i + 0.8) * line_h * size / 72) / fig_h
        color = "#ffffff" if i == 0 or line.startswith("FLy: ") else "#d4d4d4"
        fig.text(0.2 / fig_w, y, line, family="DejaVu Sans Mono", size=size, color=color)
    fig.savefig(path, facecolor=fig.get_facecolor())
    plt.close(fig)


def pick_frame(texts: list[str]) -> str:
    """The frame for a screenshot: the last one showing the verdict while the demo runs, with
    no log line printed above the view (its first line is the demo's own); else the last."""

    def clean(t: str) -> bool:
        return t.startswith("specwatch demo: sidecar") and "FLy: " in t and "stopped" not in t

    return next((t for t in reversed(texts) if clean(t)), texts[-1])


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, capture, optionally render; see the module docstring."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--size", default="80x24")
    p.add_argument("--duration", type=float, default=40.0)
    p.add_argument("--every", type=float, default=0.7)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--png", type=Path)
    p.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="SECONDS:ROLE:JSON",
        help="post a fault to a simulator that many seconds in",
    )
    p.add_argument("demo_args", nargs="*", help="more flags for specwatch demo (after --)")
    args = p.parse_args(argv)
    if shutil.which("tmux") is None:
        print("capture_demo: tmux is not installed (apt-get install tmux)", file=sys.stderr)
        return 2
    os.environ.pop("TMUX", None)
    inject = [(float(t), role, body) for t, role, body in (i.split(":", 2) for i in args.inject)]
    frames = capture(args.size, args.duration, args.out, args.every, list(args.demo_args), inject)
    if not frames:
        print("capture_demo: no frame captured", file=sys.stderr)
        return 1
    if args.png is not None:
        cols, rows = (int(x) for x in args.size.lower().split("x"))
        texts = [(args.out / str(f["file"])).read_text(encoding="utf-8") for f in frames]
        best = pick_frame(texts)
        render_png(best, cols, rows, args.png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
