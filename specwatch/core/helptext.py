"""Help text for the command line: a docstring turned into plain ``--help`` text (no reST
markup, lines within :data:`HELP_WIDTH`). Pure standard library, so the simulator's command
and every other subcommand can use it without loading the CLI's shared flags."""

from __future__ import annotations

import re
import textwrap

#: The widest line a subcommand's ``--help`` description has.
HELP_WIDTH = 79

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def plain_help(text: str, width: int = HELP_WIDTH) -> str:
    """A docstring as plain ``--help`` text: double backticks dropped, Sphinx roles
    (``:func:`~a.b```) shown as their name, and every line longer than ``width`` wrapped at
    its own indentation (short lines and blank lines kept as they are). A long line takes the
    lines that continue its paragraph (same indentation, not blank, not a new ``* ``/``- ``
    item) with it and the paragraph is wrapped as one; a list item's continuation lines are
    those indented under its text, and it wraps hanging there. So a pre-formatted list or
    paragraph is reflowed whole rather than broken into short fragments."""
    text = _ROLE.sub(
        lambda m: m.group(1).rsplit(".", 1)[-1] if "~" in m.group(0) else m.group(1), text
    )
    text = text.replace("``", "")
    lines = text.splitlines()
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if len(line) <= width:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        body = [line.strip()]
        hanging = indent
        item = _ITEM.match(line)
        if item is not None:
            hanging = " " * len(item.group(0))
        while i < len(lines) and _continues(lines[i], hanging):
            body.append(lines[i].strip())
            i += 1
        out += textwrap.wrap(
            " ".join(body),
            width=width,
            initial_indent=indent,
            subsequent_indent=hanging,
            break_on_hyphens=False,
            break_long_words=False,
        )
    return "\n".join(out)


_ITEM = re.compile(r"\s*[*-] ")


def _continues(line: str, hanging: str) -> bool:
    """``line`` continues a paragraph (or list item) whose text starts at ``len(hanging)``:
    indented exactly that far, not blank and not a new item."""
    return (
        line.startswith(hanging)
        and line.strip() != ""
        and not line[len(hanging)].isspace()
        and _ITEM.match(line) is None
    )
