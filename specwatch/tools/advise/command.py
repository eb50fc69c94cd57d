"""``specwatch advise BEFORE [AFTER]``: which K and token budget to run, from saved ``/metrics``.

Reads pages as ``specwatch analyze`` does (one body: totals since start; two: the window between
them). From the per-position acceptance of the window, τ for every K' <= K is exact; with
``--max-num-seqs``, ``--max-num-batched-tokens`` and ``--method`` each K' also gets the
scheduler limits of that vLLM version and the expected tokens per step at the observed
concurrency and the observed coverage (a step without a proposal, ngram or suffix finding
nothing, emits 1 token, not τ). Limits, concurrency and tokens per step are per engine
(each engine has its own scheduler); the acceptance rates are the server's (summed over
engines). Output (``--format json``): ``{"model_name", "drafts", "num_speculative_tokens",
"per_position_acceptance_rate", "speculation_coverage", "step_coverage", "concurrency",
"limits", "by_k": [...], "advice": [...],
"assumptions": [...], "speculation_limit"}``; ``speculation_limit`` (``null`` unless
``--standard-series`` and ``--fly-series`` are given: saved pages of each server,
``--series-interval`` seconds apart) says from how many running requests FLy decodes no
faster per request than the server without speculation of ``--baseline-series`` (when given)
and than the standard arm, each comparison labelled: compared per concurrency level seen, with
a 95 % interval that holds for all levels at once, "not reached within the observed range"
unless the gain's interval is below zero at some level (:mod:`specwatch.observe.concurrency`;
the same sentence as the live view and the report). Exit 2 with one
line on an unreadable file, a page without vLLM series,
several models without ``--model``, or bad limits.

An SGLang page (no per-position acceptance) gets what it can tell: τ, α and N draft tokens per
verify step, tokens emitted and verified per step at the concurrency, and with
``--max-num-seqs`` (read as ``--max-running-requests``) SGLang's verify budget; it cannot give τ
for a smaller K, and says so (``by_k`` empty, ``serving_engine`` ``"sglang"``).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from specwatch.cli.analyze import AnalyzeError, read_page, require_engines
from specwatch.cli.args import add_output_format, output_format
from specwatch.core.helptext import plain_help
from specwatch.observe.concurrency import (
    ConcurrencyProfile,
    SpeculationLimit,
    add_point,
    speculation_limit,
)
from specwatch.observe.health import model_windows
from specwatch.observe.values import ModelWindow
from specwatch.observe.window import page_delta
from specwatch.tools.advise.advisor import ASSUMPTIONS, advice, rows_by_k, step_coverage
from specwatch.vllm.methods import SPEC_METHODS, regime_for_version
from specwatch.vllm.sglang import EngineKind


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``advise``."""
    p = subparsers.add_parser(
        "advise",
        help="τ for every smaller K and the token budget per K, from saved /metrics bodies",
        description=plain_help(__doc__ or ""),
    )
    p.add_argument("before", metavar="BEFORE")
    p.add_argument("after", nargs="?", metavar="AFTER")
    p.add_argument("--max-num-seqs", type=int, metavar="N")
    p.add_argument("--max-num-batched-tokens", type=int, metavar="B")
    p.add_argument(
        "--method",
        choices=sorted(SPEC_METHODS),
        metavar="METHOD",
        help="speculative method: " + ", ".join(sorted(SPEC_METHODS)),
    )
    p.add_argument("--vllm-version", metavar="V", help="e.g. 0.33.0 (default: current rules)")
    p.add_argument("--parallel-drafting", action="store_true")
    p.add_argument(
        "--running",
        type=float,
        metavar="R",
        help="concurrency to plan for (default: the page's num_requests_running, max over "
        "engines; max_num_seqs when none are running)",
    )
    p.add_argument(
        "--standard-series",
        type=Path,
        nargs="+",
        metavar="PAGE",
        help="saved /metrics bodies of the standard server, oldest first, --series-interval "
        "apart: with --fly-series, where speculation stops paying",
    )
    p.add_argument(
        "--fly-series", type=Path, nargs="+", metavar="PAGE", help="the same for the FLy server"
    )
    p.add_argument(
        "--baseline-series",
        type=Path,
        nargs="+",
        metavar="PAGE",
        help="the same for a server without speculation: when given, FLy is compared with it "
        "instead of the standard server",
    )
    p.add_argument(
        "--series-interval",
        type=float,
        metavar="S",
        help="seconds between successive series pages (required with the series)",
    )
    p.add_argument("--model", help="model_name to use when a page serves several")
    add_output_format(p)
    p.set_defaults(handler=main)


def _window(args: argparse.Namespace) -> tuple[str, ModelWindow, EngineKind | None]:
    """The model's window of the pages and the engine that wrote them."""
    before = read_page(args.before)
    after = read_page(args.after) if args.after is not None else None
    require_engines(before, args.before)
    if after is not None:
        require_engines(after, args.after)
    kind = (after or before).engine_kind
    models = model_windows(page_delta(before if after else None, after or before, None))
    if args.model is not None:
        if args.model not in models:
            raise AnalyzeError(f"model {args.model!r} not on the page (have: {', '.join(models)})")
        return args.model, models[args.model], kind
    if len(models) != 1:
        raise AnalyzeError(
            f"several models on the page, pick one with --model: {', '.join(models)}"
        )
    name, mw = next(iter(models.items()))
    return name, mw, kind


