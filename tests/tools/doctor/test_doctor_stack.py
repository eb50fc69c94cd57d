"""``specwatch doctor``'s checks of the operator's own stack, driven through the command against
a hand-made Prometheus and Alertmanager HTTP API (answers as Prometheus 3 / Alertmanager 0.28
give them): an inhibit rule whose ``equal`` names a label specwatch's alerts do not carry, and a
dashboard matcher on a label no series of its metric has."""

from __future__ import annotations

import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import yaml

from deploy.mixin.render import load_rules
from specwatch.__main__ import main
from specwatch.tools.doctor.stack import (
    AlertLabels,
    alert_labels,
    check_inhibit_rules,
    check_mirror_coverage,
    expression_labels,
    expression_metrics,
    label_replace_labels,
    mirror_percentages,
    promql_matchers,
)
from tests.fakes.http import threaded_http_server

#: The label names Prometheus has on specwatch's series (``/api/v1/labels`` with its job).
SPECWATCH_LABELS = ["__name__", "instance", "job", "model_name", "namespace", "role", "target"]
#: ... and on vLLM's running gauge.
VLLM_LABELS = ["__name__", "engine", "instance", "job", "model_name", "namespace", "role"]

ALERTMANAGER = {
    "route": {"receiver": "default"},
    "receivers": [{"name": "default"}],
    "inhibit_rules": [
        # 1: the runbook's rule: both labels carried
        {
            "source_matchers": ['severity="critical"'],
            "target_matchers": ['severity="warning"'],
            "equal": ["namespace", "role"],
        },
        # 2: cluster is a Prometheus external label (carried); gpu is on nothing of specwatch's
        {
            "source_matchers": ['severity="critical"'],
            "target_matchers": ["severity=~warning|info"],
            "equal": ["cluster", "gpu"],
        },
        # 3: selects only alerts with team="db": specwatch's have no team, not judged
        {
            "source_matchers": ['team="db"'],
            "target_matchers": ['severity="warning"'],
            "equal": ["database"],
        },
        # 4: older syntax, a severity specwatch never uses: not judged
        {"source_match": {"severity": "page"}, "target_match": {}, "equal": ["shard"]},
    ],
}


#: A rule expression as Prometheus's /api/v1/rules gives it (``query``): the label_replace
#: form of the mixin's SpecAcceptanceDrop, a selector with a comma in its first argument.
DROP_QUERY = (
    'label_replace(x{window="5m", engine=""} < 0.8, "scope", "server", "", "") or '
    'label_replace(max by (namespace, role, engine) (y) < 0.8, "scope", "engine", "", "")'
)


#: Increases over the last hour the mirror check asks for, by metric (set per test).
COUNTS: dict[str, float] = {}


def _api(data: object) -> dict[str, object]:
    return {"status": "success", "data": data}


