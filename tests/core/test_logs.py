"""Structured log lines: JSON objects and plain key=value lines."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from specwatch.core.logs import log_event, setup_logging


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

    def test_plain_line(self) -> None:
        """The plain format is one line: level, logger, event, key=value."""
        stream = io.StringIO()
        setup_logging("DEBUG", "plain", stream)
        log_event(logging.getLogger("specwatch.test"), logging.INFO, "scrape", target="fly")
        assert stream.getvalue().rstrip().endswith("info specwatch.test scrape target=fly")
