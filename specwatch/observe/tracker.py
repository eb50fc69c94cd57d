"""Per-target bookkeeping (pure, clock passed in): good and failed scrapes → TargetSnapshot.

A good page updates the rolling windows and recomputes every window's health. A failed scrape
(or a page that fails to parse) changes nothing but the self-health fields: the last good values
stay and are marked stale. Families seen before and missing now also mark the target stale
(their values become ``None``, never 0).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from specwatch.core.config import SINCE_START
from specwatch.core.logs import log_event, redact_url
from specwatch.core.roles import Role
from specwatch.observe.concurrency import add_point, speculation_limit
from specwatch.observe.health import capacity, model_windows, pair_view, prefix_cache_below_block
from specwatch.observe.plausible import MAX_NAMED, JumpScreen
from specwatch.observe.sglang_health import sglang_observed_k
from specwatch.observe.values import (
    Capacity,
    EngineKey,
    ModelWindow,
    ObserveView,
    PageReading,
    PairView,
    ScrapeErrorReason,
    TargetSnapshot,
)
from specwatch.observe.window import RollingWindows

if TYPE_CHECKING:  # annotations only: the tracker runs without loading pydantic
    from specwatch.observe.settings import ScrapeSettings, TargetSettings

logger = logging.getLogger("specwatch.scrape")


class TargetTracker:
    """State of one target between scrapes; :meth:`snapshot` returns an immutable view."""

    def __init__(
        self,
        target: TargetSettings,
        windows: Mapping[str, float],
        *,
        max_models: int = 8,
        max_engines: int = 64,
        stale_seconds: float = 1800.0,
    ) -> None:
        self.target = target
        self._max_models = max_models
        self._max_engines = max_engines
        self._stale_seconds = stale_seconds
        self._windows = RollingWindows(windows)
        # the shortest window feeds the concurrency profile (None: no rolling window)
        self._short = min(windows, key=lambda w: windows[w]) if windows else None
        #: Why the last page was rejected (``no_vllm_families``, ``counters_alternate``), else None.
        self.rejected: ScrapeErrorReason | None = None
        #: (model_name, engine) pairs dropped from the last page, by ``model_cap`` / ``engine_cap``.
        self.capped: dict[ScrapeErrorReason, int] = {"model_cap": 0, "engine_cap": 0}
        self._seen_families: set[str] = set()
        self._jumps = JumpScreen()
        #: Samples refused on the last page for values no server writes (the first few).
        self.implausible: tuple[str, ...] = ()
        self._errors: dict[str, int] = {}
        self._resets: dict[str, int] = {}
        self._invalid: dict[str, int] = {}
        self._last_withheld: frozenset[str] = frozenset()
        self._snap = TargetSnapshot(
            name=target.name,
            role=target.effective_role,
            url=redact_url(target.url),
            limits=target.limits,
            capacity=capacity(target.limits, []),
            drafter_max_model_len=target.drafter_max_model_len,
            designed_short_drafts=tuple(
                name
                for name, on in (
                    ("dynamic_k", target.dynamic_k),
                    ("structured_output", target.structured_output),
                )
                if on
            ),
        )

    @classmethod
    def from_settings(
        cls, target: TargetSettings, scrape: ScrapeSettings, windows: Mapping[str, float]
    ) -> TargetTracker:
        """The tracker of ``target`` with the per-target bounds of the ``scrape`` group
        (``max_models_per_target``, ``max_engines_per_target``, ``stale_series_seconds``)."""
        return cls(
            target,
            windows,
            max_models=scrape.max_models_per_target,
            max_engines=scrape.max_engines_per_target,
            stale_seconds=scrape.stale_series_seconds,
        )

    def record_error(
        self,
        reason: ScrapeErrorReason,
        *,
        duration_seconds: float | None,
        count_scrape: bool = True,
    ) -> None:
        """A failed scrape (``reason``: timeout, connect, http_status, too_large, parse, ...).

        ``count_scrape=False`` counts the error without a scrape (``duplicate_conflict`` on an
        otherwise good page).
        """
        self._count_error(reason, 1)
        if not count_scrape:
            self._snap = replace(self._snap, scrape_errors=dict(self._errors))
            return
        self._snap = replace(
            self._snap,
            up=False,
            stale=self._snap.ready,
            scrapes_total=self._snap.scrapes_total + 1,
            scrape_errors=dict(self._errors),
            last_scrape_duration_seconds=duration_seconds,
        )

    def record_missed(self, ticks: int) -> None:
        """``ticks`` scheduled scrapes skipped because the scrape before them ran past them."""
        self._snap = replace(self._snap, missed_ticks=self._snap.missed_ticks + ticks)

    def _count_error(self, reason: ScrapeErrorReason, n: int) -> None:
        self._errors[reason] = self._errors.get(reason, 0) + n

    def bound(self, page: PageReading) -> tuple[PageReading, int, int]:
        """``page`` with at most ``max_models`` models and ``max_engines`` (model, engine) pairs:
        tracked ones first, then new ones in sorted order while there is room. Returns the kept
        page and how many (model, engine) pairs were dropped for the model cap and for the
        engine cap (pure in the tracked set)."""
        tracked = self._windows.tracked
        new = [k for k in page.engines if k not in tracked]
        if not new:
            return page, 0, 0
        models = {m for m, _ in tracked}
        room = self._max_engines - len(tracked)
        if len(new) <= room and len(models | {m for m, _ in new}) <= self._max_models:
            return page, 0, 0
        kept: set[EngineKey] = set()
        by_model = by_engine = 0
        for key in sorted(new):
            if key[0] not in models and len(models) >= self._max_models:
                by_model += 1
            elif len(kept) >= room:
                by_engine += 1
            else:
                models.add(key[0])
                kept.add(key)
        engines = {k: v for k, v in page.engines.items() if k in tracked or k in kept}
        return replace(page, engines=engines), by_model, by_engine

    def record_page(
        self, t: float, page: PageReading, *, duration_seconds: float | None
    ) -> list[str]:
        """A good page taken at ``t``: update windows and health; return reset engines' labels.

        A page without any ``vllm:*`` or ``sglang:*`` family (an error page served as text,
        another exporter) is a failed scrape (``no_vllm_families``); a page whose counters
        continue an older page's after falling (several servers behind one URL) is one too
        (``counters_alternate``): neither changes the windows. Engines over the model/engine
        caps are dropped and counted (``model_cap``, ``engine_cap``); engines absent for
        ``stale_seconds`` are pruned."""
        self.rejected = None
        self.implausible = ()
        if not any(f.startswith(("vllm:", "sglang:")) for f in page.families):
            # not a vLLM or SGLang page: no value is shown (never the last good ones, never 0)
            self.rejected = "no_vllm_families"
            self.record_error(self.rejected, duration_seconds=duration_seconds)
            self._snap = replace(self._snap, windows={})
            return []
        self._windows.prune(t, self._stale_seconds)
        page, by_model, by_engine = self.bound(page)
        self.capped = {"model_cap": by_model, "engine_cap": by_engine}
        for reason, n in self.capped.items():
            if n:
                self._count_error(reason, n)
        if self._windows.alternating(page):
            self.rejected = "counters_alternate"
            self.record_error(self.rejected, duration_seconds=duration_seconds)
            return []
        for gone in [e for e in self._resets if e not in {k[1] for k in self._windows.tracked}]:
            del self._resets[gone]
        page = self._screen(t, page)
        if page.duplicate_conflicts:
            self._count_error("duplicate_conflict", page.duplicate_conflicts)
        if page.invalid_series:
            self._count_error("invalid_series", page.invalid_series)
        resets = self._windows.add(t, page)
        for _model, engine in resets:
            self._resets[engine] = self._resets.get(engine, 0) + 1
        missing = tuple(sorted(self._seen_families - page.families))
        self._seen_families |= page.families
        k_cfg = self.target.num_speculative_tokens
        windows = {
            name: model_windows(self._windows.deltas(name), configured_k=k_cfg)
            for name in self._windows.window_names
        }
        self._count_withheld(t, windows)
        running = [
            eng.gauges["running"] for eng in page.engines.values() if "running" in eng.gauges
        ]
        observed_k = max(
            (max(e.per_position) + 1 for e in page.engines.values() if e.per_position),
            default=None,
        )
        if observed_k is None:
            observed_k = sglang_observed_k(page)
        cap: Capacity = capacity(
            replace(self.target.limits, engine=page.engine_kind), running, observed_k=observed_k
        )
        profile = self._snap.concurrency
        short = windows.get(self._short) if self._short is not None else None
        if short and running:
            server = short[min(short)].server
            profile = add_point(
                profile,
                sum(running),
                server.generation_tokens_per_second,
                server.inter_token_latency_seconds.get(0.5),
            )
        self._snap = replace(
            self._snap,
            concurrency=profile,
            up=True,
            stale=bool(missing),
            ready=True,
            last_success=t,
            last_scrape_duration_seconds=duration_seconds,
            scrapes_total=self._snap.scrapes_total + 1,
            scrape_errors=dict(self._errors),
            counter_resets=dict(self._resets),
            invalid_values=dict(self._invalid),
            missing_families=missing,
            capacity=cap,
            windows=windows,
            engine_kind=page.engine_kind,
            gauge_processes=page.gauge_processes,
            cache_config=page.cache_config or self._snap.cache_config,
            lora=page.lora,
            prefix_cache_below_block=self._below_block(t, page, windows),
        )
        return [engine for _model, engine in resets]

    def _below_block(
        self, t: float, page: PageReading, windows: Mapping[str, Mapping[str, ModelWindow]]
    ) -> bool | None:
        """:func:`~specwatch.observe.health.prefix_cache_below_block` over the since-start
        prompts of every model; one warning log line when it turns true."""
        cache = page.cache_config or self._snap.cache_config
        found = [
            prefix_cache_below_block(cache, mw.server.prompt_length)
            for mw in windows.get(SINCE_START, {}).values()
        ]
        known = [f for f in found if f is not None]
        below = all(known) if known else None
        if below and not self._snap.prefix_cache_below_block and cache is not None:
            log_event(
                logger,
                logging.WARNING,
                "prefix cache cannot hit: every prompt is shorter than one KV block",
                target=self.target.name,
                block_size=cache.block_size,
                t=t,
            )
        return below

    def _screen(self, t: float, page: PageReading) -> PageReading:
        """``page`` without the counter jumps no server makes (:mod:`~specwatch.observe.plausible`);
        counts them and the parser's refusals as ``implausible_value`` and keeps their names
        in :attr:`implausible`."""
        latest = self._windows.latest_time
        start = page.process_start_time_seconds
        restarted = start is not None and start != self._windows.process_start
        page, jumped = self._jumps.screen(
            page,
            self._windows.last_reading,
            None if latest is None else t - latest,
            restarted=restarted and self._windows.process_start is not None,
        )
        refused = page.implausible_series + len(jumped)
        if refused:
            self._count_error("implausible_value", refused)
        self.implausible = (*page.implausible, *jumped)[:MAX_NAMED]
        return page

    def _count_withheld(self, t: float, windows: Mapping[str, Mapping[str, ModelWindow]]) -> None:
        """Count, per reason, this page if any window's value was withheld; one log line when
        the set of reasons changes (not on every scrape)."""
        where: dict[str, list[str]] = {}
        for wname, models in windows.items():
            for model, mw in models.items():
                for engine, h in [("", mw.server), *mw.engines.items()]:
                    for reason in h.withheld:
                        where.setdefault(reason, []).append(
                            f"{wname}/{model}" + (f"/engine {engine}" if engine else "")
                        )
        for reason in where:
            self._invalid[reason] = self._invalid.get(reason, 0) + 1
        now = frozenset(where)
        if now and now != self._last_withheld:
            log_event(
                logger,
                logging.WARNING,
                "derived values withheld: they cannot be right",
                target=self.target.name,
                reasons=sorted(now),
                where={r: sorted(w)[:5] for r, w in sorted(where.items())},
                t=t,
            )
        self._last_withheld = now

    def snapshot(self) -> TargetSnapshot:
        """The current immutable view."""
        return self._snap


def build_view(targets: Sequence[TargetSnapshot], *, now: float) -> ObserveView:
    """Assemble the :class:`ObserveView` at unix time ``now``; the pair view uses the first
    ``fly`` and first ``standard`` target and each one's first model's server view; the
    speculation limit compares FLy with the first ``baseline`` target (no speculation) when
    there is one, else with the standard target."""
    by_name = {t.name: t for t in targets}
    pair: dict[str, PairView] = {}
    std = next((t for t in targets if t.role is Role.STANDARD), None)
    fly = next((t for t in targets if t.role is Role.FLY), None)
    if std is not None and fly is not None:
        names = list(std.windows) or list(fly.windows)
        for w in names:
            s_models = std.windows.get(w, {})
            f_models = fly.windows.get(w, {})
            s_h = s_models[min(s_models)].server if s_models else None
            f_h = f_models[min(f_models)].server if f_models else None
            pair[w] = pair_view(std.name, s_h, fly.name, f_h)
    base = next((t for t in targets if t.role is Role.BASELINE), None)
    limit = (
        speculation_limit(
            std.concurrency,
            fly.concurrency,
            baseline=base.concurrency if base is not None else None,
        )
        if std is not None and fly is not None
        else None
    )
    return ObserveView(generated_at=now, targets=by_name, pair=pair, speculation_limit=limit)
