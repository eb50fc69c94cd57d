"""Every panel query of every Grafana dashboard, run by a real Prometheus against live data.

Prometheus (Debian ``prometheus``, 1 s scrape and evaluation, temp storage, free port) scrapes
specwatch and the two simulated vLLM servers the way ``deploy/base/podmonitor.yaml`` does: one
``job`` (``<namespace>/vllm-pair``, prometheus-operator's PodMonitor job name) and ``namespace``
on every target, ``container`` per endpoint and ``role`` on the vLLM endpoints. It loads the
mixin (``deploy/mixin/specwatch.rules.yaml``, time-scaled as in
``tests/e2e/test_prometheus_stack.py`` so ``for`` durations pass within the test).

specwatch runs with its default settings for everything a dashboard reads (core ``windows``,
``paired.windows``, labels, port); only timing knobs are shortened so the test ends in seconds
(scrape and paired-refresh interval 0.5 s, alert evaluation 0.5 s, ``target_down_for`` 1 s). It
samples in canary mode (the simulator's built-in canary items with their gold answers, looped)
over standard, FLy and a noise arm, and runs the alerting component. The standard simulator runs
with vLLM's ``--max-num-queued-reqs`` and the test sends it a burst above that limit, so
``vllm:admission_rejections_total`` counts real refusals. Once every non-alert panel has data,
``POST /admin/faults`` makes the noise simulator's ``/metrics`` fail, so ``SpecwatchTargetDown``
fires in both specwatch and Prometheus and the alert panels have data.

Grafana variables are resolved as Grafana resolves them on first open: the saved ``current``
value when it is among the options (``All`` = the variable's ``allValue``), else the first
option; query variables' options come from their ``label_values`` query against this
Prometheus, downstream variables re-resolved after upstream ones; ``$__rate_interval`` is 4 ×
the scrape interval. Every panel query must parse (``status: success``) and return data at the
dashboards' default values, and again with each option of each variable (the others at their
defaults); a panel may be empty only when its description says when (``Empty when ...``).
Counters with known reasons (admission rejections, excluded pairs, ledger write errors) have
data from their 0-valued series before any event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp.test_utils import TestServer

from deploy.mixin.render import load_rules
from specwatch.alerts.settings import AlertingSettings, DetectSettings
from specwatch.server.app import build_app
from specwatch.server.wiring import AlertingPlug, ShadowPlug
from specwatch.settings import Settings
from specwatch.simulate.config import Role, SimConfig
from specwatch.simulate.launcher import SimulatorHandle, start_simulator
from specwatch.simulate.loadgen import LoadConfig, LoadGenerator
from tests.e2e.test_prometheus_stack import host, scaled_rules
from tests.fakes import REPO, free_port
from tests.fakes.prometheus import run_prometheus
from tests.fakes.wait import poll

pytestmark = [pytest.mark.promtool, pytest.mark.timeout(400)]

ROOT = REPO
DASHBOARDS = sorted((ROOT / "grafana").glob("*.json"))
NAMESPACE = "specwatch-ci"
JOB = f"{NAMESPACE}/vllm-pair"
SCRAPE_SECONDS = 1
#: Grafana's ``$__rate_interval`` is at least 4 × the scrape interval.
GLOBALS = {"__rate_interval": f"{4 * SCRAPE_SECONDS}s", "__interval": "1s", "__range": "1m"}
#: Series that only exist after a fault, restart or failed pair (produced by :func:`faults`).
CONDITIONAL = (
    "ALERTS",
    "specwatch_alert_firing",
    "specwatch_engine_resets_total",
    "specwatch_shadow_unpaired_total",
)
#: The standard simulator's ``--max-num-queued-reqs``: well above the steady load (8 closed-loop
#: clients plus the canary stream), below :data:`BURST` requests on top of it.
QUEUE_LIMIT = 32
BURST = QUEUE_LIMIT + 16

Obj = dict[str, Any]


def panels(dashboard: Obj) -> list[tuple[str, str, Obj]]:
    """(where, raw expr, panel) for every target of every panel, rows' nested panels included."""
    out = []
    for panel in dashboard["panels"]:
        for p in [panel, *panel.get("panels", [])]:
            for t in p.get("targets", []):
                where = f"{dashboard['uid']} panel {p['id']} {p['title']!r} {t['refId']}"
                out.append((where, t["expr"], p))
    return out


