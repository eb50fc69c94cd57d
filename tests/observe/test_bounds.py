"""What one target can make specwatch keep is bounded: models, engines, vanished series, and a URL
with several servers behind it. Driven through a real fake-vLLM HTTP server and specwatch's own
``/metrics`` and ``/api/v1/snapshot``.
"""

from __future__ import annotations

import gc
import json
import tracemalloc
from collections.abc import AsyncIterator, Iterable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from specwatch.observe.parse import parse_page
from specwatch.observe.settings import ScrapeSettings, TargetSettings
from specwatch.observe.tracker import TargetTracker
from specwatch.server.app import SCRAPER_KEY, build_app
from specwatch.settings import Settings
from tests.fakes import FakeWallClock
from tests.fakes.vllm import FakeVllm, Reply


def page(
    engines: Iterable[tuple[str, str]],
    drafts: int,
    *,
    start: float | None = 1.7e9,
) -> str:
    """A vLLM page: per (model, engine) ``drafts`` drafts, 3 draft tokens and 2 accepted per
    draft, 10 generated tokens per draft; ``process_start_time_seconds`` = ``start``."""
    lines = []
    for model, engine in engines:
        lab = f'engine="{engine}",model_name="{model}"'
        lines += [
            f"vllm:spec_decode_num_drafts_total{{{lab}}} {drafts}",
            f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {3 * drafts}",
            f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {2 * drafts}",
            f"vllm:generation_tokens_total{{{lab}}} {10 * drafts}",
        ]
    if start is not None:
        lines.append(f"process_start_time_seconds {start}")
    return "\n".join(lines) + "\n"


class Sidecar:
    """specwatch's app on 127.0.0.1 scraping one fake vLLM target by hand."""

    def __init__(
        self, app: Any, client: TestClient[Any, Any], fake: FakeVllm, wall_clock: FakeWallClock
    ):
        self.app, self.client, self.fake, self.wall_clock = app, client, fake, wall_clock

    async def scrape(self, body: str) -> bool:
        self.fake.replies.clear()  # the fake repeats its last reply: serve exactly this one
        self.fake.push(Reply(body))
        target = self.app[SCRAPER_KEY].trackers["fly"].target
        ok: bool = await self.app[SCRAPER_KEY].scrape_once(target)
        self.wall_clock.advance(30)
        return ok

    async def series(self) -> list[tuple[str, dict[str, str], float]]:
        resp = await self.client.get("/metrics")
        assert resp.status == 200
        return [
            (s.name, s.labels, s.value)
            for fam in text_string_to_metric_families(await resp.text())
            for s in fam.samples
            if s.name.startswith("specwatch_")
        ]

    async def value(self, name: str, **labels: str) -> float | None:
        for n, lab, v in await self.series():
            if n == name and all(lab.get(k) == x for k, x in labels.items()):
                return v
        return None

    async def scrape_errors(self, reason: str) -> float | None:
        """``specwatch_scrape_errors_total{target="fly", reason=...}`` now."""
        return await self.value("specwatch_scrape_errors_total", target="fly", reason=reason)

    async def snapshot(self) -> dict[str, Any]:
        resp = await self.client.get("/api/v1/snapshot")
        doc: dict[str, Any] = json.loads(await resp.text())
        return doc


@pytest.fixture
async def sidecar(
    request: pytest.FixtureRequest, wall_clock: FakeWallClock
) -> AsyncIterator[Sidecar]:
    scrape: dict[str, Any] = getattr(request, "param", {})
    async with FakeVllm() as fake:
        settings = Settings(
            targets=(TargetSettings(name="fly", url=fake.url),),
            scrape=ScrapeSettings(**{"max_body_bytes": 64 << 20, **scrape}),
        )
        app = build_app(settings, wall_clock=wall_clock, scrape=False)
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            yield Sidecar(app, client, fake, wall_clock)


def _labels(series: list[tuple[str, dict[str, str], float]], label: str) -> set[str]:
    return {lab[label] for _, lab, _ in series if label in lab}


