"""ShadowStats snapshots from tallies/rows, counters, and the exported Prometheus families."""

from __future__ import annotations

import json
import math
import subprocess

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from scipy.stats import binomtest

from specwatch.core.config import OVERALL
from specwatch.export.json import shadow_stats_json
from specwatch.export.prometheus import ShadowCollector
from specwatch.shadow.compare import PairOutcome, compare
from specwatch.shadow.ledger.rows import LedgerRow
from specwatch.shadow.live import OutcomeCounters
from specwatch.shadow.published import ShadowIO, ShadowStats
from specwatch.shadow.stats.power import questions_needed
from specwatch.shadow.stats.sequential import run_betting
from specwatch.shadow.summary import (
    Carried,
    LedgerView,
    Levels,
    OrderedState,
    ProcessCounts,
    build_shadow_stats,
    summarize,
)
from specwatch.shadow.tally import PairTally, labelled_outcome, tally_rows, window_tallies
from specwatch.shadow.values import Arm, ArmResult, ReplayPair, ShadowRequest, Source
from tests.shadow.stats.eprocess_reference import count_form


def _outcome(
    t: float, cat: str, std_ok: bool, fly_ok: bool, noise: str | None = None
) -> PairOutcome:
    req = ShadowRequest("/v1/completions", {}, f"h{t}", t, Source.CANARY, cat, "q", "yes", None)
    pair = ReplayPair(
        req,
        ArmResult(Arm.STANDARD, True, 0.1, text="yes" if std_ok else "no"),
        ArmResult(Arm.FLY, True, 0.1, text="yes" if fly_ok else "no"),
        ArmResult(Arm.NOISE, True, 0.1, text=noise) if noise is not None else None,
    )
    return compare(pair)


def test_summarize_by_hand() -> None:
    """summarize on a hand-made tally gives the exact McNemar, e-value, alarm and questions
    needed."""
    t = PairTally(
        both_correct=354,
        lost=25,
        gained=2,
        both_wrong=47,
        agree=401,
        disagree=27,
        flip_fly_only=20,
        flip_noise_only=4,
        flip_both=2,
        flip_neither=74,
        noise_agree=94,
        noise_disagree=6,
    )
    s = summarize(t, alpha=0.05, margin=0.01, detect_net_loss=0.02)
    assert s.n == 428
    assert s.p_two_sided == pytest.approx(binomtest(2, 27).pvalue)
    assert s.e_value == pytest.approx(count_form(25, 2), rel=1e-9)
    assert s.alarm
    assert not s.non_inferiority_pass
    assert s.questions_needed == questions_needed(0.02, 27 / 428)
    # "more pairs" under the observed effect: a loss of 23/428 at 27/428 discordance needs
    # Connor's one-sided n, far below the 428 pairs there
    assert questions_needed(23 / 428, 27 / 428, two_sided=False) < 428
    assert s.questions_still_needed == 0
    assert s.fly_flip_ratio == pytest.approx(27 / 428)
    assert s.noise_flip_ratio == pytest.approx(6 / 100)
    assert s.excess_flip_ratio == pytest.approx((20 - 4) / 100)
    assert s.excess_flip_p == pytest.approx(binomtest(20, 24, 0.5, "greater").pvalue)
    empty = summarize(PairTally())
    assert empty.n == 0
    assert math.isnan(empty.net_loss_ratio)
    assert empty.questions_needed is None
    assert not empty.alarm


def test_questions_needed_below_detect_net_loss_plans_at_delta() -> None:
    """p_d = max(observed discordance, δ): below δ the planning discordance is δ.

    By hand (Connor 1987, z 1.96 and 0.8416, δ = 0.02): at p_d = 0.02,
    (1.96·√0.02 + 0.8416·√(0.02 − 0.0004))² / 0.0004 = 390.08 → 391; at p_d = 0.03,
    (1.96·√0.03 + 0.8416·√(0.03 − 0.0004))² / 0.0004 = 586.31 → 587.
    """

    def tally(lost: int, gained: int) -> PairTally:
        return PairTally(both_correct=200 - lost - gained, lost=lost, gained=gained)

    below = summarize(tally(1, 1), detect_net_loss=0.02)  # observed p_d = 0.01 < δ
    at = summarize(tally(3, 1), detect_net_loss=0.02)  # observed p_d = 0.02 = δ
    above = summarize(tally(4, 2), detect_net_loss=0.02)  # observed p_d = 0.03 > δ
    assert below.discordant_ratio == pytest.approx(0.01)
    assert below.questions_needed == at.questions_needed == 391
    assert above.questions_needed == 587
    none = summarize(tally(0, 0), detect_net_loss=0.02)  # no flips at all: still planned at δ
    assert none.questions_needed == 391


