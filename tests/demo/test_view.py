"""The demo's live view: a pure function of the typed snapshot, drawn by rich to a width."""

from __future__ import annotations

import ast
import inspect
from dataclasses import replace

from specwatch.alerts.values import AlertingState, FiringAlert
from specwatch.core.config import OVERALL, SINCE_START
from specwatch.core.roles import Role
from specwatch.demo import view
from specwatch.demo.view import (
    LoadSummary,
    ViewContext,
    build_view,
    fault_command,
    render_text,
)
from specwatch.export.json import snapshot_verdict
from specwatch.export.snapshot import Snapshot
from specwatch.observe.values import (
    Capacity,
    Health,
    Limits,
    ModelWindow,
    ObserveView,
    PairView,
    TargetSnapshot,
)
from specwatch.shadow.published import PairedSummary, ShadowIO, ShadowStats
from specwatch.shadow.summary import Levels, summarize
from specwatch.shadow.tally import PairTally

CTX = ViewContext(
    title="specwatch demo  12 s  window 1m  Ctrl-C stops",
    base="http://127.0.0.1:9400",
    standard_url="http://127.0.0.1:41231",
    fly_url="http://127.0.0.1:41232",
    notes=("shadow ledger: /tmp/x/ledger.sqlite (removed at exit)",),
)


def _health(alpha: float | None, tau: float | None, running: int, waiting: int) -> Health:
    return Health(
        acceptance_rate=alpha,
        mean_acceptance_length=tau,
        generation_tokens_per_second=1234.4,
        num_requests_running=running,
        num_requests_waiting=waiting,
    )


def _target(name: str, a0: float, a1: float, running: float) -> TargetSnapshot:
    """A target up with max_num_seqs 16, one model whose two engines have α ``a0``, ``a1``."""
    return TargetSnapshot(
        name=name,
        role=Role(name),
        url=f"http://{name}:8000/metrics",
        up=True,
        limits=Limits(max_num_seqs=16),
        capacity=Capacity(limits_configured=False, num_requests_running=running),
        windows={
            "1m": {
                "m": ModelWindow(
                    server=_health((a0 + a1) / 2, 3.5, 20, 3),
                    engines={"1": _health(a1, None, 9, 1), "0": _health(a0, None, 11, 2)},
                )
            }
        },
    )


def _targets() -> dict[str, TargetSnapshot]:
    return {
        "standard": _target("standard", 0.6, 0.7, 11),
        "fly": _target("fly", 0.7, 0.8, 12),
    }


PAIR = {
    "1m": PairView("standard", "fly", acceptance_gain_ratio=0.1, mean_acceptance_length_ratio=1.125)
}


def _snap(
    targets: dict[str, TargetSnapshot] | None = None,
    shadow: ShadowStats | None = None,
    alerts: AlertingState | None = None,
) -> Snapshot:
    observe = ObserveView(generated_at=1.0, targets=targets or _targets(), pair=PAIR)
    return Snapshot(observe=observe, shadow=shadow, alerts=alerts)


def _summary(tally: PairTally, **values: float) -> PairedSummary:
    """The paired summary of ``tally`` with some of its numbers set by hand."""
    return replace(summarize(tally), **values)  # type: ignore[arg-type]


def test_fault_command_is_one_short_line() -> None:
    """The fault command drops ``http://`` (curl's default) and spaces in the JSON: 77
    columns with a 5-digit port, so it copies whole from an 80-column terminal."""
    cmd = fault_command("http://127.0.0.1:41232")
    assert cmd == (
        "curl -X POST 127.0.0.1:41232/admin/faults -d '{\"fly_entropy_threshold\":0.05}'"
    )
    assert len(cmd) == 77


