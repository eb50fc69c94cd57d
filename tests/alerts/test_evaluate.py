"""alerts.pending.evaluate over ObserveViews built by the observe chain's own pure code
(parse_page → TargetTracker → build_view) from synthetic vLLM pages, and over ShadowStats from
build_shadow_stats.

Every page is vLLM exposition text whose counters grow at fixed per-second rates, so the
expected α, τ and ratios are worked out by hand in each test.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from specwatch.alerts import rules as rules_module
from specwatch.alerts.alert import Alert, Severity
from specwatch.alerts.pending import Detector, ForTracker, evaluate, for_seconds
from specwatch.alerts.rules import candidates
from specwatch.alerts.settings import DetectSettings
from specwatch.core.config import SINCE_START
from specwatch.core.roles import Role
from specwatch.observe.parse import parse_page
from specwatch.observe.settings import TargetSettings
from specwatch.observe.tracker import TargetTracker, build_view
from specwatch.observe.values import (
    Capacity,
    Health,
    Limits,
    ModelWindow,
    ObserveView,
    TargetSnapshot,
)
from specwatch.settings import Settings, load_settings
from specwatch.shadow.published import ShadowStats
from specwatch.shadow.summary import Levels, OrderedState, build_shadow_stats
from specwatch.shadow.tally import PairTally

MODEL = "example-model"


@dataclass
class Engine:
    """Cumulative counters of one engine and their per-second increases."""

    drafts_per_s: float = 100.0
    k: int = 3
    accepted_per_s: float = 180.0
    generation_per_s: float = 280.0
    steps_per_s: float = 50.0
    running: float = 4.0
    waiting: float = 0.0
    kv: float = 0.2
    finished_per_s: float = 2.0
    finished: float = 0.0
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    generation: float = 0.0
    steps: float = 0.0
    per_pos: list[float] = field(default_factory=list)

    def advance(self, dt: float) -> None:
        self.drafts += self.drafts_per_s * dt
        self.draft_tokens += self.drafts_per_s * self.k * dt
        self.accepted += self.accepted_per_s * dt
        self.generation += self.generation_per_s * dt
        self.steps += self.steps_per_s * dt
        self.finished += self.finished_per_s * dt
        if not self.per_pos:
            self.per_pos = [0.0] * self.k
        # spread accepted tokens over positions, earlier positions first (sums to accepted)
        share = [0.5, 0.3, 0.2] if self.k == 3 else [1.0 / self.k] * self.k
        for i in range(self.k):
            self.per_pos[i] += self.accepted_per_s * dt * share[i]

    def reset(self) -> None:
        self.drafts = self.draft_tokens = self.accepted = self.generation = self.steps = 0.0
        self.per_pos = [0.0] * self.k


def page(engines: Mapping[str, Engine], start_time: float = 1.7e9) -> str:
    """A vLLM 0.33-style page (only the families specwatch reads)."""
    fams: dict[str, tuple[str, list[str]]] = {}

    def add(name: str, kind: str, line: str) -> None:
        fams.setdefault(name, (kind, []))[1].append(line)

    for e, eng in engines.items():
        lab = f'engine="{e}",model_name="{MODEL}"'
        add(
            "vllm:spec_decode_num_drafts",
            "counter",
            f"vllm:spec_decode_num_drafts_total{{{lab}}} {eng.drafts}",
        )
        add(
            "vllm:spec_decode_num_draft_tokens",
            "counter",
            f"vllm:spec_decode_num_draft_tokens_total{{{lab}}} {eng.draft_tokens}",
        )
        add(
            "vllm:spec_decode_num_accepted_tokens",
            "counter",
            f"vllm:spec_decode_num_accepted_tokens_total{{{lab}}} {eng.accepted}",
        )
        for i, v in enumerate(eng.per_pos):
            add(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "counter",
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{lab},position="{i}"}} {v}',
            )
        add(
            "vllm:generation_tokens",
            "counter",
            f"vllm:generation_tokens_total{{{lab}}} {eng.generation}",
        )
        add(
            "vllm:iteration_tokens_total",
            "histogram",
            f'vllm:iteration_tokens_total_bucket{{{lab},le="+Inf"}} {eng.steps}',
        )
        add(
            "vllm:iteration_tokens_total",
            "histogram",
            f"vllm:iteration_tokens_total_count{{{lab}}} {eng.steps}",
        )
        add(
            "vllm:iteration_tokens_total",
            "histogram",
            f"vllm:iteration_tokens_total_sum{{{lab}}} {eng.steps}",
        )
        add(
            "vllm:num_requests_running",
            "gauge",
            f"vllm:num_requests_running{{{lab}}} {eng.running}",
        )
        add(
            "vllm:num_requests_waiting",
            "gauge",
            f"vllm:num_requests_waiting{{{lab}}} {eng.waiting}",
        )
        add("vllm:kv_cache_usage_perc", "gauge", f"vllm:kv_cache_usage_perc{{{lab}}} {eng.kv}")
        add(
            "vllm:request_success",
            "counter",
            f'vllm:request_success_total{{{lab},finished_reason="stop"}} {eng.finished}',
        )
    lines = [
        "# TYPE process_start_time_seconds gauge",
        f"process_start_time_seconds {start_time}",
    ]
    for name, (kind, samples) in fams.items():
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(samples)
    return "\n".join(lines) + "\n"


class Sim:
    """One target scraped every ``step`` seconds through core's tracker."""

    def __init__(
        self, target: TargetSettings, engines: dict[str, Engine], windows: Mapping[str, float]
    ) -> None:
        self.engines = engines
        self.tracker = TargetTracker(target, windows)
        self.t = 0.0
        self.start_time = 1.7e9

    def scrape(self, dt: float) -> ObserveView:
        self.t += dt
        for eng in self.engines.values():
            eng.advance(dt)
        self.tracker.record_page(
            self.t, parse_page(page(self.engines, self.start_time)), duration_seconds=0.01
        )
        return build_view([self.tracker.snapshot()], now=self.t)

    def fail(self, dt: float) -> ObserveView:
        self.t += dt
        self.tracker.record_error("connect", duration_seconds=0.01)
        return build_view([self.tracker.snapshot()], now=self.t)


