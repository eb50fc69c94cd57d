"""The scrape warnings about series skipped and counters that fell name the target's URL and
the first few series with their values, and are written once per change of state, not on
every scrape; a family whose every sample is invalid is reported as present but invalid
(the skipped-series line), never as missing, in the log and in the snapshot alike. Driven
through a real fake-vLLM HTTP server on 127.0.0.1 and specwatch's own ``/api/v1/snapshot``."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from specwatch.core.logs import event_fields
from tests.observe.scraped_sidecar import Sidecar, scrape_all

LBL = 'engine="0",model_name="m"'
DRAFTS = f"vllm:spec_decode_num_drafts_total{{{LBL}}}"
ACCEPTED = f"vllm:spec_decode_num_accepted_tokens_total{{{LBL}}}"


def page(drafts: float, draft_tokens: float, accepted: float, extra: str = "") -> str:
    """A page with the three spec-decode counters of one engine, then ``extra`` lines."""
    return (
        "# TYPE vllm:spec_decode_num_drafts counter\n"
        f"{DRAFTS} {drafts:g}\n"
        "# TYPE vllm:spec_decode_num_draft_tokens counter\n"
        f"vllm:spec_decode_num_draft_tokens_total{{{LBL}}} {draft_tokens:g}\n"
        "# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
        f"{ACCEPTED} {accepted:g}\n" + extra
    )


def _lines(caplog: pytest.LogCaptureFixture, event: str) -> list[dict[str, Any]]:
    return [
        event_fields(r)
        for r in caplog.records
        if r.name == "specwatch.scrape" and r.getMessage() == event
    ]


async def test_a_duplicate_series_is_logged_once_with_the_url_and_the_series(
    sidecar: Sidecar, caplog: pytest.LogCaptureFixture
) -> None:
    """Four pages each carrying the accepted-tokens counter twice (180 and 999): one line,
    with the URL and the series with its first value, not four."""
    caplog.set_level(logging.WARNING, logger="specwatch.scrape")
    dup = f"{ACCEPTED} 999\n"
    await scrape_all(sidecar, [page(100 + 10 * i, 300, 180, dup) for i in range(4)])
    (line,) = _lines(caplog, "duplicate series skipped")
    assert line["url"] == sidecar[2].url
    assert line["count"] == 1
    assert line["samples"] == [f"{ACCEPTED}=180"]


async def test_counters_falling_on_every_page_are_logged_once_until_they_stop(
    sidecar: Sidecar, caplog: pytest.LogCaptureFixture
) -> None:
    """Drafts 100, 50, 20, 10 (each page below the last: four resets in a row after the
    first), then 30 (rising), then 5 (a reset again): two "counter reset" lines, the first
    with 1 reset so far and the second with 4, each naming the URL and the engine."""
    caplog.set_level(logging.WARNING, logger="specwatch.scrape")
    values = [100, 50, 20, 10, 30, 5]
    await scrape_all(sidecar, [page(v, 3 * v, 2 * v) for v in values])
    lines = _lines(caplog, "counter reset")
    assert [(x["url"], x["engine"], x["resets"]) for x in lines] == [
        (sidecar[2].url, "0", 1),
        (sidecar[2].url, "0", 4),
    ]


async def test_a_family_whose_samples_are_all_invalid_is_not_missing(
    sidecar: Sidecar, caplog: pytest.LogCaptureFixture
) -> None:
    """A good page, then two pages whose accepted-tokens counter is -1 (a negative counter:
    invalid): no "families missing" line, the snapshot's missing_families is [], and one
    "invalid series skipped" line names the URL and the sample."""
    caplog.set_level(logging.WARNING, logger="specwatch.scrape")
    await scrape_all(sidecar, [page(100, 300, 180), page(110, 330, -1), page(120, 360, -1)])
    doc = json.loads(await (await sidecar[1].get("/api/v1/snapshot")).text())
    assert doc["targets"]["fly"]["missing_families"] == []
    assert _lines(caplog, "families missing") == []
    (line,) = _lines(caplog, "invalid series skipped")
    assert line["url"] == sidecar[2].url
    assert line["samples"] == [f"{ACCEPTED}=-1"]
