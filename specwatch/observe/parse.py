"""Parse a vLLM ``/metrics`` page into a :class:`~specwatch.observe.values.PageReading` (pure).

Only allow-listed families are kept (catalogue in ``docs/metrics.md``), by *exact* sample name
(never a substring; ``*_created`` never read). Lines of other families are dropped by a cheap
line pre-filter before the remainder is handed to prometheus_client's parser
(``text_string_to_metric_families``, or the OpenMetrics parser when the content type says so),
which still validates every kept line, unescapes labels and HELP text. Grouped by
(``model_name``, ``engine``); other labels (``finished_reason`` …) are summed over.

Between scrapes the labels part of each kept series (``name{...}`` exactly as on the page) is
memoised with what prometheus_client parsed from it, and on later pages only the value text of
such a line is parsed, by prometheus_client's own value parser: same result as parsing the whole
line, at a fraction of the cost, since label parsing is most of the parser's time (see
:func:`_records_fast` and ``docs/benchmarks.md``). A new series whose labels part has the *shape*
of one parsed before (same text outside the quoted label values, :func:`_shape`) takes that
line's label names with its own quoted values, so a cold page costs one library parse per shape;
the shapes vLLM writes are learnt at import. Any error sends the page through the whole parse.

A malformed page raises :class:`ParseError` and nothing from it is used. NaN means unknown: the
series is treated as absent (on a counter it is also refused and counted, as a value above
2^53 is: :func:`specwatch.observe.plausible.implausible`, :attr:`PageReading.implausible`).
Values and labels no vLLM page carries (±Inf, negative counters, bad ``position``/``le``
labels) skip their series, counted in
:attr:`PageReading.invalid_series`. The same series twice: identical copies count once; conflicting
copies are skipped and counted in :attr:`PageReading.duplicate_conflicts`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as om_text_string_to_metric_families,
)
from prometheus_client.parser import text_string_to_metric_families

from specwatch.observe.plausible import MAX_NAMED, implausible, sample_text
from specwatch.observe.prefilter import (
    NAMES_TEXT,
    OPENMETRICS_CONTENT_TYPE,
    SAMPLES,
    kept_line_numbers,
    kept_text_lines,
    prefilter,
)
from specwatch.observe.sglang_parse import SglangPageError, parse_sglang_page
from specwatch.observe.values import (
    PROMPT_SOURCES,
    CacheConfig,
    EngineKey,
    EngineReading,
    Histogram,
    LoraState,
    PageReading,
)
from specwatch.vllm.families import CACHE_CONFIG_INFO, FAMILIES, LORA_REQUESTS_INFO, Family
from specwatch.vllm.sglang import EngineKind, detect_engine

_ValueParser = Callable[[str], tuple[float, float | None]]


def _library_value_parser() -> _ValueParser | None:
    """prometheus_client's own parser of the text after a sample's labels (value, timestamp),
    used for lines whose labels part is memoised; ``None`` (no memo, every kept line parsed
    whole) when this prometheus_client lacks it or it does not behave as expected."""
    try:
        from prometheus_client.parser import _parse_value_and_timestamp
    except ImportError:  # another prometheus_client layout
        return None
    try:
        ok = _parse_value_and_timestamp(" 2.5 1000") == (2.5, 1.0)
    except (ValueError, TypeError):
        ok = False
    return _parse_value_and_timestamp if ok else None


_VALUE_PARSER: _ValueParser | None = _library_value_parser()

_Ident = tuple[str, tuple[tuple[str, str], ...]]


class ParseError(ValueError):
    """A page that is not valid exposition text; ``line`` is 1-based when known (else 0)."""

    def __init__(self, message: str, *, line: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


class _Acc:
    """Mutable per-engine accumulator used only inside :func:`parse_page`."""

    __slots__ = (
        "buckets",
        "counters",
        "gauges",
        "hcount",
        "hsum",
        "per_position",
        "per_process",
        "waiting",
    )

    def __init__(self) -> None:
        self.per_process: dict[tuple[Family, tuple[tuple[str, str], ...]], float] = {}
        self.counters: dict[str, float] = {}
        self.per_position: dict[int, float] = {}
        self.gauges: dict[str, float] = {}
        self.waiting: dict[str, float] = {}
        self.buckets: dict[str, dict[float, float]] = {}
        self.hcount: dict[str, float] = {}
        self.hsum: dict[str, float] = {}

    def freeze(self) -> EngineReading:
        _fold_per_process(self)
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
        # _sum and _count as counters, so windows give means (reset-safe like every counter)
        for name, src in (("itl", "itl" if "itl" in self.hcount else "itl_old"), ("ttft", "ttft")):
            if src in self.hsum and src in self.hcount:
                counters[f"{name}_sum"] = self.hsum[src]
                counters[f"{name}_count"] = self.hcount[src]
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


def parse_page(
    body: str, *, content_type: str = "text/plain", engine: EngineKind | None = None
) -> PageReading:
    """Parse one ``/metrics`` body into a :class:`PageReading`.

    Raises :class:`ParseError` (with the 1-based line number when it can be found) when the page
    is malformed, does not end with a newline (a truncated body), or is HTML/JSON by its
    content type (an error page from a proxy). Values of series that
    carry labels besides ``model_name``, ``engine``, ``position``, ``reason`` and ``le`` are summed,
    except gauges exported once per process (:func:`_ingest_per_process`).
    ``engine``: the serving engine the target is set to; ``None`` tells it from the page
    (:func:`specwatch.vllm.sglang.detect_engine`); an SGLang page goes to
    :func:`specwatch.observe.sglang_parse.parse_sglang_page`.
    """
    media = content_type.split(";")[0].strip().lower()
    if media in ("text/html", "application/json", "application/xhtml+xml"):
        raise ParseError(f"not a metrics page: content type {media}", line=1)
    if body and not body.endswith("\n"):
        raise ParseError("truncated body: no final newline", line=body.count("\n") + 1)
    openmetrics = media == OPENMETRICS_CONTENT_TYPE
    if (engine or detect_engine(body)) == "sglang":
        try:
            return parse_sglang_page(body, openmetrics=openmetrics)
        except SglangPageError as exc:
            raise ParseError(exc.message, line=exc.line) from None
    records = _records_openmetrics(body) if openmetrics else _records_text(body)
    seen: dict[_Ident, tuple[float, _Series]] = {}
    conflicts: set[_Ident] = set()
    for series, value in records:
        ident = series.ident
        old = seen.get(ident)
        if old is not None:
            if old[0] != value and not (math.isnan(old[0]) and math.isnan(value)):
                conflicts.add(ident)
            continue
        seen[ident] = (float(value), series)
    engines: dict[EngineKey, _Acc] = {}
    process_start: float | None = None
    families: set[str] = set()
    processes: set[str] = set()
    invalid = 0
    refused: list[str] = []
    invalid_named: list[str] = []
    for ident, (value, series) in seen.items():
        fam = series.family
        # present on the page even when every sample of it is skipped below: such a family is
        # reported as invalid (the skipped-series lines), never as missing
        families.add(fam.name)
        if conflicts and ident in conflicts:
            continue
        if implausible(value, counter=fam.kind != "gauge"):
            refused.append(sample_text(ident[0], ident[1], value))
            continue
        if value != value:  # NaN is unknown
            continue
        if _invalid(series, value):
            invalid += 1
            if len(invalid_named) < MAX_NAMED:
                invalid_named.append(sample_text(ident[0], ident[1], value))
            continue
        if fam.key == "process_start_time_seconds":
            process_start = value
            continue
        acc = engines.get(series.engine)
        if acc is None:
            acc = engines[series.engine] = _Acc()
        if series.per_process:
            processes.add(series.labels[PROCESS_LABEL])
            _ingest_per_process(acc, fam, series.labels, value)
            continue
        role = series.role
        if role == "bucket":  # as _ingest, with the bound worked out once per series
            b = acc.buckets.get(fam.key)
            if b is None:
                b = acc.buckets[fam.key] = {}
            b[series.le] = b.get(series.le, 0.0) + value
        elif fam.key == "per_position":
            pos = series.position
            acc.per_position[pos] = acc.per_position.get(pos, 0.0) + value
        else:
            _ingest(acc, fam, role, series.labels, value)
    cache_rows, lora_rows, bad_info = read_info(body)
    invalid += len(bad_info)
    invalid_named += bad_info[: max(MAX_NAMED - len(invalid_named), 0)]
    return PageReading(
        engines={k: engines[k].freeze() for k in sorted(engines)},
        process_start_time_seconds=process_start,
        duplicate_conflicts=len(conflicts),
        duplicates=_named(conflicts, seen),
        families=frozenset(families),
        invalid_series=invalid,
        gauge_processes=len(processes),
        implausible_series=len(refused),
        implausible=tuple(refused[:MAX_NAMED]),
        invalid=tuple(invalid_named),
        cache_config=_cache_config(cache_rows),
        lora=_lora(lora_rows),
    )


_INFO_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}
_InfoRows = list[tuple[dict[str, str], float]]


def _info_sample(line: str) -> tuple[dict[str, str], float] | None:
    """``name{labels} value`` → (labels, value); ``None`` when the line is not well formed."""
    open_, close = line.find("{"), line.rfind("}")
    if open_ < 0 or close < open_:
        return None
    inner, labels, pos = line[open_ + 1 : close], {}, 0
    while pos < len(inner):
        m = _INFO_LABEL.match(inner, pos)
        if m is None:
            return None
        labels[m[1]] = re.sub(r"\\[\\\"n]", lambda e: _UNESCAPE[e[0]], m[2])
        pos = m.end()
    try:
        value = float(line[close + 1 :].split()[0])
    except (ValueError, IndexError):
        return None
    return (labels, value) if math.isfinite(value) else None


def read_info(body: str) -> tuple[_InfoRows, _InfoRows, list[str]]:
    """The samples of ``vllm:cache_config_info`` and ``vllm:lora_requests_info`` (info gauges of
    the whole page: no ``model_name``, and so many labels that one vLLM adds must not break the
    page), read line by line apart from the allow-listed families: (cache rows, LoRA rows, the
    first few lines skipped as malformed). A malformed line is skipped and counted with the
    page's invalid series; the rest of the page is read as always."""
    rows: dict[str, _InfoRows] = {CACHE_CONFIG_INFO: [], LORA_REQUESTS_INFO: []}
    bad: list[str] = []
    for name, got in rows.items():
        start = body.find(name + "{")
        while start >= 0:
            end = body.find("\n", start)
            line = body[start : end if end >= 0 else len(body)]
            if start == 0 or body[start - 1] == "\n":
                sample = _info_sample(line)
                if sample is None:
                    bad.append(line[:200])
                else:
                    got.append(sample)
            start = body.find(name + "{", start + 1)
    return rows[CACHE_CONFIG_INFO], rows[LORA_REQUESTS_INFO], bad


