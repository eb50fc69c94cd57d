"""Pre-filter and labels memo of ``parse_page`` against independent references.

References: prometheus_client's parser run on the *whole* page (filtered afterwards by the
allow-list), and on all kept lines in one call (the path without memo). The memo keeps the
labels part of each series between scrapes, so every check runs cold (memo cleared), warm (the
same page again) and on the next scrape (every counter grown, memo from the previous page).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.observe import parse as parse_mod
from specwatch.observe.parse import ParseError, parse_page
from specwatch.observe.prefilter import NAMES_TEXT, prefilter
from tests.fixture_files import FIXTURES, body

_Rec = tuple[str, tuple[tuple[str, str], ...], float | str]

#: Text fixtures prometheus_client parses whole (04 has a malformed line in a family specwatch
#: does not read; 01 is not exposition text).
WHOLE = [
    "vllm-metrics/02-early-v1-raw-exposition.txt",
    "vllm-metrics/03-multi-api-server-engine-label.txt",
    "vllm-metrics/real-cpu-draft-model-midflight.txt",
    "vllm-metrics/real-cpu-draft-model.txt",
    "vllm-metrics/real-cpu-ngram.txt",
    "vllm-metrics/real-cpu-nospec.txt",
    "cases/C01_dp_engines.prom",
    "cases/C03_reset_a.prom",
    "cases/C03_reset_b.prom",
    "cases/C03_reset_c.prom",
    "cases/C11_escaped_labels_valid.prom",
]
KEPT_ONLY = [*WHOLE, "vllm-metrics/04-docs-example-exposition.txt"]


@pytest.fixture(autouse=True)
def _cold_memo() -> Iterator[None]:
    parse_mod._SERIES_MEMO.clear()
    parse_mod._TYPE_OK.clear()
    yield
    parse_mod._SERIES_MEMO.clear()
    parse_mod._TYPE_OK.clear()


def _norm(value: float) -> float | str:
    return "nan" if math.isnan(value) else float(value)


def reference_whole(text: str) -> list[_Rec]:
    """Allow-listed samples of the whole page parsed by prometheus_client, in page order."""
    return [
        (s.name, tuple(sorted(s.labels.items())), _norm(s.value))
        for m in text_string_to_metric_families(text)
        for s in m.samples
        if s.name in NAMES_TEXT
    ]


def reference_kept(text: str) -> list[_Rec]:
    """The kept lines parsed by prometheus_client in one call (the path without memo)."""
    return reference_whole(prefilter(text))


def ours(text: str) -> list[_Rec]:
    return [(s.ident[0], s.ident[1], _norm(v)) for s, v in parse_mod._records_text(text)]


def grown(text: str, step: float) -> str:
    """Next scrape: ``step`` added to every sample value above 1 (counters, buckets)."""
    out = []
    for line in text.split("\n"):
        if line and not line.startswith("#") and " " in line:
            head, _, value = line.rpartition(" ")
            try:
                v = float(value)
            except ValueError:
                out.append(line)
                continue
            if v > 1:
                line = f"{head} {v + step!r}"
        out.append(line)
    return "\n".join(out)


@pytest.mark.parametrize("name", WHOLE)
def test_same_records_as_whole_page_parse(name: str) -> None:
    """Cold, warm and on the next scrape: exactly the allow-listed samples of the whole page."""
    text = body(name)
    expected = reference_whole(text)
    assert ours(text) == expected  # cold
    assert ours(text) == expected  # warm: every labels part memoised
    memoised = {s.ident for s in parse_mod._SERIES_MEMO.values()}
    assert memoised == {(n, labels) for n, labels, _ in expected}  # labelled or not
    nxt = grown(text, 7.5)
    assert ours(nxt) == reference_whole(nxt)


@pytest.mark.parametrize("name", KEPT_ONLY)
def test_same_reading_as_path_without_memo(name: str) -> None:
    """The PageReading is the same cold and with the memo of the previous scrape."""
    text = body(name)
    assert ours(text) == reference_kept(text)
    nxt = grown(text, 3.0)
    cold_next = parse_page(nxt)
    parse_mod._SERIES_MEMO.clear()
    parse_mod._TYPE_OK.clear()
    parse_page(text)
    assert parse_page(nxt) == cold_next
    assert ours(nxt) == reference_kept(nxt)


def test_crlf_and_tab_separated_values() -> None:
    """CRLF line ends and a tab before the value parse as prometheus_client parses them."""
    text = body("vllm-metrics/real-cpu-draft-model.txt")
    crlf = text.replace("\n", "\r\n")
    tabbed = "\n".join(
        ln if ln.startswith("#") or " " not in ln else "\t".join(ln.rsplit(" ", 1))
        for ln in text.split("\n")
    )
    for variant in (text, crlf, tabbed, grown(crlf, 2.0), grown(tabbed, 2.0)):
        assert ours(variant) == reference_whole(variant)


def test_real_capture_values_after_growth() -> None:
    """On the real capture the next scrape reads each counter grown by the step (memo warm)."""
    text = body("vllm-metrics/real-cpu-draft-model.txt")
    key = ("tiny", "0")
    drafts = parse_page(text).engines[key].counters["drafts"]
    nxt = parse_page(grown(text, 7.5)).engines[key]
    assert nxt.counters["drafts"] == drafts + 7.5
    itl = nxt.histograms["itl"].buckets
    assert itl[-1][0] == math.inf


def _line_of(text: str, prefix: str) -> int:
    return next(n for n, ln in enumerate(text.split("\n"), start=1) if ln.startswith(prefix))


def test_malformed_value_on_memoised_series_fails_page() -> None:
    """A memoised series with a bad value still fails the whole page, naming its line."""
    text = body("vllm-metrics/real-cpu-draft-model.txt")
    parse_page(text)
    prefix = "vllm:spec_decode_num_drafts_total{"
    line = _line_of(text, prefix)
    lines = text.split("\n")
    head, _, _ = lines[line - 1].rpartition(" ")
    for bad in ("12x", "1_000", "", "1 2 3 4x"):
        lines[line - 1] = f"{head} {bad}"
        broken = "\n".join(lines)
        rejected = False
        try:
            list(text_string_to_metric_families(broken))
        except ValueError:
            rejected = True
        assert rejected, bad  # the library rejects the whole page too
        with pytest.raises(ParseError) as info:
            parse_page(broken)
        assert info.value.line == line


def test_malformed_labels_fail_after_valid_page() -> None:
    """C11: the unescaped quote fails the page (line 4) even after the valid page was read."""
    parse_page(body("cases/C11_escaped_labels_valid.prom"))
    with pytest.raises(ParseError) as info:
        parse_page(body("cases/C11_escaped_labels_malformed.prom"))
    assert info.value.line == 4


LINE = 'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"}'


def test_brace_after_labels_is_not_memoised() -> None:
    """``L 5 } 7`` is value 5, timestamp 7 ms for prometheus_client (first unquoted ``}`` ends
    the labels); the memo must not treat ``L 5 }`` as the labels part on the next scrape."""
    first = f"{LINE} 5 }} 7\n"
    second = f"{LINE} 5 }} 9\n"
    third = f"{LINE} 6\n"
    for page in (first, second, third, second):
        assert ours(page) == reference_whole(page)
    assert parse_page(second).engines[("m", "0")].counters["drafts"] == 5


def test_timestamps() -> None:
    """A timestamp after the value is ignored, as by prometheus_client; values still change."""
    pages = [f"{LINE} 5 1700000000000\n", f"{LINE} 6 1700000005000\n", f"{LINE} 7\n"]
    for page, want in zip(pages, (5, 6, 7), strict=True):
        assert ours(page) == reference_whole(page)
        assert parse_page(page).engines[("m", "0")].counters["drafts"] == want


def test_counter_type_without_total_renames_as_library_does() -> None:
    """``# TYPE vllm:num_requests_running counter`` makes prometheus_client rename the sample to
    ``..._total`` (not read): the same with and without the memo."""
    page = (
        "# TYPE vllm:num_requests_running counter\n"
        'vllm:num_requests_running{engine="0",model_name="m"} 3\n'
        f"{LINE} 5\n"
    )
    gauge = page.replace("running counter", "running gauge")
    assert parse_page(gauge).engines[("m", "0")].gauges == {"running": 3.0}
    for _ in range(2):
        assert ours(page) == reference_whole(page)
        eng = parse_page(page).engines[("m", "0")]
        assert eng.gauges == {}
        assert eng.counters == {"drafts": 5.0}


def test_duplicates_with_memo() -> None:
    """Identical copies count once and conflicting copies are skipped, on memoised series."""
    same = f"{LINE} 5\n{LINE} 5\n"
    conflict = f"{LINE} 6\n{LINE} 7\n"
    assert parse_page(same).duplicate_conflicts == 0
    assert parse_page(same).engines[("m", "0")].counters == {"drafts": 5.0}
    page = parse_page(conflict)
    assert page.duplicate_conflicts == 1
    assert ("m", "0") not in page.engines
    nan = f'{LINE} 6\nvllm:num_requests_running{{model_name="m"}} NaN\n'
    parse_page(nan)
    assert parse_page(nan).engines[("m", "0")].gauges == {}


def test_memo_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a small bound the memo never grows past it and results stay exact."""
    monkeypatch.setattr(parse_mod, "_SERIES_MEMO_MAX", 8)
    text = body("vllm-metrics/real-cpu-draft-model.txt")
    for step in (0.0, 1.0, 2.0):
        page = grown(text, step)
        assert ours(page) == reference_whole(page)
        assert len(parse_mod._SERIES_MEMO) <= 8


