"""The replayer's token count by an arm's ``POST /tokenize`` when a streamed reply carried no
usage, over real HTTP: arms (``tests.fakes.arm``) that stream without usage and answer
``/tokenize`` each way, the mirror listener taking the requests in, and the ledger on disk.

A bad answer (nested too deep to parse, a count no reply of ``max_tokens`` tokens can have) is
counted as ``invalid_body`` for that arm, the pair is still written with that arm's tokens
unknown, and the next pairs replay and are counted (the worker lives); an answer that arrives in
pieces is read to its end and counted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import aiohttp

from specwatch.shadow.component import ShadowComponent
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.shadow.settings import LedgerSettings, PairedSettings, ShadowSettings
from tests.e2e.shadow_harness import read_rows, until
from tests.fakes.arm import FakeArm, serve_arm

#: What each arm streams: four words, in two chunks, without usage.
TEXT = "one two three four"
MAX_TOKENS = 8


def _arm(**kw: object) -> FakeArm:
    return FakeArm(text=TEXT, mode="stream", usage=False, **kw)  # type: ignore[arg-type]


@asynccontextmanager
async def _running(
    tmp_path: Path, std: FakeArm, fly: FakeArm
) -> AsyncIterator[tuple[ShadowComponent, aiohttp.ClientSession, str]]:
    async with AsyncExitStack() as stack:
        su = await stack.enter_async_context(serve_arm(std))
        fu = await stack.enter_async_context(serve_arm(fly))
        shadow = ShadowSettings.model_validate(
            {
                "enabled": True,
                "modes": ["mirror"],
                "sample_probability": 1.0,
                "max_shadow_rps": 1000.0,
                "max_in_flight": 1,  # one worker: if it died, nothing more would replay
                "pause_on_waiting": False,
                "mirror_listen_host": "127.0.0.1",
                "mirror_listen_port": 0,
                "stream_arms": ["standard", "fly"],
                "standard": {"url": su},
                "fly": {"url": fu},
            }
        )
        comp = ShadowComponent(
            shadow,
            PairedSettings(windows=("1h",), refresh_seconds=3600.0),
            LedgerSettings(path=str(tmp_path / "ledger.sqlite")),
        )
        await stack.enter_async_context(comp.running())
        client = await stack.enter_async_context(aiohttp.ClientSession())
        await until(lambda: comp.pipeline is not None and comp._started)
        yield comp, client, f"http://127.0.0.1:{comp.mirror_port}/v1/completions"


def _pairs(comp: ShadowComponent) -> int:
    return sum(comp.statistics.counters.by_status().values())


async def _send(comp: ShadowComponent, client: aiohttp.ClientSession, url: str, i: int) -> None:
    """Mirror one request and wait until its pair is counted (20 s at most)."""
    before = _pairs(comp)
    body = {"prompt": f"question {i}", "max_tokens": MAX_TOKENS, "temperature": 0}
    async with client.post(url, json=body) as r:
        assert r.status == 202, await r.text()
    await until(lambda: _pairs(comp) == before + 1, limit=20)


def _failures(comp: ShadowComponent) -> dict[tuple[str, str], int]:
    pipe = comp.pipeline
    assert pipe is not None
    return {k: v for k, v in pipe.metrics().token_count_failures.items() if v}


async def _rows(comp: ShadowComponent, tmp_path: Path) -> list[LedgerRow]:
    await comp.refresh(flush=True)
    rows = await read_rows(tmp_path / "ledger.sqlite")
    return sorted(rows, key=lambda r: r.time)


async def test_a_deeply_nested_answer_is_invalid_and_the_worker_goes_on(tmp_path: Path) -> None:
    """FLy's /tokenize answers 200,000 ``[`` then as many ``]`` (json.loads raises
    RecursionError): counted as (fly, invalid_body), the pair written with FLy's tokens
    unknown; the one worker then replays two more pairs, counted right once the answer is
    good again."""
    deep = [b"[" * 200_000 + b"]" * 200_000]
    std, fly = _arm(), _arm(tokenize=deep)
    async with _running(tmp_path, std, fly) as (comp, client, url):
        await _send(comp, client, url, 0)
        assert _failures(comp) == {("fly", "invalid_body"): 1}
        fly.tokenize = None
        await _send(comp, client, url, 1)
        await _send(comp, client, url, 2)
        assert _failures(comp) == {("fly", "invalid_body"): 1}
        rows = await _rows(comp, tmp_path)
    assert [(r.standard_tokens, r.fly_tokens) for r in rows] == [(4, None), (4, 4), (4, 4)]
    assert len(fly.tokenized) == 3


async def test_a_count_no_reply_can_have_is_invalid_and_the_ledger_goes_on(
    tmp_path: Path,
) -> None:
    """FLy's /tokenize answers ``count`` 10**20 (beyond SQLite's INTEGER), then 17 (over twice
    the ``max_tokens`` of 8 the arm was sent: re-encoding may read up to twice), then 4.0 (not
    an integer): each is (fly, invalid_body), never reaches the ledger; each pair is written
    with FLy's tokens unknown, and a last good answer is counted and written."""
    std, fly = _arm(), _arm()
    async with _running(tmp_path, std, fly) as (comp, client, url):
        for i, bad in enumerate((b'{"count": 100000000000000000000}', b'{"count": 17}')):
            fly.tokenize = [bad]
            await _send(comp, client, url, i)
        fly.tokenize = [b'{"count": 4.0}']
        await _send(comp, client, url, 2)
        fly.tokenize = [b'{"count": 16}']  # at the bound: twice max_tokens
        await _send(comp, client, url, 3)
        assert _failures(comp) == {("fly", "invalid_body"): 3}
        rows = await _rows(comp, tmp_path)
        assert comp.ledger is not None
        ledger = comp.ledger.state
    assert [(r.standard_tokens, r.fly_tokens) for r in rows] == [
        (4, None),
        (4, None),
        (4, None),
        (4, 16),
    ]
    assert ledger == "ok"


async def test_an_answer_in_pieces_is_read_to_its_end(tmp_path: Path) -> None:
    """FLy's /tokenize answer comes in two writes 0.3 s apart, then as one 200 KB body (its
    token ids listed): both are read whole and counted (4), no failure."""
    std = _arm()
    fly = _arm(tokenize=[b'{"count": 4, "tokens": [', b"1, 2, 3, 4]}"], tokenize_delay=0.3)
    ids = ", ".join(["1"] * 50_000)
    async with _running(tmp_path, std, fly) as (comp, client, url):
        await _send(comp, client, url, 0)
        fly.tokenize = [f'{{"count": 4, "tokens": [{ids}]}}'.encode()]
        assert len(fly.tokenize[0]) > 140_000
        await _send(comp, client, url, 1)
        assert _failures(comp) == {}
        rows = await _rows(comp, tmp_path)
    assert [(r.standard_tokens, r.fly_tokens) for r in rows] == [(4, 4), (4, 4)]
