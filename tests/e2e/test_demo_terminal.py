"""``specwatch demo`` in a real tmux pane at 80×24 and 160×45, captured with ``capture-pane``
by ``scripts/capture_demo.py``: every frame fits the pane (``-J`` joins wrapped lines, so a
wrapped line would show as a longer one), frames do not pile up in the scrollback, and the
header, the URLs, the one-line fault command, the target rows and the verdict are on screen."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# scripts/test.sh installs tmux; only a run outside CI without it skips (in CI it must run).
pytestmark = pytest.mark.skipif(
    shutil.which("tmux") is None and not os.environ.get("CI"), reason="needs tmux"
)

FAULT_RE = re.compile(
    r"^curl -X POST 127\.0\.0\.1:\d+/admin/faults -d '\{\"fly_entropy_threshold\":0\.05\}'$",
    re.M,
)
# target, up, α, τ, speculation coverage (or a dash), tokens/s, running/16, waiting
ROW_RE = re.compile(
    r"^(standard|fly) +up +0\.\d{3} +\d\.\d\d +(?:\d\.\d\d|[–-]) +[\d,]+ +\d+/16 +\d+", re.M
)
VERDICT_RE = re.compile(r"^FLy: τ [+-]\d+ %", re.M)


def _frames(tmp_path: Path, size: str, duration: int) -> tuple[int, int, list[tuple[str, int]]]:
    out = tmp_path / size
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "capture_demo.py"), "--size", size,
         "--duration", str(duration), "--out", str(out), "--", "--port", "0"],
        check=True, timeout=duration + 120, cwd=ROOT,
    )  # fmt: skip
    meta = json.loads((out / "frames.json").read_text(encoding="utf-8"))
    frames = [
        ((out / f["file"]).read_text(encoding="utf-8"), int(f["history_size"]))
        for f in meta["frames"]
    ]
    return int(meta["cols"]), int(meta["rows"]), frames


@pytest.mark.slow
@pytest.mark.parametrize(("size", "duration"), [("80x24", 40), ("160x45", 30)])
def test_every_frame_fits_and_shows_the_key_numbers(
    tmp_path: Path, size: str, duration: int
) -> None:
    """Every captured frame: no line wider than the pane, no more lines than it has rows, and a
    scrollback of at most 20 lines (the 2 intro lines and any log line printed above the
    view, such as a scrape warning on a loaded machine; a single frame piled up there would be
    21 or more).
    Once the view is up: title and sidecar URL, the fault command whole on one line, both
    target rows with α, τ, tokens/s and running/16; later the verdict sentence."""
    cols, rows, frames = _frames(tmp_path, size, duration)
    assert len(frames) >= 10
    for text, history in frames:
        lines = text.rstrip("\n").split("\n")
        assert max(len(line) for line in lines) <= cols, text
        assert len(lines) <= rows
        assert history <= 20  # the intro and any warnings; one piled-up frame is 21+ lines
    views = [t for t, _ in frames if "specwatch demo  " in t and ROW_RE.search(t)]
    assert views, "the view never showed both targets"
    for text in views:
        assert re.search(r"^sidecar http://127\.0\.0\.1:\d+  /metrics", text, re.M)
        assert FAULT_RE.search(text)
        assert sorted(m.group(1) for m in ROW_RE.finditer(text)) == ["fly", "standard"]
    assert any(VERDICT_RE.search(t) for t in views)
    wide = cols >= 110
    assert any(("e0=" in t) == wide for t in views)
