"""Values and labels no vLLM page carries: ±Inf, negative counters, odd ``position``/``le``.

Before: ``+Inf`` drafts gave τ = 1.0 (1 + Δaccepted/∞), a ``position="100000"`` label made K =
100001 and a 100001-entry per-position list, ``position="01"`` and ``"1"`` were summed into one
position, and a 5000-digit position label was silently dropped. Now each such series is skipped
(absent, never 0), counted in ``specwatch_scrape_errors_total{reason="invalid_series"}`` with one
warning line, and the rest of the page is used.
"""

from __future__ import annotations

import json
import logging
from typing import NoReturn

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.core.logs import event_fields
from specwatch.observe.parse import parse_page
from specwatch.observe.settings import TargetSettings
from specwatch.observe.tracker import TargetTracker
from specwatch.server.app import SCRAPER_KEY
from tests.fakes.vllm import Reply
from tests.observe.scraped_sidecar import Sidecar

LBL = 'engine="0",model_name="m"'


def page(drafts: str, accepted: str, draft_tokens: str, extra: str = "") -> str:
    return (
        "# TYPE vllm:spec_decode_num_drafts_total counter\n"
        f"vllm:spec_decode_num_drafts_total{{{LBL}}} {drafts}\n"
        f"vllm:spec_decode_num_draft_tokens_total{{{LBL}}} {draft_tokens}\n"
        f"vllm:spec_decode_num_accepted_tokens_total{{{LBL}}} {accepted}\n" + extra
    )


def pos(p: str, v: float) -> str:
    return f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{LBL},position="{p}"}} {v}\n'


@pytest.mark.parametrize(
    ("value", "field"),
    [("+Inf", "drafts"), ("-Inf", "accepted_tokens"), ("1e400", "draft_tokens"), ("-3", "drafts")],
)
def test_infinite_or_negative_counter_is_skipped_and_counted(value: str, field: str) -> None:
    """An infinite or negative counter is skipped and counted as one invalid series."""
    values = {"drafts": "10", "accepted_tokens": "5", "draft_tokens": "20", field: value}
    reading = parse_page(page(values["drafts"], values["accepted_tokens"], values["draft_tokens"]))
    counters = reading.engines[("m", "0")].counters
    assert field not in counters
    assert len(counters) == 2
    assert reading.invalid_series == 1


@pytest.mark.parametrize("label", ["01", "+1", " 1", "١", "1.0", "-1", "128", "9" * 5000, ""])
def test_bad_position_label_is_skipped_and_counted(label: str) -> None:
    """A per-position series with a bad position label is skipped and counted."""
    reading = parse_page(page("10", "5", "20", pos("0", 4) + pos("1", 1) + pos(label, 7)))
    assert reading.engines[("m", "0")].per_position == {0: 4.0, 1: 1.0}
    assert reading.invalid_series == 1


def test_sparse_and_largest_positions_are_kept() -> None:
    """Sparse and large position labels are kept as given."""
    reading = parse_page(page("10", "5", "20", pos("0", 4) + pos("3", 1) + pos("127", 2)))
    assert reading.engines[("m", "0")].per_position == {0: 4.0, 3: 1.0, 127: 2.0}
    assert reading.invalid_series == 0


def test_bucket_with_nan_le_is_skipped_and_counted() -> None:
    """A histogram bucket with le="NaN" is skipped and counted."""
    itl = "vllm:inter_token_latency_seconds_bucket"
    extra = f'{itl}{{{LBL},le="NaN"}} 1\n{itl}{{{LBL},le="0.1"}} 2\n{itl}{{{LBL},le="+Inf"}} 3\n'
    reading = parse_page(page("10", "5", "20", extra))
    assert reading.engines[("m", "0")].histograms["itl"].buckets == (
        (0.1, 2.0),
        (float("inf"), 3.0),
    )
    assert reading.invalid_series == 1


def _no_constants(name: str) -> NoReturn:
    raise ValueError(f"non-strict JSON constant {name}")


def _sample(text: str, name: str, labels: dict[str, str]) -> float | None:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


