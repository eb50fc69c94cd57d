"""E-process properties: exact Ville bound on small horizons, closed form vs quadrature."""

from __future__ import annotations

import ast
import itertools
import math

import numpy as np
import pytest
from scipy.integrate import quad
from scipy.stats import beta as beta_dist

from specwatch.shadow.stats.sequential import (
    BettingEProcess,
    alarm,
    beta_binomial_e_value,
    beta_binomial_log_e_value,
    beta_binomial_log_e_values,
    betting_log_wealth,
    betting_path,
    e_value_alarm,
    first_alarm,
    run_betting,
)
from tests.fakes import REPO


@pytest.mark.parametrize(("lost", "gained", "p0", "a", "b"), [(5, 2, 0.5, 1, 1), (9, 3, 0.6, 2, 1)])
def test_closed_form_matches_quadrature(
    lost: int, gained: int, p0: float, a: float, b: float
) -> None:
    """The beta-binomial e-value's closed form equals numeric integration over the prior."""
    prior_mass = beta_dist.sf(p0, a, b)

    def integrand(t: float) -> float:
        return float(t**lost * (1 - t) ** gained * beta_dist.pdf(t, a, b) / prior_mass)

    num = quad(integrand, p0, 1.0)[0]
    expected = num / (p0**lost * (1 - p0) ** gained)
    assert beta_binomial_e_value(lost, gained, p0, a, b) == pytest.approx(expected, rel=1e-7)
    assert beta_binomial_e_value(0, 0) == pytest.approx(1.0)


def _exact_crossing_probability(theta: float, horizon: int, alpha: float, p0: float) -> float:
    """P(sup_{t<=horizon} E_t >= 1/alpha) by dynamic programming over (lost, gained)."""
    threshold = -math.log(alpha)
    # prob[l] = probability of being at (l, t - l) without having crossed.
    prob = np.array([1.0])
    crossed = 0.0
    for t in range(1, horizon + 1):
        nxt = np.zeros(t + 1)
        nxt[1:] += prob * theta
        nxt[:-1] += prob * (1 - theta)
        lost = np.arange(t + 1)
        log_e = beta_binomial_log_e_values(lost, t - lost, p0)
        hit = log_e >= threshold
        crossed += float(nxt[hit].sum())
        nxt[hit] = 0.0
        prob = nxt
    return crossed


@pytest.mark.parametrize(("alpha", "theta"), [(0.05, 0.5), (0.2, 0.5), (0.2, 0.4)])
def test_ville_bound_holds_exactly_under_null(alpha: float, theta: float) -> None:
    """Under the null the exact probability of ever crossing 1/alpha is at most alpha."""
    assert _exact_crossing_probability(theta, 400, alpha, 0.5) <= alpha


def test_power_under_loss_and_margin_variant() -> None:
    """Under a real loss the alarm is near certain; under a wider margin it stays within alpha."""
    # θ = 2/3 (lost 4%, gained 2%): after 400 discordant pairs the alarm is near certain.
    assert _exact_crossing_probability(2 / 3, 400, 0.05, 0.5) > 0.9
    # A conditional margin p0 = 0.7 is not crossed often when θ = 2/3.
    assert _exact_crossing_probability(2 / 3, 400, 0.05, 0.7) <= 0.05


def test_alarm_rule() -> None:
    """The alarm fires at e >= 1/alpha, and the seed example crosses it; p0 = 1 raises."""
    assert alarm(math.log(20.0), 0.05)
    assert not alarm(math.log(19.9), 0.05)
    assert beta_binomial_log_e_value(25, 2) > math.log(20)
    with pytest.raises(ValueError, match="p0"):
        beta_binomial_log_e_value(1, 1, p0=1.0)


def test_alarm_siblings_by_hand() -> None:
    """The same rule on the e-value itself and over a path: 1/0.05 = 20 alarms, 19.9 does not,
    +inf does, NaN never; the log path ln 1, ln 10, ln 20, ln 25 first reaches ln 20 at pair 3;
    alpha outside (0, 1) raises."""
    assert e_value_alarm(20.0, 0.05)
    assert not e_value_alarm(19.9, 0.05)
    assert e_value_alarm(math.inf, 0.05)
    assert not e_value_alarm(math.nan, 0.05)
    assert first_alarm([0.0, math.log(10.0), math.log(20.0), math.log(25.0)], 0.05) == 3
    assert first_alarm([0.0, math.log(19.0)], 0.05) is None
    assert first_alarm([], 0.05) is None
    for bad in (0.0, 1.0):
        with pytest.raises(ValueError, match="alpha"):
            alarm(0.0, bad)
        with pytest.raises(ValueError, match="alpha"):
            e_value_alarm(1.0, bad)
        with pytest.raises(ValueError, match="alpha"):
            first_alarm([0.0], bad)


