"""Cold parse (shape memo, seeded shapes and TYPE lines) against prometheus_client's full parse.

References: ``parse_page`` with the fast path off (``_VALUE_PARSER`` None: every kept line in one
``text_string_to_metric_families`` call, the path without any memo), and a reading assembled
from prometheus_client's parse of the *whole* page. Every check runs cold as a fresh process
(shapes of vLLM's pages seeded), cold without seeds, and warm (the same page again).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from specwatch.observe import parse as parse_mod
from specwatch.observe.parse import ParseError, parse_page
from specwatch.observe.prefilter import NAMES_TEXT
from specwatch.observe.values import PageReading

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
CAPTURES = sorted(p.name for p in (FIXTURES / "vllm-metrics").iterdir() if p.suffix == ".txt")
#: Captures prometheus_client parses whole (01 is a query-result table, not exposition text;
#: 04 has a malformed line in a family specwatch does not read).
WHOLE = [n for n in CAPTURES if not n.startswith(("01-", "04-"))]
REAL = (FIXTURES / "vllm-metrics/real-cpu-draft-model.txt").read_text(encoding="utf-8")


@pytest.fixture(autouse=True)
def _fresh_memo() -> Iterator[None]:
    parse_mod.clear_memo()
    yield
    parse_mod.clear_memo()


def _capture(name: str) -> str:
    return (FIXTURES / "vllm-metrics" / name).read_text(encoding="utf-8")


def _outcome(fn: Callable[[], PageReading]) -> PageReading | tuple[str, int]:
    """The reading, or (message, line) of the ParseError."""
    try:
        return fn()
    except ParseError as exc:
        return (exc.message, exc.line)


def reference(text: str, content_type: str = "text/plain") -> PageReading | tuple[str, int]:
    """``parse_page`` with the fast path off: all kept lines parsed in one library call."""
    saved = parse_mod._VALUE_PARSER
    parse_mod._VALUE_PARSER = None
    try:
        return _outcome(lambda: parse_page(text, content_type=content_type))
    finally:
        parse_mod._VALUE_PARSER = saved


def whole_page_reading(text: str, monkeypatch: pytest.MonkeyPatch) -> PageReading:
    """The reading assembled from prometheus_client's parse of the whole page (no pre-filter),
    keeping the samples specwatch reads in the text format."""

    def records(body: str) -> list[tuple[parse_mod._Series, float]]:
        out = []
        for metric in text_string_to_metric_families(body):
            for s in metric.samples:
                series = parse_mod._series(s.name, s.labels)
                if series is not None and s.name in NAMES_TEXT:
                    out.append((series, s.value))
        return out

    with monkeypatch.context() as m:
        m.setattr(parse_mod, "_records_text", records)
        return parse_page(text)


def _runs(text: str, content_type: str = "text/plain") -> dict[str, object]:
    """Outcome cold (seeded), cold without seeds, and warm (the same page parsed again)."""
    parse_mod.clear_memo()
    seeded = _outcome(lambda: parse_page(text, content_type=content_type))
    parse_mod.clear_memo(seed=False)
    unseeded = _outcome(lambda: parse_page(text, content_type=content_type))
    warm = _outcome(lambda: parse_page(text, content_type=content_type))
    return {"cold": seeded, "cold unseeded": unseeded, "warm": warm}


def _same(a: object, b: object) -> bool:
    """Equality of readings where NaN equals NaN (readings never hold NaN; kept for safety)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


@pytest.mark.parametrize("name", CAPTURES)
def test_every_capture_same_as_full_parse_path(name: str) -> None:
    """Every capture: the same reading (or the same error) as the path without memo."""
    text = _capture(name)
    expected = reference(text)
    for kind, got in _runs(text).items():
        assert _same(got, expected), (name, kind)