WINDOWS = {"1m": 60.0}


def no_for(**overrides: object) -> DetectSettings:
    """DetectSettings with every `for` duration 0 (conditions fire on the first evaluation)."""
    zero: dict[str, object] = {n: 0.0 for n in DetectSettings.model_fields if n.endswith("_for")}
    return DetectSettings.model_validate({**zero, **overrides})


def _names(alerts: list[Alert]) -> list[str]:
    return [a.alertname for a in alerts]


def test_one_engine_of_eight_decays() -> None:
    """Engine 3 of 8 falls to τ ≈ 1 (α 0.01): SpecAcceptanceDrop{scope=engine, engine=3} fires
    after `for`, the server aggregate does not.

    Scrapes every 10 s from t = 10 (the since-start baseline starts there). Steady state: every
    engine α = 180/300 = 0.6, τ = 1 + 180/100 = 2.8. From t = 600, engine 3 accepts 3 tokens/s:
    at t = 720 its 1m α = 3/300 = 0.01, τ = 1.03. Server 1m α = (7·180 + 3)/(8·300) = 0.52625;
    since-start α = (8·590·180 + 7·120·180 + 120·3)/(8·710·300) = 1001160/1704000 = 0.58753,
    ratio 0.8957 > 0.8 (τ−1 the same): the server is fine. Engine 3's since-start α =
    (590·180 + 120·3)/(710·300) = 106560/213000 = 0.50028, ratio 0.01999 (shown as 2%).
    """
    s = DetectSettings(acceptance_short_window="1m", acceptance_drop_for=60.0)
    engines = {str(e): Engine() for e in range(8)}
    sim = Sim(TargetSettings(name="fly", url="http://h:1"), engines, WINDOWS)
    detector = Detector(s)
    for _ in range(60):
        assert detector.evaluate(sim.scrape(10.0), None, sim.t) == []
    engines["3"].accepted_per_s = 3.0
    fired: list[Alert] = []
    for _ in range(12):
        snap = sim.scrape(10.0)
        fired = detector.evaluate(snap, None, sim.t)
    server = snap.targets["fly"].windows["1m"][MODEL].server
    assert server.acceptance_rate == pytest.approx(1263 / 2400)
    base = snap.targets["fly"].windows["since_start"][MODEL]
    assert base.server.acceptance_rate == pytest.approx(1001160 / 1704000)
    assert base.engines["3"].acceptance_rate == pytest.approx(106560 / 213000)
    assert _names(fired) == ["SpecAcceptanceDrop"]
    (alert,) = fired
    assert dict(alert.labels) == {
        "target": "fly",
        "role": "fly",
        "model_name": MODEL,
        "scope": "engine",
        "engine": "3",
        "cause": "undetermined",
    }
    assert "is 0.01 " in alert.description
    assert "2% of it" in alert.description


