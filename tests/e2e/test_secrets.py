"""No configured secret reaches any output of ``specwatch run``, whatever bad input it meets.

A real ``specwatch run`` process is configured with a target bearer token, a target URL with a
password and a query token, shadow arm tokens and an Alertmanager URL with a password. After
each bad-input case (malformed HTTP requests carrying ``Authorization`` headers, targets
answering 401 / garbage, a bad mirror body) every log line, ``/metrics``,
``/api/v1/snapshot``, the ledger file and every Alertmanager request body (alerts do fire: the
targets are down) are searched for each secret, as text and as the base64 of HTTP basic auth.
A config error naming an ``alerting.urls`` entry prints the entry with its password masked.
"""

from __future__ import annotations

import asyncio
import base64
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.fakes import REPO
from tests.fakes.raw import raw_exchange
from tests.sidecar_process import free_port, run_config, specwatch_process

TARGET_TOKEN = "TOKLEAK-target-77810"
URL_PASSWORD = "PWLEAK-url-44120"
QUERY_TOKEN = "QLEAK-query-33180"
ARM_TOKEN = "ARMLEAK-arm-55210"
AM_PASSWORD = "AMLEAK-alertmanager-99210"
SECRETS = (TARGET_TOKEN, URL_PASSWORD, QUERY_TOKEN, ARM_TOKEN, AM_PASSWORD)


def _forms(secret: str, user: str) -> list[str]:
    """The secret and the base64 of ``user:secret`` (how basic auth carries it)."""
    return [secret, base64.b64encode(f"{user}:{secret}".encode()).decode()]


NEEDLES = [
    *_forms(TARGET_TOKEN, "x"),
    *_forms(URL_PASSWORD, "bob"),
    QUERY_TOKEN,
    ARM_TOKEN,
    *_forms(AM_PASSWORD, "am"),
]


class Receivers:
    """Two bad vLLM targets (one answers 401 echoing the request's headers, one 200 garbage)
    and an Alertmanager that records every request body."""

    def __init__(self) -> None:
        self.am_bodies: list[str] = []
        app = web.Application()
        app.router.add_get("/bad/metrics", self._echo_401)
        app.router.add_get("/garbage/metrics", self._garbage)
        app.router.add_post("/am/api/v2/alerts", self._alerts)
        self.server = TestServer(app, host="127.0.0.1")

    async def _echo_401(self, request: web.Request) -> web.Response:
        text = "\n".join(f"{k}: {v}" for k, v in request.headers.items())
        return web.Response(status=401, text=text)

    async def _garbage(self, request: web.Request) -> web.Response:
        auth = request.headers.get("Authorization", "")
        return web.Response(text=f'vllm:generation_tokens_total{{x="{auth}" 1\n')

    async def _alerts(self, request: web.Request) -> web.Response:
        self.am_bodies.append(await request.text())
        return web.Response(status=200)

    def url(self, path: str) -> str:
        return str(self.server.make_url(path))


async def _bad_requests(port: int) -> None:
    """Malformed requests with credentials in their headers: a bad header line, a bad request
    line, an oversized header; each connection is read until the server closes it."""
    raw = [
        b"GET /metrics HTTP/1.1\r\nAuthorization: Bearer " + TARGET_TOKEN.encode() + b"\r\n"
        b"Bad Header Line\r\n\r\n",
        b"GET /metrics?token=" + QUERY_TOKEN.encode() + b" HTTP/1.1 junk\r\n"
        b"Authorization: Basic " + base64.b64encode(f"bob:{URL_PASSWORD}".encode()) + b"\r\n\r\n",
        b"GET /metrics HTTP/1.1\r\nX-Api-Key: " + ARM_TOKEN.encode() + b"\r\n"
        b"X-Big: " + b"a" * 20_000 + b"\r\n\r\n",
    ]
    for data in raw:
        await raw_exchange(port, data)


