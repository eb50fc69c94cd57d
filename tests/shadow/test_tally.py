"""One row → tally table (shadow/tally.py): the ledger's SQL is rendered from it, and the e-process
is
rebuilt from the ledger through labelled_outcomes + run_betting, equal to the live run."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from specwatch.shadow.ledger.ledger import Ledger
from specwatch.shadow.ledger.predicates import rule_sql
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.shadow.stats.sequential import BettingEProcess, run_betting
from specwatch.shadow.tally import (
    LABELLED,
    TALLY_RULES,
    ArmSums,
    HistoryCell,
    PairTally,
    labelled_outcome,
    row_tally,
    sum_cells,
)
from tests.fakes import REPO
from tests.shadow.test_ledger import make_outcome

PKG = REPO / "specwatch"


def test_every_tally_field_has_exactly_one_rule() -> None:
    """The table covers every PairTally field, in field order, and nothing else."""
    assert list(TALLY_RULES) == [f.name for f in dataclasses.fields(PairTally)]


def test_rules_render_to_the_sql_written_by_hand() -> None:
    """Three rules rendered, compared with the SQL the ledger used to spell out by hand."""
    assert rule_sql(TALLY_RULES["lost"]) == (
        "status = 'paired' AND standard_correct = 1 AND fly_correct = 0"
    )
    assert rule_sql(TALLY_RULES["flip_fly_only"]) == (
        "status = 'paired' AND fly_agrees = 0 AND noise_agrees = 1"
    )
    assert rule_sql(TALLY_RULES["unpaired"]) == "status = 'unpaired'"
    assert rule_sql(LABELLED) == (
        "status = 'paired' AND standard_correct IS NOT NULL AND fly_correct IS NOT NULL"
    )


def test_python_rule_by_hand() -> None:
    """A paired labelled row where the standard was right and FLy wrong, FLy disagreeing and the
    noise arm agreeing: lost + disagree + noise_agree + flip_fly_only, nothing else; ``None``
    never matches a bool condition."""
    row = dataclasses.replace(
        LedgerRow.from_outcome(make_outcome(0)),
        status="paired",
        standard_correct=True,
        fly_correct=False,
        noise_correct=None,
        fly_agrees=False,
        noise_agrees=True,
    )
    assert row_tally(row) == PairTally(lost=1, disagree=1, noise_agree=1, flip_fly_only=1)
    assert labelled_outcome(row) == (True, False)
    assert labelled_outcome(dataclasses.replace(row, fly_correct=None)) is None
    assert labelled_outcome(dataclasses.replace(row, status="unpaired")) is None


def test_no_second_tally_rule_or_betting_loop() -> None:
    """No module but tally.py decides a row's tally, and only sequential.py calls ``.update(``
    on a betting e-process (every other loop goes through run_betting / betting_path)."""
    tally_defs = [
        str(p.relative_to(PKG))
        for p in PKG.rglob("*.py")
        if re.search(r"^def _?row_tally\(", p.read_text(), re.M)
    ]
    assert tally_defs == ["shadow/tally.py"]
    updates = [
        str(p.relative_to(PKG))
        for p in PKG.rglob("*.py")
        if re.search(r"(betting|state)\.update\(", p.read_text())
    ]
    assert updates == ["shadow/stats/sequential.py"]


async def test_rebuild_from_the_ledger_equals_the_live_e_process(tmp_path: Path) -> None:
    """Feeding 300 outcomes one by one (the live path) and rebuilding from the stored ledger
    (labelled_outcomes → run_betting, the restart path) give the same e-process state, and the
    number of labelled pairs equals the tally's correctness total."""
    outs = [make_outcome(i) for i in range(300)]
    live = BettingEProcess(margin=0.01)
    async with Ledger(tmp_path / "l.db") as ledger:
        for o in outs:
            ledger.submit(o)
            lab = labelled_outcome(LedgerRow.from_outcome(o))
            if lab is not None:
                live = run_betting([lab], 0.01, live)
        await ledger.flush()
        stored = await ledger.labelled_outcomes()
        tally = (await ledger.tally())["math"]
    rebuilt = run_betting(stored, 0.01)
    assert rebuilt == live
    assert len(stored) == tally.paired_counts().n > 0


def test_sum_cells_equals_adding_one_by_one() -> None:
    """Three cells: both_correct 1 + 0 + 2 = 3, lost 0 + 1 + 0 = 1, verify-step sums
    2.5e9 + 3e9 + 10**20 (beyond 64 bits, still exact), rows 1 + 1 + 2 = 4; equal to ``a + b +
    c``; no cells give the zero cell."""
    a = HistoryCell(
        PairTally(both_correct=1), ArmSums(tau_pairs=1, standard_steps=2_500_000_000), 1
    )
    b = HistoryCell(PairTally(lost=1), ArmSums(tau_pairs=1, standard_steps=3_000_000_000), 1)
    c = HistoryCell(PairTally(both_correct=2), ArmSums(tau_pairs=2, standard_steps=10**20), 2)
    got = sum_cells([a, b, c])
    assert got == a + b + c
    assert (got.tally.both_correct, got.tally.lost, got.rows) == (3, 1, 4)
    assert got.arms.standard_steps == 5_500_000_000 + 10**20
    assert sum_cells([]) == HistoryCell()
