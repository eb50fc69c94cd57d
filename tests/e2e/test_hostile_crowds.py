"""Hostile crowds against ``specwatch run`` as an operator runs it (shadow on, ``modes: [mirror,
proxy]`` in front of a real ``specwatch simulate``): what the logs say under a burst of aborted
uploads, and whether live requests through the proxy are answered while slow clients from
several loopback addresses hold connections."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tests.fakes.wait import until_listening
from tests.sidecar_process import Process, free_port, run_config, specwatch_process


@contextlib.asynccontextmanager
async def _sidecar(tmp_path: Path, **server: Any) -> AsyncIterator[tuple[Process, int, int]]:
    """A simulator and ``specwatch run`` proxying to it and mirroring: (specwatch, proxy port,
    mirror port). The shadow arms are a closed port (replays fail fast)."""
    sim_dir, run_dir = tmp_path / "sim", tmp_path / "run"
    sim_dir.mkdir()
    run_dir.mkdir()
    sim_port, port, proxy_port, mirror_port = free_port(), free_port(), free_port(), free_port()
    sim_cmd = ["simulate", "--host", "127.0.0.1", "--port", str(sim_port)]
    async with specwatch_process(sim_dir, sim_cmd, port=sim_port, ready_path="/health") as sim:
        cfg = run_config(
            run_dir,
            port,
            server=server,
            shadow={
                "enabled": True,
                "modes": ["mirror", "proxy"],
                "proxy_upstream": sim.url,
                "proxy_listen_host": "127.0.0.1",
                "proxy_listen_port": proxy_port,
                "mirror_listen_host": "127.0.0.1",
                "mirror_listen_port": mirror_port,
                "sample_probability": 1.0,
                "standard": {"url": "http://127.0.0.1:7"},
                "fly": {"url": "http://127.0.0.1:7"},
            },
        )
        async with specwatch_process(run_dir, ["run", "--config", str(cfg)], port=port) as run:
            await until_listening(proxy_port)
            await until_listening(mirror_port)
            yield run, proxy_port, mirror_port


async def _aborted_upload(port: int) -> None:
    """A completion request announcing 1,000 bytes, 10 sent, then the connection closed."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000\r\n\r\n" + b'{"prompt":'
    )
    await writer.drain()
    await asyncio.sleep(0.05)
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()


async def test_a_burst_of_aborted_uploads_writes_a_few_lines_per_reason(tmp_path: Path) -> None:
    """1,000 aborted uploads to each of the mirror and the proxy (in waves of 100) write at
    most 10 WARNING/ERROR lines of each kind (event, reason and source) in the minute the
    burst takes, the mirror's ``incomplete_body`` among them; before, every aborted upload
    wrote one line (1,010 lines of one kind)."""
    async with _sidecar(tmp_path) as (run, proxy_port, mirror_port):
        before = len(run.log_text().splitlines())
        for port in (mirror_port, proxy_port):
            for _ in range(10):
                await asyncio.gather(*(_aborted_upload(port) for _ in range(100)))
        await asyncio.sleep(1.0)  # the last handlers see their clients gone
        lines = run.log_text().splitlines()[before:]
    kinds: Counter[tuple[str, str, str]] = Counter()
    for line in lines:
        doc = json.loads(line)
        if doc["level"] in ("warning", "error"):
            kinds[(doc["event"], str(doc.get("reason", "")), str(doc.get("source", "")))] += 1
    assert kinds, "\n".join(lines[-20:])
    assert kinds[("shadow ingest rejected", "incomplete_body", "mirror")] >= 1
    assert max(kinds.values()) <= 10, kinds
