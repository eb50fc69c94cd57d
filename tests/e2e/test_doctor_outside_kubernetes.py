"""``specwatch doctor`` with the shipped dashboards against a Prometheus outside Kubernetes (a
plain ``static_configs`` scrape: no ``namespace`` or ``pod`` label on any series, and a vLLM
target without ``role``): the first line names the root cause (the missing label and how to set
it outside Kubernetes) and the dashboard failures that follow from it are one counted line, not
one line each."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from specwatch.observe.settings import TargetSettings
from specwatch.server.app import build_app
from specwatch.settings import Settings
from specwatch.simulate.config import Role, SimConfig
from specwatch.simulate.launcher import start_simulator
from tests.e2e.test_doctor_prometheus import _scraped
from tests.fakes import REPO
from tests.fakes.prometheus import run_prometheus
from tests.sidecar_process import run_specwatch

DASHBOARDS = sorted((REPO / "grafana").glob("*.json"))


@pytest.mark.slow
async def test_outside_kubernetes_leads_with_the_missing_label(tmp_path: Path) -> None:
    """Exit 1; the first line is the ``labels`` FAIL for ``namespace`` saying Prometheus may be
    outside Kubernetes and how to set the label; the next lines fold ``role`` (pointing to the
    role check) and count the dashboard queries that follow; at most 8 FAIL lines in all
    (e33cd11 printed one per metric and per panel, well over 100)."""
    sim = await start_simulator(SimConfig(role=Role.STANDARD, time_scale=0.0))
    settings = Settings(targets=(TargetSettings(name="standard", url=sim.url),))
    server = TestServer(build_app(settings), host="127.0.0.1", port=0)
    await server.start_server()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"{sim.url}/v1/completions", json={"prompt": "hi", "max_tokens": 4}
            ) as r:
                assert r.status == 200
            config = {
                "global": {"scrape_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": "specwatch",
                        "static_configs": [{"targets": [f"127.0.0.1:{server.port}"]}],
                    },
                    {
                        "job_name": "vllm",
                        "static_configs": [{"targets": [sim.url.removeprefix("http://")]}],
                    },
                ],
            }
            async with run_prometheus(tmp_path, config, session) as prom:
                await _scraped(session, prom, jobs=2, rules=False)
                await asyncio.sleep(2)  # every specwatch family scraped at least twice
                dashboards = [f"--dashboard={d}" for d in DASHBOARDS]
                rc, out, err = await run_specwatch(
                    "doctor", "--prometheus-url", prom, *dashboards, "--format", "table"
                )
    finally:
        await server.close()
        await sim.stop()
    assert rc == 1, err
    lines = out.splitlines()
    fails = [ln for ln in lines if ln.startswith("FAIL")]
    assert lines[0].startswith("FAIL  labels     no series of ")
    assert "has label 'namespace'" in lines[0]
    assert "Prometheus outside Kubernetes?" in lines[0]
    assert "static_configs: labels" in lines[0]
    assert "has label 'role'" in lines[1]
    assert lines[1].endswith("it follows from the role failure below")
    assert lines[2].startswith("FAIL  dashboard  ")
    assert "dashboard queries and variables have no data: they follow from the missing" in lines[2]
    assert len(fails) <= 8, "\n".join(fails)
    assert not [ln for ln in fails if "no data for" in ln], "\n".join(fails)
    assert any(ln.startswith("FAIL  role       vLLM target") for ln in fails)
