"""A starved budget: live traffic keeps the standard server's queue non-empty the whole time, so
replays pause (rightly) for the whole run. The canary trickle still gets graded pairs through,
the verdict keeps moving, and every place a user looks says that replays pause and why.

The standard simulator runs in real time with ``max_num_seqs`` 2; a closed loop of 6 live
clients with short answers keeps ``vllm:num_requests_waiting`` above 0 while each request turns
over within a second or two, so a trickled canary request is served in its turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path

import aiohttp

from specwatch.export.json import shadow_verdict
from specwatch.simulate.config import Role, SimConfig
from tests.e2e.shadow_harness import settings_for, sidecar, simulators, until, write_canary

LIVE = {"prompt": "live", "max_tokens": 24, "ignore_eos": True, "temperature": 0}


async def _live_loop(client: aiohttp.ClientSession, url: str, stop: asyncio.Event) -> None:
    while not stop.is_set():
        async with client.post(url + "/v1/completions", json=LIVE) as r:
            await r.read()


async def test_starved_budget_keeps_a_moving_verdict_and_says_why(tmp_path: Path) -> None:
    """Paused on waiting the whole run, graded pairs still grow by the trickle, and the
    sampler, /metrics, the snapshot and the verdict say the pause and its cause."""
    canary = tmp_path / "canary.jsonl"
    write_canary(canary, variants=1, temperature=0.0)
    slow_std = SimConfig(role=Role.STANDARD, time_scale=1.0, max_num_seqs=2)
    async with simulators(standard=slow_std) as sims:
        settings = settings_for(
            sims,
            tmp_path / "ledger.sqlite",
            scrape_interval=0.1,
            modes=["canary"],
            canary_file=str(canary),
            canary_loop=True,
            canary_rate_per_second=4.0,
            canary_min_rate_per_second=1.0,  # the trickle through the pause
            max_in_flight=1,
        )
        std = sims["standard"].url
        async with sidecar(settings) as sc:
            pipe = sc.component.pipeline
            assert pipe is not None
            counters = sc.component.statistics.counters
            stop = asyncio.Event()
            live = [asyncio.create_task(_live_loop(sc.client, std, stop)) for _ in range(6)]
            try:
                await until(lambda: "waiting" in pipe.sampler.current_pause(), limit=30)
                paired_at_pause = counters.paired
                trickled_at_pause = pipe.sampler.trickled
                # the pause holds (other canary items are dropped as paused) while trickled
                # canary requests still become graded pairs
                await until(lambda: counters.paired >= paired_at_pause + 3, limit=90)
                # (most of them trickled: the pause holds with 4 live requests always waiting)
                assert pipe.sampler.trickled >= trickled_at_pause + 2
                assert pipe.sampler.dropped["paused"] > 0
                await sc.component.refresh()
                text = pipe.sampler.pause_text
                assert re.fullmatch(r"paused: standard has \d+ requests? waiting", text), text
                m = await sc.metrics()
                assert m[("specwatch_shadow_paused", frozenset({("reason", "waiting")}))] == 1.0
                assert m[("specwatch_shadow_canary_trickled_total", frozenset())] >= 2
                async with sc.client.get(sc.url + "/api/v1/snapshot") as r:
                    snap = await r.json()
                io = snap["shadow"]["io"]
                assert io["paused"]["waiting"] is True
                assert io["pause"].startswith("paused: standard has ")
                assert io["trickled_total"] >= 2
                stats = sc.component.latest_stats()
                assert stats is not None
                verdict = shadow_verdict(stats)
                assert "(paused: standard has " in verdict, verdict
            finally:
                stop.set()
                for t in live:
                    t.cancel()
                    with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                        await t
