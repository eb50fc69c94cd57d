"""Flags and parser set-up that more than one subcommand shares (one home for each).

Not a subcommand: :mod:`specwatch.__main__` registers only the modules named in its ``HELP``.
Every helper takes the :class:`argparse.ArgumentParser` (or the subparsers action) to add to
and returns nothing but the new subparser; parsing errors are argparse's (exit 2).
"""

from __future__ import annotations

import argparse
import sys

from specwatch.core.helptext import plain_help


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


def add_output_format(p: argparse.ArgumentParser) -> None:
    """``--format table|json``: what the command prints on stdout (``args.format`` is ``None``
    when not given; :func:`output_format` picks then)."""
    p.add_argument(
        "--format",
        choices=("table", "json"),
        help="table (default on a terminal) or json (default in a pipe or a file)",
    )


def output_format(given: str | None, *, tty: bool | None = None) -> str:
    """``--format`` when given, else ``table`` when stdout is a terminal and ``json`` when it
    is a pipe or a file (``tty``: whether stdout is a terminal; looked up when ``None``)."""
    if given is not None:
        return given
    if tty is None:
        tty = sys.stdout.isatty()
    return "table" if tty else "json"


def add_windows(p: argparse.ArgumentParser) -> None:
    """``--window DURATION``, repeatable (``args.window``: a list of strings, or ``None`` when not
    given, so the settings' default windows 1m 5m 15m apply)."""
    p.add_argument(
        "--window", action="append", metavar="DURATION", help="rolling window; repeat (1m 5m 15m)"
    )
