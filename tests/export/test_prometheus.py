"""Export: catalogue vs docs, every family through promtool, JSON nulls, plugging components."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from specwatch.core.roles import Role
from specwatch.core.store import Store
from specwatch.export import catalogue
from specwatch.export.catalogue import CATALOGUE
from specwatch.export.json import snapshot_json
from specwatch.export.label_bounds import LABEL_BOUNDS
from specwatch.export.prometheus import SpecwatchCollector
from specwatch.export.snapshot import Snapshot, SnapshotGetter
from specwatch.observe.concurrency import ConcurrencyProfile, add_point, speculation_limit
from specwatch.observe.parse import parse_page
from specwatch.observe.settings import TargetSettings
from specwatch.observe.tracker import TargetTracker, build_view
from specwatch.server.app import STORE_KEY, build_app
from specwatch.settings import Settings
from specwatch.shadow.summary import Carried, LedgerView, build_shadow_stats
from specwatch.tools.fleet.catalogue import DOCUMENTED, DOCUMENTED_LABEL_BOUNDS, FLEET
from tests.fakes import REPO
from tests.fixture_files import body

ROOT = REPO


def _exported_name(name: str, kind: str) -> str:
    return name + "_total" if kind == "counter" else name


def _full_snapshot() -> Snapshot:
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
    view = build_view([std.snapshot(), fly.snapshot()], now=31.0)
    # a speculation limit between 1 running (standard 100 tokens/s per request, FLy 150) and 4
    # (standard 100, FLy 75): ln 1.5 / ln 2 of the way from 1 to 4 in log(running), 4^0.585
    std_p, fly_p = ConcurrencyProfile(), ConcurrencyProfile()
    for _ in range(8):
        std_p = add_point(std_p, 1, 100.0, 0.01)
        fly_p = add_point(fly_p, 1, 150.0, 0.008)
        std_p = add_point(std_p, 4, 400.0, 0.01)
        fly_p = add_point(fly_p, 4, 300.0, 0.012)
    return Snapshot(observe=replace(view, speculation_limit=speculation_limit(std_p, fly_p)))


class TestCatalogue:
    def test_every_label_states_its_bound(self) -> None:
        """Every label of every exported family has a bound in ``LABEL_BOUNDS``, and every bound
        names a label in use; ``docs/metrics.md`` has the label bounds section."""
        used = {label for spec in CATALOGUE for label in spec.labels}
        assert used == set(LABEL_BOUNDS)
        documented = {label for spec in DOCUMENTED for label in spec.labels}
        assert documented == set(DOCUMENTED_LABEL_BOUNDS)
        assert "## Label bounds" in (ROOT / "docs/metrics.md").read_text()

    def test_every_family_documented(self) -> None:
        """Each exported family appears in docs/metrics.md (the one written list of names)."""
        metrics_doc = (ROOT / "docs/metrics.md").read_text()
        for spec in DOCUMENTED:
            name = _exported_name(spec.name, spec.kind)
            assert f"`{name}`" in metrics_doc, name

    def test_names_follow_conventions(self) -> None:
        """specwatch_ prefix, snake case, no _total on gauges."""
        for spec in DOCUMENTED:
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

    def test_k_from_the_page_completes_the_token_budget(self) -> None:
        """A target configured with N, B and the method but no K: the budget series use the
        page's own K (4 position labels), exported with source="observed"; a configured K that
        the page contradicts (6) loses to it. draft_model K=4 on 0.32: S=1, so
        D_full = min(128, 512 // 5, 512 // 6) = 85, the same as with K=4 configured."""
        mid = parse_page(body("vllm-metrics/real-cpu-draft-model-midflight.txt"))

        def tracker(name: str, k: int | None) -> TargetTracker:
            settings = TargetSettings(
                name=name,
                url=f"http://{name}:1",
                role=Role.STANDARD,
                max_num_seqs=128,
                max_num_batched_tokens=512,
                num_speculative_tokens=k,
                method="draft_model",
                vllm_version="0.32.0",
            )
            return TargetTracker(settings, {"1m": 60.0})

        unset, stale = tracker("a", None), tracker("b", 6)
        for tracker_ in (unset, stale):
            tracker_.record_page(0.0, mid, duration_seconds=0.01)
        snap = Snapshot(observe=build_view([unset.snapshot(), stale.snapshot()], now=1.0))
        reg = CollectorRegistry()
        reg.register(SpecwatchCollector(lambda: snap))
        get = reg.get_sample_value
        for name in ("a", "b"):
            cap = {"target": name, "role": "standard"}
            assert get("specwatch_speculative_tokens", {**cap, "source": "observed"}) == 4
            assert get("specwatch_speculative_tokens", {**cap, "source": "configured"}) is None
            assert get("specwatch_limits_configured", cap) == 1
            assert get("specwatch_decode_full_per_step_requests", cap) == 85

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
        self, app: web.Application, store: Store[Snapshot], registry: CollectorRegistry
    ) -> None:
        async def route(request: web.Request) -> web.Response:
            return web.json_response({"ok": True})

        store.subscribe(self.seen.append)

        async def ctx(app: web.Application) -> Any:
            stats = build_shadow_stats({}, now=0.0, ledger=LedgerView(rows=3))
            store.update(lambda snap: replace(snap, shadow=stats))
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
    """A component adds a route, a background context and a family; the typed shadow part it
    publishes reaches the JSON and every store listener."""
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
        assert snap["shadow"]["ledger_rows"] == 3
        assert snap["shadow"]["alpha"] == 0.05
        published = app[STORE_KEY].get().shadow
        assert published is not None
        assert published.ledger_rows == 3
        assert comp.seen[-1].shadow is published  # listeners see each publish
    assert comp.stopped


