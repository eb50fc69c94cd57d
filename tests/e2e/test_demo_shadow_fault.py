"""The demo's shadow chain and alerts react to a real FLy fault: with the FLy simulator's entropy
threshold set to 0 (every rejection a waiver can cover is waived), the view's shadow section
reports FLy losing canary answers and the SpecQualityDrift alert fires (e-value past 1/alpha)."""

from __future__ import annotations

import asyncio
import re

import aiohttp
import pytest

from specwatch.demo.config import DemoConfig
from specwatch.demo.run import run_demo
from tests.demo.streams import WatchedOutput

SHADOW_RE = re.compile(
    r"^pairs \(since_start\) ([\d,]+), labelled ([\d,]+): lost ([\d,]+) gained ([\d,]+)", re.M
)
FLY_RE = re.compile(r"fly simulator:\s+(http://\S+)")


def _last_block(text: str) -> str:
    return text.rstrip().split("\n\n")[-1]


def _flagged(text: str, start: int) -> bool:
    """A view block written after ``start`` shows FLy losing and the quality alert firing."""
    block = _last_block(text[start:]) if len(text) > start else ""
    m = SHADOW_RE.search(block) if block else None
    if m is None:
        return False
    lost, gained = int(m.group(3).replace(",", "")), int(m.group(4).replace(",", ""))
    return lost >= 2 * gained + 10 and "SpecQualityDrift" in block


@pytest.mark.slow
async def test_fly_fault_shows_losses_and_fires_the_quality_alert() -> None:
    """A FLy fault in the demo shows paired losses and fires SpecQualityDrift."""
    out = WatchedOutput()
    stop = asyncio.Event()
    cfg = DemoConfig(
        port=0,
        refresh_s=0.5,
        rate=20.0,
        concurrency=8,
        canary_rate=40.0,
        canary_variants=4,
        shadow_rps=80.0,
        shadow_in_flight=16,
        alert_for_s=1.0,
        alert_interval_s=0.5,
    )
    task = asyncio.create_task(run_demo(cfg, out=out, stop=stop))
    try:
        async with asyncio.timeout(30):
            text = await out.until(lambda t: FLY_RE.search(t) is not None)
        m = FLY_RE.search(text)
        assert m is not None
        async with aiohttp.ClientSession() as s:
            body = {"fly_entropy_threshold": 0}
            async with s.post(m.group(1) + "/admin/faults", json=body) as r:
                assert r.status == 200
        start = len(out.getvalue())
        async with asyncio.timeout(90):
            text = await out.until(lambda t: _flagged(t, start))
    finally:
        stop.set()
        async with asyncio.timeout(30):
            rc = await task
    assert rc == 0
    block = _last_block(text[start:])
    m2 = SHADOW_RE.search(block)
    assert m2 is not None
    pairs, graded, lost, gained = (int(g.replace(",", "")) for g in m2.groups())
    assert pairs >= graded >= lost + gained
    assert "check=e_value" in block
    # the alert row leads with the labels that tell it apart from the other SpecQualityDrift
    # rows, then says when it fired (cut to the terminal's width, so only its start is sure)
    rows = [line for line in block.splitlines() if "SpecQualityDrift [critical]" in line]
    assert rows, block
    assert any(
        "target=fly" in row and "check=" in row and " fired" in row.split("check=", 1)[1]
        for row in rows
    ), rows
