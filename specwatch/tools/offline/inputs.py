"""Per-item correctness from files other tools write, for ``specwatch paired-test``.

lm-evaluation-harness (``lm_eval --log_samples``) writes one ``samples_<task>_<time>.jsonl`` per
task: one JSON object per (document, filter) with ``doc_id``, ``filter`` (the filter pipeline's
name, e.g. ``strict-match``), ``metrics`` (the metric names scored) and one key per metric
holding the sample's score. :func:`looks_like_lm_eval` recognises such a row by content (not by
file name); :func:`lm_eval_outcomes` turns the rows of one filter into ``{doc_id: correct}``
from the sample's own metric field, which must be 0/1 (``exact_match``, ``acc``, ...).

Each row also carries ``prompt_hash`` (SHA-256 of the prompt sent) and ``target_hash`` (of the
reference answer): :func:`lm_eval_hashes` and :func:`hash_mismatches` check that two runs asked
the same question of each document. :func:`pick_samples_file` picks the one samples file of an
output directory's listing, and :func:`split_shared` sets aside items only one run has.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any


class InputError(ValueError):
    """Bad input file or contents (the CLI prints it as one line and exits 2)."""


#: Keys every lm-eval sample row has.
LM_EVAL_KEYS = frozenset({"doc_id", "filter", "metrics"})


def looks_like_lm_eval(row: object) -> bool:
    """True when ``row`` (one parsed JSONL line) is an lm-eval harness sample."""
    return isinstance(row, dict) and row.keys() >= LM_EVAL_KEYS and isinstance(row["metrics"], list)


def _binary(value: object, where: str, metric: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float) and value in (0, 1):
        return bool(value)
    raise InputError(
        f"{where}: metric {metric!r} is {value!r}; paired-test needs a 0/1 score per item"
    )


def _pick_filter(
    rows: Sequence[tuple[str, Mapping[str, Any]]], filter_name: str | None, source: str
) -> str | None:
    filters = sorted({str(r.get("filter")) for _, r in rows if looks_like_lm_eval(r)})
    if filter_name is None:
        if len(filters) > 1:
            raise InputError(
                f"{source}: lm-eval samples with several filters ({', '.join(filters)}); "
                "pick one with --filter"
            )
        return filters[0] if filters else None
    if filter_name not in filters:
        raise InputError(
            f"{source}: no lm-eval samples for filter {filter_name!r} "
            f"(filters: {', '.join(filters) or 'none'})"
        )
    return filter_name


def lm_eval_outcomes(
    rows: Sequence[tuple[str, Mapping[str, Any]]],
    *,
    filter_name: str | None = None,
    metric: str | None = None,
    source: str = "",
) -> dict[str, bool]:
    """``{doc_id: correct}`` from lm-eval sample rows (``(where, row)`` pairs, ``where`` naming
    the file and line for messages).

    ``filter_name`` picks the filter when the task wrote several (required then); ``metric``
    picks the metric when the samples carry several (default: the only one). Raises
    :class:`InputError` for a row that is not an lm-eval sample, an unknown or ambiguous filter
    or metric, a non-0/1 score, or a doc id twice under one filter.
    """
    filter_name = _pick_filter(rows, filter_name, source)
    out: dict[str, bool] = {}
    for where, row in rows:
        if not looks_like_lm_eval(row):
            raise InputError(f"{where}: not an lm-eval sample (needs doc_id, filter, metrics)")
        if row["filter"] != filter_name:
            continue
        names = [str(m) for m in row["metrics"]]
        if metric is None:
            if len(names) != 1:
                raise InputError(
                    f"{where}: samples score several metrics ({', '.join(names)}); "
                    "pick one with --metric"
                )
            chosen = names[0]
        elif metric in names:
            chosen = metric
        else:
            raise InputError(f"{where}: metric {metric!r} not scored (metrics: {', '.join(names)})")
        if chosen not in row:
            raise InputError(f"{where}: metric {chosen!r} listed but has no value")
        doc = str(row["doc_id"])
        if doc in out:
            raise InputError(f"{where}: doc_id {doc} twice for filter {filter_name!r}")
        out[doc] = _binary(row[chosen], where, chosen)
    if not out:
        raise InputError(f"{source}: no lm-eval samples")
    return out


#: The per-document hashes lm-eval writes, in the order they are reported.
HASH_FIELDS = ("prompt_hash", "target_hash")


def lm_eval_hashes(
    rows: Sequence[tuple[str, Mapping[str, Any]]],
    *,
    filter_name: str | None = None,
    source: str = "",
) -> dict[str, dict[str, str]]:
    """``{doc_id: {field: hash}}`` for the :data:`HASH_FIELDS` each row of the chosen filter
    carries (a field a row lacks is left out; lm-eval before 0.4.3 wrote none).

    Call on rows :func:`lm_eval_outcomes` accepted (same filter rules).
    """
    filter_name = _pick_filter(rows, filter_name, source)
    out: dict[str, dict[str, str]] = {}
    for _, row in rows:
        if looks_like_lm_eval(row) and row["filter"] == filter_name:
            out[str(row["doc_id"])] = {
                f: str(row[f]) for f in HASH_FIELDS if isinstance(row.get(f), str)
            }
    return out


def hash_mismatches(
    base: Mapping[str, Mapping[str, str]], cand: Mapping[str, Mapping[str, str]]
) -> dict[str, list[str]]:
    """``{doc_id: [fields that differ]}`` over the documents both runs have, comparing each of
    :data:`HASH_FIELDS` that both rows carry (in BASE order). Empty: the runs agree."""
    out: dict[str, list[str]] = {}
    for doc, b in base.items():
        c = cand.get(doc)
        if c is None:
            continue
        differ = [f for f in HASH_FIELDS if f in b and f in c and b[f] != c[f]]
        if differ:
            out[doc] = differ
    return out


_SAMPLES_NAME = re.compile(r"samples_(?P<task>.+)_(?P<time>\d{4}-\d\d-\d\dT[\d.-]+)\.jsonl")


def pick_samples_file(directory: str, names: Sequence[str]) -> str:
    """The one lm-eval samples file among ``names`` (paths under ``directory``, as listed),
    by lm-eval's naming ``samples_<task>_<time>.jsonl``. Raises :class:`InputError` when there
    is none, or several (several tasks, or several runs of one task), naming them."""
    found = sorted(n for n in names if _SAMPLES_NAME.fullmatch(n.rsplit("/", 1)[-1]))
    if not found:
        raise InputError(
            f"{directory}: no lm-eval samples_<task>_<time>.jsonl files (run lm_eval with "
            "--log_samples, or give the file)"
        )
    if len(found) > 1:
        tasks = sorted(
            {m["task"] for n in found if (m := _SAMPLES_NAME.fullmatch(n.rsplit("/", 1)[-1]))}
        )
        what = (
            f"several tasks ({', '.join(tasks)})"
            if len(tasks) > 1
            else f"several runs of task {tasks[0]}"
        )
        raise InputError(
            f"{directory}: {what} in {len(found)} samples files ({', '.join(found[:4])}"
            f"{', ...' if len(found) > 4 else ''}); give the file"
        )
    return found[0]


def split_shared(
    base: Mapping[str, bool], cand: Mapping[str, bool]
) -> tuple[dict[str, bool], dict[str, bool], list[str], list[str]]:
    """``(base, cand)`` restricted to the items both have (BASE order kept), and the sorted
    ids only in BASE and only in CAND."""
    if list(base) == list(cand) or base.keys() == cand.keys():  # the usual case: no filtering
        return dict(base), dict(cand), [], []
    only_base = sorted(set(base) - set(cand))
    only_cand = sorted(set(cand) - set(base))
    return (
        {k: v for k, v in base.items() if k in cand},
        {k: v for k, v in cand.items() if k in base},
        only_base,
        only_cand,
    )
