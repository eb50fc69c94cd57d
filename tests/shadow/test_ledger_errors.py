"""A ledger write failure is counted, exported and logged once per state change."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from specwatch.core.logs import event_fields
from specwatch.settings import Settings
from specwatch.shadow.compare import PairOutcome, compare
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.shadow.values import Arm, ArmResult, ReplayPair, ShadowRequest, Source
from tests.e2e.shadow_harness import sidecar
from tests.fakes import REPO

METRICS_DOC = (REPO / "docs" / "metrics.md").read_text()
SHADOW_PREFIXES = (
    "specwatch_shadow_",
    "specwatch_paired_",
    "specwatch_ledger_",
    "specwatch_flip_",
    "specwatch_excess_",
)


def _outcome(i: int, fly_text: str, fly_tokens: int | None = None) -> PairOutcome:
    req = ShadowRequest(
        path="/v1/completions",
        body={"prompt": f"q{i}"},
        request_hash=f"{i:064x}",
        received_at=1_800_000_000.0 + i,
        source=Source.CANARY,
        category="math",
        item_id=f"q{i}",
        gold="42",
        checker=r"regex:answer:\s*(\d+)",
    )
    pair = ReplayPair(
        request=req,
        standard=ArmResult(Arm.STANDARD, True, 0.1, text="answer: 42"),
        fly=ArmResult(Arm.FLY, True, 0.1, text=fly_text, completion_tokens=fly_tokens),
    )
    return compare(pair)


def _trigger(path: Path, sql: str) -> None:
    conn = sqlite3.connect(path)
    try:
        conn.execute(sql)
        conn.commit()
    finally:
        conn.close()


async def test_write_errors_counted_exported_and_logged_per_state_change(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Ledger write errors are counted, exported and logged once per change of state."""
    ledger = tmp_path / "ledger.sqlite"
    settings = Settings.model_validate(
        {
            "shadow": {
                "enabled": True,
                "standard": {"url": "http://127.0.0.1:9"},
                "fly": {"url": "http://127.0.0.1:9"},
            },
            "ledger": {"path": str(ledger)},
        }
    )
    caplog.set_level(logging.INFO, logger="specwatch.shadow")
    async with sidecar(settings) as sc:
        comp = sc.component
        # the category is admitted where the pipeline admits it, at sampling
        assert comp.statistics.categories("math") == "math"
        comp.statistics.take_outcome(_outcome(0, "answer: 42"))
        await comp.refresh(flush=True)
        # writes now fail (reads still work), as on a full disk
        _trigger(
            ledger,
            "CREATE TRIGGER refuse BEFORE INSERT ON pairs "
            "BEGIN SELECT RAISE(ABORT, 'refused by test'); END",
        )
        for i in (1, 2):
            comp.statistics.take_outcome(_outcome(i, "answer: 41"))
            stats = await comp.refresh(flush=True)
        m = await sc.metrics()
        _trigger(ledger, "DROP TRIGGER refuse")
        comp.statistics.take_outcome(_outcome(3, "answer: 42"))
        after = await comp.refresh(flush=True)
    assert sum(stats.ledger_write_errors.values()) == 2
    ((reason, n),) = stats.ledger_write_errors.items()
    assert n == 2
    assert m[("specwatch_ledger_write_errors_total", frozenset({("reason", reason)}))] == 2
    assert stats.ledger_rows == 1
    # the counters still count every compared pair; the ledger holds the two that were written
    assert after.ledger_rows == 2
    assert after.pairs_total[("math", "fly", "lost")] == 2
    events = [
        (r.getMessage(), event_fields(r))
        for r in caplog.records
        if r.name == "specwatch.shadow.component"
    ]
    changes = [e for e in events if e[0].startswith("ledger writes")]
    assert [c[0] for c in changes] == ["ledger writes failing", "ledger writes recovered"]
    assert "refused by test" in str(changes[0][1]["error"])

    # every family the component exports is documented in docs/metrics.md
    exported = {n for n, _ in m if n.startswith(SHADOW_PREFIXES)}
    assert "specwatch_shadow_pauses_total" in exported
    for name in exported:
        assert f"`{name}`" in METRICS_DOC, name


async def test_a_value_sqlite_cannot_store_loses_its_row_not_the_writer(tmp_path: Path) -> None:
    """A row holding an integer beyond 64 bits is counted (OverflowError) and lost; the ledger
    stays ``ok`` on /metrics and the writer stores the next pair."""
    ledger = tmp_path / "ledger.sqlite"
    settings = Settings.model_validate(
        {
            "shadow": {
                "enabled": True,
                "standard": {"url": "http://127.0.0.1:9"},
                "fly": {"url": "http://127.0.0.1:9"},
            },
            "ledger": {"path": str(ledger)},
        }
    )
    async with sidecar(settings) as sc:
        comp = sc.component
        comp.statistics.take_outcome(_outcome(0, "answer: 42", fly_tokens=10**20))
        stats = await comp.refresh(flush=True)
        comp.statistics.take_outcome(_outcome(1, "answer: 42"))
        after = await comp.refresh(flush=True)
        m = await sc.metrics()
    assert dict(stats.ledger_write_errors) == {"OverflowError": 1}
    assert after.ledger_rows == 1
    assert m[("specwatch_ledger_state", frozenset({("state", "ok")}))] == 1.0
    assert m[("specwatch_ledger_write_errors_total", frozenset({("reason", "OverflowError")}))] == 1


async def test_a_writer_stopped_by_a_bug_is_unavailable_then_restarted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The writer task raises an error nobody expected: the ledger reads ``unavailable``
    (counted, logged), and the component's retry starts a new writer that stores the next
    pair."""
    ledger = tmp_path / "ledger.sqlite"
    settings = Settings.model_validate(
        {
            "shadow": {
                "enabled": True,
                "standard": {"url": "http://127.0.0.1:9"},
                "fly": {"url": "http://127.0.0.1:9"},
            },
            "ledger": {"path": str(ledger)},
        }
    )
    async with sidecar(settings) as sc:
        comp = sc.component
        await comp.refresh(flush=True)  # the start-up rebuild has read the ledger
        led = comp.ledger
        assert led is not None
        writer = led._writer
        real = writer._write_batch

        async def broken(batch: list[LedgerRow]) -> None:
            raise KeyError("a bug")

        writer._write_batch = broken  # type: ignore[method-assign]
        comp.statistics.take_outcome(_outcome(0, "answer: 42"))
        await comp.refresh(flush=True)  # the row is lost with the writer: no wait for ever
        m = await sc.metrics()
        writer._write_batch = real  # type: ignore[method-assign]
        assert await led.retry() == "ok"
        comp.statistics.take_outcome(_outcome(1, "answer: 42"))
        after = await comp.refresh(flush=True)
    assert m[("specwatch_ledger_state", frozenset({("state", "unavailable")}))] == 1.0
    assert m[("specwatch_ledger_state", frozenset({("state", "ok")}))] == 0.0
    assert m[("specwatch_ledger_write_errors_total", frozenset({("reason", "KeyError")}))] == 1
    assert after.ledger_rows == 1
    assert any(r.getMessage() == "ledger writer stopped" for r in caplog.records)