def series_profile(paths: list[Path], interval: float, model: str | None) -> ConcurrencyProfile:
    """The concurrency profile of saved pages ``interval`` seconds apart: one point per pair of
    successive pages (running requests on the later page, summed over engines; generation
    tokens/s and median ITL of the window between them), as the live tracker adds one per
    scrape. :class:`AnalyzeError` on an unreadable page or an unknown model."""
    profile = ConcurrencyProfile()
    pages = [read_page(p) for p in paths]
    for path, before, after in zip(paths[1:], pages, pages[1:], strict=False):
        models = model_windows(page_delta(before, after, interval))
        name = model if model is not None else (next(iter(models)) if len(models) == 1 else None)
        if name is None or name not in models:
            raise AnalyzeError(f"{path}: pick one model with --model (have: {', '.join(models)})")
        h = models[name].server
        running = sum(e.gauges.get("running", 0.0) for e in after.engines.values())
        profile = add_point(
            profile,
            running,
            h.generation_tokens_per_second,
            h.inter_token_latency_seconds.get(0.5),
        )
    return profile


def limit_doc(args: argparse.Namespace) -> SpeculationLimit | None:
    """Where speculation stops paying, from ``--standard-series`` and ``--fly-series`` and, when
    given, ``--baseline-series`` (compared first) (``None`` when none is given).
    :class:`AnalyzeError` when only one of the first two is, or without an interval."""
    std, fly, base = args.standard_series, args.fly_series, args.baseline_series
    if std is None and fly is None and base is None:
        return None
    if std is None or fly is None:
        raise AnalyzeError("--standard-series and --fly-series go together")
    if args.series_interval is None or args.series_interval <= 0:
        raise AnalyzeError("the series need --series-interval > 0 (seconds between pages)")
    interval, model = args.series_interval, args.model
    return speculation_limit(
        series_profile(std, interval, model),
        series_profile(fly, interval, model),
        baseline=None if base is None else series_profile(base, interval, model),
    )


def advise_doc(name: str, mw: ModelWindow, args: argparse.Namespace) -> dict[str, Any]:
    """The JSON document (see the module docstring); :class:`AnalyzeError` on bad limits."""
    h = mw.server
    n, b = args.max_num_seqs, args.max_num_batched_tokens
    if (n is not None and n <= 0) or (b is not None and b <= 0):
        raise AnalyzeError("--max-num-seqs and --max-num-batched-tokens must be > 0")
    try:
        regime = regime_for_version(args.vllm_version)
    except ValueError as exc:
        raise AnalyzeError(str(exc)) from None
    rates = list(h.per_position_acceptance_rate)
    k = h.num_speculative_tokens
    usable = bool(rates) and all(r is not None for r in rates)
    per_pos = [float(r) for r in rates if r is not None] if usable else []
    running = [e.num_requests_running for e in mw.engines.values()]
    observed = max((r for r in running if r is not None), default=None)
    concurrency = args.running
    note: str | None = None
    label: str | None = (
        None if concurrency is None else f"the planned {concurrency:g} running requests (--running)"
    )
    if concurrency is None:
        if observed:
            concurrency = observed
            label = f"the {observed:g} running requests now"
        elif n is not None:
            concurrency = float(n)
            note = "no requests running on the page: planning for max_num_seqs"
    limits_given = n is not None and b is not None and args.method is not None
    coverage = step_coverage(h.drafts, h.accepted_tokens, h.generation_tokens)
    rows = rows_by_k(
        per_pos,
        max_num_seqs=n,
        max_num_batched_tokens=b,
        method=args.method,
        regime=regime,
        parallel_drafting=args.parallel_drafting,
        concurrency=concurrency,
        coverage=coverage,
    )
    words = advice(
        rows,
        drafts=h.drafts,
        configured_k=k if usable else None,
        max_num_seqs=n,
        max_num_batched_tokens=b,
        concurrency=concurrency,
        concurrency_label=label,
    )
    if note is not None:
        words.append(note)
    if coverage is not None and coverage < 1.0 - 1e-9:
        words.append(
            f"only {coverage:.0%} of request steps drafted (speculation coverage "
            f"{_fmt(h.speculation_coverage)} of output tokens): tokens per step are planned at "
            "that coverage, 1 token for a step without a proposal"
        )
    limit = limit_doc(args)
    if limit is not None:
        words.append(limit.text)
    if (n is not None or b is not None or args.method is not None) and not limits_given:
        words.append(
            "budget columns need all of --max-num-seqs, --max-num-batched-tokens and --method"
        )
    return {
        "model_name": name,
        "drafts": h.drafts,
        "num_speculative_tokens": k,
        "per_position_acceptance_rate": rates,
        "speculation_coverage": h.speculation_coverage,
        "step_coverage": coverage,
        "concurrency": concurrency,
        "limits": {
            "max_num_seqs": n,
            "max_num_batched_tokens": b,
            "method": args.method,
            "regime": regime.value,
            "parallel_drafting": args.parallel_drafting,
        }
        if limits_given
        else None,
        "by_k": [asdict(r) for r in rows],
        "advice": words,
        "assumptions": list(ASSUMPTIONS),
        "speculation_limit": None if limit is None else asdict(limit),
    }


