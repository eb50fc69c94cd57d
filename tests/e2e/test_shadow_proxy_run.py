"""The shadow proxy as an operator runs it: ``specwatch run`` with ``shadow.modes: [proxy]`` in
front of a real ``specwatch simulate`` process, driven over HTTP on 127.0.0.1.

What the operator reads in ``/metrics`` (each proxied request counted once, its shadow copy
counted as received, the upstream's failures by reason from 0) and what SIGTERM does to a stream
open through the proxy (exit within the shutdown timeout, the client's answer cut, never
completed).
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.sidecar_process import Process, free_port, run_config, specwatch_process

#: The proxy's upstream failure reasons, written out by hand from docs/metrics.md.
REASONS = ("client_error", "connect", "disconnected", "timeout")


async def _samples(p: Process) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """specwatch's ``/metrics`` as {(sample name, sorted labels): value}."""
    async with aiohttp.ClientSession() as s, s.get(p.url + "/metrics") as r:
        text = await r.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _proxy_counts(m: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> dict[str, float]:
    """The proxy's counters from one scrape: requests, received copies, errors by reason."""
    out = {
        "requests": m.get(("specwatch_shadow_proxy_requests_total", ()), -1.0),
        "received": m.get(("specwatch_shadow_received_total", (("source", "proxy"),)), 0.0),
    }
    for reason in REASONS:
        key = ("specwatch_shadow_proxy_upstream_errors_total", (("reason", reason),))
        out[reason] = m.get(key, -1.0)  # -1: the series is missing
    return out


async def _until_counts(p: Process, want: dict[str, float]) -> None:
    """Scrape until the proxy's counters equal ``want`` (a copy is counted once its offer has
    run); fail with the last reading after 200 scrapes."""
    got: dict[str, float] = {}
    for _ in range(200):
        got = _proxy_counts(await _samples(p))
        if got == want:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"proxy counters {got}, want {want}\n{p.log_text()[-3000:]}")


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


@contextlib.asynccontextmanager
async def _proxy_in_front_of_simulator(
    tmp_path: Path, *sim_args: str
) -> AsyncIterator[tuple[Process, Process, str]]:
    """A simulator, and ``specwatch run`` proxying to it: (simulator, specwatch, proxy URL).
    The shadow arms are a closed port, so replays fail fast and never pause."""
    sim_dir, run_dir = tmp_path / "sim", tmp_path / "run"
    sim_dir.mkdir()
    run_dir.mkdir()
    sim_port, port, proxy_port = free_port(), free_port(), free_port()
    sim_cmd = ["simulate", "--host", "127.0.0.1", "--port", str(sim_port), *sim_args]
    async with specwatch_process(sim_dir, sim_cmd, port=sim_port, ready_path="/health") as sim:
        cfg = run_config(
            run_dir,
            port,
            shadow={
                "enabled": True,
                "modes": ["proxy"],
                "proxy_upstream": sim.url,
                "proxy_listen_host": "127.0.0.1",
                "proxy_listen_port": proxy_port,
                "sample_probability": 1.0,
                "standard": {"url": "http://127.0.0.1:7"},
                "fly": {"url": "http://127.0.0.1:7"},
            },
        )
        async with specwatch_process(run_dir, ["run", "--config", str(cfg)], port=port) as run:
            await _until_listening(proxy_port)
            yield sim, run, f"http://127.0.0.1:{proxy_port}"


async def test_proxy_counts_requests_and_upstream_failures_from_zero(tmp_path: Path) -> None:
    """Before any request the four upstream failure reasons are exported at 0; a JSON, an SSE
    and a chunked-upload completion give 3 proxied requests and 3 received copies; with the
    simulator stopped the next request is answered 502 ``upstream connect`` and counted as
    ``connect`` 1, the other reasons staying at 0."""
    async with _proxy_in_front_of_simulator(tmp_path) as (sim, run, proxy):
        zero = {"requests": 0.0, "received": 0.0} | dict.fromkeys(REASONS, 0.0)
        assert _proxy_counts(await _samples(run)) == zero
        body = {"model": "sim-model", "prompt": "What is 11 + 7?", "max_tokens": 8}

        async def chunks() -> AsyncIterator[bytes]:
            yield b'{"model": "sim-model", "prompt": '
            yield b'"chunked", "max_tokens": 8}'

        async with aiohttp.ClientSession() as s:
            async with s.post(proxy + "/v1/completions", json=body) as r:
                assert r.status == 200
                assert (await r.json())["usage"]["completion_tokens"] == 8
            async with s.post(proxy + "/v1/completions", json=body | {"stream": True}) as r:
                assert r.headers["Content-Type"].startswith("text/event-stream")
                assert (await r.read()).endswith(b"data: [DONE]\n\n")
            # a chunked upload names its JSON type, or vLLM (and the simulator) refuse it
            json_type = {"Content-Type": "application/json"}
            async with s.post(proxy + "/v1/completions", data=chunks(), headers=json_type) as r:
                assert r.status == 200
                assert (await r.json())["usage"]["completion_tokens"] == 8
        await _until_counts(run, zero | {"requests": 3.0, "received": 3.0})

        code, _ = await sim.stop(signal.SIGTERM)
        assert code == 0
        async with (
            aiohttp.ClientSession() as s,
            s.post(proxy + "/v1/completions", json=body) as r,
        ):
            assert r.status == 502
            assert await r.json() == {"error": {"message": "upstream connect"}}
        await _until_counts(run, zero | {"requests": 4.0, "received": 4.0, "connect": 1.0})


async def test_sigterm_with_a_proxied_stream_open_cuts_it_and_exits_in_time(
    tmp_path: Path,
) -> None:
    """A 4,000-token stream through the proxy from a simulator slowed 20x: SIGTERM to
    ``specwatch run`` exits 0 within ``server.shutdown_timeout_seconds`` (10 s) and the client's
    chunked answer ends without its last chunk (a payload error, never a complete answer)."""
    async with _proxy_in_front_of_simulator(tmp_path, "--time-scale", "20") as (_, run, proxy):
        body = {
            "model": "sim-model",
            "prompt": "x",
            "max_tokens": 4000,
            "ignore_eos": True,
            "stream": True,
        }
        got_first = asyncio.Event()
        received: list[bytes] = []

        async def stream() -> None:
            async with (
                aiohttp.ClientSession() as s,
                s.post(proxy + "/v1/completions", json=body) as r,
            ):
                async for line in r.content:
                    received.append(line)
                    got_first.set()

        task = asyncio.create_task(stream())
        await asyncio.wait_for(got_first.wait(), timeout=60)
        code, seconds = await run.stop(signal.SIGTERM)
        done, _ = await asyncio.wait({task}, timeout=30)
    assert code == 0, run.log_text()[-2000:]
    assert seconds < 10.0, (seconds, run.log_text()[-3000:])
    assert done
    with pytest.raises(aiohttp.ClientPayloadError):
        task.result()
    assert b"data: [DONE]\n" not in received
