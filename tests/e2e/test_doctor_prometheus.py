"""``specwatch doctor`` against a real Prometheus: a healthy setup passes, and each injected fault
(a specwatch target down, no specwatch rules, a vLLM target without ``role``, a ServiceMonitor
without the ``release`` label the Prometheus object selects on, a dashboard query without data, a
dashboard variable whose query has no value) is named by one FAIL line. A query variable with no
saved value is read at the first value Prometheus gives it, as Grafana opens the dashboard."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp.test_utils import TestServer

from specwatch.observe.settings import TargetSettings
from specwatch.server.app import build_app
from specwatch.settings import Settings
from specwatch.simulate.config import Role, SimConfig
from specwatch.simulate.launcher import start_simulator
from tests.fakes import free_port
from tests.fakes.prometheus import run_prometheus
from tests.fakes.wait import poll
from tests.sidecar_process import run_specwatch

RULES = {
    "groups": [
        {
            "name": "specwatch-doctor-test.rules",
            "rules": [
                {"record": "job:specwatch_build_info:count", "expr": "count(specwatch_build_info)"}
            ],
        }
    ]
}


def _dashboard(with_missing_panel: bool) -> dict[str, Any]:
    panels: list[dict[str, Any]] = [
        {"title": "Build", "targets": [{"expr": 'specwatch_build_info{job="$job"}'}]},
        # a query variable without a saved value: Grafana opens at the first value of its query
        {"title": "Instance", "targets": [{"expr": 'specwatch_build_info{instance="$instance"}'}]},
        {
            "title": "Quiet",
            "description": "Empty until an alert fires.",
            "targets": [{"expr": 'ALERTS{alertname="NoSuchAlert"}'}],
        },
        {
            "type": "row",
            "title": "Row",
            "panels": [
                {
                    "title": "Running",
                    "targets": [
                        {"expr": "sum(rate(vllm:generation_tokens_total[$__rate_interval]))"}
                    ],
                }
            ],
        },
    ]
    if with_missing_panel:
        panels.append({"title": "Missing", "targets": [{"expr": "specwatch_no_such_series"}]})
    variables: list[dict[str, Any]] = [
        {"name": "job", "current": {"value": "specwatch"}, "options": []},
        {
            "name": "instance",
            "type": "query",
            "query": {"query": 'label_values(specwatch_build_info{job="$job"}, instance)'},
            "current": {},
        },
    ]
    if with_missing_panel:
        variables.append(
            {"name": "gone", "type": "query", "query": "label_values(no_such_series, pod)"}
        )
    return {"title": "Doctor test", "templating": {"list": variables}, "panels": panels}


def _objects(release_label: bool) -> list[dict[str, Any]]:
    labels = {
        "app.kubernetes.io/name": "vllm-pair",
        **({"release": "kps"} if release_label else {}),
    }
    return [
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": {"name": "vllm-pair", "namespace": "llm", "labels": labels},
        },
        {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "PrometheusRule",
            "metadata": {"name": "specwatch", "namespace": "llm", "labels": {"release": "kps"}},
        },
    ]


PROMETHEUS_OBJECT = {
    "apiVersion": "monitoring.coreos.com/v1",
    "kind": "Prometheus",
    "metadata": {"name": "kps-prometheus", "namespace": "monitoring"},
    "spec": {
        "serviceMonitorSelector": {"matchLabels": {"release": "kps"}},
        "serviceMonitorNamespaceSelector": {},
        "ruleSelector": {"matchLabels": {"release": "kps"}},
        "ruleNamespaceSelector": {},
    },
}


async def _scraped(session: aiohttp.ClientSession, prom: str, jobs: int, rules: bool) -> None:
    """Wait until every target was scraped (health known) and the vLLM counter has the two samples
    a ``rate()`` panel needs, and, with ``rules``, the rule group evaluated."""

    async def ready() -> bool | None:
        async with session.get(f"{prom}/api/v1/targets") as r:
            targets = (await r.json())["data"]["activeTargets"]
        if len(targets) != jobs or any(t["health"] == "unknown" for t in targets):
            return None
        async with session.get(
            f"{prom}/api/v1/query",
            params={"query": "sum(rate(vllm:generation_tokens_total[5m]))"},  # two samples
        ) as r:
            if not (await r.json())["data"]["result"]:
                return None
        if rules:
            async with session.get(f"{prom}/api/v1/rules") as r:
                groups = (await r.json())["data"]["groups"]
            if not groups or groups[0]["lastEvaluation"].startswith("0001"):
                return None
        return True

    await poll("prometheus scraped every target", ready, within=60, every=0.5)


def _files(tmp: Path, *, healthy: bool) -> list[str]:
    rules = tmp / "rules.yaml"
    rules.write_text(yaml.safe_dump(RULES))
    dash = tmp / "dashboard.json"
    dash.write_text(json.dumps(_dashboard(with_missing_panel=not healthy)))
    manifests = tmp / "monitors.yaml"
    manifests.write_text(yaml.safe_dump_all(_objects(release_label=healthy)))
    prom_obj = tmp / "prometheus-object.yaml"
    prom_obj.write_text(yaml.safe_dump(PROMETHEUS_OBJECT))
    return [
        "--rules", str(rules), "--dashboard", str(dash), "--manifest", str(manifests),
        "--prometheus-object", str(prom_obj),
    ]  # fmt: skip


@pytest.mark.slow
async def test_doctor_healthy_then_each_fault_named(tmp_path: Path) -> None:
    """Healthy: exit 0, no FAIL, the documented-empty panel a WARN, the panel filtered by a
    variable without a saved value finds the sidecar's series (the variable takes the first
    ``instance`` Prometheus lists). Faulty: exit 1 and one FAIL per injected fault, naming the
    target, the missing rules, the vLLM target, the ServiceMonitor's missing ``release`` label,
    the empty panel and the variable whose query returns nothing."""
    sim = await start_simulator(SimConfig(role=Role.STANDARD, time_scale=0.0))
    settings = Settings(targets=(TargetSettings(name="standard", url=sim.url),))
    server = TestServer(build_app(settings), host="127.0.0.1", port=0)
    await server.start_server()
    sidecar = f"127.0.0.1:{server.port}"
    vllm = sim.url.removeprefix("http://")
    dead = f"127.0.0.1:{free_port()}"
    try:
        async with aiohttp.ClientSession() as session:
            # a little traffic so vLLM's counters have series
            async with session.post(
                f"{sim.url}/v1/completions", json={"prompt": "hi", "max_tokens": 4}
            ) as r:
                assert r.status == 200
            healthy_dir = tmp_path / "healthy"
            healthy_dir.mkdir()
            config: dict[str, Any] = {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(healthy_dir / "rules.yaml")],
                "scrape_configs": [
                    {"job_name": "specwatch", "static_configs": [{"targets": [sidecar]}]},
                    {
                        "job_name": "vllm",
                        "static_configs": [{"targets": [vllm], "labels": {"role": "standard"}}],
                    },
                ],
            }
            args = _files(healthy_dir, healthy=True)
            async with run_prometheus(healthy_dir, config, session) as prom:
                await _scraped(session, prom, jobs=2, rules=True)
                rc, out, err = await run_specwatch(
                    "doctor", "--prometheus-url", prom, *args, "--format", "table"
                )
            assert rc == 0, out + err
            lines = out.splitlines()
            assert not [ln for ln in lines if ln.startswith("FAIL")]
            assert f"OK    targets    specwatch target {sidecar} (job specwatch) is up" in lines
            assert "OK    rules      rule group specwatch-doctor-test.rules is loaded" in lines
            assert f"OK    role       vLLM target {vllm} (job vllm) has role=standard" in lines
            assert (
                "OK    selectors  ServiceMonitor vllm-pair is selected by Prometheus kps-prometheus"
                in lines
            )
            assert "OK    dashboard  Doctor test / Build: 1 series" in lines
            assert "OK    dashboard  Doctor test / Instance: 1 series" in lines
            assert "OK    dashboard  Doctor test / Running: 1 series" in lines
            assert (
                "WARN  dashboard  Doctor test / Quiet: no data (Empty until an alert fires.)"
                in lines
            )

            faulty_dir = tmp_path / "faulty"
            faulty_dir.mkdir()
            config = {
                "global": {"scrape_interval": "1s"},
                "scrape_configs": [
                    {"job_name": "specwatch", "static_configs": [{"targets": [sidecar, dead]}]},
                    {"job_name": "vllm", "static_configs": [{"targets": [vllm]}]},
                ],
            }
            args = _files(faulty_dir, healthy=False)
            async with run_prometheus(faulty_dir, config, session) as prom:
                await _scraped(session, prom, jobs=3, rules=False)
                rc, out, err = await run_specwatch(
                    "doctor", "--prometheus-url", prom, *args, "--format", "json"
                )
    finally:
        await server.close()
        await sim.stop()
    assert rc == 1, out + err
    fails = {(f["check"], f["message"]) for f in json.loads(out) if f["status"] == "fail"}
    messages = {check: [m for c, m in fails if c == check] for check, _ in fails}
    assert len(messages["targets"]) == 1
    assert messages["targets"][0].startswith(f"specwatch target {dead} (job specwatch) is down: ")
    assert sorted(messages["rules"]) == [
        "no specwatch rule group is loaded: recording rules behind the dashboards are missing "
        "(PrometheusRule not selected, or rule_files not set)",
        "rule group specwatch-doctor-test.rules is not loaded",
    ]
    assert messages["role"] == [
        f"vLLM target {vllm} (job vllm) has no role label: the per-role panels and rules drop "
        "it (add a relabeling that sets role: standard|fly)"
    ]
    assert messages["selectors"] == [
        "ServiceMonitor vllm-pair is not selected: its labels do not match Prometheus "
        "kps-prometheus's serviceMonitorSelector (needs {'release': 'kps'})"
    ]
    assert sorted(messages["dashboard"]) == [
        "Doctor test / Missing: no data for specwatch_no_such_series",
        "Doctor test: $gone has no value: label_values(no_such_series, pod) is empty",
    ]
