"""``specwatch doctor`` checks that need no Prometheus (selectors, dashboard variables) and its
exits on an unreachable Prometheus or an unreadable file (the real-Prometheus run with each
fault is tests/e2e/test_doctor_prometheus.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specwatch.__main__ import main
from specwatch.tools.doctor.command import (
    check_roles,
    check_selectors,
    dashboard_queries,
    selector_matches,
)
from tests.fakes import free_port


def test_selector_semantics() -> None:
    """Unset selects nothing, {} everything; matchLabels and each expression operator."""
    labels = {"release": "kps", "team": "llm"}
    assert not selector_matches(None, labels)
    assert selector_matches({}, labels)
    assert selector_matches({"matchLabels": {"release": "kps"}}, labels)
    assert not selector_matches({"matchLabels": {"release": "prom"}}, labels)
    expr = [{"key": "team", "operator": "In", "values": ["llm", "ml"]}]
    assert selector_matches({"matchExpressions": expr}, labels)
    assert not selector_matches(
        {"matchExpressions": [{"key": "team", "operator": "NotIn", "values": ["llm"]}]}, labels
    )
    assert selector_matches(
        {"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]}, labels
    )
    assert not selector_matches({"matchExpressions": [{"key": "x", "operator": "Exists"}]}, labels)


def test_unwatched_namespace_and_unset_selector() -> None:
    """A PodMonitor in another namespace with no namespace selector, and a PrometheusRule when
    the Prometheus object has no ruleSelector, are both named."""
    prom = {
        "kind": "Prometheus",
        "metadata": {"name": "p", "namespace": "monitoring"},
        "spec": {"podMonitorSelector": {}},
    }
    objs = [
        {"kind": "PodMonitor", "metadata": {"name": "pm", "namespace": "llm"}},
        {"kind": "PrometheusRule", "metadata": {"name": "r", "namespace": "monitoring"}},
    ]
    got = [(f.status, f.message) for f in check_selectors(prom, objs)]
    assert got == [
        (
            "fail",
            "PodMonitor pm is not selected: it is in namespace llm but podMonitorNamespaceSelector "
            "is unset, so only namespace monitoring is watched",
        ),
        (
            "fail",
            "PrometheusRule r is not selected: Prometheus p has no ruleSelector, which selects "
            "nothing",
        ),
    ]


def test_dashboard_variables_substituted() -> None:
    """$var, ${var}, [[var]] take the variable's default; multi-value joins with |; All is .*."""
    dash = {
        "templating": {
            "list": [
                {"name": "window", "current": {"value": "15m"}},
                {"name": "model", "current": {"value": ["a", "b"]}},
                {"name": "ns", "current": {"value": "$__all"}},
            ]
        },
        "panels": [
            {
                "title": "P",
                "targets": [
                    {
                        "expr": 'x{window="$window",model_name=~"${model}",ns=~"[[ns]]"}'
                        "[$__rate_interval]"
                    }
                ],
            }
        ],
    }
    assert list(dashboard_queries(dash)) == [
        ("P", "", 'x{window="15m",model_name=~"a|b",ns=~".*"}[60s]')
    ]


def test_unreachable_prometheus_is_one_fail(capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing listens: one FAIL line for check prometheus, exit 1."""
    url = f"http://127.0.0.1:{free_port()}"
    rc = main(["doctor", "--prometheus-url", url, "--timeout", "5", "--format", "table"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 1
    assert len(out) == 1
    assert out[0].startswith(f"FAIL  prometheus cannot query {url}: connect: ")


def test_unreadable_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing manifest is one line naming it and exit 2, before any query."""
    missing = tmp_path / "nope.yaml"
    rc = main(["doctor", "--prometheus-url", "http://127.0.0.1:1", "--manifest", str(missing)])
    assert rc == 2
    assert capsys.readouterr().err.startswith(f"specwatch doctor: {missing}: cannot read: ")


def test_roles_of_sglang_targets() -> None:
    """SGLang servers (``sglang:num_running_reqs``, one series per TP rank) are checked for
    ``role`` like vLLM's: one finding per job and instance, named as SGLang targets."""
    rows = [
        (
            {
                "__name__": "sglang:num_running_reqs",
                "job": "sg",
                "instance": "a:30000",
                "tp_rank": "0",
                "role": "fly",
            },
            3.0,
        ),
        (
            {
                "__name__": "sglang:num_running_reqs",
                "job": "sg",
                "instance": "a:30000",
                "tp_rank": "1",
                "role": "fly",
            },
            3.0,
        ),
        ({"__name__": "vllm:num_requests_running", "job": "vllm", "instance": "b:8000"}, 1.0),
    ]
    found = [(f.status, f.message) for f in check_roles(rows)]
    assert found[0] == ("ok", "SGLang target a:30000 (job sg) has role=fly")
    assert found[1][0] == "fail"
    assert found[1][1].startswith("vLLM target b:8000 (job vllm) has no role label")
    assert len(found) == 2
