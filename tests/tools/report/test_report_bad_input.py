"""``specwatch report`` on an older or altered ledger and on bad ``--metrics-url`` sources: one
line naming what failed (column, URL and limit, file and line), exit 2, and the ledger file
left exactly as it was (the report opens it read-only and never migrates it).
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import sqlite3
from pathlib import Path

import pytest

from specwatch.__main__ import main
from specwatch.shadow.ledger.ledger import Ledger


def _ledger(path: Path) -> Path:
    async def write() -> None:
        async with Ledger(path) as led:
            await led.write_many(["time", "category", "status"], [(1.0, "math", "paired")])

    asyncio.run(write())
    return path


def _columns(path: Path) -> list[str]:
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    try:
        return [str(r[1]) for r in conn.execute("PRAGMA table_info(pairs)")]
    finally:
        conn.close()


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(
    "column", ["fly_correct", "standard_tau", "running_at_replay", "request_hash"]
)
def test_ledger_with_a_dropped_column(
    column: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ledger whose ``pairs`` lost one column (``ALTER TABLE pairs DROP COLUMN``): exit 2, one
    line naming the column (before: "cannot read (ledger is closed)", or with
    ``request_hash`` a report that added the column back); the file's bytes and columns are
    unchanged."""
    path = _ledger(tmp_path / "pairs.db")
    conn = sqlite3.connect(path)
    conn.execute(f"ALTER TABLE pairs DROP COLUMN {column}")
    conn.commit()
    conn.close()
    before, columns = _digest(path), _columns(path)
    rc = main(["report", "--ledger", str(path), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1, err
    assert err.startswith(f"specwatch report: ledger {path}: its 'pairs' table has no {column} ")
    assert (_digest(path), _columns(path)) == (before, columns)
    assert not (tmp_path / "out").exists()


def test_report_leaves_the_ledger_file_unchanged(tmp_path: Path) -> None:
    """A report of a whole ledger writes its HTML and leaves the ledger's bytes as they were."""
    path = _ledger(tmp_path / "pairs.db")
    before = _digest(path)
    assert main(["report", "--ledger", str(path), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "index.html").is_file()
    assert _digest(path) == before


def test_metrics_url_that_times_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--metrics-url`` on a server that accepts and never answers: one line naming the URL
    and the limit (before: "TimeoutError: " and nothing after)."""
    import specwatch.tools.report.command as report_cli

    monkeypatch.setattr(report_cli, "METRICS_TIMEOUT_SECONDS", 0.5)
    path = _ledger(tmp_path / "pairs.db")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/metrics"
        argv = ["report", "--ledger", str(path), "--out", str(tmp_path / "o")]
        rc = main([*argv, "--metrics-url", url])
    err = capsys.readouterr().err
    assert rc == 2
    assert err == f"specwatch report: {url}: no answer within 0.5 s\n"


def test_metrics_file_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A saved ``/metrics`` file with a byte that is not UTF-8 on its second line: one line
    naming the file, the line and the byte offset, not a raw codec message."""
    path = _ledger(tmp_path / "pairs.db")
    saved = tmp_path / "metrics.txt"
    saved.write_bytes(b'# HELP x y\nx{a="\xff"} 1\n')
    argv = ["report", "--ledger", str(path), "--out", str(tmp_path / "o")]
    rc = main([*argv, "--metrics-url", str(saved)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err == f"specwatch report: {saved}:2: not UTF-8 (byte 16: b'\\xff')\n"


@pytest.mark.parametrize("ledger", ["/dev/null", "fifo"])
def test_ledger_that_is_not_a_regular_file(
    ledger: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--ledger`` naming a device or a pipe that exists: the line says it is not a regular
    file (it once said "no such file" of a path that is there)."""
    path = Path(ledger) if ledger.startswith("/") else tmp_path / ledger
    if not path.exists():
        os.mkfifo(path)
    rc = main(["report", "--ledger", str(path), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err == f"specwatch report: ledger {path}: not a regular file, not a ledger file\n"
