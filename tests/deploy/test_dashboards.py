"""Grafana dashboards under grafana/: reviewed JSON that keeps the mixin discipline.

Checks: valid JSON; fixed unique ``uid``; no dashboard ``id``; the ``datasource``, ``namespace``
and ``job`` template variables; every panel on the ``${datasource}`` variable; every metric a
name specwatch's code exports (``specwatch.export.catalogue.CATALOGUE``, read back from the
collectors' exposition: counters with ``_total``) or a
vLLM series (taken from a real vLLM ``/metrics`` capture in tests/fixtures);
``$__rate_interval`` in every range function;
every PromQL expression accepted by ``promtool check rules`` (wrapped as throwaway recording
rules after Grafana variables are substituted). Whether each panel returns data from a real
Prometheus is ``tests/e2e/test_dashboards_prometheus.py``.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.core.config import SINCE_START
from specwatch.core.listen import ListenerStats
from specwatch.export import catalogue
from specwatch.export.catalogue import CATALOGUE
from specwatch.export.prometheus import ListenerCollector, ShadowCollector
from specwatch.settings import Settings
from specwatch.shadow.decision import decision_table
from specwatch.shadow.published import ShadowIO, ShadowStats
from specwatch.shadow.summary import (
    Carried,
    LedgerView,
    Levels,
    OrderedState,
    ProcessCounts,
    build_shadow_stats,
    load_bands,
)
from specwatch.shadow.tally import ArmTotals, PairTally
from specwatch.tools.fleet import catalogue as catalogue_fleet
from tests.fakes import REPO

ROOT = REPO
GRAFANA = ROOT / "grafana"
VLLM_CAPTURE = ROOT / "tests" / "fixtures" / "vllm-metrics" / "real-cpu-draft-model.txt"
DASHBOARD_FILES = sorted(GRAFANA.glob("*.json"))

#: Series Prometheus itself makes for alerting rules.
PROMETHEUS_BUILTINS = frozenset({"ALERTS", "ALERTS_FOR_STATE"})
#: Window label values the dashboards offer: the default observe windows plus ``since_start``.
WINDOWS = [*Settings().windows, SINCE_START]
GRAFANA_GLOBALS = frozenset({"__rate_interval", "__interval", "__range"})
PROMQL_KEYWORDS = frozenset(
    {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring",
     "group_left", "group_right", "inf", "nan", "atan2"}
)  # fmt: skip
RANGE_FUNCTIONS = ("rate", "irate", "increase", "delta", "idelta", "deriv")

Obj = dict[str, Any]


def load(path: Path) -> Obj:
    return cast(Obj, json.loads(path.read_text(encoding="utf-8")))


def core_exported_names() -> frozenset[str]:
    """Sample names of the observe families (``OBSERVE``; counters get ``_total``)."""
    return frozenset(spec.sample_name for spec in catalogue.OBSERVE)


def full_shadow_stats() -> ShadowStats:
    """A ShadowStats with every optional part present, so every shadow family has samples."""
    tally = PairTally(
        both_correct=50, lost=6, gained=2, both_wrong=8, noise_both_correct=20, noise_lost=1,
        agree=60, disagree=6, noise_agree=25, noise_disagree=2, flip_fly_only=3, flip_noise_only=1,
        flip_both=1, flip_neither=20, lossless_spec_only=3, lossless_neither=10, unpaired=1,
        excluded=1,
    )  # fmt: skip
    return build_shadow_stats(
        {"since_start": {"math": tally}},
        now=1.0,
        counts=ProcessCounts(
            pairs_total={("math", "fly", "lost"): 6},
            unpaired_total={"fly_timeout": 1},
            excluded_total={"unsupported_parameter": 1},
            replays_total={"paired": 7, "unpaired": 1, "excluded": 1},
        ),
        ordered=OrderedState(
            betting_log_e_value=0.5, change_log_value=1.5, change_threshold=50_000.0
        ),
        ledger=LedgerView(rows=68, write_errors={"OperationalError": 0}),
        carried=Carried(
            io=ShadowIO(
                queue_depth=1,
                in_flight=1,
                offered=40,
                not_sampled=30,
                admitted=9,
                dropped={"queue_full": 0, "paused": 1},
                paused={"waiting": 0},
                pauses_total={"waiting": 2},
                received={"mirror": 38, "proxy": 4},
                ingest_errors={("mirror", "too_large"): 1, ("proxy", "invalid_json"): 1},
                arm_errors={("fly", "timeout"): 1, ("noise", "invalid_body"): 1},
                sink_errors=1,
                proxy_requests=4,
                proxy_client_disconnects=1,
                proxy_upstream_errors={"connect": 1},
                canary_offered=3,
                canary_bad_lines={"invalid_json": 2},
                replay_retries={"noise": 1},
                token_count_failures={("fly", "http_404"): 1},
                reply_spec_steps={("fly", "math"): 5},
                reply_draft_tokens={("fly", "math"): 20},
                reply_accepted_tokens={("fly", "math"): 12},
                reply_finishes={("fly", "stop"): 4, ("fly", "length"): 2},
                reply_finishes_with_spec={("fly", "length"): 2},
                reply_spec_refused={("fly", "histogram_steps"): 1},
            ),
            decisions=decision_table(
                {"math": tally},
                {
                    "math": ArmTotals(
                        tau_pairs=5,
                        standard_steps=10,
                        standard_accepted=10,
                        fly_steps=10,
                        fly_accepted=20,
                        speed_pairs=10,
                        standard_tokens=100,
                        fly_tokens=100,
                        standard_seconds=10.0,
                        fly_seconds=8.0,
                        decode_pairs=10,
                        standard_decode_tokens=90,
                        fly_decode_tokens=90,
                        standard_decode_seconds=9.0,
                        fly_decode_seconds=6.0,
                        standard_ttft_seconds=1.0,
                        fly_ttft_seconds=2.0,
                        standard_decode_tokens_sq=810,
                        fly_decode_tokens_sq=810,
                        standard_decode_cross=81.0,
                        fly_decode_cross=54.0,
                        standard_decode_seconds_sq=8.2,
                        fly_decode_seconds_sq=3.7,
                    )
                },
                levels=Levels(alpha=0.05, margin=0.01, detect_net_loss=0.02),
            ),
            by_load=load_bands({"0-7": tally}, ("0-7", "8-31", "32+")),
        ),
    )


def shadow_exported_names() -> frozenset[str]:
    """Sample names the shadow exporter exposes, read back from real exposition text."""
    registry = CollectorRegistry(auto_describe=False)
    stats = full_shadow_stats()
    registry.register(ShadowCollector(lambda: stats))
    text = generate_latest(registry).decode()
    return frozenset(
        sample.name
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.name.endswith("_created")
    )


def vllm_sample_names(exposition: str) -> frozenset[str]:
    """Sample names (``vllm:*_total``, ``*_bucket``, ...) in a vLLM /metrics capture."""
    return frozenset(
        sample.name
        for family in text_string_to_metric_families(exposition)
        for sample in family.samples
        if sample.name.startswith("vllm:")
    )


def alert_exported_names() -> frozenset[str]:
    """Sample names of the alerting families (``ALERTS``; counters get ``_total``)."""
    return frozenset(spec.sample_name for spec in catalogue.ALERTS)


def listener_exported_names() -> frozenset[str]:
    """Sample names of the listener families, exposed by a real collector over two listeners."""
    reg = CollectorRegistry()
    reg.register(ListenerCollector(lambda: [ListenerStats("main"), ListenerStats("proxy")]))
    text = generate_latest(reg).decode()
    return frozenset(s.name for fam in text_string_to_metric_families(text) for s in fam.samples)


def fleet_exported_names() -> frozenset[str]:
    """Sample names of the fleet view's families (``FLEET``; counters get ``_total``)."""
    return frozenset(spec.sample_name for spec in catalogue_fleet.FLEET)