def test_for_duration_holds_back_the_engine_alert() -> None:
    """After one decayed scrape engine 3's 1m α is (3 + 5·180)/(6·300) = 0.5017, 85% of its
    baseline: no candidate yet. After two, (2·3 + 4·180)/1800 = 0.403, about 68%: a candidate,
    which fires once it has held for `for` = 60 s (six scrapes later)."""
    s = DetectSettings(acceptance_short_window="1m", acceptance_drop_for=60.0)
    engines = {str(e): Engine() for e in range(8)}
    sim = Sim(TargetSettings(name="fly", url="http://h:1"), engines, WINDOWS)
    tracker = ForTracker(for_seconds(s))
    for _ in range(60):
        evaluate(sim.scrape(10.0), None, s, sim.t, tracker=tracker)
    engines["3"].accepted_per_s = 3.0
    results = []
    for _ in range(8):
        snap = sim.scrape(10.0)
        results.append(
            (
                len(evaluate(snap, None, s, sim.t)),
                len(evaluate(snap, None, s, sim.t, tracker=tracker)),
            )
        )
    assert results == [(0, 0)] + [(1, 0)] * 6 + [(1, 1)]


def test_whole_server_drop_fires_server_scope_only() -> None:
    """Every engine decays: one scope=server alert, no per-engine duplicates (the rule's unless)."""
    s = DetectSettings(acceptance_short_window="1m", acceptance_drop_for=0.0)
    engines = {str(e): Engine() for e in range(2)}
    sim = Sim(TargetSettings(name="standard", url="http://h:1"), engines, WINDOWS)
    for _ in range(60):
        sim.scrape(10.0)
    for eng in engines.values():
        eng.accepted_per_s = 30.0
    for _ in range(6):
        snap = sim.scrape(10.0)
    fired = evaluate(snap, None, s, sim.t)
    assert [(a.alertname, a.labels.get("scope"), a.labels.get("engine")) for a in fired] == [
        ("SpecAcceptanceDrop", "server", None)
    ]


def test_restart_between_scrapes_fires_nothing() -> None:
    """vLLM restarts (counters back near 0, new process_start_time): no alert of any kind, at any
    scrape, with `for` = 0 everywhere; α stays 0.6 in every window."""
    s = no_for(acceptance_short_window="1m")
    engines = {"0": Engine()}
    sim = Sim(TargetSettings(name="standard", url="http://h:1"), engines, WINDOWS)
    for i in range(40):
        if i == 20:
            engines["0"].reset()
            sim.start_time += 1000.0
        snap = sim.scrape(10.0)
        assert evaluate(snap, None, s, sim.t) == [], i
    h = snap.targets["standard"].windows["1m"][MODEL].server
    assert h.acceptance_rate == pytest.approx(0.6)
    assert snap.targets["standard"].counter_resets == {"0": 1}


def test_zero_drafts_fires_only_decode_inactive() -> None:
    """Drafts counters exist but stay flat while 280 tokens/s flow: only SpecDecodeInactive."""
    s = no_for(acceptance_short_window="1m", rate_window="1m")
    engines = {"0": Engine(running=10.0)}
    sim = Sim(TargetSettings(name="standard", url="http://h:1"), engines, WINDOWS)
    for _ in range(10):
        sim.scrape(10.0)
    engines["0"].drafts_per_s = 0.0
    engines["0"].accepted_per_s = 0.0
    for _ in range(7):
        snap = sim.scrape(10.0)
    h = snap.targets["standard"].windows["1m"][MODEL].server
    assert h.drafts_per_second == 0.0
    assert h.acceptance_rate is None
    fired = evaluate(snap, None, s, sim.t)
    assert _names(fired) == ["SpecDecodeInactive"]
    assert dict(fired[0].labels) == {"target": "standard", "role": "standard", "model_name": MODEL}
    assert "280 tokens/s" in fired[0].description


def test_no_drafts_counter_at_all_fires_nothing() -> None:
    """A baseline server without speculative decoding (no drafts family) is not 'inactive'."""
    s = DetectSettings(rate_window="1m", inactive_for=0.0)
    target = TargetSettings(name="baseline", url="http://h:1")
    tracker = TargetTracker(target, WINDOWS)
    for i in range(1, 5):
        body = (
            "# TYPE vllm:generation_tokens counter\n"
            f'vllm:generation_tokens_total{{engine="0",model_name="{MODEL}"}} {i * 1000.0}\n'
        )
        tracker.record_page(i * 10.0, parse_page(body), duration_seconds=0.01)
    snap = build_view([tracker.snapshot()], now=40.0)
    assert (
        snap.targets["baseline"].windows["1m"][MODEL].server.generation_tokens_per_second == 100.0
    )
    assert evaluate(snap, None, s, 40.0) == []


