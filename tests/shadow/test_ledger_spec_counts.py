"""Per-request draft counts in the ledger: an older ledger takes the new columns, the counts of
each reply are stored, and a new process reading the ledger (``specwatch report``) shows the
acceptance gain from them."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from specwatch.shadow.compare import compare
from specwatch.shadow.ledger.ledger import Ledger
from specwatch.shadow.values import Arm, ArmResult, ReplayPair, ShadowRequest, Source
from specwatch.vllm.request_metrics import SpecDecodeReading
from tests.shadow.test_ledger import OLD_COLUMNS
from tests.tools.report.test_report import parse_tables


def _reply(arm: Arm, steps: int, drafted: int, accepted: int) -> ArmResult:
    sd = SpecDecodeReading(steps, drafted, accepted, 1 + accepted / steps, accepted / drafted)
    return ArmResult(
        arm, True, 0.5, status=200, text="42", finish_reason="length", completion_tokens=20,
        mean_acceptance_length=sd.tau, spec_decode=sd,
    )  # fmt: skip


def _pair(i: int, std: tuple[int, int, int], fly: tuple[int, int, int]) -> ReplayPair:
    req = ShadowRequest("/v1/completions", {"prompt": f"q{i}"}, f"h{i}", 10.0 + i, Source.MIRROR)
    return ReplayPair(req, _reply(Arm.STANDARD, *std), _reply(Arm.FLY, *fly))


async def _write(path: Path) -> list[tuple[int | None, ...]]:
    async with Ledger(path) as led:
        led.submit(compare(_pair(1, (10, 30, 15), (10, 30, 24))))
        led.submit(compare(_pair(2, (5, 20, 8), (5, 20, 16))))
        failed = _pair(3, (4, 8, 8), (4, 8, 8))
        # an arm that failed stores no counts (the reply counters skip it too)
        timeout = ArmResult(Arm.FLY, False, 0.1, error="timeout")
        led.submit(compare(ReplayPair(failed.request, failed.standard, timeout)))
        await led.flush()
        rows = await led.query()
        totals = await led.reply_totals()
    assert totals == {("standard", "default"): (19, 58, 31), ("fly", "default"): (15, 50, 40)}
    return [
        (r.standard_spec_steps, r.standard_draft_tokens, r.standard_accepted_tokens,
         r.fly_spec_steps, r.fly_draft_tokens, r.fly_accepted_tokens)
        for r in rows
    ]  # fmt: skip


def test_counts_survive_into_a_new_process_through_an_old_ledger(tmp_path: Path) -> None:
    """A ledger of the older layout (no count columns, one old row) opens and takes the
    columns; two paired replies store their counts (standard 10/30/15 and 5/20/8 steps/drafted/
    accepted, FLy 10/30/24 and 5/20/16); a third pair whose FLy arm failed stores the standard
    arm's counts only. A new process (``specwatch report``) on the file shows the acceptance
    gain summed over every stored reply, as the live reply counters count them: FLy 40/50 =
    0.8, standard (15 + 8 + 8)/(30 + 20 + 8) = 31/58 = 0.5345, gain 0.2655."""
    path = tmp_path / "old.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute(f"CREATE TABLE pairs (id INTEGER PRIMARY KEY, {OLD_COLUMNS})")
        conn.execute(
            "INSERT INTO pairs (time, request_hash, category, source, status, labelled, "
            "noise_asked) VALUES (1.0, 'old', 'default', 'mirror', 'paired', 0, 0)"
        )
    stored = asyncio.run(_write(path))
    assert stored == [
        (None,) * 6,
        (10, 30, 15, 10, 30, 24),
        (5, 20, 8, 5, 20, 16),
        (4, 8, 8, None, None, None),
    ]
    out = tmp_path / "report"
    run = subprocess.run(
        [sys.executable, "-m", "specwatch", "report", "--ledger", str(path), "--out", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    table = parse_tables((out / "index.html").read_text(encoding="utf-8"), key="data-decision")
    gain = float(table["_all"]["acceptance_gain"]["data-value"])
    assert gain == pytest.approx(40 / 50 - 31 / 58)
