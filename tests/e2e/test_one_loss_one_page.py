"""One loss, one page, with real Prometheus and Alertmanager and the shipped rules unchanged.

The sidecar pushes its own alerts to Alertmanager and the mixin has rules of the same names;
each such rule fires only ``unless`` a sidecar of its cluster and namespace exports
``specwatch_alertmanager_delivering`` 1. Two ``specwatch run`` processes watch the same pair of
simulators, whose FLy server answers every canary item wrong (``wrong_answer_rate`` 1), one in
namespace ``a`` pushing to the real Alertmanager, one in namespace ``b`` pushing to an address
where nothing listens. Prometheus scrapes both (1 s) and evaluates
``deploy/mixin/specwatch.rules.yaml`` as rendered (SpecQualityDrift has ``for: 0s``: no hold to
wait for). Alertmanager routes everything to a webhook on 127.0.0.1.

- Namespace ``a``: the webhook gets SpecQualityDrift from the sidecar's push only (no ``job``
  label: Prometheus's copies carry the scraped series' ``job``), one label set per loss
  (hypothesis, category), and Prometheus holds no SpecQualityDrift although its e-value is over
  the page bound.
- Namespace ``b``: the sidecar's push fails, so the rule's SpecQualityDrift reaches the webhook.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specwatch.simulate.config import Role, SimConfig
from specwatch.simulate.launcher import SimulatorHandle, start_simulator
from specwatch.simulate.quiz import write_canary_jsonl
from tests.fakes import REPO, free_port
from tests.fakes.alertmanager import Webhook, hook_route, running_alertmanager
from tests.fakes.prometheus import run_prometheus
from tests.fakes.wait import poll
from tests.sidecar_process import run_config, specwatch_process

pytestmark = [pytest.mark.promtool, pytest.mark.slow, pytest.mark.timeout(300)]

Obj = dict[str, Any]
RULES = REPO / "deploy" / "mixin" / "specwatch.rules.yaml"


@contextlib.asynccontextmanager
async def faulty_pair() -> AsyncIterator[dict[str, SimulatorHandle]]:
    """Standard and FLy simulators; FLy's model favours a wrong answer to every item."""
    sims = {
        "standard": await start_simulator(SimConfig(role=Role.STANDARD, seed=1), port=0),
        "fly": await start_simulator(SimConfig(role=Role.FLY, seed=1), port=0),
    }
    try:
        async with aiohttp.ClientSession() as s:
            url = f"{sims['fly'].url}/admin/faults"
            async with s.post(url, json={"wrong_answer_rate": 1.0}) as r:
                assert r.status == 200, await r.text()
        yield sims
    finally:
        for sim in sims.values():
            await sim.stop()


def sidecar_config(
    tmp: Path, port: int, sims: dict[str, SimulatorHandle], am: str, ns: str
) -> Path:
    """``specwatch run``'s file: both simulators, the simulator's canary items (gold answers the
    standard server gets right) at 20/s, alerts every 0.5 s (the quality hold 1 s) to ``am``
    with ``namespace`` ``ns``."""
    canary = tmp / "canary.jsonl"
    write_canary_jsonl(canary, variants=4, temperature=1.0, seed=1)
    return run_config(
        tmp,
        port,
        targets=[
            {"name": role, "url": sim.url, "role": role, "method": "eagle3"}
            for role, sim in sims.items()
        ],
        scrape={"interval_seconds": 0.5, "timeout_seconds": 0.5},
        shadow={
            "enabled": True,
            "modes": ["canary"],
            "canary_file": str(canary),
            "canary_loop": True,
            "canary_rate_per_second": 20.0,
            "max_shadow_rps": 50.0,
            "standard": {"target": "standard"},
            "fly": {"target": "fly"},
        },
        paired={"refresh_seconds": 0.5},
        alerting={
            "urls": [am],
            "namespace": ns,
            "evaluation_interval": 0.5,
            "resend_interval": 1.0,
            "timeout": 1.0,
            "max_attempts": 1,
        },
        detect={"quality_e_value_for": 1.0},
    )


async def query(session: aiohttp.ClientSession, prom: str, expr: str) -> list[Obj]:
    async with session.get(f"{prom}/api/v1/query", params={"query": expr}) as r:
        body: Obj = await r.json()
    assert body["status"] == "success", (expr, body)
    result: list[Obj] = body["data"]["result"]
    return result


