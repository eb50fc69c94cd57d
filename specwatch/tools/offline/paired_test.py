"""``specwatch paired-test BASE CAND``: exact McNemar and non-inferiority on two eval runs.

BASE (standard arm / baseline) and CAND (FLy / candidate) are JSONL or CSV files of rows
``{"id": ..., "correct": 0|1}`` over the same items, or lm-evaluation-harness
``samples_*.jsonl`` files (``lm_eval --log_samples``; recognised by content, joined on
``doc_id``, scored by the sample's own 0/1 metric; ``--filter NAME`` when the task wrote
several filters, ``--metric NAME`` when it scored several metrics); BASE/CAND may be lm-eval
``--output_path`` directories holding one samples file. lm-eval's ``prompt_hash`` and
``target_hash`` must agree per document (else exit 2, or ``--exclude-mismatched`` leaves those
out); items only one run has are left out and reported (``excluded`` in the JSON, stderr).
Exit 0 with the result, 2 on bad input (one line on stderr). ``first_crossing`` gives, in BASE
file order, the pair at which each e-process first reached 1/alpha (null when never).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specwatch.cli.args import add_output_format, output_format
from specwatch.core.helptext import plain_help
from specwatch.tools.offline.inputs import (
    InputError,
    hash_mismatches,
    lm_eval_hashes,
    lm_eval_outcomes,
    looks_like_lm_eval,
    pick_samples_file,
    split_shared,
)

if TYPE_CHECKING:  # numpy, scipy and the statistics load where computed, not for --help
    import numpy as np
    import numpy.typing as npt

    from specwatch.shadow.stats.paired import PairedCounts

    BoolArray = npt.NDArray[np.bool_]
    IntArray = npt.NDArray[np.int64]

__all__ = [
    "InputError",
    "pair_outcomes",
    "pair_sequence",
    "paired_report",
    "read_hashes",
    "read_outcomes",
]


#: The words a CSV cell may hold for a correct / wrong item (a CSV cell is text; in JSON only
#: ``true``/``false``/``0``/``1`` themselves, not a string, so ``"yes"`` or ``"no"`` is an error).
_TRUE = {"1", "true"}
_FALSE = {"0", "false"}

#: A JSONL row in the plain shape ``{"id": "q1", "correct": true}`` (JSON whitespace anywhere, id
#: a string without escapes or an integer, correct true/false/0/1): read by one match instead of
#: :func:`json.loads`, the same values; any other line is parsed by :mod:`json`.
_PLAIN_ROW = re.compile(
    r'[ \t\r]*\{[ \t\r]*"id"[ \t\r]*:[ \t\r]*(?:"([^"\\\x00-\x1f]*)"|(0|-?[1-9][0-9]*))'
    r'[ \t\r]*,[ \t\r]*"correct"[ \t\r]*:[ \t\r]*(true|false|0|1)[ \t\r]*\}[ \t\r]*'
)
#: The same row as a whole line of a multi-line text (for one pass over a whole file).
_PLAIN_LINES = re.compile(f"^(?:{_PLAIN_ROW.pattern})$", re.MULTILINE)


#: Line boundaries of :meth:`str.splitlines` other than ``\n``.
_OTHER_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def _line_count(text: str) -> int:
    """``len(text.splitlines())``, counted without making the lines when ``\n`` is the only
    line boundary in ``text``."""
    if any(ch in text for ch in _OTHER_BREAKS):
        return len(text.splitlines())
    return text.count("\n") + (0 if text.endswith("\n") or not text else 1)


def _plain_jsonl(text: str) -> dict[str, bool] | None:
    """``{id: correct}`` when every line of ``text`` is a plain-shape row (see
    :data:`_PLAIN_ROW`) and no id repeats, read in one pass; ``None`` otherwise (the caller
    then reads line by line, which also names the line of any error)."""
    found = _PLAIN_LINES.findall(text)
    if not found or len(found) != _line_count(text):
        return None
    items = [text_id or int_id for text_id, int_id, _ in found]
    out = dict(zip(items, [correct in ("true", "1") for _, _, correct in found], strict=True))
    return out if len(out) == len(items) else None


def _as_bool(value: object, where: str, *, cell: bool) -> bool:
    """A row's ``correct``: a JSON boolean or 0/1, or (``cell``: a CSV cell's text) the text
    ``0``/``1``/``true``/``false``; anything else (``"yes"``, ``2``) is an :class:`InputError`."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    if cell and isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise InputError(f"{where}: 'correct' must be 0/1 or true/false, got {value!r}")