async def test_no_secret_in_logs_metrics_snapshot_ledger_or_alerts(tmp_path: Path) -> None:
    """Every output is searched for every secret after the bad-input cases; alerts were sent."""
    rec = Receivers()
    await rec.server.start_server()
    port, mirror = free_port(), free_port()
    base = rec.url("/").rstrip("/")
    host = base.removeprefix("http://")
    cfg = run_config(
        tmp_path,
        port,
        targets=[
            {"name": "fly", "url": rec.url("/bad/metrics"), "bearer_token": TARGET_TOKEN},
            {
                "name": "standard",
                "url": f"http://bob:{URL_PASSWORD}@{host}/garbage/metrics?token={QUERY_TOKEN}",
            },
        ],
        scrape={"interval_seconds": 0.2, "timeout_seconds": 2.0},
        shadow={
            "enabled": True,
            "sample_probability": 1.0,
            "mirror_listen_host": "127.0.0.1",
            "mirror_listen_port": mirror,
            "standard": {"url": "http://127.0.0.1:9", "token": ARM_TOKEN},
            "fly": {"url": "http://127.0.0.1:9", "token": ARM_TOKEN},
        },
        alerting={
            "urls": [f"http://am:{AM_PASSWORD}@{host}/am"],
            "evaluation_interval": 0.2,
            "resend_interval": 0.5,
        },
        detect={"target_down_for": 0.5},
        log={"level": "DEBUG", "format": "json"},
    )
    try:
        async with specwatch_process(tmp_path, ["run", "--config", str(cfg)], port=port) as p:
            await _bad_requests(port)
            async with aiohttp.ClientSession() as s:
                async with s.post(
                    f"http://127.0.0.1:{mirror}/v1/completions",
                    data=b'{"prompt": "Authorization: Bearer ' + TARGET_TOKEN.encode() + b'"',
                ) as r:
                    assert r.status == 400
                for _ in range(300):  # the first post may be the empty heartbeat
                    if "SpecwatchTargetDown" in "".join(rec.am_bodies):
                        break
                    await asyncio.sleep(0.1)
                async with s.get(p.url + "/metrics") as r:
                    metrics = await r.text()
                async with s.get(p.url + "/api/v1/snapshot") as r:
                    snapshot = await r.text()
            code, _ = await p.stop(signal.SIGTERM)
            assert code == 0
            log = p.log_text()
    finally:
        await rec.server.close()
    assert rec.am_bodies, "no alert reached the Alertmanager"
    assert "SpecwatchTargetDown" in "".join(rec.am_bodies)
    assert "scrape failed" in log
    ledger = (tmp_path / "ledger.sqlite").read_bytes().decode("latin-1")
    outputs = {
        "log": log,
        "metrics": metrics,
        "snapshot": snapshot,
        "ledger": ledger,
        "alertmanager": "\n".join(rec.am_bodies),
    }
    leaks = [(where, s) for where, text in outputs.items() for s in NEEDLES if s in text]
    assert leaks == []


def test_config_error_masks_the_alertmanager_password(tmp_path: Path) -> None:
    """``alerting.urls`` with a non-HTTP entry: exit 2, one line naming the field, the
    entry shown with its password as ``**********``."""
    cfg = run_config(tmp_path, free_port(), alerting={"urls": [f"ftp://am:{AM_PASSWORD}@h:1"]})
    done = subprocess.run(
        [sys.executable, "-m", "specwatch", "run", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(REPO),
        check=False,
    )
    assert done.returncode == 2
    assert "alerting.urls" in done.stderr
    assert "ftp://am:**********@h:1" in done.stderr
    assert AM_PASSWORD not in done.stderr + done.stdout


def test_target_spec_error_masks_the_url_password(tmp_path: Path) -> None:
    """A bad ``--target`` short form carrying ``user:password@`` and a query token: the error
    line names the flag but shows neither secret."""
    spec = f"fly=http://bob:{URL_PASSWORD}@h:1/metrics?token={QUERY_TOKEN},max_num_seqs"
    done = subprocess.run(
        [sys.executable, "-m", "specwatch", "run", "--target", spec],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(REPO),
        check=False,
    )
    assert done.returncode == 2
    assert "--target" in done.stderr
    assert URL_PASSWORD not in done.stderr
    assert QUERY_TOKEN not in done.stderr
