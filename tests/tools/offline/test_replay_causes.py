"""``specwatch replay`` over written timelines: each acceptance and budget alert names its cause.

Every timeline is a directory of ``<seconds>.prom`` pages one minute apart, written from
per-minute increases (:class:`Minute`) the way vLLM counts them (vllm-metrics.md §2, §6): each
request step adds 1 + accepted to ``generation_tokens``; a step that scheduled a draft adds one
draft, its draft tokens and, per position i, 1 when its first i+1 tokens were all accepted. The
values below are worked out by hand in each test's docstring.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from specwatch.__main__ import main as cli_main

SEL = 'engine="0",model_name="m"'
#: the 1-2-5 buckets vLLM gives ``request_tokens`` histograms (up to max_model_len)
PROMPT_BOUNDS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0)


@dataclass(frozen=True)
class Minute:
    """Increases over one minute of one server (one engine, model ``m``).

    ``per_pos``: drafts in which positions 0..i were all accepted, per draft (p_i), so accepted
    tokens = drafts · Σ p_i; ``other_steps``: request steps without a draft (1 token each);
    ``prompt_lengths``: finished prompts per length bucket bound (not cumulative)."""

    drafts: float
    draft_len: float
    per_pos: tuple[float, ...]
    steps: float = 600.0
    other_steps: float = 0.0
    prompt: float = 1000.0
    prompt_lengths: dict[float, float] = field(default_factory=lambda: {500.0: 10.0})
    running: float = 32.0


def write_timeline(directory: Path, phases: Sequence[tuple[int, Minute]]) -> Path:
    """``0.prom`` (every counter 0, the K position children present) and one page per minute of
    each phase (``(minutes, increases)``), counters cumulated."""
    directory.mkdir(parents=True, exist_ok=True)
    k = max(len(m.per_pos) for _, m in phases)
    total: dict[str, float] = {}
    hist = dict.fromkeys(PROMPT_BOUNDS, 0.0)
    running = phases[0][1].running
    minute = 0

    def page() -> str:
        def c(name: str) -> float:
            return total.get(name, 0.0)

        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{SEL}}} {running}",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{SEL}}} 0.0",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{SEL}}} {c('gen')}",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{{{SEL}}} {c('prompt')}",
            "# TYPE vllm:spec_decode_num_drafts_total counter",
            f"vllm:spec_decode_num_drafts_total{{{SEL}}} {c('drafts')}",
            "# TYPE vllm:spec_decode_num_draft_tokens_total counter",
            f"vllm:spec_decode_num_draft_tokens_total{{{SEL}}} {c('draft_tokens')}",
            "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
            f"vllm:spec_decode_num_accepted_tokens_total{{{SEL}}} {c('accepted')}",
            "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter",
        ]
        lines += [
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{SEL},position="{i}"}} '
            f"{c(f'pos{i}')}"
            for i in range(k)
        ]
        lines += [
            "# TYPE vllm:iteration_tokens_total histogram",
            f'vllm:iteration_tokens_total_bucket{{{SEL},le="+Inf"}} {c("steps")}',
            f"vllm:iteration_tokens_total_count{{{SEL}}} {c('steps')}",
            f"vllm:iteration_tokens_total_sum{{{SEL}}} 0.0",
            "# TYPE vllm:request_prompt_tokens histogram",
        ]
        cum = 0.0
        for le in PROMPT_BOUNDS:
            cum += hist[le]
            lines.append(f'vllm:request_prompt_tokens_bucket{{{SEL},le="{le}"}} {cum}')
        lines += [
            f'vllm:request_prompt_tokens_bucket{{{SEL},le="+Inf"}} {cum}',
            f"vllm:request_prompt_tokens_count{{{SEL}}} {cum}",
            f"vllm:request_prompt_tokens_sum{{{SEL}}} 0.0",
        ]
        return "\n".join(lines) + "\n"

    (directory / "0.prom").write_text(page(), encoding="utf-8")
    for minutes, m in phases:
        for _ in range(minutes):
            minute += 1
            accepted = m.drafts * sum(m.per_pos)
            inc = {
                "drafts": m.drafts,
                "draft_tokens": m.drafts * m.draft_len,
                "accepted": accepted,
                "gen": m.drafts + accepted + m.other_steps,
                "prompt": m.prompt,
                "steps": m.steps,
                **{f"pos{i}": m.drafts * p for i, p in enumerate(m.per_pos)},
            }
            for key, v in inc.items():
                total[key] = total.get(key, 0.0) + v
            for le, n in m.prompt_lengths.items():
                hist[le] += n
            running = m.running
            (directory / f"{60 * minute}.prom").write_text(page(), encoding="utf-8")
    return directory


def replay(capsys: pytest.CaptureFixture[str], *targets: str) -> list[dict[str, Any]]:
    """The alerts of ``specwatch replay --format json`` over ``targets`` (``--target`` specs)."""
    argv = ["replay", "--format", "json"]
    for spec in targets:
        argv += ["--target", spec]
    rc = cli_main(argv)
    out = capsys.readouterr()
    assert rc == 0, out.err
    alerts: list[dict[str, Any]] = json.loads(out.out)["alerts"]
    return alerts


@pytest.fixture(autouse=True)
def every_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    """Evaluate once a minute, at the pages' scrape times."""
    monkeypatch.setenv("SPECWATCH_ALERTING__EVALUATION_INTERVAL", "60")