def read_outcomes(
    path: Path, *, filter_name: str | None = None, metric: str | None = None
) -> dict[str, bool]:
    """Read ``{id: correct}`` from a JSONL or CSV file (CSV when the name ends in ``.csv``), or
    from lm-evaluation-harness ``samples_*.jsonl`` (recognised by content; joined on ``doc_id``;
    ``filter_name``/``metric`` pick the filter and metric, see
    :func:`specwatch.tools.offline.inputs.lm_eval_outcomes`).

    Raises :class:`InputError` for an unreadable file, a malformed row, a missing field or a
    duplicate id. A directory is lm-eval's ``--output_path``: its one samples file is read.
    """
    path = _samples_path(path)
    text = _read_text(path)
    # (line number, parsed record); a plain-shape JSONL row is read as the tuple (id, correct).
    rows: list[tuple[int, Any]] = []
    if path.suffix.lower() == ".csv":
        reader = csv.DictReader(text.splitlines())
        if reader.fieldnames is None or not {"id", "correct"} <= set(reader.fieldnames):
            raise InputError(f"{path}: CSV needs a header with 'id' and 'correct'")
        rows = list(enumerate(reader, start=2))
    else:
        fast = _plain_jsonl(text)
        if fast is not None and filter_name is None and metric is None:
            return fast
        plain = _PLAIN_ROW.fullmatch
        for lineno, line in enumerate(text.splitlines(), start=1):
            m = plain(line)
            if m is not None:
                text_id, int_id, correct = m.groups()
                rows.append(
                    (lineno, (int_id if text_id is None else text_id, correct in ("true", "1")))
                )
                continue
            if not line.strip():
                continue
            try:
                rows.append((lineno, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}:{lineno}: invalid JSON: {exc.msg}") from exc
            except RecursionError:
                raise InputError(f"{path}:{lineno}: invalid JSON: nested too deep") from None
    if rows and looks_like_lm_eval(rows[0][1]):
        return lm_eval_outcomes(
            [(f"{path}:{lineno}", rec) for lineno, rec in rows],
            filter_name=filter_name,
            metric=metric,
            source=str(path),
        )
    if filter_name is not None or metric is not None:
        raise InputError(f"{path}: --filter/--metric apply to lm-eval samples files only")
    out: dict[str, bool] = {}
    for lineno, rec in rows:
        if isinstance(rec, tuple):
            item, ok = rec
        else:
            where = f"{path}:{lineno}"
            if not isinstance(rec, dict) or "id" not in rec or "correct" not in rec:
                raise InputError(f"{where}: row needs 'id' and 'correct'")
            item = str(rec["id"])
            ok = _as_bool(rec["correct"], where, cell=path.suffix.lower() == ".csv")
        if item in out:
            raise InputError(f"{path}:{lineno}: duplicate id {item!r}")
        out[item] = ok
    if not out:
        raise InputError(f"{path}: no rows")
    return out


#: The longest line :func:`read_outcomes` reads (an lm-eval sample row with its prompt and
#: answers is kilobytes; a file without newlines, such as a device, is refused at this size).
MAX_LINE_BYTES = 64 * 1024 * 1024


def _read_text(path: Path, chunk: int = 1 << 20) -> str:
    """The UTF-8 text (a BOM dropped) of the file or pipe at ``path``. Raises
    :class:`InputError` naming ``path`` for anything else (a device, a socket), an unreadable
    file, a line over :data:`MAX_LINE_BYTES` (at ``path:line``) or bytes that are not UTF-8."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if not (stat.S_ISREG(mode) or stat.S_ISFIFO(mode)):
        raise InputError(f"{path}: is not a regular file")
    parts: list[bytes] = []
    lines = 0  # newlines read so far
    open_line = 0  # bytes of the line not yet ended
    try:
        with path.open("rb") as f:
            while block := f.read(min(chunk, MAX_LINE_BYTES)):
                first = block.find(b"\n")
                longest = open_line + (len(block) if first < 0 else first)
                if longest > MAX_LINE_BYTES:
                    raise InputError(f"{path}:{lines + 1}: line longer than {MAX_LINE_BYTES} bytes")
                if first >= 0:
                    lines += block.count(b"\n")
                    open_line = len(block) - block.rfind(b"\n") - 1
                else:
                    open_line = longest
                parts.append(block)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    raw = b"".join(parts)
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise InputError(f"{path}:{line}: not UTF-8 (byte {exc.start})") from None


def _samples_path(path: Path) -> Path:
    """``path``, or for an lm-eval output directory the one samples file under it."""
    if not path.is_dir():
        return path
    listing = [str(p) for p in path.rglob("samples_*.jsonl") if p.is_file()]
    return Path(pick_samples_file(str(path), listing))


def read_hashes(path: Path, *, filter_name: str | None = None) -> dict[str, dict[str, str]]:
    """lm-eval's per-document ``prompt_hash``/``target_hash`` in ``path`` (a file or output
    directory, as :func:`read_outcomes`, which has checked it); empty for other files."""
    path = _samples_path(path)
    if path.suffix.lower() == ".csv":
        return {}
    with path.open(encoding="utf-8-sig") as f:  # the first row tells: no need to read on
        first = next((line for line in f if line.strip()), None)
    if first is None or not looks_like_lm_eval(json.loads(first)):
        return {}
    rows: list[tuple[str, Any]] = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), start=1):
        if line.strip():
            rows.append((f"{path}:{lineno}", json.loads(line)))
    return lm_eval_hashes(rows, filter_name=filter_name, source=str(path))


def pair_outcomes(base: dict[str, bool], cand: dict[str, bool]) -> PairedCounts:
    """Build the paired 2x2 table; raises :class:`InputError` when the id sets differ."""
    import numpy as np

    from specwatch.shadow.stats.paired import PairedCounts

    if list(base) != list(cand) and base.keys() != cand.keys():  # same order: same ids
        only_base = sorted(set(base) - set(cand))
        only_cand = sorted(set(cand) - set(base))
        parts = []
        if only_base:
            parts.append(f"{len(only_base)} only in BASE (e.g. {', '.join(only_base[:3])})")
        if only_cand:
            parts.append(f"{len(only_cand)} only in CAND (e.g. {', '.join(only_cand[:3])})")
        raise InputError("ids do not match: " + "; ".join(parts))
    b, c = _columns(base, cand)
    both = int(np.count_nonzero(b & c))
    base_right, cand_right = int(np.count_nonzero(b)), int(np.count_nonzero(c))
    return PairedCounts(
        both_correct=both,
        lost=base_right - both,
        gained=cand_right - both,
        both_wrong=b.size - base_right - cand_right + both,
    )


def _columns(base: dict[str, bool], cand: dict[str, bool]) -> tuple[BoolArray, BoolArray]:
    """BASE's and CAND's correctness as arrays in BASE order (same id sets): CAND's values as
    they are when both files list the ids in the same order, else looked up per id."""
    import numpy as np

    n = len(base)
    b = np.fromiter(base.values(), dtype=np.bool_, count=n)
    same_order = list(base) == list(cand)
    values = cand.values() if same_order else map(cand.__getitem__, base)
    return b, np.fromiter(values, dtype=np.bool_, count=n)


def outcome_array(base: dict[str, bool], cand: dict[str, bool]) -> IntArray:
    """:func:`pair_sequence` as an ``int64`` array (what :func:`first_crossings` reads)."""
    import numpy as np

    b, c = _columns(base, cand)
    return b.astype(np.int64) - c.astype(np.int64)


def pair_sequence(base: dict[str, bool], cand: dict[str, bool]) -> list[int]:
    """Per pair in BASE file order, ``d = lost - gained``: 1 lost, -1 gained, 0 concordant.

    Call after :func:`pair_outcomes` (which checks that the id sets match).
    """
    out: list[int] = outcome_array(base, cand).tolist()
    return out


def first_crossings(
    d: Sequence[int] | IntArray, margin: float, alpha: float
) -> dict[str, int | None]:
    """The 1-based pair at which each live alarm first fires (``None``: never): exactly
    :func:`specwatch.shadow.stats.first_alarms` at ``alpha``/``margin`` and the sidecar's default
    ``detect_net_loss`` and ``change_arl`` (``net_loss_change``, ``no_net_loss``, ``margin``,
    ``within_margin``), plus ``no_net_loss_beta_binomial``: the uniform-prior mixture, shown for
    comparison only. Pairs in the order given.
    """
    import numpy as np

    from specwatch.shadow.settings import PairedSettings
    from specwatch.shadow.stats import first_alarms
    from specwatch.shadow.stats.alarms import first_count_alarm
    from specwatch.shadow.stats.sequential import beta_binomial_log_e_values

    x = np.asarray(d, dtype=np.int64).reshape(-1)
    out = first_alarms(x, PairedSettings(alpha=alpha, margin=margin))
    out["no_net_loss_beta_binomial"] = first_count_alarm(x, beta_binomial_log_e_values, alpha)
    return out


def paired_report(
    counts: PairedCounts,
    margin: float,
    alpha: float,
    d: Sequence[int] | IntArray | None = None,
) -> dict[str, Any]:
    """The JSON result: counts, exact McNemar p-values, Tango CI, non-inferiority, e-value.

    Every number comes from :func:`specwatch.shadow.summary.summarize`, what the sidecar, the
    fleet view, the report and the decision table compute on the same pairs. ``e_value``: the
    no-net-loss e-process (:mod:`specwatch.shadow.stats.eprocess`) folded over ``d`` in that
    order, the number the sidecar shows after the same ordered pairs; without ``d``, its count
    form. With ``d`` (see :func:`pair_sequence`) it also has ``first_crossing`` (see
    :func:`first_crossings`), and the verdict's "within margin" is the confidence sequence's
    declaration along that order.
    """
    from specwatch.shadow.summary import summarize
    from specwatch.shadow.tally import PairTally
    from specwatch.shadow.verdict import verdict_from_summary, verdict_line

    tally = PairTally(
        both_correct=counts.both_correct,
        lost=counts.lost,
        gained=counts.gained,
        both_wrong=counts.both_wrong,
    )
    log_e = None
    if d is not None:
        from specwatch.shadow.stats.eprocess import run_net_loss

        log_e = run_net_loss(d).log_e_value
    s = summarize(tally, alpha=alpha, margin=margin, log_e_value=log_e)
    crossing = first_crossings(d, margin, alpha) if d is not None else None

    def num(x: float) -> float | None:
        return None if math.isnan(x) else x

    out: dict[str, Any] = {
        "n": counts.n,
        "both_correct": counts.both_correct,
        "lost": counts.lost,
        "gained": counts.gained,
        "both_wrong": counts.both_wrong,
        "net": counts.net,
        "net_loss": num(s.net_loss_ratio),
        "discordant_ratio": num(s.discordant_ratio),
        "exact_p": s.p_two_sided,
        "exact_p_loss": s.p_loss,
        "ci": {
            "lower": num(s.ci_lower),
            "upper": num(s.ci_upper),
            "level": s.ci_level,
            "method": "tango_score",
        },
        "non_inferiority": {
            "margin": margin,
            "alpha": alpha,
            "p_value": s.non_inferiority_p,
            "upper_bound": num(s.non_inferiority_upper),
            "verdict": "non_inferior" if s.non_inferiority_pass else "not_shown",
            "method": "one_look_tango",
        },
        "within_margin": {
            "upper_bound": num(s.within_margin_upper),
            "declared": s.within_margin_declared,
            "method": "confidence_sequence",
        },
        "e_value": s.e_value,
        "pairs_more": s.questions_still_needed,
        "verdict": verdict_line(
            verdict_from_summary(
                s,
                alpha=alpha,
                margin=margin,
                declared_at=None if crossing is None else crossing["within_margin"],
            )
        ),
    }
    if crossing is not None:
        out["first_crossing"] = crossing
        out["first_page"] = first_page(d if d is not None else [], margin, alpha)
    return out


def first_page(d: Sequence[int] | IntArray, margin: float, alpha: float) -> dict[str, int | None]:
    """The 1-based pair at which each page and warning of the shipped policy over all pairs
    (``category=_all``) first fires on these pairs, ``None`` if never: exactly
    :func:`specwatch.shadow.stats.first_pages`, the code the sidecar's evaluator runs (the file's
    pairs taken as one category)."""
    from specwatch.shadow.settings import PairedSettings
    from specwatch.shadow.stats import first_pages

    got = first_pages([("file", int(v)) for v in d], PairedSettings(alpha=alpha, margin=margin))
    return {k: v for k, v in got.items() if "category=_all" in k}


def _table(report: dict[str, Any]) -> str:
    ci = report["ci"]
    ni = report["non_inferiority"]

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{100 * x:+.2f} pts"

    from specwatch.core.config import OVERALL
    from specwatch.shadow.stats.policy import NO_NET_LOSS, PagePolicy

    page = PagePolicy(alpha=ni["alpha"]).level(OVERALL, NO_NET_LOSS)
    lines = [
        ("pairs (n)", str(report["n"])),
        ("lost / gained / net", f"{report['lost']} / {report['gained']} / {report['net']:+d}"),
        ("net loss", pct(report["net_loss"])),
        (
            f"{100 * ci['level']:g}% CI ({ci['method']})",
            f"[{pct(ci['lower'])}, {pct(ci['upper'])}]",
        ),
        ("fixed-n McNemar p (two-sided)", f"{report['exact_p']:.3g}"),
        ("fixed-n McNemar p (loss)", f"{report['exact_p_loss']:.3g}"),
        (
            "discordant",
            "n/a"
            if report["discordant_ratio"] is None
            else f"{100 * report['discordant_ratio']:.2f}%",
        ),
        (f"non-inferiority (margin {100 * ni['margin']:g} pts)", ni["verdict"]),
        (f"e-value (loss; {page:g} needed for the page)", f"{report['e_value']:.3g}"),
    ]
    for name, pair in report.get("first_page", {}).items():
        lines.append((f"page {name}", "never" if pair is None else f"pair {pair}"))
    for name, pair in report.get("first_crossing", {}).items():
        lines.append(
            (f"first crossing of 1/α ({name})", "never" if pair is None else f"pair {pair}")
        )
    width = max(len(k) for k, _ in lines)
    return "\n".join([report["verdict"], *(f"{k:<{width}}  {v}" for k, v in lines)])


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``paired-test``."""
    p = subparsers.add_parser(
        "paired-test",
        help="exact McNemar + non-inferiority on per-item correctness of two runs",
        description=plain_help(__doc__ or ""),
    )
    p.add_argument("base", type=Path, metavar="BASE", help="baseline (standard) JSONL/CSV")
    p.add_argument("cand", type=Path, metavar="CAND", help="candidate (FLy) JSONL/CSV")
    p.add_argument(
        "--margin",
        type=float,
        default=0.01,
        help="non-inferiority margin: FLy may lose at most this fraction (default 0.01)",
    )
    p.add_argument("--alpha", type=float, default=0.05, help="significance level (default 0.05)")
    p.add_argument(
        "--filter",
        dest="filter_name",
        metavar="NAME",
        help="lm-eval samples: the filter to use when the task wrote several (e.g. strict-match)",
    )
    p.add_argument(
        "--metric", metavar="NAME", help="lm-eval samples: the 0/1 metric when several are scored"
    )
    p.add_argument(
        "--exclude-mismatched",
        action="store_true",
        help="lm-eval samples: leave out documents whose prompt_hash/target_hash differ between "
        "the runs (default: refuse, exit 2)",
    )
    add_output_format(p)
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    """Run the paired test; 0 on success, 2 on bad input."""
    try:
        if not 0.0 <= args.margin < 1.0:
            raise InputError("--margin must be in [0, 1)")
        if not 0.0 < args.alpha < 0.5:
            raise InputError("--alpha must be in (0, 0.5)")
        pick = {"filter_name": args.filter_name, "metric": args.metric}
        base, cand = read_outcomes(args.base, **pick), read_outcomes(args.cand, **pick)
        base, cand, excluded = _matched(args, base, cand)
        counts = pair_outcomes(base, cand)
    except InputError as exc:
        print(f"specwatch paired-test: {exc}", file=sys.stderr)
        return 2
    report = paired_report(counts, args.margin, args.alpha, outcome_array(base, cand))
    if excluded:
        report["excluded"] = excluded
    print(json.dumps(report, indent=2) if output_format(args.format) == "json" else _table(report))
    return 0