async def test_ten_thousand_models_keep_the_cap(sidecar: Sidecar) -> None:
    """10,000 distinct ``model_name`` values on every page: specwatch keeps the first 8 in
    sorted order (the default cap) and counts the other 9,992 per page as ``model_cap``; the
    number of exported series is the same as for a page with just those 8 models."""
    models = [(f"m{i:05d}", "0") for i in range(10_000)]
    assert await sidecar.scrape(page(models[:8], 100))
    assert await sidecar.scrape(page(models[:8], 200))
    with_eight = len(await sidecar.series())
    assert await sidecar.scrape(page(models, 300))
    assert await sidecar.scrape(page(models, 400))
    series = await sidecar.series()
    assert _labels(series, "model_name") == {f"m{i:05d}" for i in range(8)}
    assert await sidecar.scrape_errors("model_cap") == 2 * 9_992
    # same series as with 8 models (only error counters change value, not number)
    assert len(series) == with_eight
    assert await sidecar.value("specwatch_target_up", target="fly") == 1


@pytest.mark.parametrize("sidecar", [{"max_engines_per_target": 64}], indirect=True)
async def test_ten_thousand_engines_keep_the_cap(sidecar: Sidecar) -> None:
    """One model with 10,000 engines: 64 kept (engines 0..63 in sorted label order is
    "0", "1", "10", "100", ...: the first 64 strings), 9,936 per page counted as
    ``engine_cap``."""
    engines = [("m", str(i)) for i in range(10_000)]
    assert await sidecar.scrape(page(engines, 100))
    assert await sidecar.scrape(page(engines, 200))  # per-engine values need two pages
    series = await sidecar.series()
    kept = _labels(series, "engine")
    assert kept == set(sorted(str(i) for i in range(10_000))[:64])
    assert await sidecar.scrape_errors("engine_cap") == 2 * (10_000 - 64)


async def test_memory_stays_bounded_over_ten_thousand_models(sidecar: Sidecar) -> None:
    """Ten pages with 1,000 new model names each (10,000 distinct in all), every one absent from
    the next page: after the stale period the state of every vanished model is pruned. Memory
    still held after the last page (tracemalloc, after a full GC) grows by less than 8 MiB over
    the 2-model baseline: the parser's series memo (at most 16,384 entries) is the only cache
    that keeps page text, and each of the 8 kept models holds a few windows of counters."""
    assert await sidecar.scrape(page([("base", "0")], 1))
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for batch in range(10):
            names = [(f"x{batch}-{i:04d}", "0") for i in range(1_000)]
            assert await sidecar.scrape(page(names, 10 + batch))
            sidecar.wall_clock.advance(1800)  # past scrape.stale_series_seconds (default 1800)
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 8 * 1024 * 1024, grown
    series = await sidecar.series()
    assert len(_labels(series, "model_name")) <= 8


@pytest.mark.parametrize("sidecar", [{"max_models_per_target": 1}], indirect=True)
async def test_vanished_models_are_pruned_and_free_their_place(sidecar: Sidecar) -> None:
    """Cap 1: model ``a`` holds the place, so ``b`` is dropped (``model_cap`` 1) and nothing
    per model is shown (``a`` is not on the page); once ``a`` has been absent for the stale
    period (1800 s) its state is pruned and ``b`` takes the place."""
    assert await sidecar.scrape(page([("a", "0")], 100))
    assert await sidecar.scrape(page([("a", "0")], 110))
    assert _labels(await sidecar.series(), "model_name") == {"a"}
    assert await sidecar.scrape(page([("b", "0")], 100))
    assert _labels(await sidecar.series(), "model_name") == set()
    assert await sidecar.value("specwatch_scrape_errors_total", reason="model_cap") == 1
    sidecar.wall_clock.advance(1800)
    assert await sidecar.scrape(page([("b", "0")], 110))
    assert await sidecar.scrape(page([("b", "0")], 120))
    assert _labels(await sidecar.series(), "model_name") == {"b"}
    assert await sidecar.value("specwatch_scrape_errors_total", reason="model_cap") == 1


async def test_waiting_reasons_are_bounded(sidecar: Sidecar) -> None:
    """A page with 10,000 distinct ``reason`` values of ``num_requests_waiting_by_reason``: the
    first 16 in page order keep their own series, the other 9,984 (1 each) sum into
    ``other`` = 9,984."""
    body = page([("m", "0")], 100)
    body += "".join(
        f'vllm:num_requests_waiting_by_reason{{engine="0",model_name="m",reason="r{i:05d}"}} 1\n'
        for i in range(10_000)
    )
    assert await sidecar.scrape(body)
    series = await sidecar.series()
    reasons = {
        lab["reason"]: v
        for n, lab, v in series
        if n.startswith("specwatch_num_requests_waiting") and "engine" not in lab
    }
    assert len(reasons) == 17
    assert reasons["other"] == 9_984


