"""Shadow chain against the simulator: is FLy flagged at a low entropy threshold, and not at
infinity, over 10,000 pairs?

For each FLy entropy threshold, starts three in-process simulators (standard, FLy, and a second
standard one as the noise arm; ``time_scale`` 0), then specwatch itself (``build_app`` with the
shadow component, canary mode) replaying the simulator's 240 canary items at temperature 1 as
``--pairs`` distinct requests (``max_tokens`` 64 + pass number makes each pass a different
request, so a different replay seed). When every item is replayed it reads the ledger back in time
order and reports: lost/gained flips, the exact McNemar p, the beta-binomial e-value (H0: no net
loss) and the number of pairs after which it first reached 1/alpha, the margin e-process
(H0: net loss <= margin) and its first crossing, the Tango non-inferiority verdict, the FLy and
noise-arm flip rates (noise floor), and the wall time.

Rerun: ``PYTHONPATH=. python bench/shadow_sim_flags.py --pairs 10000`` (``--thresholds 0 0.3
inf``; ``--json`` prints one JSON object per threshold).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web
from scipy.stats import binomtest

from specwatch.core.config import OVERALL
from specwatch.server.app import build_app
from specwatch.server.wiring import ShadowPlug
from specwatch.settings import Settings
from specwatch.shadow.ledger.ledger import Ledger
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.shadow.stats.sequential import (
    BettingEProcess,
    alarm,
    beta_binomial_log_e_values,
    first_alarm,
)
from specwatch.simulate.config import Role, SimConfig
from specwatch.simulate.launcher import start_simulator
from specwatch.simulate.quiz import builtin_items, write_canary_jsonl


def write_canary(path: Path, pairs: int, temperature: float) -> None:
    variants = -(-pairs // len(builtin_items()))
    write_canary_jsonl(path, variants=variants, temperature=temperature, limit=pairs)


def analyse(rows: list[LedgerRow], alpha: float, margin: float) -> dict[str, Any]:
    """Statistics worked out from the ledger rows alone (time order)."""
    lab = [
        r
        for r in rows
        if r.status == "paired" and r.standard_correct is not None and r.fly_correct is not None
    ]
    d = np.array([int(bool(r.standard_correct)) - int(bool(r.fly_correct)) for r in lab])
    lost_c = np.cumsum(d == 1)
    gained_c = np.cumsum(d == -1)
    log_e = beta_binomial_log_e_values(lost_c, gained_c)
    bet = BettingEProcess(margin=margin)
    bet_cross: int | None = None
    for i, di in enumerate(d, start=1):
        bet = bet.update(int(di))
        if bet_cross is None and alarm(bet.log_wealth, alpha):
            bet_cross = i
    lost, gained = int(lost_c[-1]), int(gained_c[-1])
    fly_flips = sum(1 for r in rows if r.status == "paired" and r.fly_agrees is False)
    noise_n = sum(1 for r in rows if r.status == "paired" and r.noise_agrees is not None)
    noise_flips = sum(1 for r in rows if r.status == "paired" and r.noise_agrees is False)
    paired = sum(1 for r in rows if r.status == "paired")
    return {
        "n": len(lab),
        "lost": lost,
        "gained": gained,
        "net_loss": (lost - gained) / len(lab),
        "mcnemar_p_two_sided": float(binomtest(lost, lost + gained, 0.5).pvalue)
        if lost + gained
        else 1.0,
        "log10_e_value": float(log_e[-1]) / math.log(10),
        "pairs_to_alarm": first_alarm(log_e, alpha),
        "max_log10_e_value": float(log_e.max()) / math.log(10),
        "margin_log10_e_value": bet.log_wealth / math.log(10),
        "margin_pairs_to_alarm": bet_cross,
        "fly_flip_ratio": fly_flips / paired if paired else math.nan,
        "noise_flip_ratio": noise_flips / noise_n if noise_n else math.nan,
        "unpaired": sum(1 for r in rows if r.status == "unpaired"),
        "excluded": sum(1 for r in rows if r.status == "excluded"),
    }


async def run_one(
    threshold: float, pairs: int, temperature: float, workdir: Path
) -> dict[str, Any]:
    canary = workdir / f"canary-{threshold}.jsonl"
    ledger = workdir / f"ledger-{threshold}.sqlite"
    write_canary(canary, pairs, temperature)
    sims = {
        "standard": await start_simulator(SimConfig(role=Role.STANDARD, time_scale=0.0)),
        "fly": await start_simulator(
            SimConfig(role=Role.FLY, time_scale=0.0, fly_entropy_threshold=threshold)
        ),
        "noise": await start_simulator(SimConfig(role=Role.STANDARD, time_scale=0.0)),
    }
    try:
        settings = Settings.model_validate(
            {
                "targets": [
                    {"name": n, "url": h.url, "role": "fly" if n == "fly" else "standard"}
                    for n, h in sims.items()
                ],
                "scrape": {"interval_seconds": 2.0},
                "shadow": {
                    "enabled": True,
                    "modes": ["canary"],
                    "canary_file": str(canary),
                    "canary_loop": False,
                    "canary_rate_per_second": 5000.0,
                    "sample_probability": 1.0,
                    "max_shadow_rps": 5000.0,
                    "max_in_flight": 32,
                    "queue_size": 20_000,
                    "max_queue_age_seconds": 3600.0,
                    "standard": {"target": "standard"},
                    "fly": {"target": "fly"},
                    "noise": {"target": "noise"},
                    "noise_kind": "standard",
                },
                "ledger": {"path": str(ledger), "max_rows": None, "max_age_seconds": None},
                "paired": {"windows": ["1h"], "refresh_seconds": 5.0},
            }
        )
        plug = ShadowPlug(settings)
        comp = plug.component
        app = build_app(settings, components=[plug])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        t0 = time.perf_counter()
        try:
            while True:
                pipe = comp.pipeline
                if pipe is not None and pipe.canary is not None and pipe.canary.passes == 1:
                    m = pipe.metrics()
                    compared = sum(comp.statistics.counters.by_status().values())
                    if m.queue_depth == 0 and compared == m.admitted:
                        break
                await asyncio.sleep(0.2)
            elapsed = time.perf_counter() - t0
            stats = await comp.refresh(flush=True)
            dropped = dict(pipe.metrics().dropped)
        finally:
            await runner.cleanup()
    finally:
        for h in sims.values():
            await h.stop()
    async with Ledger(ledger) as led:
        rows = await led.query()
    out = analyse(rows, stats.alpha, stats.margin)
    s = stats.windows["since_start"][OVERALL]
    out.update(
        threshold=threshold,
        temperature=temperature,
        seconds=round(elapsed, 1),
        pairs_per_second=round(len(rows) / elapsed, 1),
        dropped={k: v for k, v in dropped.items() if v},
        specwatch_e_value=s.e_value,
        specwatch_alarm=s.alarm,
        specwatch_non_inferiority_pass=s.non_inferiority_pass,
        specwatch_ci=(s.ci_lower, s.ci_upper),
        specwatch_matches_ledger=(s.lost, s.gained, s.n) == (out["lost"], out["gained"], out["n"]),
    )
    return out


async def main_async(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        for th in args.thresholds:
            r = await run_one(th, args.pairs, args.temperature, Path(tmp))
            if args.json:
                print(json.dumps(r, default=str), flush=True)
                continue
            print(
                f"threshold={th} T={args.temperature}: n={r['n']} lost={r['lost']} "
                f"gained={r['gained']} net={r['net_loss']:.4f} p={r['mcnemar_p_two_sided']:.3g} "
                f"log10(e)={r['log10_e_value']:.1f} alarm_at={r['pairs_to_alarm']} "
                f"margin log10(e)={r['margin_log10_e_value']:.1f} "
                f"margin_alarm_at={r['margin_pairs_to_alarm']} "
                f"NI_pass={r['specwatch_non_inferiority_pass']} "
                f"CI=({r['specwatch_ci'][0]:.4f}, {r['specwatch_ci'][1]:.4f}) "
                f"fly_flip={r['fly_flip_ratio']:.4f} noise_flip={r['noise_flip_ratio']:.4f} "
                f"unpaired={r['unpaired']} dropped={r['dropped']} "
                f"time={r['seconds']}s ({r['pairs_per_second']} pairs/s) "
                f"matches_ledger={r['specwatch_matches_ledger']}",
                flush=True,
            )
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=10_000)
    p.add_argument("--thresholds", type=float, nargs="+", default=[0.0, 0.3, math.inf])
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--json", action="store_true")
    return asyncio.run(main_async(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
