"""Load-aware pause: while a simulator has waiting requests no shadow replay starts.

The standard simulator runs in real time with ``max_num_seqs`` 1; four long live requests
keep ``vllm:num_requests_waiting`` above 0 for a few seconds.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from specwatch.simulate.config import Role, SimConfig
from tests.e2e.shadow_harness import settings_for, sidecar, simulators, until, write_canary

LIVE = {"prompt": "live", "max_tokens": 1500, "ignore_eos": True, "temperature": 0}


async def _live(client: aiohttp.ClientSession, url: str) -> int:
    async with client.post(url + "/v1/completions", json=LIVE) as r:
        await r.read()
        return r.status


async def test_replays_pause_while_a_simulator_has_waiting_requests(tmp_path: Path) -> None:
    """Replays pause while a simulator has waiting requests and resume once it drains."""
    canary = tmp_path / "canary.jsonl"
    write_canary(canary, variants=1, temperature=0.0)
    slow_std = SimConfig(role=Role.STANDARD, time_scale=1.0, max_num_seqs=1)
    async with simulators(standard=slow_std) as sims:
        settings = settings_for(
            sims,
            tmp_path / "ledger.sqlite",
            scrape_interval=0.1,
            modes=["canary"],
            canary_file=str(canary),
            canary_loop=True,
            canary_rate_per_second=4.0,
            canary_min_rate_per_second=0.0,  # no trickle: nothing at all passes the pause
            max_in_flight=1,  # the shadow side alone never makes the standard server queue
        )
        std = sims["standard"].url
        async with sidecar(settings) as sc:
            pipe = sc.component.pipeline
            assert pipe is not None
            counters = sc.component.statistics.counters

            def started() -> int:
                # compared pairs (the regex checker compares on the loop: no await between a
                # replay's end and its count) plus the replays running now
                return sum(counters.by_status().values()) + pipe.in_flight

            await until(lambda: counters.paired >= 3)
            live = [asyncio.create_task(_live(sc.client, std)) for _ in range(4)]
            await until(lambda: "waiting" in pipe.sampler.current_pause(), limit=30)
            transitions = pipe.sampler.pauses["waiting"]
            assert transitions >= 1
            started_at_pause = started()
            admitted_at_pause = pipe.sampler.admitted
            dropped_at_pause = pipe.sampler.dropped["paused"]
            # canary items keep coming and are dropped as paused; no replay starts
            await until(lambda: pipe.sampler.dropped["paused"] >= dropped_at_pause + 3)
            await sc.component.refresh()
            still_paused = "waiting" in pipe.sampler.current_pause()
            assert still_paused
            assert pipe.sampler.pauses["waiting"] == transitions
            assert started() == started_at_pause
            assert pipe.sampler.admitted == admitted_at_pause
            m = await sc.metrics()
            assert m[("specwatch_shadow_paused", frozenset({("reason", "waiting")}))] == 1.0
            assert m[("specwatch_shadow_pauses_total", frozenset({("reason", "waiting")}))] >= 1
            assert m[("specwatch_shadow_dropped_total", frozenset({("reason", "paused")}))] >= 3
            # once the live requests are done the shadow replays resume
            assert await asyncio.gather(*live) == [200] * 4
            await until(lambda: pipe.sampler.admitted > admitted_at_pause, limit=30)
            await until(lambda: started() > started_at_pause + 1, limit=30)