def _mentions_alpha(node: ast.AST) -> bool:
    return any(
        (isinstance(n, ast.Name) and "alpha" in n.id)
        or (isinstance(n, ast.Attribute) and "alpha" in n.attr)
        or (isinstance(n, ast.Constant) and n.value == "alpha")
        for n in ast.walk(node)
    )


def _is_log(node: ast.AST) -> bool:
    func = node.func if isinstance(node, ast.Call) else None
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name in ("log", "log1p", "log10", "log2")


def _is_threshold(node: ast.AST) -> bool:
    """``1/alpha`` (any numerator 1), ``ln(1/alpha)`` or ``-ln(alpha)``, on any ``alpha``."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        one = isinstance(node.left, ast.Constant) and node.left.value == 1
        return one and _mentions_alpha(node.right)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _is_log(node.operand) and _mentions_alpha(node.operand)
    if isinstance(node, ast.Call) and _is_log(node):
        return any(_is_threshold(a) for a in node.args)
    return False


def alarm_comparisons(source: str) -> list[int]:
    """Lines of ``source`` that compare a value with ``1/alpha`` or ``ln(1/alpha)``: written
    inline, or through a name, attribute or function that is bound to (returns) one."""
    tree = ast.parse(source)
    bound: set[str] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign | ast.AnnAssign)
            and node.value is not None
            and _is_threshold(node.value)
        ):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            bound |= {t.id for t in targets if isinstance(t, ast.Name)}
        if isinstance(node, ast.FunctionDef):
            returns = [n.value for n in ast.walk(node) if isinstance(n, ast.Return) and n.value]
            if any(_is_threshold(r) for r in returns):
                bound.add(node.name)

    def threshold_like(n: ast.AST) -> bool:
        if _is_threshold(n):
            return True
        if isinstance(n, ast.Name) and n.id in bound:
            return True
        if isinstance(n, ast.Attribute) and n.attr in bound:
            return True
        return isinstance(n, ast.Call) and threshold_like(n.func)

    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Compare)
        and any(threshold_like(x) for x in (node.left, *node.comparators))
    ]


def test_the_scan_finds_every_way_of_writing_the_comparison() -> None:
    """The scan flags ``e >= 1.0 / alpha``, ``log_e >= -math.log(alpha)``, ``x > math.log(1 /
    s.alpha)``, a name bound to ``1 / alpha`` and a property returning it; it leaves alone a
    threshold that is only printed and a comparison of alpha itself."""
    flagged = """
import math
def f(e, log_e, x, s, alpha, v):
    a = e >= 1.0 / alpha
    b = log_e >= -math.log(alpha)
    c = x > math.log(1 / s.alpha)
    threshold = 1 / v.alpha
    d = v.e_value >= threshold
class Path:
    @property
    def threshold(self):
        return 1.0 / self.alpha
def g(p, x):
    return x >= p.threshold
"""
    assert alarm_comparisons(flagged) == [4, 5, 6, 8, 14]
    clean = """
def h(v, alpha):
    text = f"{1 / v.alpha:g} needed"
    return 0.0 < alpha < 1.0
