"""Per-item correctness from files other tools write, for ``specwatch paired-test``.

lm-evaluation-harness (``lm_eval --log_samples``) writes one ``samples_<task>_<time>.jsonl`` per
task: one JSON object per (document, filter) with ``doc_id``, ``filter`` (the filter pipeline's
name, e.g. ``strict-match``), ``metrics`` (the metric names scored) and one key per metric
holding the sample's score. :func:`looks_like_lm_eval` recognises such a row by content (not by
file name); :func:`lm_eval_outcomes` turns the rows of one filter into ``{doc_id: correct}``
from the sample's own metric field, which must be 0/1 (``exact_match``, ``acc``, ...).
"""

from __future__ import annotations

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
    filters = sorted({str(r.get("filter")) for _, r in rows if looks_like_lm_eval(r)})
    if filter_name is None:
        if len(filters) > 1:
            raise InputError(
                f"{source}: lm-eval samples with several filters ({', '.join(filters)}); "
                "pick one with --filter"
            )
        filter_name = filters[0] if filters else None
    elif filter_name not in filters:
        raise InputError(
            f"{source}: no lm-eval samples for filter {filter_name!r} "
            f"(filters: {', '.join(filters) or 'none'})"
        )
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
