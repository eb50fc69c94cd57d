"""The mixin in deploy/mixin: jsonnet rendering, thresholds from settings, the monitoring-mixins
lint rules, promtool, runbook links."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.mixin.render import (
    AREAS,
    DEFAULT_MANIFEST,
    DEFAULT_RULES,
    DEFAULT_THRESHOLDS,
    MIXIN_DIR,
    TEMPLATES_DIR,
    alert_rules,
    evaluate_mixin,
    load_config,
    load_rules,
    main,
    prometheus_duration,
    render_rules,
    rendered_files,
    threshold_values,
)
from specwatch.alerts.settings import DEFAULT_RUNBOOK_BASE_URL, DetectSettings
from specwatch.shadow.settings import PairedSettings
from tests.fakes import REPO

ROOT = REPO
TESTS_DIR = MIXIN_DIR / "tests"
RUNBOOK = ROOT / "docs" / "runbook.md"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

#: The alerts the mixin defines, exactly.
EXPECTED_ALERTS = {
    "SpecQualityDrift",
    "SpecQualityDriftFleet",
    "SpecQualityChange",
    "SpecFlipRateAboveNoise",
    "SpecLosslessFlips",
    "SpecAcceptanceDrop",
    "SpecFLyGainLost",
    "SpecDecodeInactive",
    "SpecBudgetStarvation",
    "SpecAdmissionStall",
    "SpecwatchTargetDown",
    "SpecwatchTargetNotOneServer",
    "SpecwatchShadowStalled",
    "SpecwatchLedgerFailing",
    "SpecNonInferiorityNotShown",
    "SpecTokenBudgetBound",
    "SpecAcceptanceDecay",
}

#: The alerting policy's bounds the templates read (thresholds.libsonnet), at the defaults.
POLICY_KEYS = {
    "page_overall_bound": 30.0,
    "page_category_bound": 11 / (0.05 * (1 - 2 / 3 - 0.01)),
    "page_margin_bound": 2000.0,
    "change_arl": 500_000.0,
}


#: config.libsonnet's PromQL selector knobs and the aggregation labels (structural placeholders).
SELECTORS = ("vllmSelector", "specwatchSelector", "sglangSelector")
STRUCTURAL = (*SELECTORS, "groupLabels")
GRAFANA = ROOT / "grafana"
_PLACEHOLDER = re.compile(r"%\((\w+)\)s")


def placeholders(template: str) -> list[str]:
    """Names of the ``%(name)s`` placeholders of a template, in order of appearance."""
    return _PLACEHOLDER.findall(template)


def own_config() -> dict[str, Any]:
    """The keys config.libsonnet sets (the mixin's _config without the generated thresholds)."""
    thresholds = threshold_values()
    return {k: v for k, v in load_config().items() if k not in thresholds}


@pytest.fixture(scope="module")
def rules() -> dict[str, Any]:
    return load_rules(DEFAULT_RULES)


def names_with_several_expressions(rules: dict[str, Any]) -> dict[str, int]:
    """Alert name -> number of distinct ``expr`` among its rules, for names with more than one."""
    exprs: dict[str, set[str]] = {}
    for rule in alert_rules(rules):
        exprs.setdefault(rule["alert"], set()).add(rule["expr"])
    return {name: len(found) for name, found in sorted(exprs.items()) if len(found) > 1}


def _github_anchors(markdown: str) -> set[str]:
    """GitHub heading anchors: lower-case, punctuation dropped, spaces to hyphens."""
    anchors = set()
    for line in markdown.splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if m:
            text = re.sub(r"[^\w\- ]", "", m.group(1).lower())
            anchors.add(text.replace(" ", "-"))
    return anchors


def _seconds(duration: str) -> float:
    """A one-unit Prometheus duration (``10m``) in seconds."""
    return float(duration[:-1]) * {"s": 1, "m": 60, "h": 3600}[duration[-1]]


def unwrapped(path: tuple[Any, ...], leaf: str) -> str:
    """A rendered leaf as its template wrote it: an ``expr`` without what mixin.libsonnet adds
    around it (the ``unless`` a sidecar delivers, the join of the sidecar's cause), a
    ``description`` without the sentence naming that cause."""
    if path[-1] == "description":
        return leaf.split(" Cause named by the specwatch sidecar: ")[0]
    if path[-1] != "expr":
        return leaf
    if leaf.startswith("(\n") and ")\nunless on (" in leaf:
        leaf = leaf[2 : leaf.rindex(")\nunless on (")]
    if leaf.startswith("(\n") and ")\n* on (" in leaf:
        leaf = leaf[2 : leaf.index(")\n* on (")]
    return leaf


def _leaves(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[tuple[Any, ...], str]]:
    """Every string leaf of a parsed YAML tree with its key path."""
    if isinstance(node, dict):
        return [leaf for k, v in node.items() for leaf in _leaves(v, (*path, k))]
    if isinstance(node, list):
        return [leaf for i, v in enumerate(node) for leaf in _leaves(v, (*path, i))]
    return [(path, str(node))]


def _filled_values() -> list[tuple[str, str]]:
    """(placeholder, text it became in the checked-in rules file), for every placeholder use.

    Each template is parsed with its structural placeholders (selectors, ``groupLabels``) filled
    from the config and the others replaced by sentinels, walked in step with the rendered group
    of the same name, and each sentinel-bearing leaf is matched against the rendered leaf.
    """
    rendered_groups = {g["name"]: g for g in load_rules(DEFAULT_RULES)["groups"]}
    config = load_config()
    found: list[tuple[str, str]] = []
    seen = 0
    for area in AREAS:
        text = (TEMPLATES_DIR / f"{area}.yaml.tmpl").read_text()
        for name in STRUCTURAL:  # filled first: an empty selector also drops its comma
            text = text.replace(f"%({name})s", str(config[name]))
        text = text.replace(", }", "}").replace("{}", "")
        names = placeholders(text)
        sentinels = {n: f"SENTINEL{i:04d}X" for i, n in enumerate(dict.fromkeys(names))}
        filled = _PLACEHOLDER.sub(lambda m, s=sentinels: s[m[1]], text)  # type: ignore[misc]
        groups = yaml.safe_load(filled)["groups"]
        seen += len(groups)
        rendered = {"groups": [rendered_groups[g["name"]] for g in groups]}
        by_path = {path: unwrapped(path, leaf) for path, leaf in _leaves(rendered)}
        back = {s: n for n, s in sentinels.items()}
        for path, leaf in _leaves({"groups": groups}):
            used = re.findall(r"SENTINEL\d{4}X", leaf)
            if not used:
                continue
            pattern = "".join(
                f"(?P<g{i}>.+?)" if i % 2 else re.escape(part)
                for i, part in enumerate(re.split(r"(SENTINEL\d{4}X)", leaf))
            )
            m = re.fullmatch(pattern, by_path[path], flags=re.DOTALL)
            assert m is not None, (path, leaf)
            found += [(back[s], m.group(f"g{2 * j + 1}")) for j, s in enumerate(used)]
    assert seen == len(rendered_groups)
    return found


class TestRender:
    def test_checked_in_files_equal_a_fresh_render(self) -> None:
        """thresholds.libsonnet, specwatch.rules.yaml and prometheusrule.yaml are exactly what
        render.py writes now (jsonnet evaluating mixin.libsonnet)."""
        files = rendered_files()
        assert set(files) == {"thresholds.libsonnet", "specwatch.rules.yaml", "prometheusrule.yaml"}
        for name, text in files.items():
            assert (MIXIN_DIR / name).read_text() == text, f"{name} is stale: run render.py"

    def test_manifest_spec_is_the_rules_file(self, rules: dict[str, Any]) -> None:
        """The PrometheusRule wraps the rules file's groups unchanged, with config.libsonnet's
        metadata."""
        manifest = yaml.safe_load(DEFAULT_MANIFEST.read_text())
        assert manifest["apiVersion"] == "monitoring.coreos.com/v1"
        assert manifest["kind"] == "PrometheusRule"
        assert manifest["metadata"] == {
            "name": "specwatch",
            "labels": {
                "app.kubernetes.io/name": "specwatch",
                "app.kubernetes.io/component": "alerting",
            },
        }
        assert manifest["spec"] == rules

    def test_check_mode(self, tmp_path: Path) -> None:
        """--check passes on fresh files, fails on a stale one; a bad template exits 2."""
        assert main(["--output-dir", str(tmp_path)]) == 0
        assert main(["--output-dir", str(tmp_path), "--check"]) == 0
        out = tmp_path / "specwatch.rules.yaml"
        out.write_text(out.read_text().replace("for: 10m", "for: 11m"))
        assert main(["--output-dir", str(tmp_path), "--check"]) == 1
        bad = tmp_path / "templates"
        bad.mkdir()
        for area in AREAS:
            (bad / f"{area}.yaml.tmpl").write_text("groups: [{name: x, rules: []}]\n")
        (bad / "self.yaml.tmpl").write_text("groups:\n  - name: %(no_such_knob)s\n")
        assert main(["--templates", str(bad), "--output-dir", str(tmp_path)]) == 2

    def test_other_percent_signs_are_left_alone(self, rules: dict[str, Any]) -> None:
        """Only ``%(name)s`` is filled: Go template's ``printf "%.3f"`` reaches the rules as is."""
        (ledger,) = [r for r in alert_rules(rules) if r["alert"] == "SpecwatchLedgerFailing"]
        assert '{{ printf "%.3f" $value }}' in ledger["annotations"]["description"]

    def test_an_unknown_placeholder_is_refused(self, tmp_path: Path) -> None:
        """A placeholder that names no _config key stops the render with jsonnet's error."""
        for area in AREAS:
            (tmp_path / f"{area}.yaml.tmpl").write_text("groups: []\n")
        (tmp_path / "self.yaml.tmpl").write_text("groups:\n  - name: %(no_such_knob)s\n")
        with pytest.raises(RuntimeError, match="unknown placeholder"):
            render_rules(tmp_path)

    @pytest.mark.parametrize(
        ("seconds", "text"),
        [(600, "10m"), (1800, "30m"), (3600, "1h"), (5400, "90m"), (90, "90s"), (0, "0s")],
    )
    def test_prometheus_duration(self, seconds: float, text: str) -> None:
        """Seconds become the largest whole unit: 1800 s is 30m, 5400 s is 90m, 90 s stays 90s."""
        assert prometheus_duration(seconds) == text

    def test_prometheus_duration_rejects_fractions(self) -> None:
        """A fractional second has no Prometheus duration here."""
        with pytest.raises(ValueError, match="whole"):
            prometheus_duration(1.5)

    def test_empty_selectors_leave_no_trace(self, rules: dict[str, Any]) -> None:
        """With the default empty selectors no expression has ``{}`` or a dangling comma."""
        for rule in (r for g in rules["groups"] for r in g["rules"]):
            assert "{}" not in rule["expr"], rule
            assert not re.search(r",\s*\}", rule["expr"]), rule

    def test_selectors_reach_every_raw_series(self) -> None:
        """With selectors set, every vllm:*, sglang:* and specwatch_* series read by a rule
        carries them."""
        config = {
            "vllmSelector": 'job="vllm"',
            "specwatchSelector": 'job="sw"',
            "sglangSelector": 'job="sg"',
        }
        rules = render_rules(config=config)
        series = re.compile(
            r"(?<![\w:])(vllm:[a-z_]+|sglang:[a-z_]+|specwatch_[a-z_]+)(\{[^}]*\})?"
        )
        wanted_by = {"vllm:": 'job="vllm"', "sglang:": 'job="sg"'}
        seen = 0
        for group in rules["groups"]:
            for rule in group["rules"]:
                for name, braces in series.findall(rule["expr"]):
                    wanted = wanted_by.get(name[: name.find(":") + 1], 'job="sw"')
                    assert wanted in braces, (rule.get("alert") or rule.get("record"), name)
                    seen += 1
        assert seen >= 50

    def test_a_template_runbook_url_is_refused(self, tmp_path: Path) -> None:
        """Runbook links come only from runbookURLPattern; a template's own link is refused."""
        for area in AREAS:
            (tmp_path / f"{area}.yaml.tmpl").write_text("groups: []\n")
        (tmp_path / "self.yaml.tmpl").write_text(
            "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up == 0\n"
            "        annotations:\n          runbook_url: https://example.invalid/#a\n"
        )
        with pytest.raises(RuntimeError, match="runbookURLPattern"):
            render_rules(tmp_path)


class TestThresholdsDefinedOnce:
    def test_every_placeholder_has_a_source_and_every_knob_is_used(self) -> None:
        """Placeholders name settings fields, the policy's bounds or config keys; each knob is
        used."""
        config = own_config()
        texts = [(TEMPLATES_DIR / f"{area}.yaml.tmpl").read_text() for area in AREAS]
        used = {n for text in texts for n in placeholders(text)}
        sources = set(DetectSettings.model_fields) | {"e_value_bound", *POLICY_KEYS} | set(config)
        assert used <= sources, used - sources
        knobs = {k for k, v in config.items() if not isinstance(v, dict)}
        knobs -= {"runbookURLPattern", "prometheusRuleName", "clusterLabel", *SELECTORS}
        knobs -= {"rulesOnlyAlerts"}  # read by mixin.libsonnet itself (test_mixin_sidecar_alerts)
        assert set(STRUCTURAL) <= used
        assert knobs <= used, knobs - used

    def test_each_rendered_threshold_equals_its_python_default(self) -> None:
        """Every number put into the rendered rules equals the default it came from."""
        detect = DetectSettings()
        config = own_config()
        found = _filled_values()
        assert len(found) >= 40
        for name, text in found:
            if name == "e_value_bound":
                assert float(text) == 1 / PairedSettings().alpha == 20, text
            elif name in POLICY_KEYS:
                assert float(text) == pytest.approx(POLICY_KEYS[name], rel=1e-9), name
            elif name in config:
                assert text == str(config[name]), name
            elif name.endswith("_for"):
                assert _seconds(text) == getattr(detect, name), name
            else:
                assert float(text) == getattr(detect, name), name
        names = {n for n, _ in found}
        assert {"acceptance_drop_ratio", "flip_z", "quality_min_pairs", "e_value_bound"} <= names

    def test_hand_checked_values(self, rules: dict[str, Any]) -> None:
        """Spot checks against the documented defaults: 0.8, 10m; the page at 40 (all pairs),
        21 / 0.0225 (a category), 400 (margin); the change warning at 500,000 pairs; the fleet
        page on the mean of the sidecars' overall e-values at 40."""
        by_name: dict[str, list[dict[str, Any]]] = {}
        for rule in alert_rules(rules):
            by_name.setdefault(rule["alert"], []).append(rule)
        drop = by_name["SpecAcceptanceDrop"][0]
        assert "ratio_rate1h < 0.8\n" in drop["expr"]
        assert drop["for"] == "10m"
        quality = {r["labels"]["check"]: r for r in by_name["SpecQualityDrift"]}
        assert set(quality) == {"e_value"}
        (ni,) = by_name["SpecNonInferiorityNotShown"]
        assert ni["labels"] == {"severity": "info"}
        expr = quality["e_value"]["expr"]
        assert 'category="_all", hypothesis="no_net_loss"} >= 30\n' in expr
        assert 'category!="_all", hypothesis="no_net_loss"} >= 680.4123711\n' in expr
        assert 'category="_all", hypothesis="margin"} >= 2000\n' in expr
        assert quality["e_value"]["for"] == "0s"
        (change,) = by_name["SpecQualityChange"]
        assert unwrapped(("expr",), change["expr"]) == "specwatch_paired_change_detector >= 500000"
        assert change["labels"]["severity"] == "warning"
        (fleet,) = by_name["SpecQualityDriftFleet"]
        assert "avg by (cluster, namespace, job) (" in fleet["expr"]
        assert "max without (replica, prometheus_replica) (" in fleet["expr"]
        assert fleet["expr"].endswith(") >= 30\n")
        assert fleet["labels"] == {"severity": "critical"}

    def test_e_value_bound_follows_alpha(self) -> None:
        """alpha 0.01 renders the page at 150 for all pairs, 11 / (0.01 x 0.3233) = 3,402.06 for a
        category and 10,000 for the margin test, and the fleet page at 150."""
        rules = render_rules(thresholds=threshold_values(paired=PairedSettings(alpha=0.01)))
        exprs = {
            r["labels"].get("check", r["alert"]): r["expr"]
            for r in alert_rules(rules)
            if r["alert"].startswith("SpecQualityDrift")
        }
        assert '"no_net_loss"} >= 150\n' in exprs["e_value"]
        assert '"no_net_loss"} >= 3402.061856\n' in exprs["e_value"]
        assert '"margin"} >= 10000\n' in exprs["e_value"]
        assert exprs["SpecQualityDriftFleet"].endswith(") >= 150\n")

    def test_quality_drift_reads_only_the_sidecar_gauges(self, rules: dict[str, Any]) -> None:
        """SpecQualityDrift fires on the e-value or non-inferiority, never on McNemar's z."""
        for rule in alert_rules(rules):
            if rule["alert"] == "SpecQualityDrift":
                assert "mcnemar" not in rule["expr"], rule["labels"]


class TestAlerts:
    def test_alert_set(self, rules: dict[str, Any]) -> None:
        """The rules define exactly the expected alerts."""
        assert {r["alert"] for r in alert_rules(rules)} == EXPECTED_ALERTS

    def test_each_alert_name_has_one_expression(self, rules: dict[str, Any]) -> None:
        """No alert name is defined twice with different expressions: variants of one alert
        (server or engine scope, the budget reasons) are joined into one rule with ``or``."""
        assert names_with_several_expressions(rules) == {}

    def test_a_name_with_two_expressions_is_caught(self) -> None:
        """The check above names an alert defined twice with different expressions, and counts
        them, but passes a name repeated with the same expression."""
        two = {"alert": "A", "expr": "up == 0"}
        rules = {"groups": [{"name": "g", "rules": [
            two, {"alert": "A", "expr": "up == 2"}, {"alert": "B", "expr": "x"},
            {"alert": "B", "expr": "x"}, {"record": "r:s:t", "expr": "up"},
        ]}]}  # fmt: skip
        assert names_with_several_expressions(rules) == {"A": 2}

    def test_every_alert_has_metadata(self, rules: dict[str, Any]) -> None:
        """Each alert has for, a severity label, summary, description and a runbook_url."""
        for rule in alert_rules(rules):
            name = rule["alert"]
            assert re.fullmatch(r"\d+[smh]", rule["for"]), name
            assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
            ann = rule["annotations"]
            assert ann["summary"], name
            assert ann["description"], name
            assert ann["runbook_url"] == f"{DEFAULT_RUNBOOK_BASE_URL}#{name.lower()}", name

    def test_critical_only_on_evidence(self, rules: dict[str, Any]) -> None:
        """A page (critical) fires only on evidence of harm: the anytime-valid e-values (per
        sidecar, and their mean across the fleet), or a stall; "non-inferiority not shown yet"
        and configuration findings are info and their summaries claim no loss."""
        by_sev: dict[str, set[str]] = {}
        for rule in alert_rules(rules):
            by_sev.setdefault(rule["labels"]["severity"], set()).add(rule["alert"])
        assert by_sev["critical"] == {
            "SpecQualityDrift",
            "SpecQualityDriftFleet",
            "SpecAdmissionStall",
        }
        assert by_sev["info"] == {"SpecNonInferiorityNotShown", "SpecTokenBudgetBound"}
        for rule in alert_rules(rules):
            if rule["alert"] == "SpecQualityDrift":
                assert unwrapped(("expr",), rule["expr"]).startswith("specwatch_paired_e_value{")
            if rule["labels"]["severity"] == "info":
                assert "loses" not in rule["annotations"]["summary"]

    def test_runbook_pattern_matches_the_python_default(self) -> None:
        """config.libsonnet's runbook pattern points where specwatch's alerts point by default."""
        assert load_config()["runbookURLPattern"] == f"{DEFAULT_RUNBOOK_BASE_URL}#%s"

    def test_recording_rule_names(self, rules: dict[str, Any]) -> None:
        """Recording rules are named level:metric:operations, each once."""
        records = [r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r]
        assert len(records) >= 20
        for name in records:
            assert re.fullmatch(r"[a-z_]*:[a-z0-9_]+:[a-z0-9_]+", name), name
        assert len(records) == len(set(records))

    def test_every_alert_fires_and_stays_quiet_in_promtool_tests(
        self, rules: dict[str, Any]
    ) -> None:
        """Each alert has at least one promtool case where it fires and one where it is quiet."""
        fires: set[str] = set()
        quiet: set[str] = set()
        for path in TESTS_DIR.glob("*.yaml"):
            doc = yaml.safe_load(path.read_text())
            for test in doc["tests"]:
                for case in test.get("alert_rule_test", []):
                    (fires if case.get("exp_alerts") else quiet).add(case["alertname"])
        names = {r["alert"] for r in alert_rules(rules)}
        assert names <= fires, names - fires
        assert names <= quiet, names - quiet

    def test_runbook_has_every_anchor(self, rules: dict[str, Any]) -> None:
        """Every alert's runbook_url fragment is a heading of docs/runbook.md."""
        anchors = _github_anchors(RUNBOOK.read_text())
        for rule in alert_rules(rules):
            fragment = rule["annotations"]["runbook_url"].split("#", 1)[1]
            assert fragment in anchors, fragment

    def test_anchor_helper(self) -> None:
        """Headings become GitHub anchors: lower case, punctuation dropped, spaces to hyphens."""
        assert _github_anchors("## SpecFLyGainLost\n### What to look at (PromQL)\n") == {
            "specflygainlost",
            "what-to-look-at-promql",
        }


def _query_strings(value: Any) -> list[str]:
    """Every string under an ``expr``, ``query`` or ``definition`` key of a dashboard."""
    if isinstance(value, dict):
        return [
            q
            for k, v in value.items()
            for q in ([v] if isinstance(v, str) and k in ("expr", "query", "definition") else [])
            + _query_strings(v)
        ]
    if isinstance(value, list):
        return [q for v in value for q in _query_strings(v)]
    return []


class TestMixinStructure:
    def test_fields_and_group_kinds(self) -> None:
        """mixin.libsonnet exposes _config, prometheusRules (recording groups only) and
        prometheusAlerts (alerting groups only); together they are the rendered rules file."""
        mixin = evaluate_mixin()
        assert set(mixin) == {"_config", "prometheusRules", "prometheusAlerts", "grafanaDashboards"}
        recording = mixin["prometheusRules"]["groups"]
        alerting = mixin["prometheusAlerts"]["groups"]
        assert all("record" in r for g in recording for r in g["rules"])
        assert all("alert" in r for g in alerting for r in g["rules"])
        assert load_rules(DEFAULT_RULES) == {"groups": recording + alerting}
        assert len(recording) == 4  # vLLM spec decode, FLy, shadow paired, SGLang
        assert len(alerting) == 3

    def test_dashboards_are_the_grafana_files(self) -> None:
        """grafanaDashboards holds every dashboard of grafana/, equal to the checked-in JSON."""
        dashboards = evaluate_mixin()["grafanaDashboards"]
        files = {p.name: json.loads(p.read_text()) for p in sorted(GRAFANA.glob("*.json"))}
        assert dashboards == files
        assert len(files) == 4

    def test_cluster_label_and_selectors_reach_the_dashboards(self) -> None:
        """clusterLabel and the three selectors of _config reach every dashboard query: the
        cluster matcher and the cluster variable use the configured label, each series selector
        starts with its engine's selector (Prometheus' ALERTS with none), and nothing else of
        the dashboards changes (undoing exactly those edits gives the checked-in JSON)."""
        overrides = {
            "clusterLabel": "k8s_cluster",
            "specwatchSelector": 'job="specwatch"',
            "vllmSelector": 'job="vllm"',
            "sglangSelector": 'job="sglang"',
        }
        dashboards = evaluate_mixin(overrides)["grafanaDashboards"]
        files = {p.name: json.loads(p.read_text()) for p in sorted(GRAFANA.glob("*.json"))}
        assert set(dashboards) == set(files)
        overview = dashboards["specwatch-overview.json"]
        alpha = next(p for p in overview["panels"] if p["title"].startswith("Acceptance rate"))
        assert alpha["targets"][0]["expr"] == (
            'specwatch_acceptance_ratio{job="specwatch", k8s_cluster=~"$cluster", '
            'namespace="$namespace", job="$job", pod=~"$pod", window="$window", '
            'target=~"$target", engine="", model_name=~"$model"}'
        )
        cluster_var = overview["templating"]["list"][1]
        assert cluster_var["name"] == "cluster"
        assert cluster_var["query"]["query"] == (
            'label_values(specwatch_build_info{job="specwatch"}, k8s_cluster)'
        )
        prefix = {"specwatch_": 'job="specwatch", ', "vllm:": 'job="vllm", '}
        prefix["sglang:"] = 'job="sglang", '
        selectors = 0
        for name, dashboard in dashboards.items():
            for query in _query_strings(dashboard):
                assert re.search(r'(?<!k8s_)cluster=~"', query) is None, (name, query)
                for m in re.finditer(r"([A-Za-z_:][\w:]*)\{([^}]*)\}", query):
                    metric, matchers = m.groups()
                    want = next((v for k, v in prefix.items() if metric.startswith(k)), "")
                    if query.startswith('label_values(specwatch_build_info{job="specwatch"}, '):
                        assert query.endswith(", k8s_cluster)"), (name, query)  # the cluster list
                        continue
                    assert matchers.startswith(want + 'k8s_cluster=~"$cluster"'), (name, m[0])
                    selectors += 1
            undone = (
                json.dumps(dashboard)
                .replace('job=\\"specwatch\\", ', "")
                .replace('{job=\\"specwatch\\"}', "")
                .replace('job=\\"vllm\\", ', "")
                .replace('job=\\"sglang\\", ', "")
                .replace('k8s_cluster=~\\"$cluster\\"', 'cluster=~\\"$cluster\\"')
                .replace(", k8s_cluster)", ", cluster)")
            )
            assert json.loads(undone) == files[name], name
        assert selectors >= 100

    def test_thresholds_file_holds_the_settings_defaults(self) -> None:
        """thresholds.libsonnet, read by jsonnet, is DetectSettings/PairedSettings' defaults:
        0.8 for acceptance_drop_ratio, 10m for acceptance_drop_for, 20 = 1/0.05 e-value bound."""
        import _jsonnet

        values = json.loads(_jsonnet.evaluate_file(str(DEFAULT_THRESHOLDS)))
        assert values == threshold_values()
        assert values["acceptance_drop_ratio"] == 0.8
        assert values["acceptance_drop_for"] == "10m"
        assert values["e_value_bound"] == 20

    def test_cluster_label_and_runbook_pattern_are_configurable(self) -> None:
        """_config overrides reach every aggregation and every runbook link."""
        overrides = {
            "clusterLabel": "k8s_cluster",
            "runbookURLPattern": "https://runbooks.example/specwatch/%s",
        }
        rules = render_rules(config=overrides)
        clauses = [
            m
            for g in rules["groups"]
            for r in g["rules"]
            for m in re.findall(r"\b(?:by|on) \(([^)]*)\)", r["expr"])
        ]
        assert len(clauses) >= 20
        for clause in clauses:
            assert clause.startswith("k8s_cluster, namespace"), clause
        for rule in alert_rules(rules):
            url = rule["annotations"]["runbook_url"]
            assert url == f"https://runbooks.example/specwatch/{rule['alert'].lower()}"

    def test_default_aggregations_keep_cluster_and_namespace(self, rules: dict[str, Any]) -> None:
        """Every by/on list of the rendered rules starts with cluster, namespace: two clusters or
        namespaces are never summed (promtool case in tests/aggregation_test.yaml)."""
        clauses = [
            m
            for g in rules["groups"]
            for r in g["rules"]
            for m in re.findall(r"\b(?:by|on) \(([^)]*)\)", r["expr"])
        ]
        assert clauses
        assert all(
            c == "cluster, namespace" or c.startswith("cluster, namespace, ") for c in clauses
        ), clauses


class TestMixinLint:
    """The monitoring-mixins lint rules (mixtool lint), as tests."""

    def test_summary_is_a_plain_sentence(self, rules: dict[str, Any]) -> None:
        """A summary has no template ({{ }}, $labels, $value): it is true for every firing
        series; it starts with a capital letter and ends with a full stop."""
        for rule in alert_rules(rules):
            summary = rule["annotations"]["summary"]
            assert "{{" not in summary, rule["alert"]
            assert "$" not in summary, rule["alert"]
            assert summary.endswith("."), summary
            assert summary[0].isupper(), summary

    def test_description_severity_and_runbook(self, rules: dict[str, Any]) -> None:
        """Every alert has a description, a known severity and an https runbook_url."""
        for rule in alert_rules(rules):
            ann = rule["annotations"]
            assert ann["description"].strip(), rule["alert"]
            assert rule["labels"]["severity"] in {"critical", "warning", "info"}, rule["alert"]
            assert ann["runbook_url"].startswith("https://"), rule["alert"]

    def test_alert_names_are_camel_case(self, rules: dict[str, Any]) -> None:
        """Alert names are UpperCamelCase (mixtool's naming rule)."""
        for rule in alert_rules(rules):
            assert re.fullmatch(r"(?:[A-Z][a-zA-Z0-9]*)+", rule["alert"]), rule["alert"]


@pytest.mark.promtool
def test_promtool_check_rules(tmp_path: Path) -> None:
    """promtool accepts the rules file, the manifest's spec and a render with selectors set."""
    spec = tmp_path / "spec.rules.yaml"
    spec.write_text(yaml.safe_dump(yaml.safe_load(DEFAULT_MANIFEST.read_text())["spec"]))
    selected = tmp_path / "selected.rules.yaml"
    config = {**load_config(), "vllmSelector": 'job="vllm"', "specwatchSelector": 'job="sw"'}
    selected.write_text(yaml.safe_dump(render_rules(config=config)))
    out = subprocess.run(
        [PROMTOOL, "check", "rules", str(DEFAULT_RULES), str(spec), str(selected)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("SUCCESS: 52 rules found") == 3


@pytest.mark.slow
@pytest.mark.promtool
def test_promtool_test_rules() -> None:
    """Every promtool unit test file passes."""
    files = sorted(str(p) for p in TESTS_DIR.glob("*.yaml"))
    assert len(files) >= 4
    out = subprocess.run(
        [PROMTOOL, "test", "rules", *files],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("SUCCESS") == len(files)
