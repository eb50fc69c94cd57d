"""``specwatch analyze BEFORE [AFTER]``: the same derivations offline from saved ``/metrics``.

One body: totals since server start. Two bodies: the window between them (restarts handled).
``--interval SECONDS`` gives rates per second. vLLM and SGLang pages are told apart by their
series (``--engine`` to say which); ``--server-info FILE`` reads a saved SGLang ``/server_info``
body for N (``speculative_num_draft_tokens``) where the page does not show it. On a terminal
it prints a table at most 80 columns wide; in a pipe, or with ``--format json``, JSON:
``{"server": {...}, "engines": {"0": {...}}}`` for one model (keys in ``docs/metrics.md``), or
``{"models": {NAME: {"server": ..., "engines": ...}}}`` for several; ``null`` where undefined.
An unreadable or malformed file, a file with neither vLLM nor SGLang series or a bad
``--interval``: exit code
2 and one line (naming the file and the line where there is one). Counters falling on every
engine of one server process (files likely swapped): one warning line on stderr.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, cast

from specwatch.cli.args import add_output_format, output_format
from specwatch.core.config import read_bounded
from specwatch.export.json import health_json
from specwatch.observe.health import model_windows
from specwatch.observe.parse import ParseError, parse_page
from specwatch.observe.values import ModelWindow, PageReading
from specwatch.observe.window import page_delta
from specwatch.vllm.sglang import ENGINE_KINDS, EngineKind, server_info_facts

#: The one line for a page that no serving engine wrote.
NO_ENGINE_SERIES = "has neither vllm:* nor sglang:* series (not a vLLM or SGLang /metrics body?)"


class AnalyzeError(Exception):
    """One line for stderr."""


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``analyze``."""
    p = subparsers.add_parser(
        "analyze",
        help="derive spec-decode health from saved /metrics bodies",
        description="Derive α, τ, per-position acceptance, rates and quantiles from one or two "
        "saved vLLM or SGLang /metrics bodies (two: the window between them).",
    )
    p.add_argument(
        "--engine", choices=ENGINE_KINDS, help="the engine that wrote the pages (default: told)"
    )
    p.add_argument(
        "--server-info",
        type=Path,
        metavar="FILE",
        help="a saved SGLang /server_info JSON body (N = speculative_num_draft_tokens)",
    )
    p.add_argument("before", metavar="BEFORE")
    p.add_argument("after", nargs="?", metavar="AFTER")
    p.add_argument("--interval", type=float, metavar="SECONDS", help="seconds between the bodies")
    add_output_format(p)
    p.add_argument("--model", help="model_name to report when a page serves several")
    p.set_defaults(handler=main)


