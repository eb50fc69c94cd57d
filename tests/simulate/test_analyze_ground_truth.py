"""``specwatch analyze`` on two simulator scrapes agrees with the simulator's
own ground truth (``/admin/stats``), server-wide and per engine (data_parallel_size 2, one engine
with a degraded draft so the engines differ), including across a counter reset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specwatch.__main__ import main as cli_main
from specwatch.simulate.config import Role, SimConfig, StepTimeModel
from specwatch.simulate.launcher import SimulatorHandle, start_simulator
from specwatch.simulate.loadgen import LoadConfig, LoadGenerator

FAST = StepTimeModel(base_s=0.001, token_s=1e-6, seq_s=1e-6)
K = 4
COUNTS = {  # analyze key -> /admin/stats key
    "drafts": "num_drafts",
    "draft_tokens": "num_draft_tokens",
    "accepted_tokens": "num_accepted_tokens",
    "generation_tokens": "generation_tokens",
    "engine_steps": "steps",
    "preemptions": "preemptions",
}


async def _capture(s: aiohttp.ClientSession, h: SimulatorHandle) -> tuple[str, dict[str, Any]]:
    """``/metrics`` text and ``/admin/stats``, checked to be one quiescent state (the stats are
    the same before and after the page is read)."""
    async with s.get(h.url + "/admin/stats") as r:
        before = await r.json()
    async with s.get(h.url + "/metrics") as r:
        assert r.status == 200
        text = await r.text()
    async with s.get(h.url + "/admin/stats") as r:
        after = await r.json()
    assert before == after
    return text, after


async def _load(h: SimulatorHandle, n: int, seed: int) -> None:
    gen = LoadGenerator(
        [h.url],
        LoadConfig(concurrency=8, duration_s=None, max_requests=n, max_tokens=48,
                   temperature=1.0, seed=seed),
    )  # fmt: skip
    stats = await gen.run()
    assert stats.ok == n


def _analyze(tmp: Path, a: str, b: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    (tmp / "a.prom").write_text(a)
    (tmp / "b.prom").write_text(b)
    capsys.readouterr()
    rc = cli_main(
        ["analyze", str(tmp / "a.prom"), str(tmp / "b.prom"), "--interval", "2.5",
         "--format", "json"]
    )  # fmt: skip
    assert rc == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def _truth(a: dict[str, Any] | None, b: dict[str, Any]) -> dict[str, Any]:
    """Ground-truth increases from two ``/admin/stats`` views (``a`` None: since the reset)."""
    out: dict[str, Any] = {}
    for key in [*COUNTS.values(), "accepted_per_pos"]:
        vb = b[key]
        va = a[key] if a is not None else None
        if key == "accepted_per_pos":
            out[key] = [x - (va[i] if va else 0) for i, x in enumerate(vb)]
        else:
            out[key] = vb - (va or 0)
    return out


def _server_truth(stats: dict[str, Any]) -> dict[str, Any]:
    """The server view as the sum of the engines (the stats `server` lacks preemptions)."""
    engines = list(stats["engines"].values())
    out = {key: sum(e[key] for e in engines) for key in COUNTS.values()}
    out["accepted_per_pos"] = [sum(e["accepted_per_pos"][i] for e in engines) for i in range(K)]
    return out


def _check(view: dict[str, Any], t: dict[str, Any]) -> None:
    for key, truth_key in COUNTS.items():
        assert view[key] == t[truth_key], key
    drafts, dtoks, acc = t["num_drafts"], t["num_draft_tokens"], t["num_accepted_tokens"]
    assert drafts > 0
    # vLLM SpecDecodingLogging: α = accepted / draft tokens, τ = 1 + accepted / drafts
    assert view["acceptance_rate"] == pytest.approx(acc / dtoks, rel=1e-12)
    assert view["mean_acceptance_length"] == pytest.approx(1 + acc / drafts, rel=1e-12)
    assert view["mean_draft_length"] == pytest.approx(dtoks / drafts, rel=1e-12)
    pp = t["accepted_per_pos"]
    assert view["per_position_acceptance_rate"] == pytest.approx(
        [x / drafts for x in pp], rel=1e-12
    )
    assert view["per_position_conditional_acceptance_rate"] == pytest.approx(
        [pp[0] / drafts] + [pp[i] / pp[i - 1] for i in range(1, K)], rel=1e-12
    )
    assert sum(pp) == acc
    assert view["num_speculative_tokens"] == K
    assert view["generation_tokens_per_second"] == pytest.approx(
        t["generation_tokens"] / 2.5, rel=1e-12
    )
    assert view["num_requests_running"] == 0
    assert view["num_requests_waiting"] == 0


@pytest.fixture
async def sim() -> Any:
    cfg = SimConfig(role=Role.FLY, data_parallel_size=2, num_speculative_tokens=K,
                    time_scale=0.0, step_time=FAST)  # fmt: skip
    h = await start_simulator(cfg)
    # engine 1 drafts with 3x the noise: a lower acceptance there only
    h.server.faults.draft_noise_multiplier = 3.0
    h.server.faults.draft_noise_engine = 1
    try:
        yield h
    finally:
        await h.stop()


async def test_analyze_of_two_scrapes_equals_ground_truth_per_engine(
    sim: SimulatorHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`specwatch analyze` of two simulator scrapes equals the simulator's ground truth per
    engine and server."""
    async with aiohttp.ClientSession() as s:
        await _load(sim, 40, seed=1)
        page_a, stats_a = await _capture(s, sim)
        await _load(sim, 60, seed=2)
        page_b, stats_b = await _capture(s, sim)
    doc = _analyze(tmp_path, page_a, page_b, capsys)
    assert doc["model_name"] == "sim-model"
    assert set(doc["engines"]) == {"0", "1"} == set(stats_b["engines"])
    for e in ("0", "1"):
        _check(doc["engines"][e], _truth(stats_a["engines"][e], stats_b["engines"][e]))
    _check(doc["server"], _truth(_server_truth(stats_a), _server_truth(stats_b)))
    # the per-engine split is the simulator's, not an average: the noisy engine accepts less
    assert doc["engines"]["1"]["acceptance_rate"] < doc["engines"]["0"]["acceptance_rate"]
    # the FLy counters of the server view are the sum the simulator reports
    server_truth = stats_b["server"]
    assert doc["server"]["accepted_tokens"] == (
        server_truth["num_accepted_tokens"] - stats_a["server"]["num_accepted_tokens"]
    )


async def test_analyze_across_a_restart_equals_ground_truth_since_the_restart(
    sim: SimulatorHandle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Across a restart, analyze equals the ground truth since the restart."""
    async with aiohttp.ClientSession() as s:
        await _load(sim, 60, seed=3)
        page_a, stats_a = await _capture(s, sim)
        async with s.post(sim.url + "/admin/restart") as r:
            assert r.status == 200
        await _load(sim, 10, seed=4)  # fewer than before: every engine's counters fall
        page_b, stats_b = await _capture(s, sim)
    assert stats_b["restarts"] == 1
    for e in ("0", "1"):
        assert stats_b["engines"][e]["num_drafts"] < stats_a["engines"][e]["num_drafts"]
    doc = _analyze(tmp_path, page_a, page_b, capsys)
    # Δ after a reset is the post-reset value: exactly the counters since the restart
    for e in ("0", "1"):
        _check(doc["engines"][e], _truth(None, stats_b["engines"][e]))
    _check(doc["server"], _truth(None, _server_truth(stats_b)))