EXPORTED = (
    core_exported_names()
    | shadow_exported_names()
    | alert_exported_names()
    | listener_exported_names()
    | fleet_exported_names()
)
VLLM = vllm_sample_names(VLLM_CAPTURE.read_text(encoding="utf-8"))
#: Sample names of the SGLang pages in tests/fixtures/sglang (each names its source in its header).
SGLANG = frozenset(
    sample.name
    for page in sorted((REPO / "tests/fixtures/sglang").glob("*.metrics"))
    for family in text_string_to_metric_families(page.read_text(encoding="utf-8"))
    for sample in family.samples
    if sample.name.startswith("sglang:")
)


def iter_panels(dashboard: Obj) -> Iterator[Obj]:
    """Every panel, including panels nested in collapsed rows."""
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


def iter_exprs(dashboard: Obj) -> Iterator[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable's selector."""
    for panel in iter_panels(dashboard):
        for target in panel.get("targets", []):
            yield f"panel {panel['id']} {panel['title']!r} {target['refId']}", target["expr"]
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", var["query"]["query"])
            assert match, var["name"]
            yield f"variable {var['name']}", match.group(1)


#: Panel types that draw no values, so carry no unit.
UNITLESS_PANEL_TYPES = frozenset({"row", "text"})


def panels_without_unit(dashboard: Obj) -> list[str]:
    """Titles of value-drawing panels whose ``fieldConfig.defaults.unit`` is unset or empty."""
    return [
        str(panel["title"])
        for panel in iter_panels(dashboard)
        if panel["type"] not in UNITLESS_PANEL_TYPES
        and not panel.get("fieldConfig", {}).get("defaults", {}).get("unit")
    ]


def substitute_variables(expr: str, dashboard: Obj) -> str:
    """Replace Grafana variables the way Grafana would at query time, with sample values."""
    values = {name: "5m" for name in GRAFANA_GLOBALS}
    for var in dashboard["templating"]["list"]:
        values[var["name"]] = "5m" if var["name"] == "window" else "x"

    def repl(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        assert name in values, f"undefined variable ${name}"
        return values[name]

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", repl, expr)


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression selects (strings, matchers, ranges, groupings removed)."""
    s = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", s)
    names = set()
    for match in re.finditer(r"(?<![\w.:])[A-Za-z_:][A-Za-z0-9_:]*", s):
        rest = s[match.end() :].lstrip()
        if rest.startswith("(") or match.group(0) in PROMQL_KEYWORDS:
            continue
        names.add(match.group(0))
    return names


def selectors(expr: str) -> list[str]:
    """Label-matcher blocks ``{...}`` of an expression."""
    return re.findall(r"\{([^}]*)\}", expr)


@pytest.fixture(scope="module", params=DASHBOARD_FILES, ids=lambda p: p.stem)
def dashboard(request: pytest.FixtureRequest) -> Obj:
    return load(cast(Path, request.param))


class TestHelpers:
    def test_metric_names_skips_functions_labels_and_ranges(self) -> None:
        """Only selected series are names: not functions, label names, durations or keywords."""
        expr = (
            'histogram_quantile(0.99, sum by (le, container) (rate(vllm:x_bucket{job="j", '
            'q=~"a|b"}[5m]))) / on (container) group_left (pod) specwatch_a offset 1h '
            "and specwatch_b > bool 1e3"
        )
        assert metric_names(expr) == {"vllm:x_bucket", "specwatch_a", "specwatch_b"}

    def test_exported_names_come_from_the_code(self) -> None:
        """Core and shadow names as exposed: counters with ``_total``, renamed ones gone."""
        for name in ("specwatch_build_info", "specwatch_acceptance_ratio",
                     "specwatch_fly_acceptance_gain_ratio", "specwatch_budget_bound",
                     "specwatch_engine_resets_total", "specwatch_scrapes_total",
                     "specwatch_shadow_pairs_total", "specwatch_paired_e_value",
                     "specwatch_shadow_dropped_total", "specwatch_shadow_paused",
                     "specwatch_ledger_write_errors_total", "specwatch_flip_ratio"):  # fmt: skip
            assert name in EXPORTED
        for gone in ("specwatch_counter_resets_total", "specwatch_scrapes", "specwatch_"):
            assert gone not in EXPORTED
        # no name exported twice
        assert len(EXPORTED) == len(CATALOGUE) + len(catalogue_fleet.FLEET)

    def test_shadow_names_are_all_read_back(self) -> None:
        """Every shadow family of the catalogue has samples in the full stats used above."""
        families = {spec.name for spec in catalogue.SHADOW}
        exposed = {n.removesuffix("_total") for n in shadow_exported_names()}
        assert families <= exposed

    def test_vllm_names_from_capture(self) -> None:
        """The real capture yields spec-decode counters and histogram buckets."""
        assert "vllm:spec_decode_num_accepted_tokens_total" in VLLM
        assert "vllm:inter_token_latency_seconds_bucket" in VLLM


class TestDashboardSet:
    def test_overview_shows_engine_resets(self) -> None:
        """The overview's self-health row charts the core's engine-resets counter."""
        overview = load(GRAFANA / "specwatch-overview.json")
        used = {n for _, expr in iter_exprs(overview) for n in metric_names(expr)}
        assert "specwatch_engine_resets_total" in used

    def test_four_dashboards_with_unique_fixed_uids(self) -> None:
        """overview, capacity, quality and alerts exist; uids equal file stems and are unique."""
        uids = [load(p)["uid"] for p in DASHBOARD_FILES]
        assert uids == [p.stem for p in DASHBOARD_FILES]
        assert sorted(uids) == [
            "specwatch-alerts", "specwatch-capacity", "specwatch-overview", "specwatch-quality",
        ]  # fmt: skip
        assert all(len(uid) <= 40 for uid in uids)
        titles = [load(p)["title"] for p in DASHBOARD_FILES]
        assert len(set(titles)) == len(titles)

    def test_files_are_canonical_json(self) -> None:
        """Files are two-space-indented JSON with a final newline, so review diffs stay small."""
        for path in DASHBOARD_FILES:
            text = path.read_text(encoding="utf-8")
            assert text == json.dumps(json.loads(text), indent=2, ensure_ascii=False) + "\n"


class TestDashboard:
    def test_no_id_and_fixed_uid(self, dashboard: Obj) -> None:
        """No numeric dashboard id (Grafana assigns it); uid fixed; not editable in place."""
        assert "id" not in dashboard
        assert re.fullmatch(r"specwatch-[a-z]+", dashboard["uid"])
        assert dashboard["editable"] is False

    def test_template_variables(self, dashboard: Obj) -> None:
        """datasource, cluster, namespace, job and pod come first, each filtered by the ones
        before it; cluster and pod default to All (``.*``, which also matches a series without
        the label), namespace and job to the first value Prometheus has."""
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        names = [v["name"] for v in dashboard["templating"]["list"]]
        assert names[:5] == ["datasource", "cluster", "namespace", "job", "pod"]
        assert variables["datasource"]["type"] == "datasource"
        assert variables["datasource"]["query"] == "prometheus"
        assert "$cluster" in variables["namespace"]["query"]["query"]
        assert "$namespace" in variables["job"]["query"]["query"]
        assert "$job" in variables["pod"]["query"]["query"]
        for name in ("cluster", "pod"):
            assert variables[name]["includeAll"] is True
            assert variables[name]["allValue"] == ".*"
            assert variables[name]["current"]["value"] == "$__all"

    def test_model_variable_where_series_have_model_name(self, dashboard: Obj) -> None:
        """A dashboard reading per-target series (labels ``model_name``) offers a ``model``
        variable, and every selector of such a series filters by it."""
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        with_model = {s.sample_name for s in CATALOGUE if "model_name" in s.labels}
        selectors = [
            (name, body)
            for where, expr in iter_exprs(dashboard)
            if where.startswith("panel")
            for name, body in re.findall(r"([a-z_:]+)\{([^}]*)\}", expr)
        ]
        read = [(n, b) for n, b in selectors if n in with_model or n.startswith("vllm:")]
        assert ("model" in variables) == any(n in with_model for n, _ in read)
        if "model" in variables:
            assert variables["model"]["allValue"] == ".*"
            for name, body in read:
                if name.startswith("vllm:") or "$job" in body:
                    assert 'model_name=~"$model"' in body, name

    def test_window_options_are_the_windows_the_series_have(self, dashboard: Obj) -> None:
        """The window variable offers exactly the windows its series are exported for under the
        default settings, and defaults to one of them: the paired statistics' windows
        (``paired.windows`` + since_start) on the Quality dashboard, the core rolling windows
        (``windows`` + since_start) elsewhere."""
        variables = {v["name"]: v for v in dashboard["templating"]["list"]}
        if "window" not in variables:
            return
        settings = Settings()
        if dashboard["uid"] == "specwatch-quality":
            expected = [*settings.paired.windows, SINCE_START]
            assert expected == ["15m", "1h", "24h", "since_start"]
        else:
            expected = [*settings.windows, SINCE_START]
            assert expected == WINDOWS
        window = variables["window"]
        assert [o["value"] for o in window["options"]] == expected
        assert window["query"] == ",".join(expected)
        assert window["current"]["value"] in expected
        selected = [o["value"] for o in window["options"] if o["selected"]]
        assert selected == [window["current"]["value"]]

    def test_every_query_uses_the_datasource_variable(self, dashboard: Obj) -> None:
        """Panels, targets and query variables point at ${datasource}, never a fixed uid."""
        expected = {"type": "prometheus", "uid": "${datasource}"}
        for panel in iter_panels(dashboard):
            if panel["type"] == "row":
                continue
            assert panel["datasource"] == expected, panel["title"]
            assert panel["targets"], panel["title"]
            for target in panel["targets"]:
                assert target["datasource"] == expected
        for var in dashboard["templating"]["list"]:
            if var["type"] == "query":
                assert var["datasource"] == expected

    def test_panel_ids_unique_and_grid_fits(self, dashboard: Obj) -> None:
        """Panel ids are unique and panels stay inside 24 columns without overlapping."""
        panels = list(iter_panels(dashboard))
        ids = [p["id"] for p in panels]
        assert len(set(ids)) == len(ids)
        cells: set[tuple[int, int]] = set()
        for p in panels:
            g = p["gridPos"]
            assert g["x"] >= 0, p["title"]
            assert g["x"] + g["w"] <= 24, p["title"]
            cover = {
                (x, y)
                for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])
            }
            assert not cells & cover, f"overlap at {p['title']}"
            cells |= cover

    def test_metric_names_are_exported_or_vllm(self, dashboard: Obj) -> None:
        """Every selected series is exported by specwatch's code, a vLLM or SGLang series (as
        their captured pages name them), or ALERTS."""
        for where, expr in iter_exprs(dashboard):
            names = metric_names(expr)
            assert names, where
            unknown = names - EXPORTED - VLLM - SGLANG - PROMETHEUS_BUILTINS
            assert not unknown, f"{where}: {sorted(unknown)}"

    def test_rates_use_rate_interval(self, dashboard: Obj) -> None:
        """rate/irate/increase/... take ``[$__rate_interval]`` so short scrapes still draw."""
        for where, expr in iter_exprs(dashboard):
            for fn in RANGE_FUNCTIONS:
                for match in re.finditer(rf"\b{fn}\s*\(", expr):
                    window = re.search(r"\[([^\]]*)\]", expr[match.end() :])
                    assert window, where
                    assert window.group(1) == "$__rate_interval", where

    def test_every_value_panel_has_a_unit(self, dashboard: Obj) -> None:
        """Every panel that draws values (not text or row) sets ``fieldConfig.defaults.unit``."""
        assert panels_without_unit(dashboard) == []

    def test_panels_on_seconds_series_are_in_seconds(self, dashboard: Obj) -> None:
        """A panel whose every series is a ``_seconds`` one shows unit ``s``."""
        for panel in iter_panels(dashboard):
            names = {n for t in panel.get("targets", []) for n in metric_names(t["expr"])}
            if names and all(n.removesuffix("_bucket").endswith("_seconds") for n in names):
                assert panel["fieldConfig"]["defaults"]["unit"] == "s", panel["title"]

    def test_a_panel_without_unit_is_caught(self) -> None:
        """The unit check names a stat panel with an empty ``defaults`` and passes text and rows."""
        board = {
            "panels": [
                {"type": "text", "title": "note"},
                {"type": "row", "title": "row", "panels": [
                    {"type": "stat", "title": "bare", "fieldConfig": {"defaults": {}}},
                    {"type": "timeseries", "title": "ok",
                     "fieldConfig": {"defaults": {"unit": "s"}}},
                ]},
                {"type": "table", "title": "no fieldConfig"},
            ]
        }  # fmt: skip
        assert panels_without_unit(board) == ["bare", "no fieldConfig"]

    def test_queries_scoped_to_cluster_namespace_and_job(self, dashboard: Obj) -> None:
        """Every selector names $cluster and $namespace; all but ALERTS, the serving engines'
        series and the namespace and job variables name $job; a vLLM (``vllm:*``) or SGLang
        (``sglang:*``) selector names ``role!=""``
        instead (the vLLM servers are scraped by their own job in the standalone layout, and
        told apart by role, never by container); every specwatch_* selector of a panel names
        $pod."""
        for where, expr in iter_exprs(dashboard):
            if where == "variable cluster":
                # the root of the chain lists every cluster (the mixin rewrites this exact query)
                assert expr == "specwatch_build_info", where
                continue
            blocks = selectors(expr)
            assert blocks, where
            for block in blocks:
                # first, so the mixin's _config can rewrite it (deploy/mixin/dashboards.libsonnet)
                assert block.startswith('cluster=~"$cluster"'), where
                if where == "variable namespace":
                    continue
                assert 'namespace="$namespace"' in block, where
                if "ALERTS" in expr or where == "variable job":
                    continue
                if f"vllm:{{{block}}}" in re.sub(r"(?:vllm|sglang):[a-z_]+\{", "vllm:{", expr):
                    assert 'role!=""' in block, where
                    assert "job=" not in block, where
                else:
                    assert 'job="$job"' in block, where
            if where.startswith("panel"):
                for name, body in re.findall(r"([a-z_:]+)\{([^}]*)\}", expr):
                    if name.startswith("specwatch_"):
                        assert 'pod=~"$pod"' in body, where
                    if name.startswith("vllm:"):
                        assert "container" not in expr, where

    def test_variables_used_are_defined(self, dashboard: Obj) -> None:
        """Each $var in a query is a template variable of this dashboard or a Grafana global."""
        defined = {v["name"] for v in dashboard["templating"]["list"]} | GRAFANA_GLOBALS
        for where, expr in iter_exprs(dashboard):
            used = {a or b for a, b in re.findall(r"\$\{(\w+)\}|\$(\w+)", expr)}
            assert used <= defined, where


def promtool_check(rules: Obj, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool missing (Debian package prometheus)"
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False), encoding="utf-8")
    return subprocess.run(
        [promtool, "check", "rules", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def as_recording_rules(dashboard: Obj) -> Obj:
    rules = [
        {"record": f"dashboard:expr_{n}:check", "expr": substitute_variables(expr, dashboard)}
        for n, (_, expr) in enumerate(iter_exprs(dashboard))
    ]
    return {"groups": [{"name": dashboard["uid"], "rules": rules}]}


@pytest.mark.promtool
class TestPromQL:
    def test_every_expression_parses(self, dashboard: Obj, tmp_path: Path) -> None:
        """promtool accepts all of the dashboard's PromQL wrapped as recording rules."""
        rules = as_recording_rules(dashboard)
        proc = promtool_check(rules, tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"SUCCESS: {len(rules['groups'][0]['rules'])} rules found" in proc.stdout

    def test_a_broken_expression_is_caught(self, tmp_path: Path) -> None:
        """The same harness fails on an unbalanced expression, so the check above can fail."""
        bad = {"groups": [{"name": "x", "rules": [{"record": "a:b:c", "expr": "sum(rate(x[5m])"}]}]}
        assert promtool_check(bad, tmp_path).returncode != 0


@pytest.mark.promtool
def test_sglang_panels_read_one_rank_of_a_tp2_server(tmp_path: Path) -> None:
    """The overview's SGLang panels, evaluated by promtool over the series of the SGLang 0.5.23
    EAGLE3 TP=2 page (tests/fixtures/sglang) advancing per minute by one tenth of the page's
    totals: τ from the counters = (38528 + 9632) / 17200 = 2.8 (481600 / 172000 on the page), the
    interval gauge 2.8, running 32 and queued 0 from tensor-parallel rank 0, never 64 (the two
    ranks summed)."""
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool missing (Debian prometheus package)"
    overview = json.loads((GRAFANA / "specwatch-overview.json").read_text(encoding="utf-8"))
    values = {"cluster": ".*", "namespace": "ns", "model": ".*", "__rate_interval": "5m"}
    queries = {
        (p["title"], t["refId"]): re.sub(r"\$(\w+)", lambda m: values[m.group(1)], t["expr"])
        for p in iter_panels(overview)
        if p["title"].startswith(("τ from SGLang", "SGLang running"))
        for t in p["targets"]
    }
    assert len(queries) == 4
    base = 'namespace="ns", role="fly", model_name="m", engine_type="unified"'
    series = [
        (f'sglang:generation_tokens_total{{{base}, is_streaming="false"}}', "0+38528x20"),
        (f'sglang:generation_tokens_total{{{base}, is_streaming="true"}}', "0+9632x20"),
        (f"sglang:spec_verify_calls_total{{{base}}}", "0+17200x20"),
    ]
    for rank in ("0", "1"):
        ranked = f'{base}, pp_rank="0", tp_rank="{rank}"'
        series += [
            (f"sglang:spec_accept_length{{{ranked}}}", "2.8x20"),
            (f"sglang:num_running_reqs{{{ranked}}}", "32x20"),
            (f"sglang:num_queue_reqs{{{ranked}}}", "0x20"),
        ]
    want = {"A": [2.8, 32.0], "B": [2.8, 0.0]}
    tests = [
        {
            "expr": expr,
            "eval_time": "10m",
            "exp_samples": [
                {
                    "labels": '{role="fly"}',
                    "value": want[ref][0 if title.startswith("τ") else 1],
                }
            ],
        }
        for (title, ref), expr in queries.items()
    ]
    doc = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in series],
                "promql_expr_test": tests,
            }
        ],
    }
    path = tmp_path / "sglang_panels_test.yaml"
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    out = subprocess.run(
        [promtool, "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
