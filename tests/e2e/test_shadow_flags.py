"""With the simulator: FLy at entropy threshold 0 is flagged, FLy at threshold infinity is not.

Canary items at temperature 1, each replayed with the seed specwatch derives from the request
hash: a standard simulator answers the same seed the same way whatever else is in the batch, so
the runs are deterministic (the noise arm, a second standard simulator, flips 0 times) and the
verdicts below cannot flake. ``bench/shadow_sim_flags.py`` runs the same over 10,000 pairs.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from scipy.stats import binomtest

from specwatch.core.config import OVERALL
from specwatch.shadow.published import ShadowStats
from tests.e2e.shadow_harness import (
    canary_done,
    expected,
    read_rows,
    settings_for,
    sidecar,
    simulators,
    until,
)

VARIANTS = 2  # 480 pairs per run


async def _run(tmp_path: Path, threshold: float) -> tuple[ShadowStats, int]:
    from tests.e2e.shadow_harness import write_canary

    canary = tmp_path / f"canary-{threshold}.jsonl"
    items = write_canary(canary, variants=VARIANTS, temperature=1.0)
    ledger = tmp_path / f"ledger-{threshold}.sqlite"
    async with simulators(fly_threshold=threshold, noise=True) as sims:
        settings = settings_for(
            sims, ledger, modes=["canary"], canary_file=str(canary), canary_rate_per_second=2000.0
        )
        async with sidecar(settings) as sc:
            await until(lambda: canary_done(sc.component, items), limit=120)
            stats = await sc.component.refresh(flush=True)
    return stats, items


@pytest.mark.slow
async def test_low_entropy_threshold_is_flagged(tmp_path: Path) -> None:
    """With threshold 0 FLy loses answers: the ledger counts match, the e-value alarms and non-
    inferiority fails."""
    stats, items = await _run(tmp_path, 0.0)
    s = stats.windows["since_start"][OVERALL]
    exp = expected(await read_rows(tmp_path / "ledger-0.0.sqlite"))
    assert s.n == exp.n >= items * 0.9
    assert (s.lost, s.gained) == (exp.lost, exp.gained)
    assert s.lost > 2 * s.gained
    # e-value alarm at 1/alpha, exact one-sided McNemar agrees, non-inferiority fails
    assert s.alarm
    assert s.e_value >= 1 / stats.alpha
    assert math.isclose(
        s.p_loss, binomtest(s.lost, s.lost + s.gained, 0.5, alternative="greater").pvalue
    )
    assert s.p_loss < stats.alpha
    assert not s.non_inferiority_pass
    assert s.ci_lower > 0
    # noise floor: a second standard server with the same seeds never flips
    assert s.noise_flip_ratio == 0.0
    assert s.fly_flip_ratio > 0.05
    assert s.excess_flip_ratio == s.fly_flip_ratio


@pytest.mark.slow
async def test_infinite_entropy_threshold_is_not_flagged(tmp_path: Path) -> None:
    """With an infinite threshold FLy matches the standard: no flips, no alarm, non-inferiority
    passes."""
    stats, items = await _run(tmp_path, math.inf)
    s = stats.windows["since_start"][OVERALL]
    assert s.n >= items * 0.9
    # no waivers: FLy is the standard rejection sampler, same seed, same text
    assert (s.lost, s.gained) == (0, 0)
    assert s.fly_flip_ratio == 0.0 == s.noise_flip_ratio
    assert not s.alarm
    assert s.e_value == 1.0
    assert s.non_inferiority_pass
    assert stats.betting_log_e_value is not None
    assert stats.betting_log_e_value <= 0.0
