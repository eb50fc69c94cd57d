"""The shadow side's CPU time per pair, through the real pair path.

Run from the repository root: ``PYTHONPATH=. python bench/bench_pair_cpu.py [--pairs N]
[--rate R] [--profile FILE]``.

A child process serves three fake OpenAI arms (standard, FLy, noise; each answers one fixed
completion with vLLM's per-request speculative-decoding metrics; ``noise_kind: standard``) and
sends ``--pairs`` mirrored ``/v1/completions`` requests at ``--rate`` per second to the
sidecar's mirror listener on 127.0.0.1. This process runs
:class:`~specwatch.shadow.component.ShadowComponent` as the sidecar does (mirror mode, a real
SQLite ledger in a temporary folder, the statistics refreshed every ``paired.refresh_seconds``,
default windows) and counts ``time.process_time`` from the first request until every pair is
counted and one last refresh ran: mirror ingest, sampling, the three replays, compare, the
ledger row and its write, the live tallies, the e-processes and the published snapshot. The
arms' and the sender's CPU are in the child and not counted. Prints CPU milliseconds per pair
and the share of one core at the rate.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ARMS = ("standard", "fly", "noise")


# -- child: arms and sender ---------------------------------------------------------------------


def _reply(steps: list[int]) -> dict[str, Any]:
    from specwatch.vllm.request_metrics import metrics_object, spec_decode_object

    spec = spec_decode_object(
        num_spec_tokens=4,
        per_step_accepted=steps,
        per_step_drafted=[4] * len(steps),
        detailed=False,
        streamed=False,
    )
    return {
        "choices": [{"index": 0, "text": "the answer is 42", "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18},
        "metrics": metrics_object(spec, streamed=False),
    }


async def _child() -> None:
    runners = []
    ports = {}
    for name, steps in zip(ARMS, ([1, 1], [3, 2], [1, 2]), strict=True):
        body = json.dumps(_reply(steps)).encode()

        async def handle(request: web.Request, body: bytes = body) -> web.Response:
            await request.read()
            return web.Response(body=body, content_type="application/json")

        app = web.Application()
        app.router.add_post("/v1/completions", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        ports[name] = runner.addresses[0][1]
        runners.append(runner)
    print(json.dumps(ports), flush=True)
    loop = asyncio.get_running_loop()
    line = await loop.run_in_executor(None, sys.stdin.readline)
    cmd = json.loads(line)
    url = f"http://127.0.0.1:{cmd['port']}/v1/completions"
    gap = 1.0 / cmd["rate"]
    start = time.monotonic()
    async with aiohttp.ClientSession() as session:
        for i in range(cmd["pairs"]):
            delay = start + i * gap - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            req: dict[str, object] = {"prompt": f"q {i}", "max_tokens": 8, "temperature": 0}
            headers = {"X-Specwatch-Category": f"c{i % 3}"}
            async with session.post(url, json=req, headers=headers) as r:
                await r.read()
    print("sent", flush=True)
    await loop.run_in_executor(None, sys.stdin.readline)
    for runner in runners:
        await runner.cleanup()


# -- parent: the sidecar's shadow side ----------------------------------------------------------


async def _parent(pairs: int, rate: float, profile: Path | None) -> None:
    from specwatch.shadow.component import ShadowComponent
    from specwatch.shadow.settings import LedgerSettings, PairedSettings, ShadowSettings

    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--child", stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    assert child.stdin is not None
    assert child.stdout is not None
    ports = json.loads(await child.stdout.readline())
    with tempfile.TemporaryDirectory() as tmp:
        shadow = ShadowSettings.model_validate(
            {
                "enabled": True,
                "modes": ["mirror"],
                "sample_probability": 1.0,
                "max_shadow_rps": 10_000.0,
                "mirror_listen_host": "127.0.0.1",
                "mirror_listen_port": 0,
                "noise_kind": "standard",
                **{a: {"url": f"http://127.0.0.1:{p}"} for a, p in ports.items()},
            }
        )
        comp = ShadowComponent(
            shadow, PairedSettings(), LedgerSettings(path=str(Path(tmp) / "ledger.sqlite"))
        )
        async with comp.running():
            await comp._ready.wait()
            prof = cProfile.Profile(time.process_time) if profile is not None else None
            wall0, cpu0, t0 = time.monotonic(), time.process_time(), os.times()
            if prof is not None:
                prof.enable()
            cmd = {"port": comp.mirror_port, "pairs": pairs, "rate": rate}
            child.stdin.write(json.dumps(cmd).encode() + b"\n")
            # a tree before the pair path was straightened kept them on the component
            holder: Any = getattr(comp, "statistics", comp)
            counters = holder.counters
            while sum(counters.by_status().values()) < pairs:  # noqa: ASYNC110 (no event to wait on)
                await asyncio.sleep(0.05)
            stats = await comp.refresh(flush=True)
            cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
            t1 = os.times()
            if prof is not None:
                prof.disable()
                prof.dump_stats(str(profile))
        child.stdin.write(b"\n")
        await asyncio.wait_for(child.wait(), 30)
    status = counters.by_status()
    print(f"pairs {pairs} at {rate:g}/s: statuses {status}, ledger rows {stats.ledger_rows}")
    print(
        f"CPU {cpu * 1000 / pairs:.2f} ms per pair ({cpu:.2f} s CPU over {wall:.1f} s wall, "
        f"{100 * cpu / wall:.1f} % of a core; user {(t1.user - t0.user) * 1000 / pairs:.2f} ms, "
        f"system {(t1.system - t0.system) * 1000 / pairs:.2f} ms per pair)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=300)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--profile", type=Path, default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        asyncio.run(_child())
    else:
        asyncio.run(_parent(args.pairs, args.rate, args.profile))


if __name__ == "__main__":
    main()
