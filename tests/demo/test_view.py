"""The demo's live view: a pure function of the snapshot document, drawn by rich to a width."""

from __future__ import annotations

from specwatch.alerts.values import AlertingState
from specwatch.demo.view import (
    ViewContext,
    build_view,
    fault_command,
    render_text,
    view_document,
)
from specwatch.export.snapshot import Snapshot
from specwatch.observe.values import ObserveView
from specwatch.shadow.summary import build_shadow_stats
from specwatch.shadow.verdict import Verdict, verdict_line

CTX = ViewContext(
    title="specwatch demo  12 s  window 1m  Ctrl-C stops",
    base="http://127.0.0.1:9400",
    standard_url="http://127.0.0.1:41231",
    fly_url="http://127.0.0.1:41232",
    notes=("shadow ledger: /tmp/x/ledger.sqlite (removed at exit)",),
)


def _health(
    alpha: float | None, tau: float | None, running: int, waiting: int
) -> dict[str, object]:
    return {
        "acceptance_rate": alpha,
        "mean_acceptance_length": tau,
        "generation_tokens_per_second": 1234.4,
        "num_requests_running": running,
        "num_requests_waiting": waiting,
    }


def _doc() -> dict[str, object]:
    def target(role: str, a0: float, a1: float, running: float) -> dict[str, object]:
        return {
            "role": role,
            "up": True,
            "stale": False,
            "limits": {"max_num_seqs": 16},
            "capacity": {"num_requests_running": running},
            "windows": {
                "1m": {
                    "server": _health((a0 + a1) / 2, 3.5, 20, 3),
                    "engines": {"1": _health(a1, None, 9, 1), "0": _health(a0, None, 11, 2)},
                }
            },
        }

    return {
        "targets": {
            "standard": target("standard", 0.6, 0.7, 11),
            "fly": target("fly", 0.7, 0.8, 12),
        },
        "pair": {"1m": {"acceptance_gain_ratio": 0.1, "mean_acceptance_length_ratio": 1.125}},
    }


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
    per-engine α column, the pair line (τ 1.125 → +12 %, rounded half to even... 12.5 → 12)."""
    lines = render_text(build_view(_doc(), CTX, width=160), width=160).splitlines()
    assert lines[0] == CTX.title
    assert lines[1] == "sidecar http://127.0.0.1:9400  /metrics  /api/v1/snapshot"
    assert lines[2] == "standard http://127.0.0.1:41231  fly http://127.0.0.1:41232"
    assert lines[4] == fault_command(CTX.fly_url)
    assert lines[5] == CTX.notes[0]
    assert lines[6].split() == [
        "target", "up", "α", "τ", "tok/s", "run/max", "wait", "α", "per", "engine",
    ]  # fmt: skip
    assert lines[7].split() == [
        "standard", "up", "0.650", "3.50", "1,234", "11/16", "3", "e0=0.600", "e1=0.700",
    ]  # fmt: skip
    assert lines[8].split()[:7] == ["fly", "up", "0.750", "3.50", "1,234", "12/16", "3"]
    assert lines[9] == "FLy vs standard (1m): α +0.100, τ +12 %, tok/s n/a (equal traffic)"
    assert len(lines) == 10  # no verdict, load, shadow or alerts given: no such sections


def test_narrow_view_fits_80_columns_and_cuts_with_an_ellipsis() -> None:
    """At 80 columns the per-engine column goes, every line fits, and a long target name is cut
    with an ellipsis instead of wrapping; the verdict wraps between words only."""
    doc = _doc()
    targets = doc["targets"]
    assert isinstance(targets, dict)
    targets["a-very-long-target-name-" * 4] = targets["fly"]
    v = Verdict(
        tau_ratio=1.13,
        throughput_ratio=1.09,
        n=351,
        net_loss=0.035,
        ci_lower=0.007,
        ci_upper=0.065,
        e_value=8.27,
        discordant=0.04,
    )
    doc["verdict"] = verdict_line(v)
    text = render_text(build_view(doc, CTX, width=80), width=80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "e0=" not in text
    assert any(line.startswith("a-very-long-target-na") and "…" in line for line in lines)
    start = next(i for i, line in enumerate(lines) if line.startswith("FLy: "))
    joined = " ".join(lines[start : start + 3])
    assert joined.startswith(verdict_line(v))


def test_view_shadow_load_and_alert_sections() -> None:
    """Shadow: 200 pairs, FLy disagrees with standard on 50 (25.0 %), the noise arm on 2 of 200
    (1.0 %); since_start wins over the view's window (its e-value is the anytime-valid one,
    read against 1/α = 20); McNemar's p is labelled fixed-n. Alerts carry the view's note."""
    doc = _doc()
    tally = {"agree": 150, "disagree": 50, "noise_agree": 198, "noise_disagree": 2}
    summary = {"n": 80, "lost": 9, "gained": 3, "p_loss": 0.073, "e_value": 3.25, "tally": tally}
    doc["shadow"] = {
        "alpha": 0.05,
        "windows": {"1m": {"_all": {**summary, "n": 1}}, "since_start": {"_all": summary}},
        "io": {
            "in_flight": 3, "queue_depth": 1, "paused": {"waiting": False, "load_stale": True},
            "dropped_total": {"paused": 7, "rate_limit": 0, "expired": 2},
        },
        "unpaired_total": {"timeout": 1, "http_500": 2},
    }  # fmt: skip
    doc["alerts"] = [{"labels": {"alertname": "SpecQualityDrift", "severity": "critical"}}]
    ctx = ViewContext(
        title="t",
        base=CTX.base,
        standard_url=CTX.standard_url,
        fly_url=CTX.fly_url,
        alert_notes={"SpecQualityDrift": "fired after 351 labelled pairs, 95 s"},
    )
    load = {"sent": 10, "ok": 9, "errors": {"timeout": 1}, "canary": {"fly": (3, 4)}}
    lines = render_text(build_view(doc, ctx, width=100, load=load), width=100).splitlines()
    assert lines[9:] == [
        "pairs (since_start) 200, labelled 80: lost 9 gained 3; e-value 3.2 of 20",
        "flips vs standard: FLy 25.0 %, noise floor 1.0 %; fixed-n McNemar p 0.073",
        "replay: in flight 3, queued 1, paused load_stale, dropped 9, unpaired 3",
        "load: sent 10, ok 9, errors 1; canary right: fly 3/4",
        "alerts: 1 firing",
        "  SpecQualityDrift [critical] fired after 351 labelled pairs, 95 s",
    ]
    doc["alerts"] = []
    assert render_text(build_view(doc, ctx, width=100), width=100).endswith("alerts: none firing")


def test_view_document_hides_sections_no_component_published() -> None:
    """Shadow and alert sections appear only once their typed parts are published; the
    snapshot's verdict says quality is unknown without labelled pairs."""
    snap = Snapshot(observe=ObserveView(generated_at=1.0))
    doc = view_document(snap)
    assert "shadow" not in doc
    assert "alerts" not in doc
    assert doc["verdict"] is None  # no pair view, no shadow stats
    snap2 = Snapshot(
        observe=ObserveView(generated_at=1.0),
        shadow=build_shadow_stats({}, now=1.0, ledger_rows=7),
        alerts=AlertingState(),
    )
    doc2 = view_document(snap2)
    assert doc2["alerts"] == []
    assert doc2["shadow"]["ledger_rows"] == 7
    text = render_text(build_view(doc2, CTX, width=80), width=80)
    assert text.splitlines()[-2:] == ["shadow: waiting for pairs", "alerts: none firing"]
