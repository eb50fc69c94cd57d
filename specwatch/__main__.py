"""Command-line entry point: ``specwatch <command>`` and ``python -m specwatch``.

Each subcommand lives in its own module under :mod:`specwatch.cli` and exposes
``add_parser(subparsers) -> None`` and ``main(args: argparse.Namespace) -> int``.
A module that is not importable (an optional extra missing) is skipped with a note.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import re
import sys
from collections.abc import Sequence
from typing import NoReturn, Protocol, cast

from specwatch import __version__

#: Subcommand modules, in the order ``--help`` lists them.
COMMANDS: tuple[str, ...] = (
    "run",
    "analyze",
    "simulate",
    "demo",
    "paired_test",
    "power",
    "report",
)


class Parser(argparse.ArgumentParser):
    """An :class:`argparse.ArgumentParser` whose errors are one line on stderr and exit 2:
    ``specwatch run: unrecognized argument --targt; did you mean --target?`` (the closest
    option of the command, by :func:`difflib.get_close_matches`), no usage block."""

    def error(self, message: str) -> NoReturn:
        """Print ``<prog>: <message>[; did you mean ...?]`` on stderr and exit 2."""
        command = getattr(self, "_specwatch_command", None)
        prog = f"{self.prog} {command}" if command and " " not in self.prog else self.prog
        if message.startswith("argument COMMAND"):
            prog = self.prog
        self.exit(2, f"{prog}: {_with_suggestion(self, message)}\n")


def _options(parser: argparse.ArgumentParser, command: str | None) -> tuple[list[str], list[str]]:
    """(option strings of ``command``'s parser, or the top parser's; command names)."""
    commands: list[str] = []
    target = parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            commands = list(action.choices)
            if command in action.choices:
                target = action.choices[command]
    opts = [o for a in target._actions for o in a.option_strings if o.startswith("--")]
    return opts, commands


def _with_suggestion(parser: argparse.ArgumentParser, message: str) -> str:
    command = getattr(parser, "_specwatch_command", None)
    opts, commands = _options(parser, command)
    m = re.match(r"unrecognized arguments: (.*)", message)
    if m:
        words = m.group(1).split()
        bad = [w.split("=", 1)[0] for w in words if w.startswith("-")] or words[:1]
        for word in bad:
            near = difflib.get_close_matches(word, opts, n=1, cutoff=0.6)
            if near:
                return f"unrecognized argument {word}; did you mean {near[0]}?"
        return f"unrecognized arguments: {m.group(1)} (see --help)"
    m = re.match(r"argument (COMMAND|command): invalid choice: '([^']*)'", message)
    if m:
        near = difflib.get_close_matches(m.group(2), commands, n=1, cutoff=0.5)
        hint = f"did you mean {near[0]}?" if near else f"one of {', '.join(commands)}"
        return f"unknown command {m.group(2)!r}; {hint}"
    return message


class _CommandModule(Protocol):
    def add_parser(
        self, subparsers: argparse._SubParsersAction[argparse.ArgumentParser]
    ) -> None: ...

    def main(self, args: argparse.Namespace) -> int: ...


def build_parser() -> argparse.ArgumentParser:
    """Build the top-level parser with every available subcommand."""
    parser = Parser(
        prog="specwatch",
        description=(
            "Watch vLLM speculative decoding: acceptance, budget starvation, paired quality."
        ),
    )
    parser.add_argument("--version", action="version", version=f"specwatch {__version__}")
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", metavar="COMMAND"),
    )
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
    words = list(sys.argv[1:] if argv is None else argv)
    command = next((w for w in words if not w.startswith("-")), None)
    parser._specwatch_command = command  # type: ignore[attr-defined]  # for the suggestion
    args = parser.parse_args(words)
    handler = getattr(args, "handler", None)
    if handler is None:
        names = ", ".join(n.replace("_", "-") for n in COMMANDS)
        print(f"specwatch: a command is needed, one of {names} (specwatch --help)", file=sys.stderr)
        return 2
    return int(handler(args))


if __name__ == "__main__":
    sys.exit(main())
