"""Structured log lines: JSON objects and plain key=value lines."""

from __future__ import annotations

import ast
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import specwatch
from specwatch.alerts.alertmanager import AlertSender, Delivery
from specwatch.alerts.settings import AlertingSettings
from specwatch.core.listen import json_too_deep
from specwatch.core.logs import RateLimitedLog, log_event, setup_logging
from specwatch.shadow.ingest.canary import parse_lines
from specwatch.shadow.pipeline import ShadowPipeline
from specwatch.shadow.settings import ArmEndpoint, ShadowSettings
from specwatch.shadow.values import ReplayPair
from tests.fakes import FakeMonotonicClock, PairSinkFn, free_port


@pytest.fixture(autouse=True)
def _restore_logger() -> Iterator[None]:
    logger = logging.getLogger("specwatch")
    handlers, level = list(logger.handlers), logger.level
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)


class TestLogs:
    def test_json_line(self) -> None:
        """One JSON object per event with the event name and its fields."""
        stream = io.StringIO()
        setup_logging("INFO", "json", stream)
        log_event(
            logging.getLogger("specwatch.test"),
            logging.WARNING,
            "scrape failed",
            target="fly",
            reason="timeout",
        )
        log_event(logging.getLogger("specwatch.test"), logging.DEBUG, "hidden")
        lines = stream.getvalue().splitlines()
        assert len(lines) == 1
        doc = json.loads(lines[0])
        assert doc["event"] == "scrape failed"
        assert (doc["level"], doc["target"], doc["reason"]) == ("warning", "fly", "timeout")

    def test_json_line_has_no_nan_or_infinity(self) -> None:
        """Non-finite floats, also nested, are written as Prometheus spells them ("NaN",
        "+Inf", "-Inf"): the line parses as strict JSON."""
        stream = io.StringIO()
        setup_logging("INFO", "json", stream)
        nan, inf = float("nan"), float("inf")
        log_event(logging.getLogger("specwatch.t"), logging.INFO, "x", v=nan, w={"a": [inf, -inf]})
        doc = json.loads(stream.getvalue(), parse_constant=lambda c: pytest.fail(c))
        assert (doc["v"], doc["w"]) == ("NaN", {"a": ["+Inf", "-Inf"]})

    def test_plain_line(self) -> None:
        """The plain format is one line: level, logger, event, key=value."""
        stream = io.StringIO()
        setup_logging("DEBUG", "plain", stream)
        log_event(logging.getLogger("specwatch.test"), logging.INFO, "scrape", target="fly")
        assert stream.getvalue().rstrip().endswith("info specwatch.test scrape target=fly")

    def test_default_stream_is_stderr(self, capsys: pytest.CaptureFixture[str]) -> None:
        """Without a stream, lines go to stderr and stdout stays empty (command output)."""
        setup_logging("INFO", "plain")
        log_event(logging.getLogger("specwatch.test"), logging.INFO, "hello", n=1)
        out, err = capsys.readouterr()
        assert out == ""
        assert err.rstrip().endswith("info specwatch.test hello n=1")

    def test_extra_attributes_are_not_dropped(self) -> None:
        """A field passed with the standard library's ``extra=`` still reaches both formats."""
        stream = io.StringIO()
        setup_logging("INFO", "json", stream)
        logger = logging.getLogger("specwatch.test")
        logger.warning("legacy", extra={"url": "http://am:9093", "error": "refused"})
        doc = json.loads(stream.getvalue())
        assert (doc["event"], doc["url"], doc["error"]) == ("legacy", "http://am:9093", "refused")
        stream = io.StringIO()
        setup_logging("INFO", "plain", stream)
        logger.warning("legacy", extra={"port": 8001})
        assert stream.getvalue().rstrip().endswith("warning specwatch.test legacy port=8001")

    def test_exc_info_appends_the_traceback(self) -> None:
        """``exc_info=True`` adds the exception being handled under ``exc``; fields stay."""
        stream = io.StringIO()
        setup_logging("INFO", "json", stream)
        try:
            raise ValueError("boom")
        except ValueError:
            log_event(
                logging.getLogger("specwatch.test"),
                logging.ERROR,
                "sink failed",
                exc_info=True,
                h="x",
            )
        doc = json.loads(stream.getvalue())
        assert (doc["event"], doc["level"], doc["h"]) == ("sink failed", "error", "x")
        assert doc["exc"].splitlines()[-1] == "ValueError: boom"


_LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "log"}


def test_no_logger_call_passes_extra() -> None:
    """``log_event`` is the one logging call: no ``<logger>.<level>(..., extra=...)`` anywhere
    in specwatch/ except inside ``log_event`` itself."""
    root = Path(specwatch.__file__).resolve().parent
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if path == root / "core" / "logs.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in _LOG_METHODS
                and any(k.arg == "extra" for k in node.keywords)
            ):
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert found == []


