"""Time ``specwatch report`` on synthetic ledgers of growing size (headless, Agg).

    PYTHONPATH=. python bench/bench_report.py [--rows 10000 100000] [--repeat 3]

Ledgers come from ``scripts/make_report_example.py`` (three categories, noise arm on a third
of the pairs). Prints the best and median wall time of the whole command (ledger read,
statistics, e-value paths per category, four plots, HTML) per size.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import tempfile
import time
from pathlib import Path
from types import ModuleType

from specwatch.__main__ import main as specwatch_main

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    example = _example()
    with tempfile.TemporaryDirectory() as tmp:
        for rows in args.rows:
            ledger = Path(tmp) / f"ledger-{rows}.db"
            asyncio.run(example.write_ledger(ledger, 7, pairs=rows))
            times = []
            for i in range(args.repeat):
                out = Path(tmp) / f"out-{rows}-{i}"
                start = time.perf_counter()
                rc = specwatch_main(["report", "--ledger", str(ledger), "--out", str(out)])
                times.append(time.perf_counter() - start)
                assert rc == 0
            print(
                f"rows={rows} best={min(times):.2f}s median={statistics.median(times):.2f}s "
                f"per_1k_rows={1000 * min(times) / rows * 1000:.1f}ms"
            )


if __name__ == "__main__":
    main()