class _Handler(BaseHTTPRequestHandler):
    """Prometheus's and Alertmanager's API answers for one healthy specwatch target."""

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        body: object
        if url.path == "/api/v1/targets":
            body = _api(
                {
                    "activeTargets": [
                        {
                            "labels": {"job": "specwatch", "instance": "sw:9000"},
                            "health": "up",
                            "scrapeInterval": "15s",
                        }
                    ]
                }
            )
        elif url.path == "/api/v1/rules":
            rule = {"name": "SpecQualityDrift", "type": "alerting", "health": "ok"}
            rule["labels"] = {"severity": "critical"}  # type: ignore[assignment]
            rule["query"] = 'specwatch_paired_e_value{window="since_start"} >= 20'
            # not firing: its scope label exists only in the expression
            drop = {"name": "SpecAcceptanceDrop", "type": "alerting", "health": "ok"}
            drop["query"] = DROP_QUERY
            drop["labels"] = {"severity": "warning"}  # type: ignore[assignment]
            drop["alerts"] = []  # type: ignore[assignment]
            body = _api({"groups": [{"name": "specwatch.rules", "rules": [rule, drop]}]})
        elif url.path == "/api/v1/query" and q["query"].startswith("sum(increase("):
            metric = q["query"].removeprefix("sum(increase(").split("{")[0]
            value = [0, str(COUNTS[metric])]
            body = _api({"resultType": "vector", "result": [{"metric": {}, "value": value}]})
        elif url.path == "/api/v1/query":
            labels = {"__name__": "x", "job": "vllm", "instance": "v:8000", "role": "fly"}
            found = (
                [] if q["query"].startswith("sglang:") else [{"metric": labels, "value": [0, "1"]}]
            )
            body = _api({"resultType": "vector", "result": found})
        elif url.path == "/api/v1/labels":
            match = q.get("match[]", "")
            body = _api(
                SPECWATCH_LABELS if match == "specwatch_paired_e_value" else
                VLLM_LABELS if match in ("vllm:num_requests_running", "x") else []
            )  # fmt: skip
        elif url.path == "/api/v1/status/config":
            body = _api({"yaml": "global:\n  external_labels:\n    cluster: eu-1\n"})
        elif url.path == "/api/v2/status":
            body = {"config": {"original": yaml.safe_dump(ALERTMANAGER)}, "cluster": {}}
        else:
            self.send_error(404)
            return
        raw = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def api() -> Iterator[str]:
    """The fake Prometheus + Alertmanager on a free port, as its base URL."""
    with threaded_http_server(_Handler) as url:
        yield url


def _doctor(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, str]]]:
    rc = main(["doctor", *args, "--format", "json"])
    return rc, json.loads(capsys.readouterr().out)


