"""Canary ingest: replay a labelled JSONL eval set through the shadow chain at a set rate.

One JSON object per line::

    {"id": "q1", "prompt": "...", "gold": "42", "category": "math", "checker": "regex:-?\\\\d+"}
    {"id": "q2", "messages": [{"role": "user", "content": "..."}], "gold": "Paris"}

``id`` (string or integer) and ``gold`` (string or number) are required, and exactly one of
``prompt`` (string) or ``messages`` (list of ``{"role", "content"}``). Optional: ``category``
(default ``canary``), ``checker`` (``exact|regex:<pattern>|json:<path>|math``, default ``exact``),
``max_tokens`` (int), ``model`` (string). Blank lines and lines starting with ``#`` are skipped.
A bad line is counted by reason (``invalid_json|not_object|missing_id|duplicate_id|missing_gold|
missing_prompt|bad_messages|bad_checker|bad_field``) with one log line naming file and line number;
the good lines are kept. A file with no good item raises :class:`CanaryFileError`.

Items become ``ShadowRequest(source=CANARY)``: ``prompt`` -> ``/v1/completions``, ``messages`` ->
``/v1/chat/completions``, ``temperature`` 0 unless the item sets one.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specwatch.core.logs import log_event
from specwatch.shadow.sample import request_hash
from specwatch.shadow.values import ShadowRequest, Source

log = logging.getLogger("specwatch.shadow.canary")

CHECKER_KINDS: tuple[str, ...] = ("exact", "regex:", "json:", "math")

#: A small built-in set (simple, unambiguous gold answers) for the simulator and smoke tests.
BUILTIN_ITEMS: tuple[dict[str, Any], ...] = (
    {
        "id": "builtin-add",
        "prompt": "What is 17 + 25? Answer with the number only.\nAnswer:",
        "gold": "42",
        "category": "math",
        "checker": "regex:-?\\d+",
    },
    {
        "id": "builtin-mul",
        "prompt": "What is 12 * 12? Answer with the number only.\nAnswer:",
        "gold": "144",
        "category": "math",
        "checker": "regex:-?\\d+",
    },
    {
        "id": "builtin-capital",
        "messages": [
            {"role": "user", "content": "What is the capital of France? One word."},
        ],
        "gold": "Paris",
        "category": "qa",
        "checker": "regex:[A-Za-z]+",
    },
    {
        "id": "builtin-json",
        "messages": [
            {
                "role": "user",
                "content": 'Reply with only this JSON, filled in: {"colour_of_sky": "..."}',
            },
        ],
        "gold": "blue",
        "category": "extraction",
        "checker": "json:colour_of_sky",
    },
    {
        "id": "builtin-copy",
        "prompt": "Repeat exactly: the quick brown fox\nOutput:",
        "gold": "the quick brown fox",
        "category": "copy",
        "checker": "exact",
    },
)


class CanaryFileError(ValueError):
    """The canary set cannot be used (unreadable, or no good item). ``str()`` is one clear line."""


@dataclass(frozen=True, slots=True)
class CanaryItem:
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
    if checker in ("exact", "math"):
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


def parse_lines(lines: Iterable[str], *, source: str, model: str | None = None) -> CanaryLoad:
    """Parse JSONL lines; bad lines are counted and logged, never raised. Pure except logging."""
    items: list[CanaryItem] = []
    bad: Counter[str] = Counter()
    errors: list[str] = []
    seen: set[str] = set()
    for n, line in enumerate(lines, start=1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        try:
            obj = json.loads(text)
        except ValueError:
            reason: str | CanaryItem = "invalid_json"
        else:
            reason = parse_item(obj, model=model)
        if isinstance(reason, CanaryItem):
            if reason.item_id in seen:
                reason = "duplicate_id"
            else:
                seen.add(reason.item_id)
                items.append(reason)
                continue
        bad[reason] += 1
        errors.append(f"{source}:{n}: {reason}")
        log_event(log, logging.WARNING, "canary bad line", file=source, line=n, reason=reason)
    return CanaryLoad(tuple(items), bad, tuple(errors))


def load_canary(path: str | None, *, builtin: bool, model: str | None = None) -> CanaryLoad:
    """Load the built-in set and/or a user JSONL file (blocking file read: call at startup or in a
    thread). Raises :class:`CanaryFileError` if the file cannot be read or nothing usable is
    left."""
    items: list[CanaryItem] = []
    bad: Counter[str] = Counter()
    errors: list[str] = []
    if builtin:
        b = parse_lines((json.dumps(i) for i in BUILTIN_ITEMS), source="<builtin>", model=model)
        items.extend(b.items)
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise CanaryFileError(f"canary file {path}: cannot read: {exc}") from exc
        f = parse_lines(text.splitlines(), source=path, model=model)
        items.extend(f.items)
        bad.update(f.bad_lines)
        errors.extend(f.errors)
    if not items:
        first = f"; first error: {errors[0]}" if errors else ""
        raise CanaryFileError(f"canary set {path or '<builtin>'}: no usable item{first}")
    return CanaryLoad(tuple(items), bad, tuple(errors))


def to_request(item: CanaryItem, *, received_at: float, salt: str = "") -> ShadowRequest:
    """The :class:`ShadowRequest` for one canary item."""
    return ShadowRequest(
        path=item.path,
        body=item.body,
        request_hash=request_hash(item.path, item.body, salt),
        received_at=received_at,
        source=Source.CANARY,
        category=item.category,
        item_id=item.item_id,
        gold=item.gold,
        checker=item.checker,
    )


class CanaryRunner:
    """Offers canary items one by one every ``1 / rate_per_second`` seconds (``sleep`` injected).

    ``offer`` is called with each request (normally ``lambda r: sampler.offer(r, force=True)``).
    ``loop`` repeats the set forever; otherwise :meth:`run` returns after one pass.
    ``offered`` counts offers by result.
    """

    def __init__(
        self,
        items: Sequence[CanaryItem],
        offer: Callable[[ShadowRequest], str],
        *,
        rate_per_second: float,
        clock: Callable[[], float],
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        loop: bool = True,
        salt: str = "",
    ) -> None:
        if rate_per_second <= 0:
            raise ValueError("canary rate must be > 0")
        self._items = tuple(items)
        self._offer = offer
        self._interval = 1.0 / rate_per_second
        self._clock = clock
        self._sleep = sleep
        self._loop = loop
        self._salt = salt
        self.offered: Counter[str] = Counter()
        self.passes = 0

    async def run(self) -> None:
        while True:
            for item in self._items:
                req = to_request(item, received_at=self._clock(), salt=self._salt)
                self.offered[self._offer(req)] += 1
                await self._sleep(self._interval)
            self.passes += 1
            if not self._loop:
                return
