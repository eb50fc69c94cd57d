"""Parse a vLLM ``/metrics`` page into a :class:`~specwatch.model.PageReading` (pure).

Only allow-listed families are kept (catalogue in ``docs/metrics.md``), by *exact* sample name
(never a substring; ``*_created`` never read). Lines of other families are dropped by a cheap
line pre-filter before the remainder is handed to prometheus_client's parser
(``text_string_to_metric_families``, or the OpenMetrics parser when the content type says so),
which still validates every kept line, unescapes labels and HELP text. Grouped by
(``model_name``, ``engine``); other labels (``finished_reason`` …) are summed over.

A malformed page raises :class:`ParseError` and nothing from it is used. NaN means unknown: the
series is treated as absent. The same series twice: identical copies count once; conflicting
copies are skipped and counted in :attr:`PageReading.duplicate_conflicts`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as om_text_string_to_metric_families,
)
from prometheus_client.parser import text_string_to_metric_families

from specwatch.model import EngineKey, EngineReading, Histogram, PageReading

_Ident = tuple[str, tuple[tuple[str, str], ...]]


class ParseError(ValueError):
    """A page that is not valid exposition text; ``line`` is 1-based when known (else 0)."""

    def __init__(self, message: str, *, line: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


@dataclass(frozen=True, slots=True)
class _Family:
    name: str  # exposition family name (as in # TYPE), counters with _total
    kind: str  # counter | gauge | histogram
    key: str  # key in EngineReading


#: Allow-listed vLLM families: exposition name → (type, key). Old names are fallbacks.
FAMILIES: tuple[_Family, ...] = (
    _Family("vllm:spec_decode_num_drafts_total", "counter", "drafts"),
    _Family("vllm:spec_decode_num_draft_tokens_total", "counter", "draft_tokens"),
    _Family("vllm:spec_decode_num_accepted_tokens_total", "counter", "accepted_tokens"),
    _Family("vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter", "per_position"),
    _Family("vllm:generation_tokens_total", "counter", "generation_tokens"),
    _Family("vllm:prompt_tokens_total", "counter", "prompt_tokens"),
    _Family("vllm:num_preemptions_total", "counter", "preemptions"),
    _Family("vllm:request_success_total", "counter", "requests_finished"),
    _Family("vllm:num_requests_running", "gauge", "running"),
    _Family("vllm:num_requests_waiting", "gauge", "waiting"),
    _Family("vllm:num_requests_waiting_by_reason", "gauge", "waiting_by_reason"),
    _Family("vllm:kv_cache_usage_perc", "gauge", "kv_cache_usage"),
    _Family("vllm:gpu_cache_usage_perc", "gauge", "kv_cache_usage_old"),
    _Family("vllm:iteration_tokens_total", "histogram", "engine_steps"),
    _Family("vllm:inter_token_latency_seconds", "histogram", "itl"),
    _Family("vllm:time_per_output_token_seconds", "histogram", "itl_old"),
    _Family("vllm:time_to_first_token_seconds", "histogram", "ttft"),
    _Family("process_start_time_seconds", "gauge", "process_start_time_seconds"),
)


def _sample_names(fam: _Family) -> dict[str, str]:
    """Exact sample names of a family → suffix role (``value``/``bucket``/``count``/``sum``)."""
    if fam.kind == "histogram":
        return {
            fam.name + "_bucket": "bucket",
            fam.name + "_count": "count",
            fam.name + "_sum": "sum",
        }
    return {fam.name: "value"}


#: Exact sample name → (family, role).
_SAMPLES: dict[str, tuple[_Family, str]] = {
    sample: (fam, role) for fam in FAMILIES for sample, role in _sample_names(fam).items()
}

#: Samples not needed in the plain text format (validated by the full page only in OpenMetrics,
#: whose parser needs whole histograms): engine steps need only ``_count``; quantiles need only
#: ``_bucket`` (the ``+Inf`` bucket is the count).
_TEXT_SKIP: frozenset[str] = frozenset(
    {
        "vllm:iteration_tokens_total_bucket",
        "vllm:iteration_tokens_total_sum",
        *(
            f"{f.name}_{suffix}"
            for f in FAMILIES
            if f.key in ("itl", "itl_old", "ttft")
            for suffix in ("count", "sum")
        ),
    }
)

#: Names that may appear in ``# HELP`` / ``# TYPE`` lines of kept families (text format keeps
#: ``_total`` on counters; OpenMetrics drops it).
_META_NAMES: frozenset[str] = frozenset(
    {f.name for f in FAMILIES}
    | {f.name.removesuffix("_total") for f in FAMILIES if f.kind == "counter"}
)

OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text"


def _prefixes(samples: Iterable[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Line prefixes of kept samples (name + ``{``/space/tab) and of kept TYPE lines."""
    names = tuple(samples)
    sample_prefixes = tuple(n + c for n in names for c in "{ \t")
    type_prefixes = tuple(f"# TYPE {n}{c}" for n in sorted(_META_NAMES) for c in " \t")
    return sample_prefixes, type_prefixes


