"""The vLLM family table: one home for the names the parser reads and the simulator writes."""

from __future__ import annotations

import re

from specwatch.observe import parse
from specwatch.simulate import metrics as sim_metrics
from specwatch.vllm.families import BY_KEY, FAMILIES
from tests.fakes import REPO


def test_parser_reads_the_one_table() -> None:
    """The observe parser's allow-list is the vllm family table itself, not a copy."""
    assert vars(parse)["FAMILIES"] is FAMILIES
    assert len(BY_KEY) == len(FAMILIES)


def test_counter_base_drops_total_only_for_counters() -> None:
    """prometheus_client appends ``_total`` to counters, so a counter is created by its base
    name; gauges and histograms keep theirs (``vllm:iteration_tokens_total`` is a histogram)."""
    assert BY_KEY["drafts"].base == "vllm:spec_decode_num_drafts"
    assert BY_KEY["running"].base == "vllm:num_requests_running"
    assert BY_KEY["engine_steps"].base == "vllm:iteration_tokens_total"


def test_simulator_spells_no_table_name_itself() -> None:
    """The simulator's /metrics module names every family of the table through it: none of the
    table's names appears there as a string literal (a renamed family cannot drift)."""
    assert vars(sim_metrics)["BY_KEY"] is BY_KEY
    src = (REPO / "specwatch" / "simulate" / "metrics.py").read_text()
    literals = set(re.findall(r'"(vllm:[a-z_:]+)"', src))
    assert literals.isdisjoint({f.base for f in FAMILIES} | {f.name for f in FAMILIES})
