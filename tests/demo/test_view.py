"""The demo's live view (a pure function of the snapshot document), its settings and flags."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from specwatch.__main__ import main as cli_main
from specwatch.alerts.alertmanager import AlertingState
from specwatch.core.roles import Role
from specwatch.demo.run import (
    DemoConfig,
    DemoFiles,
    DemoTargets,
    demo_components,
    demo_settings,
    prepare_demo_files,
    remove_demo_files,
    render_view,
    simulator_configs,
    view_document,
    write_canary_file,
)
from specwatch.export.snapshot import Snapshot
from specwatch.observe.values import ObserveView
from specwatch.server.wiring import AlertingPlug, ShadowPlug
from specwatch.shadow.ingest.canary import load_canary
from specwatch.shadow.summary import build_shadow_stats
from specwatch.simulate.config import Role as SimRole
from specwatch.simulate.quiz import builtin_items


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
        "pair": {
            "1m": {
                "acceptance_gain_ratio": 0.1,
                "mean_acceptance_length_ratio": 1.125,
                "throughput_ratio": None,
            }
        },
    }


def test_view_rows_show_alpha_tau_running_waiting_per_engine() -> None:
    """The view shows one row per target (alpha, tau, tok/s, running/max, waiting, per-engine
    alpha) and the pair line."""
    text = render_view(_doc(), window="1m", header="HEAD")
    lines = text.splitlines()
    assert lines[0] == "HEAD"
    assert lines[1].split() == [
        "target", "role", "up", "α", "τ", "tok/s", "running/max", "waiting", "per", "engine", "α",
    ]  # fmt: skip
    assert lines[2].split() == [
        "standard", "standard", "up", "0.650", "3.50", "1234", "11/16", "3", "e0=0.600", "e1=0.700",
    ]  # fmt: skip
    assert lines[3].split()[:8] == ["fly", "fly", "up", "0.750", "3.50", "1234", "12/16", "3"]
    assert lines[4] == (
        "pair (1m): α fly − standard +0.100  τ fly / standard 1.125  throughput fly / standard -"
    )
    assert len(lines) == 5  # no load, shadow or alerts given: no such sections
    assert "\x1b" not in text


def test_view_falls_back_to_the_first_window_and_marks_unknowns() -> None:
    """A missing window falls back to the first one; a stale target shows "stale" and "-" for
    unknowns."""
    doc = _doc()
    t = doc["targets"]["fly"]  # type: ignore[index]
    t["up"] = False
    t["stale"] = True
    t["windows"] = {"since_start": {"server": _health(None, None, 0, 0), "engines": {}}}
    t["capacity"] = {"num_requests_running": None}
    line = render_view(doc, window="1m").splitlines()[2]
    # running falls back to the server gauge when capacity has none
    assert line.split() == ["fly", "fly", "stale", "-", "-", "1234", "0/16", "0", "-"]


def test_view_load_shadow_and_alert_sections() -> None:
    """Load, shadow and alert sections appear when given, with the shadow counts and test
    results."""
    doc = _doc()
    summary = {
        "n": 40, "lost": 5, "gained": 1, "net_loss_ratio": 0.1, "ci_lower": -0.02,
        "ci_upper": 0.24, "p_loss": 0.109375, "e_value": 2.5, "fly_flip_ratio": 0.15,
        "noise_flip_ratio": 0.05, "non_inferiority_pass": False,
    }  # fmt: skip
    doc["shadow"] = {"windows": {"since_start": {"_all": summary, "counting": {"n": 3}}}}
    doc["alerts"] = [
        {"labels": {"alertname": "FlyAcceptanceDrop", "severity": "warning", "target": "fly"}}
    ]
    load = {"sent": 10, "ok": 9, "errors": {"timeout": 1}, "canary": {"fly": (3, 4)}}
    lines = render_view(doc, window="1m", load=load, ansi=True).splitlines()
    assert lines[4] == "load: sent 10  ok 9  errors 1  canary correct: fly 3/4"
    assert lines[5] == (
        "shadow (since_start): pairs 40  lost 5  gained 1  net loss 0.100 [-0.020, 0.240]  "
        "McNemar p(loss) 0.109  e-value 2.5"
    )
    assert lines[6].split() == [
        "flip", "ratio", "fly", "0.150", "noise", "0.050", "non-inferior", "no",
    ]  # fmt: skip
    assert lines[7] == "alerts: 1 firing"
    assert lines[8] == "\x1b[31m  FlyAcceptanceDrop [warning] target=fly\x1b[0m"
    doc["alerts"] = []
    assert render_view(doc).splitlines()[-1] == "alerts: none firing"


def test_view_document_hides_sections_no_component_published() -> None:
    """Shadow and alert sections appear only once their typed parts are published."""
    snap = Snapshot(observe=ObserveView(generated_at=1.0))
    doc = view_document(snap)
    assert "shadow" not in doc
    assert "alerts" not in doc
    snap2 = Snapshot(
        observe=ObserveView(generated_at=1.0),
        shadow=build_shadow_stats({}, now=1.0, ledger_rows=7),
        alerts=AlertingState(),
    )
    doc2 = view_document(snap2)
    assert doc2["alerts"] == []
    assert doc2["shadow"]["ledger_rows"] == 7
    assert render_view(doc2).splitlines()[-2:] == [
        "shadow: alpha 0.050  margin 0.010  detect_net_loss 0.020  ledger_rows 7",
        "alerts: none firing",
    ]


def test_demo_settings_configure_both_targets_with_limits() -> None:
    """demo_settings configures both simulated targets with their limits, short windows and no
    shadow without files."""
    cfg = DemoConfig()
    targets = DemoTargets("http://127.0.0.1:1", "http://127.0.0.1:2")
    s = demo_settings(cfg, targets, port=0)
    assert [(t.name, t.effective_role, t.url) for t in s.targets] == [
        ("standard", Role.STANDARD, "http://127.0.0.1:1/metrics"),
        ("fly", Role.FLY, "http://127.0.0.1:2/metrics"),
    ]
    assert s.scrape.interval_seconds == 1.0
    assert s.windows == ("1m", "5m")
    for t in s.targets:
        assert t.limits.max_num_seqs == 16
        assert t.limits.max_num_batched_tokens == 512
        assert t.limits.num_speculative_tokens == 4
        assert t.limits.method == "eagle3"
    assert not s.shadow.enabled  # no files: no shadow chain
    comps = demo_components(s)
    assert [type(c) for c in comps] == [AlertingPlug]
    assert demo_components(s, alerts=False) == []
    std, fly = simulator_configs(cfg)
    assert (std.role, fly.role) == (SimRole.STANDARD, SimRole.FLY)
    assert std.data_parallel_size == fly.data_parallel_size == 2
    assert std.seed == fly.seed
    assert math.isclose(fly.fly_entropy_threshold, 0.3)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--duration", "soon"], "not a duration"),
        (["--duration", "0"], "--duration must be longer than 0 s"),
        (["--port", "70000"], "--port must be 0..65535"),
        (["--concurrency", "0"], "--concurrency must be at least 1"),
        (["--rate", "-1"], "--rate must be >= 0"),
        (["--max-num-seqs", "0"], "--max-num-seqs and --max-num-batched-tokens must be >= 1"),
    ],
)
def test_bad_demo_flags_exit_2_with_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each bad demo flag exits 2 with its message in one line."""
    assert cli_main(["demo", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    assert len(err.splitlines()) == 1


def test_demo_settings_with_files_enable_shadow_arms_noise_ledger_and_demo_alerts(
    tmp_path: Path,
) -> None:
    """With files, the demo enables the shadow chain (arms, standard noise arm, ledger, canary)
    and its alerting."""
    cfg = DemoConfig(alertmanager_urls=("http://am:9093",))
    targets = DemoTargets("http://127.0.0.1:1", "http://127.0.0.1:2")
    files = DemoFiles(tmp_path / "l.sqlite", tmp_path / "c.jsonl", tmp_path)
    s = demo_settings(cfg, targets, port=0, files=files)
    sh = s.shadow
    assert sh.enabled
    assert set(sh.modes) == {"mirror", "canary"}
    # arms name the targets; their URLs are the simulators' base URLs
    assert (sh.standard.target, sh.standard.url) == ("standard", "http://127.0.0.1:1")  # type: ignore[union-attr]
    assert (sh.fly.target, sh.fly.url) == ("fly", "http://127.0.0.1:2")  # type: ignore[union-attr]
    # the noise arm is a second replay to the standard server
    assert sh.noise_kind == "standard"
    assert sh.noise_endpoint() == sh.standard
    assert sh.mirror_require_shadow_host
    assert sh.canary_file == str(files.canary)
    assert sh.sample_probability == cfg.shadow_sample
    assert s.ledger.path == str(files.ledger)
    assert s.paired.windows == ("1m", "5m")
    assert s.alerting.urls == ["http://am:9093"]
    assert s.detect.flip_for == s.detect.quality_e_value_for == cfg.alert_for_s
    # every detector window is one the sidecar keeps (no silent detector)
    assert s.detect.fly_gain_window in s.windows
    assert s.detect.flip_window in s.paired.windows
    comps = demo_components(s)
    assert [type(c) for c in comps] == [ShadowPlug, AlertingPlug]


def test_canary_file_has_every_item_per_variant_with_distinct_requests(tmp_path: Path) -> None:
    """The demo canary file holds every built-in item once per variant, shuffled, each variant
    with its own max_tokens."""
    path = tmp_path / "c.jsonl"
    n = write_canary_file(path, variants=3, temperature=1.0, seed=5)
    items = builtin_items()
    assert n == 3 * len(items) == 720
    load = load_canary(str(path), builtin=False)
    assert len(load.items) == 720
    assert not load.bad_lines
    gold = {it["prompt"]: it["gold"] for it in items}
    # every item once per variant, with its gold answer; variant v asks for 64 + v tokens
    for v in range(3):
        rows = [i for i in load.items if i.item_id.endswith(f"-v{v}")]
        assert sorted(r.body["prompt"] for r in rows) == sorted(gold)
        assert all(r.gold == gold[r.body["prompt"]] for r in rows)
        assert {r.body["max_tokens"] for r in rows} == {64 + v}
        assert {r.body["temperature"] for r in rows} == {1.0}
    # shuffled: the first pass does not run one category after the other
    first = [i.category for i in load.items[:20]]
    assert len(set(first)) > 1


def test_prepare_and_remove_demo_files(tmp_path: Path) -> None:
    """Demo files live in a temporary directory that removal deletes; a user-placed ledger is
    kept."""
    files = prepare_demo_files(DemoConfig(canary_variants=1))
    try:
        assert files.canary.parent == files.tempdir
        assert files.ledger == files.tempdir / "ledger.sqlite"
        assert len(files.canary.read_text().splitlines()) == 240
    finally:
        remove_demo_files(files)
    assert not files.tempdir.exists()
    kept = tmp_path / "kept.sqlite"
    kept.write_bytes(b"")
    files = prepare_demo_files(DemoConfig(canary_variants=1, ledger_path=str(kept)))
    remove_demo_files(files)
    assert files.ledger == kept
    assert kept.exists()  # a ledger the user placed is never removed
    assert not files.tempdir.exists()


def test_view_shadow_section_counts_flips_against_the_noise_floor_and_replay_state() -> None:
    """The shadow section uses since_start, counts flips against the noise floor and shows the
    replay state."""
    doc = _doc()
    tally = {"agree": 150, "disagree": 50, "noise_agree": 198, "noise_disagree": 2}
    summary = {
        "n": 80, "lost": 9, "gained": 3, "net_loss_ratio": 0.075, "ci_lower": 0.001,
        "ci_upper": 0.16, "p_loss": 0.073, "e_value": 3.25, "excess_flip_ratio": 0.24,
        "non_inferiority_pass": False, "tally": tally,
    }  # fmt: skip
    doc["shadow"] = {
        "windows": {"1m": {"_all": {**summary, "n": 1}}, "since_start": {"_all": summary}},
        "io": {
            "in_flight": 3, "queue_depth": 1, "paused": {"waiting": False, "load_stale": True},
            "dropped_total": {"paused": 7, "rate_limit": 0, "expired": 2},
        },
        "unpaired_total": {"timeout": 1, "http_500": 2},
    }  # fmt: skip
    lines = render_view(doc, window="1m").splitlines()
    # since_start wins over the view's window: its e-value is the anytime-valid one
    assert lines[4] == (
        "shadow (since_start): pairs 200  graded 80  lost 9  gained 3  net loss 0.075 "
        "[0.001, 0.160]  McNemar p(loss) 0.073  e-value 3.25"
    )
    assert lines[5] == (
        "        flips vs standard: fly 50/200 (0.250)  noise floor 2/200 (0.010)  "
        "excess 0.240  non-inferior no"
    )
    assert lines[6] == (
        "        replay: in flight 3  queued 1  paused load_stale  "
        "dropped expired 2, paused 7  unpaired 3"
    )
