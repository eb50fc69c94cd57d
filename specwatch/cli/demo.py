"""``specwatch demo``: a standard and a FLy simulator, live traffic and the sidecar (no GPU).

Prints the URLs to open and a live view every ~2 s (plain text when stdout is not a terminal;
none with ``--no-ui``). Ctrl-C, SIGTERM or the end of ``--duration`` stops everything; exit 0
(130 after Ctrl-C, with ``specwatch demo: interrupted`` last on stderr).
Exit 2 with one line on stderr for a bad flag or a port that cannot be bound.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import TextIO, cast

from specwatch.cli.args import add_described_command
from specwatch.core.config import parse_duration
from specwatch.core.logs import setup_logging
from specwatch.demo.config import DEFAULT_PORT, DemoConfig, simulator_configs

_DESCRIPTION = """\
Run a standard and a FLy simulated vLLM server, live traffic to both and the specwatch sidecar
(scraping, shadow pairing with paired statistics, alerting), all in this process (no GPU).
Prints the URLs to open and a live view every ~2 s (plain text when stdout is not a terminal;
none with --no-ui). Ctrl-C, SIGTERM or the end of --duration
stops everything; exit 0 (130 after Ctrl-C). See docs/demo.md.
"""


#: The variable ``specwatch run`` takes its port from; the demo's sidecar honours it too.
PORT_VARIABLE = "SPECWATCH_SERVER__PORT"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``demo``."""
    p = add_described_command(
        subparsers,
        "demo",
        help="run a simulated standard + FLy pair with live traffic and the sidecar (no GPU)",
        description=_DESCRIPTION,
    )
    p.add_argument(
        "--duration",
        metavar="DURATION",
        help="stop after this long (e.g. 20, 30s, 5m); default: until Ctrl-C",
    )
    p.add_argument(
        "--port",
        type=int,
        metavar="N",
        help=f"sidecar port (default ${PORT_VARIABLE}, else {DEFAULT_PORT} or a free port when "
        "taken; 0 = free port)",
    )
    p.add_argument(
        "--host", default="127.0.0.1", metavar="H", help="listen address of every server"
    )
    p.add_argument("--no-ui", action="store_true", help="print the URLs only, no live view")
    p.add_argument(
        "--data-parallel-size", type=int, default=2, metavar="N", help="engines per simulator"
    )
    p.add_argument("--max-num-seqs", type=int, default=16, metavar="N", help="per engine")
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=512,
        metavar="B",
        help="token budget per engine step (below N x (K + 1) = 80: a budget-bound server)",
    )
    p.add_argument(
        "--concurrency", type=int, default=40, metavar="N", help="requests in flight (each to both)"
    )
    p.add_argument(
        "--rate",
        type=float,
        default=60.0,
        metavar="R",
        help="requests per second (0 = closed loop)",
    )
    p.add_argument(
        "--fly-entropy-threshold", type=float, default=0.3, metavar="T", help="FLy threshold, nats"
    )
    p.add_argument("--seed", type=int, default=0, metavar="N")
    p.add_argument(
        "--ledger",
        metavar="PATH",
        help="keep the shadow ledger (SQLite) at PATH for `specwatch report` "
        "(default: a temporary file removed at exit)",
    )
    p.add_argument(
        "--alertmanager-url",
        action="append",
        metavar="URL",
        help="also send the alerts to this Alertmanager (repeat for several)",
    )
    p.add_argument(
        "--shadow-sample",
        type=float,
        default=0.1,
        metavar="P",
        help="share of the mirrored live requests replayed through the arms (0..1)",
    )
    p.add_argument(
        "--canary-rate",
        type=float,
        default=6.0,
        metavar="R",
        help="canary questions (with gold answers) replayed per second",
    )
    p.add_argument(
        "--no-shadow", action="store_true", help="no shadow sampling, paired statistics or ledger"
    )
    p.add_argument("--no-alerts", action="store_true", help="no alert detectors")
    p.set_defaults(handler=main)


