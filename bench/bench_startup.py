"""Start-up time of the ``specwatch`` command line, hyperfine style (medians of N runs).

Run from the repository root: ``python bench/bench_startup.py [--runs N] [--importtime]
[--before DIR]``. Each command runs as a fresh subprocess of this interpreter (``python -m
specwatch ...``), first once to warm the file cache (not counted), then ``--runs`` times,
interleaved with the bare interpreter (``python -c pass``), so machine load hits both alike.
Prints the median wall time, the median CPU seconds (user + system of the child, which a loaded
machine inflates less than wall time), the minimum wall time and the ratio of each median to the
bare interpreter's. Every subcommand's ``--help`` is timed. ``--before DIR``: a source tree of an
older revision (e.g. ``git archive REV specwatch | tar -x -C DIR``), each command also run from
it in the same rounds, with the CPU ratio before/after. Goals: ``--version`` and every ``--help``
under 0.3 s, ``analyze`` on one saved page under 1 s. ``--importtime`` also prints the ten
largest cumulative imports of ``--version`` and ``analyze`` (``python -X importtime``).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from specwatch.__main__ import HELP as _HELP

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
}
for _command, _ in _HELP.values():
    COMMANDS[f"specwatch {_command} --help"] = ["-m", "specwatch", _command, "--help"]


def run_once(args: list[str], cwd: Path = ROOT) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one ``python ARGS`` run from ``cwd`` (output discarded);
    raises on a non-zero exit."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, *args],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=cwd,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


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
    ap.add_argument("--before", type=Path, help="source tree of an older revision to compare")
    args = ap.parse_args()
    print(f"python {sys.version.split()[0]} on {os.cpu_count()} CPUs")
    print(f"load average at start: {os.getloadavg()}")
    trees = {"": ROOT} if args.before is None else {"": ROOT, "before ": args.before.resolve()}
    times: dict[str, list[tuple[float, float]]] = {
        tag + name: [] for tag in trees for name in COMMANDS
    }
    for cwd in trees.values():
        for cmd in COMMANDS.values():
            run_once(cmd, cwd)  # warm-up
    for _ in range(args.runs):
        for name, cmd in COMMANDS.items():
            for tag, cwd in trees.items():
                times[tag + name].append(run_once(cmd, cwd))
    bare = statistics.median(w for w, _ in times["python -c pass"])
    for name, xs in times.items():
        med = statistics.median(w for w, _ in xs)
        cpu = statistics.median(c for _, c in xs)
        line = (
            f"{name:>40}: median {med * 1e3:7.1f} ms  CPU {cpu * 1e3:7.1f} ms  "
            f"min {min(w for w, _ in xs) * 1e3:7.1f} ms  {med / bare:5.1f}x bare"
        )
        old = times.get("before " + name)
        if old:
            line += f"  CPU before/after {statistics.median(c for _, c in old) / cpu:5.1f}x"
        print(line)
    print(f"load average at end: {os.getloadavg()}")
    if args.importtime:
        for name in ("specwatch --version", "specwatch analyze PAGE"):
            print(f"\nlargest cumulative imports of {name}:")
            for us, module in top_imports(COMMANDS[name]):
                print(f"  {us / 1e3:7.1f} ms  {module}")


if __name__ == "__main__":
    main()
