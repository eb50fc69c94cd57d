"""The ``pairs`` table's row: :class:`LedgerRow` (one stored pair), the columns and the schema
rendered from its fields, the additive migration of an older ledger, and the conversions
between a row and the values SQLite stores."""

from __future__ import annotations

import json
import logging
import operator
import sqlite3
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from typing import Any

from specwatch.core.logs import log_event
from specwatch.shadow.values import ArmOutcome, PairOutcome, ToolCall

log = logging.getLogger("specwatch.shadow.ledger")


@dataclass(frozen=True, slots=True)
class LedgerRow:
    """One stored pair (times in unix seconds, latencies in seconds, tokens = completion tokens,
    ``*_tau`` = per-request mean acceptance length). Booleans are ``None`` when not applicable;
    ``noise_*`` are ``None`` when no noise arm was asked. ``request_id`` is the live request's
    ``X-Request-Id``. ``id`` is set on rows read back.

    Per arm, whether it answered or not: ``*_error`` (the arm's failure reason, e.g. ``aborted``,
    ``in_band_5xx``; ``None`` when it answered), ``*_error_code`` (an in-band error's code),
    ``*_finish_reason`` (as the server sent it, unknown values included) and ``*_truncated``
    (``length`` / ``content_filter``). The comparison fields behind ``*_agrees``:
    ``*_content_agrees``, ``*_tool_calls_agree`` and ``*_reasoning_agrees`` (see
    :mod:`specwatch.shadow.compare`). Texts (``*_text``, ``*_reasoning``, and ``*_tool_calls`` as a
    JSON list of ``{"name", "arguments"}``) only with ``store_text``, also of an arm that failed
    (its partial text), so the other side of an unpaired pair can be read back.

    ``greedy`` (temperature 0 or top_k 1), ``running_at_replay`` (running requests on the
    busiest arm's server when replayed), ``baseline_agrees`` (standard arm = no-speculation
    baseline) and ``noise_baseline_agrees`` (noise arm = baseline) are ``None`` in rows written
    before they existed.

    Per arm, vLLM's per-request speculative-decoding counts of an arm that answered with at
    least one verify step (``--per-request-spec-decode-metrics``): ``*_spec_steps``,
    ``*_draft_tokens``, ``*_accepted_tokens`` (the same replies the reply counters count);
    ``None`` otherwise and in rows written before they existed. The decision table's acceptance
    gain is summed from them, so it survives a restart.

    Per arm (standard and FLy), ``*_prompt_tokens`` (the reply's ``usage.prompt_tokens``: a pair
    whose arms differ is excluded ``prompt_tokens_mismatch``) and, for a streamed reply,
    ``*_first_token_seconds`` / ``*_last_token_seconds`` (seconds from sending the request to
    the first and the last chunk that carried generated output: TTFT, and the decode time
    after it); ``None`` when unknown and in rows written before they existed."""

    time: float
    request_hash: str
    category: str
    source: str
    item_id: str | None
    status: str
    reason: str | None
    labelled: bool
    noise_asked: bool
    standard_correct: bool | None
    fly_correct: bool | None
    noise_correct: bool | None
    fly_agrees: bool | None
    noise_agrees: bool | None
    fly_divergence_char: int | None
    fly_divergence_token: int | None
    fly_similarity: float | None
    noise_divergence_char: int | None
    noise_similarity: float | None
    standard_latency_seconds: float | None
    fly_latency_seconds: float | None
    noise_latency_seconds: float | None
    standard_tokens: int | None
    fly_tokens: int | None
    noise_tokens: int | None
    standard_tau: float | None
    fly_tau: float | None
    noise_tau: float | None
    standard_text: str | None = None
    fly_text: str | None = None
    noise_text: str | None = None
    greedy: bool | None = None
    running_at_replay: float | None = None
    baseline_agrees: bool | None = None
    noise_baseline_agrees: bool | None = None
    request_id: str | None = None
    standard_error: str | None = None
    fly_error: str | None = None
    noise_error: str | None = None
    standard_error_code: int | None = None
    fly_error_code: int | None = None
    noise_error_code: int | None = None
    standard_finish_reason: str | None = None
    fly_finish_reason: str | None = None
    noise_finish_reason: str | None = None
    standard_truncated: bool | None = None
    fly_truncated: bool | None = None
    noise_truncated: bool | None = None
    fly_content_agrees: bool | None = None
    noise_content_agrees: bool | None = None
    fly_tool_calls_agree: bool | None = None
    noise_tool_calls_agree: bool | None = None
    fly_reasoning_agrees: bool | None = None
    noise_reasoning_agrees: bool | None = None
    standard_tool_calls: str | None = None
    fly_tool_calls: str | None = None
    noise_tool_calls: str | None = None
    standard_reasoning: str | None = None
    fly_reasoning: str | None = None
    noise_reasoning: str | None = None
    standard_spec_steps: int | None = None
    fly_spec_steps: int | None = None
    noise_spec_steps: int | None = None
    standard_draft_tokens: int | None = None
    fly_draft_tokens: int | None = None
    noise_draft_tokens: int | None = None
    standard_accepted_tokens: int | None = None
    fly_accepted_tokens: int | None = None
    noise_accepted_tokens: int | None = None
    standard_prompt_tokens: int | None = None
    fly_prompt_tokens: int | None = None
    standard_first_token_seconds: float | None = None
    standard_last_token_seconds: float | None = None
    fly_first_token_seconds: float | None = None
    fly_last_token_seconds: float | None = None
    id: int | None = None

    @classmethod
    def from_outcome(cls, o: PairOutcome, store_text: bool = False) -> LedgerRow:
        """Flatten a :class:`PairOutcome`; texts only when ``store_text``."""
        n: ArmOutcome | None = o.noise

        def ok_only(a: ArmOutcome | None, v: Any) -> Any:
            return v if a is not None and a.ok else None

        def noise(get: Callable[[ArmOutcome], Any]) -> Any:
            return get(n) if n is not None else None

        def text(get: Callable[[ArmOutcome], Any]) -> Any:
            return (get(o.standard), get(o.fly), noise(get)) if store_text else (None,) * 3

        sc, fc, nc = _spec_counts(o.standard), _spec_counts(o.fly), _spec_counts(n)
        texts = text(operator.attrgetter("text"))
        reasonings = text(operator.attrgetter("reasoning"))
        tools = text(lambda a: _tool_calls_json(a.tool_calls) if a.tool_calls else None)

        return cls(
            time=o.time,
            request_hash=o.request_hash,
            category=o.category,
            source=str(o.source),
            item_id=o.item_id,
            status=o.status,
            reason=o.reason,
            labelled=o.labelled,
            noise_asked=n is not None,
            standard_correct=o.standard.correct,
            fly_correct=o.fly.correct,
            noise_correct=n.correct if n is not None else None,
            fly_agrees=o.fly.agrees,
            noise_agrees=n.agrees if n is not None else None,
            fly_divergence_char=o.fly.first_divergence_char,
            fly_divergence_token=o.fly.first_divergence_token,
            fly_similarity=o.fly.similarity,
            noise_divergence_char=n.first_divergence_char if n is not None else None,
            noise_similarity=n.similarity if n is not None else None,
            standard_latency_seconds=o.standard.latency_seconds,
            fly_latency_seconds=o.fly.latency_seconds,
            noise_latency_seconds=n.latency_seconds if n is not None else None,
            standard_tokens=o.standard.completion_tokens,
            fly_tokens=o.fly.completion_tokens,
            noise_tokens=n.completion_tokens if n is not None else None,
            standard_tau=o.standard.mean_acceptance_length,
            fly_tau=o.fly.mean_acceptance_length,
            noise_tau=n.mean_acceptance_length if n is not None else None,
            standard_text=texts[0],
            fly_text=texts[1],
            noise_text=texts[2],
            greedy=o.greedy,
            running_at_replay=o.running,
            baseline_agrees=o.baseline.agrees if o.baseline is not None else None,
            noise_baseline_agrees=o.noise_baseline_agrees,
            standard_error=o.standard.error,
            fly_error=o.fly.error,
            noise_error=noise(operator.attrgetter("error")),
            standard_error_code=o.standard.error_code,
            fly_error_code=o.fly.error_code,
            noise_error_code=noise(operator.attrgetter("error_code")),
            standard_finish_reason=o.standard.finish_reason,
            fly_finish_reason=o.fly.finish_reason,
            noise_finish_reason=noise(operator.attrgetter("finish_reason")),
            standard_truncated=ok_only(o.standard, o.standard.truncated),
            fly_truncated=ok_only(o.fly, o.fly.truncated),
            noise_truncated=ok_only(n, noise(operator.attrgetter("truncated"))),
            fly_content_agrees=o.fly.content_agrees,
            noise_content_agrees=noise(operator.attrgetter("content_agrees")),
            fly_tool_calls_agree=o.fly.tool_calls_agree,
            noise_tool_calls_agree=noise(operator.attrgetter("tool_calls_agree")),
            fly_reasoning_agrees=o.fly.reasoning_agrees,
            noise_reasoning_agrees=noise(operator.attrgetter("reasoning_agrees")),
            standard_tool_calls=tools[0],
            fly_tool_calls=tools[1],
            noise_tool_calls=tools[2],
            standard_reasoning=reasonings[0],
            fly_reasoning=reasonings[1],
            noise_reasoning=reasonings[2],
            request_id=o.request_id,
            standard_spec_steps=sc[0],
            standard_draft_tokens=sc[1],
            standard_accepted_tokens=sc[2],
            fly_spec_steps=fc[0],
            fly_draft_tokens=fc[1],
            fly_accepted_tokens=fc[2],
            noise_spec_steps=nc[0],
            noise_draft_tokens=nc[1],
            noise_accepted_tokens=nc[2],
            standard_prompt_tokens=o.standard.prompt_tokens,
            fly_prompt_tokens=o.fly.prompt_tokens,
            standard_first_token_seconds=o.standard.first_token_seconds,
            standard_last_token_seconds=o.standard.last_token_seconds,
            fly_first_token_seconds=o.fly.first_token_seconds,
            fly_last_token_seconds=o.fly.last_token_seconds,
        )


