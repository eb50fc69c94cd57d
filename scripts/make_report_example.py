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
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from matplotlib.figure import Figure
from matplotlib.image import imread

from specwatch.__main__ import main as specwatch_main
from specwatch.shadow.ledger.ledger import Ledger

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


#: The columns :func:`synthetic_columns` fills (the rest of a ledger row stays NULL).
COLUMNS: tuple[str, ...] = (
    "time",
    "request_hash",
    "category",
    "source",
    "item_id",
    "status",
    "reason",
    "labelled",
    "noise_asked",
    "standard_correct",
    "fly_correct",
    "noise_correct",
    "fly_agrees",
    "noise_agrees",
    "standard_latency_seconds",
    "fly_latency_seconds",
    "noise_latency_seconds",
    "standard_tokens",
    "fly_tokens",
    "noise_tokens",
    "standard_tau",
    "fly_tau",
    "noise_tau",
)


def synthetic_columns(
    rng: np.random.Generator, first: int, count: int, pairs: int
) -> list[tuple[Any, ...]]:
    """Rows ``first .. first + count - 1`` of a ``pairs``-row ledger as :data:`COLUMNS` tuples,
    drawn with numpy from :data:`CATEGORIES` (about 2% unpaired, 1% excluded; vectorised: a
    million rows in seconds)."""
    i = np.arange(first, first + count)
    t = START + HOURS * 3600.0 * (i + rng.random(count)) / pairs
    names = list(CATEGORIES)
    share = np.array([CATEGORIES[c][0] for c in names])
    cat = rng.choice(len(names), size=count, p=share / share.sum())
    table = np.array([CATEGORIES[c][1:] for c in names])
    p_lost, p_gained, p_wrong = table[cat, 0], table[cat, 1], table[cat, 2]
    u, v = rng.random(count), rng.random(count)
    status = np.where(u < 0.02, 1, np.where(u < 0.03, 2, 0))
    unpaired_reason = rng.integers(0, 2, count)
    lost = v < p_lost
    gained = (v >= p_lost) & (v < p_lost + p_gained)
    wrong = (v >= p_lost + p_gained) & (v < p_lost + p_gained + p_wrong)
    std = lost | ~(gained | wrong)
    fly = gained | ~(lost | wrong)
    paired = status == 0
    noise = (i % 3 == 0) & paired
    noise_ok = np.where(rng.random(count) > 0.015, std, ~std)
    lat = rng.uniform([0.8, 0.6, 0.8], [2.5, 2.0, 2.5], (count, 3))
    tok = rng.integers(40, 401, (count, 3))
    tau = rng.uniform([2.2, 2.9, 2.2], [2.8, 3.6, 2.8], (count, 3))
    status_name = np.array(["paired", "unpaired", "excluded"])[status].tolist()
    reason = np.where(
        status == 0,
        np.full(count, None, dtype=object),
        np.where(
            status == 1,
            np.array(["fly_timeout", "standard_http_503"], dtype=object)[unpaired_reason],
            "unsupported_parameter",
        ),
    ).tolist()

    def when(mask: npt.NDArray[np.bool_], values: npt.NDArray[Any]) -> list[Any]:
        none = np.full(mask.shape, None, dtype=object)
        picked: list[Any] = np.where(mask, values.astype(object), none).tolist()
        return picked

    cat_name = np.array(names, dtype=object)[cat].tolist()
    ids = i.tolist()
    columns = (
        t.tolist(),
        [f"{k:016x}" for k in ids],
        cat_name,
        ["canary"] * count,
        [f"{c}-{k}" for c, k in zip(cat_name, ids, strict=True)],
        status_name,
        reason,
        [True] * count,
        noise.tolist(),
        when(paired, std),
        when(paired, fly),
        when(noise, noise_ok),
        when(paired, std == fly),
        when(noise, noise_ok == std),
        lat[:, 0].tolist(),
        lat[:, 1].tolist(),
        when(noise, lat[:, 2]),
        tok[:, 0].tolist(),
        tok[:, 1].tolist(),
        when(noise, tok[:, 2]),
        tau[:, 0].tolist(),
        tau[:, 1].tolist(),
        when(noise, tau[:, 2]),
    )
    out = list(zip(*columns, strict=True))
    return out


async def write_ledger(path: Path, seed: int, pairs: int = 4000, batch: int = 50_000) -> None:
    """A ledger of ``pairs`` rows spread over :data:`HOURS` hours (:func:`synthetic_columns`),
    written ``batch`` rows per transaction with ``Ledger.write_many`` (the ledger's own schema,
    no write queue), so a million rows take seconds, not minutes."""
    rng = np.random.default_rng(seed)
    async with Ledger(path, synchronous="OFF") as ledger:
        for first in range(0, pairs, batch):
            count = min(batch, pairs - first)
            await ledger.write_many(COLUMNS, synthetic_columns(rng, first, count, pairs))


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
