"""Verification rules: standard rejection sampling is lossless; FLy as vLLM 0.33 implements it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from specwatch.simulate.config import Role, SimConfig
from specwatch.simulate.engine_core import Simulation
from specwatch.simulate.lm import (
    DraftSampleMethod,
    DynState,
    FlyParams,
    LMConfig,
    SeqTable,
    SyntheticLM,
    process_probs,
    topk_entropy,
    verify,
    verify_arrays,
)
from specwatch.simulate.quiz import params_for_prompt


def _batch(lm: SyntheticLM, n: int, temperature: float, prompt: str) -> tuple[SeqTable, np.ndarray]:
    table = SeqTable(n)
    params = params_for_prompt(prompt)
    rows = [
        table.allocate(params, seed=1000 + i, temperature=temperature, top_p=1.0,
                       last_prompt_tokens=(20, 30))
        for i in range(n)
    ]  # fmt: skip
    return table, np.array(rows, dtype=np.int64)


def _first_token_counts(
    lm: SyntheticLM, table: SeqTable, rows: np.ndarray, k: int, fly: FlyParams | None,
    method: DraftSampleMethod,
) -> np.ndarray:  # fmt: skip
    res = verify(lm, table, rows, np.full(rows.shape[0], k, np.int64),
                 draft_noise=np.full(rows.shape[0], lm.config.draft_noise), fly=fly,
                 draft_method=method)  # fmt: skip
    first = np.array([t[0] for t in res.tokens])
    return np.bincount(first, minlength=lm.vocab_size)


def _chi2_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] < 5:  # fold a tiny remainder into the largest bin
        obs[np.argmax(exp[:-1])] += obs[-1]
        exp[np.argmax(exp[:-1])] += exp[-1]
        obs, exp = obs[:-1], exp[:-1]
    assert obs.sum() == n
    assert np.all(counts[probs == 0] == 0)
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


@pytest.mark.parametrize("method", [DraftSampleMethod.GREEDY, DraftSampleMethod.RANDOM])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_standard_rejection_sampling_preserves_target_distribution(
    method: DraftSampleMethod, temperature: float
) -> None:
    """Standard rejection sampling keeps the target distribution (chi-square) for each draft
    sampling method."""
    # draft noise high so that many drafts are rejected and recovered tokens matter
    lm = SyntheticLM(LMConfig(seed=3, target_sharpness=3.0, draft_noise=1.5))
    table, rows = _batch(lm, 6000, temperature, "a plain prompt for the chi square test")
    st = DynState.of(table, rows[:1])
    pm, _ = lm.target_and_draft(table, rows[:1], st, np.array([1.5]))
    p0 = process_probs(pm, np.array([temperature]), np.array([1.0]))[0]
    counts = _first_token_counts(lm, table, rows, 3, None, method)
    assert _chi2_pvalue(counts, p0) > 1e-3


def test_chi_square_has_power_against_fly() -> None:
    """The same chi-square test rejects FLy at threshold 0, which is lossy."""
    # the same test rejects FLy (threshold 0: waive whenever the window passes), which is lossy
    lm = SyntheticLM(LMConfig(seed=3, target_sharpness=3.0, draft_noise=1.5))
    table, rows = _batch(lm, 6000, 1.0, "a plain prompt for the chi square test")
    st = DynState.of(table, rows[:1])
    pm, _ = lm.target_and_draft(table, rows[:1], st, np.array([1.5]))
    p0 = process_probs(pm, np.array([1.0]), np.array([1.0]))[0]
    fly = FlyParams(1, 0.0, 3)
    fly_counts = _first_token_counts(lm, table, rows, 3, fly, DraftSampleMethod.GREEDY)
    assert _chi2_pvalue(fly_counts, p0) < 1e-4


def _run(role: Role, prompts: list[str], temperature: float, **kw: object) -> list[list[int]]:
    cfg = SimConfig(role=role, num_speculative_tokens=4, **kw)  # type: ignore[arg-type]
    sim = Simulation(cfg)
    reqs = [sim.submit(p, max_tokens=80, temperature=temperature, seed=i)
            for i, p in enumerate(prompts)]  # fmt: skip
    sim.run_until(math.inf)
    assert all(r.finish_reason is not None for r in reqs)
    return [r.output for r in reqs]


PROMPTS = [f"tell me about item {i} in the list" for i in range(24)]


def test_greedy_standard_equals_baseline_token_for_token() -> None:
    """Greedy standard decoding equals the baseline token for token."""
    std = _run(Role.STANDARD, PROMPTS, 0.0)
    base = _run(Role.BASELINE, PROMPTS, 0.0)
    assert std == base
    assert sum(len(o) for o in std) > 24 * 20


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_fly_with_infinite_threshold_equals_standard(temperature: float) -> None:
    """FLy with an infinite threshold equals standard decoding, with no waivers."""
    cfg_std = SimConfig(role=Role.STANDARD)
    cfg_fly = SimConfig(role=Role.FLY, fly_entropy_threshold=math.inf)
    outs = []
    truths = []
    for cfg in (cfg_std, cfg_fly):
        sim = Simulation(cfg)
        reqs = [sim.submit(p, max_tokens=80, temperature=temperature, seed=7 + i)
                for i, p in enumerate(PROMPTS)]  # fmt: skip
        sim.run_until(math.inf)
        outs.append([r.output for r in reqs])
        truths.append(sim.cores[0].truth.as_dict())
    assert outs[0] == outs[1]
    assert truths[0] == truths[1]
    assert truths[1]["fly_waivers"] == 0


def test_fly_acceptance_never_below_standard_on_the_same_drafts() -> None:
    """On the same drafts FLy accepts at least as many tokens as standard, never more than
    drafted."""
    rng = np.random.default_rng(11)
    n, k, v = 4000, 5, 6
    logits = rng.standard_normal((n, k + 1, v)) * 1.5
    p = np.exp(logits) / np.exp(logits).sum(axis=2, keepdims=True)
    ql = logits[:, :k] + rng.standard_normal((n, k, v))
    q = np.exp(ql) / np.exp(ql).sum(axis=2, keepdims=True)
    drafts = np.array([[rng.choice(v, p=q[i, j]) for j in range(k)] for i in range(n)])
    num_drafts = rng.integers(1, k + 1, n)
    greedy = rng.random(n) < 0.3
    u = rng.random((n, k))
    std, _, _ = verify_arrays(p=p, q=q, drafts=drafts, num_drafts=num_drafts, greedy=greedy,
                              u_accept=u)  # fmt: skip
    for window, thr in [(1, 0.3), (2, 0.5), (4, 0.0)]:
        fly, waived, _ = verify_arrays(p=p, q=q, drafts=drafts, num_drafts=num_drafts,
                                       greedy=greedy, u_accept=u,
                                       fly=FlyParams(window, thr, 3))  # fmt: skip
        assert np.all(fly >= std)
        assert np.all(fly <= num_drafts)
        assert fly.sum() > std.sum()  # waivers happened
        # every extra accepted token is explained by waivers inside the prefix
        assert np.all(fly - std <= num_drafts)
        assert np.all((fly > std) <= (waived > 0))
    acc_std = std.sum() / num_drafts.sum()
    assert 0.0 < acc_std < 1.0


def test_topk_entropy_by_hand() -> None:
    """topk_entropy equals the hand-computed top-3 entropy without renormalising."""
    p = np.array([[0.6, 0.25, 0.15, 0.0], [0.97, 0.02, 0.01, 0.0], [0.5, 0.2, 0.1, 0.1]])
    h = topk_entropy(p, 3)
    by_hand = [
        -(0.6 * math.log(0.6) + 0.25 * math.log(0.25) + 0.15 * math.log(0.15)),  # 0.9377
        -(0.97 * math.log(0.97) + 0.02 * math.log(0.02) + 0.01 * math.log(0.01)),  # 0.1540
        # top 3 of [0.5, 0.2, 0.1, 0.1] NOT renormalised: 0.34657 + 0.32189 + 0.23026
        -(0.5 * math.log(0.5) + 0.2 * math.log(0.2) + 0.1 * math.log(0.1)),
    ]
    assert h == pytest.approx(by_hand, abs=1e-12)
    assert h[0] == pytest.approx(0.93766, abs=1e-4)
    assert h[2] == pytest.approx(0.89872, abs=1e-4)


def _greedy_case(native: list[bool], high: list[bool]) -> tuple[np.ndarray, np.ndarray]:
    """Target rows over V=4: high entropy [0.6,.25,.15,0] or low [.97,.02,.01,0]; argmax token 0.
    A natively accepted draft is token 0, a rejected one token 1 (p > 0)."""
    hi = [0.6, 0.25, 0.15, 0.0]
    lo = [0.97, 0.02, 0.01, 0.0]
    p = np.array([[hi if h else lo for h in high] + [hi]], dtype=np.float64)
    drafts = np.array([[0 if a else 1 for a in native]])
    return p, drafts


@pytest.mark.parametrize(
    ("native", "high", "window", "expected_fly", "expected_std", "expected_waived"),
    [
        # reject at 1 (high entropy), 2 and 3 native (window W=2 fits: 1+2 < 5) -> waived;
        # reject at 4: 4+2 >= 5, the window does not fit -> stop at 4
        ([1, 0, 1, 1, 0], [1, 1, 1, 1, 1], 2, 4, 1, 1),
        # same, but position 1 has low entropy (0.154 < 0.3): no waiver
        ([1, 0, 1, 1, 0], [1, 0, 1, 1, 1], 2, 1, 1, 0),
        # reject at 0 whose window holds a native rejection (at 2): no waiver at 0
        ([0, 1, 0, 1, 1], [1, 1, 1, 1, 1], 2, 0, 0, 0),
        # waived at 0; reject at 3 cannot be waived (3+2 >= 5) -> accepted length 3
        ([0, 1, 1, 0, 1], [1, 1, 1, 1, 1], 2, 3, 0, 1),
        # W=1: two waivers in one draft (at 0 and at 2), all 5 accepted
        ([0, 1, 0, 1, 1], [1, 1, 1, 1, 1], 1, 5, 0, 2),
        # W=1: a rejection at the last position never fits (4+1 >= 5)
        ([1, 1, 1, 1, 0], [1, 1, 1, 1, 1], 1, 4, 4, 0),
    ],
)
def test_fly_hand_worked_greedy(
    native: list[int], high: list[int], window: int, expected_fly: int, expected_std: int,
    expected_waived: int,
) -> None:  # fmt: skip
    """Hand-worked greedy cases give the expected standard and FLy acceptances and waivers."""
    p, drafts = _greedy_case([bool(a) for a in native], [bool(h) for h in high])
    q = np.zeros((1, 5, 4))
    q[0, np.arange(5), drafts[0]] = 1.0
    common = {"p": p, "q": q, "drafts": drafts, "num_drafts": np.array([5]),
              "greedy": np.array([True]), "u_accept": np.full((1, 5), 0.5)}  # fmt: skip
    std, _, _ = verify_arrays(**common)  # type: ignore[arg-type]
    fly, waived, _ = verify_arrays(**common, fly=FlyParams(window, 0.3, 3))
    assert int(std[0]) == expected_std
    assert int(fly[0]) == expected_fly
    assert int(waived[0]) == expected_waived


def test_fly_hand_worked_random_request() -> None:
    """A hand-worked random request is waived as expected, not with q(x) = 0 nor above the
    entropy gate."""
    # K_d = 4, W = 2, random request: native iff p(x) >= u * q(x)
    p = np.array([[[0.5, 0.3, 0.2]] * 5])  # top-3 entropy 1.0297 nats >= 0.3
    q = np.array([[[0.2, 0.6, 0.2]] * 4])
    drafts = np.array([[1, 0, 0, 1]])
    # position 0: p/q = 0.5 < u = 0.9 -> native reject; 1, 2: p/q = 2.5 -> accept;
    # position 3: p/q = 0.5 < 0.9 -> reject, 3 + 2 >= 4 so no waiver
    u = np.array([[0.9, 0.9, 0.9, 0.9]])
    common = {"p": p, "q": q, "drafts": drafts, "num_drafts": np.array([4]),
              "greedy": np.array([False]), "u_accept": u}  # fmt: skip
    std, _, _ = verify_arrays(**common)  # type: ignore[arg-type]
    fly, waived, _ = verify_arrays(**common, fly=FlyParams(2, 0.3, 3))
    assert (int(std[0]), int(fly[0]), int(waived[0])) == (0, 3, 1)
    # q(x) = 0 makes the token invalid for a random request: no waiver
    q0 = q.copy()
    q0[0, 0] = [1.0, 0.0, 0.0]
    common["q"] = q0
    fly0, _, _ = verify_arrays(**common, fly=FlyParams(2, 0.3, 3))
    assert int(fly0[0]) == 0
    # entropy gate: threshold above 1.0297 blocks the waiver
    common["q"] = q
    fly_hi, _, _ = verify_arrays(**common, fly=FlyParams(2, 1.05, 3))
    assert int(fly_hi[0]) == 0
