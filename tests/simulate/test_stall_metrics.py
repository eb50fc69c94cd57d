"""Regression: with admission stalled, ``/metrics`` reports the real queue.

The queue gauges used to be set only after a step that scheduled something; with
``stall_admission`` and nothing running no step runs, so ``vllm:num_requests_waiting`` stayed 0
while ``/admin/stats`` showed the queued requests.
"""

from __future__ import annotations

import asyncio

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from specwatch.simulate.config import SimConfig
from specwatch.simulate.launcher import start_simulator


async def _queues(s: aiohttp.ClientSession, url: str) -> tuple[float, float, int, int]:
    """(waiting, running) summed over engines from ``/metrics``; the same from ``/admin/stats``."""
    async with s.get(url + "/metrics") as r:
        text = await r.text()
    gauges = {"vllm:num_requests_waiting": 0.0, "vllm:num_requests_running": 0.0}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if smp.name in gauges:
                gauges[smp.name] += smp.value
    async with s.get(url + "/admin/stats") as r:
        server = (await r.json())["server"]
    return (
        gauges["vllm:num_requests_waiting"],
        gauges["vllm:num_requests_running"],
        int(server["num_requests_waiting"]),
        int(server["num_requests_running"]),
    )


async def test_stalled_admission_shows_waiting_requests_on_metrics() -> None:
    """Requests held by a stalled admission show as waiting on /metrics until released."""
    h = await start_simulator(SimConfig(data_parallel_size=2, time_scale=0.0))
    n = 7
    sent: list[asyncio.Task[int]] = []
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(h.url + "/admin/faults", json={"stall_admission": True}) as r:
                assert r.status == 200

            async def one(i: int) -> int:
                body = {"prompt": f"stalled request {i}", "max_tokens": 8}
                async with s.post(h.url + "/v1/completions", json=body) as resp:
                    await resp.read()
                    return resp.status

            sent += [asyncio.create_task(one(i)) for i in range(n)]
            async with asyncio.timeout(20):
                while True:  # the requests reach the queue as their handlers run
                    got = await _queues(s, h.url)
                    if got[2] == n:
                        break
                    await asyncio.sleep(0.02)
            # all queued (the stats were read after /metrics: read both again), none admitted,
            # and /metrics agrees with the ground truth
            assert await _queues(s, h.url) == (float(n), 0.0, n, 0)
            await asyncio.sleep(0.1)  # idle engines: the gauges still hold the queue
            assert await _queues(s, h.url) == (float(n), 0.0, n, 0)
            async with s.delete(h.url + "/admin/faults") as r:
                assert r.status == 200
            async with asyncio.timeout(20):
                assert await asyncio.gather(*sent) == [200] * n
            assert await _queues(s, h.url) == (0.0, 0.0, 0, 0)
    finally:
        for t in sent:  # a failed assert leaves requests queued: do not wait for them
            t.cancel()
        await asyncio.gather(*sent, return_exceptions=True)
        await h.stop()
