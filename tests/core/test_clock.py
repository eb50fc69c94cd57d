"""The two kinds of clock: what the system ones read, that mypy tells them apart, and that no
clock in ``specwatch/`` is left whose kind its name or type does not say."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from specwatch.core.clock import SYSTEM_MONOTONIC, SYSTEM_WALL
from tests.fakes import REPO, FakeClocks, FakeMonotonicClock, FakeWallClock

PKG = REPO / "specwatch"

#: Names a clock parameter or attribute may not have: they do not say which kind it is.
AMBIGUOUS_NAMES = frozenset({"clock", "_clock"})

#: Words that mark a name as holding a time source (for the ``Callable[[], float]`` check).
TIME_WORDS = ("clock", "time", "now", "mono", "wall", "timer")

#: The functions of the ``time`` module that read a clock; only ``core/clock.py`` may hand one
#: around uncalled (as ``SYSTEM_WALL`` / ``SYSTEM_MONOTONIC``).
CLOCK_FUNCTIONS = frozenset({"time", "monotonic", "perf_counter", "time_ns", "monotonic_ns"})


def test_system_clocks_read_time_time_and_time_monotonic() -> None:
    """``SYSTEM_WALL()`` lies between two ``time.time()`` readings taken around it, and
    ``SYSTEM_MONOTONIC()`` between two ``time.monotonic()`` readings; each says its kind."""
    before = time.time()
    wall = SYSTEM_WALL()
    after = time.time()
    assert before <= wall <= after
    before = time.monotonic()
    mono = SYSTEM_MONOTONIC()
    after = time.monotonic()
    assert before <= mono <= after
    assert (SYSTEM_WALL.kind, SYSTEM_MONOTONIC.kind) == ("wall", "monotonic")


def test_fake_clocks_move_by_hand() -> None:
    """The fakes return what the test set; :meth:`FakeClocks.advance` moves both kinds by the
    same amount and assigning ``t`` moves only one."""
    clocks = FakeClocks(wall=1_800_000_000.0, mono=1000.0)
    clocks.advance(2.5)
    assert (clocks.wall(), clocks.mono()) == (1_800_000_002.5, 1002.5)
    clocks.wall.t = 5.0
    assert (clocks.wall(), clocks.mono()) == (5.0, 1002.5)
    assert (FakeWallClock(3.0).kind, FakeMonotonicClock(4.0).kind) == ("wall", "monotonic")


def test_mypy_rejects_a_clock_of_the_other_kind(tmp_path: Path) -> None:
    """Under ``mypy --strict`` a wall clock where a monotonic one is wanted is an error, and so
    is a bare ``time.time`` or lambda where any clock is wanted; each right kind passes."""
    snippet = tmp_path / "swap.py"
    snippet.write_text(
        textwrap.dedent(
            """\
            import time
            from specwatch.core.clock import (
                SYSTEM_MONOTONIC, SYSTEM_WALL, MonotonicClock, WallClock,
            )

            def wants_mono(mono_clock: MonotonicClock) -> float:
                return mono_clock()

            def wants_wall(wall_clock: WallClock) -> float:
                return wall_clock()

            wants_mono(SYSTEM_MONOTONIC)
            wants_wall(SYSTEM_WALL)
            wants_mono(SYSTEM_WALL)  # line 14
            wants_wall(SYSTEM_MONOTONIC)  # line 15
            wants_wall(time.time)  # line 16
            wants_mono(lambda: 0.0)  # line 17
            """
        )
    )
    # in a process of its own: mypy raises the interpreter's recursion limit for good
    env = {**os.environ, "MYPYPATH": str(REPO)}
    args = ["--strict", "--config-file", "", "--cache-dir", str(tmp_path / "cache")]
    done = subprocess.run(
        [sys.executable, "-m", "mypy", *args, "--no-error-summary", str(snippet)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=240,
        check=False,
    )
    assert done.stderr == ""
    errors = [line for line in done.stdout.splitlines() if ": error:" in line]
    assert [int(line.split(":")[1]) for line in errors] == [14, 15, 16, 17], done.stdout
    assert all("[arg-type]" in line for line in errors), done.stdout
    assert done.returncode == 1


def _annotation_is_float_thunk(node: ast.expr | None) -> bool:
    """True for ``Callable[[], float]`` (bare or ``collections.abc.``/``typing.``-qualified)."""
    if not isinstance(node, ast.Subscript):
        return False
    head = node.value
    name = head.attr if isinstance(head, ast.Attribute) else getattr(head, "id", None)
    if name != "Callable" or not isinstance(node.slice, ast.Tuple):
        return False
    args, result = node.slice.elts
    return (
        isinstance(args, ast.List)
        and not args.elts
        and isinstance(result, ast.Name)
        and result.id == "float"
    )


def _clock_problems(rel: str, tree: ast.Module) -> list[str]:
    """Every ambiguous clock in one module of ``specwatch/``, as ``path:line: what``, by line."""
    problems: list[tuple[int, str]] = []
    # a called ``time.time()`` is a reading, not a clock handed around
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}

    def named(name: str, annotation: ast.expr | None, line: int) -> None:
        if name in AMBIGUOUS_NAMES:
            problems.append((line, f"{name!r} does not say wall or monotonic"))
        if _annotation_is_float_thunk(annotation) and any(w in name.lower() for w in TIME_WORDS):
            problems.append((line, f"{name!r} is a bare Callable[[], float]"))

    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                if arg is not None:
                    named(arg.arg, arg.annotation, arg.lineno)
        elif isinstance(node, ast.AnnAssign):
            target = node.target
            if isinstance(target, ast.Name):
                named(target.id, node.annotation, node.lineno)
            elif isinstance(target, ast.Attribute):
                named(target.attr, node.annotation, node.lineno)
        elif isinstance(node, ast.Assign):
            for assigned in node.targets:
                if isinstance(assigned, ast.Attribute):
                    named(assigned.attr, None, node.lineno)
        elif isinstance(node, ast.keyword) and node.arg is not None:
            named(node.arg, None, node.value.lineno)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "time"
            and node.attr in CLOCK_FUNCTIONS
            and id(node) not in called
            and rel != "core/clock.py"
        ):
            problems.append((node.lineno, f"time.{node.attr} (call it, or pass a clock)"))
    return [f"{rel}:{line}: {what}" for line, what in sorted(problems)]


def test_every_clock_in_specwatch_says_its_kind() -> None:
    """No parameter, keyword, attribute or field in ``specwatch/`` is named ``clock`` (or
    ``_clock``) or typed ``Callable[[], float]`` for a time source, and no module but
    ``core/clock.py`` hands ``time.time``/``time.monotonic`` around uncalled: clocks are
    ``wall_clock: WallClock`` or ``mono_clock: MonotonicClock``."""
    problems: list[str] = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG).as_posix()
        problems += _clock_problems(rel, ast.parse(path.read_text(encoding="utf-8")))
    assert problems == []


def test_the_clock_scan_finds_each_kind_of_ambiguity() -> None:
    """The scan reports a ``clock`` parameter, a ``self._clock`` attribute, a ``clock=``
    keyword, a ``Callable[[], float]`` time parameter and an uncalled ``time.monotonic``, and
    passes a called ``time.time()`` and a non-time ``Callable[[], float]``."""
    src = textwrap.dedent(
        """\
        import time
        from collections.abc import Callable

        class A:
            def __init__(self, clock, now_fn: Callable[[], float], size: Callable[[], float]):
                self._clock = clock
                run(clock=time.monotonic)
                stamp = time.time()
        """
    )
    problems = _clock_problems("x.py", ast.parse(src))
    assert problems == [
        "x.py:5: 'clock' does not say wall or monotonic",
        "x.py:5: 'now_fn' is a bare Callable[[], float]",
        "x.py:6: '_clock' does not say wall or monotonic",
        "x.py:7: 'clock' does not say wall or monotonic",
        "x.py:7: time.monotonic (call it, or pass a clock)",
    ]
