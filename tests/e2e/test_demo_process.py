"""``specwatch demo`` as a real process: it starts, serves both targets' acceptance gauges, the
shadow pairs and the alert gauges, and exits 0 leaving no process and no temporary ledger
behind (end of --duration, SIGINT to its process group, SIGTERM)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import sys
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.fakes import REPO

ROOT = REPO
METRICS_RE = re.compile(r"metrics:\s+(http://\S+/metrics)")
LEDGER_RE = re.compile(r"shadow ledger:\s+(\S+)\s+\(removed at exit")


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, pgrp) of ``pid`` from ``/proc/PID/stat``; None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[2])


def _all_pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _tree(root: int) -> set[int]:
    """``root`` and every live descendant, plus every process in ``root``'s process group."""
    stats = {pid: st for pid in _all_pids() if (st := _proc_stat(pid)) is not None}
    found = {root} | {pid for pid, st in stats.items() if st[2] == root}
    grew = True
    while grew:
        new = {pid for pid, st in stats.items() if st[1] in found} - found
        found |= new
        grew = bool(new)
    return found


def _alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` that still exist and are not zombies."""
    out = set()
    for pid in pids:
        st = _proc_stat(pid)
        if st is not None and st[0] != "Z":
            out.add(pid)
    return out


def _group_members(pgid: int) -> set[int]:
    return {
        pid
        for pid in _all_pids()
        if (st := _proc_stat(pid)) is not None and st[2] == pgid and st[0] != "Z"
    }


async def _start(*args: str) -> asyncio.subprocess.Process:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (
        os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""
    )
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specwatch", "demo", "--port", "0", *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=str(ROOT),
        start_new_session=True,  # its own process group: pgid == pid
    )  # fmt: skip


async def _read_until(
    proc: asyncio.subprocess.Process, seen: list[str], pattern: re.Pattern[str]
) -> str:
    """Read stdout lines (kept in ``seen``) until one matches ``pattern``; its group 1."""
    assert proc.stdout is not None
    async with asyncio.timeout(60):
        while True:
            raw = await proc.stdout.readline()
            assert raw, f"demo exited before printing {pattern.pattern!r}: {seen}"
            line = raw.decode()
            seen.append(line)
            m = pattern.search(line)
            if m:
                return m.group(1)


async def _metrics_url(proc: asyncio.subprocess.Process, seen: list[str]) -> str:
    return await _read_until(proc, seen, METRICS_RE)


def _acceptance(text: str) -> dict[str, float]:
    """Server-wide (no engine label) 1m acceptance ratio per target."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != "specwatch_acceptance_ratio":
            continue
        for s in fam.samples:
            if s.labels.get("window") == "1m" and "engine" not in s.labels:
                out[s.labels["target"]] = s.value
    return out


async def _wait_for_acceptance(url: str) -> tuple[dict[str, float], dict[str, object]]:
    """Poll the printed /metrics URL until both targets have an acceptance ratio."""
    async with aiohttp.ClientSession() as s:
        async with asyncio.timeout(40):
            while True:
                async with s.get(url) as r:
                    assert r.status == 200
                    values = _acceptance(await r.text())
                if {"standard", "fly"} <= values.keys():
                    break
                await asyncio.sleep(0.5)
        async with s.get(url.removesuffix("/metrics") + "/api/v1/snapshot") as r:
            assert r.status == 200
            snap = json.loads(await r.text())
    return values, snap


def _families(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Family name → [(labels, value)] of every sample (prometheus_client's parser)."""
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        out.setdefault(fam.name, []).extend((dict(s.labels), s.value) for s in fam.samples)
    return out


def _paired(fams: dict[str, list[tuple[dict[str, str], float]]]) -> float:
    """Paired requests: ``specwatch_shadow_pairs_total`` summed over arm="fly" and
    outcome agree|disagree."""
    return sum(
        v
        for labels, v in fams.get("specwatch_shadow_pairs", [])
        if labels.get("arm") == "fly" and labels.get("outcome") in ("agree", "disagree")
    )


async def _wait_for_pairs(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Poll /metrics until the shadow chain has counted a pair; returns the parsed families."""
    async with aiohttp.ClientSession() as s, asyncio.timeout(40):
        while True:
            async with s.get(url) as r:
                fams = _families(await r.text())
            if _paired(fams) > 0:
                return fams
            await asyncio.sleep(0.5)


def _check_serving(values: dict[str, float], snap: dict[str, object]) -> None:
    for target in ("standard", "fly"):
        assert 0.0 < values[target] < 1.0, values
    targets = snap["targets"]
    assert isinstance(targets, dict)
    assert {targets["standard"]["role"], targets["fly"]["role"]} == {"standard", "fly"}
    for t in targets.values():
        assert t["up"] is True
        assert t["capacity"]["limits_configured"] is True  # the demo configures the limits
        assert t["limits"]["max_num_seqs"] == 16


async def _exited(
    proc: asyncio.subprocess.Process, seen: list[str], *, within: float, code: int = 0
) -> str:
    """Wait (``within`` s at most) for the demo to exit; check it exited with ``code`` (130:
    Ctrl-C, with ``specwatch demo: interrupted`` as stderr's last line), without a traceback,
    saying it stopped; returns its whole stdout (``seen``: the lines already read)."""
    async with asyncio.timeout(within):
        assert proc.stdout is not None
        assert proc.stderr is not None
        rest, err = await asyncio.gather(proc.stdout.read(), proc.stderr.read())
        rc = await proc.wait()
    assert rc == code, err.decode()
    assert "Traceback" not in err.decode()
    if code == 130:
        assert err.decode().splitlines()[-1] == "specwatch demo: interrupted"
    out = "".join(seen) + rest.decode()
    assert "specwatch demo: stopped;" in out
    return out


async def _reap(proc: asyncio.subprocess.Process) -> None:
    """Kill the demo if a failed check left it running."""
    if proc.returncode is None:
        proc.kill()
        await proc.wait()


@pytest.mark.slow
async def test_demo_duration_serves_then_exits_0_leaving_no_process() -> None:
    """`specwatch demo --duration` serves metrics and pairs, then exits 0 leaving no child
    process or directory."""
    proc = await _start("--duration", "20")
    lines: list[str] = []
    try:
        url = await _metrics_url(proc, lines)
        ledger = Path(await _read_until(proc, lines, LEDGER_RE))
        assert ledger.parent.is_dir()  # the temporary directory exists while the demo runs
        values, snap = await _wait_for_acceptance(url)
        fams = await _wait_for_pairs(url)
        tree = _tree(proc.pid)
        out = await _exited(proc, lines, within=60)
    finally:
        await _reap(proc)
    _check_serving(values, snap)
    assert "\x1b" not in out  # stdout is a pipe: plain text, no ANSI
    # the plain view ran and showed both arms' acceptance
    assert re.search(r"^standard\s+up\s+0\.\d{3}", out, re.M), out[-2000:]
    assert re.search(r"^fly\s+up\s+0\.\d{3}", out, re.M)
    assert proc.pid in tree
    assert _alive(tree) == set()
    assert _group_members(proc.pid) == set()
    # the shadow chain paired live/canary requests; the alerting component exports its family
    assert _paired(fams) > 0
    assert "specwatch_alert_firing" in fams
    assert sum(v for _, v in fams["specwatch_alert_firing"]) >= 0
    # the view showed the shadow section and the alerts section
    assert re.search(r"^pairs \(since_start\) [1-9][\d,]*", out, re.M), out[-2000:]
    assert re.search(r"^FLy: τ [+-]\d+ %", out, re.M)  # the verdict
    assert re.search(r"^alerts: ", out, re.M)
    # the temporary ledger directory is gone
    assert ledger.name == "ledger.sqlite"
    assert ledger.parent.name.startswith("specwatch-demo-")
    assert not ledger.parent.exists()


async def _signal_mid_run(sig: signal.Signals, code: int) -> None:
    proc = await _start("--no-ui")
    lines: list[str] = []
    try:
        url = await _metrics_url(proc, lines)
        ledger = Path(await _read_until(proc, lines, LEDGER_RE))
        values, snap = await _wait_for_acceptance(url)
        tree = _tree(proc.pid)
        assert proc.returncode is None  # still running: the signal lands mid-run
        os.killpg(proc.pid, sig)  # what Ctrl-C does: the whole foreground group
        out = await _exited(proc, lines, within=30, code=code)
    finally:
        await _reap(proc)
    _check_serving(values, snap)
    assert "target    role" not in out  # --no-ui: no view
    assert _alive(tree) == set()
    assert _group_members(proc.pid) == set()
    assert not ledger.parent.exists()  # the temporary ledger directory is removed


async def test_demo_sigint_mid_run_exits_130_leaving_no_process() -> None:
    """SIGINT (Ctrl-C) mid-run stops the demo the same way, no process left, then exits 130
    with its one ``interrupted`` line."""
    await _signal_mid_run(signal.SIGINT, 130)


async def test_demo_sigterm_mid_run_exits_0_leaving_no_process() -> None:
    """SIGTERM mid-run stops the demo with exit 0 and no process left."""
    await _signal_mid_run(signal.SIGTERM, 0)