def _int_label(labels: Mapping[str, str], name: str) -> int | None:
    try:
        return int(float(labels.get(name, "")))
    except ValueError:
        return None


def _cache_config(rows: _InfoRows) -> CacheConfig | None:
    """The lowest engine's ``vllm:cache_config_info`` labels (``None`` without the family)."""
    if not rows:
        return None
    labels = min(rows, key=lambda r: (_int_label(r[0], "engine") or 0, sorted(r[0].items())))[0]
    flag = labels.get("enable_prefix_caching", "").strip().lower()
    return CacheConfig(
        block_size=_int_label(labels, "block_size"),
        enable_prefix_caching={"true": True, "false": False}.get(flag),
        kv_cache_size_tokens=_int_label(labels, "kv_cache_size_tokens"),
    )


def _lora(rows: _InfoRows) -> LoraState | None:
    """The series of ``vllm:lora_requests_info`` with the largest value (vLLM stamps the current
    state with the wall time; older label sets keep older times), ``None`` without the family."""
    if not rows:
        return None
    labels, value = max(rows, key=lambda r: (r[1], sorted(r[0].items())))

    def names(key: str) -> tuple[str, ...]:
        return tuple(n for n in (x.strip() for x in labels.get(key, "").split(",")) if n)

    return LoraState(
        max_lora=_int_label(labels, "max_lora"),
        running=names("running_lora_adapters"),
        waiting=names("waiting_lora_adapters"),
        updated_at=value,
    )


