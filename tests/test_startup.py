"""Start-up of the command line: what ``specwatch`` imports, and a generous time budget.

The one timed test in the suite (asked for explicitly): ``--version`` must stay under 15 times
the bare interpreter's start (``python -c pass``), medians of 5 interleaved runs each, so a
loaded machine slows both alike. Goals in absolute terms are measured by
``bench/bench_startup.py`` (results in ``docs/benchmarks.md``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specwatch import __main__ as entry

PAGE = Path(__file__).resolve().parent / "fixtures/vllm-metrics/real-cpu-draft-model.txt"
HEAVY = ("scipy", "numpy", "matplotlib", "rapidfuzz", "aiohttp")


def _loaded_after(code: str) -> dict[str, list[str]]:
    """Which of HEAVY (and of the subcommand modules: under ``specwatch.cli`` or a tool's
    command) a fresh interpreter has after ``code``."""
    probe = (
        "import sys, json\n"
        + code
        + "\nnames = list(sys.modules)\n"
        + "print(json.dumps({'heavy': sorted(m for m in names if m.split('.')[0] in "
        + repr(HEAVY)
        + "), 'cli': sorted(m for m in names if m.startswith('specwatch.cli.')"
        + " or m.removeprefix('specwatch.') in "
        + repr(tuple(entry.HELP))
        + ")}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    got: dict[str, list[str]] = json.loads(done.stdout.strip().splitlines()[-1])
    return got


def test_import_main_loads_no_heavy_module() -> None:
    """``import specwatch.__main__`` loads none of scipy, numpy, matplotlib, rapidfuzz, aiohttp
    and no subcommand module."""
    got = _loaded_after("import specwatch.__main__")
    assert got == {"heavy": [], "cli": []}


@pytest.mark.parametrize("argv", [["--version"], ["--help"], []])
def test_version_and_help_import_no_subcommand(argv: list[str]) -> None:
    """``--version``, ``--help`` and no command import no subcommand module (nor HEAVY)."""
    code = (
        "import contextlib, io\n"
        "from specwatch.__main__ import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        f"    main({argv!r})\n"
    )
    assert _loaded_after(code) == {"heavy": [], "cli": []}


@pytest.mark.parametrize("command", [command for command, _ in entry.HELP.values()])
def test_subcommand_help_imports_no_server_or_numerics(command: str) -> None:
    """``python -m specwatch <command> --help`` (the module run as ``-m`` runs it) imports none
    of HEAVY, no ``specwatch.server`` module and not pydantic (the settings' defaults a parser
    shows are plain constants): the parser is built before the server,
    statistics and plotting stacks load, which the command's ``main`` imports when it runs."""
    code = (
        "import contextlib, io, runpy\n"
        f"sys.argv = ['specwatch', {command!r}, '--help']\n"
        "with contextlib.redirect_stdout(io.StringIO()) as out, contextlib.suppress(SystemExit):\n"
        "    runpy.run_module('specwatch', run_name='__main__', alter_sys=True)\n"
        f"assert 'usage: specwatch {command}' in out.getvalue(), out.getvalue()\n"
        "extra = sorted(m for m in sys.modules if m.startswith('specwatch.server'))\n"
        "assert not extra, extra\n"
        "assert 'pydantic' not in sys.modules, 'pydantic'\n"
    )
    assert _loaded_after(code)["heavy"] == []


def test_analyze_loads_only_its_module() -> None:
    """``analyze`` on a saved page imports ``specwatch.cli.analyze`` and the shared flag
    helpers (``cli.args``: the one ``--format`` rule, table on a terminal and JSON in a pipe),
    no other subcommand module, and none of HEAVY."""
    code = (
        "import contextlib, io\n"
        "from specwatch.__main__ import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert main(['analyze', {str(PAGE)!r}]) == 0\n"
    )
    assert _loaded_after(code) == {
        "heavy": [],
        "cli": ["specwatch.cli.analyze", "specwatch.cli.args"],
    }


def _subparser_help(parser: argparse.ArgumentParser) -> list[tuple[str, str | None]]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return [(a.dest, a.help) for a in sub._choices_actions]


def test_help_table_matches_modules() -> None:
    """HELP lists each subcommand as its module registers it (name and help, in order), so the
    top-level ``--help`` is the same with every module imported and with none."""
    full = entry.build_parser()
    assert _subparser_help(full) == [entry.HELP[name] for name in entry.COMMANDS]
    assert entry.build_parser(load=None).format_help() == full.format_help()
    assert entry.build_parser(load="cli.analyze").format_help() == full.format_help()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["analyze", "a.txt"], "cli.analyze"),
        (["paired-test", "a", "b"], "tools.offline.paired_test"),
        (["-h"], None),
        (["--version"], None),
        ([], None),
        (["paired_test"], None),
        (["--", "run"], None),
        (["nonsense", "run"], None),
    ],
)
def test_chosen_command(argv: list[str], expected: str | None) -> None:
    """The first word not starting with ``-`` names the command (module name returned)."""
    assert entry.chosen_command(argv) == expected


def test_unknown_command_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown command exits 2 with one line listing every command (nothing is close)."""
    with pytest.raises(SystemExit) as info:
        entry.main(["nonsense"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    names = ", ".join(name for name, _ in entry.HELP.values())
    assert names.startswith(
        "run, analyze, replay, record, advise, simulate, demo, paired-test, power, report"
    )
    assert err.splitlines() == [f"specwatch: unknown command 'nonsense'; one of {names}"]


def _wall(args: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, *args],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=120,
    )
    return time.perf_counter() - start


def test_version_start_budget() -> None:
    """``python -m specwatch --version`` median under 15x ``python -c pass`` median (5 runs each,
    interleaved, after one warm-up run of each). Measured on a loaded 2-core box: about 2-3x."""
    bare: list[float] = []
    version: list[float] = []
    _wall(["-c", "pass"])
    _wall(["-m", "specwatch", "--version"])
    for _ in range(5):
        bare.append(_wall(["-c", "pass"]))
        version.append(_wall(["-m", "specwatch", "--version"]))
    assert statistics.median(version) < 15 * statistics.median(bare)
