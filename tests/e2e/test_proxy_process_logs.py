"""``specwatch run --log-format json`` with the shadow proxy in its own process: every line the
sidecar writes (the main process and the proxy process) is a JSON object, and a normal stop
(SIGTERM) writes no ERROR line. Driven as an operator runs it: a real ``specwatch simulate``
upstream, a request through the proxy on 127.0.0.1, then SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import aiohttp

from tests.sidecar_process import free_port, run_config, specwatch_process


async def _until_listening(port: int) -> None:
    """Wait until something accepts TCP connections on 127.0.0.1:``port``."""
    for _ in range(600):
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        writer.close()
        return
    raise AssertionError(f"nothing listens on {port}")


async def test_proxy_process_writes_json_lines_only_and_no_error_on_a_normal_stop(
    tmp_path: Path,
) -> None:
    """One completion through the proxy process (200, 4 tokens), a refused replay arm (its
    failure logged) and SIGTERM: exit 0; every non-empty line of the combined stdout/stderr
    parses as a JSON object with a ``level`` field (the configuration warnings printed before
    the server starts included), the proxy process's own line about a body cut short among them,
    none is ``error``."""
    sim_dir, run_dir = tmp_path / "sim", tmp_path / "run"
    sim_dir.mkdir()
    run_dir.mkdir()
    sim_port, port, proxy_port = free_port(), free_port(), free_port()
    sim_cmd = ["simulate", "--host", "127.0.0.1", "--port", str(sim_port)]
    async with specwatch_process(sim_dir, sim_cmd, port=sim_port, ready_path="/health") as sim:
        cfg = run_config(
            run_dir,
            port,
            shadow={
                "enabled": True,
                "modes": ["proxy"],
                "proxy_own_process": True,
                "proxy_upstream": sim.url,
                "proxy_listen_host": "127.0.0.1",
                "proxy_listen_port": proxy_port,
                "sample_probability": 1.0,
                "standard": {"url": "http://127.0.0.1:7"},
                "fly": {"url": "http://127.0.0.1:7"},
            },
        )
        args = ["run", "--config", str(cfg), "--log-format", "json"]
        async with specwatch_process(run_dir, args, port=port) as run:
            await _until_listening(proxy_port)
            body = {"model": "sim-model", "prompt": "What is 11 + 7?", "max_tokens": 4}
            async with (
                aiohttp.ClientSession() as s,
                s.post(f"http://127.0.0.1:{proxy_port}/v1/completions", json=body) as r,
            ):
                assert r.status == 200
                assert (await r.json())["usage"]["completion_tokens"] == 4
            # a body cut short: the proxy process logs it (a WARNING line of its own)
            _, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
            writer.write(
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"model"'
            )
            await writer.drain()
            writer.close()
            await asyncio.sleep(1.5)  # the copy reaches the main process, its replay fails
            code, _ = await run.stop(signal.SIGTERM)
            text = run.log_text()
    assert code == 0, text[-3000:]
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines
    records = []
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}\n{text[-3000:]}") from None
        assert isinstance(rec, dict), line
        assert "level" in rec, line
        records.append(rec)
    assert [r for r in records if str(r["level"]).upper() == "ERROR"] == []
    events = {r.get("event") for r in records}
    assert "proxy client body incomplete" in events  # written by the proxy process
    assert "shadow arm failed" in events  # written by the main process
