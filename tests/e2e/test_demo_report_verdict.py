"""The demo and ``specwatch report`` print one verdict sentence: ``specwatch demo --no-ui
--duration N --ledger PATH`` as a user runs it, then ``specwatch report`` on that ledger; the
sentence the demo prints at exit equals the report's, τ and speed parts included (both read them
from the paired requests' per-request counts), and the live ``/api/v1/snapshot`` verdict has
the same parts."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path

import aiohttp
import pytest

from tests.fakes import REPO

SNAPSHOT_RE = re.compile(r"snapshot:\s+(http://\S+/api/v1/snapshot)")
VERDICT_RE = re.compile(r"^verdict: (.+)$", re.M)
REPORT_RE = re.compile(r'data-field="verdict">([^<]+)<')
HEAD_RE = re.compile(r"^FLy: τ [+-]\d+ %, speed per request [+-]\d+ %, ")


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    return env


async def _live_verdict(url: str) -> str:
    """Poll the printed snapshot URL until its verdict has labelled pairs."""
    async with aiohttp.ClientSession() as s, asyncio.timeout(30):
        while True:
            async with s.get(url) as r:
                verdict = json.loads(await r.text()).get("verdict") or ""
            if re.search(r" on [\d,]+ labelled pairs", verdict):
                return str(verdict)
            await asyncio.sleep(0.5)


@pytest.mark.slow
async def test_demo_exit_verdict_equals_report_verdict(tmp_path: Path) -> None:
    """The demo's exit verdict equals ``specwatch report``'s on the ledger it kept, and both
    (and the live snapshot's) carry τ and speed per request."""
    ledger = tmp_path / "demo.db"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specwatch", "demo", "--no-ui", "--port", "0",
        "--duration", "12", "--ledger", str(ledger),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=_env(), cwd=str(REPO),
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(40):
            while not (m := SNAPSHOT_RE.search("".join(lines))):
                raw = await proc.stdout.readline()
                assert raw, f"demo exited early: {lines}"
                lines.append(raw.decode())
        live = await _live_verdict(m.group(1))
        out, err = await asyncio.wait_for(proc.communicate(), 40)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    exit_verdict = VERDICT_RE.search(out.decode())
    assert exit_verdict is not None, out.decode()
    report = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specwatch", "report", "--ledger", str(ledger),
        "--out", str(tmp_path / "report"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=_env(), cwd=str(REPO),
    )  # fmt: skip
    _, rerr = await asyncio.wait_for(report.communicate(), 60)
    assert report.returncode == 0, rerr.decode()
    page = (tmp_path / "report" / "index.html").read_text()
    in_report = REPORT_RE.search(page)
    assert in_report is not None
    assert exit_verdict.group(1) == in_report.group(1).replace("&#x27;", "'")
    assert HEAD_RE.search(exit_verdict.group(1)), exit_verdict.group(1)
    assert HEAD_RE.search(live), live
