"""Start-up time of the ``specwatch`` command line, hyperfine style (median wall time of N runs).

Run from the repository root: ``python bench/bench_startup.py [--runs N] [--importtime]``.
Each command runs as a fresh subprocess of this interpreter (``python -m specwatch ...``), first
once to warm the file cache (not counted), then ``--runs`` times, interleaved with the bare
interpreter (``python -c pass``), so machine load hits both alike. Prints the median, the
minimum and the ratio of each median to the bare interpreter's. Goals: ``--version`` under
0.3 s, ``analyze`` on one saved page under 1 s. ``--importtime`` also prints the ten largest
cumulative imports of ``--version`` and ``analyze`` (``python -X importtime``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "tests/fixtures/vllm-metrics/real-cpu-draft-model.txt"

COMMANDS: dict[str, list[str]] = {
    "python -c pass": ["-c", "pass"],
    "specwatch --version": ["-m", "specwatch", "--version"],
    "specwatch --help": ["-m", "specwatch", "--help"],
    "specwatch analyze PAGE": ["-m", "specwatch", "analyze", str(PAGE)],
    "specwatch power ...": [
        "-m",
        "specwatch",
        "power",
        "--net-loss",
        "0.02",
        "--discordant",
        "0.06",
    ],
    "specwatch run --help": ["-m", "specwatch", "run", "--help"],
}


def run_once(args: list[str]) -> float:
    """Wall seconds of one ``python ARGS`` run (output discarded); raises on a non-zero exit."""
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    return time.perf_counter() - start


def top_imports(args: list[str], n: int = 10) -> list[tuple[int, str]]:
    """The ``n`` largest cumulative import times (µs, module) of ``python -X importtime ARGS``."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *args], capture_output=True, text=True, check=True
    )
    rows: list[tuple[int, str]] = []
    for line in done.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].rstrip()))
    return sorted(rows, reverse=True)[:n]


def main() -> None:
    """Print the table (and the import profile with ``--importtime``)."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=21, help="runs per command (median)")
    ap.add_argument("--importtime", action="store_true", help="print the largest imports")
    args = ap.parse_args()
    print(f"python {sys.version.split()[0]} on {os.cpu_count()} CPUs")
    print(f"load average at start: {os.getloadavg()}")
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for cmd in COMMANDS.values():
        run_once(cmd)  # warm-up
    for _ in range(args.runs):
        for name, cmd in COMMANDS.items():
            times[name].append(run_once(cmd))
    bare = statistics.median(times["python -c pass"])
    for name, xs in times.items():
        med = statistics.median(xs)
        print(
            f"{name:>24}: median {med * 1e3:7.1f} ms  min {min(xs) * 1e3:7.1f} ms  "
            f"{med / bare:5.1f}x bare"
        )
    print(f"load average at end: {os.getloadavg()}")
    if args.importtime:
        for name in ("specwatch --version", "specwatch analyze PAGE"):
            print(f"\nlargest cumulative imports of {name}:")
            for us, module in top_imports(COMMANDS[name]):
                print(f"  {us / 1e3:7.1f} ms  {module}")


if __name__ == "__main__":
    main()
