"""Canary ingest: replay a labelled JSONL eval set through the shadow chain at a set rate.

The file format (and its parser) is :mod:`specwatch.core.canary_file`. A bad line is counted by
reason
with one log line naming file and line number; the good lines are kept. A file with no good item
raises
:class:`~specwatch.core.canary_file.CanaryFileError`.

Items become ``ShadowRequest(source=CANARY)``: ``prompt`` -> ``/v1/completions``, ``messages`` ->
``/v1/chat/completions``, ``temperature`` 0 unless the item sets one.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from specwatch.core import canary_file
from specwatch.core.canary_file import CanaryFileError as CanaryFileError
from specwatch.core.canary_file import CanaryItem as CanaryItem
from specwatch.core.canary_file import CanaryLineError, CanaryLoad
from specwatch.core.clock import WallClock
from specwatch.core.logs import log_event
from specwatch.shadow.sample import request_hash
from specwatch.shadow.values import ShadowRequest, Source

log = logging.getLogger("specwatch.shadow.ingest.canary")


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


def _log_bad(exc: CanaryLineError) -> None:
    log_event(
        log,
        logging.WARNING,
        "canary bad line",
        file=exc.source,
        line=exc.line,
        reason=exc.reason,
        key=exc.key,
    )


def parse_lines(lines: Iterable[str], *, source: str, model: str | None = None) -> CanaryLoad:
    """:func:`specwatch.core.canary_file.parse_lines` plus one log line per bad line."""
    return canary_file.parse_lines(lines, source=source, model=model, on_bad=_log_bad)


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
        wall_clock: WallClock,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        loop: bool = True,
        salt: str = "",
    ) -> None:
        if rate_per_second <= 0:
            raise ValueError("canary rate must be > 0")
        self._items = tuple(items)
        self._offer = offer
        self._interval = 1.0 / rate_per_second
        self._wall_clock = wall_clock
        self._sleep = sleep
        self._loop = loop
        self._salt = salt
        self.offered: Counter[str] = Counter()
        self.passes = 0

    async def run(self) -> None:
        while True:
            for item in self._items:
                req = to_request(item, received_at=self._wall_clock(), salt=self._salt)
                self.offered[self._offer(req)] += 1
                await self._sleep(self._interval)
            self.passes += 1
            if not self._loop:
                return