def substitute(expr: str, values: dict[str, str]) -> str:
    def repl(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        assert name in values, f"no value for ${name}"
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", repl, expr)


async def api(session: aiohttp.ClientSession, url: str, path: str, params: Any) -> Obj:
    """A Prometheus API call's JSON body (``status`` ``success`` or ``error``, any HTTP code)."""
    async with session.get(f"{url}{path}", params=params) as resp:
        body: Obj = await resp.json()
        return body


async def variable_options(
    session: aiohttp.ClientSession, url: str, var: Obj, values: dict[str, str]
) -> list[str]:
    """What Grafana offers for ``var`` given the upstream ``values``, in Grafana's order: a
    custom variable's options; for a query variable, ``All`` (its ``allValue``) when
    ``includeAll`` is set, then the values of ``label_values(selector, label)`` in this
    Prometheus, sorted."""
    if var["type"] == "custom":
        return [o["value"] for o in var["options"]]
    assert var["type"] == "query", var
    m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["query"]["query"])
    assert m, var["query"]
    body = await api(session, url, "/api/v1/series", {"match[]": substitute(m[1], values)})
    assert body["status"] == "success", body
    found = sorted({s[m[2]] for s in body["data"] if m[2] in s})
    return ([var["allValue"]] if var.get("includeAll") else []) + found


def default_value(var: Obj, options: list[str]) -> str | None:
    """Grafana's value on first open: the saved ``current`` when it is one of the options (a
    saved ``$__all`` means the ``allValue``), else the first option; ``None`` when there is none."""
    current = var.get("current", {}).get("value")
    if current == "$__all" and var.get("includeAll"):
        current = var["allValue"]
    if current in options:
        return str(current)
    return options[0] if options else None


async def variable_values(
    session: aiohttp.ClientSession, url: str, dashboard: Obj, chosen: dict[str, str] | None = None
) -> dict[str, str]:
    """Each template variable's value, resolved in dashboard order as Grafana does: ``chosen``
    where given, otherwise the dashboard's default (:func:`default_value`) among the options the
    upstream values leave; ``{}`` when a variable has no option at all."""
    chosen = chosen or {}
    values = dict(GLOBALS)
    for var in dashboard["templating"]["list"]:
        name = var["name"]
        if var["type"] == "datasource":
            continue
        if name in chosen:
            values[name] = chosen[name]
            continue
        value = default_value(var, await variable_options(session, url, var, values))
        if value is None:
            return {}
        values[name] = value
    return values


def empty_allowed(panel: Obj) -> bool:
    """A panel may be empty when its description says when (``Empty when ...``, ``empty until``)."""
    text = panel.get("description", "")
    return re.search(r"\bempty (when|until|while|before|unless|if)\b", text, re.I) is not None


async def empty_at(
    session: aiohttp.ClientSession,
    url: str,
    dashboard: Obj,
    values: dict[str, str],
    label: str,
    retries: int = 0,
) -> list[str]:
    """Panel queries of ``dashboard`` that return nothing at ``values`` and whose panel does not
    say when it is empty (a query that does not parse fails the test). An empty query is asked
    again up to ``retries`` times, a scrape interval apart: on a loaded machine Prometheus can
    miss one scrape of the sidecar (1 s timeout), which empties every specwatch_* panel at once
    for that instant; a panel that is empty for its options stays empty."""
    empty = []
    for where, raw, panel in panels(dashboard):
        if not values:
            empty.append(f"{where} [{label}] (variables unresolved)")
            continue
        expr = substitute(raw, values)
        for attempt in range(1 + retries):
            if attempt:
                await asyncio.sleep(1)  # one scrape interval: a missed scrape of a loaded sidecar
            body = await api(session, url, "/api/v1/query", {"query": expr})
            assert body["status"] == "success", f"{where}: {expr}: {body}"
            if body["data"]["result"] or empty_allowed(panel):
                break
        else:
            empty.append(f"{where} [{label}]: {expr}")
    return empty


async def empty_panels(session: aiohttp.ClientSession, url: str) -> list[str]:
    """Panel queries that return no data now at each dashboard's default variable values."""
    empty = []
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        values = await variable_values(session, url, dashboard)
        empty += await empty_at(session, url, dashboard, values, "defaults")
    return empty


