"""``/readyz``: 200 once every target was scraped and, with shadow on, once the paired statistics
exist (the start-up rebuild from the ledger has published them); the body says which is missing."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from specwatch.server.app import STORE_KEY, build_app
from specwatch.settings import Settings
from specwatch.shadow.settings import ArmEndpoint, ShadowSettings
from specwatch.shadow.summary import build_shadow_stats

#: Shadow on, both arms named (nothing is started: the app is built without components).
SHADOW_ON = ShadowSettings(
    enabled=True,
    standard=ArmEndpoint(url="http://127.0.0.1:9"),
    fly=ArmEndpoint(url="http://127.0.0.1:9"),
)


async def _readyz(settings: Settings, publish: bool) -> tuple[int, dict[str, Any]]:
    app = build_app(settings, scrape=False)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        if publish:
            stats = build_shadow_stats({}, now=0.0)
            app[STORE_KEY].update(lambda s: replace(s, shadow=stats))
        resp = await client.get("/readyz")
        doc: dict[str, Any] = await resp.json()
        return resp.status, doc


async def test_statistics_rebuilding_is_not_ready() -> None:
    """Shadow on and no statistics published yet: 503, ``statistics: rebuilding``."""
    settings = Settings(shadow=SHADOW_ON)
    assert await _readyz(settings, publish=False) == (
        503,
        {"ready": False, "waiting_for": [], "statistics": "rebuilding"},
    )


async def test_statistics_published_is_ready() -> None:
    """Shadow on and the statistics published: 200, ``statistics: ready``."""
    settings = Settings(shadow=SHADOW_ON)
    assert await _readyz(settings, publish=True) == (200, {"ready": True, "statistics": "ready"})


async def test_shadow_off_needs_no_statistics() -> None:
    """Shadow off: the statistics are ``off`` and never hold readiness back."""
    assert await _readyz(Settings(), publish=False) == (200, {"ready": True, "statistics": "off"})
