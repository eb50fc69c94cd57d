"""promtool (Debian) reads the simulator's page as it reads vLLM's: only vLLM's naming lints."""

from __future__ import annotations

import math
import shutil
import subprocess

import pytest

from specwatch.simulate.config import Role, SimConfig
from specwatch.simulate.engine_core import Simulation
from specwatch.simulate.faults import MALFORMED_METRICS_BODY
from specwatch.simulate.metrics import SimMetrics

pytestmark = pytest.mark.promtool
PROMTOOL = shutil.which("promtool")


def _check(body: bytes) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None, "promtool is installed on the CI machine (/usr/bin/promtool)"
    return subprocess.run([PROMTOOL, "check", "metrics"], input=body.decode(),
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip


def test_promtool_parses_the_page_and_finds_only_vllm_naming_lints() -> None:
    """promtool parses the simulator's page and finds only vLLM's own naming lints."""
    cfg = SimConfig(role=Role.FLY, data_parallel_size=2)
    m = SimMetrics(cfg)
    sim = Simulation(cfg, sink=m)
    for i in range(8):
        sim.submit(f"promtool {i}", max_tokens=20)
    sim.run_until(math.inf)
    res = _check(m.exposition())
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
    assert res.returncode == 3  # lint findings only (1 would be a parse error)
    assert lines
    for ln in lines:
        # vLLM's own names carry a colon, and its iteration_tokens_total histogram ends in _total
        assert ln.endswith("metric names should not contain ':'") or ln.endswith(
            'non-counter metrics should not have "_total" suffix'
        ), ln


def test_promtool_rejects_the_malformed_fault_body() -> None:
    """promtool rejects the malformed /metrics body of the fault mode."""
    res = _check(MALFORMED_METRICS_BODY)
    assert res.returncode == 1
    assert "parsing error" in res.stdout + res.stderr
