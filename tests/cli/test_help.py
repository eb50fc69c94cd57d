"""Every subcommand's ``--help`` is plain text that fits an 80-column terminal."""

from __future__ import annotations

import pytest

from specwatch.__main__ import HELP, main
from specwatch.core.helptext import plain_help


@pytest.mark.parametrize("command", ["", *(name for name, _ in HELP.values())])
def test_help_is_plain_and_within_80_columns(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``specwatch [COMMAND] --help`` at COLUMNS=80: exit 0, no line over 80 characters, no
    reStructuredText markup (double backticks, Sphinx roles) left in the text."""
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as done:
        main([command, "--help"] if command else ["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.strip()
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert "``" not in out
    assert ":func:" not in out
    assert ":class:" not in out


def test_plain_help_drops_markup_and_wraps_long_lines_at_their_indent() -> None:
    """Backticks go, a role shows its name (the last part with ``~``), a long indented line
    wraps under its own indentation and short lines stay as they are."""
    text = "``run`` uses :func:`~specwatch.a.b` and :mod:`x.y`\n" + "  " + "word " * 20 + "\nend"
    assert plain_help(text, width=30).splitlines() == [
        "run uses b and x.y",
        "  word word word word word",
        "  word word word word word",
        "  word word word word word",
        "  word word word word word",
        "end",
    ]


def test_plain_help_reflows_a_long_list_item_with_its_continuation_lines() -> None:
    """A long ``* `` item takes its continuation lines (indented under its text) and wraps
    as one, hanging under the text; the next item and a short line stay as they are."""
    text = "* one two three four five six\n  seven eight\n* nine\nshort"
    assert plain_help(text, width=20).splitlines() == [
        "* one two three four",
        "  five six seven",
        "  eight",
        "* nine",
        "short",
    ]


def test_doctor_help_keeps_its_check_list_whole(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``specwatch doctor --help``: each check of the list is one item wrapped under its text
    (no fragment left at the margin), e.g. the targets check on two lines."""
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit):
        main(["doctor", "--help"])
    lines = capsys.readouterr().out.splitlines()
    start = lines.index("* targets: every specwatch target Prometheus knows (job matching")
    assert lines[start + 1] == "  --specwatch-job) is up; none at all is a failure;"
    assert lines[start + 2].startswith("* rules: ")
    items = lines[start : lines.index("", start)]
    assert all(ln.startswith(("* ", "  ")) for ln in items), items
