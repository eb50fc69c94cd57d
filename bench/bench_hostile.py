"""``/healthz`` answer times under hostile input: a target page of 100,000 model names, then six
mirrored bodies of 200,000 keys, against a sidecar on 127.0.0.1, timed from another process
(the scenario of ``tests/server/hostile_inputs.py``). Prints p50, p99 and the maximum per input.

    PYTHONPATH=. .venv/bin/python bench/bench_hostile.py [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from pathlib import Path

from tests.server.hostile_inputs import quantile, run


async def main(runs: int) -> None:
    """Run the scenario ``runs`` times and print one line per input and run."""
    for i in range(runs):
        with tempfile.TemporaryDirectory() as d:
            timed = await run(Path(d))
        for name, times in (("page", timed.page_latencies), ("bodies", timed.body_latencies)):
            print(
                f"run {i + 1} {name}: n={len(times)} p50={quantile(times, 0.5) * 1000:.1f} ms "
                f"p99={quantile(times, 0.99) * 1000:.1f} ms max={max(times) * 1000:.1f} ms"
            )
        print(f"run {i + 1} mirror statuses: {timed.mirror_statuses}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    asyncio.run(main(parser.parse_args().runs))
