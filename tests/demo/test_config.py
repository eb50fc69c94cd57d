"""The demo's configuration: settings for the sidecar, the simulators' shapes, its files, flags."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from specwatch.__main__ import main as cli_main
from specwatch.core.roles import Role
from specwatch.demo.config import (
    DemoConfig,
    DemoFiles,
    DemoTargets,
    demo_components,
    demo_settings,
    prepare_demo_files,
    remove_demo_files,
    simulator_configs,
    write_canary_file,
)
from specwatch.server.wiring import AlertingPlug, ShadowPlug
from specwatch.shadow.ingest.canary import load_canary
from specwatch.simulate.config import Role as SimRole
from specwatch.simulate.quiz import builtin_items


def test_demo_settings_configure_both_targets_with_limits() -> None:
    """Both simulators are targets with their limits (so capacity gauges have values);
    without files there is no shadow chain, only alerting."""
    cfg = DemoConfig()
    targets = DemoTargets("http://127.0.0.1:1", "http://127.0.0.1:2")
    s = demo_settings(cfg, targets, port=0)
    assert [(t.name, t.effective_role, t.url) for t in s.targets] == [
        ("standard", Role.STANDARD, "http://127.0.0.1:1/metrics"),
        ("fly", Role.FLY, "http://127.0.0.1:2/metrics"),
    ]
    assert s.scrape.interval_seconds == 1.0
    assert s.windows == ("1m", "5m", "20s")  # 20s: the acceptance-drop window
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
    """Each bad flag value exits 2 with one line naming the flag."""
    assert cli_main(["demo", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    assert len(err.splitlines()) == 1


def test_demo_settings_with_files_enable_shadow_arms_noise_ledger_and_demo_alerts(
    tmp_path: Path,
) -> None:
    """With files the shadow chain runs: mirror + canary, arms by target name, a noise arm,
    the ledger, alerts at demo scale."""
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
    # with its own server the standard and FLy servers get the same traffic
    own = DemoTargets("http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3")
    sh3 = demo_settings(cfg, own, port=0, files=files).shadow
    assert sh3.noise_kind == "standard"
    assert sh3.noise_endpoint().url == "http://127.0.0.1:3"  # type: ignore[union-attr]
    assert sh.mirror_require_shadow_host
    assert sh.canary_file == str(files.canary)
    assert sh.sample_probability == cfg.shadow_sample
    assert s.ledger.path == str(files.ledger)
    assert s.paired.windows == ("1m", "5m")
    assert s.alerting.urls == ["http://am:9093"]
    assert s.detect.flip_for == s.detect.quality_e_value_for == cfg.alert_for_s
    # no page from a lack of evidence: Connor one-sided, margin 0.01, 20 % discordance:
    # (1.6449·0.447214 + 0.8416·0.447102)² / 0.0001 = 1.1119120² / 0.0001 = 12,363.5 → 12,364
    assert s.detect.quality_min_pairs == 12_364
    # every detector window is one the sidecar keeps (no silent detector)
    assert s.detect.fly_gain_window in s.windows
    assert s.detect.flip_window in s.paired.windows
    comps = demo_components(s)
    assert [type(c) for c in comps] == [ShadowPlug, AlertingPlug]


def test_canary_file_has_every_item_per_variant_with_distinct_requests(tmp_path: Path) -> None:
    """The canary file holds the 240 items once per variant, each variant a distinct
    request, shuffled."""
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
    """The temporary directory is removed at exit; a ledger the user placed elsewhere is kept."""
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