def test_windows_rows_counters_and_betting() -> None:
    """Ledger rows fold into per-window, per-category tallies and the stats built from them."""
    outs = [
        _outcome(100.0, "a", True, False, noise="yes"),  # lost; fly flips, noise agrees
        _outcome(150.0, "a", True, True, noise="no"),  # both correct; noise flips
        _outcome(190.0, "b", False, True),  # gained
        _outcome(195.0, "b", True, False),  # lost
    ]
    rows = [LedgerRow.from_outcome(o) for o in outs]
    tallies = window_tallies(rows, now=200.0, windows={"1m": 60.0, "since_start": None})
    assert tallies["1m"] == {
        "a": PairTally(
            both_correct=1,
            agree=1,
            noise_disagree=1,
            noise_both_wrong=0,
            noise_lost=1,
            flip_noise_only=1,
        ),
        "b": PairTally(gained=1, lost=1, agree=0, disagree=2),
    }
    assert tally_rows(rows)["a"].lost == 1
    stats = build_shadow_stats(tallies, now=200.0, levels=Levels(margin=0.01))
    assert stats.windows["since_start"][OVERALL].n == 4
    assert stats.windows["since_start"][OVERALL].lost == 2
    assert stats.windows["1m"][OVERALL].n == 3
    counters = OutcomeCounters()
    for r in rows:
        counters.add(r)
    assert counters.by_status() == {"paired": 4, "unpaired": 0, "excluded": 0}
    assert counters.pairs[("a", "fly", "lost")] == 1
    assert counters.pairs[("a", "noise", "lost")] == 1
    assert counters.pairs[("b", "fly", "disagree")] == 2
    seeded = OutcomeCounters()
    seeded.seed(tally_rows(rows), {("unpaired", "fly_timeout"): 3})
    assert seeded.pairs == counters.pairs
    assert seeded.unpaired == {"fly_timeout": 3}
    assert seeded.by_status() == {"paired": 4, "unpaired": 3, "excluded": 0}
    labelled = [o for o in map(labelled_outcome, rows) if o is not None]
    bet = run_betting(labelled, margin=0.0)
    assert bet.n == 4


def _fixed(stats: ShadowStats) -> ShadowCollector:
    return ShadowCollector(lambda: stats)


def _exposition() -> str:
    t = PairTally(
        both_correct=354,
        lost=25,
        gained=2,
        both_wrong=47,
        agree=401,
        disagree=27,
        noise_agree=400,
        noise_disagree=28,
    )
    stats = build_shadow_stats(
        {"since_start": {"gsm8k": t, "empty": PairTally()}},
        now=1.0,
        counts=ProcessCounts(
            pairs_total={("gsm8k", "fly", "lost"): 25, ("gsm8k", "fly", "gained"): 2},
            unpaired_total={"fly_timeout": 3},
            excluded_total={"unsupported_parameter": 1},
        ),
        ordered=OrderedState(betting_log_e_value=math.log(7.5)),
        ledger=LedgerView(rows=431, write_errors={"OperationalError": 2}),
        carried=Carried(
            io=ShadowIO(
                queue_depth=4,
                in_flight=2,
                dropped={"queue_full": 9},
                paused={"waiting": 1, "running_near_max": 0},
            )
        ),
    )
    reg = CollectorRegistry()
    reg.register(_fixed(stats))
    return generate_latest(reg).decode()


def test_export_values() -> None:
    """The exported shadow and paired series carry the values of the summary."""
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(_exposition())
        for s in fam.samples
    }
    wc = (("category", "gsm8k"), ("window", "since_start"))
    assert (
        samples[
            (
                "specwatch_shadow_pairs_total",
                (("arm", "fly"), ("category", "gsm8k"), ("outcome", "lost")),
            )
        ]
        == 25
    )
    assert samples[("specwatch_paired_lost", wc)] == 25
    assert samples[("specwatch_paired_n", (("category", "_all"), ("window", "since_start")))] == 428
    assert samples[("specwatch_paired_net_loss_ratio", wc)] == pytest.approx(23 / 428)
    assert samples[("specwatch_paired_mcnemar_p_value", (("alternative", "two_sided"), *wc))] == (
        pytest.approx(binomtest(2, 27).pvalue)
    )
    assert samples[
        ("specwatch_paired_e_value", (*wc[:1], ("hypothesis", "no_net_loss"), *wc[1:]))
    ] == pytest.approx(count_form(25, 2), rel=1e-6)
    assert samples[
        (
            "specwatch_paired_e_value",
            (("category", "_all"), ("hypothesis", "margin"), ("window", "since_start")),
        )
    ] == pytest.approx(7.5)
    assert samples[("specwatch_flip_ratio", (("arm", "noise"), *wc))] == pytest.approx(28 / 428)
    assert samples[("specwatch_ledger_write_errors_total", (("reason", "OperationalError"),))] == 2
    assert samples[("specwatch_shadow_paused", (("reason", "waiting"),))] == 1
    assert samples[("specwatch_shadow_dropped_total", (("reason", "queue_full"),))] == 9
    assert samples[("specwatch_shadow_queue_depth", ())] == 4
    assert samples[("specwatch_ledger_rows", ())] == 431
    # Undefined values (no pairs) are left out, not exported as NaN.
    empty = (("category", "empty"), ("window", "since_start"))
    assert ("specwatch_paired_net_loss_ratio", empty) not in samples
    assert samples[("specwatch_paired_n", empty)] == 0


