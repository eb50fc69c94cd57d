"""Streamed replies that carry no ``usage``: completion tokens are counted by the arm's own
``POST /tokenize`` over the generated text, never by SSE chunks; a failed count leaves the
pair's decode speed unknown and is counted with its reason.

Both arms are simulators (real time, so a reply's steps arrive in separate reads) with the
``stream_usage_ignored`` fault: they ignore ``stream_options.include_usage``, as a server may.
The simulator's tokenizer gives one token per whitespace-separated word (plus BOS, which
``add_special_tokens: false`` leaves out), so the count of a text is ``len(text.split())``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.simulate.config import Role, SimConfig
from specwatch.simulate.launcher import SimulatorHandle, start_simulator
from tests.e2e.shadow_harness import Sidecar, read_rows, settings_for, sidecar, until

BODY = {"prompt": "count the words", "max_tokens": 24, "temperature": 0}


@asynccontextmanager
async def _arms(**faults: dict[str, Any]) -> AsyncIterator[dict[str, SimulatorHandle]]:
    """Standard and FLy simulators in real time; ``faults[name]`` patched into that one."""
    sims = {
        "standard": await start_simulator(SimConfig(role=Role.STANDARD, time_scale=1.0)),
        "fly": await start_simulator(SimConfig(role=Role.FLY, time_scale=1.0)),
    }
    try:
        async with aiohttp.ClientSession() as client:
            for name, sim in sims.items():
                patch = {"stream_usage_ignored": True} | faults.get(name, {})
                async with client.post(sim.url + "/admin/faults", json=patch) as r:
                    assert r.status == 200, await r.text()
        yield sims
    finally:
        for s in sims.values():
            await s.stop()


async def _one_pair(sc: Sidecar) -> None:
    async with sc.client.post(sc.mirror_url + "/v1/completions", json=BODY) as r:
        assert r.status == 202, await r.text()
    await until(lambda: sum(sc.component.statistics.counters.by_status().values()) >= 1, limit=20)


def _decode_tps(tokens: int, first: float | None, last: float | None) -> float:
    assert first is not None
    assert last is not None
    assert last > first
    return (tokens - 1) / (last - first)


async def test_reply_without_usage_is_counted_by_the_arms_tokenizer(tmp_path: Path) -> None:
    """Neither arm sends usage; each reply's tokens are its words (the simulator's tokenizer),
    and the decode speed per arm is (words − 1) ÷ (last − first output time)."""
    ledger = tmp_path / "ledger.sqlite"
    async with _arms() as sims:
        settings = settings_for(
            sims, ledger, modes=["mirror"], stream_arms=["standard", "fly"], store_text=True
        )
        async with sidecar(settings) as sc:
            await _one_pair(sc)
            stats = await sc.component.refresh(flush=True)
            pipe = sc.component.pipeline
            assert pipe is not None
            assert dict(pipe.replayer.token_count_failures) == {}
    (row,) = await read_rows(ledger)
    assert (row.status, row.reason) == ("paired", None)
    words = _words(row)
    assert words[0] >= 2
    assert words[1] >= 2
    assert (row.standard_tokens, row.fly_tokens) == words
    decision = {r.category: r for r in stats.decisions}["default"]
    assert decision.decode_pairs == 1
    s_tps = _decode_tps(words[0], row.standard_first_token_seconds, row.standard_last_token_seconds)
    f_tps = _decode_tps(words[1], row.fly_first_token_seconds, row.fly_last_token_seconds)
    assert decision.standard_decode_tokens_per_second == pytest.approx(s_tps, rel=1e-6)
    assert decision.fly_decode_tokens_per_second == pytest.approx(f_tps, rel=1e-6)


def _words(row: LedgerRow) -> tuple[int, int]:
    assert row.standard_text is not None
    assert row.fly_text is not None
    return len(row.standard_text.split()), len(row.fly_text.split())


async def test_a_failed_count_leaves_the_decode_speed_unknown(tmp_path: Path) -> None:
    """FLy's /tokenize answers 500: FLy's tokens stay unknown, the pair has no decode speed
    (not a chunk count), and the failure is counted by arm and reason on /metrics."""
    ledger = tmp_path / "ledger.sqlite"
    async with _arms(fly={"tokenize_error": True}) as sims:
        settings = settings_for(
            sims, ledger, modes=["mirror"], stream_arms=["standard", "fly"], store_text=True
        )
        async with sidecar(settings) as sc:
            await _one_pair(sc)
            stats = await sc.component.refresh(flush=True)
            metrics = await sc.metrics()
    (row,) = await read_rows(ledger)
    assert row.status == "paired"
    assert row.standard_tokens == _words(row)[0]
    assert row.fly_tokens is None
    decision = {r.category: r for r in stats.decisions}["default"]
    assert decision.decode_pairs == 0
    assert decision.standard_decode_tokens_per_second is None
    assert decision.fly_decode_tokens_per_second is None
    key = ("specwatch_shadow_token_count_failures_total",
           frozenset({("arm", "fly"), ("reason", "http_500")}))  # fmt: skip
    assert metrics[key] == 1.0