#: Largest ``position`` label + 1 read (K); vLLM's K is a handful. A larger or non-canonical
#: position (``01``, ``+1``, `` 1``, non-ASCII digits) would add a wrong per-position value or
#: make K (and the per-position lists) huge.
MAX_POSITIONS = 128

#: Distinct ``reason`` labels of ``vllm:num_requests_waiting_by_reason`` kept per engine (vLLM
#: has a handful); further reasons are summed into ``other``.
MAX_WAITING_REASONS = 16


def _named(conflicts: set[_Ident], seen: Mapping[_Ident, tuple[float, _Series]]) -> tuple[str, ...]:
    """The first few series seen twice with different values (``name{labels}=first value``),
    in sorted order so the same page names the same series."""
    return tuple(sample_text(i[0], i[1], seen[i][0]) for i in sorted(conflicts)[:MAX_NAMED])


def _invalid(series: _Series, value: float) -> bool:
    """True for a value or label no vLLM page carries (the series is skipped and counted):
    ±Inf anywhere; a negative counter or histogram sample; a per-position counter whose
    ``position`` is not a canonical integer in ``[0, MAX_POSITIONS)``; a bucket whose ``le`` is
    not a number (the labels part worked out once, :attr:`_Series.bad_labels`)."""
    if math.isinf(value) or series.bad_labels:
        return True
    return value < 0 and series.family.kind != "gauge"


