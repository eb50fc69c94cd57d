"""histogram_quantile checked against Prometheus itself (promtool's PromQL engine)."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
import yaml

from specwatch.observe.health import histogram_quantile
from specwatch.observe.parse import parse_page
from tests.fixture_files import body

#: (name, cumulative buckets) cases: real ITL/TTFT captures and edge cases
#: (empty leading buckets, mass in +Inf, a single finite bucket, a flat tail).
_REAL = parse_page(body("vllm-metrics/real-cpu-ngram.txt")).engines[("tiny", "0")].histograms
CASES: dict[str, tuple[tuple[float, float], ...]] = {
    "itl": _REAL["itl"].buckets,
    "ttft": _REAL["ttft"].buckets,
    "inf_heavy": ((0.1, 1.0), (0.2, 2.0), (math.inf, 10.0)),
    "single": ((0.5, 4.0), (math.inf, 4.0)),
    "leading_zeros": ((0.001, 0.0), (0.005, 0.0), (0.01, 3.0), (0.05, 9.0), (math.inf, 9.0)),
}
QS = (0.01, 0.25, 0.5, 0.9, 0.99, 1.0)


def _le(value: float) -> str:
    return "+Inf" if value == math.inf else repr(value)


@pytest.mark.promtool
async def test_matches_promql(tmp_path: Path) -> None:
    """For every case and quantile, promtool evaluates histogram_quantile to our value."""
    series = []
    tests = []
    for name, buckets in CASES.items():
        for le, count in buckets:
            series.append(
                {"series": f'h_bucket{{case="{name}",le="{_le(le)}"}}', "values": repr(count)}
            )
        for q in QS:
            ours = histogram_quantile(q, buckets)
            assert ours is not None
            tests.append(
                {
                    "expr": f'histogram_quantile({q}, h_bucket{{case="{name}"}})',
                    "eval_time": "0m",
                    "exp_samples": [{"labels": f'{{case="{name}"}}', "value": ours}],
                }
            )
    (tmp_path / "rules.yaml").write_text("groups: []\n")
    doc = {
        "rule_files": ["rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": tests}],
    }
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(doc))
    proc = await asyncio.create_subprocess_exec(
        "/usr/bin/promtool",
        "test",
        "rules",
        "t.yaml",
        cwd=tmp_path,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, out.decode() + err.decode()