def test_wide_view_rows_show_alpha_tau_running_waiting_per_engine() -> None:
    """At 160 columns: title, URLs, the fault command, notes, the target table with the
    per-engine α column, the pair line (τ 1.125 → +12 %, rounded half to even... 12.5 → 12),
    then the snapshot's verdict: τ only, no labelled pairs yet."""
    lines = render_text(build_view(_snap(), CTX, width=160), width=160).splitlines()
    assert lines[0] == CTX.title
    assert lines[1] == "sidecar http://127.0.0.1:9400  /metrics  /api/v1/snapshot"
    assert lines[2] == "standard http://127.0.0.1:41231  fly http://127.0.0.1:41232"
    assert lines[4] == fault_command(CTX.fly_url)
    assert lines[5] == CTX.notes[0]
    assert lines[6].split() == [
        "target", "up", "α", "τ", "cov", "tok/s", "run/max", "wait", "α", "per", "engine",
    ]  # fmt: skip
    assert lines[7].split() == [
        "standard", "up", "0.650", "3.50", "-", "1,234", "11/16", "3", "e0=0.600", "e1=0.700",
    ]  # fmt: skip
    assert lines[8].split()[:8] == ["fly", "up", "0.750", "3.50", "-", "1,234", "12/16", "3"]
    assert lines[9] == "FLy vs standard (1m): α +0.100, τ +12 %, tok/s n/a (equal traffic)"
    assert lines[10:] == [
        "FLy: τ +12 %, no labelled pairs yet (quality unknown)",
        "what each figure means: docs/demo.md#reading-the-screen",
    ]


def test_unknown_values_show_a_dash() -> None:
    """A target with no good scrape yet (down, no window, no limits) shows ``-`` for every
    number; NaN and infinite values read as unknown too (never ``nan``)."""
    down = TargetSnapshot(name="fly", role=Role.FLY, url="http://fly:8000/metrics")
    nan = replace(
        _target("standard", 0.6, 0.7, 11),
        capacity=Capacity(limits_configured=False),
        windows={"1m": {"m": ModelWindow(_health(float("nan"), float("inf"), 2, 1), {})}},
    )
    lines = render_text(
        build_view(_snap({"standard": nan, "fly": down}), CTX, width=160), width=160
    ).splitlines()
    assert lines[7].split() == ["standard", "up", "-", "-", "-", "1,234", "2/16", "1", "-"]
    assert lines[8].split() == ["fly", "down", "-", "-", "-", "-", "-/-", "-", "-"]


