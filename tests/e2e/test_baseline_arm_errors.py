"""The no-speculation baseline arm's failed replays are counted like every other arm's:
``specwatch_shadow_arm_errors_total{arm="baseline",reason}`` and one ``shadow arm failed`` log
line each. Driven through the mirror over real HTTP on 127.0.0.1, with fake standard and FLy
arms that answer and a baseline that answers 500 or closes the connection unanswered."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from specwatch.settings import Settings
from tests.e2e.shadow_harness import sidecar, until
from tests.fakes.arm import FakeArm, serve_arm


@asynccontextmanager
async def _closing_server() -> AsyncIterator[str]:
    """A server on 127.0.0.1 that reads a request and closes the connection unanswered."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1024)
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


@asynccontextmanager
async def _baseline(kind: str) -> AsyncIterator[str]:
    """The baseline arm's URL: ``http_500`` (a FakeArm answering 500) or ``disconnected``."""
    if kind == "http_500":
        async with serve_arm(FakeArm(mode="status", status=500, message="boom")) as url:
            yield url
    else:
        async with _closing_server() as url:
            yield url


@pytest.mark.parametrize("reason", ["http_500", "disconnected"])
async def test_baseline_arm_failures_are_counted_with_their_reason(
    tmp_path: Path, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Three greedy requests through the mirror with standard and FLy answering and the
    baseline failing (``http_500`` or ``disconnected``): ``arm_errors_total{arm="baseline",
    reason}`` = 3, the standard, FLy and noise arms (a second answering server) at 0 errors,
    three ``shadow arm failed`` lines naming the baseline arm, and the three pairs still
    compared (a baseline failure never makes the standard/FLy pair unpaired)."""
    caplog.set_level(logging.INFO, logger="specwatch")
    async with (
        serve_arm(FakeArm(text="Paris")) as std,
        serve_arm(FakeArm(text="Paris")) as fly,
        serve_arm(FakeArm(text="Paris")) as noise,
        _baseline(reason) as base,
    ):
        settings = Settings.model_validate(
            {
                # a scrape target is required; it is no arm's server, so replay never pauses
                "targets": [{"name": "other", "url": "http://127.0.0.1:9", "role": "baseline"}],
                "shadow": {
                    "enabled": True,
                    "sample_probability": 1.0,
                    "max_shadow_rps": 100.0,
                    "mirror_listen_host": "127.0.0.1",
                    "mirror_listen_port": 0,
                    "standard": {"url": std},
                    "fly": {"url": fly},
                    "baseline": {"url": base},
                    "noise": {"url": noise},
                    "noise_kind": "baseline",
                },
                "ledger": {"path": str(tmp_path / "ledger.sqlite")},
                "paired": {"windows": ["1h"], "refresh_seconds": 0.2},
            }
        )
        async with sidecar(settings) as sc:
            await until(lambda: sc.component.latest_stats() is not None)
            for i in range(3):
                body: dict[str, Any] = {
                    "model": "m",
                    "prompt": f"capital {i}",
                    "max_tokens": 4,
                    "temperature": 0,
                }
                async with sc.client.post(sc.mirror_url + "/v1/completions", json=body) as r:
                    assert r.status == 202
            await until(
                lambda: sum(sc.component.statistics.counters.by_status().values()) == 3, limit=30
            )
            await sc.component.refresh(flush=True)
            m = await sc.metrics()
    errors = {
        dict(labels)["arm"]: v
        for (name, labels), v in m.items()
        if name == "specwatch_shadow_arm_errors_total" and v
    }
    assert errors == {"baseline": 3.0}
    assert (
        m[
            (
                "specwatch_shadow_arm_errors_total",
                frozenset({("arm", "baseline"), ("reason", reason)}),
            )
        ]
        == 3
    )
    lines = [r for r in caplog.records if r.getMessage() == "shadow arm failed"]
    assert sum(getattr(r, "specwatch_fields", {}).get("arm") == "baseline" for r in lines) == 3
    assert sc.component.statistics.counters.by_status()["paired"] == 3
