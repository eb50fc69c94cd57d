"""The mixin evaluated by a real Prometheus (Debian `prometheus`) scraping fake vLLM servers.

Three fake vLLM `/metrics` endpoints (aiohttp, port 0) expose vLLM's spec-decode counters in
vLLM's own names; each scrape advances them by fixed steps, so every rate ratio is exact:
standard accepts 90 of 180 draft tokens per 60 drafts (α 0.5, τ 2.5), FLy 108 of 180 (α 0.6,
τ 2.8), and a third server generates tokens but drafts nothing. Prometheus scrapes them every
second with a `role` label from the scrape config, evaluates the rules every second, and we
read the recording rules and the pending SpecDecodeInactive alert from its HTTP API.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from deploy.mixin.render import DEFAULT_RULES
from tests.fakes.prometheus import run_prometheus
from tests.fakes.vllm import FakeVllm

pytestmark = pytest.mark.promtool


def counters_page(
    drafts: int, draft_tokens: int, accepted: int, generation: int
) -> Callable[[int], str]:
    """A vLLM page whose spec-decode counters advance by one step per scrape (n-th scrape: n
    steps), for :class:`~tests.fakes.vllm.FakeVllm`'s ``page``."""

    def page(n: int) -> str:
        lab = 'engine="0",model_name="llama"'
        lines = [
            "# TYPE vllm:spec_decode_num_drafts_total counter",
            f"vllm:spec_decode_num_drafts_total{{{lab}}} {n * drafts}",
            "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
            f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {n * draft_tokens}",
            "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
            f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {n * accepted}",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{lab}}} {n * generation}",
            # a speculating server exposes its K per-position counters (here K 3), at 0 when idle
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
            *(
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} 0'
                for i in range(3)
            ),
            "",
        ]
        return "\n".join(lines)

    return page


@pytest.fixture
async def prometheus(tmp_path: Path) -> AsyncIterator[str]:
    pages = {
        "standard": counters_page(drafts=60, draft_tokens=180, accepted=90, generation=150),
        "fly": counters_page(drafts=60, draft_tokens=180, accepted=108, generation=168),
        "idle": counters_page(drafts=0, draft_tokens=0, accepted=0, generation=100),
    }
    async with contextlib.AsyncExitStack() as stack:
        session = await stack.enter_async_context(aiohttp.ClientSession())
        jobs = []
        for role, page in pages.items():
            fake = await stack.enter_async_context(FakeVllm(page=page))
            jobs.append(
                {
                    "job_name": f"vllm-{role}",
                    "scrape_interval": "1s",
                    "static_configs": [
                        {
                            "targets": [fake.url.split("//")[1].split("/")[0]],
                            "labels": {"role": "standard" if role == "idle" else role},
                        }
                    ],
                }
            )
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(DEFAULT_RULES)],
            "scrape_configs": jobs,
        }
        yield await stack.enter_async_context(run_prometheus(tmp_path, config, session))


async def _query_until(
    session: aiohttp.ClientSession, base: str, expr: str, count: int
) -> list[dict[str, Any]]:
    """Poll an instant query until it returns ``count`` series (60 s at most)."""
    result: list[dict[str, Any]] = []
    for _ in range(600):
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(f"{base}/api/v1/query", params={"query": expr}) as resp:
                if resp.status == 200:
                    result = (await resp.json())["data"]["result"]
                    if len(result) >= count:
                        return result
        await asyncio.sleep(0.1)
    raise AssertionError(f"{expr}: {result}")


def _by(result: list[dict[str, Any]], label: str) -> dict[str, float]:
    return {r["metric"][label]: float(r["value"][1]) for r in result}


async def test_rules_on_real_prometheus(prometheus: str) -> None:
    """α, τ, ℓ and the FLy gain come out exact; the idle server has SpecDecodeInactive pending."""
    async with aiohttp.ClientSession() as session:
        alpha = await _query_until(
            session,
            prometheus,
            'instance:vllm_spec_decode_acceptance:ratio_rate5m{job!="vllm-idle"}',
            2,
        )
        assert _by(alpha, "role") == pytest.approx({"standard": 0.5, "fly": 0.6})
        tau = await _query_until(
            session,
            prometheus,
            'instance_engine:vllm_spec_decode_mean_acceptance_length:rate5m{job!="vllm-idle"}',
            2,
        )
        assert _by(tau, "role") == pytest.approx({"standard": 2.5, "fly": 2.8})
        ell = await _query_until(
            session, prometheus, "instance:vllm_spec_decode_mean_draft_length:rate5m", 3
        )
        assert _by(ell, "job")["vllm-fly"] == pytest.approx(3.0)
        assert _by(ell, "job")["vllm-standard"] == pytest.approx(3.0)
        assert math.isnan(_by(ell, "job")["vllm-idle"])  # no drafts: undefined, not 0
        # "> -1" drops NaN: the standard pool is 0/0 until the standard server's second scrape
        gain = await _query_until(
            session,
            prometheus,
            "model_name:vllm_spec_decode_fly_acceptance_gain:ratio_rate15m > -1",
            1,
        )
        # standard's pool mixes the idle server, which drafts nothing: α_std stays 0.5
        assert _by(gain, "model_name") == pytest.approx({"llama": 0.1})
        pending = await _query_until(
            session, prometheus, 'ALERTS{alertname="SpecDecodeInactive"}', 1
        )
        assert [r["metric"]["job"] for r in pending] == ["vllm-idle"]
        assert pending[0]["metric"]["alertstate"] == "pending"
        everything = await _query_until(session, prometheus, "count(ALERTS) or vector(0)", 1)
        assert float(everything[0]["value"][1]) == 1.0  # nothing else pending or firing
