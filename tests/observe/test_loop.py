"""Scraper and app against real aiohttp servers: every kind of bad input, end to end."""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
import re
import socket
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr

from specwatch.core.logs import event_fields
from specwatch.observe.settings import ScrapeSettings, TargetSettings
from specwatch.server.app import SCRAPER_KEY, build_app
from specwatch.settings import Settings
from tests.fakes import FakeWallClock
from tests.fakes.vllm import FakeVllm, Reply
from tests.fixture_files import body

GOOD = body("vllm-metrics/real-cpu-ngram.txt")


def _settings(url: str, **scrape: Any) -> Settings:
    return Settings(
        targets=(TargetSettings(name="fly", url=url, bearer_token=SecretStr("s3cret-token")),),
        scrape=ScrapeSettings(**{"timeout_seconds": 2.0, **scrape}),
    )


def _sample(text: str, name: str, labels: dict[str, str]) -> float | None:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return None


class Harness:
    """An app with scraping driven by hand, a fake vLLM and a fake wall clock."""

    def __init__(
        self,
        app: web.Application,
        client: TestClient[Any, Any],
        fake: FakeVllm,
        wall_clock: FakeWallClock,
    ) -> None:
        self.app = app
        self.client = client
        self.fake = fake
        self.wall_clock = wall_clock

    async def scrape(self) -> bool:
        target = self.app[SCRAPER_KEY].trackers["fly"].target
        return await self.app[SCRAPER_KEY].scrape_once(target)

    async def metrics(self) -> str:
        resp = await self.client.get("/metrics")
        assert resp.status == 200
        return await resp.text()

    async def snapshot(self) -> dict[str, Any]:
        resp = await self.client.get("/api/v1/snapshot")
        assert resp.status == 200
        doc: dict[str, Any] = json.loads(await resp.text())
        return doc


async def _harness(
    fake: FakeVllm, wall_clock: FakeWallClock, **scrape: Any
) -> AsyncIterator[Harness]:
    app = build_app(_settings(fake.url, **scrape), wall_clock=wall_clock, scrape=False)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        yield Harness(app, client, fake, wall_clock)


@pytest.fixture
async def fake() -> AsyncIterator[FakeVllm]:
    async with FakeVllm(token="s3cret-token") as f:
        yield f


@pytest.fixture
async def h(fake: FakeVllm, wall_clock: FakeWallClock) -> AsyncIterator[Harness]:
    async for harness in _harness(fake, wall_clock, max_body_bytes=200_000):
        yield harness


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records if r.name == "specwatch.scrape" and r.levelno >= logging.WARNING
    ]


async def _good_then(h: Harness, bad: Reply, caplog: pytest.LogCaptureFixture) -> str:
    """One good scrape, then ``bad``: return /metrics after the bad one."""
    h.fake.push(Reply(GOOD), bad)
    assert await h.scrape()
    h.wall_clock.advance(5)
    caplog.clear()
    assert not await h.scrape()
    return await h.metrics()


def _assert_kept_and_stale(text: str) -> None:
    assert _sample(text, "specwatch_target_up", {"target": "fly"}) == 0
    assert _sample(text, "specwatch_target_stale", {"target": "fly"}) == 1
    alpha = _sample(text, "specwatch_acceptance_ratio", {"target": "fly", "window": "since_start"})
    assert alpha is None  # only one good page: no window value, and no invented one
    k = _sample(text, "specwatch_num_speculative_tokens", {"target": "fly", "model_name": "tiny"})
    assert k == 4  # last good values kept