"""
    assert alarm_comparisons(clean) == []


def test_one_alarm_rule() -> None:
    """No module of specwatch/ but shadow/stats/sequential.py compares anything with
    ``1/alpha`` or ``ln(1/alpha)``: every alarm goes through :func:`alarm` (or its siblings
    there), so the rule has one home."""
    pkg = REPO / "specwatch"
    offenders = {
        str(p.relative_to(pkg)): lines
        for p in sorted(pkg.rglob("*.py"))
        if p.relative_to(pkg).as_posix() != "shadow/stats/sequential.py"
        and (lines := alarm_comparisons(p.read_text(encoding="utf-8")))
    }
    assert offenders == {}


@pytest.mark.parametrize(
    ("margin", "probs", "alpha"),
    [(0.1, {1: 0.35, 0: 0.4, -1: 0.25}, 0.25), (0.0, {1: 0.3, 0: 0.4, -1: 0.3}, 0.5)],
)
def test_betting_e_process_exact_ville_bound(
    margin: float, probs: dict[int, float], alpha: float
) -> None:
    """Over every length-9 path with mean at the margin, the betting e-process crosses 1/alpha
    with probability <= alpha."""
    # Enumerate every path of d in {-1, 0, 1} of length 9 with E[d] = margin exactly
    # (crossing probabilities are about 0.02 and 0.15: the bound is exercised, not vacuous).
    total = 0.0
    for path in itertools.product((1, 0, -1), repeat=9):
        state = BettingEProcess(margin=margin)
        weight = 1.0
        hit = False
        for d in path:
            weight *= probs[d]
            state = state.update(d)
            if state.log_wealth >= -math.log(alpha):
                hit = True
        total += weight if hit else 0.0
    assert total <= alpha


def test_betting_e_process_grows_under_loss() -> None:
    """Under a net loss above the margin the betting e-process reaches 20; a bad step raises."""
    rng = np.random.default_rng(3)
    d = rng.choice([1, 0, -1], size=3000, p=[0.06, 0.9, 0.04])  # net loss 0.02 > margin 0
    state = BettingEProcess(margin=0.0)
    for x in d:
        state = state.update(int(x))
    assert state.max_log_wealth >= math.log(20)
    assert state.n == 3000
    with pytest.raises(ValueError, match="d must"):
        state.update(2)


# numpy's vectorised log1p (SIMD on AVX2/AVX-512 CPUs) and libm's math.log1p may differ by one ulp
# per term (<= 2.3e-16 relative, terms below 1 in size); the wealth sums the terms in the same order
# on both sides, so after 20,000 pairs the paths differ by at most 20,000 ulps of 1, about 4.4e-12.
LOG1P_PATH_ATOL = 1e-10


def _assert_same_state(got: BettingEProcess, want: BettingEProcess) -> None:
    """Equal counts and sums (exact: small integers) and log wealth within LOG1P_PATH_ATOL."""
    assert (got.margin, got.cap, got.n, got.sum_d, got.sum_d2) == (
        want.margin,
        want.cap,
        want.n,
        want.sum_d,
        want.sum_d2,
    )
    assert got.log_wealth == pytest.approx(want.log_wealth, rel=0, abs=LOG1P_PATH_ATOL)
    assert got.max_log_wealth == pytest.approx(want.max_log_wealth, rel=0, abs=LOG1P_PATH_ATOL)


@pytest.mark.parametrize("margin", [0.0, 0.01, 0.05])
def test_array_driver_equals_update_pair_by_pair(margin: float) -> None:
    """``betting_log_wealth`` (prefix-sum bets, numpy's log1p, running sum) gives the log wealth of
    ``BettingEProcess.update`` (math.log1p) applied pair by pair, within LOG1P_PATH_ATOL, from a
    fresh state and from a state part-way; ``run_betting`` (the same driver) ends in the same state
    exactly; an empty input leaves the start."""
    rng = np.random.default_rng(5)
    std = rng.random(20_000) < 0.7
    fly = rng.random(20_000) < 0.66
    outcomes = list(zip(std.tolist(), fly.tolist(), strict=True))
    state = BettingEProcess(margin=margin)
    by_update = []
    for s, f in outcomes:
        state = state.update(int(s) - int(f))
        by_update.append(state)
    by_update_path = np.array([st.log_wealth for st in by_update])
    path, last = betting_log_wealth(outcomes, margin)
    np.testing.assert_allclose(path, by_update_path, rtol=0, atol=LOG1P_PATH_ATOL)
    assert abs(path[-1]) > 1.0  # the paths compared are not all near 0
    _assert_same_state(last, by_update[-1])
    assert last == run_betting(outcomes, margin)
    d = std.astype(np.int8) - fly.astype(np.int8)
    tail, last2 = betting_log_wealth(d[7000:], margin, by_update[6999])
    np.testing.assert_allclose(tail, by_update_path[7000:], rtol=0, atol=LOG1P_PATH_ATOL)
    _assert_same_state(last2, by_update[-1])
    np.testing.assert_allclose(
        [st.log_wealth for st in betting_path(outcomes[:50], margin)],
        path[:50],
        rtol=0,
        atol=LOG1P_PATH_ATOL,
    )
    empty, same = betting_log_wealth([], margin, by_update[10])
    assert empty.size == 0
    assert same == by_update[10]
    with pytest.raises(ValueError, match="d must"):
        betting_log_wealth(np.array([0, 2]), margin)