async def test_inf_drafts_in_run_no_wrong_tau_strict_json_counter_and_one_log_line(
    sidecar: Sidecar,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Infinite drafts in a run give no wrong tau, strict JSON, a counted error and one log line."""
    app, client, fake, clock = sidecar
    target = app[SCRAPER_KEY].trackers["fly"].target
    fake.push(
        Reply(page("10", "5", "20")),
        Reply(page("+Inf", "9", "28")),
        Reply(page("+Inf", "13", "36")),
    )
    caplog.set_level(logging.DEBUG, logger="specwatch.scrape")
    assert await app[SCRAPER_KEY].scrape_once(target)
    for _ in range(2):
        clock.advance(5)
        assert await app[SCRAPER_KEY].scrape_once(target)
    warnings = [
        r for r in caplog.records if r.name == "specwatch.scrape" and r.levelno >= logging.WARNING
    ]
    invalid = [r for r in warnings if event_fields(r).get("reason") == "invalid_series"]
    assert len(invalid) == 1  # the same count on the next page logs nothing
    assert event_fields(invalid[0])["count"] == 1

    resp = await client.get("/api/v1/snapshot")
    doc = json.loads(await resp.text(), parse_constant=_no_constants)
    server = doc["targets"]["fly"]["windows"]["since_start"]["server"]
    assert server["acceptance_rate"] == pytest.approx(8 / 16)  # (13-5)/(36-20)
    assert server["mean_acceptance_length"] is None  # drafts unknown: never 1 + 8/inf = 1.0
    assert server["drafts"] is None

    text = await (await client.get("/metrics")).text()
    labels = {"target": "fly", "reason": "invalid_series"}
    assert _sample(text, "specwatch_scrape_errors_total", labels) == 2
    tau = _sample(text, "specwatch_mean_acceptance_length", {"target": "fly"})
    assert tau is None


def _spec_page(drafts: float, draft_tokens: float, accepted: float, k: int = 3) -> str:
    """A page with K per-position series (all 0) and the three spec-decode counters."""
    pos = "\n".join(
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{LBL},position="{i}"}} 0'
        for i in range(k)
    )
    return (
        "# TYPE vllm:spec_decode_num_drafts counter\n"
        f"vllm:spec_decode_num_drafts_total{{{LBL}}} {drafts}\n"
        "# TYPE vllm:spec_decode_num_draft_tokens counter\n"
        f"vllm:spec_decode_num_draft_tokens_total{{{LBL}}} {draft_tokens}\n"
        "# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
        f"vllm:spec_decode_num_accepted_tokens_total{{{LBL}}} {accepted}\n"
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter\n"
        f"{pos}\n"
    )


def test_impossible_ratios_are_withheld_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    """Over the window 0 → 10 s: 10 drafts, 30 draft tokens, 45 accepted (K 3 from the position
    labels). α = 45/30 = 1.5 > 1 and τ = 1 + 45/10 = 5.5 > K + 1 = 4: both withheld (None),
    ℓ = 30/10 = 3 kept; the page is counted once per reason, with one warning line; a second
    such page counts again without a second line."""
    tracker = TargetTracker(TargetSettings(name="fly", url="http://h:1"), {"1m": 60.0})
    tracker.record_page(0.0, parse_page(_spec_page(0, 0, 0)), duration_seconds=None)
    with caplog.at_level(logging.WARNING, logger="specwatch"):
        tracker.record_page(10.0, parse_page(_spec_page(10, 30, 45)), duration_seconds=None)
        snap = tracker.snapshot()
        h = snap.windows["1m"]["m"].server
        assert (h.acceptance_rate, h.mean_acceptance_length) == (None, None)
        assert h.mean_draft_length == 3.0
        assert h.withheld == ("acceptance_above_one", "tau_above_k_plus_one")
        # both windows (1m and since_start) withheld on this page: the page counts once
        assert dict(snap.invalid_values) == {"acceptance_above_one": 1, "tau_above_k_plus_one": 1}
        tracker.record_page(20.0, parse_page(_spec_page(20, 60, 90)), duration_seconds=None)
    assert dict(tracker.snapshot().invalid_values) == {
        "acceptance_above_one": 2,
        "tau_above_k_plus_one": 2,
    }
    lines = [r for r in caplog.records if r.getMessage().startswith("derived values withheld")]
    assert len(lines) == 1
    assert event_fields(lines[0])["reasons"] == ["acceptance_above_one", "tau_above_k_plus_one"]


def test_valid_values_are_published() -> None:
    """α = 18/30 = 0.6, τ = 1 + 18/10 = 2.8 ≤ 4: published, nothing withheld or counted."""
    tracker = TargetTracker(TargetSettings(name="fly", url="http://h:1"), {"1m": 60.0})
    tracker.record_page(0.0, parse_page(_spec_page(0, 0, 0)), duration_seconds=None)
    tracker.record_page(10.0, parse_page(_spec_page(10, 30, 18)), duration_seconds=None)
    h = tracker.snapshot().windows["1m"]["m"].server
    assert (h.acceptance_rate, h.mean_acceptance_length, h.withheld) == (0.6, 2.8, ())
    assert dict(tracker.snapshot().invalid_values) == {}