_NO_COUNTS: tuple[None, None, None] = (None, None, None)


def _spec_counts(a: ArmOutcome | None) -> tuple[int, int, int] | tuple[None, None, None]:
    """``(verify steps, draft tokens, accepted tokens)`` of an arm's reply when it answered
    with at least one verify step, else ``None`` each."""
    sd = a.spec_decode if a is not None and a.ok else None
    if sd is None or sd.num_spec_steps <= 0:
        return _NO_COUNTS
    return sd.num_spec_steps, sd.num_draft_tokens, sd.num_accepted_draft_tokens


def _tool_calls_json(calls: Sequence[ToolCall]) -> str:
    return json.dumps(
        [{"name": c.name, "arguments": c.arguments} for c in calls], ensure_ascii=False
    )


#: The stored columns, in the order of :data:`INSERT` and of a row read back after its ``id``:
#: every :class:`LedgerRow` field but ``id``.
COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(LedgerRow) if f.name != "id")
_BOOL_COLUMNS = frozenset(f.name for f in fields(LedgerRow) if f.type in ("bool", "bool | None"))
_SQL_TYPES = {"float": "REAL", "str": "TEXT", "bool": "INTEGER", "int": "INTEGER"}


def _sql_type(annotation: object) -> str:
    base = str(annotation).split(" | ")[0]
    return _SQL_TYPES[base]