#: What ``advise`` cannot say from an SGLang page, and why.
SGLANG_CANNOT = (
    "SGLang exports no per-position acceptance, so τ for a smaller K (fewer "
    "--speculative-num-steps or --speculative-num-draft-tokens) cannot be worked out from its "
    "page: run each candidate and compare τ and tokens/s"
)


def sglang_advise_doc(name: str, mw: ModelWindow, args: argparse.Namespace) -> dict[str, Any]:
    """The document for an SGLang page, with the keys of :func:`advise_doc` (``by_k`` empty,
    ``limits`` ``null``) plus ``serving_engine``, ``mean_acceptance_length`` and
    ``acceptance_rate``: what the page tells (τ, α = (τ − 1) / (N − 1), N draft tokens per
    verify step, the tokens verified per step under SGLang's rule, running × N, up to
    ``--max-num-seqs`` taken as ``--max-running-requests``) and what it cannot
    (:data:`SGLANG_CANNOT`)."""
    h = mw.server
    n = args.max_num_seqs
    if n is not None and n <= 0:
        raise AnalyzeError("--max-num-seqs must be > 0")
    k = h.num_speculative_tokens
    tau, alpha = h.mean_acceptance_length, h.acceptance_rate
    running = [e.num_requests_running for e in mw.engines.values()]
    observed = max((r for r in running if r is not None), default=None)
    concurrency = args.running if args.running is not None else observed
    words: list[str] = []
    if tau is None or k is None:
        words.append("no speculative decoding measured on the page (no τ or draft length)")
    else:
        shown = "-" if alpha is None else f"{alpha:.3f}"
        words.append(
            f"τ {tau:.2f} tokens per verify step, α {shown}, at N = {k + 1} draft tokens per "
            f"verify step (K = {k})"
        )
        if concurrency:
            words.append(
                f"at {concurrency:g} running requests: about {concurrency * tau:,.0f} tokens "
                f"emitted and {concurrency * (k + 1):,.0f} verified per step"
            )
        if n is not None:
            words.append(
                f"max_running_requests {n}: up to {n * (k + 1):,} tokens verified per step "
                "(SGLang's rule: N per running request, no token-budget cap on drafts)"
            )
    words.append(SGLANG_CANNOT)
    if args.max_num_batched_tokens is not None or args.method is not None:
        words.append("--max-num-batched-tokens and --method apply to vLLM pages only")
    limit = limit_doc(args)
    if limit is not None:
        words.append(limit.text)
    return {
        "model_name": name,
        "serving_engine": "sglang",
        "drafts": h.drafts,
        "num_speculative_tokens": k,
        "mean_acceptance_length": tau,
        "acceptance_rate": alpha,
        "per_position_acceptance_rate": [],
        "concurrency": concurrency,
        "limits": None,
        "by_k": [],
        "advice": words,
        "assumptions": [],
        "speculation_limit": None if limit is None else asdict(limit),
    }


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def render_table(doc: dict[str, Any]) -> str:
    """Plain text: a header line, one row per K (columns sized to their widest cell), advice."""
    cols = [
        ("k", "k"),
        ("mean_acceptance_length", "tau"),
        ("tokens_per_request_step", "tok/req step"),
        ("admission_cap_requests", "admission cap"),
        ("decode_full_per_step_requests", "decode full/step"),
        ("served_full_requests", "served full"),
        ("expected_tokens_per_step", "tokens/step"),
        ("budget_for_max_num_seqs", "budget for N"),
    ]
    cells = [[_fmt(r[key]) for key, _ in cols] for r in doc["by_k"]]
    lines = [
        f"model {doc['model_name']}: drafts {_fmt(doc['drafts'])}, "
        f"K {_fmt(doc['num_speculative_tokens'])}, concurrency {_fmt(doc['concurrency'])}",
    ]
    if cells:  # an SGLang page has no row per K
        widths = [max(len(h), *(len(c[i]) for c in cells)) for i, (_, h) in enumerate(cols)]
        lines.append("  ".join(h.rjust(w) for (_, h), w in zip(cols, widths, strict=True)))
        lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines += ["", *(f"- {a}" for a in doc["advice"])]
    if doc["assumptions"]:
        lines += ["assumptions:", *(f"  {a}" for a in doc["assumptions"])]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Print the advice; 2 on bad input (one line on stderr)."""
    try:
        name, mw, kind = _window(args)
        doc = sglang_advise_doc(name, mw, args) if kind == "sglang" else advise_doc(name, mw, args)
    except AnalyzeError as exc:
        print(f"specwatch advise: {exc}", file=sys.stderr)
        return 2
    print(
        json.dumps(doc, indent=2, allow_nan=False)
        if output_format(args.format) == "json"
        else render_table(doc)
    )
    return 0