def drift_alerts(hook: Webhook, ns: str) -> list[dict[str, str]]:
    """Label sets of every SpecQualityDrift alert of namespace ``ns`` the webhook received."""
    return [
        a["labels"]
        for n in hook.notifications
        for a in n["alerts"]
        if a["labels"].get("alertname") == "SpecQualityDrift" and a["labels"].get("namespace") == ns
    ]


async def test_one_loss_pages_once_and_a_broken_push_still_pages(tmp_path: Path) -> None:
    """Namespace a (push works): SpecQualityDrift arrives once per loss, from the sidecar, and
    Prometheus holds none while the e-value is over its bound; namespace b (push to a dead
    address): the rule's SpecQualityDrift arrives."""
    hook = Webhook()
    dead = f"http://127.0.0.1:{free_port()}"
    async with contextlib.AsyncExitStack() as stack:
        session = await stack.enter_async_context(aiohttp.ClientSession())
        await stack.enter_async_context(hook.running())
        am = await stack.enter_async_context(
            running_alertmanager(tmp_path, session, config=hook_route(hook))
        )
        sims = await stack.enter_async_context(faulty_pair())
        ports = {"a": free_port(), "b": free_port()}
        for ns, target in (("a", am.url), ("b", dead)):
            (tmp_path / ns).mkdir()
            cfg = sidecar_config(tmp_path / ns, ports[ns], sims, target, ns)
            await stack.enter_async_context(
                specwatch_process(tmp_path / ns, ["run", "--config", str(cfg)], port=ports[ns])
            )
        config = {
            "global": {
                "scrape_interval": "1s",
                "evaluation_interval": "1s",
                "scrape_timeout": "1s",
            },
            "rule_files": [str(RULES)],
            "scrape_configs": [
                {
                    "job_name": "specwatch",
                    "honor_labels": True,
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{ports[ns]}"], "labels": {"namespace": ns}}
                        for ns in ("a", "b")
                    ],
                }
            ],
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [am.url[7:]]}]}]},
        }
        prom = await stack.enter_async_context(run_prometheus(tmp_path, config, session))

        async def both_paged() -> bool | None:
            return True if drift_alerts(hook, "a") and drift_alerts(hook, "b") else None

        try:
            await poll("SpecQualityDrift from both namespaces", both_paged, within=180, every=1)
        except AssertionError:
            seen = await query(session, prom, 'specwatch_paired_e_value{window="since_start"}')
            names = sorted({str(a["labels"]) for n in hook.notifications for a in n["alerts"]})
            raise AssertionError(f"e-values {seen}\nalerts {names}") from None
        delivering = {
            r["metric"]["namespace"]: r["value"][1]
            for r in await query(session, prom, "specwatch_alertmanager_delivering")
        }
        assert delivering == {"a": "1", "b": "0"}
        # ten more rule evaluations with namespace a's e-value over its page bound: no copy
        bound = (
            'specwatch_paired_e_value{window="since_start", category="_all",'
            ' hypothesis="no_net_loss", namespace="a"} >= 40'
        )
        for _ in range(10):
            assert await query(session, prom, bound), "namespace a's e-value under the bound"
            held = 'ALERTS{alertname="SpecQualityDrift", namespace="a"}'
            assert await query(session, prom, held) == []
            await asyncio.sleep(1)
        await asyncio.sleep(3)  # group_interval 1 s: any late notification has arrived

    pushed = drift_alerts(hook, "a")
    assert all("job" not in labels for labels in pushed), pushed
    per_loss: dict[tuple[str, str], set[tuple[tuple[str, str], ...]]] = {}
    for labels in pushed:
        key = (labels["hypothesis"], labels["category"])
        per_loss.setdefault(key, set()).add(tuple(sorted(labels.items())))
    assert ("no_net_loss", "_all") in per_loss, per_loss
    assert all(len(sets) == 1 for sets in per_loss.values()), per_loss
    ruled = drift_alerts(hook, "b")
    assert {labels.get("job") for labels in ruled} == {"specwatch"}, ruled
    assert ("no_net_loss", "_all") in {(x["hypothesis"], x["category"]) for x in ruled}
