"""The mixin's alerts and the sidecar's own (the ones it pushes to Alertmanager) are the same
set: the mixin rendered with jsonnet (deploy/mixin/render.py) against the sidecar's catalogue
(:data:`specwatch.alerts.values.ALERT_NAMES`), which in turn is every name
:mod:`specwatch.alerts.rules` builds an alert with; differences only in the written
allow-list :data:`~specwatch.alerts.values.RULES_ONLY_ALERTS`."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from deploy.mixin.render import evaluate_mixin, prometheus_duration
from specwatch.alerts import quality as quality_module
from specwatch.alerts import rules as rules_module
from specwatch.alerts.pending import for_seconds
from specwatch.alerts.rules import NOT_ONE_SERVER_WINDOW_SECONDS, candidates
from specwatch.alerts.settings import DetectSettings
from specwatch.alerts.values import ALERT_NAMES, CAUSE_ALERTS, RULES_ONLY_ALERTS
from specwatch.observe.settings import TargetSettings
from specwatch.observe.tracker import TargetTracker, build_view

pytest.importorskip("_jsonnet")


def _mixin_alerts() -> list[dict[str, Any]]:
    """The alerting rules of the mixin as jsonnet renders it with the default settings."""
    groups = evaluate_mixin()["prometheusAlerts"]["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


def _sidecar_names() -> set[str]:
    """Every alert name :mod:`specwatch.alerts.rules` and :mod:`specwatch.alerts.quality` (the
    shadow detectors rules.py calls) pass to ``Alert(...)``."""
    names: set[str] = set()
    nodes = [
        node
        for module in (rules_module, quality_module)
        for node in ast.walk(ast.parse(Path(str(module.__file__)).read_text("utf-8")))
    ]
    for node in nodes:
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Alert":
            first = node.args[0]
            assert isinstance(first, ast.Constant), ast.dump(first)
            assert isinstance(first.value, str), ast.dump(first)
            names.add(first.value)
    return names


def test_every_mixin_alert_is_pushed_by_the_sidecar_but_the_allowed_ones() -> None:
    """Mixin names = the sidecar's catalogue + the rules-only allow-list (each with a written
    reason); the catalogue is exactly what the sidecar's rules build, no name twice."""
    mixin = {r["alert"] for r in _mixin_alerts()}
    assert len(ALERT_NAMES) == len(set(ALERT_NAMES))
    assert set(ALERT_NAMES) == _sidecar_names()
    assert set(RULES_ONLY_ALERTS) <= mixin
    assert not set(RULES_ONLY_ALERTS) & set(ALERT_NAMES)
    assert all(len(why) > 20 for why in RULES_ONLY_ALERTS.values())
    assert mixin - set(RULES_ONLY_ALERTS) == set(ALERT_NAMES)


#: What every rule named like a sidecar alert ends with (groupLabels at their default).
BACKSTOP = (
    "unless on (cluster, namespace) (max by (cluster, namespace) "
    "(specwatch_alertmanager_delivering) == 1)"
)


def test_rules_named_like_the_sidecars_alerts_fire_only_unless_it_delivers() -> None:
    """One loss, one page: each of the sidecar's alert names (all but the rules-only ones) is,
    as a rule, its expression ``unless`` a sidecar of the same cluster and namespace delivers;
    the rules-only alert has no such clause (nothing else would page it). The mixin's own list
    of rules-only alerts is the sidecar's allow-list."""
    config = evaluate_mixin()["_config"]
    assert set(config["rulesOnlyAlerts"]) == set(RULES_ONLY_ALERTS)
    rules = _mixin_alerts()
    backstops = {r["alert"] for r in rules if r["expr"].rstrip().endswith(BACKSTOP)}
    assert backstops == set(ALERT_NAMES)
    assert not any(
        "specwatch_alertmanager_delivering" in r["expr"]
        for r in rules
        if r["alert"] in RULES_ONLY_ALERTS
    )


def test_cause_bearing_rules_copy_the_sidecars_cause() -> None:
    """The rules that join ``specwatch_alert_cause`` are exactly the sidecar's cause-bearing
    alerts, each falling back to cause="unknown" and naming the cause in its description."""
    config = evaluate_mixin()["_config"]
    assert set(config["causeJoinLabels"]) == set(CAUSE_ALERTS)
    for rule in _mixin_alerts():
        joined = "specwatch_alert_cause" in rule["expr"]
        assert joined == (rule["alert"] in CAUSE_ALERTS), rule["alert"]
        if joined:
            assert f'specwatch_alert_cause{{alertname="{rule["alert"]}"}}' in rule["expr"]
            assert '"cause", "unknown"' in rule["expr"]
            assert "{{ $labels.cause }}" in rule["annotations"]["description"]


def test_not_one_server_has_the_mixins_window_hold_and_summary() -> None:
    """SpecwatchTargetNotOneServer: the mixin's ``[10m]`` window is the sidecar's 600 s, its
    ``for`` is ``target_down_for`` in both, its summary the sidecar's word for word (the alert
    the sidecar raises for a target with one refusal in the window)."""
    (rule,) = [r for r in _mixin_alerts() if r["alert"] == "SpecwatchTargetNotOneServer"]
    assert f"[{prometheus_duration(NOT_ONE_SERVER_WINDOW_SECONDS)}]" in rule["expr"]
    assert prometheus_duration(NOT_ONE_SERVER_WINDOW_SECONDS) == "10m"
    s = DetectSettings()
    assert rule["for"] == prometheus_duration(s.target_down_for)
    target = TargetTracker(TargetSettings(name="fly", url="http://lb:8000"), {}).snapshot()
    (alert,) = candidates(build_view([target], now=0.0), None, s, alternations={"fly": 1.0})
    assert alert.alertname == "SpecwatchTargetNotOneServer"
    assert alert.summary == rule["annotations"]["summary"]
    assert for_seconds(s)(alert) == s.target_down_for
