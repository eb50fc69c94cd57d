"""Command-line entry point: ``specwatch <command>`` and ``python -m specwatch``.

Each subcommand lives in its own module and exposes ``add_parser(subparsers) -> None`` and
``main(args: argparse.Namespace) -> int``: the sidecar's commands (``run``, ``analyze``,
``power``) and the simulator's and demo's under :mod:`specwatch.cli`, the offline tools'
(doctor, advise, fleet, report, paired-test, bench-result, record, replay) under
:mod:`specwatch.tools`.
A module that is not importable (an optional extra missing) is skipped with a note.

Start-up is kept short: :func:`main` imports only the module of the subcommand on the command
line (its statistics, plotting or simulator stacks load with it, not before); the other
subcommands appear in ``--help`` from :data:`HELP`, without importing their modules. ``--version``
and ``--help`` import no subcommand module at all (``bench/bench_startup.py`` measures it).
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn, Protocol, cast

from specwatch import __version__
from specwatch.core.exits import EXIT_CLOSED_PIPE, EXIT_INTERRUPTED

#: The one table of subcommands, in the order ``--help`` lists them: module under
#: :mod:`specwatch` → (command name, one-line help), exactly as the module's ``add_parser``
#: registers it (a test checks they agree), so ``--help`` lists every command without imports.
HELP: dict[str, tuple[str, str]] = {
    "cli.run": ("run", "scrape vLLM servers and export speculative-decoding health"),
    "cli.analyze": ("analyze", "derive spec-decode health from saved /metrics bodies"),
    "tools.offline.replay": (
        "replay",
        "run every detector over saved /metrics timelines (offline)",
    ),
    "tools.offline.record": ("record", "save running servers' /metrics as timelines for replay"),
    "tools.advise.command": (
        "advise",
        "τ for every smaller K and the token budget per K, from saved /metrics bodies",
    ),
    "cli.simulate": (
        "simulate",
        "run a simulated vLLM server with speculative decoding (standard, FLy or baseline)",
    ),
    "cli.demo": (
        "demo",
        "run a simulated standard + FLy pair with live traffic and the sidecar (no GPU)",
    ),
    "tools.offline.paired_test": (
        "paired-test",
        "exact McNemar + non-inferiority on per-item correctness of two runs",
    ),
    "cli.power": (
        "power",
        "questions needed to detect a net accuracy loss with a paired McNemar test",
    ),
    "tools.report.command": (
        "report",
        "HTML report with plots from the pair ledger (needs the 'report' extra)",
    ),
    "tools.fleet.command": (
        "fleet",
        "fleet-wide paired statistics per model from the sidecars' counters in Prometheus",
    ),
    "tools.doctor.command": ("doctor", "say why a specwatch dashboard would be empty"),
    "tools.offline.bench_result": (
        "bench-result",
        "the minimum spec-decode table from vllm bench serve result files",
    ),
}

#: Subcommand modules, in the order ``--help`` lists them (the keys of :data:`HELP`).
COMMANDS: tuple[str, ...] = tuple(HELP)


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


def _import_command(name: str) -> _CommandModule | None:
    """The module ``specwatch.<name>``; ``None`` when it does not exist (not built yet)."""
    module = f"specwatch.{name}"
    try:
        # ``__import__`` (the import statement's path), not ``importlib.import_module``: only
        # the former is timed by ``-X importtime``, which tests/test_runtime_imports.py reads.
        __import__(module)
        return cast(_CommandModule, sys.modules[module])
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module + ".").startswith(exc.name + "."):
            return None
        raise


def _top_parser() -> tuple[
    argparse.ArgumentParser, argparse._SubParsersAction[argparse.ArgumentParser]
]:
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
    return parser, sub


def build_parser(load: str | None = "*") -> argparse.ArgumentParser:
    """Build the top-level parser.

    ``load``: ``"*"`` (default) imports every subcommand module and registers its full parser;
    a module name from :data:`COMMANDS` imports only that one; ``None`` imports none. A command
    whose module is not imported gets a stub entry (name and help from :data:`HELP`, so
    ``--help`` lists it the same way), which is only valid for listing, never for parsing its
    arguments. Nothing of a command not chosen is imported, not even its package (so
    ``specwatch run`` loads no tool's ``__init__``).
    """
    parser, sub = _top_parser()
    for name in COMMANDS:
        if load == "*" or load == name:
            module = _import_command(name)
            if module is not None:
                module.add_parser(sub)
            continue
        command, help_text = HELP[name]
        sub.add_parser(command, help=help_text)
    return parser


def chosen_command(argv: Sequence[str]) -> str | None:
    """The module name of the subcommand ``argv`` names, or ``None`` (no command, ``--help``,
    ``--version``, an unknown word). The top-level parser has no options taking values, so the
    first argument not starting with ``-`` is the command word."""
    by_command = {command: name for name, (command, _) in HELP.items()}
    for arg in argv:
        if arg == "--":
            return None
        if not arg.startswith("-"):
            return by_command.get(arg)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen subcommand; returns the process exit code.

    Every command ends the same two ways whatever it was doing: Ctrl-C (a
    :class:`KeyboardInterrupt` that reached here: during start-up, in a command that has no
    handler of its own, or raised by a serving command after the orderly stop SIGINT started,
    :meth:`specwatch.core.shutdown.StopSignal.end`) prints ``specwatch COMMAND: interrupted``
    and ends the process at once with :data:`EXIT_INTERRUPTED` (whatever the command had to
    finish is done by then; the interpreter's teardown could take a second, and under
    ``python -m`` CPython turns 130 into death by SIGINT when the interrupt passed through an
    ``exec`` of a string, as dataclasses and namedtuple do while a module imports); a reader
    that closed stdout ends the command silently with :data:`EXIT_CLOSED_PIPE` (stdout is
    pointed at the null device so the interpreter's final flush cannot fail either)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    word = next((a for a in args_list if not a.startswith("-")), None)
    try:
        code = _dispatch(args_list)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's teardown
        return code
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C during teardown
        name = f"specwatch {word}" if word in _COMMAND_WORDS else "specwatch"
        print(f"{name}: interrupted", file=sys.stderr, flush=True)
        from specwatch.core.shutdown import exit_now

        exit_now(EXIT_INTERRUPTED)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_CLOSED_PIPE


_COMMAND_WORDS = frozenset(command for command, _ in HELP.values())


def _dispatch(args_list: list[str]) -> int:
    parser = build_parser(load=chosen_command(args_list))
    word = next((a for a in args_list if not a.startswith("-")), None)
    parser._specwatch_command = word  # type: ignore[attr-defined]  # for error messages
    args = parser.parse_args(args_list)
    handler = getattr(args, "handler", None)
    if handler is None:
        names = ", ".join(command for command, _ in HELP.values())
        print(f"specwatch: a command is needed, one of {names} (specwatch --help)", file=sys.stderr)
        return 2
    return int(handler(args))


if __name__ == "__main__":
    sys.exit(main())