LIMITS = "max_num_seqs=256,max_num_batched_tokens=8192,num_speculative_tokens=4,method=eagle3"

#: K 4 drafted as 2 tokens by a server whose K falls with batch size (or grammar-invalidated
#: tokens): 32 running, 32 drafts per step, 600 steps a minute; p0 0.8, p1 0.6.
#: accepted = 19200 · 1.4 = 26880, generated = 19200 + 26880 = 46080 a minute;
#: scheduled per step = (1000 + 46080 + 38400 − 26880) / 600 = 97.67 tokens, far below B.
SHORT = Minute(drafts=19200.0, draft_len=2.0, per_pos=(0.8, 0.6, 0.0, 0.0))


def _names(alerts: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [a for a in alerts if a["alertname"] == name]


def test_dynamic_k_is_no_budget_starvation(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """ℓ = 2 < 0.9 · K 4 with 32 running for 25 minutes, but each step schedules 97.67 tokens of
    a budget of 8192 (and D_full = 8192 // 5 = 1638 ≥ 32): the budget cannot be what shortens
    the drafts, so no SpecBudgetStarvation fires, with or without ``dynamic_k`` configured
    (before: draft_truncation fired after its 15 minutes, telling to raise the budget)."""
    d = write_timeline(tmp_path / "dyn", [(25, SHORT)])
    for extra in ("", ",dynamic_k=true"):
        alerts = replay(capsys, f"dyn={d},role=standard,{LIMITS}{extra}")
        assert _names(alerts, "SpecBudgetStarvation") == []


def test_grammar_short_drafts_are_no_budget_starvation(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Structured output: vLLM subtracts the draft tokens the grammar invalidates, so ℓ = 3.2 of
    K 4 (0.8 tokens a draft invalidated on average). The budget is far from full (scheduled
    (1000 + 19200 · (1 + 2.0) + 19200 · 3.2 − 19200 · 2.0) / 600 ≈ 136 tokens a step of 8192),
    so no SpecBudgetStarvation, configured as structured output or not. The ℓ = 2 pages of
    :data:`SHORT` on a server whose steps fill the budget (B 100: 97.67 ≥ 0.9 · 100, and 32
    running > D_full 100 // 5 = 20) fire draft_truncation with ``cause="token_budget"`` and the
    summary saying so."""
    grammar = Minute(drafts=19200.0, draft_len=3.2, per_pos=(0.8, 0.6, 0.4, 0.2))
    d = write_timeline(tmp_path / "json", [(25, grammar)])
    for extra in ("", ",structured_output=true"):
        alerts = replay(capsys, f"g={d},role=standard,{LIMITS}{extra}")
        assert _names(alerts, "SpecBudgetStarvation") == []
    d2 = write_timeline(tmp_path / "tight", [(25, SHORT)])
    tight = LIMITS.replace("8192", "100")
    found = [
        a
        for a in _names(replay(capsys, f"t={d2},role=standard,{tight}"), "SpecBudgetStarvation")
        if a["labels"]["reason"] == "draft_truncation"
    ]
    assert len(found) == 1
    assert found[0]["labels"]["cause"] == "token_budget"
    assert found[0]["value"] == pytest.approx(2.0, rel=1e-9)
    assert "by the token budget" in found[0]["summary"]
    assert found[0]["fired_at"] == 960.0  # first window at 60 s, for 900 s


#: K 3 with a good drafter: p = (0.7, 0.5, 0.35): conditional rates 0.714, 0.7 from position 1.
GOOD = Minute(drafts=6000.0, draft_len=3.0, per_pos=(0.7, 0.5, 0.35))
#: Half the drafts zero-filled (the drafter's context limit): counted drafted and rejected, so
#: every p_i halves and the conditional rates from position 1 stay; prompts over 2000 tokens
#: (bucket 5000) finish now.
ZERO_FILLED = Minute(
    drafts=6000.0,
    draft_len=3.0,
    per_pos=(0.35, 0.25, 0.175),
    prompt_lengths={500.0: 5.0, 5000.0: 5.0},
)
#: A worse drafter: the conditional rates fall too (0.6, 0.33 → 0.2/0.6, 0.05/0.2).
WORSE = Minute(drafts=6000.0, draft_len=3.0, per_pos=(0.6, 0.2, 0.05))
K3 = "num_speculative_tokens=3,method=eagle3"


def test_context_limit_zero_fill_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """60 good minutes, then 20 with half the drafts zero-filled. α(5m) = (0.35 + 0.25 +
    0.175) / 3 = 0.2583 against the since-start α (the 1h window is not configured) > 0.35, so
    SpecAcceptanceDrop fires; the conditional rates from position 1 are unchanged (0.714, 0.7)
    and 50 % of the prompts are over 2000 ≥ 2048 − 3: ``cause="drafter_context_limit"``, and the
    summary names it (before: no cause; the text blamed a restart or new weights). Without the
    drafter's limit configured the summary says which candidates remain."""
    d = write_timeline(tmp_path / "ctx", [(60, GOOD), (20, ZERO_FILLED)])
    alerts = replay(capsys, f"eagle={d},role=standard,{K3},drafter_max_model_len=2048")
    drops = _names(alerts, "SpecAcceptanceDrop") + _names(alerts, "SpecAcceptanceDecay")
    assert drops
    for a in drops:
        assert a["labels"]["cause"] == "drafter_context_limit"
        assert "cause: drafter_context_limit" in a["summary"]
    alerts = replay(capsys, f"eagle={d},role=standard,{K3}")
    drop = _names(alerts, "SpecAcceptanceDrop")
    assert drop
    assert drop[0]["labels"]["cause"] == "undetermined"
    assert "drafter_context_limit or drafter_change" in drop[0]["summary"]


def test_worse_drafter_is_not_the_context_limit(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The same drop with the conditional rates falling (0.5 → 0.33, 0.7 → 0.25) and long
    prompts absent: the drafter or the traffic changed, never the context limit."""
    d = write_timeline(tmp_path / "worse", [(60, GOOD), (20, WORSE)])
    alerts = replay(capsys, f"eagle={d},role=standard,{K3},drafter_max_model_len=2048")
    drop = _names(alerts, "SpecAcceptanceDrop")
    assert drop
    assert {a["labels"]["cause"] for a in drop} == {"undetermined"}
    assert "drafter_change or traffic_change" in drop[0]["summary"]


#: FLy's relaxed verification on the GOOD drafter: p = (0.85, 0.7, 0.55), α = 0.7.
FLY_GOOD = Minute(drafts=6000.0, draft_len=3.0, per_pos=(0.85, 0.7, 0.55))
#: A stricter FLy threshold: p = (0.75, 0.5, 0.3), α = 0.5167 (standard's level), conditional
#: rates 0.667, 0.6 against 0.824, 0.786 before.
FLY_STRICT = Minute(drafts=6000.0, draft_len=3.0, per_pos=(0.75, 0.5, 0.3))


def test_fly_threshold_change_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The standard server keeps α = (0.7 + 0.5 + 0.35) / 3 = 0.5167 throughout. The FLy server
    (same drafter) falls from α 0.7 to 0.5167 with its conditional rates: α(5m) / α(since
    start) < 0.8, standard did not drop, and FLy still accepts at least 0.95 × standard's α, as
    a stricter FLy threshold does (FLy accepts all the exact rule accepts): ``cause=
    "fly_threshold"`` on the FLy target only. When FLy falls below standard's level (α 0.283,
    :data:`WORSE`), a threshold cannot explain it: ``drafter_change`` (FLy's own drafter)."""
    good = write_timeline(tmp_path / "std", [(80, GOOD)])
    fly = write_timeline(tmp_path / "fly", [(60, FLY_GOOD), (20, FLY_STRICT)])
    alerts = replay(capsys, f"standard={good},{K3}", f"fly={fly},{K3}")
    drop = _names(alerts, "SpecAcceptanceDrop")
    assert [(a["labels"]["target"], a["labels"]["cause"]) for a in drop] == [
        ("fly", "fly_threshold")
    ]
    assert "cause: fly_threshold" in drop[0]["summary"]
    worse = write_timeline(tmp_path / "fly-worse", [(60, FLY_GOOD), (20, WORSE)])
    drop = _names(
        replay(capsys, f"standard={good},{K3}", f"fly={worse},{K3}"), "SpecAcceptanceDrop"
    )
    assert [(a["labels"]["target"], a["labels"]["cause"]) for a in drop] == [
        ("fly", "drafter_change")
    ]


def test_ngram_without_proposals(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """ngram, K 3, 16 running: only 4 of the 16 request steps per engine step draft (2400
    drafts a minute over 600 steps; 7200 request steps without a proposal add 1 token each).
    drafts per step 4 < 0.5 · 16, but with accepted = 2400 · 1.2 = 2880 and generated =
    2400 + 2880 + 7200 = 12480, steps schedule (1000 + 12480 + 7200 − 2880) / 600 ≈ 29.7 tokens
    of 8192: no SpecBudgetStarvation (before: ``drafts_per_step`` fired after 15 minutes,
    blaming the token budget)."""
    sparse = Minute(
        drafts=2400.0, draft_len=3.0, per_pos=(0.6, 0.4, 0.2), other_steps=7200.0, running=16.0
    )
    d = write_timeline(tmp_path / "ngram", [(25, sparse)])
    limits = "max_num_seqs=256,max_num_batched_tokens=8192,num_speculative_tokens=3,method=ngram"
    assert _names(replay(capsys, f"ng={d},role=standard,{limits}"), "SpecBudgetStarvation") == []


def test_decode_pod_collapse_against_baseline(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Prefill/decode disaggregation: the decode pods' MTP (K 1) accepts 0.08 of draft tokens,
    the monolithic baseline with the same drafter 0.62, from the first minute on (no history of
    their own to drop from). SpecAcceptanceDrop ``scope="baseline"`` fires on the decode target
    with value 0.08 / 0.62 and ``cause="disaggregation"`` after its 10 minutes (first window at
    60 s, fired at 660 s)."""
    decode = write_timeline(
        tmp_path / "decode", [(15, Minute(drafts=6000.0, draft_len=1.0, per_pos=(0.08,)))]
    )
    base = write_timeline(
        tmp_path / "mono", [(15, Minute(drafts=6000.0, draft_len=1.0, per_pos=(0.62,)))]
    )
    mtp = "num_speculative_tokens=1,method=mtp"
    alerts = replay(capsys, f"decode={decode},{mtp}", f"mono={base},role=baseline,{mtp}")
    drop = _names(alerts, "SpecAcceptanceDrop")
    assert len(drop) == 1
    a = drop[0]
    assert a["labels"] == {
        "target": "decode",
        "role": "decode",
        "model_name": "m",
        "scope": "baseline",
        "baseline": "mono",
        "cause": "disaggregation",
    }
    assert a["value"] == pytest.approx(0.08 / 0.62, rel=1e-9)
    assert a["fired_at"] == 660.0


def test_busy_prefill_pod_is_not_decode_inactive(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A prefill pod: the spec-decode families at zero with K 3 ``position`` children, 1000
    first tokens a second. It is never expected to draft: no SpecDecodeInactive, even with K
    configured; the same pages as ``decode`` (meant to speculate) fire it."""
    quiet = Minute(drafts=0.0, draft_len=3.0, per_pos=(0.0, 0.0, 0.0), other_steps=60000.0)
    d = write_timeline(tmp_path / "prefill", [(15, quiet)])
    assert replay(capsys, f"prefill={d}") == []
    assert replay(capsys, f"p={d},role=prefill,num_speculative_tokens=3") == []
    fired = replay(capsys, f"decode={d}")
    assert [(a["alertname"], a["value"]) for a in fired] == [("SpecDecodeInactive", 1000.0)]