async def empty_at_every_option(session: aiohttp.ClientSession, url: str) -> list[str]:
    """Panel queries that return no data with one variable set to one of its options and the
    others at their defaults (downstream variables re-resolved), for every option of every
    variable of every dashboard."""
    empty = []
    for path in DASHBOARDS:
        dashboard = json.loads(path.read_text(encoding="utf-8"))
        defaults = await variable_values(session, url, dashboard)
        assert defaults, f"{path.name}: variables unresolved at their defaults"
        for var in dashboard["templating"]["list"]:
            if var["type"] == "datasource":
                continue
            upstream = {}
            for earlier in dashboard["templating"]["list"]:
                if earlier["name"] == var["name"]:
                    break
                if earlier["type"] != "datasource":
                    upstream[earlier["name"]] = defaults[earlier["name"]]
            options = await variable_options(session, url, var, {**GLOBALS, **upstream})
            for option in options:
                chosen = {**upstream, var["name"]: option}
                values = await variable_values(session, url, dashboard, chosen)
                label = f"${var['name']}={option}"
                empty += await empty_at(session, url, dashboard, values, label, retries=5)
    return empty


@contextlib.asynccontextmanager
async def prometheus(tmp: Path, session: aiohttp.ClientSession, targets: Obj) -> AsyncIterator[str]:
    """Prometheus scraping ``targets`` (container → (url, role or None)) as one PodMonitor job."""
    rules = tmp / "rules.yaml"
    rules.write_text(yaml.safe_dump(scaled_rules(load_rules()), sort_keys=False))
    static = []
    for container, (url, role) in targets.items():
        labels = {"namespace": NAMESPACE, "container": container, "pod": "vllm-pair-0"}
        if role is not None:
            labels["role"] = role
        static.append({"targets": [host(url)], "labels": labels})
    config = {
        "global": {
            "scrape_interval": f"{SCRAPE_SECONDS}s",
            "evaluation_interval": f"{SCRAPE_SECONDS}s",
            "scrape_timeout": f"{SCRAPE_SECONDS}s",
        },
        "rule_files": [str(rules)],
        "scrape_configs": [
            {
                "job_name": "vllm-pair",
                "static_configs": static,
                # what prometheus-operator does for a PodMonitor: job = <namespace>/<name>
                "relabel_configs": [{"target_label": "job", "replacement": JOB}],
            }
        ],
    }
    async with run_prometheus(tmp, config, session) as url:
        yield url


@contextlib.asynccontextmanager
async def simulated_pair(
    session: aiohttp.ClientSession,
) -> AsyncIterator[dict[str, SimulatorHandle]]:
    """Standard, FLy and noise simulators; closed-loop load on standard and FLy."""
    sims = {
        "standard": await start_simulator(
            SimConfig(role=Role.STANDARD, seed=1, max_num_queued_reqs=QUEUE_LIMIT), port=0
        ),
        "fly": await start_simulator(SimConfig(role=Role.FLY, seed=1), port=0),
        "noise": await start_simulator(SimConfig(role=Role.STANDARD, seed=2), port=0),
    }
    load = LoadGenerator(
        [sims["standard"].url, sims["fly"].url],
        LoadConfig(concurrency=8, duration_s=None, fanout=True, max_tokens=48, temperature=1.0),
        session=session,
    )
    task = asyncio.create_task(load.run())
    try:
        yield sims
    finally:
        load.stop()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for sim in sims.values():
            await sim.stop()


async def admission_burst(session: aiohttp.ClientSession, url: str) -> list[int]:
    """:data:`BURST` concurrent long completions (256 tokens, ``ignore_eos``) to ``url``; their
    HTTP statuses. More than ``QUEUE_LIMIT`` are in flight at once, so some are refused (503)."""

    async def one(i: int) -> int:
        body = {"prompt": f"burst {i}", "max_tokens": 256, "ignore_eos": True}
        async with session.post(f"{url}/v1/completions", json=body) as resp:
            await resp.read()
            return resp.status

    return list(await asyncio.gather(*(one(i) for i in range(BURST))))