def test_mtp_budget_bound_is_a_config_finding_not_a_stall() -> None:
    """mtp, K = 7, B = 4096, N = 1024: D_full = 4096 // (1 + 7) = 512 < 1024. Running steady at
    512 with 300 waiting, full drafts (ℓ = 7), KV 35%: SpecBudgetStarvation{reason=budget_cap}
    with the configuration finding (B ≥ 1024 · 8 = 8192), and the info-level
    SpecTokenBudgetBound from configuration; no SpecAdmissionStall, nothing else."""
    s = no_for(acceptance_short_window="1m", rate_window="1m")
    target = TargetSettings(
        name="standard",
        url="http://h:1",
        method="mtp",
        num_speculative_tokens=7,
        max_num_batched_tokens=4096,
        max_num_seqs=1024,
        vllm_version="0.33.0",
    )
    # 512 drafts per step at 20 steps/s; α = 0.5 → 3.5 accepted per draft
    eng = Engine(
        drafts_per_s=512 * 20,
        k=7,
        accepted_per_s=512 * 20 * 3.5,
        generation_per_s=512 * 20 * 4.5,
        steps_per_s=20,
        running=512,
        waiting=300,
        kv=0.35,
    )
    sim = Sim(target, {"0": eng}, WINDOWS)
    for _ in range(12):
        snap = sim.scrape(10.0)
    cap = snap.targets["standard"].capacity
    assert (cap.decode_full_per_step_requests, cap.budget_bound) == (512, True)
    h = snap.targets["standard"].windows["1m"][MODEL].server
    assert h.drafts_per_step == pytest.approx(512.0)
    assert h.mean_draft_length == pytest.approx(7.0)
    fired = evaluate(snap, None, s, sim.t)
    assert _names(fired) == ["SpecTokenBudgetBound", "SpecBudgetStarvation"]
    finding, alert = fired
    assert finding.severity is Severity.INFO
    assert finding.summary == (
        "The token budget max_num_batched_tokens 4096 is below N 1024 x (1 + K 7 + S 0) = 8192, "
        "so at most 512 "
        "requests can decode per step on standard."
    )
    assert dict(alert.labels) == {
        "target": "standard",
        "role": "standard",
        "model_name": MODEL,
        "reason": "budget_cap",
    }
    assert "Configuration finding, not a stall" in alert.description
    assert "at least 8192" in alert.description
    assert "--max-num-seqs to 512" in alert.description


def test_the_page_k_wins_for_health_capacity_and_the_budget_finding() -> None:
    """K configured 3, but the page carries 5 ``position`` labels (vLLM runs K = 5): the
    window's health, Capacity (source ``observed``) and SpecTokenBudgetBound all use 5. dspark
    on v0.32, N = 128, B = 512: S = K - 1 = 4, slots per request 1 + 5 + 4 = 10, need
    128 · 10 = 1280, D_full = min(128, 512 // (1 + 5) = 85, 512 // 10 = 51) = 51 (with the
    configured K 3 it would be S 2, 6 slots, need 768 and D_full 85)."""
    target = TargetSettings(
        name="standard",
        url="http://h:1",
        method="dspark",
        num_speculative_tokens=3,
        max_num_batched_tokens=512,
        max_num_seqs=128,
        vllm_version="0.32.0",
    )
    sim = Sim(target, {"0": Engine(k=5, accepted_per_s=200.0)}, WINDOWS)
    for _ in range(3):
        snap = sim.scrape(10.0)
    t = snap.targets["standard"]
    assert t.windows["1m"][MODEL].server.num_speculative_tokens == 5
    cap = t.capacity
    assert (cap.num_speculative_tokens, cap.num_speculative_tokens_source) == (5, "observed")
    assert (cap.extra_batch_slots, cap.slots_per_request, cap.required_batched_tokens) == (
        4,
        10,
        1280,
    )
    assert cap.decode_full_per_step_requests == 51
    fired = evaluate(snap, None, no_for(rate_window="1m"), sim.t)
    bound = [a for a in fired if a.alertname == "SpecTokenBudgetBound"]
    assert [a.summary for a in bound] == [
        "The token budget max_num_batched_tokens 512 is below N 128 x (1 + K 5 + S 4) = 1280, "
        "so at most 51 "
        "requests can decode per step on standard."
    ]