def _json_lines(stream: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


async def test_alertmanager_send_failure_line_has_url_and_error() -> None:
    """A send to a closed port logs ``alertmanager send failed`` with the (redacted) endpoint
    and the connection error."""
    port = free_port()
    url = f"http://user:pw@127.0.0.1:{port}"
    settings = AlertingSettings(urls=[url], max_attempts=1, timeout=5.0)
    stream = io.StringIO()
    setup_logging("INFO", "json", stream)

    async def no_sleep(_: float) -> None:
        return None

    async with aiohttp.ClientSession() as session:
        sender = AlertSender(settings, session, sleep=no_sleep)
        sender.enqueue([Delivery({"alertname": "A"}, {"summary": "s"}, 100.0, None)])
        await sender.flush(200.0)
    (doc,) = [d for d in _json_lines(stream) if d["event"] == "alertmanager send failed"]
    assert doc["url"] == f"http://user:**********@127.0.0.1:{port}/api/v2/alerts"
    assert f"127.0.0.1:{port}" in doc["error"]
    assert sender.errors["connect"] == 1


async def test_proxy_listening_line_has_port() -> None:
    """Starting the shadow proxy on port 0 logs the port the OS gave it."""
    dead = f"http://127.0.0.1:{free_port()}"
    settings = ShadowSettings(
        enabled=True,
        modes=("proxy",),
        standard=ArmEndpoint(url=dead),
        fly=ArmEndpoint(url=dead),
        proxy_listen_host="127.0.0.1",
        proxy_listen_port=0,
        proxy_upstream=dead,
    )
    stream = io.StringIO()
    setup_logging("INFO", "json", stream)

    async def sink(_: ReplayPair) -> None:
        return None

    async with aiohttp.ClientSession() as session:
        pipe = ShadowPipeline.from_settings(settings, session=session, sink=PairSinkFn(sink))
        await pipe.start()
        try:
            assert pipe.proxy is not None
            port = pipe.proxy.port
        finally:
            await pipe.stop()
    (doc,) = [d for d in _json_lines(stream) if d["event"] == "shadow proxy listening"]
    assert port is not None
    assert port > 0
    assert doc["port"] == port


def test_canary_bad_line_has_file_line_and_reason() -> None:
    """A malformed canary line logs the file, the 1-based line number and the reason."""
    stream = io.StringIO()
    setup_logging("INFO", "json", stream)
    lines = [json.dumps({"id": "a", "prompt": "p", "gold": "g"}), "{not json"]
    parse_lines(lines, source="set.jsonl")
    (doc,) = [d for d in _json_lines(stream) if d["event"] == "canary bad line"]
    assert (doc["file"], doc["line"], doc["reason"]) == ("set.jsonl", 2, "invalid_json")


def test_rate_limited_log_counts_what_it_leaves_out() -> None:
    """Burst 10 a minute per (event, reason): 25 lines in one minute write 10 and leave out 15;
    the first line of the next minute carries ``suppressed=15``; another reason has its own
    budget."""
    stream = io.StringIO()
    setup_logging("INFO", "json", stream)
    mono_clock = FakeMonotonicClock()
    limited = RateLimitedLog(logging.getLogger("specwatch.test"), mono_clock=mono_clock)
    written = [limited.warning("bad request", reason="invalid_json", n=i) for i in range(25)]
    assert written == [True] * 10 + [False] * 15
    assert limited.warning("bad request", reason="too_deep")
    mono_clock.advance(60)
    assert limited.warning("bad request", reason="invalid_json", n=25)
    docs = [d for d in _json_lines(stream) if d["event"] == "bad request"]
    assert len(docs) == 12
    assert "suppressed" not in docs[9]
    assert (docs[-1]["n"], docs[-1]["suppressed"]) == (25, 15)
    assert limited.suppressed_total == 15


@pytest.mark.parametrize(
    ("text", "deep"),
    [
        ("[" * 64 + "]" * 64, False),
        ("[" * 65 + "]" * 65, True),
        ('{"a": "' + "[" * 500 + '"}', False),  # brackets inside a string do not nest
        ('{"a": "\\"' + "{" * 500 + '"}', False),  # nor after an escaped quote
        ('{"a":' * 65 + "1" + "}" * 65, True),
    ],
)
def test_json_too_deep(text: str, deep: bool) -> None:
    """Nesting is counted over arrays and objects, outside strings; the limit is inclusive."""
    assert json_too_deep(text, 64) is deep
    assert json_too_deep(text.encode(), 64) is deep
