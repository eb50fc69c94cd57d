"""Counter values no server can reach, refused per sample (pure, except the offsets a
:class:`JumpScreen` keeps between pages).

Two bounds. A sample above :data:`MAX_SAMPLE_VALUE` (2^53: past it a float no longer counts
by one, and a counter of tokens at a million a second takes 285 years to get there), or a NaN
counter, is refused by the parser (:func:`implausible`). A counter that rises between two good
pages by more than :data:`MAX_COUNTER_RATE` per second (a hundred times the token rate of the
fastest servers) is refused by :class:`JumpScreen`: the sample is dropped from the page, so the
windows keep the last good value (that counter reads as absent for this page, never as the
jump), and the jump is remembered as an offset subtracted from the later values of that
series, so a counter that stays at its new level continues from the old one instead of being
refused for ever or counted once the time since makes the rate look possible. A value below
the offset (a restart) or a new ``process_start_time_seconds`` clears the offsets.
Each refusal is counted as ``specwatch_scrape_errors_total{reason="implausible_value"}``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from specwatch.observe.values import EngineKey, EngineReading, PageReading

__all__ = ["MAX_COUNTER_RATE", "MAX_SAMPLE_VALUE", "JumpScreen", "implausible", "sample_text"]

#: The largest sample value read (2^53).
MAX_SAMPLE_VALUE = float(2**53)

#: The largest increase per second of one counter between two good pages.
MAX_COUNTER_RATE = 1e8

#: Refused samples named in a page's log line, at most (the count has them all).
MAX_NAMED = 5


def sample_text(name: str, labels: tuple[tuple[str, str], ...], value: float) -> str:
    """``name{a="x",b="y"}=value``: a refused sample as a log line names it."""
    inner = ",".join(f'{k}="{v}"' for k, v in labels)
    return f"{name}{{{inner}}}={value:g}" if labels else f"{name}={value:g}"


def implausible(value: float, *, counter: bool) -> bool:
    """True for a value no server writes: above :data:`MAX_SAMPLE_VALUE` in magnitude (finite;
    infinities are the parser's ``invalid_series``), or NaN for a ``counter``."""
    if value != value:
        return counter
    return not math.isinf(value) and abs(value) > MAX_SAMPLE_VALUE


class JumpScreen:
    """Refuses counter jumps between pages of one target (see the module docstring)."""

    def __init__(self) -> None:
        self._offsets: dict[tuple[EngineKey, str], float] = {}

    def screen(
        self,
        page: PageReading,
        last: Callable[[EngineKey], EngineReading | None],
        seconds: float | None,
        *,
        restarted: bool,
    ) -> tuple[PageReading, list[str]]:
        """``page`` with each jumping counter dropped and the remembered offsets subtracted,
        and the refused samples (``model/engine counter=value``). ``last``: the last good
        reading of an engine (already offset); ``seconds``: since the last good page (``None``
        before the first); ``restarted``: the page's process start time changed."""
        if restarted:
            self._offsets.clear()
        if not self._offsets and seconds is None:
            return page, []
        allowed = MAX_COUNTER_RATE * max(seconds or 0.0, 1.0)
        refused: list[str] = []
        engines: dict[EngineKey, EngineReading] = {}
        changed = False
        for key, cur in page.engines.items():
            prev = last(key)
            counters: dict[str, float] = {}
            for name, raw in cur.counters.items():
                value = self._offset(key, name, raw)
                old = prev.counters.get(name) if prev is not None else None
                if old is not None and seconds is not None and value - old > allowed:
                    self._offsets[(key, name)] = self._offsets.get((key, name), 0.0) + value - old
                    refused.append(f"{key[0]}/{key[1]} {name}={raw:g}")
                    changed = True
                    continue
                changed |= value != raw
                counters[name] = value
            engines[key] = replace(cur, counters=counters) if changed else cur
        if not changed:
            return page, refused
        return replace(page, engines=engines), refused

    def _offset(self, key: EngineKey, name: str, raw: float) -> float:
        off = self._offsets.get((key, name))
        if off is None:
            return raw
        if raw < off:  # fell below what was added: a restart, counted from its value
            del self._offsets[(key, name)]
            return raw
        return raw - off
