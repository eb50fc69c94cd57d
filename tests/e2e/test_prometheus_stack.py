"""End to end with a real Prometheus evaluating the mixin: Prometheus scrapes the two simulated
vLLM servers (job ``vllm``, ``role`` label per target as the mixin requires) and specwatch (job
``specwatch``), loads a time-scaled copy of ``deploy/mixin/specwatch.rules.yaml``, and the
faults injected through ``POST /admin/faults`` fire the matching Prometheus alerts
(``/api/v1/alerts``), which clear with the fault.

Time scaling (:func:`scaled_rules`, the only change to the mixin): every duration in a range
selector ``[d]`` and in a ``window="d"`` label matcher is divided by 60 (``5m`` → ``5s``,
``15m`` → ``15s``, ``1h`` → ``1m``) and every ``for`` becomes ``1s``. Expressions are otherwise
the mixin's, character for character (checked). specwatch runs with windows ``5s`` and ``15s``
so the scaled ``window`` matchers select its series.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from deploy.mixin.render import load_rules
from specwatch.alerts.settings import AlertingSettings, DetectSettings
from tests.e2e.stack import Stack, running_stack
from tests.fakes.prometheus import run_prometheus
from tests.fakes.wait import poll

pytestmark = pytest.mark.promtool

_RANGE = re.compile(r"\[(\d+)([mh])\]")
_WINDOW = re.compile(r'window="(\d+)([mh])"')


def _scaled(amount: str, unit: str) -> str:
    seconds = int(amount) * (60 if unit == "m" else 3600) // 60
    return f"{seconds}s" if seconds < 60 else f"{seconds // 60}m"


def scaled_rules(rules: dict[str, Any]) -> dict[str, Any]:
    """The mixin with every duration divided by 60 and ``for: 1s`` (see the module docstring)."""
    out: dict[str, Any] = {"groups": []}
    for group in rules["groups"]:
        new_rules = []
        for rule in group["rules"]:
            rule = dict(rule)
            expr = _RANGE.sub(lambda m: f"[{_scaled(m[1], m[2])}]", rule["expr"])
            rule["expr"] = _WINDOW.sub(lambda m: f'window="{_scaled(m[1], m[2])}"', expr)
            if "for" in rule:
                rule["for"] = "1s"
            new_rules.append(rule)
        out["groups"].append({**group, "rules": new_rules})
    return out


def _durations_blanked(expr: str) -> str:
    return re.sub(r'window="\d+[smh]"', 'window="D"', re.sub(r"\[\d+[smh]\]", "[D]", expr))


def test_scaling_changes_only_durations() -> None:
    """Scaling the rules for the test stack changes only durations, never the rest of a rule."""
    rules = load_rules()
    scaled = scaled_rules(rules)
    pairs = [
        (a, b)
        for ga, gb in zip(rules["groups"], scaled["groups"], strict=True)
        for a, b in zip(ga["rules"], gb["rules"], strict=True)
    ]
    assert pairs
    for a, b in pairs:
        assert _durations_blanked(a["expr"]) == _durations_blanked(b["expr"])
        assert {k: v for k, v in a.items() if k not in ("expr", "for")} == {
            k: v for k, v in b.items() if k not in ("expr", "for")
        }
    exprs = " ".join(r["expr"] for _, r in pairs)
    for present in ("[5s]", "[1m]", "[15s]", 'window="5s"'):
        assert present in exprs
    for gone in ("[5m]", "[1h]", "[15m]", 'window="5m"'):
        assert gone not in exprs


def host(url: str) -> str:
    """``host:port`` of a base URL (a scrape target)."""
    return url.split("://", 1)[1]


@contextlib.asynccontextmanager
async def prometheus(tmp: Path, stack: Stack) -> AsyncIterator[str]:
    rules = tmp / "rules.yaml"
    rules.write_text(yaml.safe_dump(scaled_rules(load_rules()), sort_keys=False))
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": "vllm",
                "static_configs": [
                    {"targets": [host(stack.standard.url)], "labels": {"role": "standard"}},
                    {"targets": [host(stack.fly.url)], "labels": {"role": "fly"}},
                ],
            },
            {"job_name": "specwatch", "static_configs": [{"targets": [host(stack.specwatch_url)]}]},
        ],
    }
    async with run_prometheus(tmp, config, stack.session) as url:
        yield url


async def _alerts(session: aiohttp.ClientSession, url: str) -> list[dict[str, Any]]:
    async with session.get(f"{url}/api/v1/alerts") as resp:
        resp.raise_for_status()
        alerts: list[dict[str, Any]] = (await resp.json())["data"]["alerts"]
        return alerts


def _matching(
    alerts: list[dict[str, Any]], state: str | None = None, **labels: str
) -> list[dict[str, Any]]:
    """Alerts with these labels (and this ``state``: ``pending`` or ``firing``, when given)."""
    return [
        a
        for a in alerts
        if (state is None or a["state"] == state)
        and all(a["labels"].get(k) == v for k, v in labels.items())
    ]


async def _first(session: aiohttp.ClientSession, url: str, alertname: str) -> dict[str, Any] | None:
    """The first ``alertname`` alert Prometheus lists as firing, or ``None``."""
    got = _matching(await _alerts(session, url), state="firing", alertname=alertname)
    return got[0] if got else None


async def _query(session: aiohttp.ClientSession, url: str, expr: str) -> list[dict[str, Any]]:
    async with session.get(f"{url}/api/v1/query", params={"query": expr}) as resp:
        resp.raise_for_status()
        result: list[dict[str, Any]] = (await resp.json())["data"]["result"]
        return result


@pytest.mark.slow
async def test_mixin_alerts_fire_on_injected_faults(tmp_path: Path) -> None:
    """The mixin's alerts fire in a real Prometheus on injected simulator faults, for the faulted
    role only."""
    async with (
        running_stack(
            alerting=AlertingSettings(evaluation_interval=0.5),
            detect=DetectSettings(),
            windows=("5s", "15s"),
        ) as stack,
        prometheus(tmp_path, stack) as prom,
    ):
        session = stack.session

        async def baseline() -> bool | None:
            # recording-rule names keep the mixin's (unscaled) names
            got = await _query(session, prom, "instance:vllm_spec_decode_acceptance:ratio_rate1h")
            roles = {r["metric"].get("role") for r in got}
            return True if roles == {"standard", "fly"} else None

        await poll("recording rules for both roles", baseline, within=60)
        firing = _matching(await _alerts(session, prom), alertname="SpecAcceptanceDrop")
        assert firing == []

        # FLy's drafts get worse: the mixin's server-scope SpecAcceptanceDrop fires for fly only.
        await stack.fault(stack.fly, {"draft_noise_multiplier": 6.0})

        drop = await poll(
            "SpecAcceptanceDrop firing in Prometheus",
            lambda: _first(session, prom, "SpecAcceptanceDrop"),
            within=60,
        )
        assert drop["labels"]["role"] == "fly"
        assert drop["labels"]["scope"] == "server"
        assert drop["labels"]["job"] == "vllm"
        assert drop["labels"]["model_name"] == "sim-model"
        assert drop["labels"]["instance"] == host(stack.fly.url)
        assert float(drop["value"]) < 0.8
        assert drop["annotations"]["runbook_url"].endswith("#specacceptancedrop")
        # FLy now accepts less than standard: the fleet-wide FLy gain rule fires as well
        gain = await poll(
            "SpecFLyGainLost firing in Prometheus",
            lambda: _first(session, prom, "SpecFLyGainLost"),
            within=60,
        )
        assert gain["labels"]["model_name"] == "sim-model"
        assert float(gain["value"]) < 0.02

        # /metrics of the standard server answers 500: specwatch reports it down, and the
        # mixin's SpecwatchTargetDown fires from specwatch's own series.
        await stack.fault(stack.standard, {"metrics_mode": "error"})

        down = await poll(
            "SpecwatchTargetDown firing in Prometheus",
            lambda: _first(session, prom, "SpecwatchTargetDown"),
            within=60,
        )
        assert down["labels"]["target"] == "standard"
        assert down["labels"]["role"] == "standard"
        assert down["labels"]["job"] == "specwatch"

        # Clear both faults: both alerts go away.
        await stack.fault(stack.fly, None)
        await stack.fault(stack.standard, None)

        async def cleared() -> bool | None:
            alerts = await _alerts(session, prom)
            left = _matching(alerts, alertname="SpecAcceptanceDrop") + _matching(
                alerts, alertname="SpecwatchTargetDown"
            )
            return True if not left else None

        await poll("both alerts cleared", cleared, within=80)