_KEEP_TEXT = _prefixes(n for n in _SAMPLES if n not in _TEXT_SKIP)
_KEEP_OPENMETRICS = _prefixes(_SAMPLES)


def _kept(line: str, keep: tuple[tuple[str, ...], tuple[str, ...]], openmetrics: bool) -> bool:
    if line.startswith(keep[0]):
        return True
    if line.startswith("# TYPE"):
        return line.startswith(keep[1])
    return openmetrics and line.rstrip() == "# EOF"


def prefilter(body: str, *, openmetrics: bool = False) -> str:
    """Keep only the lines of allow-listed families.

    A sample line is kept when its name is exactly an allow-listed sample name (followed by
    ``{``, space or tab: ``str.startswith`` on a tuple of prefixes, so never a substring match);
    TYPE lines when they name a kept family (so each kept sample keeps its family's type);
    ``# EOF`` in OpenMetrics. Everything else (other families, ``*_created``, HELP text, other
    comments) is dropped before parsing.
    """
    if openmetrics:
        keep = _KEEP_OPENMETRICS
        return "\n".join([ln for ln in body.split("\n") if _kept(ln, keep, True)]) + "\n"
    samples, types = _KEEP_TEXT
    kept = [
        ln
        for ln in body.split("\n")
        if ln.startswith(samples) or (ln.startswith("# TYPE") and ln.startswith(types))
    ]
    return "\n".join(kept) + "\n"


def kept_line_numbers(body: str, *, openmetrics: bool = False) -> list[int]:
    """1-based line numbers in ``body`` of the lines :func:`prefilter` keeps (for errors)."""
    keep = _KEEP_OPENMETRICS if openmetrics else _KEEP_TEXT
    return [n for n, ln in enumerate(body.split("\n"), start=1) if _kept(ln, keep, openmetrics)]


class _Acc:
    """Mutable per-engine accumulator used only inside :func:`parse_page`."""

    __slots__ = ("buckets", "counters", "gauges", "hcount", "hsum", "per_position", "waiting")

    def __init__(self) -> None:
        self.counters: dict[str, float] = {}
        self.per_position: dict[int, float] = {}
        self.gauges: dict[str, float] = {}
        self.waiting: dict[str, float] = {}
        self.buckets: dict[str, dict[float, float]] = {}
        self.hcount: dict[str, float] = {}
        self.hsum: dict[str, float] = {}

    def freeze(self) -> EngineReading:
        gauges = dict(self.gauges)
        old_kv = gauges.pop("kv_cache_usage_old", None)
        if "kv_cache_usage" not in gauges and old_kv is not None:
            gauges["kv_cache_usage"] = old_kv
        counters = dict(self.counters)
        hists: dict[str, Histogram] = {}
        for key, buckets in self.buckets.items():
            if math.inf not in buckets:
                continue  # a histogram without +Inf cannot give quantiles
            hists[key] = Histogram(
                tuple(sorted(buckets.items())), self.hcount.get(key), self.hsum.get(key)
            )
        if "engine_steps" in self.hcount:
            counters["engine_steps"] = self.hcount["engine_steps"]
        hists.pop("engine_steps", None)
        old_itl = hists.pop("itl_old", None)
        if "itl" not in hists and old_itl is not None:
            hists["itl"] = old_itl
        return EngineReading(
            counters=counters,
            per_position=dict(sorted(self.per_position.items())),
            gauges=gauges,
            waiting_by_reason=dict(sorted(self.waiting.items())),
            histograms=hists,
        )


def _families(text: str, openmetrics: bool) -> Iterable[Metric]:
    if openmetrics:
        om: Iterable[Metric] = om_text_string_to_metric_families(text)  # type: ignore[no-untyped-call]
        return om
    plain: Iterable[Metric] = text_string_to_metric_families(text)
    return plain


