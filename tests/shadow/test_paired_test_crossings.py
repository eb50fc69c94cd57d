"""paired-test's first crossings: every e-process's first alarm along the file's order."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.shadow.stats.eprocess_reference import reference


def test_paired_test_reports_first_crossings(tmp_path: Path) -> None:
    """3 concordant pairs then 12 losses, in file order. Crossings at 1/alpha = 20: the
    no-net-loss e-value, read from its formulas (Σ_j w_j (2 θ_j)^lost), at pair 11 (8 losses);
    beta-binomial
    ln((2^(L+1) - 1)/(L+1)): 127/7 < 20 <= 255/8 at L = 7 (pair 10); betting (margin 0): the
    bet is 0 until the first loss and then 0.5 (aGRAPA raw bet 1, capped), wealth 1.5^(k-1)
    >= 20 first at k = 9 (pair 12)."""
    base = tmp_path / "base.jsonl"
    cand = tmp_path / "cand.jsonl"
    base.write_text("".join(json.dumps({"id": i, "correct": 1}) + "\n" for i in range(15)))
    cand.write_text("".join(json.dumps({"id": i, "correct": int(i < 3)}) + "\n" for i in range(15)))
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "specwatch",
            "paired-test",
            str(base),
            str(cand),
            "--margin",
            "0",
            "--format",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(out.stdout)
    e, _ = reference([0, 0, 0] + [1] * 12)
    assert next(n for n, v in enumerate(e, start=1) if v >= 20) == 11
    assert report["first_crossing"] == {
        "net_loss_change": None,
        "no_net_loss": 11,
        "no_net_loss_beta_binomial": 10,
        "margin": 12,
        "within_margin": None,
    }
