"""``specwatch bench-result FILE...``: the minimum speculative-decoding table from ``vllm bench
serve`` result files (``--save-result``; one JSON object, or one per line with
``--append-result``).

One row per run and concurrency: aggregate output throughput (tokens/s, a server number),
per-user tokens/s (1000 / TPOT: p50, and p90 of TPOT = the slowest tenth of users), TTFT and ITL
p50/p90/p99 in ms (run the bench with ``--metric-percentiles 50,90,99``; a missing percentile is
shown as ``n/a``), the acceptance rate and mean acceptance length τ that ``vllm bench serve``
reads from the server's ``/metrics`` (absent without speculative decoding), and the sampling
parameters. ``vllm bench serve`` does not write the sampling parameters it sent into the result;
record them with ``--metadata temperature=0 top_p=1``. A parameter not recorded is shown as not
sent: the server then uses the model's ``generation_config.json`` or vLLM's neutral default
(shown in brackets).

Exit 0, or 2 on an unreadable file or a result without the fields above (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specwatch.cli.args import add_described_command, add_output_format, output_format
from specwatch.core.config import read_bounded
from specwatch.core.helptext import plain_help

#: vLLM's neutral sampling defaults (SamplingParams) used when neither the request nor the
#: model's generation config sets a parameter.
VLLM_NEUTRAL_DEFAULTS: Mapping[str, float] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "min_p": 0.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
    "repetition_penalty": 1.0,
}

PERCENTILES = ("50", "90", "99")


class InputError(ValueError):
    """An unreadable or unusable result file (one line, exit code 2)."""


@dataclass(frozen=True, slots=True)
class BenchRow:
    """One run at one concurrency. Throughputs in tokens/s, latencies in ms; ``None`` when the
    result does not have it. ``acceptance_rate`` is a fraction; ``sampling[name]`` is the
    recorded value or ``None`` (not sent)."""

    run: str
    max_concurrency: int | None
    request_rate: str
    completed: int
    output_throughput: float
    per_user_tps_p50: float | None
    per_user_tps_p90: float | None
    ttft_ms: dict[str, float | None]
    itl_ms: dict[str, float | None]
    acceptance_rate: float | None
    acceptance_length: float | None
    sampling: dict[str, float | str | None]


def _num(doc: Mapping[str, Any], key: str) -> float | None:
    v = doc.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v):
        return None
    return float(v)


def _percentile(doc: Mapping[str, Any], metric: str, p: str) -> float | None:
    value = _num(doc, f"p{p}_{metric}_ms")
    if value is None and p == "50":
        value = _num(doc, f"median_{metric}_ms")
    return value


def bench_row(doc: Mapping[str, Any], run: str) -> BenchRow:
    """The table row of one ``vllm bench serve`` result object. Raises :class:`InputError` when
    the object is not a generation benchmark result (no ``output_throughput``)."""
    throughput = _num(doc, "output_throughput")
    if throughput is None:
        raise InputError(f"{run}: not a vllm bench serve generation result (no output_throughput)")
    tpot50 = _percentile(doc, "tpot", "50")
    tpot90 = _percentile(doc, "tpot", "90")
    rate = _num(doc, "spec_decode_acceptance_rate")
    conc = doc.get("max_concurrency")
    sampling: dict[str, float | str | None] = {}
    for name in VLLM_NEUTRAL_DEFAULTS:
        v = doc.get(name)
        sampling[name] = v if isinstance(v, int | float | str) and not isinstance(v, bool) else None
    return BenchRow(
        run=run,
        max_concurrency=conc if isinstance(conc, int) and not isinstance(conc, bool) else None,
        request_rate=str(doc.get("request_rate", "inf")),
        completed=int(_num(doc, "completed") or 0),
        output_throughput=throughput,
        per_user_tps_p50=1000.0 / tpot50 if tpot50 else None,
        per_user_tps_p90=1000.0 / tpot90 if tpot90 else None,
        ttft_ms={p: _percentile(doc, "ttft", p) for p in PERCENTILES},
        itl_ms={p: _percentile(doc, "itl", p) for p in PERCENTILES},
        acceptance_rate=None if rate is None else rate / 100.0,
        acceptance_length=_num(doc, "spec_decode_acceptance_length"),
        sampling=sampling,
    )


#: Largest result file read (kilobytes per run; a device or runaway file is refused).
MAX_RESULT_BYTES = 64 << 20


def read_results(path: Path) -> list[BenchRow]:
    """Rows of a result file: one JSON object, or JSON lines (``--append-result``). The run is
    named by the result's ``label`` or the file name, plus ``date``. Raises :class:`InputError`."""
    try:
        text = read_bounded(path, MAX_RESULT_BYTES).decode("utf-8")
    except (OSError, ValueError) as exc:  # ValueError: not UTF-8, or past MAX_RESULT_BYTES
        raise InputError(f"{path}: cannot read: {exc}") from None
    docs: list[Any]
    try:
        docs = [json.loads(text)]
    except RecursionError:
        raise InputError(f"{path}: invalid JSON: nested too deep") from None
    except json.JSONDecodeError:
        docs = []
        for lineno, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    docs.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise InputError(f"{path}:{lineno}: invalid JSON: {exc.msg}") from exc
                except RecursionError:
                    raise InputError(f"{path}:{lineno}: invalid JSON: nested too deep") from None
    rows = []
    for i, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise InputError(f"{path}: result {i + 1} is not a JSON object")
        name = str(doc.get("label") or path.name)
        if doc.get("date"):
            name += f" @ {doc['date']}"
        rows.append(bench_row(doc, name))
    if not rows:
        raise InputError(f"{path}: no results")
    return rows


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def format_table(rows: list[BenchRow]) -> str:
    """The printed table: one block per run and concurrency."""
    out: list[str] = []
    for r in sorted(rows, key=lambda r: (r.run, r.max_concurrency or 0)):
        conc = "unlimited" if r.max_concurrency is None else str(r.max_concurrency)
        sampling = ", ".join(
            f"{k}={v}" if v is not None else f"{k} not sent [{VLLM_NEUTRAL_DEFAULTS[k]:g}]"
            for k, v in r.sampling.items()
        )
        lines = [
            ("run", r.run),
            ("concurrency / request rate", f"{conc} / {r.request_rate}"),
            ("completed requests", str(r.completed)),
            ("output throughput (tok/s, all users)", _f(r.output_throughput)),
            (
                "per-user tok/s (p50 / p90 slowest)",
                f"{_f(r.per_user_tps_p50)} / {_f(r.per_user_tps_p90)}",
            ),
            ("TTFT ms p50 / p90 / p99", " / ".join(_f(r.ttft_ms[p]) for p in PERCENTILES)),
            ("ITL ms p50 / p90 / p99", " / ".join(_f(r.itl_ms[p]) for p in PERCENTILES)),
            (
                "acceptance rate",
                "n/a (no spec decode metrics)"
                if r.acceptance_rate is None
                else f"{100 * r.acceptance_rate:.1f}%",
            ),
            ("mean acceptance length tau", _f(r.acceptance_length, "{:.2f}")),
            ("sampling", sampling),
        ]
        width = max(len(k) for k, _ in lines)
        out.append("\n".join(f"{k:<{width}}  {v}" for k, v in lines))
    return "\n\n".join(out)


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``bench-result``."""
    p = add_described_command(
        subparsers,
        "bench-result",
        help="the minimum spec-decode table from vllm bench serve result files",
        description=plain_help(__doc__ or ""),
    )
    p.add_argument("files", type=Path, nargs="+", metavar="FILE")
    add_output_format(p)
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    """Print the table (or JSON rows); 0, or 2 on bad input."""
    try:
        rows = [row for path in args.files for row in read_results(path)]
    except InputError as exc:
        print(f"specwatch bench-result: {exc}", file=sys.stderr)
        return 2
    if output_format(args.format) == "json":
        print(json.dumps([asdict(r) for r in rows], indent=2))
    else:
        print(format_table(rows))
    return 0