def test_narrow_view_fits_80_columns_and_cuts_with_an_ellipsis() -> None:
    """At 80 columns the per-engine column goes, every line fits, and a long target name is cut
    with an ellipsis instead of wrapping; the verdict (351 labelled pairs since start) wraps
    between words only."""
    targets = _targets()
    targets["a-very-long-target-name-" * 4] = targets["fly"]
    tally = PairTally(both_correct=280, lost=25, gained=13, both_wrong=33)
    stats = ShadowStats(
        generated_at=1.0,
        alpha=0.05,
        margin=0.01,
        detect_net_loss=0.02,
        windows={SINCE_START: {OVERALL: summarize(tally)}},
    )
    snap = _snap(targets, shadow=stats)
    verdict = snapshot_verdict(snap)
    assert verdict is not None
    assert "351 labelled pairs" in verdict
    assert len(verdict) > 80
    text = render_text(build_view(snap, CTX, width=80), width=80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "e0=" not in text
    assert any(line.startswith("a-very-long-target-na") and "…" in line for line in lines)
    start = next(i for i, line in enumerate(lines) if line.startswith("FLy: "))
    joined = " ".join(lines[start : start + 3])
    assert joined.startswith(verdict)


def test_view_shadow_load_and_alert_sections() -> None:
    """Shadow: 200 pairs, FLy disagrees with standard on 50 (25.0 %), the noise arm on 2 of 200
    (1.0 %); since_start wins over the view's window (its e-value is the anytime-valid one,
    read against the overall page bound 1/(α x 0.5) = 40); McNemar's p is labelled fixed-n.
    Alerts carry the view's note."""
    tally = PairTally(
        both_correct=60,
        lost=9,
        gained=3,
        both_wrong=8,
        agree=150,
        disagree=50,
        noise_agree=198,
        noise_disagree=2,
    )
    summary = _summary(tally, p_loss=0.073, e_value=3.25)
    assert summary.n == 80
    stats = ShadowStats(
        generated_at=1.0,
        alpha=0.05,
        margin=0.01,
        detect_net_loss=0.02,
        windows={"1m": {OVERALL: replace(summary, n=1)}, SINCE_START: {OVERALL: summary}},
        io=ShadowIO(
            in_flight=3,
            queue_depth=1,
            paused={"waiting": 0, "load_stale": 1},
            dropped={"paused": 7, "rate_limit": 0, "expired": 2},
        ),
        unpaired_total={"timeout": 1, "http_500": 2},
    )
    firing = FiringAlert({"alertname": "SpecQualityDrift", "severity": "critical"}, 90.0)
    ctx = ViewContext(
        title="t",
        base=CTX.base,
        standard_url=CTX.standard_url,
        fly_url=CTX.fly_url,
        alert_notes={"SpecQualityDrift": "fired after 351 labelled pairs, 95 s"},
    )
    load = LoadSummary(sent=10, ok=9, errors={"timeout": 1}, canary={"fly": (3, 4)})
    snap = _snap(shadow=stats, alerts=AlertingState(firing=(firing,)))
    lines = render_text(build_view(snap, ctx, width=100, load=load), width=100).splitlines()
    assert lines[-7:] == [
        "pairs (since_start) 200, labelled 80: lost 9 gained 3; e-value 3.2 of 30",
        "flips vs standard: FLy 25.0 %, noise floor 1.0 %; fixed-n McNemar p 0.073",
        "replay: in flight 3, queued 1, paused load_stale, dropped 9, unpaired 3",
        "load: sent 10, ok 9, errors 1",
        "canary right: fly 3/4 75 %",
        "alerts: 1 firing",
        "  SpecQualityDrift [critical] fired after 351 labelled pairs, 95 s",
    ]
    assert " ".join(lines[9:-8]) == snapshot_verdict(snap)  # between the pair line and these
    assert lines[-8] == "what each figure means: docs/demo.md#reading-the-screen"
    quiet = replace(snap, alerts=AlertingState())
    assert render_text(build_view(quiet, ctx, width=100), width=100).endswith("alerts: none firing")


def test_view_hides_sections_no_component_published() -> None:
    """Shadow and alert sections appear only once their typed parts are published; without a
    pair view or shadow statistics the snapshot has no verdict line either."""
    bare = Snapshot(observe=ObserveView(generated_at=1.0))
    assert snapshot_verdict(bare) is None
    lines = render_text(build_view(bare, CTX, width=80), width=80).splitlines()
    assert lines[-1].split() == ["target", "up", "α", "τ", "cov", "tok/s", "run/max", "wait"]
    published = Snapshot(
        observe=ObserveView(generated_at=1.0),
        shadow=ShadowStats(
            generated_at=1.0, alpha=0.05, margin=0.01, detect_net_loss=0.02, windows={}
        ),
        alerts=AlertingState(),
    )
    text = render_text(build_view(published, CTX, width=80), width=80)
    assert text.splitlines()[-2:] == ["shadow: waiting for pairs", "alerts: none firing"]


def test_the_view_reads_typed_values_only() -> None:
    """The view module never builds or reads the JSON document: it does not use
    ``snapshot_json`` or ``typing.Any``, and checks no value's JSON type with ``isinstance``
    (every attribute and ``.get`` it reads is on a typed value mypy checks; the one
    ``isinstance`` is its own ``str | Text`` argument)."""
    tree = ast.parse(inspect.getsource(view))
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    assert not names & {"snapshot_json", "view_document", "Any"}
    checked = [
        ast.unparse(n.args[1])
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "isinstance"
    ]
    assert checked == ["Text"]
    # the JSON document would have given the view dict keys; typed values have attributes
    subscripts_by_string = [
        ast.unparse(n)
        for n in ast.walk(tree)
        if isinstance(n, ast.Subscript)
        and isinstance(n.slice, ast.Constant)
        and isinstance(n.slice.value, str)
    ]
    assert subscripts_by_string == []


def test_view_shows_tau_coverage_per_category() -> None:
    """Below the shadow lines, per-request τ coverage per category from the decision table:
    math 5 pairs of which 4 carried τ on both arms (80.0 %), code 2 of 2, all 6 of 7
    (85.7 %), overall first; a detail, so it goes first when the terminal is short."""
    from specwatch.shadow.decision import decision_table
    from specwatch.shadow.tally import ArmTotals

    tallies = {"math": PairTally(agree=5), "code": PairTally(agree=2)}
    totals = {"math": ArmTotals(tau_pairs=4), "code": ArmTotals(tau_pairs=2)}
    decisions = decision_table(
        tallies, totals, levels=Levels(alpha=0.05, margin=0.01, detect_net_loss=0.02)
    )
    stats = ShadowStats(
        generated_at=1.0,
        alpha=0.05,
        margin=0.01,
        detect_net_loss=0.02,
        windows={SINCE_START: {OVERALL: _summary(PairTally(agree=7))}},
        decisions=decisions,
    )
    snap = _snap(shadow=stats)
    lines = render_text(build_view(snap, CTX, width=80), width=80).splitlines()
    assert "τ coverage: all 85.7 %, code 100.0 %, math 80.0 %" in lines
    short = render_text(build_view(snap, CTX, width=80, height=12), width=80).splitlines()
    assert not any(line.startswith("τ coverage") for line in short)


def test_view_shows_the_speculation_limit_sentence_of_the_snapshot() -> None:
    """The view prints the speculation limit's own sentence (the one ``/api/v1/snapshot`` and
    ``specwatch advise`` carry), after the pair line; nothing while there is no data."""
    from specwatch.export.json import snapshot_json
    from specwatch.observe.concurrency import ConcurrencyProfile, add_point, speculation_limit

    std, fly = ConcurrencyProfile(), ConcurrencyProfile()
    for running, s, f in [(1, 50.0, 80.0)] * 8 + [(8, 400.0, 380.0)] * 8:
        std, fly = add_point(std, running, s, None), add_point(fly, running, f, None)
    limit = speculation_limit(std, fly)
    snap = _snap()
    snap = replace(snap, observe=replace(snap.observe, speculation_limit=limit))
    lines = render_text(build_view(snap, CTX, width=400), width=400).splitlines()
    assert lines[10] == limit.text
    assert limit.text.startswith(
        "FLy vs standard speculation: stops paying from about 7 running requests (95 % "
        "interval 1-8)"
    )
    assert snapshot_json(snap)["speculation_limit"]["text"] == limit.text
    none = replace(snap.observe, speculation_limit=speculation_limit(ConcurrencyProfile(), fly))
    text = render_text(build_view(replace(snap, observe=none), CTX, width=400), width=400)
    assert "speculation" not in text


def test_view_names_the_subject_of_a_limit_not_reached() -> None:
    """A speculation limit that is not reached says what was compared and what was not reached
    ("FLy vs standard speculation: not reached within the observed range ..."), and the view
    shows that sentence whole, never a subject-less "not reached: ..."."""
    from specwatch.observe.concurrency import ConcurrencyProfile, add_point, speculation_limit

    std, fly = ConcurrencyProfile(), ConcurrencyProfile()
    for running, s, f in [(1, 50.0, 80.0)] * 8 + [(8, 400.0, 480.0)] * 8:
        std, fly = add_point(std, running, s, None), add_point(fly, running, f, None)
    limit = speculation_limit(std, fly)
    assert [c.status for c in limit.comparisons] == ["not_reached"]
    assert limit.text.startswith("FLy vs standard speculation: not reached within the observed")
    assert "highest concurrency seen: 8" in limit.text
    snap = _snap()
    snap = replace(snap, observe=replace(snap.observe, speculation_limit=limit))
    lines = render_text(build_view(snap, CTX, width=400), width=400).splitlines()
    assert limit.text in lines