def test_budget_detectors_read_capacity_and_never_work_it_out_again() -> None:
    """The budget detectors take K, S and the need from Capacity as it is. A hand-made Capacity
    says K 5 (observed), S 4, 1 + 5 + 4 = 10 slots, need 128 · 10 = 1280, D_full 51, beside
    limits that say K 3 (which would give S 2 and 128 · 6 = 768 if anything recomputed them):
    SpecTokenBudgetBound and SpecBudgetStarvation{reason=budget_cap} (60 running > D_full 51,
    drafts flowing) quote exactly Capacity's numbers; SpecDecodeInactive would read its K."""
    cap = Capacity(
        limits_configured=True,
        max_num_seqs=128,
        max_num_batched_tokens=512,
        num_requests_running=60.0,
        admission_cap_requests=51,
        decode_full_per_step_requests=51,
        budget_bound=True,
        num_speculative_tokens=5,
        num_speculative_tokens_source="observed",
        extra_batch_slots=4,
        slots_per_request=10,
        required_batched_tokens=1280,
    )
    health = Health(
        drafts_per_second=100.0,
        mean_draft_length=5.0,
        num_requests_running=60.0,
        num_requests_waiting=3.0,
        generation_tokens_per_second=500.0,
    )
    target = TargetSnapshot(
        name="standard",
        role=Role.STANDARD,
        url="http://h:1",
        up=True,
        ready=True,
        limits=Limits(128, 512, 3, "dspark", vllm_version="0.32.0"),
        capacity=cap,
        windows={"1m": {MODEL: ModelWindow(server=health, engines={})}},
    )
    view = ObserveView(generated_at=10.0, targets={"standard": target})
    found = {a.alertname: a for a in candidates(view, None, no_for(rate_window="1m"))}
    assert found["SpecTokenBudgetBound"].summary == (
        "The token budget max_num_batched_tokens 512 is below N 128 x (1 + K 5 + S 4) = 1280, "
        "so at most 51 "
        "requests can decode per step on standard."
    )
    starving = found["SpecBudgetStarvation"]
    assert starving.labels["reason"] == "budget_cap"
    assert (
        "raise --max-num-batched-tokens to at least 1280 (max_num_seqs 128 x (1 + K 5 + S 4))"
        in starving.description
    )
    assert "SpecDecodeInactive" not in found  # drafts flow
    idle_window = ModelWindow(server=replace(health, drafts_per_second=0.0), engines={})
    idle = replace(target, windows={"1m": {MODEL: idle_window}})
    inactive = candidates(
        ObserveView(generated_at=10.0, targets={"standard": idle}),
        None,
        no_for(rate_window="1m"),
    )
    assert [a.description for a in inactive if a.alertname == "SpecDecodeInactive"] == [
        f"standard (role standard, model {MODEL}) generated 500 tokens/s over 1m with "
        "speculative decoding configured (K 5), but not one draft was verified."
    ]


def test_stall_fires_on_a_real_stall() -> None:
    """A server admitting nothing relative to its capacity: 4 of max_num_seqs 256 running
    (4/256 = 0.015625 <= 0.1), 492 waiting, KV 20 %, no tokens, no request finishing — the
    public report's numbers — is a stall; the same server with requests finishing is not."""
    s = no_for(rate_window="1m")
    eng = Engine(
        drafts_per_s=0,
        accepted_per_s=0,
        generation_per_s=0,
        steps_per_s=1,
        running=4,
        waiting=492,
        kv=0.2,
        finished_per_s=0,
    )
    target = TargetSettings(name="fly", url="http://h:1", max_num_seqs=256)
    sim = Sim(target, {"0": eng}, WINDOWS)
    for _ in range(8):
        snap = sim.scrape(10.0)
    fired = evaluate(snap, None, s, sim.t)
    assert _names(fired) == ["SpecAdmissionStall"]
    assert "runs 4 of the 256 its limits allow (1.56%)" in fired[0].description
    eng.finished_per_s = 0.5
    for _ in range(8):
        snap = sim.scrape(10.0)
    assert evaluate(snap, None, s, sim.t) == []


def test_no_stall_without_max_num_seqs() -> None:
    """Without max_num_seqs the ceiling is unknown: no stall is claimed (no absolute count)."""
    s = no_for(rate_window="1m")
    eng = Engine(
        drafts_per_s=0, accepted_per_s=0, generation_per_s=0, running=0, waiting=40, kv=0.05
    )
    eng.finished_per_s = 0
    sim = Sim(TargetSettings(name="fly", url="http://h:1"), {"0": eng}, WINDOWS)
    for _ in range(8):
        snap = sim.scrape(10.0)
    assert "SpecAdmissionStall" not in _names(evaluate(snap, None, s, sim.t))


def test_stale_or_down_target_fires_no_acceptance_alert() -> None:
    """A decayed target whose scrape then fails: only SpecwatchTargetDown (after its `for`)."""
    s = DetectSettings(acceptance_short_window="1m", acceptance_drop_for=0.0, target_down_for=20.0)
    engines = {"0": Engine()}
    sim = Sim(TargetSettings(name="fly", url="http://h:1"), engines, WINDOWS)
    detector = Detector(s)
    for _ in range(60):
        sim.scrape(10.0)
    engines["0"].accepted_per_s = 20.0
    for _ in range(6):
        snap = sim.scrape(10.0)
    assert _names(detector.evaluate(snap, None, sim.t)) == ["SpecAcceptanceDrop"]
    assert detector.evaluate(sim.fail(10.0), None, sim.t) == []  # down: pending, drop cleared
    fired = detector.evaluate(sim.fail(10.0), None, sim.t)
    assert fired == []
    fired = detector.evaluate(sim.fail(10.0), None, sim.t)
    assert [(a.alertname, dict(a.labels)) for a in fired] == [
        ("SpecwatchTargetDown", {"target": "fly", "role": "fly"})
    ]
    assert fired[0].summary == "Target fly cannot be scraped by specwatch."