def test_known_reasons_exported_from_zero() -> None:
    """Known reasons are initialised at 0 (Prometheus practice); reasons seen are added."""

    def reasons(stats: ShadowStats) -> dict[tuple[str, str], float]:
        reg = CollectorRegistry()
        reg.register(_fixed(stats))
        text = generate_latest(reg).decode()
        return {
            (s.name, s.labels["reason"]): s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name in ("specwatch_shadow_excluded_total", "specwatch_ledger_write_errors_total")
        }

    fresh = reasons(build_shadow_stats({}, now=1.0))
    ex, we = "specwatch_shadow_excluded_total", "specwatch_ledger_write_errors_total"
    assert fresh == {
        (ex, "unsupported_parameter"): 0,
        (ex, "bad_request"): 0,
        (ex, "bad_checker"): 0,
        (ex, "multiple_choices"): 0,
        (we, "queue_full"): 0,
        (we, "not_stored"): 0,
        (we, "OperationalError"): 0,
        (we, "IntegrityError"): 0,
        (we, "DatabaseError"): 0,
        (we, "OSError"): 0,
    }
    later = reasons(
        build_shadow_stats(
            {},
            now=2.0,
            counts=ProcessCounts(excluded_total={"bad_checker": 2, "legacy_reason": 1}),
            ledger=LedgerView(write_errors={"queue_full": 5, "InterfaceError": 1}),
        )
    )
    assert later[(ex, "bad_checker")] == 2
    assert later[(ex, "legacy_reason")] == 1
    assert later[(ex, "bad_request")] == 0
    assert later[(we, "queue_full")] == 5
    assert later[(we, "InterfaceError")] == 1
    assert later[(we, "OperationalError")] == 0
    assert len(later) == len(fresh) + 2


@pytest.mark.promtool
def test_export_passes_promtool_check_metrics() -> None:
    """The shadow exposition passes `promtool check metrics`."""
    res = subprocess.run(
        ["promtool", "check", "metrics"],
        input=_exposition(),
        text=True,
        capture_output=True,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr


def test_snapshot_json_is_strict_json() -> None:
    """The shadow JSON is strict JSON: an overflowing e-value is null, not Infinity."""
    t = PairTally(both_correct=10, lost=3, gained=1, both_wrong=2, agree=14, disagree=2)
    stats = build_shadow_stats(
        {"since_start": {"a": t, "b": PairTally()}},
        now=5.0,
        counts=ProcessCounts(pairs_total={("a", "fly", "lost"): 3}),
        ordered=OrderedState(betting_log_e_value=1000.0),
        carried=Carried(io=ShadowIO(queue_depth=1)),
    )
    doc = json.loads(json.dumps(shadow_stats_json(stats), allow_nan=False))
    assert doc["windows"]["since_start"]["a"]["lost"] == 3
    assert doc["windows"]["since_start"]["a"]["tally"]["both_correct"] == 10
    assert doc["windows"]["since_start"]["b"]["net_loss_ratio"] is None
    assert doc["windows"]["since_start"][OVERALL]["n"] == 16
    assert doc["pairs_total"] == [{"category": "a", "arm": "fly", "outcome": "lost", "count": 3}]
    assert doc["betting_e_value"] is None
    assert doc["betting_log_e_value"] == 1000.0
    assert doc["io"]["queue_depth"] == 1


def test_families_before_io_and_ledger_are_known() -> None:
    """Without I/O state and ledger rows: counters and gauges keep their TYPE lines, the I/O
    families and specwatch_ledger_rows are absent, and the known reasons still start at 0."""
    reg = CollectorRegistry()
    reg.register(_fixed(build_shadow_stats({}, now=1.0)))
    text = generate_latest(reg).decode()
    assert "# TYPE specwatch_shadow_pairs_total counter" in text
    assert "# TYPE specwatch_paired_n gauge" in text
    assert 'specwatch_shadow_excluded_total{reason="bad_checker"} 0.0' in text
    for absent in (
        "specwatch_ledger_rows",
        "specwatch_shadow_queue_depth",
        "specwatch_shadow_received",
    ):
        assert absent not in text
