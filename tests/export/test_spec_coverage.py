"""Per-request τ coverage: the share of replayed replies that carry vLLM's per-request
speculative-decoding metrics, by arm and finish reason, on specwatch's /metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.export.prometheus import ShadowCollector
from specwatch.shadow.published import ShadowIO
from specwatch.shadow.summary import Carried, build_shadow_stats

COVERAGE = "specwatch_shadow_spec_metrics_coverage_ratio"


def coverage_samples(io: ShadowIO) -> dict[tuple[str, str], float]:
    """The coverage series the shadow collector exposes for ``io``, read back from the text."""
    stats = build_shadow_stats({}, now=0.0, carried=Carried(io=io))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ShadowCollector(lambda: stats))
    text = generate_latest(registry).decode()
    return {
        (s.labels["arm"], s.labels["finish_reason"]): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == COVERAGE
    }


def test_coverage_is_the_share_of_replies_with_metrics_per_finish_reason() -> None:
    """FLy: 6 stop-string finishes, none with metrics (vLLM sends null there), 3 length
    finishes all with metrics; standard: 4 stop finishes, 1 with metrics (an EOS): 0, 1, 0.25."""
    io = ShadowIO(
        reply_finishes={("fly", "stop"): 6, ("fly", "length"): 3, ("standard", "stop"): 4},
        reply_finishes_with_spec={("fly", "length"): 3, ("standard", "stop"): 1},
    )
    assert io.spec_metrics_coverage() == {
        ("fly", "stop"): 0.0,
        ("fly", "length"): 1.0,
        ("standard", "stop"): 0.25,
    }
    assert coverage_samples(io) == {
        ("fly", "length"): 1.0,
        ("fly", "stop"): 0.0,
        ("standard", "stop"): 0.25,
    }


def test_no_series_before_a_reply() -> None:
    """Without replies the family has no series (a share of nothing is not 0)."""
    assert coverage_samples(ShadowIO()) == {}


def test_finish_reason_label_is_bounded() -> None:
    """vLLM's finish reasons keep their name, a missing one is ``none``, anything else
    ``other`` (so a server sending arbitrary strings cannot grow the label set)."""
    from specwatch.shadow.pipeline import finish_label

    assert [finish_label(r) for r in ("stop", "length", "tool_calls", None, "x" * 40)] == [
        "stop",
        "length",
        "tool_calls",
        "none",
        "other",
    ]
