"""Statistics cost against ledger size: the restart rebuild and the idle CPU of ``specwatch run``.

For each ledger size (default 0, 10,000, 100,000 and 1,000,000 rows) the script

1. builds a ledger fast: the :class:`~specwatch.shadow.ledger.Ledger` creates its schema, then
   rows are inserted with ``executemany`` in one transaction (about 10 % labelled, 5 categories,
   a noise arm on half, running counts in every load band, times spread evenly over the 30 days
   before now: the default retention), then the ledger's stored per-day aggregates are built
   once (timed: what opening a ledger from an older specwatch costs once);
2. times the restart rebuild in this process: a :class:`~specwatch.shadow.component.
   ShadowComponent` on that ledger from ``running()`` to its first statistics (the stored
   aggregates of the days before the longest window's plus one grouped SQL pass over the rows
   after, and one streamed read for the e-process, in worker threads), wall and CPU seconds;
   and, for comparison, one full SQL recomputation of the statistics' inputs
   (:func:`~specwatch.shadow.live.ledger_inputs`: what every refresh cost before the
   statistics were kept live);
3. runs the real CLI, ``python -m specwatch run --config …`` (shadow on, mirror mode, both arms
   at a closed port, one unreachable scrape target, no traffic), waits for the log line
   "shadow statistics rebuilt from the ledger", reads the process's CPU time from
   ``/proc/<pid>/stat`` (start-up CPU), samples it again after ``--seconds`` (default 60) and
   prints the idle CPU as % of one core.

Run: ``PYTHONPATH=. .venv/bin/python bench/bench_history.py [--sizes 0,10000,100000,1000000]
[--seconds 60]``; ``--root DIR`` runs ``specwatch run`` from another checkout (``python -m
specwatch`` in DIR imports DIR's package), e.g. ``git worktree add /tmp/old <commit>`` for the
numbers before a change. Results and the machine are recorded in ``docs/benchmarks.md``, section
"Statistics cost against ledger size". Linux only (``/proc``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import fields
from pathlib import Path

import yaml

from specwatch.shadow.component import ShadowComponent
from specwatch.shadow.ledger.aggregates import HistoryGrouping
from specwatch.shadow.ledger.ledger import Ledger
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.shadow.live import STATS_BUCKET_SECONDS, ledger_inputs
from specwatch.shadow.settings import LedgerSettings, PairedSettings, ShadowSettings

ROOT = Path(__file__).resolve().parents[1]
DAYS = 30.0
COLUMNS = [f.name for f in fields(LedgerRow) if f.name != "id"]
READY = "shadow statistics rebuilt from the ledger"
TICKS = os.sysconf("SC_CLK_TCK")


def _template(rng: random.Random, labelled_share: float = 0.1) -> LedgerRow:
    status = rng.choices(["paired", "unpaired", "excluded"], [96, 3, 1])[0]
    paired = status == "paired"
    labelled = paired and rng.random() < labelled_share
    noise = rng.random() < 0.5
    std_ok = rng.random() < 0.8
    fly_ok = std_ok if rng.random() < 0.95 else not std_ok
    return LedgerRow(
        time=0.0,
        request_hash="0" * 64,
        category=rng.choice(["math", "code", "chat", "rag", "tools"]),
        source="proxy",
        item_id=None,
        status=status,
        reason=None if paired else "fly_timeout",
        labelled=labelled,
        noise_asked=noise,
        standard_correct=std_ok if labelled else None,
        fly_correct=fly_ok if labelled else None,
        noise_correct=(std_ok if rng.random() < 0.97 else not std_ok)
        if labelled and noise
        else None,
        fly_agrees=(rng.random() < 0.9) if paired else None,
        noise_agrees=(rng.random() < 0.93) if paired and noise else None,
        fly_divergence_char=None,
        fly_divergence_token=None,
        fly_similarity=None,
        noise_divergence_char=None,
        noise_similarity=None,
        standard_latency_seconds=rng.uniform(0.2, 3.0) if paired else None,
        fly_latency_seconds=rng.uniform(0.2, 3.0) if paired else None,
        noise_latency_seconds=None,
        standard_tokens=rng.randint(20, 400) if paired else None,
        fly_tokens=rng.randint(20, 400) if paired else None,
        noise_tokens=None,
        standard_tau=rng.uniform(1.5, 3.0) if paired else None,
        fly_tau=rng.uniform(2.0, 3.5) if paired else None,
        noise_tau=None,
        greedy=rng.random() < 0.5,
        running_at_replay=rng.choice([None, 2.0, 12.0, 40.0]),
        baseline_agrees=None,
        noise_baseline_agrees=None,
    )


def build_ledger(
    path: Path,
    rows: int,
    now: float,
    seed: int = 1,
    *,
    days: float = DAYS,
    labelled_share: float = 0.1,
) -> float:
    """Write ``rows`` rows spread evenly over the ``days`` days before ``now`` into a new
    ledger at ``path`` (500 row templates, times varied, ``labelled_share`` of the paired rows
    labelled); returns the seconds it took."""
    t0 = time.perf_counter()

    async def schema() -> None:
        async with Ledger(path):
            pass

    asyncio.run(schema())
    rng = random.Random(seed)
    templates = [
        tuple(getattr(_template(rng, labelled_share), c) for c in COLUMNS) for _ in range(500)
    ]
    span = days * 86400.0
    sql = f"INSERT INTO pairs ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"

    def values() -> object:
        for i in range(rows):
            t = templates[rng.randrange(500)]
            yield (now - span + span * (i + 0.5) / rows, *t[1:])

    conn = sqlite3.connect(path)
    try:
        with conn:
            conn.executemany(sql, values())  # type: ignore[arg-type]
    finally:
        conn.close()
    return time.perf_counter() - t0


def build_aggregates(path: Path) -> tuple[float, float]:
    """``(wall, cpu)`` seconds of the one-time build of the ledger's stored per-day aggregates
    (rows written behind the ledger's back, as :func:`build_ledger` does or an older specwatch
    did, make the first ``history()`` rebuild them from every row)."""

    async def run() -> None:
        async with Ledger(path) as led:
            await led.history(HistoryGrouping(STATS_BUCKET_SECONDS, None, (0,)))

    c0, t0 = time.process_time(), time.perf_counter()
    asyncio.run(run())
    return time.perf_counter() - t0, time.process_time() - c0


def _shadow(port: int) -> dict[str, object]:
    return {
        "enabled": True,
        "modes": ["mirror"],
        "mirror_listen_host": "127.0.0.1",
        "mirror_listen_port": port,
        "standard": {"url": "http://127.0.0.1:9"},
        "fly": {"url": "http://127.0.0.1:9"},
    }


async def time_rebuild(path: Path) -> tuple[float, float, float, float]:
    """``(wall, cpu, full_sql, tick)`` seconds: a component's start on ``path`` until its first
    statistics (wall and this process's CPU), one full SQL recomputation of the inputs, and the
    mean CPU of one refresh tick without new pairs (100 ticks)."""
    comp = ShadowComponent(
        ShadowSettings.model_validate(_shadow(0)),
        PairedSettings(),
        LedgerSettings.model_validate({"path": str(path), "max_age_seconds": None}),
    )
    c0, t0 = time.process_time(), time.perf_counter()
    async with comp.running():
        await comp.refresh()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        assert comp.ledger is not None
        s0 = time.perf_counter()
        await ledger_inputs(comp.ledger, PairedSettings(), time.time())
        full = time.perf_counter() - s0
        c1 = time.process_time()
        for _ in range(100):
            await comp.refresh()
        tick = (time.process_time() - c1) / 100
    return wall, cpu, full, tick


def _cpu_seconds(pid: int) -> float:
    parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / TICKS  # utime, stime (fields 14, 15)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def idle_cpu(
    tmp: Path, ledger: Path, seconds: float, root: Path = ROOT
) -> tuple[float, float, float]:
    """``(ready_after, startup_cpu, idle_pct)``: ``specwatch run`` (from the checkout ``root``)
    on ``ledger`` until the statistics are rebuilt (wall seconds, CPU seconds), then its CPU
    over ``seconds`` as % of one core."""
    config = tmp / "specwatch.yaml"
    doc = {
        "targets": [{"name": "fly", "url": "http://127.0.0.1:9/metrics"}],
        "server": {"host": "127.0.0.1", "port": _free_port()},
        "ledger": {"path": str(ledger)},
        "log": {"level": "INFO", "format": "json"},
        "shadow": _shadow(_free_port()),
    }
    config.write_text(yaml.safe_dump(doc), encoding="utf-8")
    log = tmp / "run.log"
    t0 = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "specwatch", "run", "--config", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=root,
        )
    try:
        while READY not in log.read_text(errors="replace"):
            if proc.poll() is not None:
                raise RuntimeError(f"specwatch run exited {proc.returncode}: {log.read_text()}")
            time.sleep(0.05)
        ready_after = time.monotonic() - t0
        start_cpu = _cpu_seconds(proc.pid)
        time.sleep(seconds)
        idle = (_cpu_seconds(proc.pid) - start_cpu) / seconds * 100.0
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    return ready_after, start_cpu, idle


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="0,10000,100000,1000000")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument(
        "--root",
        type=Path,
        default=ROOT,
        help="run `python -m specwatch` from this checkout (e.g. a worktree of an older commit, "
        "for the numbers before the statistics were kept live); implies --skip-rebuild",
    )
    ap.add_argument("--skip-rebuild", action="store_true", help="skip the in-process timings")
    ap.add_argument(
        "--days",
        type=float,
        default=DAYS,
        help="days the rows span (2 with --labelled 1: the dense ledger the default row cap "
        "fills in about two days of labelled pairs)",
    )
    ap.add_argument("--labelled", type=float, default=0.1, help="share of paired rows labelled")
    args = ap.parse_args()
    skip = args.skip_rebuild or args.root != ROOT
    print(
        f"python {sys.version.split()[0]}, sqlite {sqlite3.sqlite_version}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()}"
    )
    print(
        "rows | build s | aggregates once: wall s | CPU s | rebuild wall s | rebuild CPU s | "
        "full SQL recompute s | tick ms | "
        "run: ready after s | run: start-up CPU s | run: idle % of a core"
    )
    for size in (int(s) for s in args.sizes.split(",")):
        with tempfile.TemporaryDirectory() as d:
            tmp = Path(d)
            ledger = tmp / "ledger.sqlite"
            built = build_ledger(
                ledger, size, time.time(), days=args.days, labelled_share=args.labelled
            )
            agg_wall, agg_cpu = build_aggregates(ledger)
            nan = float("nan")
            wall, cpu, full, tick = (nan,) * 4 if skip else asyncio.run(time_rebuild(ledger))
            ready, start_cpu, idle = idle_cpu(tmp, ledger, args.seconds, args.root)
            print(
                f"{size} | {built:.1f} | {agg_wall:.2f} | {agg_cpu:.2f} | {wall:.2f} | {cpu:.2f} | "
                f"{full:.2f} | "
                f"{tick * 1000:.2f} | {ready:.2f} | "
                f"{start_cpu:.2f} | {idle:.2f}",
                flush=True,
            )
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
