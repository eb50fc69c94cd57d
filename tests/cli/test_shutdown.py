"""SIGTERM with connections open: ``specwatch run`` and ``specwatch simulate`` stop accepting and
exit within their shutdown timeout (10 s by default, below Kubernetes' 30 s grace period;
aiohttp's own default waits 60 s for open requests).

Each process gets idle keep-alive connections, a half-sent request head and a request stuck
mid-body (``run``) or a long streaming completion (``simulate``) before the signal.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
from pathlib import Path

import aiohttp

from tests.sidecar_process import free_port, run_config, specwatch_process

#: Open requests are held longer than any grace period here.
HOLD = {"header_timeout_seconds": 120.0, "body_timeout_seconds": 120.0}


async def _open_connections(port: int) -> list[asyncio.StreamWriter]:
    """Three idle connections, one half-sent request head, one body stuck after 10 of 1,000
    announced bytes."""
    writers = []
    for data in (
        b"",
        b"",
        b"",
        b"GET /metrics HTTP/1.1\r\nHost: x\r\n",
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n" + b'{"prompt":',
    ):
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(data)
        await writer.drain()
        writers.append(writer)
    return writers


async def test_run_exits_within_the_default_grace_with_open_connections(tmp_path: Path) -> None:
    """``specwatch run`` (shadow on, mirror) with 5 open connections and 4 replays done:
    SIGTERM → exit code 0 within the 10 s default grace (under 30 s: slack for a loaded machine,
    far below the 120 s the connections are held), and the 4 replayed pairs are in the ledger."""
    port, mirror = free_port(), free_port()
    cfg = run_config(
        tmp_path,
        port,
        server=HOLD,
        shadow={
            "mirror_listen_host": "127.0.0.1",
            "mirror_listen_port": mirror,
            "enabled": True,
            "sample_probability": 1.0,
            "standard": {"url": "http://127.0.0.1:7"},  # not a target: never load-paused
            "fly": {"url": "http://127.0.0.1:7"},
        },
    )
    async with specwatch_process(tmp_path, ["run", "--config", str(cfg)], port=port) as p:
        async with aiohttp.ClientSession() as s:
            for i in range(4):
                body = {"model": "m", "prompt": f"p{i}", "max_tokens": 1}
                async with s.post(f"http://127.0.0.1:{mirror}/v1/completions", json=body) as r:
                    assert (r.status, await r.json()) == (202, {"shadow": "admitted"})
        writers = await _open_connections(port)
        await asyncio.sleep(1.0)  # let the four replays fail against the closed arms
        code, seconds = await p.stop(signal.SIGTERM)
        for w in writers:
            w.close()
    assert code == 0, p.log_text()[-2000:]
    assert seconds < 30.0, seconds
    assert '"event":"stopped"' in p.log_text()
    with sqlite3.connect(tmp_path / "ledger.sqlite") as db:
        (rows,) = db.execute("SELECT COUNT(*) FROM pairs").fetchone()
    assert rows == 4, p.log_text()[-3000:]


async def test_run_honours_a_shorter_configured_grace(tmp_path: Path) -> None:
    """``server.shutdown_timeout_seconds: 1``: the same open connections, exit in under 8 s (the
    1 s grace and up to 7 s for a loaded machine, still below the 10 s default grace)."""
    port = free_port()
    cfg = run_config(tmp_path, port, server={**HOLD, "shutdown_timeout_seconds": 1.0})
    async with specwatch_process(tmp_path, ["run", "--config", str(cfg)], port=port) as p:
        writers = await _open_connections(port)
        code, seconds = await p.stop(signal.SIGTERM)
        for w in writers:
            w.close()
    assert code == 0
    assert seconds < 8.0, seconds


async def test_simulate_exits_within_the_default_grace_with_a_stream_open(tmp_path: Path) -> None:
    """``specwatch simulate`` slowed 20x with a 4,000-token stream running and idle
    connections open: SIGTERM → exit code 0 in under 30 s (the 10 s default grace, with slack
    for a loaded machine; the stream would run for minutes: it is cut)."""
    port = free_port()
    args = ["simulate", "--host", "127.0.0.1", "--port", str(port), "--time-scale", "20"]
    async with specwatch_process(tmp_path, args, port=port, ready_path="/health") as p:
        body = {
            "model": "sim-model",
            "prompt": "x",
            "max_tokens": 4000,
            "ignore_eos": True,
            "stream": True,
        }
        got_first = asyncio.Event()

        async def stream() -> None:
            async with (
                aiohttp.ClientSession() as s,
                s.post(p.url + "/v1/completions", json=body) as r,
            ):
                async for _ in r.content:
                    got_first.set()

        task = asyncio.create_task(stream())
        await asyncio.wait_for(got_first.wait(), timeout=60)
        writers = await _open_connections(port)
        code, seconds = await p.stop(signal.SIGTERM)
        for w in writers:
            w.close()
        done, _ = await asyncio.wait({task}, timeout=30)
        assert done
    assert code == 0, p.log_text()[-2000:]
    assert seconds < 30.0, seconds


async def test_run_warns_once_when_the_budget_does_not_fit_the_pod(tmp_path: Path) -> None:
    """``pod.termination_grace_period_seconds: 30`` with a 30 s budget (31 s needed with the
    1 s margin): one WARNING line ``shutdown budget does not fit the pod`` naming the setting
    and 29 s; nothing of it on stderr's plain warnings; SIGTERM still exits 0 with nothing open
    (under 15 s, half the 30 s budget, with slack for a loaded machine)."""
    port = free_port()
    cfg = run_config(
        tmp_path,
        port,
        server={"shutdown_timeout_seconds": 30.0},
        pod={"termination_grace_period_seconds": 30, "container": "container"},
    )
    async with specwatch_process(tmp_path, ["run", "--config", str(cfg)], port=port) as p:
        code, seconds = await p.stop(signal.SIGTERM)
    lines = [
        json.loads(line)
        for line in p.log_text().splitlines()
        if '"event":"shutdown budget does not fit the pod"' in line
    ]
    assert code == 0
    assert seconds < 15.0, seconds
    [line] = lines
    assert (line["level"], line["setting"]) == ("warning", "server.shutdown_timeout_seconds")
    assert "lower it to 29 s" in line["message"]
    assert "terminationGracePeriodSeconds" not in p.log_text().replace(line["message"], "")
