"""Make docs/img/report-example.png: a report rendered from a realistic synthetic ledger.

Six hours of shadow traffic, three categories, a noise arm on a third of the pairs. FLy loses
about two points net on ``math`` (lost 5% / gained 3% of pairs) and nothing on ``code`` and
``chat`` (lost = gained = 2%). Per-position acceptance comes from a saved snapshot document
(K = 4; FLy accepts more at every position, as its waived tokens count as accepted).

    PYTHONPATH=. python scripts/make_report_example.py [--out DIR] [--seed N]

Writes the full report to DIR (default: a temporary directory) and a 2x2 composite of its
plots to docs/img/report-example.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.image import imread

from specwatch.__main__ import main as specwatch_main
from specwatch.shadow.ledger import Ledger, LedgerRow

ROOT = Path(__file__).resolve().parents[1]
IMAGE = ROOT / "docs" / "img" / "report-example.png"
START = 1_764_460_800.0  # 2025-11-30 00:00 UTC
HOURS = 6.0
#: category → (share of traffic, P(lost), P(gained), P(both wrong))
CATEGORIES = {
    "math": (0.40, 0.05, 0.03, 0.20),
    "code": (0.35, 0.02, 0.02, 0.25),
    "chat": (0.25, 0.02, 0.02, 0.10),
}


def synthetic_row(rng: random.Random, t: float, i: int) -> LedgerRow:
    """One ledger row drawn from :data:`CATEGORIES` (about 2% unpaired, 1% excluded)."""
    cats = list(CATEGORIES)
    cat = rng.choices(cats, weights=[CATEGORIES[c][0] for c in cats])[0]
    _, p_lost, p_gained, p_wrong = CATEGORIES[cat]
    u = rng.random()
    if u < 0.02:
        status, reason = "unpaired", rng.choice(["fly_timeout", "standard_http_503"])
    elif u < 0.03:
        status, reason = "excluded", "unsupported_parameter"
    else:
        status, reason = "paired", None
    paired = status == "paired"
    v = rng.random()
    if v < p_lost:
        std, fly = True, False
    elif v < p_lost + p_gained:
        std, fly = False, True
    elif v < p_lost + p_gained + p_wrong:
        std, fly = False, False
    else:
        std, fly = True, True
    noise = i % 3 == 0 and paired
    noise_ok = (std if rng.random() > 0.015 else not std) if noise else None
    return LedgerRow(
        time=t,
        request_hash=f"{i:016x}",
        category=cat,
        source="canary",
        item_id=f"{cat}-{i}",
        status=status,
        reason=reason,
        labelled=True,
        noise_asked=noise,
        standard_correct=std if paired else None,
        fly_correct=fly if paired else None,
        noise_correct=noise_ok,
        fly_agrees=(std == fly) if paired else None,
        noise_agrees=(noise_ok == std) if noise else None,
        fly_divergence_char=None,
        fly_divergence_token=None,
        fly_similarity=None,
        noise_divergence_char=None,
        noise_similarity=None,
        standard_latency_seconds=rng.uniform(0.8, 2.5),
        fly_latency_seconds=rng.uniform(0.6, 2.0),
        noise_latency_seconds=rng.uniform(0.8, 2.5) if noise else None,
        standard_tokens=rng.randint(40, 400),
        fly_tokens=rng.randint(40, 400),
        noise_tokens=rng.randint(40, 400) if noise else None,
        standard_tau=rng.uniform(2.2, 2.8),
        fly_tau=rng.uniform(2.9, 3.6),
        noise_tau=rng.uniform(2.2, 2.8) if noise else None,
    )


async def write_ledger(path: Path, seed: int, pairs: int = 4000) -> None:
    """A ledger of ``pairs`` rows spread over :data:`HOURS` hours."""
    rng = random.Random(seed)
    async with Ledger(path) as ledger:
        for i in range(pairs):
            t = START + HOURS * 3600.0 * (i + rng.random()) / pairs
            ledger.submit(synthetic_row(rng, t, i))
        await ledger.flush()


def snapshot_doc() -> dict[str, object]:
    """A minimal /api/v1/snapshot document with per-position acceptance for both arms."""

    def target(role: str, port: int, p: list[float]) -> dict[str, object]:
        return {
            "role": role,
            "url": f"http://127.0.0.1:{port}/metrics",
            "windows": {"since_start": {"server": {"per_position_acceptance_rate": p}}},
        }

    return {
        "generated_at": START + HOURS * 3600.0,
        "targets": {
            "standard": target("standard", 8000, [0.71, 0.52, 0.38, 0.27]),
            "fly": target("fly", 8001, [0.83, 0.68, 0.55, 0.43]),
        },
    }


def composite(report_dir: Path, image: Path) -> None:
    """The report's four plots in a 2x2 grid."""
    names = ["flips.png", "evalue.png", "net_loss.png", "per_position.png"]
    fig = Figure(figsize=(16, 6.6), layout="constrained")
    for ax, name in zip(fig.subplots(2, 2).flat, names, strict=True):
        ax.imshow(imread(report_dir / name))
        ax.set_axis_off()
    image.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(image, format="png", dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, help="report directory (default: temporary)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        ledger = work / "ledger.db"
        asyncio.run(write_ledger(ledger, args.seed))
        snap = work / "snapshot.json"
        snap.write_text(json.dumps(snapshot_doc()), encoding="utf-8")
        out = args.out or work / "report"
        rc = specwatch_main(
            ["report", "--ledger", str(ledger), "--metrics-url", str(snap), "--out", str(out)]
        )
        if rc != 0:
            return rc
        composite(out, IMAGE)
    print(f"wrote {IMAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