@dataclass(frozen=True, slots=True)
class _Series:
    """One allow-listed series as prometheus_client parsed it (labels never mutated)."""

    ident: _Ident
    labels: dict[str, str]
    family: Family
    role: str
    engine: EngineKey
    #: what the labels alone say, worked out once per series (memoised between pages):
    #: ``bad_labels``: a ``position`` or ``le`` label no vLLM page carries (see :func:`_invalid`);
    #: ``le``: the bucket bound of a ``bucket`` sample; ``position``: the per-position index;
    #: ``per_process``: a gauge with a :data:`PROCESS_LABEL` label.
    bad_labels: bool = False
    le: float = 0.0
    position: int = 0
    per_process: bool = False


def _series(name: str, labels: dict[str, str]) -> _Series | None:
    got = SAMPLES.get(name)
    if got is None:
        return None
    fam, role = got
    ident = (name, tuple(sorted(labels.items())))
    engine = (labels.get("model_name", ""), labels.get("engine", "0"))
    bad = False
    le = 0.0
    position = 0
    if fam.key == "per_position":
        pos = labels.get("position", "")
        bad = not _canonical_position(pos)
        position = 0 if bad else int(pos)
    elif role == "bucket":
        bound = _le(labels.get("le", ""))
        bad = bound is None or bound != bound
        le = 0.0 if bound is None else bound
    per_process = fam.kind == "gauge" and PROCESS_LABEL in labels
    return _Series(ident, labels, fam, role, engine, bad, le, position, per_process)


def _canonical_position(pos: str) -> bool:
    """A ``position`` label that is a canonical integer in ``[0, MAX_POSITIONS)``."""
    return (
        0 < len(pos) <= 3
        and pos.isascii()
        and pos.isdigit()
        and (pos == "0" or pos[0] != "0")
        and int(pos) < MAX_POSITIONS
    )


