"""``specwatch analyze`` with hostile files and arguments: exit code 2 and one line, or a warning.

Before: an empty file printed ``{"models": {}}`` with exit 0 (and ``--format table`` crashed with
a KeyError traceback, exit 1); ``--interval 0`` or a negative one turned every value (α too)
into ``null`` with exit 0; ``--interval nan`` was taken; files in the wrong order were silently
read as a restart.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from specwatch.__main__ import main as cli_main

LBL = 'engine="0",model_name="m"'


def page(start: float, drafts: int, draft_tokens: int, accepted: int) -> str:
    return (
        f"process_start_time_seconds {start}\n"
        f"vllm:spec_decode_num_drafts_total{{{LBL}}} {drafts}\n"
        f"vllm:spec_decode_num_draft_tokens_total{{{LBL}}} {draft_tokens}\n"
        f"vllm:spec_decode_num_accepted_tokens_total{{{LBL}}} {accepted}\n"
    )


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = cli_main(["analyze", *args])
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("fmt", ["json", "table"])
@pytest.mark.parametrize(
    "text", ["", "\n", "# HELP x y\nother_metric 1\n", "process_start_time_seconds 5\n"]
)
def test_file_without_vllm_series_is_exit_2_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, fmt: str
) -> None:
    """A file with no vLLM series exits 2 with one line on stderr naming the file and nothing
    on stdout."""
    f = tmp_path / "empty.prom"
    f.write_text(text)
    rc, out, err = _run([str(f), "--format", fmt], capsys)
    assert (rc, out) == (2, "")
    assert err == (
        f"specwatch analyze: {f} has neither vllm:* nor sglang:* series"
        " (not a vLLM or SGLang /metrics body?)\n"
    )


@pytest.mark.parametrize("interval", ["0", "-5", "nan", "inf", "-inf"])
def test_interval_not_positive_finite_is_exit_2_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], interval: str
) -> None:
    """An --interval that is not a positive finite number exits 2 with one line."""
    a, b = tmp_path / "a.prom", tmp_path / "b.prom"
    a.write_text(page(100.0, 10, 40, 20))
    b.write_text(page(100.0, 20, 80, 30))
    rc, out, err = _run([str(a), str(b), f"--interval={interval}"], capsys)
    assert (rc, out) == (2, "")
    assert err.startswith("specwatch analyze: --interval must be a positive number")
    assert err.count("\n") == 1


def test_swapped_files_warn_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Files given newer-first warn in one line; the right order prints no warning."""
    older, newer = tmp_path / "older.prom", tmp_path / "newer.prom"
    older.write_text(page(100.0, 10, 40, 20))
    newer.write_text(page(100.0, 20, 80, 30))
    rc, _, err = _run([str(newer), str(older)], capsys)
    assert rc == 0
    assert err.count("\n") == 1
    assert "is BEFORE newer than AFTER?" in err
    rc, _, err = _run([str(older), str(newer)], capsys)
    assert (rc, err) == (0, "")


def test_restart_with_new_process_start_does_not_warn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A restart (new process start time) between files counts from the restart, without a
    warning."""
    a, b = tmp_path / "a.prom", tmp_path / "b.prom"
    a.write_text(page(100.0, 20, 80, 30))
    b.write_text(page(200.0, 4, 16, 8))
    rc, out, err = _run([str(a), str(b)], capsys)
    assert (rc, err) == (0, "")
    assert '"acceptance_rate": 0.5' in out  # after the restart: 8 / 16


@pytest.mark.parametrize("kind", ["directory", "missing", "binary"])
def test_unreadable_paths_are_exit_2_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """A missing, directory or binary path exits 2 with one line naming it."""
    target = tmp_path / "x"
    if kind == "directory":
        target.mkdir()
    elif kind == "binary":
        target.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe\x00\x01")
    rc, out, err = _run([str(target)], capsys)
    assert (rc, out) == (2, "")
    assert err.startswith(f"specwatch analyze: {target}")
    assert err.count("\n") == 1
