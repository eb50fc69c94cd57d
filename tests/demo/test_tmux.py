"""The live view in a real terminal: a tmux pane at 80×24, 80×16 and 60×20.

Each test draws the view with the demo's own live display in a tmux pane of that size and
reads the screen back (``capture-pane``): nothing scrolls off the top, no line is wider than
the pane, and the verdict, every firing alert with the label that tells it apart and both
arms' canary scores are on screen; the rest is dropped first.
"""

from __future__ import annotations

import pytest

from tests.demo.tmux import HAVE_TMUX, Pane, pane

pytestmark = pytest.mark.skipif(not HAVE_TMUX, reason="tmux is not installed")

FIXTURE = ["-m", "tests.demo.live_fixture", "30"]


def _show(cols: int, rows: int) -> Pane:
    return pane(FIXTURE, cols, rows, ready="SpecAcceptanceDrop")


def _must_show(p: Pane, cols: int, rows: int) -> str:
    """The checks every size shares; returns the screen as one text."""
    text = "\n".join(p.lines)
    assert p.history == 0, text
    assert len(p.lines) <= rows
    assert max(len(line) for line in p.lines) <= cols
    assert p.lines[0] == "specwatch demo: sidecar on http://127.0.0.1:9477"
    assert p.lines[2] == "specwatch demo  98 s / 100 s  window 1m  Ctrl-C stops"
    assert "FLy: τ +11 %" in text
    assert "e-value 14 of 30 needed" in text.replace("\n", " ")
    assert "canary right: standard 334/376 89 %, fly 268/376 71 %" in p.lines
    assert "alerts: 4 firing" in p.lines
    rows_ = [line.strip() for line in p.lines if line.startswith("  Spec")]
    assert [r.split(" [")[0] for r in rows_] == [
        "SpecQualityDrift",
        "SpecQualityDrift",
        "SpecFlipRateAboveNoise",
        "SpecAcceptanceDrop",
    ]
    assert rows_[0].startswith("SpecQualityDrift [critical] hypothesis=no_net_loss ")
    assert rows_[1].startswith("SpecQualityDrift [critical] hypothesis=non_inferiority ")
    assert rows_[3].startswith("SpecAcceptanceDrop [warning] target=standard engine=1 ")
    return text


def test_80x24_shows_everything_that_matters_and_drops_detail() -> None:
    """80×24 (21 rows under the intro and the cursor): the table, the fault command on one
    line, the pairs line and the pointer to what each figure means stay; the lowest details
    (notes, replay and load) go."""
    p = _show(80, 24)
    text = _must_show(p, 80, 24)
    assert "curl -X POST 127.0.0.1:41232/admin/faults -d '{\"fly_entropy_threshold\":0.05}'" in (
        p.lines
    )
    assert any(line.startswith("standard  up  0.546  3.18  -    1,226") for line in p.lines)
    assert "pairs (since_start) 200, labelled 131: lost 22 gained 7; e-value 14 of 30" in p.lines
    assert "what each figure means: docs/demo.md#reading-the-screen" in p.lines
    assert "shadow ledger:" not in text
    assert "replay:" not in text
    assert "load: sent" not in text


def test_80x16_keeps_alerts_verdict_and_canary_scores() -> None:
    """80×16 (13 rows): the links, the notes and the shadow lines go; the verdict, the four
    alerts and the canary scores stay, with the target table and the fault command."""
    p = _show(80, 16)
    text = _must_show(p, 80, 16)
    assert "sidecar http" not in text
    assert "pairs (since_start)" not in text
    assert "shadow ledger" not in text
    assert any(line.startswith("curl -X POST 127.0.0.1:41232") for line in p.lines)
    assert any(line.startswith("fly       up  0.632") for line in p.lines)


def test_60x20_wraps_the_fault_command_and_keeps_the_labels() -> None:
    """60×20: the verdict wraps at 60 columns, the fault command (77 columns) is two lines
    joined by a shell continuation, and the alerts' distinguishing labels still fit."""
    p = _show(60, 20)
    _must_show(p, 60, 20)
    at = p.lines.index("curl -X POST 127.0.0.1:41232/admin/faults \\")
    assert p.lines[at + 1] == "  -d '{\"fly_entropy_threshold\":0.05}'"
