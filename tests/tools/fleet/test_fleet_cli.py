"""``specwatch fleet`` when Prometheus cannot answer, and on bad flags (the real-Prometheus run
is tests/e2e/test_fleet_prometheus.py)."""

from __future__ import annotations

import pytest

from specwatch.__main__ import main
from tests.fakes import free_port


def test_unreachable_prometheus_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing listens on the port: one line naming the reason (connect), exit 1."""
    url = f"http://127.0.0.1:{free_port()}"
    rc = main(["fleet", "--prometheus-url", url, "--timeout", "5s"])
    err = capsys.readouterr().err
    assert rc == 1
    assert err.startswith(f"specwatch fleet: prometheus query failed: connect: {url}/api/v1/query")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--alpha", "0.7"], "--alpha must be in (0, 0.5)"),
        (["--margin", "1.5"], "--margin must be in [0, 1)"),
        (["--listen", "nowhere"], "--listen: need HOST:PORT, got 'nowhere'"),
        (["--interval", "soon"], "soon"),
    ],
)
def test_bad_flags_exit_2(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad flag is one line on stderr and exit 2, before any query."""
    rc = main(["fleet", "--prometheus-url", "http://127.0.0.1:1", *flags])
    assert rc == 2
    assert message in capsys.readouterr().err
