"""server.wiring: the arm ↔ target load join and the shadow stats → detectors → Snapshot.alerts
join, over a real app with no network peers."""

from __future__ import annotations

import json
import math
from dataclasses import replace

from aiohttp.test_utils import TestClient, TestServer

from specwatch.alerts.settings import AlertingSettings, DetectSettings
from specwatch.core.roles import Role
from specwatch.export.snapshot import Snapshot
from specwatch.observe.settings import TargetSettings
from specwatch.observe.values import Capacity, ObserveView, TargetSnapshot
from specwatch.server.app import STORE_KEY, build_app
from specwatch.server.wiring import AlertingPlug, arm_loads
from specwatch.settings import Settings
from specwatch.shadow.sample import ArmLoad
from specwatch.shadow.summary import Levels, OrderedState, build_shadow_stats
from tests.fakes import FakeMonotonicClock, FakeWallClock


class TestArmLoads:
    def test_load_comes_from_the_current_view(self) -> None:
        """fly scraped 5 s ago (wall 100 vs 95) reads as observed at monotonic 50 − 5 = 45 with
        its running gauge and max_num_seqs; an arm whose target is absent has no reading."""
        fly = TargetSnapshot(
            name="fly",
            role=Role.FLY,
            url="http://f/metrics",
            last_success=95.0,
            capacity=Capacity(limits_configured=False, num_requests_running=3.0, max_num_seqs=8),
        )
        views = [ObserveView(generated_at=95.0, targets={"fly": fly})]
        state = arm_loads(
            lambda: views[-1],
            {"fly": "fly", "standard": "std"},
            wall_clock=FakeWallClock(100.0),
            mono_clock=FakeMonotonicClock(50.0),
        )
        assert state() == {
            "fly": ArmLoad(running=3.0, waiting=None, max_num_seqs=8, observed_at=45.0),
            "standard": ArmLoad(None, None, None, None),
        }
        views.append(ObserveView(generated_at=96.0))  # the next published view wins
        assert state()["fly"] == ArmLoad(None, None, None, None)


async def test_alerts_fire_on_published_shadow_stats_and_are_published_once() -> None:
    """With paired.alpha 0.01, a published margin e-value of 12,000 (≥ its page bound
    1/(0.01 x 0.01) = 10,000) fires SpecQualityDrift; the alert state comes back as
    Snapshot.alerts in exactly one more swap, next to the same shadow stats the detectors
    read."""
    settings = Settings(
        targets=(TargetSettings(name="fly", url="http://127.0.0.1:9"),),
        alerting=AlertingSettings(evaluation_interval=3600.0),
        detect=DetectSettings(quality_e_value_for=0.0),
    )
    plug = AlertingPlug(settings, wall_clock=FakeWallClock(1000.0))
    app = build_app(settings, scrape=False, components=[plug], wall_clock=FakeWallClock(1000.0))
    store = app[STORE_KEY]
    seen: list[Snapshot] = []
    store.subscribe(seen.append)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        initial = store.get().alerts
        assert initial is not None
        assert initial.firing == ()
        stats = build_shadow_stats(
            {},
            now=1000.0,
            levels=Levels(alpha=0.01),
            ordered=OrderedState(betting_log_e_value=math.log(12000)),
        )
        start = len(seen)
        store.update(lambda snap: replace(snap, shadow=stats))
        await plug.component.tick()
        published = store.get()
        assert published.shadow is stats
        assert published.alerts is not None
        assert [a.labels["alertname"] for a in published.alerts.firing] == ["SpecQualityDrift"]
        swaps = seen[start:]
        assert len(swaps) == 2  # the shadow swap, then one alerts swap
        assert swaps[0].alerts is not None
        assert swaps[0].alerts.firing == ()
        assert swaps[1] is published
        doc = json.loads(await (await client.get("/api/v1/snapshot")).text())
        assert doc["alerts"][0]["labels"]["hypothesis"] == "margin"
        assert doc["shadow"]["alpha"] == 0.01


async def test_e_value_under_one_over_alpha_stays_quiet() -> None:
    """With paired.alpha 0.01, e = 50 (< 100) fires nothing even though it is over 20."""
    settings = Settings(
        targets=(TargetSettings(name="fly", url="http://127.0.0.1:9"),),
        alerting=AlertingSettings(evaluation_interval=3600.0),
        detect=DetectSettings(quality_e_value_for=0.0),
    )
    plug = AlertingPlug(settings, wall_clock=FakeWallClock(1000.0))
    app = build_app(settings, scrape=False, components=[plug], wall_clock=FakeWallClock(1000.0))
    store = app[STORE_KEY]
    async with TestClient(TestServer(app, host="127.0.0.1")):
        stats = build_shadow_stats(
            {},
            now=1000.0,
            levels=Levels(alpha=0.01),
            ordered=OrderedState(betting_log_e_value=math.log(50)),
        )
        store.update(lambda snap: replace(snap, shadow=stats))
        await plug.component.tick()
        alerts = store.get().alerts
        assert alerts is not None
        assert alerts.firing == ()
