"""Shadow runs against the real vLLM CPU servers: deterministic prompts, request bodies, and one
helper that mirrors traffic through specwatch's :class:`ShadowPipeline` (on 127.0.0.1, port 0)
into a SQLite :class:`Ledger` and summarises the ledger's tallies."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from specwatch.core.config import OVERALL
from specwatch.core.wire import CATEGORY_HEADER
from specwatch.shadow.compare import PairOutcome, compare
from specwatch.shadow.ledger.ledger import Ledger
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.shadow.pipeline import ShadowPipeline
from specwatch.shadow.published import PairedSummary, ShadowStats
from specwatch.shadow.settings import ShadowSettings
from specwatch.shadow.summary import build_shadow_stats
from specwatch.shadow.values import ReplayPair
from tests.fakes import PairSinkFn

WORDS = [
    "river",
    "stone",
    "engine",
    "quiet",
    "market",
    "lantern",
    "orbit",
    "signal",
    "harbor",
    "meadow",
    "cipher",
    "velvet",
    "anchor",
    "summit",
    "thread",
    "copper",
    "winter",
    "garden",
    "pulse",
    "mirror",
]


def prompts(n: int, offset: int) -> list[str]:
    """``n`` distinct pseudo-English prompts (deterministic)."""
    out = []
    for i in range(offset, offset + n):
        words = [WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(5 + i % 4)]
        out.append(f"Request {i}: " + " ".join(words))
    return out


def completion_body(
    prompt: str, temperature: float, seed: int, *, max_tokens: int
) -> dict[str, Any]:
    """A ``/v1/completions`` body as a client would send it (a fixed length, a seed)."""
    return {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": temperature,
        "seed": seed,
    }


@dataclass(frozen=True)
class MirrorRun:
    """What one shadow run produced; ``stats`` has the one window named by ``window``."""

    outcomes: list[PairOutcome]
    rows: list[LedgerRow]
    stats: ShadowStats
    window: str
    offered: int
    replays: dict[str, int]
    seconds: float

    def summary(self, category: str = OVERALL) -> PairedSummary:
        """The paired summary of ``category`` (default: every category summed)."""
        return self.stats.windows[self.window][category]


async def mirror_run(
    traffic: list[tuple[str, dict[str, Any]]],
    ledger_path: Path,
    *,
    in_flight: int,
    max_tokens: int,
    timeout_s: float,
    window: str,
    **arms: Any,
) -> MirrorRun:
    """Mirror ``traffic`` (``(category, body)``, the category sent in the mirror's category
    header) into a pipeline replaying to ``arms`` (:class:`ShadowSettings` fields: ``standard``,
    ``fly``, ``noise``, ``noise_kind``, ``baseline``), every request sampled, ``in_flight``
    replays at once and replies capped at ``max_tokens``; wait up to ``timeout_s`` for every
    pair, each compared and written to the ledger; the statistics come from the ledger's
    tallies, under the window name ``window``."""
    settings = ShadowSettings(
        enabled=True,
        modes=("mirror",),
        sample_probability=1.0,
        queue_size=len(traffic) + 1,
        max_shadow_rps=1000.0,
        max_in_flight=in_flight,
        max_queue_age_seconds=timeout_s,
        max_tokens_cap=max_tokens,
        mirror_listen_host="127.0.0.1",
        mirror_listen_port=0,
        **arms,
    )
    outcomes: list[PairOutcome] = []
    all_done = asyncio.Event()
    t0 = time.monotonic()
    async with Ledger(ledger_path) as ledger, aiohttp.ClientSession() as session:

        async def sink(pair: ReplayPair) -> None:
            outcome = compare(pair)
            assert ledger.submit(outcome)
            outcomes.append(outcome)
            if len(outcomes) == len(traffic):
                all_done.set()

        pipeline = ShadowPipeline.from_settings(settings, session=session, sink=PairSinkFn(sink))
        app = web.Application()
        pipeline.mount(app)
        runner = web.AppRunner(app)
        await runner.setup()
        try:
            for category, payload in traffic:
                async with session.post(
                    f"http://127.0.0.1:{pipeline.mirror_port}/v1/completions",
                    json=payload,
                    headers={CATEGORY_HEADER: category},
                ) as resp:
                    assert resp.status == 202
                    assert await resp.json() == {"shadow": "admitted"}
            await asyncio.wait_for(all_done.wait(), timeout_s)
            offered = pipeline.sampler.offered
            replays = {"paired": 0, "unpaired": 0, "excluded": 0}
            for o in outcomes:
                replays[o.status] += 1
        finally:
            await runner.cleanup()  # stops the pipeline's workers
        await ledger.flush()
        rows = await ledger.query()
        tallies = await ledger.tally()
    stats = build_shadow_stats({window: tallies}, now=time.time())
    return MirrorRun(outcomes, rows, stats, window, offered, replays, time.monotonic() - t0)
