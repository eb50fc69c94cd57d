"""``specwatch record``: save running servers' ``/metrics`` as the timelines ``replay`` reads.

    specwatch record --target standard=http://127.0.0.1:8000 --out timeline/ --duration 5m

``--target NAME=URL`` (repeatable; a base URL gets ``/metrics``, as in ``run``) is scraped
every ``--interval`` seconds (default 1) until ``--duration`` passes or Ctrl-C. Each body is
written to ``OUT/NAME/<seconds since start>.prom`` (``.om`` when the server answered
OpenMetrics), the layout ``specwatch replay --target NAME=OUT/NAME`` reads. A failed scrape
writes nothing (replay sees a gap, as ``run`` would); the first failure of each target is
one line on stderr (and recording goes on). The last line counts the bodies per target and
gives the replay command. Exit 2 with one line for a bad flag or an ``OUT`` that cannot be
written; 1 when a target gave no body at all (one line per such target, with why its last
scrape failed); 0 otherwise. Ctrl-C stops it the same way (the bodies counted, the replay
command given) and then ends it as Ctrl-C ends every command: one line
``specwatch record: interrupted`` and exit 130 (SIGTERM: the exit code above).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from specwatch.cli.args import add_described_command
from specwatch.core.clock import SYSTEM_MONOTONIC, MonotonicClock
from specwatch.core.config import parse_duration
from specwatch.core.shutdown import StopSignal
from specwatch.observe.prefilter import OPENMETRICS_CONTENT_TYPE


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``record``."""
    p = add_described_command(
        subparsers,
        "record",
        help="save running servers' /metrics as timelines for replay",
        description=__doc__,
    )
    p.add_argument(
        "--target",
        action="append",
        required=True,
        metavar="NAME=URL",
        help="a server to scrape; repeat per server",
    )
    p.add_argument("--out", type=Path, required=True, metavar="DIR", help="where to write")
    p.add_argument("--interval", type=float, default=1.0, metavar="S", help="seconds between")
    p.add_argument("--duration", metavar="D", help="stop after D (20, 30s, 5m); default Ctrl-C")
    p.set_defaults(handler=main)


def body_name(t: float, content_type: str) -> str:
    """The file name of a body scraped ``t`` seconds after the start: ``12.000.prom``, or
    ``.om`` for an OpenMetrics answer."""
    suffix = ".om" if content_type.startswith(OPENMETRICS_CONTENT_TYPE.split(";")[0]) else ".prom"
    return f"{t:.3f}{suffix}"


async def record(
    targets: Mapping[str, str],
    out: Path,
    *,
    interval: float,
    duration: float | None,
    stop: asyncio.Event,
    mono_clock: MonotonicClock = SYSTEM_MONOTONIC,
    failed: dict[str, str] | None = None,
) -> dict[str, int]:
    """Scrape every ``targets`` name → metrics URL each ``interval`` s into ``out/NAME/``
    until ``duration`` s passed or ``stop`` is set (the directories are created; raises
    ``OSError`` when they cannot be); returns the bodies written per name. ``failed`` (when
    given) gets, per name, why its latest failed scrape failed; the first failure of a name is
    one line on stderr."""
    written = dict.fromkeys(targets, 0)
    failed = {} if failed is None else failed
    for name in targets:
        await asyncio.to_thread((out / name).mkdir, parents=True, exist_ok=True)
    started = mono_clock()
    import aiohttp  # loads when recording, not for ``record --help``

    timeout = aiohttp.ClientTimeout(total=max(0.5, interval * 0.9))
    async with aiohttp.ClientSession(timeout=timeout) as session:

        def miss(name: str, url: str, reason: str) -> None:
            if name not in failed:
                print(
                    f"specwatch record: {name}: {url}: {reason}; still trying every {interval:g} s",
                    file=sys.stderr,
                    flush=True,
                )
            failed[name] = reason

        async def one(name: str, url: str, t: float) -> None:
            try:
                async with session.get(url) as resp:
                    if resp.status != 200:
                        miss(name, url, f"HTTP {resp.status}")
                        return
                    body = await resp.read()
                    ctype = resp.headers.get("Content-Type", "text/plain")
            except TimeoutError:
                miss(name, url, f"no answer within {timeout.total:g} s")
                return
            except aiohttp.ClientError as exc:
                miss(name, url, _reason(exc))
                return
            path = out / name / body_name(t, ctype)
            await asyncio.to_thread(path.write_bytes, body)
            written[name] += 1

        tick = 0
        while not stop.is_set():
            t = mono_clock() - started
            if duration is not None and t > duration:
                break
            await asyncio.gather(*(one(n, u, t) for n, u in targets.items()))
            tick += 1
            wait = started + tick * interval - mono_clock()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, wait))
    return written


def replay_command(out: Path, names: Sequence[str]) -> str:
    """The ``specwatch replay`` command line that reads what :func:`record` wrote."""
    return "specwatch replay " + " ".join(f"--target {n}={out / n}" for n in names)


async def _run(
    targets: Mapping[str, str],
    out: Path,
    interval: float,
    dur: float | None,
    stopped_by: StopSignal,
) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def on_signal(sig: signal.Signals) -> None:
        stopped_by.note(sig)
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    failed: dict[str, str] = {}
    written = await record(targets, out, interval=interval, duration=dur, stop=stop, failed=failed)
    counts = ", ".join(f"{n} {c:,}" for n, c in written.items())
    print(f"specwatch record: bodies written: {counts}")
    empty = [n for n, c in written.items() if c == 0]
    for name in empty:
        why = failed.get(name, "no scrape finished")
        print(
            f"specwatch record: {name}: no body recorded from {targets[name]} ({why})",
            file=sys.stderr,
        )
    if len(empty) < len(written):
        print(f"  replay them: {replay_command(out, [n for n in targets if n not in empty])}")
    return 1 if empty else 0


def _reason(exc: BaseException) -> str:
    """A short why for a failed scrape: the OS error's words (``connection refused``), else
    the exception's text or class."""
    cause = getattr(exc, "os_error", None) or exc.__cause__
    if isinstance(cause, OSError) and cause.errno:
        return os.strerror(cause.errno).lower()
    return str(exc) or type(exc).__name__


def main(args: argparse.Namespace) -> int:
    """Record until the duration or Ctrl-C; 2 on a bad flag or an unwritable ``--out``."""
    from specwatch.settings import ConfigError, load_settings, parse_target_spec

    try:
        if not (args.interval > 0):
            raise ConfigError("--interval must be a positive number of seconds")
        specs = [parse_target_spec(s) for s in args.target]
        for spec in specs:  # the role does not matter to a recording
            spec.setdefault("role", "standard")
        settings = load_settings(overrides={"targets": specs}, only=())
        dur = parse_duration(args.duration) if args.duration is not None else None
        targets = {t.name: t.url for t in settings.targets}
        for name in targets:
            (args.out / name).mkdir(parents=True, exist_ok=True)
    except (ConfigError, ValueError) as exc:
        print(f"specwatch record: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"specwatch record: --out {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    stopped_by = StopSignal()
    code = asyncio.run(_run(targets, args.out, args.interval, dur, stopped_by))
    stopped_by.end()  # Ctrl-C: after the summary, the entry point's one line and exit 130
    return code