def test_inhibit_equal_label_specwatch_alerts_lack(
    api: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """From the file and from the live Alertmanager alike: rule 1 (namespace, role) passes,
    rule 2 fails on gpu only (cluster comes from Prometheus's external labels), rules 3 and 4
    select no specwatch alert and are not judged; the failure is the first line, exit 1."""
    conf = tmp_path / "alertmanager.yml"
    conf.write_text(yaml.safe_dump(ALERTMANAGER))
    for flags, source in (
        (["--alertmanager-config", str(conf)], "--alertmanager-config"),
        (["--alertmanager-url", api], api),
    ):
        rc, found = _doctor(capsys, "--prometheus-url", api, *flags)
        assert rc == 1
        inhibit = [(f["status"], f["message"]) for f in found if f["check"] == "inhibit"]
        assert inhibit == [
            (
                "fail",
                f"{source}: inhibit rule 2 (equal: cluster, gpu) pairs specwatch alerts that do "
                "not both carry gpu: SpecQualityDrift (source, no gpu) with SpecAcceptanceDrop "
                "(target, no gpu). Alertmanager compares a missing label as empty, so such an "
                "alert inhibits the other across every gpu (or never, where the other carries "
                "it); drop gpu from equal, narrow the matchers to alerts that carry it, or add it "
                "to specwatch's alerts (the Prometheus external labels)",
            ),
            ("ok", f"{source}: inhibit rule 1: equal labels carried"),
        ]
        assert found[0]["check"] == "inhibit"


def test_inhibit_equal_label_set_by_label_replace_before_any_alert_fires(
    api: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An inhibit rule comparing ``scope``: no series and no firing alert has it, but
    SpecAcceptanceDrop's expression sets it with label_replace, so it is carried (before this
    was read from the expressions the rule failed as "carry no scope"); SpecQualityDrift, which
    has no scope, is not selected."""
    conf = tmp_path / "alertmanager.yml"
    scope_rule = {
        "source_matchers": ['alertname="SpecAcceptanceDrop"'],
        "target_matchers": ['severity="warning"'],
        "equal": ["namespace", "scope"],
    }
    conf.write_text(yaml.safe_dump({**ALERTMANAGER, "inhibit_rules": [scope_rule]}))
    _rc, found = _doctor(capsys, "--prometheus-url", api, "--alertmanager-config", str(conf))
    inhibit = [(f["status"], f["message"]) for f in found if f["check"] == "inhibit"]
    assert inhibit == [("ok", "--alertmanager-config: inhibit rule 1: equal labels carried")]


def test_labels_the_shipped_rules_set_without_firing() -> None:
    """From the rendered mixin, each alert on its own: ``scope`` (server or engine) on
    SpecAcceptanceDrop and SpecAcceptanceDecay only, ``reason`` (three values) on
    SpecBudgetStarvation only, ``check`` on SpecQualityDrift only; the self alerts aggregate
    ``by (cluster, namespace, job, instance)`` so carry no ``role``; the external label on all."""
    rules = load_rules()
    every = frozenset({"cluster", "namespace", "job", "instance", "role", "target"})
    exprs = [r["expr"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    labels_of = {m: every for e in exprs for m in expression_metrics(e)}
    got = alert_labels(rules, labels_of, ["region"])
    assert got["SpecAcceptanceDrop"].labels["scope"] == ["engine", "server"]
    assert got["SpecBudgetStarvation"].labels["reason"] == [
        "budget_cap",
        "draft_truncation",
        "drafts_per_step",
    ]
    assert got["SpecQualityDrift"].labels["check"] == ["e_value"]
    assert got["SpecQualityDrift"].labels["severity"] == ["critical"]
    assert [n for n, a in got.items() if "scope" in a.labels] == [
        "SpecAcceptanceDrop",
        "SpecAcceptanceDecay",
    ]
    assert set(got["SpecwatchShadowStalled"].labels) == {
        "alertname", "severity", "cluster", "namespace", "job", "instance", "region"
    }  # fmt: skip
    assert all("region" in a.labels and not a.open for a in got.values())
    # a metric with no series: its alert's labels are open (not judged)
    assert alert_labels(rules, {}, [])["SpecwatchTargetDown"].open
    # capture-group replacements give any value; brackets and quotes in the first argument
    expr = (
        'label_replace(f(x{a=",)"}[5m]), "dst", "$1", "src", "(.*)")'
        ' or label_replace(y, "k", "v", "", "")'
    )
    assert label_replace_labels(expr) == {"dst": None, "k": ["v"]}


def test_expression_result_labels() -> None:
    """An outer ``by`` keeps exactly its labels, ``without`` drops its labels, no aggregation
    keeps the metric's series labels (functions and comparisons with a scalar too), ``and``
    keeps the left side's, ``or`` those both sides have, ``group_left(x)`` adds ``x``; a
    metric with no known series makes the result unknown."""
    of = {"a": frozenset({"job", "instance", "engine"}), "b": frozenset({"job", "role"})}
    assert expression_labels('sum by (job, role) (rate(a{x="1"}[5m])) > 0', of) == frozenset(
        {"job", "role"}
    )
    assert expression_labels("sum without (engine) (a)", of) == frozenset({"job", "instance"})
    assert expression_labels("max(a) by (instance)", of) == frozenset({"instance"})
    assert expression_labels("max_over_time(a[1h:5m]) / 2 < 0.8", of) == of["a"]
    assert expression_labels("a and on (job) b", of) == of["a"]
    assert expression_labels("a or b", of) == frozenset({"job"})
    assert expression_labels("a * on (job) group_left (role) b", of) == of["a"] | {"role"}
    assert expression_labels("b unless a offset 5m", of) == of["b"]
    assert expression_labels("c + a", of) is None  # the result has the left side's labels


def _alerts(**labels: list[str]) -> dict[str, AlertLabels]:
    """Hand-built alerts: each name to its label names (``severity`` taken from the name)."""
    return {
        name: AlertLabels(
            {"alertname": [name], "severity": [name.split("_")[0]]} | {n: None for n in names}
        )
        for name, names in labels.items()
    }


RULE = {
    "source_matchers": ['severity="critical"'],
    "target_matchers": ['severity="warning"'],
}


def test_inhibit_equal_judged_per_alert() -> None:
    """``equal: [engine]`` where neither selected alert carries engine fails naming both (the
    union of all alerts' labels has engine, from an alert neither side selects); ``equal:
    [target]`` on alerts that all carry target passes; one alert of a pair carrying it and the
    other not fails, naming the one without; a rule selecting nothing on one side is not
    judged."""
    alerts = _alerts(
        critical_A=["target", "namespace"],
        warning_B=["target", "namespace", "role"],
        warning_C=["target"],
        info_D=["engine", "target"],
    )
    rules = {
        "inhibit_rules": [
            {**RULE, "equal": ["engine"]},
            {**RULE, "equal": ["target"]},
            {**RULE, "equal": ["role"]},
            {"source_matchers": ['severity="page"'], "target_matchers": [], "equal": ["gpu"]},
        ]
    }
    tail = (
        ". Alertmanager compares a missing label as empty, so such an alert inhibits the other "
        "across every {0} (or never, where the other carries it); drop {0} from equal, narrow "
        "the matchers to alerts that carry it, or add it to specwatch's alerts (the Prometheus "
        "external labels)"
    )
    assert check_inhibit_rules(rules, alerts, "am.yml") == [
        (
            "fail",
            "inhibit",
            "am.yml: inhibit rule 1 (equal: engine) pairs specwatch alerts that do not both "
            "carry engine: critical_A (source, no engine) with warning_B (target, no engine); "
            "critical_A (source, no engine) with warning_C (target, no engine)"
            + tail.format("engine"),
        ),
        ("ok", "inhibit", "am.yml: inhibit rule 2: equal labels carried"),
        (
            "fail",
            "inhibit",
            "am.yml: inhibit rule 3 (equal: role) pairs specwatch alerts that do not both carry "
            "role: critical_A (source, no role) with warning_B (target); critical_A (source, no "
            "role) with warning_C (target, no role)" + tail.format("role"),
        ),
    ]
    # one carrying it and the other not
    one = _alerts(critical_A=["role"], warning_B=[])
    found = check_inhibit_rules({"inhibit_rules": [{**RULE, "equal": ["role"]}]}, one, "f")
    assert found[0][:2] == ("fail", "inhibit")
    assert "critical_A (source) with warning_B (target, no role)" in found[0][2]
    # an open alert (labels unknown) is not judged
    opened = {**one, "warning_B": AlertLabels(one["warning_B"].labels, open=True)}
    found = check_inhibit_rules({"inhibit_rules": [{**RULE, "equal": ["role"]}]}, opened, "f")
    assert found == [("ok", "inhibit", "f: inhibit rule 1: equal labels carried")]


def test_dashboard_matcher_on_missing_label(
    api: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``container="vllm"`` on vLLM's gauge, whose series have no container label, fails once
    naming both panels and the labels there are; ``role``, a negative matcher and one that
    accepts the empty value (``pod=~".*"``) pass."""
    dash = {
        "title": "Pair",
        "templating": {"list": [{"name": "c", "current": {"value": "vllm"}}]},
        "panels": [
            {
                "title": "Running",
                "targets": [{"expr": 'vllm:num_requests_running{container="$c"}'}],
            },
            {
                "title": "By role",
                "targets": [
                    {"expr": 'sum by (role) (vllm:num_requests_running{role="fly", pod=~".*"})'},
                    {"expr": 'vllm:num_requests_running{container="vllm", gpu!="0"}'},
                ],
            },
        ],
    }
    path = tmp_path / "pair.json"
    path.write_text(json.dumps(dash))
    rc, found = _doctor(capsys, "--prometheus-url", api, "--dashboard", str(path))
    assert rc == 1
    assert [(f["status"], f["message"]) for f in found if f["check"] == "labels"] == [
        (
            "fail",
            "Pair: no series of vllm:num_requests_running has label 'container', so "
            'container="vllm" selects nothing (its labels: engine, instance, job, model_name, '
            "namespace, role); panels: Running, By role",
        )
    ]
    assert found[0]["check"] == "labels"  # before the dashboard's own lines


def test_matchers_read_from_promql() -> None:
    """Selectors by name and by ``__name__``; grouping clauses and range brackets are not
    selectors; escaped quotes are unescaped."""
    assert promql_matchers(
        'sum by (le) (rate(a:b{x="1", y=~"p|q"}[5m])) / on(z) {__name__="c", w!="say \\"hi\\""}'
    ) == [("a:b", "x", "=", "1"), ("a:b", "y", "=~", "p|q"), ("c", "w", "!=", 'say "hi"')]


def test_unreadable_matcher_is_a_warning() -> None:
    """An inhibit rule whose matcher cannot be read is a warning naming it, not a guess."""
    conf = {"inhibit_rules": [{"source_matchers": ["severity"], "equal": ["x"]}]}
    got = check_inhibit_rules(conf, {"A": AlertLabels({"severity": ["critical"]})}, "am.yml")
    assert got == [("warn", "inhibit", "am.yml: inhibit rule 1: cannot read matchers")]


HTTPROUTE = {
    "apiVersion": "gateway.networking.k8s.io/v1",
    "kind": "HTTPRoute",
    "metadata": {"name": "vllm-mirror"},
    "spec": {
        "rules": [
            {
                "filters": [
                    {
                        "type": "RequestMirror",
                        "requestMirror": {"backendRef": {"name": "specwatch"}, "percent": 5},
                    }
                ]
            }
        ]
    },
}


@pytest.mark.parametrize(
    ("mirrored", "status", "message"),
    [
        (100, "ok", "5 % (100 of 2000 live requests in the last 1h) reached the mirror; "),
        (0, "fail", "no live request reached specwatch's mirror listener, HTTPRoute "),
        (30, "fail", "only 1.5 % (30 of 2000 live requests in the last 1h) reached specwatch's "),
    ],
)
def test_mirror_coverage_against_configured_percent(
    api: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    mirrored: float,
    status: str,
    message: str,
) -> None:
    """The HTTPRoute mirrors 5 %; the standard server finished 2200 requests in the hour, 200 of
    them specwatch's (100 replays, on the standard and the noise arm), so 2000 live ones: 100
    mirrored is 5 % (ok), none is a failure, 30 (1.5 %, under half of 5 %) is a failure."""
    COUNTS.update(
        {
            "specwatch_shadow_received_total": mirrored,
            "vllm:request_success_total": 2200,
            "specwatch_shadow_replays_total": 100,
        }
    )
    manifest = tmp_path / "route.yaml"
    manifest.write_text(yaml.safe_dump(HTTPROUTE))
    rc, found = _doctor(capsys, "--prometheus-url", api, "--manifest", str(manifest))
    mirror = [(f["status"], f["message"]) for f in found if f["check"] == "mirror"]
    assert len(mirror) == 1
    assert mirror[0][0] == status
    assert mirror[0][1].startswith(message)
    assert "HTTPRoute vllm-mirror rule 1 (5 %)" in mirror[0][1]
    assert rc == (0 if status == "ok" else 1)


def test_mirror_percentages_of_both_meshes() -> None:
    """Istio: ``mirrors[].percentage`` (5.0) and a ``mirror`` without ``mirrorPercentage``
    (Istio's 100 %); Gateway API: a ``fraction`` 1/50 is 2 %, a filter without percent 100 %."""
    vs = {
        "kind": "VirtualService",
        "metadata": {"name": "vs"},
        "spec": {
            "http": [
                {"mirrors": [{"destination": {"host": "specwatch"}, "percentage": {"value": 5.0}}]},
                {"mirror": {"host": "specwatch"}},
            ]
        },
    }
    route = {
        "kind": "HTTPRoute",
        "metadata": {"name": "r"},
        "spec": {
            "rules": [
                {
                    "filters": [
                        {
                            "type": "RequestMirror",
                            "requestMirror": {"fraction": {"numerator": 1, "denominator": 50}},
                        },
                        {"type": "RequestMirror", "requestMirror": {}},
                        {"type": "RequestHeaderModifier"},
                    ]
                }
            ]
        },
    }
    assert mirror_percentages([vs, route]) == [
        ("VirtualService vs route 1", 5.0),
        ("VirtualService vs route 2", 100.0),
        ("HTTPRoute r rule 1", 2.0),
        ("HTTPRoute r rule 1", 100.0),
    ]


def test_istio_mirror_percent_in_every_form() -> None:
    """The older single ``mirror`` with each way Istio has written its share: ``mirrorPercentage``
    / ``mirror_percentage`` (a Percent, ``{value: 7.5}``), the deprecated integer
    ``mirrorPercent`` / ``mirror_percent`` (plain, or as a UInt32Value ``{value: 10}``), a
    numeric string; a route's ``name`` names it. An old ``mirror_percent: 10`` is 10 %, not
    Istio's 100 % default."""
    forms: list[tuple[dict[str, object], float]] = [
        ({"mirrorPercentage": {"value": 7.5}}, 7.5),
        ({"mirror_percentage": {"value": 7.5}}, 7.5),
        ({"mirrorPercent": 10}, 10.0),
        ({"mirror_percent": 10}, 10.0),
        ({"mirror_percent": {"value": 10}}, 10.0),
        ({"mirrorPercent": "25"}, 25.0),
        ({}, 100.0),
    ]
    routes = [
        {"name": f"r{i}", "mirror": {"host": "specwatch"}, **f} for i, (f, _) in enumerate(forms)
    ]
    vs = {"kind": "VirtualService", "metadata": {"name": "vs"}, "spec": {"http": routes}}
    assert mirror_percentages([vs]) == [
        (f"VirtualService vs route r{i}", want) for i, (_, want) in enumerate(forms)
    ]


def test_gateway_api_mirror_percent_and_fraction() -> None:
    """``percent: 50``; ``fraction`` 3/4 is 75 %, ``fraction`` without denominator is out of 100
    (Gateway API's default); each rule named by its position."""
    rules = [
        {"filters": [{"type": "RequestMirror", "requestMirror": m}]}
        for m in (
            {"percent": 50},
            {"fraction": {"numerator": 3, "denominator": 4}},
            {"fraction": {"numerator": 20}},
        )
    ]
    route = {"kind": "HTTPRoute", "metadata": {"name": "g"}, "spec": {"rules": rules}}
    assert mirror_percentages([route]) == [
        ("HTTPRoute g rule 1", 50.0),
        ("HTTPRoute g rule 2", 75.0),
        ("HTTPRoute g rule 3", 20.0),
    ]


def test_coverage_short_of_a_full_mirror_is_flagged_with_numbers() -> None:
    """A 100 % mirror that delivered 1880 of 2000 live requests (94 %): 120 copies missing,
    6 % of the 2000 expected, over the 2 % the window's edges explain (40), so a warning with
    those numbers; 1990 (5 missing, under 40) is fine."""
    configured = [("VirtualService vs route m", 100.0)]
    ((status, check, message),) = check_mirror_coverage(configured, 1880, 2000)
    assert (status, check) == ("warn", "mirror")
    assert message.startswith(
        "only 94 % (1880 of 2000 live requests in the last 1h) reached specwatch's mirror, "
        "VirtualService vs route m (100 %) sends 100 %: 120 of 2000 expected copies (6 %) missing"
    )
    assert check_mirror_coverage(configured, 1990, 2000)[0][0] == "ok"


def test_several_routes_are_judged_by_their_own_shares() -> None:
    """Two routes, 100 % and 10 %: specwatch counts copies, not routes, so the share must lie
    between 10 % and 100 %. 30 % of live requests is within (before, it was judged against
    the largest, 100 %, and failed); 4 % is under half of the smaller route's 10 % and fails,
    naming both routes."""
    configured = [("HTTPRoute g rule 1", 100.0), ("HTTPRoute g rule 2", 10.0)]
    assert check_mirror_coverage(configured, 600, 2000)[0][0] == "ok"
    ((status, _check, message),) = check_mirror_coverage(configured, 80, 2000)
    assert status == "fail"
    assert "HTTPRoute g rule 1 (100 %), HTTPRoute g rule 2 (10 %) sends between 10 % and 100 %" in (
        message
    )
