"""The canary JSONL format: one labelled question per line, shared by shadow ingest and the
simulator.

One JSON object per line::

    {"id": "q1", "prompt": "...", "gold": "42", "category": "math", "checker": "regex:-?\\\\d+"}
    {"id": "q2", "messages": [{"role": "user", "content": "..."}], "gold": "Paris"}

``id`` (string or integer) and ``gold`` (string or number) are required, and exactly one of
``prompt`` (string) or ``messages`` (list of ``{"role", "content"}``). Optional: ``category``
(default ``canary``), ``checker``
(``exact|regex:<pattern>|json:<path>|math|gsm8k_strict|gsm8k_flexible``, default ``exact``),
``model`` (string), ``temperature`` (number, default 0) and every other sampling field vLLM's
OpenAI server accepts (:data:`SAMPLING_FIELDS`: ``seed``, ``ignore_eos``, ``top_p``, ``top_k``,
``min_p``, ``max_tokens``, ``stop``, penalties, ...; ``max_completion_tokens``, ``top_logprobs``,
``tools`` and the other :data:`CHAT_FIELDS` with ``messages`` only), copied into the request body
as given after a type check. The simulator's quiz keys ``p_correct`` and ``draft_confusion`` are
read by the simulator and left out of the body. Any other key fails the line (``unknown_key``, its
message names the key, so a typo such as ``temperatur`` never silently makes a greedy item). Blank
lines and lines starting with ``#`` are skipped. A bad line has a reason (``invalid_json|
not_object|missing_id|duplicate_id|missing_gold|missing_prompt|bad_messages|bad_checker|bad_field|
unknown_key``), reported as ``<file>:<line>: <reason>`` (``<file>:<line>: unknown_key '<key>'``
for an unknown key).

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

CHECKER_KINDS: tuple[str, ...] = (
    "exact",
    "regex:",
    "json:",
    "math",
    "gsm8k_strict",
    "gsm8k_flexible",
)


def _int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _pos_int(v: object) -> bool:
    return _int(v) and isinstance(v, int) and v >= 1


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _bool(v: object) -> bool:
    return isinstance(v, bool)


def _str_or_strs(v: object) -> bool:
    return isinstance(v, str) or (isinstance(v, list) and all(isinstance(x, str) for x in v))


def _ints(v: object) -> bool:
    return isinstance(v, list) and all(_int(x) for x in v)


def _strs(v: object) -> bool:
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _obj(v: object) -> bool:
    return isinstance(v, dict)


def _any(v: object) -> bool:
    return True


#: Sampling fields of vLLM's ``/v1/completions`` and ``/v1/chat/completions`` requests
#: (vllm 0.32 ``CompletionRequest`` / ``ChatCompletionRequest``, ``SamplingParams``) a canary
#: item may set, with the type check applied to each.
SAMPLING_FIELDS: dict[str, Callable[[object], bool]] = {
    "max_tokens": _pos_int,
    "temperature": _number,
    "top_p": _number,
    "top_k": _int,
    "min_p": _number,
    "seed": _int,
    "n": _pos_int,
    "presence_penalty": _number,
    "frequency_penalty": _number,
    "repetition_penalty": _number,
    "length_penalty": _number,
    "stop": _str_or_strs,
    "stop_token_ids": _ints,
    "bad_words": _strs,
    "ignore_eos": _bool,
    "min_tokens": _int,
    "logprobs": _int,
    "prompt_logprobs": _int,
    "logit_bias": _obj,
    "allowed_token_ids": _ints,
    "include_stop_str_in_output": _bool,
    "skip_special_tokens": _bool,
    "spaces_between_special_tokens": _bool,
    "truncate_prompt_tokens": _int,
    "use_beam_search": _bool,
    "response_format": _obj,
    "structured_outputs": _obj,
    "thinking_token_budget": _int,
    "echo": _bool,
    "user": lambda v: isinstance(v, str),
}

#: Fields only ``/v1/chat/completions`` takes (an item with ``messages``).
CHAT_FIELDS: dict[str, Callable[[object], bool]] = {
    "max_completion_tokens": _pos_int,
    "top_logprobs": _int,
    "tools": lambda v: isinstance(v, list),
    "tool_choice": _any,
    "parallel_tool_calls": _bool,
    "chat_template_kwargs": _obj,
    "include_reasoning": _bool,
    "reasoning_effort": lambda v: isinstance(v, str),
}

#: Keys of the canary format itself (not sent as they are).
ITEM_KEYS: frozenset[str] = frozenset(
    {"id", "gold", "prompt", "messages", "category", "checker", "model"}
)

#: Keys the simulator's quiz writes and reads; never sent to an arm.
SIMULATOR_KEYS: frozenset[str] = frozenset({"p_correct", "draft_confusion"})


class CanaryFileError(ValueError):
    """The canary set cannot be used (unreadable, or no good item). ``str()`` is one clear line."""


class CanaryLineError(CanaryFileError):
    """One bad line: ``str()`` is ``<file>:<line>: <reason>`` (``... unknown_key '<key>'`` when
    ``key`` is set); ``reason`` is the bare reason, ``key`` the unknown key."""

    def __init__(self, source: str, line: int, reason: str, key: str | None = None) -> None:
        detail = reason if key is None else f"{reason} {key!r}"
        super().__init__(f"{source}:{line}: {detail}")
        self.source = source
        self.line = line
        self.reason = reason
        self.key = key


@dataclass(frozen=True, slots=True)
class UnknownKey:
    """:func:`parse_item`'s answer for a line with a key the format does not know."""

    key: str


@dataclass(frozen=True, slots=True)
class CanaryItem:
    """One parsed line as a request: ``path`` ``/v1/completions`` (``prompt``) or
    ``/v1/chat/completions`` (``messages``), ``body`` the request body (``temperature`` set,
    ``model`` and the sampling fields when given), ``gold`` the expected answer as text."""

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


def parse_item(obj: object, *, model: str | None = None) -> CanaryItem | UnknownKey | str:
    """One decoded line -> :class:`CanaryItem`, :class:`UnknownKey` (the first key, in line
    order, that is neither a format key, a sampling field nor a simulator key), or the bad-line
    reason. Pure."""
    if not isinstance(obj, dict):
        return "not_object"
    chat = "messages" in obj
    for key in obj:
        known = (
            key in ITEM_KEYS
            or key in SIMULATOR_KEYS
            or key in SAMPLING_FIELDS
            or (chat and key in CHAT_FIELDS)
        )
        if not known:
            return UnknownKey(key)
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
    for key, ok in (SAMPLING_FIELDS | CHAT_FIELDS).items():
        if key in obj and key != "temperature":
            if not ok(obj[key]):
                return "bad_field"
            body[key] = obj[key]
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
    except (ValueError, RecursionError):  # RecursionError: nested too deep for the parser
        raise CanaryLineError(source, line, "invalid_json") from None
    parsed = parse_item(obj, model=model)
    if isinstance(parsed, str):
        raise CanaryLineError(source, line, parsed)
    if isinstance(parsed, UnknownKey):
        raise CanaryLineError(source, line, "unknown_key", parsed.key)
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