def read_server_info(path: Path) -> dict[str, int | str | None]:
    """The facts of a saved SGLang ``/server_info`` body
    (:func:`specwatch.vllm.sglang.server_info_facts`); :class:`AnalyzeError` names the file."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise AnalyzeError(f"{path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AnalyzeError(f"{path}: not a JSON /server_info body ({exc})") from None
    if not isinstance(doc, dict):
        raise AnalyzeError(f"{path}: not a JSON object (an SGLang /server_info body?)")
    return server_info_facts(cast(dict[str, object], doc))


#: Largest saved /metrics body read (a real page is at most a few MiB; a device such as
#: ``/dev/zero`` or a runaway file is refused instead of filling the memory).
MAX_PAGE_BYTES = 64 << 20


def read_page(path: Path | str, engine: EngineKind | None = None) -> PageReading:
    """Read and parse one saved body; :class:`AnalyzeError` names the file (and line). A URL
    is refused with how to save its body (these commands read saved files)."""
    if isinstance(path, str):
        if path.startswith(("http://", "https://")):
            raise AnalyzeError(
                f"{path}: a URL; this command reads saved /metrics files: save one with "
                f"`curl -s {path} > page.txt` (or a timeline with `specwatch record`)"
            )
        path = Path(path)
    try:
        raw = read_bounded(path, MAX_PAGE_BYTES)
        text = raw.decode("utf-8")
    except OSError as exc:
        raise AnalyzeError(f"{path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise AnalyzeError(f"{path}:{line}: not UTF-8 text") from None
    except ValueError as exc:  # past MAX_PAGE_BYTES
        raise AnalyzeError(f"{path}: {exc}") from None
    try:
        return parse_page(text, engine=engine)
    except ParseError as exc:
        where = f"{path}:{exc.line}" if exc.line else str(path)
        raise AnalyzeError(f"{where}: {exc.message}") from None


def require_engines(page: PageReading, path: Path | str) -> None:
    """Raise :class:`AnalyzeError` naming ``path`` unless ``page`` has an engine's series: a
    page whose vllm:*/sglang:* samples were all skipped (NaN, ±Inf, ...) says so."""
    if page.engines:
        return
    skipped = page.implausible_series + page.invalid_series
    if skipped:
        first = (page.implausible + page.invalid)[:1]
        example = f", e.g. {first[0]}" if first else ""
        raise AnalyzeError(
            f"{path}: every vllm:*/sglang:* sample was skipped ({skipped} with a value no "
            f"server writes{example})"
        )
    raise AnalyzeError(f"{path} {NO_ENGINE_SERIES}")


def looks_swapped(before: PageReading, after: PageReading) -> bool:
    """True when the same server process (same ``process_start_time_seconds``) shows a counter
    drop on every engine of both pages: the files are likely in the wrong order. (An engine
    restart inside a running server, as the simulator's restart fault does, looks the same, so
    this is a warning, and the window is still computed as after a restart.)"""
    start = before.process_start_time_seconds
    if start is None or start != after.process_start_time_seconds:
        return False
    common = [k for k in after.engines if k in before.engines]
    return bool(common) and all(
        any(
            v < before.engines[k].counters.get(name, v)
            for name, v in after.engines[k].counters.items()
        )
        for k in common
    )


def _model_doc(mw: ModelWindow) -> dict[str, Any]:
    return {
        "server": health_json(mw.server),
        "engines": {e: health_json(h) for e, h in mw.engines.items()},
    }


def analyze(
    before: PageReading,
    after: PageReading | None,
    *,
    interval: float | None,
    model: str | None,
    configured_k: int | None = None,
) -> dict[str, Any]:
    """The JSON document for one body (``after`` None) or the window between two.

    ``configured_k``: K (an SGLang server's N − 1) where the pages do not show it.
    :class:`AnalyzeError` when a page has neither vLLM nor SGLang series or ``interval`` is not
    a positive finite number.
    """
    if interval is not None and not (math.isfinite(interval) and interval > 0):
        raise AnalyzeError(f"--interval must be a positive number of seconds, not {interval}")
    for page, which in ((before, "BEFORE"), (after, "AFTER")):
        if page is not None and not page.engines:
            raise AnalyzeError(f"{which} {NO_ENGINE_SERIES}")
    if after is None:
        models = model_windows(page_delta(None, before, interval), configured_k=configured_k)
    else:
        models = model_windows(page_delta(before, after, interval), configured_k=configured_k)
    if model is not None:
        if model not in models:
            raise AnalyzeError(f"model {model!r} not on the page (have: {', '.join(models)})")
        return {"model_name": model, **_model_doc(models[model])}
    if len(models) == 1:
        name, mw = next(iter(models.items()))
        return {"model_name": name, **_model_doc(mw)}
    return {"models": {name: _model_doc(mw) for name, mw in models.items()}}


def _fmt(value: Any) -> str:
    """One cell: ``-`` for undefined, numbers of 1,000 or more with thousands separators and
    no decimals, smaller ones to 4 significant digits, lists space-separated."""
    if value is None or value == "" or value == []:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int | float):
        if not math.isfinite(value):
            return "-"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.4g}"
    if isinstance(value, list):
        return " ".join(_short(v) for v in value)
    if isinstance(value, dict):
        return " ".join(f"{k}={_short(v)}" for k, v in value.items()) or "-"
    return str(value)


def _short(value: Any) -> str:
    """A list or mapping item: 3 significant digits (``-`` when undefined)."""
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.3g}"
    return _fmt(value)


#: The widest line :func:`render_table` writes.
TABLE_WIDTH = 80


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def render_table(doc: dict[str, Any], width: int = TABLE_WIDTH) -> str:
    """A plain text table at most ``width`` columns wide: one row per key, columns server and
    each engine, right-aligned, two spaces apart; columns that do not fit side by side go to a
    block of their own below, and a cell wider than the room left is cut with ``…``."""
    parts: list[str] = []
    models = doc.get("models") or {doc.get("model_name", ""): doc}
    for name, md in models.items():
        columns = [("server", md["server"])] + [
            (f"engine {e}", h) for e, h in md["engines"].items()
        ]
        keys = list(md["server"])
        kw = min(max(len(k) for k in keys), width // 2)
        room = width - kw - 2
        cells = [[_cut(_fmt(h.get(k)), room) for k in keys] for _, h in columns]
        widths = [
            max(len(c), *(len(v) for v in col)) for (c, _), col in zip(columns, cells, strict=True)
        ]
        parts.append(f"model {name}")
        blocks: list[list[int]] = [[]]
        used = 0
        for i, w in enumerate(widths):
            if blocks[-1] and used + 2 + w > room:
                blocks.append([])
                used = 0
            blocks[-1].append(i)
            used += w + (2 if used else 0)
        for b, block in enumerate(blocks):
            if b:
                parts.append("")
            header = [" " * kw] + [columns[i][0].rjust(widths[i]) for i in block]
            parts.append("  ".join(header).rstrip())
            for r, k in enumerate(keys):
                row = [cells[i][r].rjust(widths[i]) for i in block]
                parts.append("  ".join([_cut(k, kw).ljust(kw), *row]))
    return "\n".join(parts)


def main(args: argparse.Namespace) -> int:
    """Print the analysis; 2 on an unreadable/malformed file or an unknown model."""
    try:
        engine: EngineKind | None = args.engine
        k: int | None = None
        if args.server_info is not None:
            engine = engine or "sglang"
            n = read_server_info(args.server_info)["num_draft_tokens"]
            k = n - 1 if isinstance(n, int) and n >= 2 else None
        before = read_page(args.before, engine)
        after = read_page(args.after, engine) if args.after is not None else None
        require_engines(before, args.before)
        if after is not None:
            require_engines(after, args.after)
        doc = analyze(before, after, interval=args.interval, model=args.model, configured_k=k)
    except AnalyzeError as exc:
        print(f"specwatch analyze: {exc}", file=sys.stderr)
        return 2
    if after is not None and looks_swapped(before, after):
        print(
            "specwatch analyze: warning: counters fall on every engine while"
            " process_start_time_seconds is unchanged; read as an engine restart"
            " (is BEFORE newer than AFTER?)",
            file=sys.stderr,
        )
    if output_format(args.format) == "json":
        print(json.dumps(doc, indent=2, allow_nan=False))
    else:
        print(render_table(doc))
    return 0