def _examples(ids: Sequence[str]) -> str:
    return ", ".join(ids[:5]) + (", ..." if len(ids) > 5 else "")


def _matched(
    args: argparse.Namespace, base: dict[str, bool], cand: dict[str, bool]
) -> tuple[dict[str, bool], dict[str, bool], dict[str, Any]]:
    """The pairs both runs share with the same lm-eval hashes, and what was left out and why
    (also said on stderr). Raises :class:`InputError` when hashes differ without
    ``--exclude-mismatched``, or when no pair is left."""
    base, cand, only_base, only_cand = split_shared(base, cand)
    hb = read_hashes(args.base, filter_name=args.filter_name)
    hc = read_hashes(args.cand, filter_name=args.filter_name)
    differ = hash_mismatches(hb, hc)
    if differ and not args.exclude_mismatched:
        first = next(iter(differ))
        raise InputError(
            f"{len(differ)} documents were not asked the same in both runs (doc_id {first}: "
            f"{' and '.join(differ[first])} differ{'s' if len(differ[first]) == 1 else ''}; "
            f"doc_ids {_examples(list(differ))}); fix the runs, or pass --exclude-mismatched "
            "to leave them out"
        )
    excluded: dict[str, Any] = {}
    for key, ids, why in (
        ("only_base", only_base, "only in BASE"),
        ("only_cand", only_cand, "only in CAND"),
        ("hash_mismatch", list(differ), "with differing prompt_hash/target_hash"),
    ):
        if ids:
            excluded[key] = {"count": len(ids), "ids": ids[:5]}
            print(
                f"specwatch paired-test: left out {len(ids)} item{'s' * (len(ids) != 1)} "
                f"{why} (e.g. {_examples(ids)})",
                file=sys.stderr,
            )
    if differ:
        base = {k: v for k, v in base.items() if k not in differ}
        cand = {k: v for k, v in cand.items() if k not in differ}
    if not base:
        raise InputError("no item is in both runs")
    return base, cand, excluded