#: Memo of the labels part of kept sample lines: ``name{...}`` exactly as on the page → the
#: series prometheus_client parsed from a whole line starting with it. Bounded; cleared when full.
_SERIES_MEMO: dict[str, _Series] = {}
_SERIES_MEMO_MAX = 16384
_PLACEHOLDER = _Series(("", ()), {}, FAMILIES[0], "", ("", ""))
#: TYPE lines of kept families that prometheus_client already accepted (a TYPE line's validity
#: depends on that line only).
_TYPE_OK: set[str] = set()
#: Memo of sample line shapes (:func:`_shape`) → (sample name, label names in order), taken
#: from a whole line prometheus_client parsed. Bounded; cleared when full.
_SHAPE_MEMO: dict[str, tuple[str, tuple[str, ...]]] = {}


def _accepted_type_lines() -> frozenset[str]:
    """The canonical TYPE line of every allow-listed family (``# TYPE <name> <type>``, as vLLM's
    prometheus_client writes them), each accepted by prometheus_client's parser at import: a
    page whose TYPE lines are these has none parsed again (a TYPE line's validity depends on
    that line only). Lines the fast path never sees (counters without ``_total``) are left out."""
    out: set[str] = set()
    for fam in FAMILIES:
        line = f"# TYPE {fam.name} {fam.kind}"
        if _renames(line):
            continue
        try:
            list(text_string_to_metric_families(line + "\n"))
        except (ValueError, IndexError, KeyError, TypeError):
            continue
        out.add(line)
    return frozenset(out)


def clear_memo(*, seed: bool = True) -> None:
    """Forget every memoised labels part, shape and TYPE line: the next parse is cold, as the
    first scrape of a process (``seed``: with the shapes of vLLM's own pages memoised, as at
    import; ``False``: none, as a page of shapes vLLM does not write)."""
    _SERIES_MEMO.clear()
    _SHAPE_MEMO.clear()
    _TYPE_OK.clear()
    if seed:
        _seed_shapes()


def _malformed(exc: Exception, body: str, kept: list[str], index: int | None) -> ParseError:
    numbers = kept_line_numbers(body)
    if index is not None:
        return ParseError(f"malformed exposition: {exc}", line=numbers[index])
    text = "\n".join(kept) + "\n"
    return ParseError(f"malformed exposition: {exc}", line=_locate(text, numbers, False))


def _records_text(body: str) -> list[tuple[_Series, float]]:
    """(series, value) of the kept sample lines of a plain-text page, in page order.

    Every kept line is parsed by prometheus_client, whole or in part (see :func:`_records_fast`);
    a page the fast path cannot take, or one with an error anywhere, is parsed whole by
    :func:`_records_whole` (all kept lines in one ``text_string_to_metric_families`` call), so
    errors are always the whole parse's. The one context effect of the text parser, renaming
    the samples of a ``counter`` TYPE whose name lacks ``_total``, cannot be reproduced line by
    line: a page with such a kept TYPE line is parsed whole.
    """
    kept = kept_text_lines(body)
    value_of = _VALUE_PARSER
    if value_of is None or any(_renames(ln) for ln in kept if ln[0] == "#"):
        return _records_whole(body, kept)
    try:
        got = _records_fast(kept, value_of)
    except (ValueError, IndexError, KeyError, TypeError):
        got = None
    return _records_whole(body, kept) if got is None else got


def _shape(head: str) -> tuple[str, list[str]] | None:
    """Split the labels part ``name{...}`` of a sample line into its shape (every quoted label
    value emptied) and the label values, left to right; ``None`` when it holds a backslash or an
    odd number of double quotes (then quotes are not plain toggles and no shape is taken).

    Without backslashes prometheus_client's label parser treats each ``"`` as opening or
    closing a quoted string, so two lines of the same shape differ only inside quoted strings
    that hold no ``"``: the parser splits them at the same places, reads the same label names,
    and the label values are exactly the quoted texts (no unescaping without ``\\``).
    """
    if "\\" in head:
        return None
    parts = head.split('"')
    if len(parts) % 2 == 0:
        return None
    return '""'.join(parts[0::2]), parts[1::2]


