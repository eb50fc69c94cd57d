"""Hostile answers from a server on 127.0.0.1 and other bad input met by the commands that read
URLs (``fleet``, ``doctor``): each ends in one clear stderr line naming the URL, no traceback,
and every JSON log line stays strict JSON.
"""

from __future__ import annotations

import json

import pytest

from specwatch.__main__ import main as cli_main
from tests.fakes.http import canned_json_server


def _vector(value: str, metric: dict[str, str]) -> bytes:
    result = [{"metric": metric, "value": [0, value]}]
    doc = {"status": "success", "data": {"resultType": "vector", "result": result}}
    return json.dumps(doc).encode()


@pytest.mark.parametrize("command", ["fleet", "doctor"])
def test_prometheus_answer_not_utf8(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A "Prometheus" answering ``\\xff\\x00garbage`` as application/json: one line saying
    ``decode: URL: not UTF-8`` (as for an answer that is not JSON), no UnicodeDecodeError
    traceback; exit 1, the code both commands give when Prometheus cannot be queried."""
    with canned_json_server(b"\xff\x00garbage") as url:
        rc = cli_main([command, "--prometheus-url", url])
    assert rc == 1
    out = capsys.readouterr()
    text = out.err if command == "fleet" else out.out + out.err
    assert "Traceback" not in text
    assert f"decode: {url}/api/v1/" in text
    assert ": not UTF-8" in text


def test_doctor_targets_answer_of_the_wrong_shape(capsys: pytest.CaptureFixture[str]) -> None:
    """A Prometheus whose ``/api/v1/targets`` answer is valid API JSON but a vector, not the
    targets shape: doctor says the answer is malformed, naming the URL, and invents no target
    (before: "vLLM target (job ) has no role label")."""
    with canned_json_server(_vector("1", {})) as url:
        rc = cli_main(["doctor", "--prometheus-url", url])
    assert rc == 1
    out = capsys.readouterr()
    text = out.out + out.err
    assert f"{url}/api/v1/targets: malformed answer" in text
    assert "has no role label" not in text
    assert "Traceback" not in text


def test_fleet_logs_a_non_numeric_value_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    """A pairs series whose value is ``"bad"``: fleet skips it and its JSON log line is strict
    JSON (no bare ``NaN``) carrying the text the server sent."""
    body = _vector("bad", {"model_name": "m", "outcome": "both_correct", "category": "c"})
    with canned_json_server(body) as url:
        rc = cli_main(["fleet", "--prometheus-url", url, "--log-format", "json"])
    assert rc == 0
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "series skipped" in ln]
    assert lines
    for line in lines:
        assert "NaN" not in line
        rec = json.loads(line, parse_constant=lambda c: pytest.fail(f"non-strict {c}"))
        assert rec["value"] == "bad"