def test_fly_gain_lost_from_the_pair_view() -> None:
    """Both servers accept 0.6: gain 0 < 0.02 with both drafting 100/s → SpecFLyGainLost."""
    s = DetectSettings(fly_gain_window="1m", fly_gain_for=0.0)
    std = TargetTracker(TargetSettings(name="standard", url="http://h:1"), WINDOWS)
    fly = TargetTracker(TargetSettings(name="fly", url="http://h:2"), WINDOWS)
    a, b = {"0": Engine()}, {"0": Engine()}
    for i in range(1, 8):
        for engines, tr in ((a, std), (b, fly)):
            engines["0"].advance(10.0)
            tr.record_page(i * 10.0, parse_page(page(engines)), duration_seconds=0.01)
    snap = build_view([std.snapshot(), fly.snapshot()], now=70.0)
    fired = evaluate(snap, None, s, 70.0)
    assert [(x.alertname, dict(x.labels)) for x in fired] == [
        ("SpecFLyGainLost", {"model_name": MODEL, "standard": "standard", "fly": "fly"})
    ]
    b["0"].accepted_per_s = 240.0  # α_fly 0.8 over the next minute: gain well above 0.02
    for i in range(8, 15):
        for engines, tr in ((a, std), (b, fly)):
            engines["0"].advance(10.0)
            tr.record_page(i * 10.0, parse_page(page(engines)), duration_seconds=0.01)
    snap = build_view([std.snapshot(), fly.snapshot()], now=140.0)
    assert evaluate(snap, None, s, 140.0) == []


def _shadow(tallies: Mapping[str, Mapping[str, PairTally]]) -> ShadowStats:
    return build_shadow_stats(tallies, now=0.0, levels=Levels(alpha=0.05, margin=0.01))


def test_quality_and_flip_from_shadow_stats() -> None:
    """FLy loses 40 and gains 5 of 215 math pairs: the e-value (critical, evidence) and the
    info-level non-inferiority state fire for `math` and `_all`; flips 40/200 against noise
    10/200 give z = 0.15 / sqrt(0.125 · 0.875 · 0.01) = 4.54 ≥ 3.09."""
    s = no_for()
    bad = PairTally(
        both_correct=150,
        lost=40,
        gained=5,
        both_wrong=20,
        agree=160,
        disagree=40,
        noise_agree=190,
        noise_disagree=10,
    )
    stats = _shadow({"since_start": {"math": bad}, "1h": {"math": bad}})
    fired = evaluate(ObserveView(generated_at=0.0), stats, s, 0.0)
    got = sorted((a.alertname, tuple(sorted(a.labels.items()))) for a in fired)
    assert got == sorted(
        [
            (
                "SpecQualityDrift",
                (("category", c), ("check", "e_value"), ("hypothesis", "no_net_loss")),
            )
            for c in ("_all", "math")
        ]
        + [("SpecNonInferiorityNotShown", (("category", c),)) for c in ("_all", "math")]
        + [("SpecFlipRateAboveNoise", (("category", "_all"),))]
    )
    fine = PairTally(
        both_correct=150,
        lost=5,
        gained=5,
        both_wrong=15,
        agree=195,
        disagree=5,
        noise_agree=196,
        noise_disagree=4,
    )
    assert (
        evaluate(ObserveView(generated_at=0.0), _shadow({"since_start": {"math": fine}}), s, 0.0)
        == []
    )


def test_margin_bound_is_its_share_of_paired_alpha() -> None:
    """The margin e-process has 1 % of the page's alpha: with paired.alpha 0.01 it fires at
    1/(0.01 x 0.01) = 10,000: e = 8,000 is quiet and e = 12,000 fires
    SpecQualityDrift{check="e_value", hypothesis="margin"}."""
    s = no_for()
    quiet = build_shadow_stats(
        {},
        now=0.0,
        levels=Levels(alpha=0.01),
        ordered=OrderedState(betting_log_e_value=math.log(8000.0)),
    )
    assert evaluate(ObserveView(generated_at=0.0), quiet, s, 0.0) == []
    loud = build_shadow_stats(
        {},
        now=0.0,
        levels=Levels(alpha=0.01),
        ordered=OrderedState(betting_log_e_value=math.log(12000.0)),
    )
    fired = evaluate(ObserveView(generated_at=0.0), loud, s, 0.0)
    assert [(a.alertname, dict(a.labels)) for a in fired] == [
        (
            "SpecQualityDrift",
            {"check": "e_value", "category": "_all", "hypothesis": "margin"},
        )
    ]