def _records_fast(kept: list[str], value_of: _ValueParser) -> list[tuple[_Series, float]] | None:
    """(series, value) of the kept lines, parsing as little as possible with prometheus_client;
    ``None`` when a line does not fit (the caller parses the page whole). Errors propagate.

    Per sample line, the first that applies:

    1. the labels part (``name{...}``, up to the last ``}``) was parsed before from a whole line
       (memo between scrapes): only the value text is parsed, by prometheus_client's value parser
       (``_parse_value_and_timestamp``, what the line parser applies to the text after the
       labels);
    2. a line of the same *shape* (:func:`_shape`: same text outside the quoted label values)
       was parsed whole, here or on an earlier page, and its label values were exactly its
       quoted texts in order: the labels are the shape's label names with this line's quoted
       texts; the value as in 1. This is how a cold page is cheap: the buckets of one histogram,
       the engines of a data-parallel server, the positions of the per-position counter share
       one shape, so one line of each is parsed whole;
    3. otherwise the line is parsed whole, with the other such lines, in one
       ``text_string_to_metric_families`` call (the first line of a shape new to this page;
       later lines of that shape wait for its result).

    A memo entry is only made from a line whose value parsed as a single token without
    timestamp (so no ``}`` follows its labels part) and whose name is followed by ``{``.
    TYPE lines of kept families go to the parser unless accepted before, on an earlier page or
    at import (:data:`_TYPE_KNOWN`; a TYPE line's validity depends on that line only).
    """
    memo = _SERIES_MEMO
    shapes = _SHAPE_MEMO
    out: list[tuple[_Series, float]] = []
    slots: list[tuple[int, str]] = []  # (index in out, line) of sample lines sent to the parser
    waiting: list[tuple[int, str, str, list[str]]] = []  # (index, line, shape, values)
    batch: list[str] = []
    new_shapes: set[str] = set()
    for raw in kept:
        line = raw.strip()
        if line[0] == "#":
            if line not in _TYPE_KNOWN and line not in _TYPE_OK:
                batch.append(line)
            continue
        end = line.rfind("}")
        bare = _bare_name(line) if end < 0 else None
        if bare is not None and bare in memo:  # no labels, a name parsed before: as in 1.
            out.append((memo[bare], value_of(line[len(bare) + 1 :])[0]))
            continue
        if end > 0:
            head = line[: end + 1]
            hit = memo.get(head)
            if hit is not None:
                tail = line[end + 1 :]
                if tail[:1] == " " and "." in tail and _plain_value(tail):
                    out.append((hit, float(tail)))
                else:
                    out.append((hit, value_of(tail)[0]))
                continue
            split = _shape(head)
            if split is not None:
                shape, values = split
                known = shapes.get(shape)
                if known is not None:
                    series = _series(known[0], dict(zip(known[1], values, strict=True)))
                    if series is None:
                        return None
                    out.append((series, value_of(line[end + 1 :])[0]))
                    _remember(head, series)
                    continue
                if shape in new_shapes:
                    waiting.append((len(out), line, shape, values))
                    out.append((_PLACEHOLDER, 0.0))
                    continue
                new_shapes.add(shape)
        slots.append((len(out), line))
        out.append((_PLACEHOLDER, 0.0))
        batch.append(line)
    if batch:
        samples = [
            s for m in text_string_to_metric_families("\n".join(batch) + "\n") for s in m.samples
        ]
        if len(samples) != len(slots):  # one sample per sample line; anything else: parse whole
            return None
        for (slot, line), sample in zip(slots, samples, strict=True):
            series = _series(sample.name, sample.labels)
            if series is None:
                return None
            out[slot] = (series, sample.value)
            end = line.rfind("}")
            if sample.timestamp is None and end > 0 and line[len(sample.name)] == "{":
                head = line[: end + 1]
                _remember(head, series)
                _learn_shape(head, sample.name, sample.labels)
            elif sample.timestamp is None and _bare_name(line) == sample.name:
                _remember(sample.name, series)  # no labels: memoised by the name
        if len(_TYPE_OK) >= _SERIES_MEMO_MAX:
            _TYPE_OK.clear()
        _TYPE_OK.update(ln for ln in batch if ln[0] == "#")
    for slot, line, shape, values in waiting:
        known = shapes.get(shape)
        if known is None:
            return None
        series = _series(known[0], dict(zip(known[1], values, strict=True)))
        if series is None:
            return None
        out[slot] = (series, value_of(line[line.rfind("}") + 1 :])[0])
        _remember(line[: line.rfind("}") + 1], series)
    return out


