"""``run_demo`` in this event loop: the terminal view redraws in place on a TTY, a taken default
port falls back to a free one, a taken explicit port is exit 2, and stopping leaves no task."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Iterator

import aiohttp
import pytest

from specwatch.__main__ import main as cli_main
from specwatch.demo import run as demo_mod
from specwatch.demo.run import DemoConfig, run_demo
from tests.demo.streams import WatchedOutput


async def _healthz(port: int) -> int:
    async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/healthz") as r:
        return r.status


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port some other socket is listening on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


async def test_tty_view_redraws_and_default_port_falls_back(
    taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a TTY the view redraws; a taken default port falls back to a free one; stop leaves no
    task."""
    monkeypatch.setattr(demo_mod, "DEFAULT_PORT", taken_port)
    out = WatchedOutput()
    stop = asyncio.Event()
    cfg = DemoConfig(port=None, refresh_s=0.2, rate=20.0, concurrency=8)
    task = asyncio.create_task(run_demo(cfg, out=out, tty=True, stop=stop))
    async with asyncio.timeout(30):
        text = await out.until(lambda t: t.count("\x1b[H\x1b[2J") >= 2 and "fly       fly" in t)
    m = re.search(r"sidecar on http://127\.0\.0\.1:(\d+)", text)
    assert m is not None
    port = int(m.group(1))
    assert port != taken_port
    assert await _healthz(port) == 200
    assert "\x1b[1mspecwatch demo" in text  # bold header on a TTY
    stop.set()
    async with asyncio.timeout(30):
        assert await task == 0
    assert out.getvalue().rstrip().splitlines()[-1].startswith("specwatch demo: stopped;")
    leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert leftover == []
    # nothing listens any more on the sidecar's port
    with pytest.raises(aiohttp.ClientConnectionError):
        await _healthz(port)


def test_taken_explicit_port_is_exit_2_with_one_line(
    taken_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """A taken --port exits 2 with one line naming the address."""
    assert cli_main(["demo", "--port", str(taken_port), "--no-ui"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"specwatch demo: cannot listen on 127.0.0.1:{taken_port}:")
    assert len(err.splitlines()) == 1
