"""``specwatch report``: an HTML report with plots from the pair ledger (``report`` extra).

Writes ``OUT/index.html`` and PNG plots: flips over time, the e-value path against 1/alpha, net
loss with its interval, per-category tables and, with ``--metrics-url`` (a specwatch
``/api/v1/snapshot`` or ``/metrics`` URL, or a saved copy of either), per-position acceptance per
arm. Exit 2 with one line on a missing or corrupt ledger, a bad source, or matplotlib missing.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from specwatch.core.helptext import plain_help
from specwatch.tools.report import MAX_POINTS, REPORT_WINDOW

if TYPE_CHECKING:  # the ledger, numpy and statistics load in main, not for ``report --help``
    from specwatch.tools.report.data import ReportData

MISSING_EXTRA = (
    "specwatch report: matplotlib is not installed; install the 'report' extra "
    "(pip install 'specwatch[report]')"
)


#: How long ``--metrics-url`` may take to answer.
METRICS_TIMEOUT_SECONDS = 10.0


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``report``."""
    p = subparsers.add_parser(
        "report",
        help="HTML report with plots from the pair ledger (needs the 'report' extra)",
        description=plain_help(__doc__ or ""),
    )
    p.add_argument("--ledger", type=Path, required=True, help="the SQLite pair ledger")
    p.add_argument(
        "--metrics-url",
        help="specwatch /api/v1/snapshot or /metrics URL (or a saved file) for per-position "
        "acceptance per arm",
    )
    p.add_argument("--out", type=Path, required=True, help="output directory (created)")
    p.add_argument(
        "--window",
        default=REPORT_WINDOW,
        help=f"acceptance window to show (default {REPORT_WINDOW})",
    )
    p.add_argument("--alpha", type=float, default=0.05, help="level (default 0.05)")
    p.add_argument(
        "--margin",
        type=float,
        default=0.01,
        help="non-inferiority margin, a fraction (default 0.01 = one point)",
    )
    p.add_argument(
        "--bins",
        type=int,
        default=40,
        help=f"time bins of the flips and net-loss plots, 1 to {MAX_POINTS} (default 40)",
    )
    p.set_defaults(handler=main)


#: Ledger size (bytes) from which reading it takes longer than importing matplotlib: only
#: then is the renderer imported during the read (below it, when the first plot is drawn).
PRELOAD_RENDER_BYTES = 64 * 1024 * 1024


def _preload(render: bool) -> bool:
    """Import what building (scipy.optimize for the intervals) and, with ``render``, drawing
    the report needs (matplotlib through the renderer): run in a thread while SQLite reads the
    ledger, which releases the GIL, so the imports use the time the reads leave on the second
    core. False when an import failed: :func:`main` imports the renderer again and reports
    that."""
    try:
        import scipy.optimize  # noqa: F401

        if render:
            import specwatch.tools.report.render  # noqa: F401
    except ImportError:
        return False
    return True


def _large(path: Path) -> bool:
    try:
        return path.stat().st_size >= PRELOAD_RENDER_BYTES
    except OSError:  # the read reports it
        return False


async def _gather(args: argparse.Namespace) -> ReportData:
    from specwatch.shadow.summary import Levels
    from specwatch.tools.report.data import (
        Acceptance,
        build_report,
        fetch_text,
        parse_acceptance,
        read_ledger,
    )

    digest, _ = await asyncio.gather(
        read_ledger(args.ledger, bins=args.bins),
        asyncio.to_thread(_preload, _large(args.ledger)),
    )
    acceptance: Acceptance | None = None
    if args.metrics_url:
        text = await fetch_text(args.metrics_url, METRICS_TIMEOUT_SECONDS)
        acceptance = parse_acceptance(text, args.window, args.metrics_url)
    return build_report(
        str(args.ledger),
        digest,
        levels=Levels(alpha=args.alpha, margin=args.margin),
        acceptance=acceptance,
        now=time.time(),
    )


def _has_matplotlib() -> bool:
    """Whether matplotlib can be imported, without importing it (that takes ~0.5 s, which the
    report spends in a thread during the ledger read instead)."""
    try:
        return importlib.util.find_spec("matplotlib") is not None
    except (ImportError, ValueError):  # ValueError: a module entry without a spec
        return False


def main(args: argparse.Namespace) -> int:
    """Build the report; 0 on success, 2 on bad input or a missing extra."""
    if not _has_matplotlib():
        print(MISSING_EXTRA, file=sys.stderr)
        return 2
    if not 0.0 < args.alpha < 0.5:
        print("specwatch report: --alpha must be in (0, 0.5)", file=sys.stderr)
        return 2
    if not 0.0 <= args.margin < 1.0:
        print("specwatch report: --margin must be in [0, 1)", file=sys.stderr)
        return 2
    if not 1 <= args.bins <= MAX_POINTS:
        print(f"specwatch report: --bins must be in [1, {MAX_POINTS}]", file=sys.stderr)
        return 2
    from specwatch.tools.report.data import ReportInputError

    try:
        data = asyncio.run(_gather(args))
    except ReportInputError as exc:
        print(f"specwatch report: {exc}", file=sys.stderr)
        return 2
    try:
        from specwatch.tools.report.render import render_report  # matplotlib loads here
    except ImportError:  # installed but not importable
        print(MISSING_EXTRA, file=sys.stderr)
        return 2
    try:
        written = render_report(data, args.out)
    except OSError as exc:
        print(f"specwatch report: {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"wrote {written[-1]} and {len(written) - 1} plots")
    return 0
