"""Hostile input on the command line: each case is a file or flag a user can hand specwatch that
once ended in a Python traceback (or was accepted and broke the service later). Each must end
in exit code 2 and one stderr line that names what failed (the file, line or setting).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from specwatch.__main__ import main as cli_main
from tests.fakes.http import canned_json_server

#: A nesting depth far past Python's recursion limit (1000): a recursive parser fails on it.
DEEP = 100_000


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No SPECWATCH_* setting from the environment of the test run leaks into a case."""
    import os

    for key in list(os.environ):
        if key.startswith("SPECWATCH_"):
            monkeypatch.delenv(key)


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("net_loss", ["1e-300", "1e-160"])
def test_power_net_loss_too_small_to_size(
    net_loss: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A net loss so small that δ² underflows to 0 (1e-300) or n overflows a float (1e-160)
    has no finite sample size: exit 2 with one line, not ZeroDivisionError/OverflowError."""
    assert cli_main(["power", "--net-loss", net_loss, "--discordant", "0.1"]) == 2
    err = _one_line(capsys)
    assert err.startswith("specwatch power: ")
    assert "net_loss" in err


def test_paired_test_deeply_nested_json_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A JSONL row nested 100,000 deep is a bad row at file:line (exit 2), not RecursionError."""
    base = tmp_path / "base.jsonl"
    cand = tmp_path / "cand.jsonl"
    base.write_text('{"id": 1, "correct": 1}\n', encoding="utf-8")
    cand.write_text('{"id": 1, "correct": 1}\n' + "[" * DEEP + "]" * DEEP + "\n")
    assert cli_main(["paired-test", str(base), str(cand)]) == 2
    err = _one_line(capsys)
    assert f"{cand}:2: " in err
    assert "nested too deep" in err


def test_bench_result_deeply_nested_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A result file nested 100,000 deep is refused naming the file (exit 2), no traceback."""
    result = tmp_path / "result.json"
    result.write_text("[" * DEEP + "]" * DEEP, encoding="utf-8")
    assert cli_main(["bench-result", str(result)]) == 2
    err = _one_line(capsys)
    assert str(result) in err
    assert "nested too deep" in err


RUN_TARGET = "targets:\n  - {name: fly, url: 'http://127.0.0.1:1/'}\n"


@pytest.mark.parametrize(
    ("suffix", "body", "reason"),
    [
        (".yaml", RUN_TARGET.encode() + b"log:\n  level: \xff\xfe\n", "not UTF-8"),
        (".yaml", b"x: " + b"[" * DEEP + b"]" * DEEP + b"\n", "nested too deep"),
        (".json", b'{"x": ' + b"[" * DEEP + b"]" * DEEP + b"}", "nested too deep"),
        (".toml", b"x = " + b"[" * DEEP + b"]" * DEEP + b"\n", "nested too deep"),
    ],
    ids=["yaml-not-utf8", "yaml-deep", "json-deep", "toml-deep"],
)
def test_run_config_file_unparseable(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    suffix: str,
    body: bytes,
    reason: str,
) -> None:
    """A config file with bytes that are not UTF-8, or nested past the parser's recursion
    limit: ``specwatch run`` exits 2 with one line naming the file, before it serves."""
    cfg = tmp_path / f"specwatch{suffix}"
    cfg.write_bytes(body)
    assert cli_main(["run", "--config", str(cfg), "--port", "0"]) == 2
    err = _one_line(capsys)
    assert err.startswith(f"specwatch run: config file {cfg}")
    assert reason in err


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://[::1/metrics", "not a valid URL"),
        ("http://vllm:99999/metrics", "Port out of range"),
        ("http://vllm:80a/metrics", "Port could not be cast"),
        ("http://:8000/metrics", "no host"),
    ],
)
def test_run_target_url_that_cannot_be_parsed(
    url: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A target URL that matches ``http://HOST/...`` in shape but cannot be parsed (an open IPv6
    bracket, a port over 65535 or not a number, no host) is a config error naming the target
    (exit 2). Before, it was accepted and its first failed scrape raised inside the scrape
    loop, which stopped scraping every target while ``/metrics`` kept answering."""
    assert cli_main(["run", "--target", f"fly={url}", "--port", "0"]) == 2
    err = _one_line(capsys)
    assert "config error: targets.0.url: " in err
    assert reason in err


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("SPECWATCH_TARGETS", "config error: environment: a SPECWATCH_* value is JSON nested"),
        ("SPECWATCH_WINDOWS", "config error: windows: "),
    ],
)
def test_run_environment_json_nested_too_deep(
    name: str, says: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A SPECWATCH_* environment value of 5,000 nested brackets is a config error (exit 2,
    one line), not a RecursionError traceback."""
    monkeypatch.setenv(name, "[" * 5000 + "]" * 5000)
    assert cli_main(["run", "--target", "fly=http://127.0.0.1:1", "--port", "0"]) == 2
    err = _one_line(capsys)
    assert says in err


def test_doctor_dashboard_nested_too_deep(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``doctor --dashboard`` with a file of 100,000 nested brackets: exit 2, one line naming
    the file, no RecursionError traceback."""
    dash = tmp_path / "dash.json"
    dash.write_text("[" * DEEP + "]" * DEEP, encoding="utf-8")
    rc = cli_main(["doctor", "--prometheus-url", "http://127.0.0.1:1", "--dashboard", str(dash)])
    assert rc == 2
    err = _one_line(capsys)
    assert f"{dash}: cannot read dashboard JSON: nested too deep" in err


@pytest.fixture
def deep_prometheus() -> Iterator[str]:
    """A "Prometheus" on 127.0.0.1 whose every answer is 200 JSON nested 100,000 deep."""
    with canned_json_server(("[" * DEEP + "]" * DEEP).encode()) as url:
        yield url


def test_fleet_prometheus_answer_nested_too_deep(
    deep_prometheus: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fleet`` against a server answering JSON nested 100,000 deep: exit 1 (fleet's code for
    "Prometheus cannot be queried") and one line naming the query URL and "nested too deep" (a
    ``decode`` failure), no RecursionError traceback."""
    rc = cli_main(["fleet", "--prometheus-url", deep_prometheus])
    assert rc == 1
    err = _one_line(capsys)
    assert deep_prometheus in err
    assert "JSON nested too deep" in err


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ("scrape:\n  interval_seconds: .inf\n", "scrape.interval_seconds"),
        ("server:\n  shutdown_timeout_seconds: .inf\n", "server.shutdown_timeout_seconds"),
        ("alerting:\n  evaluation_interval: .nan\n", "alerting.evaluation_interval"),
    ],
)
def test_run_config_infinite_duration(
    setting: str, field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An infinite or NaN duration (YAML ``.inf``, ``.nan``) is a config error naming the
    setting (exit 2). Before: ``scrape.interval_seconds: .inf`` started a sidecar that scraped
    once and never again, and an infinite shutdown timeout was accepted."""
    cfg = tmp_path / "specwatch.yaml"
    cfg.write_text(RUN_TARGET + setting, encoding="utf-8")
    assert cli_main(["run", "--config", str(cfg), "--port", "0"]) == 2
    err = _one_line(capsys)
    assert f"config error: {field}: Input should be a finite number" in err


def test_paired_test_refuses_a_device(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``paired-test /dev/zero good.jsonl``: exit 2 at once with "is not a regular file" (before:
    it read without end, memory growing, then a MemoryError traceback and exit 0)."""
    good = tmp_path / "good.jsonl"
    good.write_text('{"id": 1, "correct": 1}\n', encoding="utf-8")
    assert cli_main(["paired-test", "/dev/zero", str(good)]) == 2
    err = _one_line(capsys)
    assert err == "specwatch paired-test: /dev/zero: is not a regular file\n"


def test_paired_test_line_too_long(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A row longer than the line limit (here lowered to 1,000 bytes; the third line has
    5,000) is refused at file:line (exit 2) without reading the rest of the file."""
    import specwatch.tools.offline.paired_test as paired_test

    monkeypatch.setattr(paired_test, "MAX_LINE_BYTES", 1000)
    base = tmp_path / "base.jsonl"
    cand = tmp_path / "cand.jsonl"
    base.write_text('{"id": 1, "correct": 1}\n', encoding="utf-8")
    cand.write_text('{"id": 1, "correct": 1}\n\n' + "x" * 5000 + "\n", encoding="utf-8")
    assert cli_main(["paired-test", str(base), str(cand)]) == 2
    err = _one_line(capsys)
    assert err == f"specwatch paired-test: {cand}:3: line longer than 1000 bytes\n"


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["run", "--config", "/dev/zero"],
            "specwatch run: config file /dev/zero: larger than 1048576 bytes\n",
        ),
        (["analyze", "/dev/zero"], "specwatch analyze: /dev/zero: larger than 67108864 bytes\n"),
        (["advise", "/dev/zero"], "specwatch advise: /dev/zero: larger than 67108864 bytes\n"),
        (
            ["bench-result", "/dev/zero"],
            "specwatch bench-result: /dev/zero: cannot read: larger than 67108864 bytes\n",
        ),
    ],
)
def test_endless_device_as_input_file(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``/dev/zero`` (or any endless file) given as a config or saved page: refused at the
    size limit (1 MiB for settings, 64 MiB for pages and result files) with exit 2, instead
    of reading until the memory runs out and the kernel kills the process."""
    assert cli_main(argv) == 2
    assert _one_line(capsys) == expected
