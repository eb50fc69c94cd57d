"""A first ``parse_page`` in a new process against prometheus_client's full parse, per real capture.

Each round starts a fresh interpreter per capture in ``tests/fixtures/vllm-metrics/real-*.txt``
(rounds interleave the captures, so machine load hits them alike). The child imports
:mod:`specwatch.observe.parse` (its import-time seeding included in neither figure), then times
with ``time.process_time`` (CPU seconds of the child):

- ``first``: the process's first ``parse_page`` of the capture (nothing memoised but the seeds);
- ``full``: prometheus_client's parse of the whole page (``text_string_to_metric_families``,
  every family listed), run after the first parse: the median of 5 in-process runs, as the
  anchor in ``docs/benchmarks.md`` is measured, and its first run (a cold library parse).

Prints per capture the medians over rounds and the ratios full / first (goal: >= 10x with the
warm anchor). Run from the repository root: ``PYTHONPATH=. python bench/bench_cold_parse.py
[--rounds 15]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CAPTURES = sorted((ROOT / "tests/fixtures/vllm-metrics").glob("real-*.txt"))

CHILD = """
import json, statistics, sys, time
from specwatch.observe.parse import parse_page
from prometheus_client.parser import text_string_to_metric_families
body = open(sys.argv[1], encoding="utf-8").read()
t = time.process_time(); parse_page(body); first = time.process_time() - t
fulls = []
for _ in range(5):
    t = time.process_time(); list(text_string_to_metric_families(body))
    fulls.append(time.process_time() - t)
print(json.dumps({"first": first, "full": statistics.median(fulls), "full_first": fulls[0]}))
"""


def one(capture: Path) -> dict[str, float]:
    """The child's three timings for ``capture`` (seconds)."""
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(capture)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    got: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return got


def main() -> None:
    """Print the table."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    print(f"python {sys.version.split()[0]}, load average at start {os.getloadavg()}")
    runs: dict[Path, list[dict[str, float]]] = {c: [] for c in CAPTURES}
    for _ in range(args.rounds):
        for capture in CAPTURES:
            runs[capture].append(one(capture))
    print("capture | size | first parse_page ms | full parse ms (warm) | ratio | full (first) ms")
    for capture, xs in runs.items():
        first = statistics.median(x["first"] for x in xs)
        full = statistics.median(x["full"] for x in xs)
        full_first = statistics.median(x["full_first"] for x in xs)
        print(
            f"{capture.name} | {capture.stat().st_size // 1024} KiB | {first * 1e3:.2f} | "
            f"{full * 1e3:.2f} | {full / first:.1f}x | {full_first * 1e3:.2f}"
        )
    print(f"load average at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