class TestBadInput:
    @pytest.mark.parametrize(
        ("reply", "reason"),
        [
            (
                Reply(
                    "<html><body>502 Bad Gateway</body></html>",
                    status=502,
                    content_type="text/html",
                ),
                "http_status",
            ),
            (Reply(GOOD[:30000], kind="cut"), "truncated"),
            (Reply(GOOD[: GOOD.index("1828.0") + 2]), "parse"),  # cut mid-number, length right
            (Reply(body("cases/C11_escaped_labels_malformed.prom")), "parse"),
            (Reply("<html>oops</html>\n", content_type="text/html"), "parse"),
            (Reply(GOOD * 5), "too_large"),
            (Reply(GOOD * 5, gzip=True), "too_large"),
        ],
        ids=[
            "html502",
            "cut_connection",
            "cut_mid_number",
            "unescaped_quote",
            "html200",
            "over_cap",
            "over_cap_gzip",
        ],
    )
    async def test_bad_reply(
        self, h: Harness, reply: Reply, reason: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Each bad reply: up 0, its reason counted, one structured log line, last good kept."""
        caplog.set_level(logging.DEBUG, logger="specwatch")
        text = await _good_then(h, reply, caplog)
        assert (
            _sample(text, "specwatch_scrape_errors_total", {"target": "fly", "reason": reason}) == 1
        )
        assert _sample(text, "specwatch_scrapes_total", {"target": "fly"}) == 2
        _assert_kept_and_stale(text)
        warnings = _warnings(caplog)
        assert len(warnings) == 1
        assert warnings[0].getMessage() == "scrape failed"
        fields = event_fields(warnings[0])
        assert fields["reason"] == reason
        assert fields["url"] == h.fake.url  # every failed-scrape line names the URL
        if reply.content_type == "text/html" and reply.status == 200:
            assert fields["hint"] == (
                "the server answered with HTML, not metrics; give the vLLM server's /metrics URL"
            )
        else:
            assert "hint" not in fields

    async def test_openai_base_url_gets_a_hint(
        self, fake: FakeVllm, wall_clock: FakeWallClock, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A target given as the OpenAI base URL (``…/v1``): the failed scrape's log line names
        that URL and says which URL specwatch wants instead."""
        caplog.set_level(logging.DEBUG, logger="specwatch")
        base = fake.url.removesuffix("/metrics")
        app = build_app(_settings(base + "/v1"), wall_clock=wall_clock, scrape=False)
        async with TestClient(TestServer(app, host="127.0.0.1")):
            target = app[SCRAPER_KEY].trackers["fly"].target
            assert not await app[SCRAPER_KEY].scrape_once(target)
        fields = event_fields(_warnings(caplog)[0])
        assert fields["url"] == base + "/v1"
        assert fields["hint"] == (
            f"this looks like the OpenAI API URL; specwatch scrapes {base}/metrics"
        )

    async def test_timeout(
        self, fake: FakeVllm, wall_clock: FakeWallClock, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A server that never answers: reason timeout, last good values kept."""
        caplog.set_level(logging.DEBUG, logger="specwatch")
        async for h in _harness(fake, wall_clock, timeout_seconds=0.2):
            text = await _good_then(h, Reply(kind="hang"), caplog)
            assert (
                _sample(
                    text, "specwatch_scrape_errors_total", {"target": "fly", "reason": "timeout"}
                )
                == 1
            )
            _assert_kept_and_stale(text)
            assert len(_warnings(caplog)) == 1

    async def test_connection_refused(
        self, wall_clock: FakeWallClock, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Nobody listening: reason connect, up 0, not ready."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        app = build_app(
            _settings(f"http://127.0.0.1:{port}/metrics"), wall_clock=wall_clock, scrape=False
        )
        caplog.set_level(logging.DEBUG, logger="specwatch")
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            target = app[SCRAPER_KEY].trackers["fly"].target
            assert not await app[SCRAPER_KEY].scrape_once(target)
            text = await (await client.get("/metrics")).text()
            assert (
                _sample(
                    text, "specwatch_scrape_errors_total", {"target": "fly", "reason": "connect"}
                )
                == 1
            )
            assert _sample(text, "specwatch_target_up", {"target": "fly"}) == 0
            assert (
                _sample(text, "specwatch_target_stale", {"target": "fly"}) == 0
            )  # nothing to be stale
            assert (await client.get("/readyz")).status == 503
            assert len(_warnings(caplog)) == 1

    async def test_repeated_failure_logs_warning_once(
        self, h: Harness, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The same failure again is not a new warning (warnings on state changes only)."""
        caplog.set_level(logging.DEBUG, logger="specwatch")
        h.fake.push(Reply("x", status=502))
        await h.scrape()
        await h.scrape()
        assert len(_warnings(caplog)) == 1


class TestGoodInput:
    async def test_window_values_and_auth(self, h: Harness) -> None:
        """Two good pages 30 s apart: α and τ of the increase; the token is sent, never shown."""
        first = (
            GOOD.replace("} 488.0", "} 400.0")
            .replace("} 1828.0", "} 1500.0")
            .replace('model_name="tiny"} 184.0', 'model_name="tiny"} 150.0')
        )
        h.fake.push(Reply(first), Reply(GOOD))
        assert (await h.client.get("/readyz")).status == 503
        assert await h.scrape()
        h.wall_clock.advance(30)
        assert await h.scrape()
        assert (await h.client.get("/readyz")).status == 200
        text = await h.metrics()
        labels = {"target": "fly", "window": "1m", "model_name": "tiny"}
        alpha = _sample(text, "specwatch_acceptance_ratio", labels)
        assert alpha == pytest.approx((184 - 150) / (1828 - 1500))
        tau = _sample(text, "specwatch_mean_acceptance_length", labels)
        assert tau == pytest.approx(1 + (184 - 150) / (488 - 400))
        assert _sample(text, "specwatch_drafts_per_second", labels) == pytest.approx(88 / 30)
        assert _sample(text, "specwatch_target_up", {"target": "fly", "role": "fly"}) == 1
        assert _sample(text, "specwatch_limits_configured", {"target": "fly"}) == 0
        assert h.fake.auth_seen == ["Bearer s3cret-token", "Bearer s3cret-token"]
        snap = await h.snapshot()
        assert "s3cret" not in text
        assert "s3cret" not in json.dumps(snap)
        w = snap["targets"]["fly"]["windows"]["1m"]["server"]
        assert w["acceptance_rate"] == pytest.approx(34 / 328)
        assert w["generation_tokens_per_second"] == 0.0

    async def test_gzip_body(self, h: Harness) -> None:
        """A gzip-encoded body under the cap is read."""
        h.fake.push(Reply(GOOD, gzip=True))
        assert await h.scrape()
        text = await h.metrics()
        assert (
            _sample(
                text, "specwatch_num_speculative_tokens", {"target": "fly", "model_name": "tiny"}
            )
            == 4
        )

    async def test_restart_between_scrapes(
        self, h: Harness, caplog: pytest.LogCaptureFixture
    ) -> None:
        """C03 a→b: reset counted per engine, α from post-reset values, one log line."""
        caplog.set_level(logging.DEBUG, logger="specwatch")
        h.fake.push(Reply(body("cases/C03_reset_a.prom")), Reply(body("cases/C03_reset_b.prom")))
        await h.scrape()
        h.wall_clock.advance(30)
        await h.scrape()
        text = await h.metrics()
        assert _sample(text, "specwatch_engine_resets_total", {"target": "fly", "engine": "0"}) == 1
        labels = {"target": "fly", "window": "1m", "model_name": "example-model"}
        assert _sample(text, "specwatch_acceptance_ratio", labels) == pytest.approx(700 / 1200)
        assert _sample(text, "specwatch_mean_acceptance_length", labels) == pytest.approx(2.75)
        assert [r.getMessage() for r in _warnings(caplog)] == ["counter reset"]

    async def test_page_without_vllm_families_is_a_failed_scrape(
        self, h: Harness, caplog: pytest.LogCaptureFixture
    ) -> None:
        """C03 b→c: a 200 page with no vLLM family is a failed scrape (reason
        ``no_vllm_families``, up 0, not ready-making), stale, no acceptance value (never 0),
        one warning line (not repeated while it lasts)."""
        caplog.set_level(logging.DEBUG, logger="specwatch")
        h.fake.push(*(Reply(body(f"cases/C03_reset_{x}.prom")) for x in "abcc"))
        for _ in range(2):
            await h.scrape()
            h.wall_clock.advance(30)
        caplog.clear()
        for _ in range(2):
            await h.scrape()
            h.wall_clock.advance(30)
        warnings = _warnings(caplog)
        assert [r.getMessage() for r in warnings] == ["scrape failed"]
        assert event_fields(warnings[0])["reason"] == "no_vllm_families"
        text = await h.metrics()
        assert _sample(text, "specwatch_target_up", {"target": "fly"}) == 0
        assert _sample(text, "specwatch_target_stale", {"target": "fly"}) == 1
        errors = {"target": "fly", "reason": "no_vllm_families"}
        assert _sample(text, "specwatch_scrape_errors_total", errors) == 2
        assert _sample(text, "specwatch_acceptance_ratio", {"target": "fly"}) is None
        snap = await h.snapshot()
        assert snap["targets"]["fly"]["up"] is False

    async def test_duplicate_conflict_counted(
        self, h: Harness, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Conflicting duplicate series: reason duplicate_conflict counted, page still used,
        one log line while the conflict persists."""
        caplog.set_level(logging.DEBUG, logger="specwatch")
        dup = GOOD + 'vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny"} 1.0\n'
        h.fake.push(Reply(dup))
        assert await h.scrape()
        assert await h.scrape()  # logged once, counted twice
        assert [r.getMessage() for r in _warnings(caplog)] == ["duplicate series skipped"]
        text = await h.metrics()
        assert (
            _sample(
                text,
                "specwatch_scrape_errors_total",
                {"target": "fly", "reason": "duplicate_conflict"},
            )
            == 2
        )
        assert _sample(text, "specwatch_target_up", {"target": "fly"}) == 1

    async def test_healthz(self, h: Harness) -> None:
        """/healthz answers while the process lives."""
        resp = await h.client.get("/healthz")
        assert resp.status == 200


@pytest.mark.promtool
async def test_promtool_check_metrics(h: Harness, tmp_path: Any) -> None:
    """promtool check metrics accepts specwatch's exposition with every family populated."""

    h.fake.push(Reply(body("vllm-metrics/real-cpu-draft-model-midflight.txt")), Reply(GOOD))
    await h.scrape()
    h.wall_clock.advance(30)
    await h.scrape()
    text = await h.metrics()
    assert re.search(r"^specwatch_per_position_acceptance_ratio\{", text, re.M)
    proc = await asyncio.create_subprocess_exec(
        "/usr/bin/promtool",
        "check",
        "metrics",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate(text.encode())
    assert proc.returncode == 0, out.decode() + err.decode()


def test_gzip_helper_roundtrip() -> None:
    """The fake's gzip encoding is real gzip (guards the gzip test above)."""
    assert gzip.decompress(gzip.compress(GOOD.encode())).decode() == GOOD


async def test_concurrent_requests_do_not_overlap(h: Harness) -> None:
    """Three scrapes of one target asked at once run one after the other."""
    h.fake.push(Reply(GOOD))
    results = await asyncio.gather(h.scrape(), h.scrape(), h.scrape())
    assert list(results) == [True, True, True]
    assert h.fake.max_in_flight == 1
    assert len(h.fake.auth_seen) == 3


async def test_per_process_gauges_said_in_metrics_and_one_log_line(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """A page carrying each gauge once per process (eight ``pid`` copies of KV usage 0.3):
    /metrics shows KV usage 0.3 (read once) and specwatch_target_processes 8, and
    /api/v1/snapshot the same 8 as the target's ``gauge_processes``; one "gauges per process"
    line on the first such page, none on the next, one more (processes 0) when the page goes
    back to one value per gauge."""
    caplog.set_level(logging.INFO, logger="specwatch")
    per_process = "".join(
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="tiny",pid="{100 + i}"}} 0.3\n'
        for i in range(8)
    )
    single = 'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.3\n'
    h.fake.push(Reply(per_process), Reply(per_process), Reply(single))
    assert await h.scrape()
    text = await h.metrics()
    assert _sample(text, "specwatch_target_processes", {"target": "fly"}) == 8
    assert (await h.snapshot())["targets"]["fly"]["gauge_processes"] == 8
    kv = _sample(text, "specwatch_kv_cache_usage_ratio", {"target": "fly", "model_name": "tiny"})
    assert kv == 0.3
    h.wall_clock.advance(5)
    assert await h.scrape()
    h.wall_clock.advance(5)
    assert await h.scrape()
    text = await h.metrics()
    assert _sample(text, "specwatch_target_processes", {"target": "fly"}) == 0
    assert (await h.snapshot())["targets"]["fly"]["gauge_processes"] == 0
    said = [
        event_fields(r)
        for r in caplog.records
        if r.name == "specwatch.scrape" and r.getMessage() == "gauges per process"
    ]
    assert [(f["target"], f["processes"]) for f in said] == [("fly", 8), ("fly", 0)]