def test_for_seconds_by_alert_and_check() -> None:
    """for_seconds picks the hold time per alert and, for quality drift, per check."""
    s = DetectSettings()
    get = for_seconds(s)
    """Each alert's `for` comes from its settings field."""
    assert get(Alert("SpecNonInferiorityNotShown", Severity.INFO, "", "")) == 900.0
    assert get(Alert("SpecTokenBudgetBound", Severity.INFO, "", "")) == 0.0
    assert get(Alert("SpecQualityDrift", Severity.CRITICAL, "", "", {"check": "e_value"})) == 0.0
    assert get(Alert("SpecLosslessFlips", Severity.WARNING, "", "")) == 0.0
    assert get(Alert("SpecwatchTargetDown", Severity.WARNING, "", "")) == 300.0


def test_settings_groups_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """SPECWATCH_ALERTING__ and SPECWATCH_DETECT__ variables fill the alert groups; unset, the
    defaults return."""
    monkeypatch.setenv("SPECWATCH_ALERTING__URLS", '["http://am:9093/"]')
    monkeypatch.setenv("SPECWATCH_ALERTING__RESEND_INTERVAL", "30")
    monkeypatch.setenv("SPECWATCH_DETECT__ACCEPTANCE_DROP_FOR", "120")
    monkeypatch.setenv("SPECWATCH_DETECT__ACCEPTANCE_SHORT_WINDOW", "1m")
    s = load_settings()
    assert s.alerting.urls == ["http://am:9093"]
    assert s.alerting.resend_interval == 30.0
    assert (s.detect.acceptance_drop_for, s.detect.acceptance_short_window) == (120.0, "1m")
    monkeypatch.delenv("SPECWATCH_ALERTING__URLS")
    assert load_settings().alerting.urls == []
    assert Settings.model_fields["detect"].default == DetectSettings()


def test_engine_keeps_its_label_when_the_server_drops_too() -> None:
    """Four engines at α 0.6 (180 accepted of 300 draft tokens a second) for 10 minutes; then
    engine 3 accepts nothing and the others 160/s (α 0.5333). 1m window against since-start
    (from the first scrape at t = 10 s): server α_1m = 3·160/1200 = 0.4, since-start α =
    (4·590·180 + 3·60·160)/(4·650·300) = 453600/780000 = 0.5815, ratio 0.6878 < 0.8: the
    server fires. Engines 0-2: 0.5333 / ((590·180 + 60·160)/195000 = 0.5938) = 0.898: quiet.
    Engine 3: 0 < 0.8: fires with its engine label although the server fired too."""
    s = no_for(acceptance_short_window="1m")
    engines = {str(e): Engine() for e in range(4)}
    sim = Sim(TargetSettings(name="standard", url="http://h:1"), engines, WINDOWS)
    for _ in range(60):
        sim.scrape(10.0)
    engines["3"].accepted_per_s = 0.0
    for e in ("0", "1", "2"):
        engines[e].accepted_per_s = 160.0
    for _ in range(6):
        snap = sim.scrape(10.0)
    server = snap.targets["standard"].windows[SINCE_START][MODEL].server
    assert server.acceptance_rate == pytest.approx(453600 / 780000)
    fired = [a for a in evaluate(snap, None, s, sim.t) if a.alertname == "SpecAcceptanceDrop"]
    assert [(a.labels.get("scope"), a.labels.get("engine"), a.value) for a in fired] == [
        ("server", None, pytest.approx(0.4 / (453600 / 780000))),
        ("engine", "3", 0.0),
    ]
    assert fired[1].summary == (
        "Speculative-decoding acceptance dropped on engine 3 of standard (cause undetermined: "
        "drafter_change or traffic_change)."
    )