async def faults(session: aiohttp.ClientSession, sims: dict[str, SimulatorHandle]) -> None:
    """The conditions the alert and restart panels need: the noise simulator's ``/metrics``
    answers 500 and its completions fail (``SpecwatchTargetDown``), and the FLy simulator
    restarts (counters reset: an engine reset) and fails one completion in five (unpaired
    pairs, reason ``fly_*``)."""
    url = f"{sims['noise'].url}/admin/faults"
    patch = {"metrics_mode": "error", "completion_error_rate": 1.0}
    async with session.post(url, json=patch) as resp:
        assert resp.status == 200, await resp.text()
    async with session.post(f"{sims['fly'].url}/admin/restart") as resp:
        assert resp.status == 200, await resp.text()
    fly = f"{sims['fly'].url}/admin/faults"
    async with session.post(fly, json={"completion_error_rate": 0.2}) as resp:
        assert resp.status == 200, await resp.text()


def sidecar_settings(sims: dict[str, SimulatorHandle], tmp: Path) -> Settings:
    return Settings.model_validate(
        {
            "targets": [
                {
                    "name": name,
                    "url": s.url,
                    "role": "standard" if name == "noise" else name,
                    "max_num_seqs": 256,
                    "max_num_batched_tokens": 8192,
                    "method": "eagle3",
                    "num_speculative_tokens": 4,
                }
                for name, s in sims.items()
            ],
            "scrape": {"interval_seconds": 0.5, "timeout_seconds": 0.5},
            "shadow": {
                "enabled": True,
                "modes": ["canary"],
                "canary_builtin": True,
                "canary_loop": True,
                "canary_rate_per_second": 50.0,
                "max_shadow_rps": 200.0,
                "standard": {"target": "standard"},
                "fly": {"target": "fly"},
                "noise": {"target": "noise"},
                "noise_kind": "standard",
            },
            "ledger": {"path": str(tmp / "ledger.db")},
            "paired": {"refresh_seconds": 0.5},
            # an Alertmanager nobody answers at: the delivery panels (outbox, send errors per
            # peer) have data only where alerting.urls names one
            "alerting": AlertingSettings(
                evaluation_interval=0.5, urls=[f"http://127.0.0.1:{free_port()}"]
            ),
            "detect": DetectSettings(target_down_for=1.0),
        }
    )


@pytest.mark.slow
async def test_every_panel_query_returns_data(tmp_path: Path) -> None:
    """Every Grafana panel query returns data from a real Prometheus scraping the sidecar and
    simulators."""
    async with aiohttp.ClientSession() as session, simulated_pair(session) as sims:
        settings = sidecar_settings(sims, tmp_path)
        shadow = ShadowPlug(settings)
        alerting = AlertingPlug(settings)
        server = TestServer(build_app(settings, components=[shadow, alerting]), port=0)
        await server.start_server()
        specwatch = f"http://127.0.0.1:{server.port}"
        try:
            targets = {
                "specwatch": (specwatch, None),
                "vllm-standard": (sims["standard"].url, "standard"),
                "vllm-fly": (sims["fly"].url, "fly"),
            }
            async with prometheus(tmp_path, session, targets) as prom:
                statuses = await admission_burst(session, sims["standard"].url)
                assert set(statuses) == {200, 503}, statuses
                faulted = False
                last: list[str] = []

                async def all_have_data() -> bool | None:
                    nonlocal faulted, last
                    last = await empty_panels(session, prom)
                    left = last
                    if not faulted and all(any(n in e for n in CONDITIONAL) for e in left):
                        await faults(session, sims)
                        faulted = True
                    return True if not left else None

                try:
                    await poll("every panel query returns data", all_have_data, within=75, every=1)
                except AssertionError as err:
                    raise AssertionError(f"{err}; still empty: {last}") from None
                assert faulted
                refused = statuses.count(503)

                async def rejections_scraped() -> float | None:
                    query = (
                        'vllm:admission_rejections_total{container="vllm-standard",'
                        'reason="max_num_queued_reqs"}'
                    )
                    body = await api(session, prom, "/api/v1/query", {"query": query})
                    result = body["data"]["result"]
                    value = float(result[0]["value"][1]) if result else 0.0
                    return value if value >= refused else None

                assert await poll("rejections scraped", rejections_scraped, within=10) >= refused
                empty = await empty_at_every_option(session, prom)
                assert not empty, "\n".join(empty)
        finally:
            await server.close()
