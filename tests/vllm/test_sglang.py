"""SGLang facts: engine detection, N from the accept-rate gauge per formula era, α from τ, the
budget rule and the /server_info facts (values worked by hand from SGLang's formulas)."""

from __future__ import annotations

import json

import pytest

from specwatch.vllm.sglang import (
    alpha_from_tau,
    budget,
    detect_engine,
    draft_tokens_from_rate,
    rate_formula,
    server_info_facts,
)
from tests.fixture_files import FIXTURES, body


def test_detect_engine_by_series() -> None:
    """A vllm:* line makes a vLLM page, a sglang:* line (and no vllm:*) an SGLang page,
    neither gives None (not a serving engine's page)."""
    assert detect_engine(body("vllm-metrics/real-cpu-ngram.txt")) == "vllm"
    assert detect_engine(body("sglang/sglang-0.5.23-nospec-tp1.metrics")) == "sglang"
    assert detect_engine("# HELP x y\nother_metric 1\n") is None
    assert detect_engine("sglang:num_running_reqs 1\n") == "sglang"


def test_rate_formula_from_help_text() -> None:
    """The two HELP wordings name the two eras; any other text is unknown."""
    old = "The average acceptance rate of speculative decoding (`accepted tokens / total draft"
    new = "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch)."
    assert rate_formula(old + " tokens` in batch).") == "tau_over_n"
    assert rate_formula(new) == "alpha"
    assert rate_formula("something else") is None


@pytest.mark.parametrize(
    ("tau", "rate", "era", "n"),
    [
        (2.8, 0.7, "tau_over_n", 4),  # 0.5.10: 3584 / (1280 * 4) = 0.7
        (2.8, 0.6, "alpha", 4),  # 0.5.11+: (2.8 - 1) / 3 = 0.6
        (2.5, 2.5, "tau_over_n", None),  # NGRAM before 0.5.5.post3: rate = tau, above 1
        (2.8, 0.66, "tau_over_n", None),  # 4.24: not a whole N
        (2.8, 0.7, None, None),  # era unknown
    ],
)
def test_draft_tokens_from_rate(tau: float, rate: float, era: str | None, n: int | None) -> None:
    """N = τ / rate (tau_over_n era) or 1 + (τ − 1) / rate (alpha era); a rate above 1 or an
    N that is not whole gives None."""
    assert draft_tokens_from_rate(tau, rate, era) == n  # type: ignore[arg-type]


def test_alpha_from_tau() -> None:
    """α = (τ − 1) / (N − 1): τ 2.8 with N 4 is 0.6; τ 2.5 with NGRAM's N 12 is 1.5 / 11."""
    assert alpha_from_tau(2.8, 4) == pytest.approx(0.6)
    assert alpha_from_tau(2.5, 12) == pytest.approx(1.5 / 11)
    assert alpha_from_tau(2.0, 1) is None


def test_budget_rule() -> None:
    """48 running requests verifying N = 4 tokens each: a verify forward of 192 tokens; the KV
    reservation per request is max(S · topk, N): 4 for a chain of 3 steps, 20 for 5 steps of a
    top-4 tree."""
    chain = budget(48, 4, 3, 1)
    assert (chain.admission_cap, chain.tokens_per_request) == (48, 4)
    assert (chain.verify_tokens_per_step, chain.kv_reserved_per_request) == (192, 4)
    assert budget(48, 8, 5, 4).kv_reserved_per_request == 20
    assert budget(64, None, None, 1).verify_tokens_per_step == 64


def test_server_info_facts_from_the_fixture() -> None:
    """The saved 0.5.10 /server_info body: EAGLE, N 4, S 3, topk 1, 48 requests per DP rank,
    chunked prefill 8192, version 0.5.10."""
    text = (FIXTURES / "sglang/replies/sglang-0.5.10-server-info-eagle-tp2.http").read_text()
    doc = json.loads(text.split("\n\n", 1)[1])
    assert server_info_facts(doc) == {
        "version": "0.5.10",
        "speculative_algorithm": "EAGLE",
        "num_draft_tokens": 4,
        "num_steps": 3,
        "topk": 1,
        "max_running_requests": 48,
        "chunked_prefill_size": 8192,
    }
