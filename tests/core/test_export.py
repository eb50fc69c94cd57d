"""Export: catalogue vs docs, every family through promtool, JSON nulls, plugging components."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from specwatch.export import catalogue
from specwatch.export.catalogue import CATALOGUE
from specwatch.export.json import snapshot_json
from specwatch.export.prometheus import SpecwatchCollector
from specwatch.observe.parse import parse_page
from specwatch.observe.settings import TargetSettings
from specwatch.observe.tracker import TargetTracker, build_snapshot
from specwatch.observe.values import SnapshotGetter
from specwatch.server.app import STORE_KEY, SnapshotStore, build_app
from specwatch.settings import Settings
from tests.core.conftest import body

ROOT = Path(__file__).resolve().parents[2]


def _exported_name(name: str, kind: str) -> str:
    return name + "_total" if kind == "counter" else name


def _full_snapshot() -> Any:
    """A standard and a fly target with limits, two pages each, every family populated."""
    mid = parse_page(body("vllm-metrics/real-cpu-draft-model-midflight.txt"))
    ngram = parse_page(body("vllm-metrics/real-cpu-ngram.txt"))
    std = TargetTracker(TargetSettings(name="standard", url="http://s:1"), {"1m": 60.0})
    fly = TargetTracker(
        TargetSettings(
            name="fly",
            url="http://f:1",
            max_num_seqs=128,
            max_num_batched_tokens=512,
            num_speculative_tokens=4,
            method="draft_model",
            vllm_version="0.32.0",
        ),
        {"1m": 60.0},
    )
    for tracker in (std, fly):
        tracker.record_page(0.0, ngram, duration_seconds=0.01)
        tracker.record_page(30.0, mid, duration_seconds=0.01)
    fly.record_error("timeout", duration_seconds=4.0)
    return build_snapshot([std.snapshot(), fly.snapshot()], now=31.0)


class TestCatalogue:
    def test_every_family_documented(self) -> None:
        """Each exported family appears in docs/metrics.md and in the architecture contract."""
        metrics_doc = (ROOT / "docs/metrics.md").read_text()
        contract = (ROOT / "docs/architecture.md").read_text()
        for spec in CATALOGUE:
            name = _exported_name(spec.name, spec.kind)
            assert f"`{name}`" in metrics_doc, name
            assert name in contract, name

    def test_names_follow_conventions(self) -> None:
        """specwatch_ prefix, snake case, no _total on gauges."""
        for spec in CATALOGUE:
            assert re.fullmatch(r"specwatch_[a-z0-9_]+", spec.name)
            assert spec.kind == "counter" or not spec.name.endswith("_total")


class TestCollector:
    def test_values_and_capacity(self) -> None:
        """Capacity of a configured draft_model target; the unconfigured one says so."""
        snap = _full_snapshot()
        reg = CollectorRegistry()
        reg.register(SpecwatchCollector(lambda: snap))
        get = reg.get_sample_value
        assert get("specwatch_limits_configured", {"target": "fly", "role": "fly"}) == 1
        assert get("specwatch_limits_configured", {"target": "standard", "role": "standard"}) == 0
        # draft_model K=4 on 0.32: S=1 → D_full = min(128, 512//5, 512//6) = 85
        assert (
            get("specwatch_decode_full_per_step_requests", {"target": "fly", "role": "fly"}) == 85
        )
        assert get("specwatch_running_gap_requests", {"target": "fly", "role": "fly"}) == 120
        assert get("specwatch_max_num_seqs", {"target": "standard", "role": "standard"}) is None
        assert get("specwatch_target_up", {"target": "fly", "role": "fly"}) == 0
        assert get("specwatch_target_stale", {"target": "fly"}) == 1
        assert get("specwatch_engine_resets_total", {"target": "fly", "engine": "0"}) == 1
        assert (
            get(
                "specwatch_num_requests_waiting_by_reason",
                {"target": "fly", "role": "fly", "model_name": "tiny", "reason": "capacity"},
            )
            == 4
        )
        # α over the reset window is the midflight page's own values: 0 accepted of 6308
        labels = {"target": "fly", "role": "fly", "model_name": "tiny", "window": "1m"}
        assert get("specwatch_acceptance_ratio", labels) == 0.0
        assert get("specwatch_acceptance_ratio", {**labels, "engine": "0"}) == 0.0
        assert (
            get(
                "specwatch_fly_mean_acceptance_length_ratio",
                {"window": "1m", "standard": "standard", "fly": "fly"},
            )
            == 1.0
        )

    @pytest.mark.promtool
    async def test_promtool_every_family(self) -> None:
        """promtool check metrics passes on output that has every observe family."""
        reg = CollectorRegistry()
        snap = _full_snapshot()
        reg.register(SpecwatchCollector(lambda: snap))
        text = generate_latest(reg)
        for spec in catalogue.OBSERVE:
            assert f"# TYPE {spec.name}" in text.decode(), spec.name
        proc = await asyncio.create_subprocess_exec(
            "/usr/bin/promtool",
            "check",
            "metrics",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await proc.communicate(text)
        assert proc.returncode == 0, out.decode() + err.decode()


class TestJson:
    def test_nulls_and_shape(self) -> None:
        """Undefined values are null (never NaN); the documented keys are present."""
        doc = snapshot_json(_full_snapshot())
        text = json.dumps(doc, allow_nan=False)
        assert "NaN" not in text
        fly = doc["targets"]["fly"]
        assert set(fly) >= {
            "role",
            "url",
            "up",
            "stale",
            "last_success",
            "limits",
            "capacity",
            "windows",
        }
        server = fly["windows"]["1m"]["server"]
        assert server["per_position_conditional_acceptance_rate"][1] is None  # 0/0
        assert server["acceptance_rate"] == 0.0
        assert set(doc) >= {"generated_at", "targets", "pair", "shadow", "alerts"}
        assert doc["pair"]["1m"]["mean_acceptance_length_ratio"] == 1.0


class _Component:
    """A stand-in for the shadow/alerting components: one route, one task, one family."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.stopped = False
        self.seen: list[Any] = []

    def install(
        self, app: web.Application, store: SnapshotStore, registry: CollectorRegistry
    ) -> None:
        async def route(request: web.Request) -> web.Response:
            return web.json_response({"ok": True})

        store.add_listener(self.seen.append)

        async def ctx(app: web.Application) -> Any:
            store.set_extra("shadow", {"pairs": 3})
            self.started.set()
            yield
            self.stopped = True

        app.router.add_get("/api/v1/shadow", route)
        app.cleanup_ctx.append(ctx)

        class _C(Collector):
            def collect(self) -> Any:
                fam = GaugeMetricFamily("specwatch_shadow_queue_depth", "Queue depth.")
                fam.add_metric([], 2.0)
                yield fam

        registry.register(_C())


def _extra(get: SnapshotGetter) -> Collector:
    class _X(Collector):
        def collect(self) -> Any:
            fam: Metric = GaugeMetricFamily(
                "specwatch_paired_n", "Pairs.", value=float(len(get().targets))
            )
            yield fam

    return _X()


async def test_components_plug_in() -> None:
    """A component adds a route, a background context and a family; extras reach the JSON."""
    comp = _Component()
    settings = Settings(targets=(TargetSettings(name="fly", url="http://127.0.0.1:9"),))
    app = build_app(settings, scrape=False, components=[comp], extra_collectors=[_extra])
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        assert comp.started.is_set()
        assert (await client.get("/api/v1/shadow")).status == 200
        text = await (await client.get("/metrics")).text()
        assert "specwatch_shadow_queue_depth 2.0" in text
        assert "specwatch_paired_n 1.0" in text
        snap = json.loads(await (await client.get("/api/v1/snapshot")).text())
        assert snap["shadow"] == {"pairs": 3}
        assert app[STORE_KEY].get().extras["shadow"] == {"pairs": 3}
        assert comp.seen[-1].extras["shadow"] == {"pairs": 3}  # listeners see each publish
    assert comp.stopped