# -- catalogue: the only source of families --------------------------------------------------


def _doc_tables() -> list[tuple[str, list[str], list[list[str]]]]:
    """(text before the table since the previous one, header cells, rows) of every table in the
    'Exported metrics' section of docs/metrics.md."""
    text = (ROOT / "docs/metrics.md").read_text(encoding="utf-8")
    section = text.split("## Exported metrics", 1)[1].split("\n## ", 1)[0]
    tables: list[tuple[str, list[str], list[list[str]]]] = []
    intro: list[str] = []
    rows: list[list[str]] = []
    header: list[str] | None = None
    for line in [*section.splitlines(), ""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if header is None:
                header = cells
            elif not set(line) <= {"|", "-", " "}:
                rows.append(cells)
            continue
        if header is not None:
            tables.append(("\n".join(intro), header, rows))
            intro, rows, header = [], [], None
        intro.append(line)
    return tables


def _names(cell: str) -> list[str]:
    """Backticked names of a cell, without parenthesised value lists."""
    return re.findall(r"`([^`]+)`", re.sub(r"\([^)]*\)", "", cell))


def _base_labels(intro: str) -> set[str]:
    """Labels a table's heading or intro gives every row (``[, engine]`` rows left out)."""
    if "per `window` and `category`" in intro:
        return {"window", "category"}
    heading = intro.strip().splitlines()[-1] if intro.strip() else ""
    match = re.search(r"labels (`[^;)]*)", heading)
    if match is None:
        return set()
    found = ",".join(_names(match.group(1))).replace("[, engine]", "")
    return {label.strip() for label in found.split(",") if label.strip()}


def documented_families() -> dict[str, tuple[str, set[str]]]:
    """Exposed name → (type, labels) as docs/metrics.md states them."""
    out: dict[str, tuple[str, set[str]]] = {}
    for intro, header, rows in _doc_tables():
        base = _base_labels(intro)
        last_para = intro.strip().split("\n\n")[-1]
        for row in rows:
            cells = dict(zip(header, row, strict=True))
            kind = cells.get("type", "counter" if "ounters" in last_para else "gauge")
            labels = set(base)
            for col in ("labels", "extra labels"):
                labels |= set(_names(cells.get(col, "")))
            for name in _names(row[0]):
                out[name] = (kind, labels)
    return out


class TestCatalogueIsTheSource:
    def test_docs_match_catalogue(self) -> None:
        """docs/metrics.md lists exactly the sidecar's and the fleet view's families, each with
        its type and labels; the sidecar's catalogue has none of the fleet view's."""
        docs = documented_families()
        want = {spec.sample_name: (spec.kind, set(spec.labels)) for spec in DOCUMENTED}
        assert docs == want
        assert not {spec.name for spec in FLEET} & {spec.name for spec in CATALOGUE}

    def test_doc_parser_reads_a_known_row(self) -> None:
        """The doc parser finds labels in the heading and in the row, and the type column."""
        docs = documented_families()
        assert docs["specwatch_scrape_errors_total"] == ("counter", {"target", "reason"})
        assert docs["specwatch_per_position_acceptance_ratio"] == (
            "gauge",
            {"target", "role", "model_name", "window", "position"},
        )
        assert docs["specwatch_paired_mcnemar_p_value"] == (
            "gauge",
            {"window", "category", "alternative"},
        )
        assert docs["specwatch_shadow_arm_errors_total"] == ("counter", {"arm", "reason"})

    def test_family_not_in_catalogue_cannot_be_emitted(self) -> None:
        """A spec outside the catalogue, or of another collector's part, raises KeyError."""
        from specwatch.export.prometheus import _Families
        from specwatch.export.spec import MetricSpec

        fam = _Families(catalogue.OBSERVE)
        with pytest.raises(KeyError, match="specwatch_bogus"):
            fam.add(MetricSpec("specwatch_bogus", "gauge", "Not listed.", ()), (), 1.0)
        with pytest.raises(KeyError, match="specwatch_ledger_rows"):
            fam.add(catalogue.LEDGER_ROWS, (), 1.0)
        with pytest.raises(ValueError, match="labels"):
            fam.add(catalogue.TARGET_STALE, ("a", "b"), 1.0)

    def test_clashing_names_fail_at_registration(self) -> None:
        """With auto_describe, a second collector describing a registered name raises."""
        from specwatch.export.prometheus import ShadowCollector

        reg = CollectorRegistry(auto_describe=True)
        reg.register(ShadowCollector(lambda: None))
        with pytest.raises(ValueError, match="specwatch_"):
            reg.register(ShadowCollector(lambda: None))

    def test_app_registry_rejects_a_clashing_collector(self) -> None:
        """build_app's own registry refuses an extra collector that re-exports a core name."""

        def clash(get: SnapshotGetter) -> Collector:
            class _Clash(Collector):
                def collect(self) -> Any:
                    yield GaugeMetricFamily("specwatch_target_stale", "Clash.", value=1.0)

            return _Clash()

        settings = Settings(targets=(TargetSettings(name="fly", url="http://127.0.0.1:9"),))
        with pytest.raises(ValueError, match="specwatch_target_stale"):
            build_app(settings, scrape=False, extra_collectors=[clash])

    def test_every_shadow_io_counter_is_exported(self) -> None:
        """Each ShadowIO field, set to its own value, shows up as a sample value (no field is
        left unexported)."""
        from dataclasses import fields

        from specwatch.export.prometheus import ShadowCollector
        from specwatch.shadow.published import ShadowIO
        from specwatch.shadow.summary import build_shadow_stats

        values: dict[str, Any] = {}
        expected: dict[str, float] = {}
        for i, f in enumerate(fields(ShadowIO)):
            n = 1000 + i
            if f.name == "pause_text":  # the pause in words: the snapshot's and verdict's
                values[f.name] = "paused: standard has 3 requests waiting"
                continue
            if f.name == "paused":
                values[f.name], n = {"waiting": 1}, 1
            elif "Mapping[tuple" in str(f.type):
                values[f.name] = {("a", "b"): n}
            elif "Mapping" in str(f.type):
                values[f.name] = {"r": n}
            else:
                values[f.name] = n
            expected[f.name] = float(n)
        stats = build_shadow_stats({}, now=1.0, carried=Carried(io=ShadowIO(**values)))
        reg = CollectorRegistry()
        reg.register(ShadowCollector(lambda: stats))
        exposed = {
            s.value
            for fam in text_string_to_metric_families(generate_latest(reg).decode())
            for s in fam.samples
        }
        assert len(expected) == 26
        missing = {name: v for name, v in expected.items() if v not in exposed}
        assert not missing


# -- /metrics over HTTP: prometheus_client's handler ---------------------------------------


async def _served_metrics(headers: dict[str, str]) -> tuple[str, str, bytes]:
    """(Content-Type, Content-Encoding, raw body) of ``/metrics`` fetched over real HTTP."""
    settings = Settings(targets=(TargetSettings(name="fly", url="http://127.0.0.1:9"),))
    app = build_app(settings, scrape=False)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        async with (
            aiohttp.ClientSession(auto_decompress=False) as session,
            session.get(server.make_url("/metrics"), headers=headers) as resp,
        ):
            assert resp.status == 200
            return (
                resp.headers["Content-Type"],
                resp.headers.get("Content-Encoding", ""),
                await resp.read(),
            )
    finally:
        await server.close()


class TestMetricsEndpoint:
    async def test_text_format(self) -> None:
        """Accept: text/plain gets the Prometheus text format with build info and process series."""
        ctype, enc, raw = await _served_metrics(
            {"Accept": "text/plain", "Accept-Encoding": "identity"}
        )
        assert ctype.startswith("text/plain")
        assert enc == ""
        families = {f.name: f for f in text_string_to_metric_families(raw.decode())}
        assert families["specwatch_build_info"].samples[0].value == 1.0
        assert families["specwatch_scrape_errors"].type == "counter"
        assert "process_cpu_seconds" in families
        assert "python_info" in families
        assert "python_gc_objects_collected" in families

    async def test_openmetrics_format(self) -> None:
        """Accept: OpenMetrics 1.0.0 gets OpenMetrics, parsed by the OpenMetrics parser."""
        ctype, _, raw = await _served_metrics(
            {"Accept": "application/openmetrics-text; version=1.0.0", "Accept-Encoding": "identity"}
        )
        assert ctype.startswith("application/openmetrics-text; version=1.0.0")
        text = raw.decode()
        assert text.endswith("# EOF\n")
        parsed: list[Metric] = list(openmetrics_families(text))  # type: ignore[no-untyped-call]
        families = {f.name: f for f in parsed}
        assert families["specwatch_scrapes"].type == "counter"
        assert [s.value for s in families["specwatch_scrapes"].samples] == [0.0]
        assert families["specwatch_build_info"].samples[0].value == 1.0

    async def test_gzip(self) -> None:
        """Accept-Encoding: gzip gets a gzip body that decompresses to the text format."""
        ctype, enc, raw = await _served_metrics({"Accept-Encoding": "gzip"})
        assert ctype.startswith("text/plain")
        assert enc == "gzip"
        assert raw[:2] == b"\x1f\x8b"
        text = gzip.decompress(raw).decode()
        names = {f.name for f in text_string_to_metric_families(text)}
        assert {"specwatch_build_info", "specwatch_target_up"} <= names
