"""Time ``specwatch report`` on synthetic ledgers of growing size (headless, Agg).

    PYTHONPATH=. python bench/bench_report.py [--rows 10000 100000 1000000] [--repeat 3] \
        [--baseline-src DIR]

Ledgers come from ``scripts/make_report_example.py`` (three categories, noise arm on a third
of the pairs, about 2% unpaired and 1% excluded), written with ``Ledger.write_many`` (the
ledger's own schema, 50,000 rows per transaction). Each run is the whole command in a fresh
interpreter (``python -m specwatch report --ledger L --out DIR``: imports, ledger read,
statistics, e-value paths, three plots, HTML), so imports are counted every time. Prints, per
size, the best and median wall time, the best CPU time (user + system of the child) and the
1-minute load average before the runs. ``--baseline-src DIR`` also runs the same command from
another source tree (e.g. ``git archive <rev> | tar -x -C DIR``), interleaved run by run with
this one so both see the same machine load.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "make_report_example", ROOT / "scripts" / "make_report_example.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _children_cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def run_once(src: Path, ledger: Path, out: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one ``specwatch report`` run from source tree ``src``."""
    env = {**os.environ, "PYTHONPATH": str(src), "MPLBACKEND": "Agg"}
    cmd = [sys.executable, "-m", "specwatch", "report", "--ledger", str(ledger)]
    cpu0, start = _children_cpu(), time.perf_counter()
    # cwd=src: `python -m` puts the working directory first on sys.path
    subprocess.run([*cmd, "--out", str(out)], check=True, env=env, capture_output=True, cwd=src)
    return time.perf_counter() - start, _children_cpu() - cpu0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline-src", type=Path, help="another source tree to compare")
    args = parser.parse_args()
    example = _example()
    trees = {"this": ROOT}
    if args.baseline_src is not None:
        trees["baseline"] = args.baseline_src.resolve()
    with tempfile.TemporaryDirectory() as tmp:
        for rows in args.rows:
            ledger = Path(tmp) / f"ledger-{rows}.db"
            start = time.perf_counter()
            asyncio.run(example.write_ledger(ledger, 7, pairs=rows))
            built = time.perf_counter() - start
            load = os.getloadavg()[0]
            times: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
            for i in range(args.repeat):
                for name, src in trees.items():
                    times[name].append(run_once(src, ledger, Path(tmp) / f"out-{name}-{i}"))
            for name, got in times.items():
                walls = [w for w, _ in got]
                print(
                    f"{name}: rows={rows} best={min(walls):.2f}s "
                    f"median={statistics.median(walls):.2f}s "
                    f"cpu_best={min(c for _, c in got):.2f}s "
                    f"load1={load:.1f} ledger_built_in={built:.1f}s",
                    flush=True,
                )
            ledger.unlink()


if __name__ == "__main__":
    main()
