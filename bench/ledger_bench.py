"""Ledger write throughput (goal >= 2,000 pairs/s) and event-loop lag while writing.

Submits ``--pairs`` compared outcomes through ``Ledger.submit`` and waits for ``flush``;
reports pairs/s end to end (row flattening, queue, batched SQLite commits in a worker thread)
and the worst event-loop lag seen by a 1 ms ticker task during the write (shows the writes do
not block the loop). Repeats for ``synchronous=NORMAL`` (default) and ``FULL``.

Run: ``PYTHONPATH=. python bench/ledger_bench.py --pairs 50000``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import tempfile
import time
from pathlib import Path

from specwatch.shadow.compare import compare
from specwatch.shadow.ledger.ledger import Ledger
from specwatch.shadow.values import Arm, ArmResult, PairOutcome, ReplayPair, ShadowRequest, Source


def _outcomes(n: int) -> list[PairOutcome]:
    out = []
    for i in range(n):
        req = ShadowRequest(
            "/v1/chat/completions",
            {},
            f"{i:064x}",
            1_000_000.0 + i,
            Source.PROXY,
            f"cat{i % 8}",
            None,
            "42" if i % 2 else None,
            None,
        )
        text = f"The answer is {i % 50}."
        out.append(
            compare(
                ReplayPair(
                    req,
                    ArmResult(
                        Arm.STANDARD,
                        True,
                        0.8,
                        text=text,
                        completion_tokens=120,
                        mean_acceptance_length=2.4,
                        token_ids=(1, 2, 3),
                    ),
                    ArmResult(
                        Arm.FLY,
                        True,
                        0.6,
                        text=text if i % 9 else "The answer is 7.",
                        completion_tokens=121,
                        mean_acceptance_length=3.1,
                        token_ids=(1, 2, 4),
                    ),
                    ArmResult(Arm.NOISE, True, 0.7, text=text) if i % 4 == 0 else None,
                )
            )
        )
    return out


async def _run(
    path: Path, outcomes: list[PairOutcome], synchronous: str, rate: float | None = None
) -> tuple[float, float, float]:
    lags: list[float] = []
    stop = False

    async def ticker() -> None:
        while not stop:
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - t - 0.001)

    async with Ledger(path, synchronous=synchronous) as ledger:
        tick = asyncio.create_task(ticker())
        t0 = time.perf_counter()
        if rate is None:
            for i, o in enumerate(outcomes):
                ledger.submit(o)
                if i % 500 == 0:
                    await asyncio.sleep(0)  # a producer that yields, like the replay loop
        else:  # paced: rate/100 pairs every 10 ms
            step = max(1, int(rate / 100))
            for i in range(0, len(outcomes), step):
                for o in outcomes[i : i + step]:
                    ledger.submit(o)
                await asyncio.sleep(max(0.0, t0 + (i + step) / rate - time.perf_counter()))
        await ledger.flush()
        elapsed = time.perf_counter() - t0
        stop = True
        await tick
        assert await ledger.row_count() == len(outcomes)
        assert not ledger.health.write_errors
    lags.sort()
    return len(outcomes) / elapsed, lags[int(0.99 * (len(lags) - 1))], lags[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--pairs", type=int, default=50_000)
    ap.add_argument(
        "--paced-rate",
        type=float,
        default=2000.0,
        help="also run paced at this many pairs/s and report loop lag",
    )
    args = ap.parse_args()
    outcomes = _outcomes(args.pairs)
    gc.collect()
    gc.freeze()  # the pre-built fixtures are not the ledger's garbage-collection cost
    for sync in ("NORMAL", "FULL"):
        with tempfile.TemporaryDirectory() as d:
            rate, p99, worst = asyncio.run(_run(Path(d) / "ledger.db", outcomes, sync))
        print(
            f"synchronous={sync}: {args.pairs} pairs, {rate:,.0f} pairs/s, "
            f"event-loop lag p99 {1000 * p99:.1f} ms, max {1000 * worst:.1f} ms"
        )
    paced = outcomes[: int(args.paced_rate * 10)]
    with tempfile.TemporaryDirectory() as d:
        rate, p99, worst = asyncio.run(_run(Path(d) / "l.db", paced, "NORMAL", args.paced_rate))
    print(
        f"paced at {args.paced_rate:,.0f} pairs/s for 10 s (NORMAL): event-loop lag "
        f"p99 {1000 * p99:.1f} ms, max {1000 * worst:.1f} ms"
    )


if __name__ == "__main__":
    main()
