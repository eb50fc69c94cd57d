"""The sidecar's root URL lists its endpoints (real HTTP on 127.0.0.1)."""

from __future__ import annotations

from aiohttp.test_utils import TestClient, TestServer

from specwatch.observe.settings import TargetSettings
from specwatch.server.app import build_app
from specwatch.settings import Settings


async def test_root_lists_every_endpoint_with_what_it_is_for() -> None:
    """``GET /`` answers 200 with every route of the app, sorted by path, each with its methods
    and, for the well-known ones, a one-line description (instead of the 404 it used to be)."""
    settings = Settings(targets=(TargetSettings(name="fly", url="http://127.0.0.1:9/metrics"),))
    app = build_app(settings, scrape=False)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        resp = await client.get("/")
        assert resp.status == 200
        doc = await resp.json()
    assert doc["service"] == "specwatch"
    assert [e["path"] for e in doc["endpoints"]] == [
        "/", "/api/v1/snapshot", "/healthz", "/metrics", "/readyz",
    ]  # fmt: skip
    by_path = {e["path"]: e for e in doc["endpoints"]}
    assert by_path["/metrics"] == {
        "path": "/metrics",
        "methods": ["GET"],
        "about": "Prometheus metrics (specwatch_*)",
    }
    assert by_path["/readyz"]["about"] == (
        "readiness: 200 once every target was scraped and the statistics are rebuilt; "
        "503 while shutting down"
    )
