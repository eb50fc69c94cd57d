"""A ledger write failure is counted, exported and logged once per state change."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from specwatch.core.logs import event_fields
from specwatch.settings import Settings
from specwatch.shadow.compare import PairOutcome, compare
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


def _outcome(i: int, fly_text: str) -> PairOutcome:
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
        fly=ArmResult(Arm.FLY, True, 0.1, text=fly_text),
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
