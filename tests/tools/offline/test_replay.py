"""``specwatch replay``: the detectors over saved /metrics timelines, driven through the CLI, and
the same scenarios walked through the Prometheus rules with promtool.

The admission-stall scenario is the public report in ``tests/fixtures/cases/C08_*`` (4 of
max_num_seqs 256 running, 492 waiting, KV 20 %, 29 generated tokens and no finished request
between the two scrapes 60 s apart), extended to 10 minutes by continuing every counter at the
rate it had between the two pages (gauges as on the second page).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from deploy.mixin.render import DEFAULT_RULES
from specwatch.__main__ import main as cli_main
from specwatch.export.prometheus import SpecwatchCollector
from specwatch.export.snapshot import Snapshot
from specwatch.observe.parse import parse_page
from specwatch.observe.settings import TargetSettings
from specwatch.observe.tracker import TargetTracker, build_view
from tests.fixture_files import FIXTURES

CASES = FIXTURES / "cases"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
C08_LIMITS = "max_num_seqs=256,max_num_batched_tokens=8192,num_speculative_tokens=3,method=eagle3"
#: The same server with a token budget of 512: N (1 + K + S) = 256 * (1 + 3 + 0) = 1024 > 512,
#: so at most 512 // 4 = 128 requests decode with full drafts per step.
TIGHT_LIMITS = "max_num_seqs=256,max_num_batched_tokens=512,num_speculative_tokens=3,method=eagle3"
_SAMPLE = re.compile(r"^(?P<series>[a-zA-Z_:][^ ]*) (?P<value>\S+)$")
_COUNTERS = ("_total", "_count", "_sum", "_bucket")


def c08_timeline(directory: Path, minutes: int = 10) -> Path:
    """Write ``0.prom`` … ``<60·minutes>.prom``: the two C08 pages, then every counter continued
    at its 0 → 60 s increase per minute, gauges as on the 60 s page."""
    first = (CASES / "C08_stall_t000.prom").read_text(encoding="utf-8")
    second = (CASES / "C08_stall_t060.prom").read_text(encoding="utf-8")
    start = {
        m["series"]: float(m["value"]) for ln in first.splitlines() if (m := _SAMPLE.match(ln))
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "0.prom").write_text(first, encoding="utf-8")
    for minute in range(1, minutes + 1):
        lines = []
        for ln in second.splitlines():
            m = _SAMPLE.match(ln)
            name = m["series"].split("{")[0] if m else ""
            if m and name.endswith(_COUNTERS) and m["series"] in start:
                v0, v1 = start[m["series"]], float(m["value"])
                lines.append(f"{m['series']} {v0 + (v1 - v0) * minute!r}")
            else:
                lines.append(ln)
        (directory / f"{60 * minute}.prom").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


def zero_spec_timeline(directory: Path, minutes: int = 5) -> Path:
    """Write ``0.prom`` … ``<60·minutes>.prom`` of a server that generates 1000 tokens/s and
    carries the spec-decode families all at zero, with the K = 3 ``position`` children vLLM
    creates at start-up: the page of a server that drafts nothing."""
    directory.mkdir(parents=True, exist_ok=True)
    sel = 'engine="0",model_name="m"'
    for minute in range(minutes + 1):
        t = 60 * minute
        lines = [
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{sel}}} {1000.0 * t!r}",
        ]
        for fam in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
            lines += [f"# TYPE vllm:spec_decode_{fam}_total counter"]
            lines += [f"vllm:spec_decode_{fam}_total{{{sel}}} 0.0"]
        lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter")
        lines += [
            f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{sel},position="{i}"}} 0.0'
            for i in range(3)
        ]
        (directory / f"{t}.prom").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


def _replay(
    capsys: pytest.CaptureFixture[str], *argv: str
) -> tuple[int, dict[str, Any] | str, str]:
    rc = cli_main(["replay", *argv])
    out = capsys.readouterr()
    if "--format" in argv and argv[argv.index("--format") + 1] == "json" and rc == 0:
        return rc, json.loads(out.out), out.err
    return rc, out.out, out.err


@pytest.fixture
def every_minute(monkeypatch: pytest.MonkeyPatch) -> None:
    """Evaluate the detectors once a minute (the scrape interval of the saved pages)."""
    monkeypatch.setenv("SPECWATCH_ALERTING__EVALUATION_INTERVAL", "60")


@pytest.mark.usefixtures("every_minute")
class TestReplayCli:
    def test_c08_stall_fires_after_its_for(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """The stall holds from the first window (t = 60 s: rates between 0 and 60 s) and fires
        after `for` 300 s, at 360 s; still firing at the end. Value = running / ceiling =
        4 / min(256, R_max) = 0.015625 (the case's right value)."""
        d = c08_timeline(tmp_path / "c08")
        rc, doc, _ = _replay(capsys, "--target", f"c08={d},{C08_LIMITS}", "--format", "json")
        assert rc == 0
        assert doc == {
            "alerts": [
                {
                    "alertname": "SpecAdmissionStall",
                    "severity": "critical",
                    "labels": {"model_name": "example-model", "role": "standard", "target": "c08"},
                    "value": 0.015625,
                    "summary": "Target c08 admits no work: requests wait, running is far below "
                    "capacity and nothing finishes.",
                    "fired_at": 360.0,
                    "resolved_at": None,
                }
            ]
        }

    def test_config_and_env_set_thresholds(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """`for` from the environment (0: fires at the first window, 60 s); a threshold from
        the --config file (running ratio 0.01 < 0.015625) silences it."""
        d = c08_timeline(tmp_path / "c08", minutes=3)
        monkeypatch.setenv("SPECWATCH_DETECT__STALL_FOR", "0")
        rc, doc, _ = _replay(capsys, "--target", f"c08={d},{C08_LIMITS}", "--format", "json")
        assert rc == 0
        assert isinstance(doc, dict)
        assert [(a["alertname"], a["fired_at"]) for a in doc["alerts"]] == [
            ("SpecAdmissionStall", 60.0)
        ]
        cfg = tmp_path / "specwatch.yaml"
        cfg.write_text("detect:\n  stall_max_running_ratio: 0.01\n", encoding="utf-8")
        rc, doc, _ = _replay(
            capsys, "--config", str(cfg), "--target", f"c08={d},{C08_LIMITS}", "--format", "json"
        )
        assert (rc, doc) == (0, {"alerts": []})

    def test_no_stall_claimed_without_the_ceiling(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """Without max_num_seqs there is no capacity to be far below: nothing fires (no
        absolute running count), and this server does not speculate (no drafts counter, K
        unknown), so SpecDecodeInactive never fires on it either."""
        d = c08_timeline(tmp_path / "c08")
        rc, doc, _ = _replay(capsys, "--target", f"c08={d}", "--format", "json")
        assert (rc, doc) == (0, {"alerts": []})

    def test_decode_inactive_only_where_speculation_is_meant(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The same pages (1000 tokens/s, every spec-decode family at zero, three ``position``
        children): a baseline target never raises SpecDecodeInactive, since a baseline does not
        speculate and zero-valued families are no sign that it does; a standard target (K 3
        observed) and a baseline configured with K 3 both raise it at the first window (for 0),
        with the value 1000 tokens/s."""
        monkeypatch.setenv("SPECWATCH_DETECT__INACTIVE_FOR", "0")
        d = zero_spec_timeline(tmp_path / "zero")
        fired: dict[str, list[tuple[str, float, float]]] = {}
        for spec in (
            f"baseline={d}",
            f"quiet={d},role=baseline",
            f"standard={d}",
            f"baseline={d},num_speculative_tokens=3",
        ):
            rc, doc, _ = _replay(capsys, "--target", spec, "--format", "json")
            assert rc == 0
            assert isinstance(doc, dict)
            fired[spec.replace(str(d), "D")] = [
                (a["alertname"], a["fired_at"], a["value"]) for a in doc["alerts"]
            ]
        assert fired == {
            "baseline=D": [],
            "quiet=D,role=baseline": [],
            "standard=D": [("SpecDecodeInactive", 60.0, 1000.0)],
            "baseline=D,num_speculative_tokens=3": [("SpecDecodeInactive", 60.0, 1000.0)],
        }

    def test_budget_finding_from_configuration(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """B 512 < 256 · (1 + 3 + 0) = 1024: the info-level finding fires at the first
        evaluation (t = 0, one page, no drafts on the page at all) with D_full 512 // 4 = 128."""
        d = c08_timeline(tmp_path / "c08", minutes=1)
        rc, doc, _ = _replay(capsys, "--target", f"tight={d},{TIGHT_LIMITS}", "--format", "json")
        assert rc == 0
        assert isinstance(doc, dict)
        (alert,) = [a for a in doc["alerts"] if a["alertname"] == "SpecTokenBudgetBound"]
        assert alert == {
            "alertname": "SpecTokenBudgetBound",
            "severity": "info",
            "labels": {"role": "standard", "target": "tight"},
            "value": 128,
            "summary": "The token budget max_num_batched_tokens 512 is below N 256 x "
            "(1 + K 3 + S 0) = 1024, so "
            "at most 128 requests can decode per step on tight.",
            "fired_at": 0.0,
            "resolved_at": None,
        }

    def test_table(self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        """The default table fits 80 columns: a header, one line per firing interval ('-' while
        unresolved), its labels and its summary wrapped between words below it, indented by two
        spaces."""
        d = c08_timeline(tmp_path / "c08")
        rc, out, _ = _replay(capsys, "--target", f"c08={d},{C08_LIMITS}", "--format", "table")
        assert rc == 0
        assert isinstance(out, str)
        lines = out.splitlines()
        assert max(len(line) for line in lines) <= 80
        assert lines[0].split() == ["fired_at", "resolved_at", "severity", "value", "alertname"]
        assert lines[1].split() == ["360", "-", "critical", "0.015625", "SpecAdmissionStall"]
        assert lines[1].index("SpecAdmissionStall") == lines[0].index("alertname")
        assert lines[2] == "  model_name=example-model, role=standard, target=c08"
        summary = " ".join(line.strip() for line in lines[3:])
        assert summary == (
            "Target c08 admits no work: requests wait, running is far below capacity and "
            "nothing finishes."
        )
        assert all(line.startswith("  ") for line in lines[2:])

    def test_resolves_when_requests_finish_again(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """From 240 s on, 10 requests finish per minute: the 1-minute window sees them at
        300 s and the stall (for 0, rate window 1m) resolves there."""
        monkeypatch.setenv("SPECWATCH_DETECT__STALL_FOR", "0")
        monkeypatch.setenv("SPECWATCH_DETECT__RATE_WINDOW", "1m")
        d = c08_timeline(tmp_path / "c08", minutes=6)
        for minute in (5, 6):
            page = d / f"{60 * minute}.prom"
            text = page.read_text(encoding="utf-8")
            pattern = r'(finished_reason="stop",model_name="example-model"\} )(\S+)'
            m = re.search(pattern, text)
            assert m is not None
            done = float(m[2]) + 10.0 * (minute - 4)
            text = text.replace(m[0], f"{m[1]}{done!r}")
            page.write_text(text, encoding="utf-8")
        rc, doc, _ = _replay(capsys, "--target", f"c08={d},{C08_LIMITS}", "--format", "json")
        assert rc == 0
        assert isinstance(doc, dict)
        assert [(a["alertname"], a["fired_at"], a["resolved_at"]) for a in doc["alerts"]] == [
            ("SpecAdmissionStall", 60.0, 300.0)
        ]

    def test_bad_input(self, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
        """A missing directory, an empty one and a body not named <seconds>.prom: exit 2 and
        one line naming the target and the file."""
        rc, _, err = _replay(capsys, "--target", f"x={tmp_path / 'nope'}")
        assert rc == 2
        assert "x:" in err
        assert "is not a directory" in err
        (tmp_path / "empty").mkdir()
        rc, _, err = _replay(capsys, "--target", f"x={tmp_path / 'empty'}")
        assert rc == 2
        assert "no <seconds>.prom or .om bodies" in err
        (tmp_path / "bad").mkdir()
        (tmp_path / "bad" / "later.prom").write_text("", encoding="utf-8")
        rc, _, err = _replay(capsys, "--target", f"x={tmp_path / 'bad'}")
        assert rc == 2
        assert "later.prom: name must be <seconds>.prom" in err
        assert len(err.strip().splitlines()) == 1

    def test_unparseable_body_is_a_failed_scrape(
        self, capsys: pytest.CaptureFixture[str], tmp_path: Path
    ) -> None:
        """A malformed body in the middle counts as a failed scrape and the replay goes on."""
        d = c08_timeline(tmp_path / "c08", minutes=2)
        malformed = (CASES / "C11_escaped_labels_malformed.prom").read_text(encoding="utf-8")
        (d / "90.prom").write_text(malformed, encoding="utf-8")
        rc, doc, err = _replay(capsys, "--target", f"c08={d},{C08_LIMITS}", "--format", "json")
        assert rc == 0
        assert doc == {"alerts": []}
        assert "replay body not parsed" in err
        assert "90.prom" in err


# -- the same scenarios through the Prometheus rules ----------------------------------------


def _const(snap: Snapshot) -> Callable[[], Snapshot]:
    return lambda: snap


def _exported_series(pages: Mapping[float, str], target: TargetSettings) -> dict[str, list[str]]:
    """specwatch's own /metrics (the real exporter over the observe chain) after each page:
    series text → one value per page (``_`` where the series is absent), as promtool reads."""
    tracker = TargetTracker(target, {"1m": 60.0, "5m": 300.0, "15m": 900.0})
    per_page: list[dict[str, float]] = []
    for t in sorted(pages):
        tracker.record_page(t, parse_page(pages[t]), duration_seconds=None)
        snap = Snapshot(observe=build_view([tracker.snapshot()], now=t))
        registry = CollectorRegistry()
        registry.register(SpecwatchCollector(_const(snap)))
        text = generate_latest(registry).decode()
        row: dict[str, float] = {}
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                labels = {"job": "specwatch", "instance": "sw:9477", **s.labels}
                body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
                row[f"{s.name}{{{body}}}"] = s.value
        per_page.append(row)
    names = sorted({n for row in per_page for n in row})
    return {n: [repr(row[n]) if n in row else "_" for row in per_page] for n in names}


@pytest.mark.promtool
@pytest.mark.usefixtures("every_minute")
@pytest.mark.parametrize(
    ("name", "limits"), [("c08", C08_LIMITS), ("tight", TIGHT_LIMITS), ("plain", "")]
)
def test_rules_fire_what_replay_fires(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, name: str, limits: str
) -> None:
    """Walk each scenario through `specwatch replay` and through the rules file with promtool
    (series = what specwatch exports after each page, evaluated every minute): at every minute
    the set of firing (alertname, target) pairs is the same."""
    d = c08_timeline(tmp_path / name)
    spec = f"{name}={d}" + (f",{limits}" if limits else "")
    rc, doc, _ = _replay(capsys, "--target", spec, "--format", "json")
    assert rc == 0
    assert isinstance(doc, dict)
    minutes = range(11)
    expected: dict[int, set[tuple[str, str]]] = {m: set() for m in minutes}
    for a in doc["alerts"]:
        end = a["resolved_at"] if a["resolved_at"] is not None else 1e9
        for m in minutes:
            if a["fired_at"] <= 60 * m < end:
                expected[m].add((a["alertname"], a["labels"]["target"]))
    assert any(expected.values()) or name == "plain"
    pages = {float(p.stem): p.read_text(encoding="utf-8") for p in d.glob("*.prom")}
    kv = dict(kv.split("=") for kv in limits.split(",")) if limits else {}
    target = TargetSettings.model_validate(
        {"name": name, "url": "http://h:1", "role": "standard", **kv}
    )
    series = _exported_series(pages, target)
    tests = []
    for m in minutes:
        tests.append(
            {
                "expr": 'count by (alertname, target) (ALERTS{alertstate="firing"})',
                "eval_time": f"{m}m",
                "exp_samples": [
                    {"labels": f'{{alertname="{a}",target="{t}"}}', "value": 1}
                    for a, t in sorted(expected[m])
                ],
            }
        )
    unit = {
        "rule_files": [str(DEFAULT_RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {"series": n, "values": " ".join(vals)} for n, vals in series.items()
                ],
                "promql_expr_test": tests,
            }
        ],
    }
    path = tmp_path / "replay_test.yaml"
    path.write_text(yaml.safe_dump(unit), encoding="utf-8")
    out = subprocess.run(
        [PROMTOOL, "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def _sample(text: str, name: str) -> float:
    """Sum of a family's samples on a page (the raw vLLM numbers, not specwatch's)."""
    total = 0.0
    for ln in text.splitlines():
        m = _SAMPLE.match(ln)
        if m and m["series"].split("{")[0] == name:
            total += float(m["value"])
    return total


@pytest.mark.usefixtures("every_minute")
def test_each_fired_summary_is_true_on_the_raw_pages(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Whatever replay fires on the C08 scenario (with the tight budget too), its summary's
    claims hold on the raw pages at the time it fired, read straight from vLLM's numbers:
    "requests wait" (waiting > 0), "running is far below capacity" (running / 256 <= 0.1),
    "nothing finishes" (request_success unchanged over the 5m window, here 0 -> fired_at),
    near-zero generation (< 1 token/s); the budget finding's arithmetic
    B < N (1 + K + S) and "at most R" with R = B // (1 + K) for eagle3 (S = 0)."""
    d = c08_timeline(tmp_path / "c08")
    rc, doc, _ = _replay(
        capsys,
        "--target",
        f"c08={d},{C08_LIMITS}",
        "--target",
        f"tight={d},{TIGHT_LIMITS}",
        "--format",
        "json",
    )
    assert rc == 0
    assert isinstance(doc, dict)
    names = sorted({a["alertname"] for a in doc["alerts"]})
    assert names == ["SpecAdmissionStall", "SpecTokenBudgetBound"]
    for a in doc["alerts"]:
        t = a["fired_at"]
        page = (d / f"{t:g}.prom").read_text(encoding="utf-8")
        if a["alertname"] == "SpecAdmissionStall":
            start = (d / f"{max(0.0, t - 300):g}.prom").read_text(encoding="utf-8")
            assert "requests wait" in a["summary"]
            assert _sample(page, "vllm:num_requests_waiting") > 0
            assert "running is far below capacity" in a["summary"]
            assert _sample(page, "vllm:num_requests_running") / 256 <= 0.1
            assert "nothing finishes" in a["summary"]
            done = _sample(page, "vllm:request_success_total")
            assert done - _sample(start, "vllm:request_success_total") == 0
            generated = _sample(page, "vllm:generation_tokens_total")
            assert (generated - _sample(start, "vllm:generation_tokens_total")) / 300 < 1
        else:
            m = re.fullmatch(
                r"The token budget max_num_batched_tokens (\d+) is below N (\d+) x "
                r"\(1 \+ K (\d+) \+ S (\d+)\) = "
                r"(\d+), so at most (\d+) requests can decode per step on (\w+)\.",
                a["summary"],
            )
            assert m is not None
            b, n, k, s, need, most = (int(m[i]) for i in range(1, 7))
            assert (m[7], b, n, k, s) == ("tight", 512, 256, 3, 0)
            assert need == n * (1 + k + s) > b
            assert most == b // (1 + k + s) == a["value"]


def test_nothing_fired_says_what_was_evaluated(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A K=4 timeline (the ngram capture, per-position counters for positions 0 to 3) replayed
    with K=3 on --target: no alert, and stderr says what was evaluated (2 pages, K=3 from
    --target, the pages show K=4, the windows and the span 0 to 60 s) so the mismatch shows."""
    d = tmp_path / "fly"
    d.mkdir()
    page = (FIXTURES / "vllm-metrics" / "real-cpu-ngram.txt").read_text(encoding="utf-8")
    for t in (0, 60):
        (d / f"{t}.prom").write_text(page, encoding="utf-8")
    rc, doc, err = _replay(
        capsys, "--target", f"fly={d},num_speculative_tokens=3", "--format", "json"
    )
    assert (rc, doc) == (0, {"alerts": []})
    assert err.strip().splitlines()[-1] == (
        "specwatch replay: no alert fired; evaluated fly: 2 pages, K=3 from --target, the pages "
        "show K=4; windows 1m, 5m, 15m over 0 to 60 s"
    )
