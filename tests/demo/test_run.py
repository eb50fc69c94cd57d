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
from specwatch.demo import config as demo_config
from specwatch.demo.config import DemoConfig
from specwatch.demo.run import run_demo
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
    """On a terminal rich's live display redraws the view in place (cursor up and erase, no
    screen clear piling frames up); a taken default port moves to a free one and says so; the
    last frame's "sent" is the exit line's count."""
    monkeypatch.setattr(demo_config, "DEFAULT_PORT", taken_port)
    out = WatchedOutput()
    stop = asyncio.Event()
    cfg = DemoConfig(port=None, refresh_s=0.2, rate=20.0, concurrency=8)
    task = asyncio.create_task(run_demo(cfg, out=out, tty=True, stop=stop))
    async with asyncio.timeout(30):
        text = await out.until(lambda t: t.count("\x1b[2K") >= 40 and "FLy: τ " in t)
    m = re.search(r"sidecar on http://127\.0\.0\.1:(\d+) \(port (\d+) was taken\)", text)
    assert m is not None
    port = int(m.group(1))
    assert port != taken_port
    assert int(m.group(2)) == taken_port
    assert "\x1b[H\x1b[2J" not in text  # redrawn in place, never by clearing the screen
    assert await _healthz(port) == 200
    # the verdict the view shows is the snapshot's (one function builds it)
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"http://127.0.0.1:{port}/api/v1/snapshot") as r,
    ):
        verdict = (await r.json())["verdict"]
    assert verdict.startswith("FLy: τ ")
    assert "\x1b[1mspecwatch demo" in text  # bold title on a TTY
    stop.set()
    async with asyncio.timeout(30):
        assert await task == 0
    last = out.getvalue().rstrip().splitlines()[-1]
    assert last.removeprefix("\x1b[?25h").startswith("specwatch demo: stopped;")  # cursor back
    # the view's last frame is drawn after the load stopped: its "sent" is the exit line's,
    # with the same thousands separators
    sent = re.findall(r"load: sent (\d+(?:,\d{3})*)", out.getvalue())
    assert sent, "the view shows the load line"
    assert f"; {sent[-1]} requests sent" in last
    leftover = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert leftover == []
    # nothing listens any more on the sidecar's port
    with pytest.raises(aiohttp.ClientConnectionError):
        await _healthz(port)


def test_taken_explicit_port_is_exit_2_with_one_line(
    taken_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """An explicit port that is taken is not moved: exit 2 with one line naming it."""
    assert cli_main(["demo", "--port", str(taken_port), "--no-ui"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"specwatch demo: cannot listen on 127.0.0.1:{taken_port}:")
    assert len(err.splitlines()) == 1
