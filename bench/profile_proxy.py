"""Where the shadow proxy's time goes: cProfile of ShadowProxy relaying non-streaming requests.

The upstream is ``specwatch simulate`` in its own process; the proxy runs on this process's
main thread (profiled); a load generator on a second thread (not profiled: cProfile follows one
thread) sends ``--requests`` sequential POSTs. Prints the top functions by own time and by
cumulative time.

Run from the repository root::

    PYTHONPATH=. python bench/profile_proxy.py --requests 3000
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import pstats
import subprocess
import sys

import aiohttp
from bench_proxy import PLAIN_BODY, free_port, wait_port  # bench/ is sys.path[0]

from specwatch.core.clock import SYSTEM_WALL
from specwatch.shadow.ingest.offer import IngestCounters
from specwatch.shadow.ingest.proxy import ShadowProxy
from specwatch.shadow.values import ShadowRequest


def load(port: int, n: int) -> None:
    async def run() -> None:
        body = json.dumps(PLAIN_BODY).encode()
        url = f"http://127.0.0.1:{port}/v1/completions"
        async with aiohttp.ClientSession() as s:
            for _ in range(n):
                async with s.post(url, data=body) as r:
                    await r.read()

    asyncio.run(run())


async def main_async(args: argparse.Namespace, up_port: int) -> None:
    await wait_port(up_port)

    def offer(r: ShadowRequest) -> str:
        return "admitted"

    proxy = ShadowProxy(
        f"http://127.0.0.1:{up_port}",
        offer,
        counters=IngestCounters(),
        wall_clock=SYSTEM_WALL,
    )
    port = await proxy.start("127.0.0.1", 0)
    prof = cProfile.Profile()
    prof.enable()
    await asyncio.to_thread(load, port, args.requests)
    prof.disable()
    await proxy.stop()
    stats = pstats.Stats(prof)
    stats.sort_stats("tottime").print_stats(args.top)
    stats.sort_stats("cumulative").print_stats(args.top)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--top", type=int, default=25)
    up_port = free_port()
    sim = ["simulate", "--host", "127.0.0.1", "--port", str(up_port), "--time-scale", "0"]
    up = subprocess.Popen([sys.executable, "-m", "specwatch", *sim])
    try:
        asyncio.run(main_async(ap.parse_args(), up_port))
    finally:
        up.terminate()
        up.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
