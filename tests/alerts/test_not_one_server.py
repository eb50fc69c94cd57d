"""``SpecwatchTargetNotOneServer`` raised by the sidecar's own evaluation, on the mixin's
condition (``increase(specwatch_scrape_errors_total{reason="counters_alternate"}[10m]) > 0``
held for ``target_down_for``), with the mixin's summary. Pages go through the real parser and
tracker, as a scrape would feed them."""

from __future__ import annotations

from specwatch.alerts.pending import Detector
from specwatch.alerts.rules import NOT_ONE_SERVER_WINDOW_SECONDS
from specwatch.alerts.settings import DetectSettings
from specwatch.observe.parse import parse_page
from specwatch.observe.settings import TargetSettings
from specwatch.observe.tracker import TargetTracker, build_view

SUMMARY = "A specwatch target URL answers with counters of more than one vLLM server."


def _page(drafts: int, start: float) -> str:
    lab = 'engine="0",model_name="m"'
    return (
        f"vllm:spec_decode_num_drafts_total{{{lab}}} {drafts}\n"
        f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {3 * drafts}\n"
        f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {2 * drafts}\n"
        f"vllm:generation_tokens_total{{{lab}}} {10 * drafts}\n"
        f"process_start_time_seconds {start}\n"
    )


def test_alternating_servers_fire_not_one_server_and_it_resolves_ten_minutes_later() -> None:
    """Scrapes every 30 s, ``target_down_for`` 60 s. Servers A (started 1.0e9) and B (1.1e9)
    answer in turn for 6 scrapes, then A alone: from A's second page (t=60) to A's first page
    after B's last (t=180, a start time seen before the latest) each is refused as
    ``counters_alternate``, 5 in all. The condition holds from t=60, so the alert fires at
    t=120 (60 s later) with ``target`` only and the mixin's summary; the last refusal (t=180)
    leaves the 10-minute window at t=780, so the alert is still there at t=750 and gone at
    t=780."""
    s = DetectSettings(target_down_for=60.0)
    tracker = TargetTracker(TargetSettings(name="fly", url="http://lb:8000/metrics"), {"1m": 60.0})
    detector = Detector(s)
    fired: dict[float, list[str]] = {}
    last = None
    for i in range(40):
        t = 30.0 * i
        if i < 6:
            drafts, start = ((1000 + 10 * i), 1.0e9) if i % 2 == 0 else (50 + 5 * i, 1.1e9)
        else:
            drafts, start = 1000 + 10 * i, 1.0e9
        tracker.record_page(t, parse_page(_page(drafts, start)), duration_seconds=0.01)
        view = build_view([tracker.snapshot()], now=t)
        alerts = detector.evaluate(view, None, t)
        fired[t] = sorted(a.alertname for a in alerts)
        for a in alerts:
            if a.alertname == "SpecwatchTargetNotOneServer":
                last = a
    assert tracker.snapshot().scrape_errors["counters_alternate"] == 5
    assert "SpecwatchTargetNotOneServer" not in fired[90.0]
    assert "SpecwatchTargetNotOneServer" in fired[120.0]
    assert "SpecwatchTargetNotOneServer" in fired[750.0]
    assert "SpecwatchTargetNotOneServer" not in fired[780.0]
    assert last is not None
    assert last.summary == SUMMARY
    assert dict(last.labels) == {"target": "fly"}
    assert NOT_ONE_SERVER_WINDOW_SECONDS == 600.0