@pytest.mark.parametrize("name", WHOLE)
def test_every_capture_same_as_whole_page_parse(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Captures the library parses whole: the same reading as from the whole-page parse."""
    text = _capture(name)
    expected = whole_page_reading(text, monkeypatch)
    for kind, got in _runs(text).items():
        assert got == expected, (name, kind)


def test_real_capture_values() -> None:
    """Values read off the real capture by hand (engine 0 of model ``tiny``): drafts 2603,
    draft tokens 10412, the ITL ``+Inf`` bucket 2603."""
    eng = parse_page(REAL).engines[("tiny", "0")]
    assert eng.counters["drafts"] == 2603.0
    assert eng.counters["draft_tokens"] == 10412.0
    assert eng.histograms["itl"].buckets[-1] == (math.inf, 2603.0)


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record the sample lines handed to prometheus_client's text parser."""
    seen: list[str] = []

    def spy(text: str) -> Iterator[Metric]:
        seen.extend(ln for ln in text.split("\n") if ln and not ln.startswith("#"))
        return iter(list(text_string_to_metric_families(text)))

    monkeypatch.setattr(parse_mod, "text_string_to_metric_families", spy)
    return seen


def test_cold_real_capture_parses_no_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fresh process: every vLLM series of the real capture has a seeded shape and the
    unlabelled ``process_start_time_seconds`` a seeded name, so no line goes to the library
    parser; the reading is the whole parse's."""
    want = reference(REAL, "text/plain")
    parse_mod.clear_memo()
    seen = _spy(monkeypatch)
    assert parse_page(REAL) == want
    assert seen == []


def test_unseeded_real_capture_parses_one_line_per_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without seeds: one line per shape goes to the library parser, 20 on the real capture
    (counted by hand): ``process_start_time_seconds``; 14 series labelled ``engine,
    model_name`` (drafts, draft tokens, accepted tokens, running, waiting, KV cache usage,
    preemptions, prompt and generation tokens, ``iteration_tokens_total_count``, the TTFT and
    ITL ``_sum`` and ``_count``); the per-position, waiting-by-reason and finished-reason
    counters; the TTFT and ITL buckets."""
    parse_mod.clear_memo(seed=False)
    seen = _spy(monkeypatch)
    parse_page(REAL)
    names = [ln.split("{")[0].split(" ")[0] for ln in seen]
    # 20, and the prompt tokens by source, the prefix-cache queries and hits and the
    # prompt-length histogram's _bucket, _sum and _count
    assert len(names) == len(set(names)) == 26
    assert "vllm:time_to_first_token_seconds_bucket" in names
    assert "vllm:spec_decode_num_accepted_tokens_per_pos_total" in names


TRICKY = """\
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="a,b=\\"c\\"}"} 5
vllm:spec_decode_num_drafts_total{engine="1",model_name="a,b=\\"c\\"}"} 6
vllm:spec_decode_num_drafts_total{engine="0",model_name="x,le=\\"1\\""} 7
vllm:spec_decode_num_drafts_total{engine="2",model_name="}{,="} 8
vllm:spec_decode_num_drafts_total{engine="3",model_name="}{,="} 9
vllm:spec_decode_num_drafts_total{engine = "4", model_name = "sp aced"} 10
vllm:spec_decode_num_drafts_total{engine = "5", model_name = "sp aced"} 11
vllm:spec_decode_num_drafts_total{model_name="m",engine="6"} 12
vllm:spec_decode_num_drafts_total{model_name="m",engine="7",} 13
vllm:spec_decode_num_drafts_total{engine="8",model_name="t"} 14 1700000000000
vllm:spec_decode_num_drafts_total{engine="9",model_name="t"} 15 1700000000000
vllm:spec_decode_num_drafts_total{engine="10",model_name=""} 16
vllm:spec_decode_num_drafts_total {engine="11",model_name="s"} 17
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",engine="0",model_name="q"} 1
vllm:time_to_first_token_seconds_bucket{le="+Inf",engine="0",model_name="q"} 2
vllm:time_to_first_token_seconds_bucket{engine="1",le="0.1",model_name="q",extra="z"} 3
vllm:time_to_first_token_seconds_bucket{engine="1",le="+Inf",model_name="q",extra="y"} 4
"""


def test_tricky_labels_same_as_full_parse_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Escaped quotes, separators inside values, spaces around ``=``, other label orders,
    trailing commas, timestamps, empty values, a blank before ``{`` and extra labels: the same
    reading as the path without memo and as the whole-page parse, cold, unseeded and warm."""
    expected = reference(TRICKY)
    assert isinstance(expected, PageReading)
    assert expected == whole_page_reading(TRICKY, monkeypatch)
    for kind, got in _runs(TRICKY).items():
        assert got == expected, kind
    # by hand: engine label values and the one drafts counter of each
    assert expected.engines[('a,b="c"}', "1")].counters["drafts"] == 6
    assert expected.engines[('x,le="1"', "0")].counters["drafts"] == 7
    assert expected.engines[("}{,=", "3")].counters["drafts"] == 9
    assert expected.engines[("sp aced", "5")].counters["drafts"] == 11
    assert expected.engines[("m", "7")].counters["drafts"] == 13
    assert expected.engines[("t", "9")].counters["drafts"] == 15
    assert expected.engines[("", "10")].counters["drafts"] == 16
    assert expected.engines[("s", "11")].counters["drafts"] == 17
    assert expected.engines[("q", "0")].histograms["ttft"].buckets == ((0.1, 1.0), (math.inf, 2.0))
    assert expected.engines[("q", "1")].histograms["ttft"].buckets == ((0.1, 3.0), (math.inf, 4.0))


