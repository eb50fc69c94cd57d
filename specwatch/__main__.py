"""Command-line entry point: ``specwatch <command>`` and ``python -m specwatch``.

Each subcommand lives in its own module under :mod:`specwatch.cli` and exposes
``add_parser(subparsers) -> None`` and ``main(args: argparse.Namespace) -> int``.
A module that is not importable (an optional extra missing) is skipped with a note.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Protocol, cast

from specwatch import __version__

#: Subcommand modules, in the order ``--help`` lists them.
COMMANDS: tuple[str, ...] = (
    "run",
    "analyze",
    "replay",
    "simulate",
    "demo",
    "paired_test",
    "power",
    "report",
)


class _CommandModule(Protocol):
    def add_parser(
        self, subparsers: argparse._SubParsersAction[argparse.ArgumentParser]
    ) -> None: ...

    def main(self, args: argparse.Namespace) -> int: ...


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every available subcommand."""
    parser = argparse.ArgumentParser(
        prog="specwatch",
        description=(
            "Watch vLLM speculative decoding: acceptance, budget starvation, paired quality."
        ),
    )
    parser.add_argument("--version", action="version", version=f"specwatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = cast(_CommandModule, importlib.import_module(f"specwatch.cli.{name}"))
        except ModuleNotFoundError as exc:
            if exc.name is not None and exc.name.startswith("specwatch.cli"):
                continue  # subcommand not built yet
            raise
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return 2
    return int(handler(args))


if __name__ == "__main__":
    sys.exit(main())
