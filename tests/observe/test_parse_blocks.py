"""The block-wise pre-filter keeps exactly the lines the line-by-line prefix test keeps, on real
captures, on pages that break the one-block-per-family layout, and on random shuffles."""

from __future__ import annotations

import random

import pytest

from specwatch.observe import prefilter as prefilter_mod
from specwatch.observe.parse import parse_page
from specwatch.observe.prefilter import KEEP_TEXT, kept, kept_text_lines, prefilter
from tests.fixture_files import body


@pytest.fixture
def blockwise(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every page cut into family blocks, however small (the size threshold set to 0)."""
    monkeypatch.setattr(prefilter_mod, "_BLOCKWISE_BYTES", 0)


CAPTURES = (
    "vllm-metrics/real-cpu-draft-model.txt",
    "vllm-metrics/real-cpu-draft-model-midflight.txt",
    "vllm-metrics/real-cpu-ngram.txt",
    "vllm-metrics/real-cpu-nospec.txt",
    "vllm-metrics/01-spec-decode-dp8-prometheus-query.txt",
    "vllm-metrics/02-early-v1-raw-exposition.txt",
    "vllm-metrics/03-multi-api-server-engine-label.txt",
    "vllm-metrics/04-docs-example-exposition.txt",
)


def reference(page: str) -> list[str]:
    """The prefix test applied to every line on its own (the rule of ``kept_line_numbers``)."""
    return [ln for ln in page.split("\n") if kept(ln, KEEP_TEXT, False)]


@pytest.mark.parametrize("name", CAPTURES)
def test_real_captures(name: str, blockwise: None) -> None:
    """Every real capture: the same kept lines as the line-by-line test."""
    page = body(name)
    assert kept_text_lines(page) == reference(page)


DRAFTS = 'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 7.0'
TRICKY = {
    "kept sample inside a foreign block": (
        '# TYPE python_info gauge\npython_info{x="1"} 1.0\n' + DRAFTS + "\n"
    ),
    "foreign block named by a prefix of a kept name": (
        "# TYPE vllm:spec_decode_num gauge\nvllm:spec_decode_num 1.0\n" + DRAFTS + "\n"
    ),
    "foreign block with a blank line": "# TYPE a gauge\na 1.0\n\na 2.0\n# TYPE b gauge\nb 1\n",
    "TYPE with a tab": "# TYPE\tvllm:spec_decode_num_drafts_total counter\n" + DRAFTS + "\n",
    "kept TYPE without a type": "# TYPE vllm:spec_decode_num_drafts_total\n" + DRAFTS + "\n",
    "kept TYPE then a foreign sample": (
        "# TYPE vllm:spec_decode_num_drafts_total counter\n"
        + DRAFTS
        + '\nvllm:spec_decode_num_drafts_created{engine="0"} 1.0\n'
    ),
    "sample with leading blank": "# TYPE a gauge\n a 1.0\n " + DRAFTS + "\n",
    "carriage returns": "# TYPE a gauge\r\na 1.0\r\n# TYPE b gauge\n" + DRAFTS + "\r\n",
    "kept name as the TYPE of a foreign type": "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{engine="0"} 1.0\nvllm:num_requests_running 2.0\n',
    "empty TYPE name": "# TYPE  x gauge\n" + DRAFTS + "\n",
    "no final newline": "# TYPE a gauge\na 1",
    "empty page": "",
}


@pytest.mark.parametrize("case", sorted(TRICKY))
def test_pages_that_break_the_block_layout(case: str, blockwise: None) -> None:
    """Samples outside their family's block, names that prefix kept names, blank lines, tabs,
    carriage returns: the same kept lines as the line-by-line test."""
    page = TRICKY[case]
    assert kept_text_lines(page) == reference(page)


def test_random_shuffles_of_a_real_capture(blockwise: None) -> None:
    """300 seeded shuffles of the real capture (lines moved into other blocks, duplicated,
    prefixed with a blank, TYPE lines renamed to prefixes of kept names): the same kept lines
    as the line-by-line test every time."""
    lines = body("vllm-metrics/real-cpu-draft-model.txt").split("\n")
    rng = random.Random(20261202)
    for _ in range(300):
        page = list(lines)
        for _ in range(rng.randint(1, 8)):
            i, j = rng.randrange(len(page)), rng.randrange(len(page))
            kind = rng.randrange(5)
            if kind == 0:
                page.insert(j, page.pop(i))
            elif kind == 1:
                page.insert(j, page[i])
            elif kind == 2:
                page[i] = " " + page[i]
            elif kind == 3 and page[i].startswith("# TYPE vllm:"):
                name = page[i].split()[2]
                page[i] = f"# TYPE {name[: rng.randrange(6, len(name))]} counter"
            else:
                page.insert(j, "")
        text = "\n".join(page)
        assert kept_text_lines(text) == reference(text)


def test_prefilter_and_parse_unchanged_on_a_many_engine_page() -> None:
    """A 16-engine page built from the real capture: the pre-filter keeps the line-by-line
    lines, and the page parses to 16 engines whose drafts are the capture's (2603 each)."""
    page = body("vllm-metrics/real-cpu-draft-model.txt")
    blocks = page.split("\n# TYPE ")
    out = [blocks[0]]
    for block in blocks[1:]:
        head, *rest = block.split("\n")
        samples = [ln for ln in rest if ln and not ln.startswith("#")]
        comments = [ln for ln in rest if ln.startswith("#")]
        many = [ln.replace('engine="0"', f'engine="{e}"') for e in range(16) for ln in samples]
        out.append("\n".join([head, *many, *comments]))
    text = "\n# TYPE ".join(out) + "\n"
    assert prefilter(text) == "\n".join(reference(text)) + "\n"
    reading = parse_page(text)
    assert len(reading.engines) == 16
    assert {e.counters["drafts"] for e in reading.engines.values()} == {2603.0}


def test_small_pages_are_read_line_by_line() -> None:
    """A page under the block-wise threshold gives the same lines (read line by line)."""
    page = body("vllm-metrics/real-cpu-ngram.txt")
    assert len(page) < prefilter_mod._BLOCKWISE_BYTES
    assert kept_text_lines(page) == reference(page)