def test_memo_is_active_with_installed_prometheus_client() -> None:
    """The installed prometheus_client has the value parser the memo relies on (else every
    page is parsed whole: correct but slower, and the benchmark numbers would not hold)."""
    assert parse_mod._VALUE_PARSER is not None
    assert parse_mod._VALUE_PARSER(" 7 1500") == (7, 1.5)


def test_fixtures_have_allow_listed_samples() -> None:
    """The fixtures above exist and together hold many allow-listed samples (not vacuous)."""
    for name in KEPT_ONLY:
        assert Path(FIXTURES / name).is_file()
    assert sum(len(reference_kept(body(name))) for name in KEPT_ONLY) > 300


def test_without_value_parser_every_line_is_parsed_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fallback when the library's value parser is missing: same records, nothing memoised."""
    monkeypatch.setattr(parse_mod, "_VALUE_PARSER", None)
    text = body("vllm-metrics/real-cpu-draft-model.txt")
    for page in (text, grown(text, 4.0)):
        assert ours(page) == reference_whole(page)
    assert not parse_mod._SERIES_MEMO


@pytest.mark.parametrize(
    "line",
    [
        "process_start_time_seconds 1.7e+09",
        "process_start_time_seconds\t1.7e+09",
        "process_start_time_seconds  1.7e+09",
        "process_start_time_seconds 1.7e+09 1700000000000",
        "process_start_time_seconds NaN",
        "process_start_time_seconds 12x",
        "process_start_time_secondsx 3",
    ],
)
def test_unlabelled_sample_same_as_whole_page_parse(line: str) -> None:
    """A sample line without labels (its name memoised from the first page) reads, or fails,
    as the whole page's library parse does: spacing, a tab, a timestamp, NaN, a bad value,
    another name."""
    for page in (f"{LINE} 5\n{line}\n", f"{line}\n{LINE} 6\n"):
        try:
            want: object = reference_whole(page)
        except (ValueError, IndexError, KeyError, TypeError):
            want = "malformed"
        try:
            got: object = ours(page)
        except (ValueError, IndexError, KeyError, TypeError):  # ParseError is a ValueError
            got = "malformed"
        assert got == want
