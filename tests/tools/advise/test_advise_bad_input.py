"""``specwatch advise`` on pages it cannot use: one stderr line naming the file (or the URL it
was given instead of a file), exit 2, nothing on stdout."""

from __future__ import annotations

from pathlib import Path

import pytest

from specwatch.__main__ import main as cli_main

NAN_PAGE = (
    "# TYPE vllm:spec_decode_num_drafts counter\n"
    'vllm:spec_decode_num_drafts_total{model_name="m",engine="0"} NaN\n'
    'vllm:spec_decode_num_draft_tokens_total{model_name="m",engine="0"} NaN\n'
)


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    capsys.readouterr()
    assert cli_main(["advise", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1, err
    return err


def test_page_without_engine_series_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An HTML file given as BEFORE: the line names that file, not "BEFORE"."""
    before, after = tmp_path / "ph.html", tmp_path / "p2.txt"
    before.write_text("<html><body>hi</body></html>\n")
    after.write_text("x 1\n")
    err = _run(capsys, str(before), str(after))
    assert err.startswith(f"specwatch advise: {before} has neither vllm:* nor sglang:* series")


def test_page_whose_engine_samples_are_all_nan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A page whose vllm counters are all NaN: the line names the file and says its 2 samples
    were skipped for a value no server writes (not "has neither vllm:* ...")."""
    page = tmp_path / "nan.prom"
    page.write_text(NAN_PAGE)
    err = _run(capsys, str(page))
    assert err.startswith(
        f"specwatch advise: {page}: every vllm:*/sglang:* sample was skipped (2 with a value "
        "no server writes, e.g. vllm:spec_decode_num_drafts_total{"
    )


def test_url_instead_of_a_saved_file(capsys: pytest.CaptureFixture[str]) -> None:
    """A URL as BEFORE keeps its ``//`` in the message, which says advise reads saved files
    and how to save one (before: "http:/127.0.0.1:1/metrics: No such file or directory")."""
    url = "http://127.0.0.1:1/metrics"
    err = _run(capsys, url)
    assert err.startswith(f"specwatch advise: {url}: a URL; this command reads saved /metrics")
    assert f"curl -s {url} > page.txt" in err
