"""A ledger that cannot store rows stops pairing and nothing else: a corrupt file at start is
moved aside and a fresh ledger started; a read-only or full one (real small file systems) leaves
``/healthz`` and ``/metrics`` answering, shows its state in ``specwatch_ledger_state``, logs one
line per change, refuses replays and recovers when space comes back; corruption while running is
found by the periodic integrity check."""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from specwatch.alerts.rules import candidates
from specwatch.alerts.settings import DetectSettings
from specwatch.observe.values import ObserveView
from specwatch.settings import Settings
from specwatch.shadow.values import LEDGER_STATES, ShadowRequest, Source
from tests.e2e.shadow_harness import Sidecar, sidecar, until
from tests.shadow.test_ledger_errors import _outcome


def _settings(ledger: Path, **ledger_extra: object) -> Settings:
    return Settings.model_validate(
        {
            "shadow": {
                "enabled": True,
                "standard": {"url": "http://127.0.0.1:9"},
                "fly": {"url": "http://127.0.0.1:9"},
            },
            "paired": {"refresh_seconds": 0.05},
            "ledger": {"path": str(ledger), **ledger_extra},
        }
    )


async def _state(sc: Sidecar) -> str:
    """The one ``specwatch_ledger_state`` series at 1 (every state is exported)."""
    m = await sc.metrics()
    states = {
        dict(labels)["state"]: v for (n, labels), v in m.items() if n == "specwatch_ledger_state"
    }
    assert sorted(states) == sorted(LEDGER_STATES)
    (on,) = [s for s, v in states.items() if v == 1]
    return on


async def _healthz(sc: Sidecar) -> int:
    async with sc.client.get(sc.url + "/healthz") as r:
        return r.status


def _request(i: int) -> ShadowRequest:
    return ShadowRequest(
        path="/v1/completions",
        body={"prompt": f"p{i}"},
        request_hash=f"{i:064x}",
        received_at=0.0,
        source=Source.MIRROR,
        category="chat",
    )


