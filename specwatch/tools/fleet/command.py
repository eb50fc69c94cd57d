"""``specwatch fleet --prometheus-url URL``: fleet-wide paired statistics per model from the
sidecars' counters in Prometheus (or Thanos Querier).

Queries ``specwatch_ledger_pairs{arm="fly"}`` (each sidecar's ledger as a 2x2 table),
sums it per model (the series' ``--model-label``, default ``model_name``: set it with the scrape
config's target labels) and category, and computes what one sidecar would compute on the union
of the pairs: exact McNemar, the Tango interval and non-inferiority test, and per category the
count form of the ``no_net_loss`` e-value. The order-dependent e-processes (no net loss, of all
categories, and the margin) are combined from each sidecar's own since-start values, queried
from ``specwatch_paired_e_value`` (mean: valid under any dependence, the ``overall`` e-value
shown; product: valid for independent traffic).

Without ``--listen`` it queries once and prints a table or JSON (exit 0; 1 when Prometheus cannot
be queried; 2 on a bad flag). With ``--listen HOST:PORT`` it serves the ``specwatch_fleet_*``
gauges on ``/metrics`` and refreshes every ``--interval``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import sys
import time
from typing import TYPE_CHECKING, Any

from specwatch.cli.args import (
    add_described_command,
    add_output_format,
    add_prometheus_url,
    output_format,
)
from specwatch.core.clock import SYSTEM_WALL
from specwatch.core.config import (
    DEFAULT_ALPHA,
    DEFAULT_MARGIN,
    DEFAULT_REPLICA_LABELS,
    parse_duration,
)
from specwatch.core.logs import setup_logging
from specwatch.core.shutdown import StopSignal

if TYPE_CHECKING:  # aiohttp, the server and the statistics load in main, not for ``fleet --help``
    from specwatch.tools.fleet.server import FleetQuery
    from specwatch.tools.fleet.stats import FleetStats


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``fleet``."""
    p = add_described_command(
        subparsers,
        "fleet",
        help="fleet-wide paired statistics per model from the sidecars' counters in Prometheus",
        description=__doc__,
    )
    add_prometheus_url(p)
    p.add_argument(
        "--selector",
        default="",
        metavar="MATCHERS",
        help='extra label matchers for every query, e.g. \'job="specwatch",cluster="eu1"\'',
    )
    p.add_argument(
        "--model-label",
        default="model_name",
        help="series label naming the model (default model_name; '' pools every series)",
    )
    p.add_argument(
        "--replica-label",
        action="append",
        default=None,
        metavar="LABEL",
        help="label telling HA Prometheus replicas apart, repeatable (default "
        f"{', '.join(DEFAULT_REPLICA_LABELS)}; '' for none): series equal but for it count once",
    )
    p.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help="test level")
    p.add_argument(
        "--margin", type=float, default=DEFAULT_MARGIN, help="non-inferiority margin (fraction)"
    )
    add_output_format(p)
    p.add_argument("--timeout", default="10s", metavar="DURATION", help="per query (10s)")
    p.add_argument(
        "--listen", metavar="HOST:PORT", help="serve the specwatch_fleet_* gauges on /metrics"
    )
    p.add_argument("--interval", default="30s", metavar="DURATION", help="refresh (30s)")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--log-format", default="json", choices=("json", "plain"))
    p.set_defaults(handler=main)


def _table(stats: FleetStats) -> str:
    def pct(x: float) -> str:
        return "n/a" if math.isnan(x) else f"{100 * x:+.2f}"

    head = ("model", "category", "n", "lost", "gained", "net_loss_pts", "ci_pts", "p_loss", "e")
    rows: list[tuple[str, ...]] = [head]
    for name, m in stats.models.items():
        for category, s in sorted(m.summaries.items()):
            rows.append(
                (
                    name,
                    category,
                    str(s.n),
                    str(s.lost),
                    str(s.gained),
                    pct(s.net_loss_ratio),
                    f"[{pct(s.ci_lower)}, {pct(s.ci_upper)}]",
                    f"{s.p_loss:.3g}",
                    f"{s.e_value:.3g}",
                )
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    for name, m in stats.models.items():
        if m.net_loss_e_mean is not None:
            lines.append(
                f"{name}: no-net-loss e-value over {m.net_loss_sidecars} sidecars: mean "
                f"{m.net_loss_e_mean:.3g}, product {m.net_loss_e_product:.3g}"
            )
        if m.margin_e_mean is not None:
            lines.append(
                f"{name}: margin e-value over {m.margin_sidecars} sidecars: mean "
                f"{m.margin_e_mean:.3g}, product {m.margin_e_product:.3g}; "
                f"{m.sidecars} sidecars with pairs"
            )
    if stats.bad_series:
        lines.append(f"skipped series: {dict(stats.bad_series)}")
    return "\n".join(lines)


async def _once(q: FleetQuery) -> FleetStats:
    import aiohttp

    from specwatch.tools.fleet.server import query_fleet

    async with aiohttp.ClientSession() as session:
        return await query_fleet(session, q, now=time.time())


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--listen: need HOST:PORT, got {text!r}")
    return host or "0.0.0.0", int(port)


def main(args: argparse.Namespace) -> int:
    """Print the fleet statistics once, or serve them with ``--listen``; 0 ok, 1 when
    Prometheus cannot be queried, 2 on a bad flag."""
    try:
        if not 0.0 < args.alpha < 0.5:
            raise ValueError("--alpha must be in (0, 0.5)")
        if not 0.0 <= args.margin < 1.0:
            raise ValueError("--margin must be in [0, 1)")
        timeout = parse_duration(args.timeout)
        interval = parse_duration(args.interval)
        listen = _listen(args.listen) if args.listen else None
    except ValueError as exc:
        print(f"specwatch fleet: {exc}", file=sys.stderr)
        return 2
    from aiohttp import web

    from specwatch.shadow.summary import Levels
    from specwatch.tools.fleet.server import FleetQuery, build_fleet_app
    from specwatch.tools.fleet.stats import fleet_json
    from specwatch.tools.prom_api import PromApiError

    q = FleetQuery(
        prometheus_url=args.prometheus_url,
        matchers=args.selector,
        model_label=args.model_label,
        replica_labels=DEFAULT_REPLICA_LABELS
        if args.replica_label is None
        else tuple(label for label in args.replica_label if label),
        levels=Levels(alpha=args.alpha, margin=args.margin),
        timeout=timeout,
    )
    setup_logging(args.log_level, args.log_format)
    if listen is not None:
        app = build_fleet_app(q, interval=interval, wall_clock=SYSTEM_WALL)
        stopped_by = StopSignal()
        loop = asyncio.new_event_loop()

        def on_signal(sig: signal.Signals) -> None:
            stopped_by.note(sig)
            raise web.GracefulExit  # run_app's own way out: its cleanup runs

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal, sig)
        try:
            web.run_app(
                app,
                host=listen[0],
                port=listen[1],
                print=None,
                access_log=None,
                handle_signals=False,  # ours above: they note which signal came
                loop=loop,
            )
        except OSError as exc:
            print(f"specwatch fleet: cannot listen on {args.listen}: {exc}", file=sys.stderr)
            return 2
        stopped_by.end()  # Ctrl-C: the entry point's one line and exit 130; SIGTERM: 0
        return 0
    try:
        stats = asyncio.run(_once(q))
    except PromApiError as exc:
        print(f"specwatch fleet: prometheus query failed: {exc}", file=sys.stderr)
        return 1
    doc: dict[str, Any] = fleet_json(stats)
    print(json.dumps(doc, indent=2) if output_format(args.format) == "json" else _table(stats))
    return 0
