"""Request categories come from traffic (``X-Specwatch-Category``, copied by Envoy/Istio from end
users), so specwatch bounds them: ``shadow.max_categories`` (here 20) keep their own series, the
rest are ``other``, live and after a restart on a ledger that already holds 10,000 categories.
Driven through the mirror over real HTTP and read from ``/metrics``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from specwatch.core.wire import CATEGORY_HEADER
from specwatch.settings import Settings
from specwatch.shadow.compare import compare
from specwatch.shadow.ledger.ledger import Ledger
from specwatch.shadow.values import Arm, ArmResult, ReplayPair, ShadowRequest, Source
from tests.e2e.shadow_harness import settings_for, sidecar, simulators, until


def _settings(ledger: Path) -> Settings:
    arm = {"url": "http://127.0.0.1:9"}  # refuses connections: every replay is unpaired
    return Settings.model_validate(
        {
            "targets": [{"name": "fly", "url": "http://127.0.0.1:9/metrics"}],
            "shadow": {
                "enabled": True,
                "sample_probability": 1.0,
                "max_shadow_rps": 5.0,
                "max_categories": 20,
                "mirror_listen_host": "127.0.0.1",
                "mirror_listen_port": 0,
                "standard": arm,
                "fly": arm,
            },
            "ledger": {"path": str(ledger)},
            "paired": {"windows": ["1h"], "refresh_seconds": 0.2},
        }
    )


async def _old_ledger(path: Path) -> None:
    """A ledger written before the bound: 30 labelled pairs in ``big`` and one in each of
    10,000 categories ``c00000``..``c09999`` (every pair both correct)."""
    async with Ledger(path) as ledger:
        cats = ["big"] * 30 + [f"c{i:05d}" for i in range(10_000)]
        for n, cat in enumerate(cats):
            req = ShadowRequest("/v1/completions", {}, f"h{n}", 1.0, Source.CANARY, cat, "q", "y")
            pair = ReplayPair(
                req,
                ArmResult(Arm.STANDARD, True, 0.1, text="y"),
                ArmResult(Arm.FLY, True, 0.1, text="y"),
                None,
            )
            while not ledger.submit(compare(pair)):
                await ledger.flush()
        await ledger.flush()


def _categories(metrics: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> set[str]:
    return {v for (_, labels) in metrics for k, v in labels if k == "category"}


async def test_ten_thousand_categories_stay_bounded_across_restart_and_live(
    tmp_path: Path,
) -> None:
    """Restart on the old ledger: the 20 largest categories keep their series (``big`` and, by
    name among the 1-row ties, ``c00000``..``c00018``), the other 9,981 rows are ``other``
    (``specwatch_paired_n{window="since_start",category="other"}`` = 9,981, ``_all`` = 10,030).
    Then 10,000 live requests with 10,000 new categories through the mirror: every one is
    counted as ``other`` (``specwatch_shadow_categories_folded_total`` = 10,000) and no new
    category label appears: 22 values in all (20 + ``other`` + ``_all``)."""
    path = tmp_path / "ledger.sqlite"
    await _old_ledger(path)
    async with sidecar(_settings(path)) as sc:
        await until(lambda: sc.component.latest_stats() is not None)
        m = await sc.metrics()
        kept = {"big", *(f"c{i:05d}" for i in range(19))}
        assert _categories(m) == kept | {"other", "_all"}
        n = "specwatch_paired_n"
        other = frozenset({("window", "since_start"), ("category", "other")})
        everything = frozenset({("window", "since_start"), ("category", "_all")})
        assert m[(n, other)] == 9_981
        assert m[(n, everything)] == 10_030

        sem = asyncio.Semaphore(32)

        async def send(i: int) -> int:
            body: dict[str, Any] = {"model": "m", "prompt": f"p{i}", "max_tokens": 1}
            async with (
                sem,
                sc.client.post(
                    sc.mirror_url + "/v1/completions",
                    json=body,
                    headers={CATEGORY_HEADER: f"user-{i:05d}"},
                ) as r,
            ):
                await r.read()
                return r.status

        statuses = await asyncio.gather(*(send(i) for i in range(10_000)))
        assert set(statuses) == {202}
        await sc.component.refresh(flush=True)
        m = await sc.metrics()
        assert m[("specwatch_shadow_categories_folded_total", frozenset())] == 10_000
        assert _categories(m) == kept | {"other", "_all"}


async def test_attacker_categories_sent_first_do_not_keep_a_busy_category_out(
    tmp_path: Path,
) -> None:
    """15 slots (``shadow.max_categories``), filled by 15 attacker requests with 15 made-up
    categories through the mirror (replayed to in-process standard and FLy simulators). Then
    ``checkout`` at about 25 requests/s for 3 s: it reads as ``other`` until it has at least 10
    requests (the takeover floor, above 1.5 x the weakest attacker's 1) for 1 s
    (``category_takeover_seconds``), then takes an attacker's slot without a restart:
    ``specwatch_paired_n{window="since_start",category="checkout"}`` appears in ``/metrics`` and
    ``specwatch_shadow_pairs_total{category="checkout"}`` counts its pairs (the pairs of every
    category still summing to the paired count), the
    ``category`` label takes at most 15 + ``other`` + ``_all`` values, one attacker gone."""
    async with simulators() as sims:
        settings = settings_for(
            sims,
            tmp_path / "ledger.sqlite",
            modes=["mirror"],
            max_categories=15,
            category_window_seconds=60.0,
            category_takeover_seconds=1.0,
        )
        async with sidecar(settings) as sc:
            await until(lambda: sc.component.latest_stats() is not None)

            async def send(category: str, i: int) -> int:
                body: dict[str, Any] = {
                    "model": "sim-model",
                    "prompt": f"{category} {i}",
                    "max_tokens": 4,
                }
                async with sc.client.post(
                    sc.mirror_url + "/v1/completions",
                    json=body,
                    headers={CATEGORY_HEADER: category},
                ) as r:
                    await r.read()
                    return r.status

            attackers = {f"evil-{i:02d}" for i in range(15)}
            assert {await send(c, 0) for c in sorted(attackers)} == {202}
            assert sc.component.statistics.categories.kept == attackers
            for i in range(75):
                assert await send("checkout", i) == 202
                await asyncio.sleep(0.04)
            assert "checkout" in sc.component.statistics.categories.kept
            assert sc.component.statistics.categories.demoted == 1
            await until(
                lambda: sum(sc.component.statistics.counters.by_status().values()) >= 90, limit=30
            )
            await sc.component.refresh(flush=True)
            m = await sc.metrics()
            paired = sc.component.statistics.counters.paired
    assert paired == 90  # 15 + 75 requests, every one replayed and compared
    cats = _categories(m)
    assert "checkout" in cats
    assert len(cats) <= 17
    assert len(cats & attackers) == 14
    checkout = frozenset({("window", "since_start"), ("category", "checkout")})
    assert ("specwatch_paired_n", checkout) in m
    assert m[("specwatch_shadow_category_takeovers_total", frozenset())] == 1
    compared: dict[str, float] = {}
    for (name, labels), v in m.items():
        outcome = dict(labels).get("outcome")
        if name == "specwatch_shadow_pairs_total" and outcome in ("agree", "disagree"):
            cat = dict(labels)["category"]
            compared[cat] = compared.get(cat, 0.0) + v
    # the FLy arm's pairs: one per request, the demoted attacker's and checkout's before its
    # takeover in ``other``, the 14 attackers left with 1 each
    assert sum(compared.values()) == paired
    assert compared["checkout"] + compared["other"] == 76
    assert {compared[c] for c in cats & attackers} == {1.0}