def _plain_value(tail: str) -> bool:
    """True when ``float(tail)`` is what prometheus_client's value parser gives for ``tail``,
    the text after a sample's labels, known to start with one space and to hold a ``.``: no
    further blank (so no timestamp) and no ``_``. The library's parser then strips the token
    and, ``int()`` refusing a ``.``, returns ``float()`` of it; ``float`` strips blanks alike,
    and refuses exactly what it refuses."""
    return tail.count(" ") == 1 and "\t" not in tail and "_" not in tail


def _learn_shape(head: str, name: str, labels: dict[str, str]) -> None:
    """Memoise the shape of a labels part ``head`` that prometheus_client parsed whole into
    ``name`` and ``labels``, when its label values are exactly its quoted texts in order."""
    split = _shape(head)
    if split is None or list(labels.values()) != split[1]:
        return
    if len(_SHAPE_MEMO) >= _SERIES_MEMO_MAX:
        _SHAPE_MEMO.clear()
    _SHAPE_MEMO[split[0]] = (name, tuple(labels))


def _seed_shapes() -> None:
    """Memoise the shapes vLLM's own pages use (``engine`` and ``model_name``, plus
    ``position``, ``reason``, ``source``, ``finished_reason`` or ``le`` where the family has it,
    in the order vLLM writes them), each from a line of that shape with empty label values
    parsed by prometheus_client, so that even the first page a process reads has one parse per
    series only for shapes vLLM does not write; and the unlabelled
    ``process_start_time_seconds`` by its name. A seed line that does not parse as expected is
    left out."""
    extra: dict[str, tuple[str, ...]] = {
        "per_position": ("engine", "model_name", "position"),
        "waiting_by_reason": ("engine", "model_name", "reason"),
        "prompt_tokens_by_source": ("engine", "model_name", "source"),
        "requests_finished": ("engine", "finished_reason", "model_name"),
    }
    for sample_name in sorted(NAMES_TEXT):
        fam, role = SAMPLES[sample_name]
        if fam.key == "process_start_time_seconds":  # no labels: the name is memoised
            got = [
                s for m in text_string_to_metric_families(f"{sample_name} 0\n") for s in m.samples
            ]
            series = _series(sample_name, {})
            if series is not None and [(g.name, g.labels) for g in got] == [(sample_name, {})]:
                _remember(sample_name, series)
            continue
        plain: tuple[str, ...] = ("engine", "model_name")
        keys = ("engine", "le", "model_name") if role == "bucket" else extra.get(fam.key, plain)
        head = sample_name + "{" + ",".join(f'{k}=""' for k in keys) + "}"
        try:
            samples = [s for m in text_string_to_metric_families(head + " 0\n") for s in m.samples]
        except (ValueError, IndexError, KeyError, TypeError):
            continue
        if (
            len(samples) == 1
            and samples[0].name == sample_name
            and tuple(samples[0].labels) == keys
        ):
            _learn_shape(head, sample_name, samples[0].labels)


def _bare_name(line: str) -> str | None:
    """The name of a sample line without labels or quotes (``None`` for any other line): up to
    its first space or tab, where prometheus_client splits such a line."""
    if "{" in line or '"' in line:
        return None
    ends = [i for i in (line.find(" "), line.find("\t")) if i > 0]
    return line[: min(ends)] if ends else None


def _remember(head: str, series: _Series) -> None:
    """Memoise a labels part (bounded: cleared when full)."""
    if len(_SERIES_MEMO) >= _SERIES_MEMO_MAX:
        _SERIES_MEMO.clear()
    _SERIES_MEMO[head] = series


