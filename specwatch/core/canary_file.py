"""The canary JSONL format: one labelled question per line, shared by shadow ingest and the
simulator.

One JSON object per line::

    {"id": "q1", "prompt": "...", "gold": "42", "category": "math", "checker": "regex:-?\\\\d+"}
    {"id": "q2", "messages": [{"role": "user", "content": "..."}], "gold": "Paris"}

``id`` (string or integer) and ``gold`` (string or number) are required, and exactly one of
``prompt`` (string) or ``messages`` (list of ``{"role", "content"}``). Optional: ``category``
(default ``canary``), ``checker`` (``exact|regex:<pattern>|json:<path>|math|gsm8k_strict|
gsm8k_flexible``, default ``exact``),
``max_tokens`` (int), ``model`` (string), ``temperature`` (number, default 0). Other keys are
ignored
(the simulator's quiz adds ``p_correct`` and ``draft_confusion``). Blank lines and lines starting
with
``#`` are skipped. A bad line has a reason (``invalid_json|not_object|missing_id|duplicate_id|
missing_gold|missing_prompt|bad_messages|bad_checker|bad_field``), reported as ``<file>:<line>:
<reason>``.

Readers: :mod:`specwatch.shadow.ingest.canary` (the live canary mode); writers:
:func:`write_items` (used by :mod:`specwatch.simulate.quiz` for the simulator's known questions).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHECKER_KINDS: tuple[str, ...] = ("exact", "regex:", "json:", "math")


class CanaryFileError(ValueError):
    """The canary set cannot be used (unreadable, or no good item). ``str()`` is one clear line."""


class CanaryLineError(CanaryFileError):
    """One bad line: ``str()`` is ``<file>:<line>: <reason>``; ``reason`` is the bare reason."""

    def __init__(self, source: str, line: int, reason: str) -> None:
        super().__init__(f"{source}:{line}: {reason}")
        self.source = source
        self.line = line
        self.reason = reason


@dataclass(frozen=True, slots=True)
class CanaryItem:
    """One parsed line as a request: ``path`` ``/v1/completions`` (``prompt``) or
    ``/v1/chat/completions`` (``messages``), ``body`` the request body (``temperature`` set,
    ``model``
    and ``max_tokens`` when given), ``gold`` the expected answer as text."""

    item_id: str
    path: str
    body: dict[str, Any]
    gold: str
    category: str
    checker: str


@dataclass(frozen=True, slots=True)
class CanaryLoad:
    """Parsed set: good ``items``, ``bad_lines`` by reason, ``errors`` as ``"file:line:
    reason"``."""

    items: tuple[CanaryItem, ...]
    bad_lines: Counter[str]
    errors: tuple[str, ...]


def _checker_ok(checker: str) -> bool:
    if checker in ("exact", "math", "gsm8k_strict", "gsm8k_flexible"):
        return True
    return checker.startswith(("regex:", "json:")) and len(checker.split(":", 1)[1]) > 0


def parse_item(obj: object, *, model: str | None = None) -> CanaryItem | str:
    """One decoded line -> :class:`CanaryItem`, or the bad-line reason. Pure."""
    if not isinstance(obj, dict):
        return "not_object"
    raw_id = obj.get("id")
    if isinstance(raw_id, bool) or not isinstance(raw_id, str | int) or raw_id == "":
        return "missing_id"
    gold = obj.get("gold")
    if isinstance(gold, bool) or not isinstance(gold, str | int | float):
        return "missing_gold"
    category = obj.get("category", "canary")
    checker = obj.get("checker", "exact")
    if not isinstance(category, str) or not category:
        return "bad_field"
    if not isinstance(checker, str) or not _checker_ok(checker):
        return "bad_checker"
    prompt, messages = obj.get("prompt"), obj.get("messages")
    body: dict[str, Any]
    if isinstance(prompt, str) and prompt and messages is None:
        path, body = "/v1/completions", {"prompt": prompt}
    elif prompt is None and messages is not None:
        if not (
            isinstance(messages, list)
            and messages
            and all(
                isinstance(m, dict)
                and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str)
                for m in messages
            )
        ):
            return "bad_messages"
        path, body = "/v1/chat/completions", {"messages": messages}
    else:
        return "missing_prompt"
    mt = obj.get("max_tokens")
    if mt is not None:
        if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
            return "bad_field"
        body["max_tokens"] = mt
    item_model = obj.get("model", model)
    if item_model is not None:
        if not isinstance(item_model, str):
            return "bad_field"
        body["model"] = item_model
    temp = obj.get("temperature", 0)
    if isinstance(temp, bool) or not isinstance(temp, int | float):
        return "bad_field"
    body["temperature"] = temp
    return CanaryItem(str(raw_id), path, body, str(gold), category, checker)


def parse_line(text: str, *, source: str, line: int, model: str | None = None) -> CanaryItem | None:
    """One JSONL line → :class:`CanaryItem`; ``None`` for a blank or ``#`` comment line.

    Raises :class:`CanaryLineError` (``<source>:<line>: <reason>``) for a bad line. Pure."""
    stripped = text.strip()
    if not stripped or stripped.startswith("#"):
        return None
    try:
        obj = json.loads(stripped)
    except ValueError:
        raise CanaryLineError(source, line, "invalid_json") from None
    parsed = parse_item(obj, model=model)
    if isinstance(parsed, str):
        raise CanaryLineError(source, line, parsed)
    return parsed


def parse_lines(
    lines: Iterable[str],
    *,
    source: str,
    model: str | None = None,
    on_bad: Callable[[CanaryLineError], None] | None = None,
) -> CanaryLoad:
    """Parse JSONL lines; bad lines (and repeated ids, ``duplicate_id``) are counted, passed to
    ``on_bad`` and kept in ``errors``, never raised. Pure apart from ``on_bad``."""
    items: list[CanaryItem] = []
    bad: Counter[str] = Counter()
    errors: list[str] = []
    seen: set[str] = set()
    for n, text in enumerate(lines, start=1):
        try:
            item = parse_line(text, source=source, line=n, model=model)
            if item is not None and item.item_id in seen:
                raise CanaryLineError(source, n, "duplicate_id")
        except CanaryLineError as exc:
            bad[exc.reason] += 1
            errors.append(str(exc))
            if on_bad is not None:
                on_bad(exc)
            continue
        if item is not None:
            seen.add(item.item_id)
            items.append(item)
    return CanaryLoad(tuple(items), bad, tuple(errors))


def write_items(path: Path, rows: Iterable[Mapping[str, Any]], limit: int | None = None) -> int:
    """Write ``rows`` (objects in the format above) to ``path``, one JSON object per line, at most
    ``limit`` rows; returns the row count. Blocking (file write); raises ``OSError``."""
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            if limit is not None and n >= limit:
                break
            f.write(json.dumps(row) + "\n")
            n += 1
    return n
