"""Flags and parser set-up that more than one subcommand shares (one home for each).

Not a subcommand: :mod:`specwatch.__main__` registers only the modules named in its ``HELP``.
Every helper takes the :class:`argparse.ArgumentParser` (or the subparsers action) to add to
and returns nothing but the new subparser; parsing errors are argparse's (exit 2).
"""

from __future__ import annotations

import argparse
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


def add_described_command(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    *,
    help: str,
    description: str | None,
) -> argparse.ArgumentParser:
    """Register the subcommand ``name`` whose ``--help`` prints ``description`` (usually the
    module docstring) with its line breaks kept; returns its parser."""
    return subparsers.add_parser(
        name,
        help=help,
        description=plain_help(description) if description is not None else None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_prometheus_url(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    """``--prometheus-url URL`` (required unless ``required`` is false): the Prometheus or
    Thanos Querier base URL that the command queries through the HTTP API (``/api/v1/...`` is
    appended)."""
    p.add_argument(
        "--prometheus-url", required=required, help="Prometheus or Thanos Querier base URL"
    )


def add_output_format(p: argparse.ArgumentParser, *, default: str = "table") -> None:
    """``--format table|json``: what the command prints on stdout."""
    p.add_argument("--format", choices=("table", "json"), default=default)


def add_windows(p: argparse.ArgumentParser) -> None:
    """``--window DURATION``, repeatable (``args.window``: a list of strings, or ``None`` when not
    given, so the settings' default windows 1m 5m 15m apply)."""
    p.add_argument(
        "--window", action="append", metavar="DURATION", help="rolling window; repeat (1m 5m 15m)"
    )
