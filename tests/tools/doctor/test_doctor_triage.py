"""``specwatch doctor``'s reading order and Grafana's built-in intervals."""

from __future__ import annotations

from specwatch.tools.doctor.command import Finding, grafana_builtins, scrape_seconds, triage


def test_rate_interval_is_grafanas_rule() -> None:
    """``$__rate_interval`` = max(``$__interval`` + scrape, 4 × scrape) with ``$__interval`` the
    scrape interval: 60 s at Grafana's default 15 s scrape (not 5m), 4 s at 1 s, 2 m at 30 s."""
    assert grafana_builtins()["__rate_interval"] == "60s"
    assert grafana_builtins(1.0)["__rate_interval"] == "4s"
    assert grafana_builtins(30.0)["__rate_interval"] == "120s"
    assert grafana_builtins(30.0)["__interval_ms"] == "30000"


def test_scrape_interval_of_the_specwatch_targets() -> None:
    """The longest ``scrapeInterval`` of the targets whose job matches; 15 s when none."""
    targets = {
        "activeTargets": [
            {"labels": {"job": "ns/vllm-pair"}, "scrapeInterval": "30s"},
            {"labels": {"job": "ns/vllm-pair"}, "scrapeInterval": "15s"},
            {"labels": {"job": "node"}, "scrapeInterval": "1m"},
        ]
    }
    assert scrape_seconds(targets, ".+/vllm-pair") == 30.0
    assert scrape_seconds({"activeTargets": []}, ".+/vllm-pair") == 15.0


def test_root_cause_first_and_follow_ons_counted() -> None:
    """No specwatch target up: the targets FAIL is the first line, the 40 dashboard FAILs become
    one line saying they follow from it, a WARN repeated 3 times is one line (x3), OK lines last."""
    findings = [
        Finding("ok", "rules", "rule group specwatch-a is loaded"),
        *[Finding("fail", "dashboard", f"D / panel {i}: no data for q{i}") for i in range(40)],
        *[Finding("warn", "dashboard", "D / Alerts: no data (Empty when none fires)")] * 3,
        Finding("fail", "targets", "Prometheus has no target whose job matches 'x'"),
    ]
    got = triage(findings)
    assert got == [
        Finding("fail", "targets", "Prometheus has no target whose job matches 'x'"),
        Finding(
            "fail",
            "dashboard",
            "40 dashboard queries have no data: they follow from the targets failure above "
            "(no specwatch target is up); fix it and run doctor again",
        ),
        Finding("warn", "dashboard", "D / Alerts: no data (Empty when none fires) (x3)"),
        Finding("ok", "rules", "rule group specwatch-a is loaded"),
    ]


def test_independent_failures_stay_named() -> None:
    """One specwatch target up and one down: a dashboard FAIL is its own finding (not a
    follow-on), listed after the targets FAIL."""
    findings = [
        Finding("fail", "dashboard", "D / Missing: no data for x"),
        Finding("ok", "targets", "specwatch target a is up"),
        Finding("fail", "targets", "specwatch target b is down: refused"),
    ]
    assert [f.message for f in triage(findings)] == [
        "specwatch target b is down: refused",
        "D / Missing: no data for x",
        "specwatch target a is up",
    ]
