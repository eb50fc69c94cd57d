"""A ledger file ``specwatch run`` cannot read never stops the sidecar: random bytes, an empty
file, a real ledger cut in half, a JSON document and a zip archive are each moved aside
(``<name>.corrupt-<unix seconds>``, bytes unchanged) with one WARNING line, and a fresh ledger
starts in their place (``specwatch_ledger_state{state="ok"}`` 1, a SQLite file with a ``pairs``
table). Before, every start exited 2 on all but the empty file."""

from __future__ import annotations

import asyncio
import io
import json
import os
import sqlite3
import zipfile
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest

from tests.sidecar_process import free_port, run_config, specwatch_process


def _real_ledger_cut_in_half(path: Path) -> bytes:
    """A SQLite file with a ``pairs`` table of 2,000 rows (about 60 pages), its second half
    cut off."""
    scratch = path.with_name("whole.sqlite")
    with sqlite3.connect(scratch) as db:
        db.execute(
            "CREATE TABLE pairs (id INTEGER PRIMARY KEY, time REAL, category TEXT, status TEXT)"
        )
        db.executemany(
            "INSERT INTO pairs (time, category, status) VALUES (?, ?, ?)",
            [(float(i), "math" * 20, "paired") for i in range(2000)],
        )
    whole = scratch.read_bytes()
    scratch.unlink()
    assert len(whole) >= 16 * 4096
    return whole[: len(whole) // 2]


def _zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("pairs.csv", "time,category,status\n1,math,paired\n")
    return buf.getvalue()


KINDS: dict[str, Callable[[Path], bytes]] = {
    "random_bytes": lambda path: os.urandom(64 << 10),
    "empty": lambda path: b"",
    "truncated": _real_ledger_cut_in_half,
    "json": lambda path: json.dumps({"pairs": [{"status": "paired"}]}).encode(),
    "zip": lambda path: _zip(),
}


@pytest.mark.parametrize("kind", sorted(KINDS))
async def test_an_unreadable_ledger_is_moved_aside_and_a_fresh_one_starts(
    kind: str, tmp_path: Path
) -> None:
    """A ledger file that is not a readable SQLite database (random bytes, empty, truncated,
    JSON, zip) is moved aside with one line and ``specwatch run`` starts on a fresh ledger; the
    old bytes are kept whole beside it."""
    ledger = tmp_path / "ledger.sqlite"
    before = KINDS[kind](ledger)
    ledger.write_bytes(before)
    port = free_port()
    cfg = run_config(
        tmp_path,
        port,
        shadow={
            "enabled": True,
            "mirror_listen_host": "127.0.0.1",
            "mirror_listen_port": free_port(),
            "standard": {"url": "http://127.0.0.1:7"},
            "fly": {"url": "http://127.0.0.1:7"},
        },
    )
    async with specwatch_process(tmp_path, ["run", "--config", str(cfg)], port=port) as p:
        async with aiohttp.ClientSession() as s:
            text = ""
            for _ in range(100):
                async with s.get(p.url + "/metrics") as r:
                    text = await r.text()
                if 'specwatch_ledger_state{state="ok"} 1.0' in text:
                    break
                await asyncio.sleep(0.1)
            assert 'specwatch_ledger_state{state="ok"} 1.0' in text, p.log_text()[-3000:]
        log = p.log_text()
    _check_files(tmp_path, before, log)


def _check_files(tmp_path: Path, before: bytes, log: str) -> None:
    """The old bytes kept aside, named in the one WARNING line; a fresh ledger in place."""
    ledger = tmp_path / "ledger.sqlite"
    (aside,) = sorted(tmp_path.glob("ledger.sqlite.corrupt-*[0-9]"))
    assert aside.read_bytes() == before
    moved = [line for line in log.splitlines() if "corrupt ledger moved aside" in line]
    assert len(moved) == 1, log[-3000:]
    assert json.loads(moved[0])["moved_to"] == str(aside)
    with sqlite3.connect(ledger) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "pairs" in tables
