"""``specwatch report`` on a ledger path that is not a ledger: one line naming the file and why."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

import pytest

from specwatch.__main__ import main


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(argv)
    return rc, capsys.readouterr().err


def test_ledger_that_is_a_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--ledger DIR`` exits 2 with one line saying DIR is a directory (not "no such file"),
    and writes no report."""
    ledger_dir = tmp_path / "ledgers"
    ledger_dir.mkdir()
    out = tmp_path / "out"
    rc, err = _run(["report", "--ledger", str(ledger_dir), "--out", str(out)], capsys)
    assert rc == 2
    assert err == f"specwatch report: ledger {ledger_dir}: is a directory, not a ledger file\n"
    assert not out.exists()


def test_pairs_table_of_another_schema(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An SQLite file whose ``pairs`` table lacks the ledger's ``time`` and ``status`` columns
    (someone else's table of pairs) exits 2 with one line naming the file, the missing columns
    and that it is not a specwatch ledger; the file is left unchanged (no columns added)."""
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE pairs (left_id INTEGER, right_id INTEGER, category TEXT)")
    conn.execute("INSERT INTO pairs VALUES (1, 2, 'math')")
    conn.commit()
    conn.close()
    before = other.read_bytes()
    rc, err = _run(["report", "--ledger", str(other), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2
    assert err == (
        f"specwatch report: ledger {other}: its 'pairs' table has no time, status column "
        "(not a specwatch ledger)\n"
    )
    assert other.read_bytes() == before


def test_database_without_pairs_names_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An SQLite file with no ``pairs`` table exits 2 with one line naming the file and saying
    it is not a specwatch ledger."""
    other = tmp_path / "app.sqlite"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE users (id INTEGER)")
    conn.close()
    rc, err = _run(["report", "--ledger", str(other), "--out", str(tmp_path / "o")], capsys)
    assert rc == 2
    assert err == (f"specwatch report: ledger {other}: no 'pairs' table (not a specwatch ledger)\n")


def test_matplotlib_installed_but_broken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """matplotlib present but failing to import (here ``matplotlib.figure`` blocked, as a
    broken install would): the renderer fails to load when the first plot is to be drawn; the
    command exits 2 with the one 'report' extra line, no traceback, nothing written."""
    import asyncio

    from specwatch.shadow.ledger.ledger import Ledger

    ledger = tmp_path / "pairs.db"

    async def write() -> None:
        async with Ledger(ledger) as led:
            await led.write_many(["time", "category", "status"], [(1.0, "math", "paired")])

    asyncio.run(write())
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.delitem(sys.modules, "specwatch.tools.report.render", raising=False)
    out = tmp_path / "out"
    rc, err = _run(["report", "--ledger", str(ledger), "--out", str(out)], capsys)
    assert rc == 2
    assert err.count("\n") == 1
    assert "'report' extra" in err
    assert not out.exists()


def test_matplotlib_loads_only_to_draw(tmp_path: Path) -> None:
    """A small ledger's report (a fresh interpreter) has not imported matplotlib when the
    ledger has been read and the statistics built (the start cost does not include it); the
    plots are drawn and written after."""
    import asyncio
    import subprocess

    from specwatch.shadow.ledger.ledger import Ledger

    ledger = tmp_path / "pairs.db"

    async def write() -> None:
        async with Ledger(ledger) as led:
            await led.write_many(["time", "category", "status"], [(1.0, "math", "paired")])

    asyncio.run(write())
    out = tmp_path / "out"
    code = (
        "import sys\n"
        "import specwatch.tools.report.data as data\n"
        "built = data.build_report\n"
        "def spy(*a, **k):\n"
        "    print('matplotlib at build:', 'matplotlib' in sys.modules)\n"
        "    return built(*a, **k)\n"
        "data.build_report = spy\n"
        "from specwatch.__main__ import main\n"
        f"sys.exit(main(['report', '--ledger', {str(ledger)!r}, '--out', {str(out)!r}]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True
    )
    assert done.stdout.splitlines()[0] == "matplotlib at build: False"
    assert (out / "index.html").is_file()
