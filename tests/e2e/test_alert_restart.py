"""``specwatch run`` killed with SIGKILL while an alert fires, then started again, against a real
Alertmanager that notifies a webhook receiver run by the test.

The target is a closed port, so SpecwatchTargetDown{target="standard"} becomes a candidate on the
first scrape and fires after ``detect.target_down_for`` = 20 s. The Alertmanager lease is
4 x ``resend_interval`` (3 s) = 12 s, shorter than the ``for``: a specwatch that restarted its
timers from zero would let Alertmanager resolve the alert (a "resolved" notification) and fire
it again later with a new ``startsAt`` (a second "firing" notification).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.fakes import free_port
from tests.fakes.alertmanager import Webhook, hook_route, running_alertmanager
from tests.fakes.wait import poll

pytestmark = pytest.mark.promtool

ROOT = Path(__file__).resolve().parents[2]


async def start_specwatch(config: Path, log: Path) -> asyncio.subprocess.Process:
    """``python -m specwatch run --config <config>`` with its output appended to ``log``."""
    env = dict(os.environ)
    extra = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + extra if extra else "")
    with log.open("ab") as out:
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", "specwatch", "run", "--config", str(config),
            stdout=out, stderr=asyncio.subprocess.STDOUT, env=env, cwd=str(config.parent),
        )  # fmt: skip


async def am_alerts(s: aiohttp.ClientSession, url: str) -> list[dict[str, Any]]:
    params = {"filter": 'alertname="SpecwatchTargetDown"'}
    async with s.get(f"{url}/api/v2/alerts", params=params) as resp:
        body: list[dict[str, Any]] = await resp.json()
        return body


async def snapshot_alerts(s: aiohttp.ClientSession, url: str) -> list[dict[str, Any]] | None:
    async with s.get(f"{url}/api/v1/snapshot") as resp:
        if resp.status != 200:
            return None
        doc: dict[str, Any] = await resp.json()
        alerts: list[dict[str, Any]] = doc["alerts"]
        return alerts or None


@pytest.mark.slow  # about 40 s: the alert must fire, survive a SIGKILL and a 16 s gap
async def test_sigkill_while_firing_keeps_the_alert(tmp_path: Path) -> None:
    """SIGKILL while SpecwatchTargetDown fires, restart: Alertmanager never sends "resolved", the
    alert keeps its startsAt (in Alertmanager and in specwatch's snapshot), and the webhook got
    exactly one notification, "firing", from start to past the lease after the restart."""
    hook = Webhook()
    port = free_port()
    sw_url = f"http://127.0.0.1:{port}"
    log = tmp_path / "specwatch.log"
    state_file = tmp_path / "ledger.sqlite-alerts.json"
    async with (
        hook.running(),
        aiohttp.ClientSession() as am_session,
        running_alertmanager(tmp_path, am_session, config=hook_route(hook)) as am,
    ):
        am_url = am.url
        config = tmp_path / "specwatch.json"
        config.write_text(
            json.dumps(
                {
                    "server": {"host": "127.0.0.1", "port": port},
                    "targets": [
                        {"name": "standard", "url": f"http://127.0.0.1:{free_port()}/metrics"}
                    ],
                    "scrape": {"interval_seconds": 0.5, "timeout_seconds": 0.4},
                    "ledger": {"path": str(tmp_path / "ledger.sqlite")},
                    "detect": {"target_down_for": 20.0},
                    "alerting": {
                        "urls": [am_url],
                        "evaluation_interval": 0.5,
                        "resend_interval": 3.0,
                        "max_attempts": 1,
                        "timeout": 2.0,
                    },
                }
            )
        )
        proc = await start_specwatch(config, log)
        try:
            async with aiohttp.ClientSession() as s:
                firing = await poll(
                    "the alert fires in specwatch",
                    lambda: snapshot_alerts(s, sw_url),
                    within=60,
                    every=0.25,
                )
                await poll("the firing notification", lambda: _some(hook.notifications), 20)
                listed = await poll(
                    "alert in alertmanager", lambda: _some_list(am_alerts, s, am_url)
                )
                starts_at = firing[0]["startsAt"]
                am_starts = listed[0]["startsAt"]
                await poll("state saved", lambda: _exists(state_file), 10)
                await asyncio.sleep(1.0)  # one more save after the alert fired

                proc.kill()  # SIGKILL: no cleanup of any kind
                await proc.wait()
                killed_at = time.monotonic()
                proc = await start_specwatch(config, log)

                after = await poll(
                    "specwatch back with the alert", lambda: snapshot_alerts(s, sw_url), within=60
                )
                assert after[0]["startsAt"] == starts_at
                # well past the lease (12 s) of the last send before the kill
                await asyncio.sleep(max(0.0, killed_at + 16.0 - time.monotonic()))
                listed_after = await am_alerts(s, am_url)
                after_lease = await snapshot_alerts(s, sw_url)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert after_lease is not None
    assert after_lease[0]["startsAt"] == starts_at
    assert [a["status"]["state"] for a in listed_after] == ["active"]
    assert listed_after[0]["startsAt"] == am_starts
    assert listed_after[0]["labels"]["target"] == "standard"
    # Alertmanager writes the same instant with trimmed trailing zeros in its webhook payloads
    # (".44Z") and its API (".440Z"): compare instants, not strings.
    statuses = [(status, datetime.fromisoformat(ts)) for status, ts in hook.statuses()]
    assert statuses == [("firing", datetime.fromisoformat(am_starts))], log.read_text()[-3000:]
    assert "alert state restored" in log.read_text()


async def _some(items: list[dict[str, Any]]) -> bool | None:
    return True if items else None


async def _exists(path: Path) -> bool | None:
    return True if await asyncio.to_thread(path.exists) else None


async def _some_list(fn: Any, *args: Any) -> list[dict[str, Any]] | None:
    got: list[dict[str, Any]] = await fn(*args)
    return got or None