def config_from_args(args: argparse.Namespace) -> DemoConfig:
    """Build a :class:`DemoConfig` from the flags; ``ValueError`` with one line when bad."""
    duration = None
    if args.duration is not None:
        duration = parse_duration(args.duration)
        if duration <= 0:
            raise ValueError("--duration must be longer than 0 s")
    port = args.port if args.port is not None else _port_from_environment()
    if port is not None and not 0 <= port <= 65535:
        raise ValueError("--port must be 0..65535")
    if args.concurrency < 1:
        raise ValueError("--concurrency must be at least 1")
    if args.rate < 0:
        raise ValueError("--rate must be >= 0")
    if not 0.0 <= args.shadow_sample <= 1.0:
        raise ValueError("--shadow-sample must be in [0, 1]")
    if args.canary_rate <= 0:
        raise ValueError("--canary-rate must be > 0")
    urls = tuple(args.alertmanager_url or ())
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"--alertmanager-url must be http(s)://...: {url!r}")
    if args.ledger is not None:
        ledger = Path(args.ledger)
        if not args.ledger.strip() or ledger.is_dir():
            raise ValueError(f"--ledger must be a file path: {args.ledger!r}")
        if not ledger.parent.is_dir():
            raise ValueError(f"--ledger: directory {str(ledger.parent)!r} does not exist")
    cfg = DemoConfig(
        duration_s=duration,
        host=args.host,
        port=port,
        data_parallel_size=args.data_parallel_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        fly_entropy_threshold=args.fly_entropy_threshold,
        concurrency=args.concurrency,
        rate=args.rate or None,
        seed=args.seed,
        ui=not args.no_ui,
        shadow=not args.no_shadow,
        shadow_sample=args.shadow_sample,
        canary_rate=args.canary_rate,
        ledger_path=args.ledger,
        alerts=not args.no_alerts,
        alertmanager_urls=urls,
    )
    simulator_configs(cfg)  # SimConfig.validate(): one sentence when the shape is invalid
    return cfg


def _port_from_environment() -> int | None:
    """``SPECWATCH_SERVER__PORT`` as the sidecar's port when set (``--port`` wins); a
    ``ValueError`` naming the variable when it is not a port number."""
    text = os.environ.get(PORT_VARIABLE, "").strip()
    if not text:
        return None
    if not text.isdigit() or not 0 <= int(text) <= 65535:
        raise ValueError(f"{PORT_VARIABLE}={text!r}: not a port number (0..65535)")
    return int(text)


def ledger_problem(path: str) -> str | None:
    """Why the ledger file at ``path`` cannot be opened or created as SQLite (in words), or
    ``None`` when it can. Blocking; checked before anything starts, so an unwritable ``--ledger``
    is one line and exit 2 rather than a demo that records nothing."""
    import sqlite3

    from specwatch.shadow.ledger.files import check_openable, path_problem

    try:
        check_openable(path)
    except sqlite3.Error as exc:
        return path_problem(path) or str(exc)
    return None


class _CurrentStderr:
    """A text stream writing to whatever ``sys.stderr`` is at the time of the write."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def main(args: argparse.Namespace) -> int:
    """Run the demo; 0 after a clean stop, 2 on a bad flag or an unusable port; after Ctrl-C
    (the same clean stop) :class:`KeyboardInterrupt`, for the entry point's line and 130."""
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        print(f"specwatch demo: {exc}", file=sys.stderr)
        return 2
    if cfg.shadow and cfg.ledger_path is not None:
        problem = ledger_problem(cfg.ledger_path)
        if problem is not None:
            print(f"specwatch demo: --ledger {cfg.ledger_path}: {problem}", file=sys.stderr)
            return 2
    # Logs go to stderr; looked up at each write, so under the live view (which redirects
    # stderr) a warning prints above the view instead of tearing it.
    setup_logging("WARNING", "plain", stream=cast(TextIO, _CurrentStderr()))
    from specwatch.core.shutdown import StopSignal
    from specwatch.demo.run import run_demo  # the server and simulator stacks load only here
    from specwatch.settings import ConfigError

    stopped_by = StopSignal()
    try:
        code = asyncio.run(
            run_demo(cfg, out=sys.stdout, tty=sys.stdout.isatty(), stopped_by=stopped_by)
        )
    except ConfigError as exc:  # e.g. a bad SPECWATCH_* environment value
        print(f"specwatch demo: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # stdout's reader left (``| head``): the entry point ends quietly
        raise
    except OSError as exc:
        port = DEFAULT_PORT if cfg.port is None else cfg.port
        print(f"specwatch demo: cannot listen on {args.host}:{port}: {exc}", file=sys.stderr)
        return 2
    stopped_by.end()  # Ctrl-C: after the same clean stop, the entry point's line and exit 130
    return code