async def test_alternating_counters_are_not_one_server(
    sidecar: Sidecar, caplog: pytest.LogCaptureFixture
) -> None:
    """Two servers behind one URL (a load balancer), answering in turn: A (started at t0,
    drafts 1000, 1010, 1020) and B (started at t1, drafts 50, 55, 60). A1 is good, B1 reads
    as one restart, and from A2 on every page continues an older page's series: four failed
    scrapes with reason ``counters_alternate`` (target down), one reset, not a stream of
    resets; each is a warning line naming the reason (the first, then repeats at debug)."""
    caplog.set_level("DEBUG", logger="specwatch")
    eng = [("m", "0")]
    pages = [
        page(eng, 1000, start=1.0e9),
        page(eng, 50, start=1.1e9),
        page(eng, 1010, start=1.0e9),
        page(eng, 55, start=1.1e9),
        page(eng, 1020, start=1.0e9),
        page(eng, 60, start=1.1e9),
    ]
    results = [await sidecar.scrape(p) for p in pages]
    assert results == [True, True, False, False, False, False]
    assert await sidecar.scrape_errors("counters_alternate") == 4
    assert await sidecar.value("specwatch_engine_resets_total", target="fly", engine="0") == 1
    assert await sidecar.value("specwatch_target_up", target="fly") == 0
    warned = [
        r
        for r in caplog.records
        if r.name == "specwatch.scrape"
        and r.levelname == "WARNING"
        and "counters_alternate" in str(r.__dict__)
    ]
    assert len(warned) == 1
    assert "not one server" in str(warned[0].__dict__)


async def test_alternating_counters_without_start_time(sidecar: Sidecar) -> None:
    """The same without ``process_start_time_seconds`` (multiprocess mode): B1 reads as a reset,
    A2 rises and is used, B2 and B3 fall below A and continue B1: ``counters_alternate`` 2,
    while A's pages keep being read (one reset in all)."""
    eng = [("m", "0")]
    pages = [page(eng, d, start=None) for d in (1000, 50, 1010, 55, 1020, 60)]
    results = [await sidecar.scrape(p) for p in pages]
    assert results == [True, True, True, False, True, False]
    assert await sidecar.scrape_errors("counters_alternate") == 2
    assert await sidecar.value("specwatch_engine_resets_total", target="fly", engine="0") == 1


async def test_one_server_restarting_is_a_reset_not_alternation(sidecar: Sidecar) -> None:
    """A true restart (new start time, counters from near 0, never back to the old series):
    two restarts are two resets and no ``counters_alternate``."""
    eng = [("m", "0")]
    pages = [
        page(eng, 1000, start=1.0e9),
        page(eng, 5, start=1.1e9),
        page(eng, 20, start=1.1e9),
        page(eng, 3, start=1.2e9),
        page(eng, 9, start=1.2e9),
    ]
    assert [await sidecar.scrape(p) for p in pages] == [True] * 5
    assert await sidecar.scrape_errors("counters_alternate") == 0
    assert await sidecar.value("specwatch_engine_resets_total", target="fly", engine="0") == 2


def test_tracker_from_settings_keeps_the_scrape_groups_bounds() -> None:
    """``TargetTracker.from_settings`` takes the per-target caps of the ``scrape`` group: with
    ``max_models_per_target`` 1, model ``b`` of a page with models ``a`` and ``b`` is dropped and
    counted once as ``model_cap``; only ``a`` is kept."""
    tracker = TargetTracker.from_settings(
        TargetSettings(name="fly", url="http://h:1"),
        ScrapeSettings(max_models_per_target=1),
        {"1m": 60.0},
    )
    tracker.record_page(0.0, parse_page(page([("a", "0"), ("b", "0")], 5)), duration_seconds=None)
    assert tracker.capped == {"model_cap": 1, "engine_cap": 0}
    assert tracker.snapshot().scrape_errors == {"model_cap": 1}
    assert set(tracker.snapshot().windows["1m"]) == {"a"}
