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
    its own indentation (short lines and blank lines kept as they are)."""
    text = _ROLE.sub(
        lambda m: m.group(1).rsplit(".", 1)[-1] if "~" in m.group(0) else m.group(1), text
    )
    text = text.replace("``", "")
    out: list[str] = []
    for line in text.splitlines():
        if len(line) <= width:
            out.append(line)
            continue
        indent = line[: len(line) - len(line.lstrip())]
        out += textwrap.wrap(
            line.strip(),
            width=width,
            initial_indent=indent,
            subsequent_indent=indent,
            break_on_hyphens=False,
            break_long_words=False,
        )
    return "\n".join(out)
