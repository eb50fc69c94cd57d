"""SIGTERM drains: ``specwatch run`` in proxy mode in front of a slow streaming upstream, as a
real process on 127.0.0.1, with a shutdown budget of 10 s (the default).

A stream that lasts 8 s and its replay finish; a stream that lasts 30 s is cut when the budget
less its close reserve (1 s) runs out, its replay is counted as abandoned in one log line; the
process exits 0 within the budget (+0.3 s for the signal and the measurement), with the pair
that finished in the ledger, the alert state saved and no ERROR line.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from specwatch.core.wire import SHADOW_MARKER_HEADER
from tests.fakes.wait import until_listening
from tests.sidecar_process import free_port, run_config, specwatch_process

#: Seconds between two chunks of the slow upstream's stream.
TICK = 0.25
#: The shutdown budget (``server.shutdown_timeout_seconds``, its default) and what the process
#: keeps of it for closing (10 % of it, at most 1 s): streams are cut at BUDGET - RESERVE.
BUDGET, RESERVE = 10.0, 1.0
#: How late past the budget a loaded 2-core machine may see the cut and the exit (the lower
#: bounds, which show nothing is cut early, stay tight; the 30 s stream would end 29 s in).
LOAD_SLACK = 5.0


def _chunk(i: int) -> bytes:
    """The ``i``-th SSE event of a slow stream."""
    doc = {"choices": [{"index": 0, "text": f"t{i} ", "finish_reason": None}]}
    return f"data: {json.dumps(doc)}\n\n".encode()


def _stream_bytes(seconds: float) -> bytes:
    """Every byte of the slow upstream's stream of ``seconds`` seconds."""
    return b"".join(_chunk(i) for i in range(round(seconds / TICK))) + b"data: [DONE]\n\n"


async def _slow(request: web.Request) -> web.StreamResponse:
    """``prompt: "seconds=N"``: a live request streams one chunk every :data:`TICK` for N s; a
    shadow replay (marked) answers a whole completion after N s."""
    body = await request.json()
    seconds = float(str(body["prompt"]).split("=")[1])
    if SHADOW_MARKER_HEADER in request.headers:
        await asyncio.sleep(seconds)
        choice = {"index": 0, "text": "done", "finish_reason": "stop"}
        usage = {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3}
        return web.json_response({"choices": [choice], "usage": usage})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(round(seconds / TICK)):
        await asyncio.sleep(TICK)
        await resp.write(_chunk(i))
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


@asynccontextmanager
async def _slow_upstream() -> AsyncIterator[str]:
    """The slow upstream on 127.0.0.1 (this test's process); yields its base URL."""
    app = web.Application()
    app.router.add_post("/v1/completions", _slow)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server()
    try:
        yield f"http://127.0.0.1:{server.port}"
    finally:
        await server.close()


class Stream:
    """One client stream through the proxy: the bytes it got and when it ended (monotonic)."""

    def __init__(self) -> None:
        self.data = b""
        self.ended_at = 0.0
        self.cut = False
        self.first = asyncio.Event()

    async def run(self, url: str, seconds: float) -> None:
        """POST a streamed completion lasting ``seconds`` and read it to its end or its cut."""
        body = {"model": "m", "prompt": f"seconds={seconds:g}", "max_tokens": 8, "stream": True}
        try:
            async with aiohttp.ClientSession() as s, s.post(url, json=body) as r:
                async for piece in r.content.iter_any():
                    self.data += piece
                    self.first.set()
        except aiohttp.ClientPayloadError:
            self.cut = True
        self.ended_at = time.monotonic()


def _events(log: str, event: str) -> list[dict[str, Any]]:
    """The JSON log lines of ``event``."""
    out = []
    for line in log.splitlines():
        if line.startswith("{") and f'"event":"{event}"' in line:
            out.append(json.loads(line))
    return out


async def test_sigterm_lets_an_8s_stream_finish_cuts_a_longer_one_at_the_budget(
    tmp_path: Path,
) -> None:
    """An 8 s and a 30 s stream through the proxy, each replayed to arms as slow: SIGTERM 1 s
    in. ``/readyz`` answers 503 ``draining``; the 8 s stream ends byte-complete (before the
    drain it was cut at 40 % of the budget, 4 s); the 30 s one is cut no earlier than 8.5 s after
    the signal (and before 15 s: the budget plus LOAD_SLACK); one ``shadow replays drained`` line
    counts 1 replay completed and 1 abandoned in flight; exit 0 within the 10 s budget plus
    LOAD_SLACK; the finished pair is in the ledger, the alert state file is
    written and no line is an ERROR."""
    async with _slow_upstream() as upstream:
        port, proxy_port = free_port(), free_port()
        arm = {"url": upstream, "timeout_seconds": 60}
        cfg = run_config(
            tmp_path,
            port,
            shadow={
                "enabled": True,
                "modes": ["proxy"],
                "proxy_upstream": upstream,
                "proxy_listen_host": "127.0.0.1",
                "proxy_listen_port": proxy_port,
                "sample_probability": 1.0,
                "noise_kind": "off",
                "standard": arm,
                "fly": arm,
            },
        )
        async with specwatch_process(tmp_path, ["run", "--config", str(cfg)], port=port) as p:
            proxy = f"http://127.0.0.1:{proxy_port}/v1/completions"
            await until_listening(proxy_port)  # the proxy binds after the main listener
            short, long = Stream(), Stream()
            tasks = [
                asyncio.create_task(short.run(proxy, 8)),
                asyncio.create_task(long.run(proxy, 30)),
            ]
            await asyncio.wait_for(short.first.wait(), 30)
            await asyncio.wait_for(long.first.wait(), 30)
            await asyncio.sleep(1.0)  # both copies handed over, both replays under way
            sent = time.monotonic()
            p.proc.send_signal(signal.SIGTERM)
            ready: tuple[int, Any] = (0, None)
            async with aiohttp.ClientSession() as s:
                for _ in range(20):
                    async with s.get(p.url + "/readyz") as r:
                        ready = (r.status, await r.json())
                    if r.status == 503:
                        break
                    await asyncio.sleep(0.05)
            code = await asyncio.wait_for(p.proc.wait(), 30)
            exited = time.monotonic() - sent
            await asyncio.wait_for(asyncio.gather(*tasks), 30)
            log = p.log_text()
    assert ready == (503, {"ready": False, "draining": True}), ready
    assert code == 0, log[-3000:]
    assert exited <= BUDGET + LOAD_SLACK, (exited, log[-3000:])
    assert not short.cut
    assert short.data == _stream_bytes(8), len(short.data)
    cut_after = long.ended_at - sent
    print(
        f"8 s stream done {short.ended_at - sent:.2f} s, 30 s stream cut {cut_after:.2f} s, "
        f"exit {exited:.2f} s after SIGTERM"
    )
    assert long.cut
    assert long.data
    assert _stream_bytes(30).startswith(long.data)
    assert BUDGET - RESERVE - 0.5 <= cut_after <= BUDGET + LOAD_SLACK, cut_after
    [drained] = _events(log, "shadow replays drained")
    assert (drained["completed"], drained["abandoned_in_flight"]) == (1, 1), drained
    assert drained["level"] == "warning"
    assert '"level":"error"' not in log.replace(" ", ""), log[-3000:]
    with sqlite3.connect(tmp_path / "ledger.sqlite") as db:
        (rows,) = db.execute("SELECT COUNT(*) FROM pairs").fetchone()
    assert rows == 1, log[-3000:]
    assert (tmp_path / "ledger.sqlite-alerts.json").is_file()
