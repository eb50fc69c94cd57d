"""The shadow chain end to end: simulators → specwatch (canary / mirror) → ledger → /metrics."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from specwatch.core.config import OVERALL
from specwatch.export.json import shadow_stats_json
from tests.e2e.shadow_harness import (
    canary_done,
    close,
    expected,
    read_rows,
    settings_for,
    sidecar,
    simulators,
    until,
    write_canary,
)


def _key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset(labels.items())


async def test_canary_pairs_reach_ledger_and_metrics_then_survive_restart(tmp_path: Path) -> None:
    """Canary pairs reach the ledger, the pair counters and the snapshot, and survive a restart."""
    canary = tmp_path / "canary.jsonl"
    items = write_canary(canary, variants=1, temperature=0.0)
    ledger = tmp_path / "ledger.sqlite"
    async with simulators(fly_threshold=0.0) as sims:
        settings = settings_for(sims, ledger, modes=["canary"], canary_file=str(canary))
        async with sidecar(settings) as sc:
            await until(lambda: canary_done(sc.component, items))
            stats = await sc.component.refresh(flush=True)
            m = await sc.metrics()
            snap = await (await sc.client.get(sc.url + "/api/v1/snapshot")).json()
        rows = await read_rows(ledger)
        paired = [r for r in rows if r.status == "paired"]
        assert len(paired) >= items // 2  # a few first items may meet the pre-scrape pause
        exp = expected(rows)
        assert exp.n == len(paired)
        assert exp.lost > 0  # threshold 0: FLy waives wrong digits on some items
        # pair counters = ledger rows, per category and outcome
        for cat in {r.category for r in paired}:
            e = expected(rows, cat)
            both_c = sum(
                1 for r in paired if r.category == cat and r.standard_correct and r.fly_correct
            )
            assert (
                m.get(
                    _key("specwatch_shadow_pairs_total", category=cat, arm="fly", outcome="lost"),
                    0.0,
                )
                == e.lost
            )
            assert (
                m.get(
                    _key("specwatch_shadow_pairs_total", category=cat, arm="fly", outcome="gained"),
                    0.0,
                )
                == e.gained
            )
            assert (
                m.get(
                    _key(
                        "specwatch_shadow_pairs_total",
                        category=cat,
                        arm="fly",
                        outcome="both_correct",
                    ),
                    0.0,
                )
                == both_c
            )
            for w in ("1h", "since_start"):
                assert m[_key("specwatch_paired_lost", window=w, category=cat)] == e.lost
                assert m[_key("specwatch_paired_n", window=w, category=cat)] == e.n
                assert close(
                    m[
                        _key(
                            "specwatch_paired_mcnemar_p_value",
                            window=w,
                            category=cat,
                            alternative="two_sided",
                        )
                    ],
                    e.p_two_sided,
                )
        for w in ("1h", "since_start"):
            assert m[_key("specwatch_paired_lost", window=w, category=OVERALL)] == exp.lost
            assert m[_key("specwatch_paired_gained", window=w, category=OVERALL)] == exp.gained
            assert m[_key("specwatch_paired_n", window=w, category=OVERALL)] == exp.n
            assert close(
                m[
                    _key(
                        "specwatch_paired_mcnemar_p_value",
                        window=w,
                        category=OVERALL,
                        alternative="two_sided",
                    )
                ],
                exp.p_two_sided,
            )
            assert close(
                m[
                    _key(
                        "specwatch_paired_mcnemar_p_value",
                        window=w,
                        category=OVERALL,
                        alternative="loss",
                    )
                ],
                exp.p_loss,
            )
        assert m[_key("specwatch_ledger_rows")] == len(rows)
        assert snap["shadow"]["windows"]["since_start"][OVERALL]["lost"] == exp.lost
        # (b) restart on the same ledger: statistics rebuilt equal
        settings2 = settings_for(sims, ledger, modes=["mirror"])
        async with sidecar(settings2) as sc2:
            stats2 = await sc2.component.refresh(flush=True)
            m2 = await sc2.metrics()
    strip = {"generated_at": 0.0, "io": None}
    j1 = shadow_stats_json(replace(stats, **strip))  # type: ignore[arg-type]
    j2 = shadow_stats_json(replace(stats2, **strip))  # type: ignore[arg-type]
    # the margin e-process is order-dependent: rebuilt in ledger (time) order, which may differ
    # from the order replays finished in; the values agree to rounding
    for k in ("betting_log_e_value", "betting_e_value"):
        assert close(j1.pop(k), j2.pop(k))
    # so is the no-net-loss e-process of all pairs and its change detector (folded pair by pair
    # live, in one pass at the restart)
    for field_name in ("e_value", "log_e_value"):
        a = j1["windows"]["since_start"][OVERALL].pop(field_name)
        b = j2["windows"]["since_start"][OVERALL].pop(field_name)
        assert close(a, b), field_name
    a_row, b_row = (next(r for r in j["decisions"] if r["category"] == OVERALL) for j in (j1, j2))
    assert close(a_row.pop("e_value"), b_row.pop("e_value"))
    a_det, b_det = j1.pop("change_detector"), j2.pop("change_detector")
    assert a_det["threshold"] == b_det["threshold"]
    assert (a_det["log_value"] is None) == (b_det["log_value"] is None)
    if a_det["log_value"] is not None:
        assert close(a_det["log_value"], b_det["log_value"])
    # the pair counters count each process's own pairs: the restarted one has none yet (a true
    # counter reset, never a recount of the pruned ledger); the ledger's totals are a gauge
    assert j1.pop("pairs_total") != []
    assert j2.pop("pairs_total") == []
    assert sum(j2.pop("unpaired_total").values()) == 0
    assert sum(j2.pop("excluded_total").values()) == 0
    j1.pop("unpaired_total")
    j1.pop("excluded_total")
    # the decision table is rebuilt from the ledger, the acceptance gain too: the ledger keeps
    # each reply's draft and accepted tokens, so the restarted process (no reply of its own
    # yet) shows the same column
    gains = [r["acceptance_gain"] for r in j1["decisions"]]
    assert gains
    assert all(g is not None for g in gains)
    assert [r["acceptance_gain"] for r in j2["decisions"]] == gains
    drafted = sum(r.fly_draft_tokens or 0 for r in rows)
    accepted = sum(r.fly_accepted_tokens or 0 for r in rows)
    std_d = sum(r.standard_draft_tokens or 0 for r in rows)
    std_a = sum(r.standard_accepted_tokens or 0 for r in rows)
    overall = next(r for r in j2["decisions"] if r["category"] == OVERALL)
    assert close(overall["acceptance_gain"], accepted / drafted - std_a / std_d)
    assert j1 == j2
    assert stats2.ledger_pairs == stats.ledger_pairs
    assert stats2.ledger_pairs[(paired[0].category, "fly", "agree")] > 0
    for key, v in m.items():
        if key[0].startswith(("specwatch_paired_", "specwatch_ledger_pairs")):
            assert close(m2[key], v), key


async def test_mirror_pairs_are_counted_as_agreement(tmp_path: Path) -> None:
    """Mirrored requests are replayed once each and counted as agreement, not correctness."""
    ledger = tmp_path / "ledger.sqlite"
    async with simulators(fly_threshold=0.0) as sims:
        settings = settings_for(sims, ledger, modes=["mirror"])
        async with sidecar(settings) as sc:
            comp = sc.component
            await until(lambda: comp.load_state()["fly"].observed_at is not None)
            await until(lambda: not comp.pipeline.sampler.current_pause())  # type: ignore[union-attr]
            sent = 0
            for i in range(60):
                body = {"prompt": f"Tell me about item {i}.", "max_tokens": 40, "temperature": 0}
                headers = {
                    "Host": "llm-shadow",
                    "X-Specwatch-Category": "live",
                    "X-Request-Id": f"req-{i}",
                }
                async with sc.client.post(
                    sc.mirror_url + "/v1/completions", json=body, headers=headers
                ) as r:
                    assert r.status == 202
                    sent += (await r.json())["shadow"] == "admitted"
            await until(lambda: sum(comp.statistics.counters.by_status().values()) == sent)
            await comp.refresh(flush=True)
            m = await sc.metrics()
    rows = await read_rows(ledger)
    assert len(rows) == sent > 0
    agree = sum(1 for r in rows if r.status == "paired" and r.fly_agrees)
    disagree = sum(1 for r in rows if r.status == "paired" and r.fly_agrees is False)
    assert agree + disagree == sent
    assert all(not r.labelled and r.source == "mirror" for r in rows)
    ids = [r.request_id for r in rows]  # each admitted copy's X-Request-Id, once
    assert len(set(ids)) == len(ids)
    assert set(ids) <= {f"req-{i}" for i in range(60)}
    # per-request spec-decode metrics (simulators run with the flag at summary) reach the
    # ledger's tau columns, and alpha / tau per arm and category on /metrics are the ratios of
    # the exported counters
    assert all(r.standard_tau is not None and r.fly_tau is not None for r in rows)
    for arm in ("standard", "fly"):
        lab = {"arm": arm, "category": "live"}
        steps = m[_key("specwatch_shadow_reply_spec_steps_total", **lab)]
        drafted = m[_key("specwatch_shadow_reply_draft_tokens_total", **lab)]
        accepted = m[_key("specwatch_shadow_reply_accepted_tokens_total", **lab)]
        assert steps > 0
        assert drafted == 4 * steps  # K = 4 drafted at every verify step
        assert close(m[_key("specwatch_shadow_reply_acceptance_ratio", **lab)], accepted / drafted)
        assert close(
            m[_key("specwatch_shadow_reply_mean_acceptance_length", **lab)], 1 + accepted / steps
        )
        # no stop strings sent: every reply carried its metrics, whatever its finish reason
        coverage = {
            labels: v
            for (name, labels), v in m.items()
            if name == "specwatch_shadow_spec_metrics_coverage_ratio" and ("arm", arm) in labels
        }
        assert coverage
        assert set(coverage.values()) == {1.0}
    assert (
        m.get(
            _key("specwatch_shadow_pairs_total", category="live", arm="fly", outcome="agree"), 0.0
        )
        == agree
    )
    assert (
        m.get(
            _key("specwatch_shadow_pairs_total", category="live", arm="fly", outcome="disagree"),
            0.0,
        )
        == disagree
    )
    assert close(
        m[_key("specwatch_flip_ratio", window="since_start", category="live", arm="fly")],
        disagree / sent,
    )
    assert m[_key("specwatch_paired_n", window="since_start", category="live")] == 0