def parse_page(body: str, *, content_type: str = "text/plain") -> PageReading:
    """Parse one ``/metrics`` body into a :class:`PageReading`.

    Raises :class:`ParseError` (with the 1-based line number when it can be found) when the page
    is malformed, does not end with a newline (a truncated body), or is HTML/JSON by its
    content type (an error page from a proxy). Values of series that
    carry labels besides ``model_name``, ``engine``, ``position``, ``reason`` and ``le`` are summed.
    """
    media = content_type.split(";")[0].strip().lower()
    if media in ("text/html", "application/json", "application/xhtml+xml"):
        raise ParseError(f"not a metrics page: content type {media}", line=1)
    if body and not body.endswith("\n"):
        raise ParseError("truncated body: no final newline", line=body.count("\n") + 1)
    openmetrics = media == OPENMETRICS_CONTENT_TYPE
    text = prefilter(body, openmetrics=openmetrics)
    try:
        metrics = list(_families(text, openmetrics))
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        numbers = kept_line_numbers(body, openmetrics=openmetrics)
        line = _locate(text, numbers, openmetrics)
        raise ParseError(f"malformed exposition: {exc}", line=line) from None
    seen: dict[_Ident, tuple[float, dict[str, str]]] = {}
    conflicts: set[_Ident] = set()
    for metric in metrics:
        for s in metric.samples:
            if s.name not in _SAMPLES:
                continue
            ident = (s.name, tuple(sorted(s.labels.items())))
            old = seen.get(ident)
            if old is not None:
                if old[0] != s.value and not (math.isnan(old[0]) and math.isnan(s.value)):
                    conflicts.add(ident)
                continue
            seen[ident] = (float(s.value), s.labels)
    engines: dict[EngineKey, _Acc] = {}
    process_start: float | None = None
    families: set[str] = set()
    for ident, (value, labels) in seen.items():
        if value != value or (conflicts and ident in conflicts):  # NaN is unknown
            continue
        fam, role = _SAMPLES[ident[0]]
        families.add(fam.name)
        if fam.key == "process_start_time_seconds":
            process_start = value
            continue
        ekey = (labels.get("model_name", ""), labels.get("engine", "0"))
        acc = engines.get(ekey)
        if acc is None:
            acc = engines[ekey] = _Acc()
        _ingest(acc, fam, role, labels, value)
    return PageReading(
        engines={k: engines[k].freeze() for k in sorted(engines)},
        process_start_time_seconds=process_start,
        duplicate_conflicts=len(conflicts),
        families=frozenset(families),
    )


def _ingest(acc: _Acc, fam: _Family, role: str, labels: dict[str, str], value: float) -> None:
    key = fam.key
    if fam.kind == "histogram":
        if role == "bucket":
            le = _le(labels.get("le", ""))
            if le is None:
                return
            b = acc.buckets.setdefault(key, {})
            b[le] = b.get(le, 0.0) + value
        elif role == "count":
            acc.hcount[key] = acc.hcount.get(key, 0.0) + value
        else:
            acc.hsum[key] = acc.hsum.get(key, 0.0) + value
        return
    if key == "per_position":
        try:
            pos = int(labels.get("position", ""))
        except ValueError:
            return
        acc.per_position[pos] = acc.per_position.get(pos, 0.0) + value
    elif key == "waiting_by_reason":
        reason = labels.get("reason", "")
        acc.waiting[reason] = acc.waiting.get(reason, 0.0) + value
    elif fam.kind == "gauge":
        acc.gauges[key] = acc.gauges.get(key, 0.0) + value
    else:
        acc.counters[key] = acc.counters.get(key, 0.0) + value


_LE_CACHE: dict[str, float | None] = {}


def _le(text: str) -> float | None:
    got = _LE_CACHE.get(text, 0.5)
    if got != 0.5:
        return got
    try:
        value: float | None = float(text)
    except ValueError:
        value = None
    if len(_LE_CACHE) < 4096:
        _LE_CACHE[text] = value
    return value


def _locate(text: str, numbers: list[int], openmetrics: bool) -> int:
    """Find the first kept line that fails to parse alone; its line number in the original."""
    lines = text.split("\n")
    for index, line in enumerate(lines[: len(numbers)]):
        if line.startswith("#"):
            continue
        try:
            list(_families(line + "\n" + ("# EOF\n" if openmetrics else ""), openmetrics))
        except (ValueError, IndexError, KeyError, TypeError):
            return numbers[index]
    return 0
