"""Counter values no server can reach are refused per sample: a counter at 1e300 (above 2^53), a
NaN counter, a counter that rises faster than 1e8 a second. Each refusal is counted as
``specwatch_scrape_errors_total{reason="implausible_value"}`` with one warning line naming the
URL and the sample, and the windows keep the last good state. Driven through a real fake-vLLM
HTTP server on 127.0.0.1 and specwatch's own ``/api/v1/snapshot`` and ``/metrics``."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.core.logs import event_fields
from specwatch.observe.parse import parse_page
from specwatch.observe.plausible import MAX_SAMPLE_VALUE, JumpScreen
from tests.observe.scraped_sidecar import Sidecar, scrape_all

LBL = 'engine="0",model_name="m"'
DRAFTS = f"vllm:spec_decode_num_drafts_total{{{LBL}}}"


def page(drafts: str, draft_tokens: float, accepted: float) -> str:
    """A page with the three spec-decode counters of one engine."""
    return (
        "# TYPE vllm:spec_decode_num_drafts counter\n"
        f"{DRAFTS} {drafts}\n"
        "# TYPE vllm:spec_decode_num_draft_tokens counter\n"
        f"vllm:spec_decode_num_draft_tokens_total{{{LBL}}} {draft_tokens}\n"
        "# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
        f"vllm:spec_decode_num_accepted_tokens_total{{{LBL}}} {accepted}\n"
    )


async def _since_start(sc: Sidecar) -> dict[str, Any]:
    resp = await sc[1].get("/api/v1/snapshot")
    doc: dict[str, Any] = json.loads(await resp.text())
    server: dict[str, Any] = doc["targets"]["fly"]["windows"]["since_start"]["server"]
    return server


async def _refusals(sc: Sidecar) -> float:
    text = await (await sc[1].get("/metrics")).text()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "specwatch_scrape_errors_total" and s.labels == {
                "target": "fly",
                "reason": "implausible_value",
            }:
                return float(s.value)
    raise AssertionError("no implausible_value series")


def _lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [
        event_fields(r)
        for r in caplog.records
        if r.name == "specwatch.scrape" and r.getMessage() == "implausible values refused"
    ]


@pytest.mark.parametrize("bad", ["1e300", "NaN"])
async def test_a_counter_at_1e300_or_nan_is_refused_and_the_windows_keep_the_last_good_state(
    sidecar: Sidecar, caplog: pytest.LogCaptureFixture, bad: str
) -> None:
    """Drafts 100 / 300 draft tokens / 180 accepted at t=0, then drafts ``bad`` twice (t=30, 60:
    the other counters rise to 330/198 and 360/216), then drafts 130 (t=90, 390/234). The bad
    sample is refused on both pages (2 refusals, one line naming the URL and the sample; the
    second page repeats it and logs nothing), the page's other counters are used, and since
    start drafts = 130 - 100 = 30, α = (234 - 180) / (390 - 300) = 0.6, τ = 1 + 54/30 = 2.8:
    never a window of 1e300."""
    caplog.set_level(logging.WARNING, logger="specwatch.scrape")
    await scrape_all(
        sidecar,
        [
            page("100", 300, 180),
            page(bad, 330, 198),
            page(bad, 360, 216),
            page("130", 390, 234),
        ],
    )
    assert await _refusals(sidecar) == 2
    (line,) = _lines(caplog)
    assert line["url"] == sidecar[2].url
    value = "1e+300" if bad == "1e300" else "nan"
    assert line["samples"] == [f"{DRAFTS}={value}"]
    server = await _since_start(sidecar)
    assert server["drafts"] == 30
    assert server["acceptance_rate"] == pytest.approx(0.6)
    assert server["mean_acceptance_length"] == pytest.approx(2.8)


async def test_a_counter_jumping_faster_than_any_server_is_refused_then_continues(
    sidecar: Sidecar, caplog: pytest.LogCaptureFixture
) -> None:
    """Drafts 100 at t=0, 1e12 at t=30 (a rise of 3.3e10/s, over the 1e8/s bound: refused),
    1e12 + 10 at t=60 (continues from the jump: read as 110), 1e12 + 30 at t=90 (130). One
    refusal, one line naming the sample; since start drafts = 30, α = 54/90 = 0.6 as above:
    the jump is never counted, neither at once nor later."""
    caplog.set_level(logging.WARNING, logger="specwatch.scrape")
    await scrape_all(
        sidecar,
        [
            page("100", 300, 180),
            page("1000000000000", 330, 198),
            page("1000000000010", 360, 216),
            page("1000000000030", 390, 234),
        ],
    )
    assert await _refusals(sidecar) == 1
    (line,) = _lines(caplog)
    assert line["url"] == sidecar[2].url
    assert line["samples"] == ["m/0 drafts=1e+12"]
    server = await _since_start(sidecar)
    assert server["drafts"] == 30
    assert server["acceptance_rate"] == pytest.approx(0.6)


def test_a_restart_after_a_jump_is_counted_from_its_own_value() -> None:
    """After a refused jump (offset 1e12 - 100), a restarted server's drafts of 5 fall below the
    offset: the offset is dropped and 5 is read as it is (the window sees a reset)."""
    screen = JumpScreen()
    first = parse_page(page("100", 300, 180))
    jumped, refused = screen.screen(
        parse_page(page("1000000000000", 330, 198)),
        first.engines.get,
        30.0,
        restarted=False,
    )
    assert refused == ["m/0 drafts=1e+12"]
    assert "drafts" not in jumped.engines[("m", "0")].counters
    after, refused = screen.screen(
        parse_page(page("5", 3, 1)), first.engines.get, 30.0, restarted=False
    )
    assert refused == []
    assert after.engines[("m", "0")].counters["drafts"] == 5
    assert MAX_SAMPLE_VALUE == 2.0**53


@pytest.mark.parametrize(("bad", "shown"), [("-5", "-5"), ("+Inf", "inf")])
async def test_a_negative_or_infinite_counter_names_the_url_and_the_sample(
    sidecar: Sidecar, caplog: pytest.LogCaptureFixture, bad: str, shown: str
) -> None:
    """A negative or infinite drafts counter (``invalid_series``) is skipped as before, and its
    one warning line names the URL and the sample; since start drafts = 130 - 100 = 30."""
    caplog.set_level(logging.WARNING, logger="specwatch.scrape")
    await scrape_all(sidecar, [page("100", 300, 180), page(bad, 330, 198), page("130", 390, 234)])
    (line,) = [
        event_fields(r) for r in caplog.records if r.getMessage() == "invalid series skipped"
    ]
    assert line["url"] == sidecar[2].url
    assert line["samples"] == [f"{DRAFTS}={shown}"]
    assert (await _since_start(sidecar))["drafts"] == 30
