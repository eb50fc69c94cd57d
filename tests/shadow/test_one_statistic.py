"""One statistic under one name: `paired-test`, the fleet view, the sidecar's snapshot, the
report and the decision table give the same e-value and the same "about N more pairs" on the
same counts."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from specwatch.__main__ import main
from specwatch.core.config import OVERALL, SINCE_START
from specwatch.export.fleet import fleet_json, fleet_stats
from specwatch.export.json import shadow_stats_json
from specwatch.shadow.decision import decision_row
from specwatch.shadow.stats.power import pairs_to_decide
from specwatch.shadow.stats.sequential import net_loss_mixture_grid
from specwatch.shadow.summary import build_shadow_stats
from specwatch.shadow.tally import ArmTotals, PairTally
from specwatch.shadow.verdict import more_pairs_needed, verdict_from_summary
from tests.report.test_report import T0, report_of, row

#: (both_correct, lost, gained, both_wrong): the issue's 30 lost / 10 gained of 1,000 and
#: 12 lost / 8 gained of 300.
CASES = [(900, 30, 10, 60), (260, 12, 8, 20)]


def _hand_e(lost: int, gained: int) -> float:
    """The no-net-loss e-value from its formula, term by term: Σ_j w_j (2 q_j)^L (2(1-q_j))^G."""
    q, w = net_loss_mixture_grid(0.02)
    return math.fsum(
        wj * (2 * qj) ** lost * (2 * (1 - qj)) ** gained
        for qj, wj in zip(q.tolist(), w.tolist(), strict=True)
    )


def _tally(bc: int, lost: int, gained: int, bw: int) -> PairTally:
    return PairTally(both_correct=bc, lost=lost, gained=gained, both_wrong=bw)


def _paired_test(
    tmp_path: Path, cells: tuple[int, int, int, int], capsys: pytest.CaptureFixture[str]
) -> dict[str, object]:
    bc, lost, gained, bw = cells
    outcomes = [(1, 1)] * bc + [(1, 0)] * lost + [(0, 1)] * gained + [(0, 0)] * bw
    base, cand = tmp_path / "base.jsonl", tmp_path / "cand.jsonl"
    base.write_text(
        "".join(json.dumps({"id": i, "correct": s}) + "\n" for i, (s, _) in enumerate(outcomes))
    )
    cand.write_text(
        "".join(json.dumps({"id": i, "correct": f}) + "\n" for i, (_, f) in enumerate(outcomes))
    )
    capsys.readouterr()
    assert main(["paired-test", str(base), str(cand), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def _fleet_rows(cells: tuple[int, int, int, int]) -> list[tuple[dict[str, str], float]]:
    names = ("both_correct", "lost", "gained", "both_wrong")
    return [
        (
            {
                "instance": "s1:9464",
                "category": "math",
                "arm": "fly",
                "outcome": o,
                "model_name": "m",
            },
            float(v),
        )
        for o, v in zip(names, cells, strict=True)
    ]


def _report_rows(cells: tuple[int, int, int, int]) -> list[object]:
    bc, lost, gained, bw = cells
    outcomes = [(True, True)] * bc + [(True, False)] * lost + [(False, True)] * gained
    outcomes += [(False, False)] * bw
    return [row(T0 + i, "math", s, f) for i, (s, f) in enumerate(outcomes)]


@pytest.mark.parametrize("cells", CASES)
def test_identical_counts_give_identical_numbers_everywhere(
    cells: tuple[int, int, int, int], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same 2x2 table fed to the five places: every e-value equals the formula's (to 1e-9)
    and each other exactly, and every "about N more pairs" is the one function's number at the
    observed effect (the decision table gives none once the e-value decided)."""
    _, lost, gained, _ = cells
    n = sum(cells)
    expected_e = _hand_e(lost, gained)
    expected_more = pairs_to_decide((lost - gained) / n, (lost + gained) / n, n, 0.01, 0.05, 0.8)

    cli = _paired_test(tmp_path, cells, capsys)
    fleet = fleet_stats(_fleet_rows(cells), now=1.0).models["m"].summaries[OVERALL]
    fleet_doc = fleet_json(fleet_stats(_fleet_rows(cells), now=1.0))
    sidecar = build_shadow_stats({SINCE_START: {"math": _tally(*cells)}}, now=1.0)
    snap = shadow_stats_json(sidecar)
    live = sidecar.windows[SINCE_START][OVERALL]
    report = report_of(tmp_path / "ledger.sqlite", _report_rows(cells))  # type: ignore[arg-type]
    rep = report.stats.windows[SINCE_START][OVERALL]
    decision = decision_row(
        OVERALL, _tally(*cells), ArmTotals(), alpha=0.05, margin=0.01, detect_net_loss=0.02
    )

    e_values = {
        "paired-test": cli["e_value"],
        "fleet": fleet.e_value,
        "sidecar": live.e_value,
        "report": rep.e_value,
        "report path": math.exp(report.evalue.log_e_no_net_loss[-1]),
        "decision table": decision.e_value,
    }
    assert e_values["paired-test"] == pytest.approx(expected_e, rel=1e-9)
    for where, e in e_values.items():
        assert e == pytest.approx(e_values["paired-test"], rel=1e-12), where
    assert json.dumps(fleet_doc)  # the fleet document carries the same summary
    assert snap["windows"][SINCE_START][OVERALL]["e_value"] == pytest.approx(live.e_value)

    more = {
        "paired-test": cli["pairs_more"],
        "fleet": fleet.questions_still_needed,
        "sidecar": live.questions_still_needed,
        "report": rep.questions_still_needed,
        "verdict": more_pairs_needed(verdict_from_summary(live, alpha=0.05, margin=0.01)),
    }
    assert set(more.values()) == {expected_more}, more
    # the table gives a number only while undecided (30/10 of 1,000: the e-value reached 20)
    decided = decision.verdict == "costs_quality"
    assert decision.pairs_more == (None if decided else expected_more)
    assert decided == (expected_e >= 20.0)
