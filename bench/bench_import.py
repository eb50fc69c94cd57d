"""Import time of the observe chain and of the CLI, each in fresh interpreters.

    PYTHONPATH=. python bench/bench_import.py [--runs 9] [--json]

Five commands, each run ``--runs`` times in a new subprocess (so no module is cached):

* ``import specwatch.observe.tracker`` (the observe chain a sidecar without shadow needs),
* ``import specwatch.observe.loop`` (adds the scrape loop: aiohttp),
* ``import specwatch.server.app`` (the whole sidecar: both chains, alerts, export, the app),
* ``import specwatch.cli.run`` (what ``specwatch run`` imports before it starts),
* ``specwatch --version`` (the console entry point, ``python -m specwatch --version``).

The import time is the sum of ``-X importtime``'s cumulative column over the roots of the
import tree whose name starts with ``specwatch`` (``specwatch``, ``specwatch.observe``,
``specwatch.observe.tracker``, ...; everything they pull in is nested under them), i.e. import
work only, without interpreter start-up. The wall time of the whole subprocess is also shown
(start-up included; for ``--version`` it is the number that matters). Prints the median (and
min, max) in seconds per command.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

COMMANDS: dict[str, list[str]] = {
    "import specwatch.observe.tracker": ["-c", "import specwatch.observe.tracker"],
    "import specwatch.observe.loop": ["-c", "import specwatch.observe.loop"],
    "import specwatch.server.app": ["-c", "import specwatch.server.app"],
    "import specwatch.cli.run": ["-c", "import specwatch.cli.run"],
    "specwatch --version": ["-m", "specwatch", "--version"],
}


@dataclass(frozen=True)
class Run:
    """One subprocess: seconds spent importing (from -X importtime) and wall seconds."""

    import_s: float
    wall_s: float


def import_seconds(stderr: str) -> float:
    """Sum of the cumulative import time (seconds) of the import tree's ``specwatch*`` roots.

    ``-X importtime`` writes ``import time: self [us] | cumulative | <indent>name`` per module;
    a root is a line whose name has one leading space (nesting adds two spaces per level).
    """
    total_us = 0
    for line in stderr.splitlines():
        if not line.startswith("import time:") or "cumulative" in line:
            continue
        _, cumulative, name = line.removeprefix("import time:").split("|", 2)
        if name.startswith(" specwatch"):  # one space follows the bar; deeper levels add two
            total_us += int(cumulative)
    return total_us / 1e6


def run_once(args: list[str]) -> Run:
    """Run ``python -X importtime <args>`` once; raises CalledProcessError if it fails."""
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return Run(import_seconds(proc.stderr), time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=9, help="subprocesses per command")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    opts = parser.parse_args()
    results: dict[str, dict[str, float]] = {}
    for label, args in COMMANDS.items():
        runs = [run_once(args) for _ in range(opts.runs)]
        imports = [r.import_s for r in runs]
        walls = [r.wall_s for r in runs]
        results[label] = {
            "import_median_s": statistics.median(imports),
            "import_min_s": min(imports),
            "import_max_s": max(imports),
            "wall_median_s": statistics.median(walls),
        }
    if opts.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{'command':36} {'import median':>14} {'min':>7} {'max':>7} {'wall median':>12}")
    for label, r in results.items():
        print(
            f"{label:36} {r['import_median_s']:>13.3f}s {r['import_min_s']:>6.3f}s "
            f"{r['import_max_s']:>6.3f}s {r['wall_median_s']:>11.3f}s"
        )


if __name__ == "__main__":
    main()