def _renames(type_line: str) -> bool:
    """True when a TYPE line may make prometheus_client rename samples (counter without _total)."""
    parts = type_line.split()
    return "counter" in type_line and (len(parts) < 3 or not parts[2].endswith("_total"))


#: Canonical TYPE lines of the allow-listed families, accepted by prometheus_client at import.
_TYPE_KNOWN: frozenset[str] = _accepted_type_lines()


def _kept_samples(metrics: Iterable[Metric]) -> list[tuple[_Series, float]]:
    """(series, value) of every sample of ``metrics`` that is an allow-listed series."""
    out: list[tuple[_Series, float]] = []
    for metric in metrics:
        for s in metric.samples:
            series = _series(s.name, s.labels)
            if series is not None:
                out.append((series, s.value))
    return out


def _records_whole(body: str, kept: list[str]) -> list[tuple[_Series, float]]:
    """(series, value) of the kept lines of a plain-text page, all parsed in one call."""
    text = "\n".join(kept) + "\n"
    try:
        metrics = list(text_string_to_metric_families(text))
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise _malformed(exc, body, kept, None) from None
    return _kept_samples(metrics)


def _records_openmetrics(body: str) -> list[tuple[_Series, float]]:
    """(series, value) of the kept samples of an OpenMetrics page (the whole kept text parsed)."""
    text = prefilter(body, openmetrics=True)
    try:
        metrics = list(_families(text, True))
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        numbers = kept_line_numbers(body, openmetrics=True)
        line = _locate(text, numbers, True)
        raise ParseError(f"malformed exposition: {exc}", line=line) from None
    return _kept_samples(metrics)


def _ingest(acc: _Acc, fam: Family, role: str, labels: dict[str, str], value: float) -> None:
    key = fam.key
    if fam.kind == "histogram":
        if role == "bucket":
            le = _le(labels.get("le", ""))
            if le is None:  # not reached: _invalid skips such buckets
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
        if reason not in acc.waiting and len(acc.waiting) >= MAX_WAITING_REASONS:
            reason = "other"
        acc.waiting[reason] = acc.waiting.get(reason, 0.0) + value
    elif key == "prompt_tokens_by_source":
        source = labels.get("source", "")
        if source in PROMPT_SOURCES:
            name = f"prompt_tokens_{source}"
            acc.counters[name] = acc.counters.get(name, 0.0) + value
    elif fam.kind == "gauge":
        acc.gauges[key] = acc.gauges.get(key, 0.0) + value
    else:
        acc.counters[key] = acc.counters.get(key, 0.0) + value


#: The label prometheus_client's multiprocess mode gives each process's copy of a gauge
#: (``multiprocess_mode="all"``, its default, and ``"liveall"``): vLLM run with several API-server
#: processes exports such gauges once per process.
PROCESS_LABEL = "pid"


def _ingest_per_process(acc: _Acc, fam: Family, labels: dict[str, str], value: float) -> None:
    """A gauge exported once per process (a :data:`PROCESS_LABEL` label): every process reports
    the same engine state, so the copies are one reading, not parts of a sum; it is read once,
    the largest copy per series without the process label (eight copies of KV usage 0.3 read
    0.3, not 2.4). Counters are not per-process copies and are still summed (:func:`_ingest`).
    """
    rest = tuple(sorted((k, v) for k, v in labels.items() if k != PROCESS_LABEL))
    group = (fam, rest)
    old = acc.per_process.get(group)
    acc.per_process[group] = value if old is None else max(old, value)


def _fold_per_process(acc: _Acc) -> None:
    """Add each per-process gauge, read once, to the engine's gauges as :func:`_ingest` would
    (other labels still summed)."""
    for (fam, rest), value in acc.per_process.items():
        _ingest(acc, fam, "value", dict(rest), value)
    acc.per_process.clear()


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


_seed_shapes()  # last: it reads the whole module