def _malformed() -> list[tuple[str, str]]:
    """(label, page) pairs the library rejects: bad values on a line whose shape is seeded, on
    the first and on a later line of a shape new to the page, broken labels, the malformed C11
    case, a query-result table, a truncated body."""
    lines = REAL.split("\n")
    bucket = next(i for i, ln in enumerate(lines) if ln.startswith("vllm:inter_token_latency_s"))
    drafts = next(i for i, ln in enumerate(lines) if ln.startswith("vllm:spec_decode_num_drafts_t"))
    out: list[tuple[str, str]] = []
    for bad in ("12x", "1_000", "", "1 2 3 4x", "NaNx"):
        for label, i in (("bucket", bucket), ("later bucket", bucket + 3), ("drafts", drafts)):
            changed = list(lines)
            changed[i] = changed[i].rsplit(" ", 1)[0] + (f" {bad}" if bad else "")
            out.append((f"{label} value {bad!r}", "\n".join(changed)))
    new_shape = TRICKY.replace("} 15 1700000000000", "} 1x5")
    out.append(("bad value on a later line of a new shape", new_shape))
    for label, broken in (
        ("unescaped quote", '{engine="0",model_name="a"b"}'),
        ("duplicate label", '{engine="0",engine="1",model_name="a"}'),
        ("missing quote", '{engine=0,model_name="a"}'),
        ("double comma", '{engine="0",,model_name="a"}'),
        ("brace after value", '{engine="0",model_name="a"} 5}'),
        ("name twice", '{engine="0",__name__="x",model_name="a"}'),
    ):
        changed = list(lines)
        head, _, value = changed[drafts].rpartition(" ")
        changed[drafts] = (
            head.split("{")[0] + broken + (" " + value if "} 5}" not in broken else "")
        )
        out.append((label, "\n".join(changed)))
    out.append(("C11", (FIXTURES / "cases/C11_escaped_labels_malformed.prom").read_text()))
    out.append(("01", _capture("01-spec-decode-dp8-prometheus-query.txt")))
    out.append(("truncated", REAL[: REAL.index("} ") + 3]))
    return out


@pytest.mark.parametrize(("label", "text"), _malformed(), ids=[lb for lb, _ in _malformed()])
def test_malformed_same_error_as_full_parse_path(label: str, text: str) -> None:
    """Every malformed page: the same ParseError (message and line) as the path without memo,
    cold, unseeded and after a valid page taught the memos every series of the real capture."""
    expected = reference(text)
    assert isinstance(expected, tuple), label  # the reference rejects the page
    for kind, got in _runs(text).items():
        assert got == expected, (label, kind)
    parse_mod.clear_memo()
    parse_page(REAL)
    assert _outcome(lambda: parse_page(text)) == expected, label


def test_openmetrics_unchanged() -> None:
    """The OpenMetrics path is untouched: same reading as the path without memo."""
    text = REAL.replace("_total{", "_total{") + "# EOF\n"
    ct = "application/openmetrics-text; version=1.0.0"
    expected = reference(text, ct)
    for kind, got in _runs(text, ct).items():
        assert got == expected, kind


def test_seeded_shapes_and_type_lines() -> None:
    """At import (and after ``clear_memo()``) the shapes of vLLM's pages are known, one per
    allow-listed text-format sample except the unlabelled ``process_start_time_seconds``
    (31 = 32 sample names kept in the text format minus 1: the 18 before, V0's emitted-tokens
    and efficiency, the ``_sum``/``_count`` of ITL, its old name and TTFT, the prompt tokens by
    source, the prefix-cache queries and hits, and the prompt-length histogram's three), and
    the 24 canonical TYPE lines (18, V0's two families, and the four of prompt tokens by
    source, prefix-cache queries and hits and prompt lengths)."""
    assert len(NAMES_TEXT) == 32
    assert len(parse_mod._SHAPE_MEMO) == 31
    assert parse_mod._SHAPE_MEMO[
        'vllm:request_success_total{engine="",finished_reason="",model_name=""}'
    ] == (
        "vllm:request_success_total",
        ("engine", "finished_reason", "model_name"),
    )
    assert "# TYPE vllm:spec_decode_num_drafts_total counter" in parse_mod._TYPE_KNOWN
    assert len(parse_mod._TYPE_KNOWN) == 24
    parse_mod.clear_memo(seed=False)
    assert not parse_mod._SHAPE_MEMO


def test_shape_split() -> None:
    """``_shape``: quoted values emptied, values in order; a backslash or an odd number of
    quotes gives no shape."""
    assert parse_mod._shape('n{a="1",b="x y"}') == ('n{a="",b=""}', ["1", "x y"])
    assert parse_mod._shape('n{a="1\\"",b="2"}') is None
    assert parse_mod._shape('n{a="1}') is None
    assert parse_mod._shape("n{}") == ("n{}", [])