#: The ``pairs`` table (one column per :class:`LedgerRow` field) and its two indexes.
SCHEMA = (
    "CREATE TABLE IF NOT EXISTS pairs (id INTEGER PRIMARY KEY, "
    + ", ".join(f"{f.name} {_sql_type(f.type)}" for f in fields(LedgerRow) if f.name != "id")
    + ")",
    "CREATE INDEX IF NOT EXISTS pairs_time ON pairs(time)",
    "CREATE INDEX IF NOT EXISTS pairs_category_time ON pairs(category, time)",
)


def ledger_columns() -> tuple[str, ...]:
    """The ``pairs`` columns of the current schema (``id`` aside), in table order."""
    return tuple(f.name for f in fields(LedgerRow) if f.name != "id")


def add_missing_columns(conn: sqlite3.Connection) -> list[str]:
    """Additive schema migration: ``ALTER TABLE pairs ADD COLUMN`` for every :class:`LedgerRow`
    column a ledger written by an older specwatch lacks (old rows read them as ``NULL``: not
    known). Returns the names added; never drops or changes a column."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(pairs)")}
    added = []
    for f in fields(LedgerRow):
        if f.name != "id" and f.name not in have:
            conn.execute(f"ALTER TABLE pairs ADD COLUMN {f.name} {_sql_type(f.type)}")
            added.append(f.name)
    if added:
        log_event(log, logging.INFO, "ledger columns added", columns=",".join(added))
    return added


#: One row's insert, values in :data:`COLUMNS` order (see :func:`row_to_values`).
INSERT = f"INSERT INTO pairs ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})"


_GET_VALUES = operator.attrgetter(*COLUMNS)


def row_to_values(row: LedgerRow) -> tuple[Any, ...]:
    """``row``'s values in :data:`COLUMNS` order (what :data:`INSERT` binds)."""
    values: tuple[Any, ...] = _GET_VALUES(row)
    return values


def values_to_row(values: Sequence[Any]) -> LedgerRow:
    """The :class:`LedgerRow` of ``(id, *COLUMNS)`` read back (0/1 of a boolean column as
    ``bool``)."""
    kw: dict[str, Any] = {"id": values[0]}
    for name, v in zip(COLUMNS, values[1:], strict=True):
        kw[name] = bool(v) if (name in _BOOL_COLUMNS and v is not None) else v
    return LedgerRow(**kw)