@contextlib.contextmanager
def small_fs(tmp_path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted under ``tmp_path`` (skips the test where mounting is not
    allowed: it needs root)."""
    where = tmp_path / "fs"
    where.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def corrupt_copies(where: Path) -> list[Path]:
    """The ledger files moved aside in ``where``."""
    return sorted(where.glob("ledger.sqlite.corrupt-*"))


def read_only_ledger(fs: Path) -> Path:
    """A ledger file on ``fs``, then ``fs`` remounted read-only."""
    ledger = fs / "ledger.sqlite"
    conn = sqlite3.connect(ledger)
    conn.execute("CREATE TABLE pairs (id INTEGER PRIMARY KEY, time REAL)")
    conn.close()
    subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
    return ledger


def _ledger_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "specwatch.shadow.component" and r.getMessage().startswith("ledger writes")
    ]


async def test_a_corrupt_ledger_at_start_is_moved_aside_and_a_fresh_one_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A ledger file of garbage (SQLite: "file is not a database") does not stop the sidecar:
    ``/healthz`` is 200, the file is renamed ``<name>.corrupt-<unix seconds>`` with its bytes
    kept, one WARNING names both paths, and a new ledger stores rows."""
    ledger = tmp_path / "ledger.sqlite"
    junk = bytes(range(256)) * 64
    ledger.write_bytes(junk)
    caplog.set_level(logging.INFO, logger="specwatch")
    async with sidecar(_settings(ledger)) as sc:
        comp = sc.component
        await until(lambda: comp.statistics.live is not None, 20)
        assert await _healthz(sc) == 200
        comp.statistics.take_outcome(_outcome(0, "answer: 42"))
        stats = await comp.refresh(flush=True)
        state = await _state(sc)
    (aside,) = corrupt_copies(tmp_path)
    assert aside.read_bytes() == junk
    assert state == "ok"
    assert stats.ledger_rows == 1
    moved = [r for r in caplog.records if r.getMessage().startswith("corrupt ledger moved aside")]
    assert len(moved) == 1
    assert moved[0].levelno == logging.WARNING


async def test_a_read_only_ledger_stops_pairing_and_nothing_else(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A ledger on a file system mounted read-only: the sidecar starts, ``/healthz`` is 200,
    ``specwatch_ledger_state{state="read_only"}`` is 1, an offered request is dropped as
    ``ledger_unusable`` (no replay), ``SpecwatchLedgerFailing`` holds while the state lasts
    (no write errors needed) and one log line says so."""
    caplog.set_level(logging.INFO, logger="specwatch")
    with small_fs(tmp_path, "4m") as fs:
        ledger = read_only_ledger(fs)
        async with sidecar(_settings(ledger)) as sc:
            comp = sc.component
            await until(lambda: comp.statistics.live is not None, 20)
            assert comp.pipeline is not None
            offered = comp.pipeline.sampler.offer(_request(1))
            stats = await comp.refresh()
            health = await _healthz(sc)
            state = await _state(sc)
    assert health == 200
    assert state == "read_only"
    assert offered == "ledger_unusable"
    assert stats.ledger_state == "read_only"
    firing = [
        a.alertname for a in candidates(ObserveView(generated_at=0.0), stats, DetectSettings())
    ]
    assert "SpecwatchLedgerFailing" in firing
    assert _ledger_lines(caplog) == ["ledger writes failing"]


async def test_a_full_disk_stops_pairing_then_recovers_when_space_comes_back(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A ledger on a 1 MiB tmpfs filled by another file: the first failed batch sets the state
    ``full`` (one log line, not one per batch), later rows are refused as ``not_stored`` and
    offers dropped as ``ledger_unusable``; ``/healthz`` stays 200; once the filler is removed a
    retry sets the state ``ok`` again (one more line) and rows are stored."""
    caplog.set_level(logging.INFO, logger="specwatch")
    with small_fs(tmp_path, "1m") as fs:
        ledger = fs / "ledger.sqlite"
        async with sidecar(_settings(ledger)) as sc:
            comp = sc.component
            await until(lambda: comp.statistics.live is not None, 20)
            assert comp.ledger is not None
            assert comp.pipeline is not None
            filler = fs / "filler"
            with contextlib.suppress(OSError), filler.open("wb") as f:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
                    os.fsync(f.fileno())
            for i in range(40):
                comp.statistics.take_outcome(_outcome(i, "answer: 42" if i % 2 else "answer: 41"))
                await comp.refresh(flush=True)
                if comp.ledger.state == "full":
                    break
            for i in range(40, 45):
                comp.statistics.take_outcome(_outcome(i, "answer: 42"))
            full = await comp.refresh(flush=True)
            offered = comp.pipeline.sampler.offer(_request(2))
            health = await _healthz(sc)
            state_full = await _state(sc)
            filler.unlink()
            assert await comp.ledger.retry() == "ok"
            comp.statistics.take_outcome(_outcome(99, "answer: 42"))
            after = await comp.refresh(flush=True)
            state_after = await _state(sc)
    assert full.ledger_state == "full"
    assert state_full == "full"
    assert full.ledger_write_errors.get("not_stored") == 5
    assert offered == "ledger_unusable"
    assert health == 200
    assert state_after == "ok"
    assert after.ledger_rows is not None
    assert full.ledger_rows is not None
    assert after.ledger_rows == full.ledger_rows + 1
    assert _ledger_lines(caplog) == ["ledger writes failing", "ledger writes recovered"]


async def test_corruption_while_running_is_found_by_the_integrity_check(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Pages of a running ledger overwritten behind its back: the periodic quick check (every
    0.2 s here; hourly by default), run in a worker thread, sets the state ``corrupt`` and stops
    pairing, while ``/healthz`` stays 200; the next start moves the file aside."""
    ledger = tmp_path / "ledger.sqlite"
    caplog.set_level(logging.INFO, logger="specwatch")
    settings = _settings(ledger, integrity_check_seconds=0.2)
    async with sidecar(settings) as sc:
        comp = sc.component
        await until(lambda: comp.statistics.live is not None, 20)
        assert comp.ledger is not None
        rows = [(1_800_000_000.0 + i, f"cat{i % 7}", "paired") for i in range(5000)]
        await comp.ledger.write_many(["time", "category", "status"], rows)
        conn = sqlite3.connect(ledger)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        with ledger.open("r+b") as f:  # pages 2-7: the rows' root page among them
            f.seek(4096 * 1)
            f.write(b"\xff" * 4096 * 6)
        await until(lambda: comp.ledger is not None and comp.ledger.state == "corrupt", 20)
        health = await _healthz(sc)
        state = await _state(sc)
    assert health == 200
    assert state == "corrupt"
    assert _ledger_lines(caplog) == ["ledger writes failing"]
    async with sidecar(_settings(ledger)) as sc:
        await until(lambda: sc.component.statistics.live is not None, 20)
        restarted = await _state(sc)
    assert restarted == "ok"
    assert len(corrupt_copies(tmp_path)) == 1


async def test_damage_first_read_by_the_rebuild_marks_the_ledger_corrupt(tmp_path: Path) -> None:
    """A damaged page the open does not touch (the stored aggregates' bookkeeping) is met by the
    restart rebuild: the integrity check sets the state ``corrupt`` (pairing stops, the ledger
    alert's state is exported), the statistics start empty and the task goes on (``/healthz``
    200) instead of ending with the read's error."""
    ledger = tmp_path / "ledger.sqlite"
    async with sidecar(_settings(ledger)) as sc:
        comp = sc.component
        await until(lambda: comp.statistics.live is not None, 20)
        assert comp.ledger is not None
        rows = [(1_800_000_000.0 + i, f"cat{i % 7}", "paired") for i in range(2000)]
        await comp.ledger.write_many(["time", "category", "status"], rows)
    with sqlite3.connect(ledger) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        (page,) = conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = 'pair_sums_meta'"
        ).fetchone()
        (size,) = conn.execute("PRAGMA page_size").fetchone()
    with ledger.open("r+b") as f:
        f.seek((page - 1) * size)
        f.write(b"\xff" * size)
    async with sidecar(_settings(ledger)) as sc:
        await until(lambda: sc.component.statistics.live is not None, 20)
        state = await _state(sc)
        health = await _healthz(sc)
        live = sc.component.statistics.live
        assert live is not None
        rows_seen = live.rows()
    assert (state, health, rows_seen) == ("corrupt", 200, 0)