def test_decay_baseline_is_the_best_sustained_level_across_a_restart() -> None:
    """α 0.6 for 20 minutes (scrapes every minute, 15m window), then the engine restarts
    (counters to 0) and comes back at α 0.4 (120 of 300 draft tokens a second). The best 15m
    level seen is 0.6, kept across the restart: 0.4 / 0.6 = 0.6667 < 0.8 → SpecAcceptanceDecay
    with value 0.6667 on the first evaluation after the restart has a full 1m window."""
    s = no_for(acceptance_short_window="1m", acceptance_sustained_window="15m")
    engines = {"0": Engine()}
    sim = Sim(TargetSettings(name="fly", url="http://h:1"), engines, {"1m": 60.0, "15m": 900.0})
    detector = Detector(s)
    for _ in range(20):
        fired = detector.evaluate(sim.scrape(60.0), None, sim.t)
        assert "SpecAcceptanceDecay" not in _names(fired)
    engines["0"].reset()
    engines["0"].accepted_per_s = 120.0
    sim.start_time += 1300.0  # the new process
    snap = sim.scrape(60.0)
    snap = sim.scrape(60.0)
    fired = [
        a for a in detector.evaluate(snap, None, sim.t) if a.alertname == "SpecAcceptanceDecay"
    ]
    (alert,) = fired
    assert dict(alert.labels) == {
        "target": "fly",
        "role": "fly",
        "model_name": MODEL,
        "scope": "server",
        # every conditional rate kept (the page shows no prompt lengths to judge the drafter's
        # context limit by): whole drafts rejected or a changed drafter remain
        "cause": "undetermined",
    }
    assert alert.value == pytest.approx(0.4 / 0.6)
    assert alert.summary == (
        "Acceptance on fly is below 80% of its best sustained level in the last 6h (cause "
        "undetermined: drafter_context_limit or drafter_change)."
    )


def test_shadow_alerts_name_the_pair_they_come_from() -> None:
    """With a standard and a FLy target scraped, a quality alert carries the FLy target, its
    role and model and the standard target it was compared with (two pairs never merge); the
    lossless alert is about the standard server, so it carries that one (role standard) and
    names the FLy target beside it."""
    std = TargetTracker(TargetSettings(name="std-a", url="http://h:1", role=Role.STANDARD), WINDOWS)
    fly = TargetTracker(TargetSettings(name="fly-a", url="http://h:2", role=Role.FLY), WINDOWS)
    engines = {"0": Engine()}
    for i in range(1, 4):
        engines["0"].advance(10.0)
        for tr in (std, fly):
            tr.record_page(i * 10.0, parse_page(page(engines)), duration_seconds=0.01)
    view = build_view([std.snapshot(), fly.snapshot()], now=30.0)
    loud = build_shadow_stats(
        {},
        now=0.0,
        levels=Levels(alpha=0.05),
        ordered=OrderedState(betting_log_e_value=math.log(2500.0)),
    )
    (alert,) = evaluate(view, loud, no_for(), 30.0)
    assert rules_module._pair_labels(view, "standard") == {
        "target": "std-a",
        "role": "standard",
        "fly": "fly-a",
        "model_name": MODEL,
    }
    assert dict(alert.labels) == {
        "target": "fly-a",
        "role": "fly",
        "standard": "std-a",
        "model_name": MODEL,
        "check": "e_value",
        "category": "_all",
        "hypothesis": "margin",
    }


def _summary_parts(tree: ast.Module) -> list[tuple[str, list[ast.expr]]]:
    """(alertname, the pieces of its summary) for every ``Alert(...)`` built in a module: a
    string or f-string given directly, or every value assigned to the name given."""
    found: list[tuple[str, list[ast.expr]]] = []
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        assigned: dict[str, list[ast.expr]] = {}
        for node in ast.walk(fn):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        assigned.setdefault(target.id, []).append(node.value)
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
            if not (isinstance(call.func, ast.Name) and call.func.id == "Alert"):
                continue
            name, summary = call.args[0], call.args[2]
            assert isinstance(name, ast.Constant)
            values = assigned[summary.id] if isinstance(summary, ast.Name) else [summary]
            found.extend((str(name.value), [v]) for v in values)
    return found


def test_every_detector_summary_is_a_plain_capitalised_sentence() -> None:
    """Every summary the built-in detectors write (each ``Alert`` in alerts/rules.py and
    alerts/quality.py, read from its source) is a plain sentence as mixtool lint wants of the
    rules: its first word is fixed text starting with a capital letter (never a target name or
    a lower-case "specwatch"), it ends with a full stop, and it has no template ({{ }} or $)."""
    from specwatch.alerts import quality as quality_module

    found = [
        part
        for module in (rules_module, quality_module)
        for part in _summary_parts(ast.parse(Path(str(module.__file__)).read_text("utf-8")))
    ]
    assert len({name for name, _ in found}) >= 13
    for name, (value,) in found:
        pieces = list(value.values) if isinstance(value, ast.JoinedStr) else [value]
        first, last = pieces[0], pieces[-1]
        assert isinstance(first, ast.Constant), name
        assert isinstance(first.value, str), name
        assert isinstance(last, ast.Constant), name
        assert isinstance(last.value, str), name
        assert first.value[0].isupper(), (name, first.value)
        assert not first.value.lower().startswith("specwatch"), name
        assert last.value.endswith("."), (name, last.value)
        for piece in pieces:
            if isinstance(piece, ast.Constant):
                assert "{{" not in str(piece.value), name
                assert "$" not in str(piece.value), name
