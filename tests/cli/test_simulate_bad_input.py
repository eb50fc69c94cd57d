"""``specwatch simulate`` with bad flags: exit code 2 and one line, never a traceback.

Before: ``--vocab-size 1`` died in numpy ("negative dimensions are not allowed", exit 1),
``--port 99999`` died with an ``OverflowError`` traceback (exit 1), and ``--time-scale nan`` or a
negative ``--draft-noise`` started a server.
"""

from __future__ import annotations

import pytest

from specwatch.__main__ import main as cli_main


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--vocab-size", "1"], "--vocab-size must be >= 32"),
        (["--time-scale", "nan"], "--time-scale must be a finite number >= 0, not nan"),
        (["--time-scale", "-1"], "--time-scale must be a finite number >= 0, not -1.0"),
        (["--draft-noise", "-0.5"], "--draft-noise must be a finite number >= 0, not -0.5"),
        (["--target-sharpness", "inf"], "--target-sharpness must be a finite number >= 0, not inf"),
        (["--step-time-base-ms", "-3"], "--step-time-base-ms must be a finite number >= 0"),
        (["--port", "99999"], "cannot listen on 127.0.0.1:99999"),
        (["--fly-entropy-threshold", "nan"], "--fly-entropy-threshold must be a number, not nan"),
        (["--faults", "{"], "--faults: invalid JSON: Expecting property name"),
        (["--faults", "[" * 5000 + "]" * 5000], "--faults: invalid JSON: nested too deep"),
        (["--faults", "[1]"], "--faults must be a JSON object"),
    ],
)
def test_bad_flag_is_exit_2_one_line(
    capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    """Each bad simulate flag exits 2 with one line on stderr and nothing on stdout."""
    capsys.readouterr()
    rc = cli_main(["simulate", "--host", "127.0.0.1", "--port", "0", *flags])
    out, err = capsys.readouterr()
    assert rc == 2
    assert out == ""
    assert err.startswith("specwatch simulate: ")
    assert message in err
    assert err.count("\n") == 1
