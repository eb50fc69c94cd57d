"""Parse an SGLang ``/metrics`` page into the same :class:`PageReading` as a vLLM page (pure).

Only the families of :data:`specwatch.vllm.sglang.FAMILIES` are kept, by exact sample name;
the kept lines (and their ``# HELP`` / ``# TYPE`` lines) are parsed by prometheus_client. Rules
(versions in ``docs/metrics.md``):

- **One rank.** Scheduler gauges carry ``tp_rank`` (0.4.10 on) and ``pp_rank``; every rank may
  write them (``--enable-metrics-for-all-schedulers``, and the start-up constants from 0.5.11),
  so of each family only the lowest ``tp_rank`` and ``pp_rank`` of each ``dp_rank`` is read:
  ``tp_rank="0"`` on a plain TP server, the stats-logging rank of each DP group under DP
  attention. Never summed over ranks.
- **Engines.** specwatch's engine is SGLang's ``dp_rank`` (``"0"`` when absent). The tokenizer's
  counters have no ``dp_rank``: they are the whole server's and are read on engine ``"0"``.
- **Counters** are summed over their other labels (``is_streaming``, ``cache_source``,
  ``engine_type`` ...). From 0.5.13 ``sglang:spec_verify_calls_total`` gives vLLM-shaped
  spec-decode counters that are exact over any window: drafts = verify calls, accepted tokens =
  generation tokens − verify calls (every verify emits its accepted drafts plus one bonus token;
  the first token of each request, from prefill, is counted too: a bias of about 1 / verifies
  per request) and draft tokens = verify calls · (N − 1), N from ``sglang:spec_num_draft_tokens``.
- **Interval gauges** (``spec_accept_length``, ``spec_accept_rate``, running, queue, token
  usage) are kept as gauges; the accept-rate formula era read from its HELP text is kept as the
  gauge ``sglang_rate_formula`` (:data:`specwatch.vllm.sglang.RATE_FORMULA_CODES`).

NaN is unknown (absent); ±Inf or a negative counter skips its series, counted in
``invalid_series``; the same series twice with different values is skipped and counted in
``duplicate_conflicts``. A malformed page raises :class:`SglangPageError`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as om_text_string_to_metric_families,
)
from prometheus_client.parser import text_string_to_metric_families

from specwatch.observe.plausible import MAX_NAMED, implausible, sample_text
from specwatch.observe.values import EngineKey, EngineReading, Histogram, PageReading
from specwatch.vllm.families import Family
from specwatch.vllm.sglang import (
    BY_NAME,
    DP_LABEL,
    PIPELINE_LABEL,
    RANK_LABEL,
    RATE_FORMULA_CODES,
    rate_formula,
)


class SglangPageError(ValueError):
    """A malformed SGLang page; ``line`` is 1-based when known (else 0)."""

    def __init__(self, message: str, *, line: int = 0) -> None:
        super().__init__(message)
        self.message = message
        self.line = line


def _sample_roles() -> dict[str, tuple[Family, str]]:
    out: dict[str, tuple[Family, str]] = {}
    for fam in BY_NAME.values():
        if fam.kind == "histogram":
            for suffix in ("bucket", "count", "sum"):
                out[f"{fam.name}_{suffix}"] = (fam, suffix)
        else:
            out[fam.name] = (fam, "value")
    return out


#: Exact sample name → (family, role).
_SAMPLES: dict[str, tuple[Family, str]] = _sample_roles()
#: Names a ``# HELP`` / ``# TYPE`` line of a kept family may carry (OpenMetrics drops ``_total``).
_META: frozenset[str] = frozenset(
    set(BY_NAME) | {n.removesuffix("_total") for n, f in BY_NAME.items() if f.kind == "counter"}
)


def _name_of(line: str) -> str:
    end = len(line)
    for sep in ("{", " ", "\t"):
        i = line.find(sep)
        if 0 <= i < end:
            end = i
    return line[:end]


def _kept(body: str, openmetrics: bool) -> tuple[list[str], list[int]]:
    """The kept lines and their 1-based numbers in ``body``."""
    lines: list[str] = []
    numbers: list[int] = []
    for number, raw in enumerate(body.split("\n"), start=1):
        line = raw.strip()
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            keep = _name_of(line[7:]) in _META
        elif openmetrics and line == "# EOF":
            keep = True
        else:
            keep = line.startswith("sglang:") and _name_of(line) in _SAMPLES
        if keep:
            lines.append(line)
            numbers.append(number)
    return lines, numbers


def _families(text: str, openmetrics: bool) -> list[Metric]:
    if openmetrics:
        om: Iterable[Metric] = om_text_string_to_metric_families(text)  # type: ignore[no-untyped-call]
        return list(om)
    return list(text_string_to_metric_families(text))


def _parse(lines: list[str], numbers: list[int], openmetrics: bool) -> list[Metric]:
    text = "\n".join(lines) + "\n"
    try:
        return _families(text, openmetrics)
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        where = 0
        for line, number in zip(lines, numbers, strict=True):
            if line.startswith("#"):
                continue
            try:
                _families(line + "\n" + ("# EOF\n" if openmetrics else ""), openmetrics)
            except (ValueError, IndexError, KeyError, TypeError):
                where = number
                break
        raise SglangPageError(f"malformed exposition: {exc}", line=where) from None


def _rank(labels: dict[str, str], name: str) -> int:
    try:
        return int(labels.get(name, "0"))
    except ValueError:
        return 0


class _Acc:
    __slots__ = ("buckets", "counters", "gauges", "hcount", "hsum")

    def __init__(self) -> None:
        self.counters: dict[str, float] = {}
        self.gauges: dict[str, float] = {}
        self.buckets: dict[str, dict[float, float]] = {}
        self.hcount: dict[str, float] = {}
        self.hsum: dict[str, float] = {}


def parse_sglang_page(body: str, *, openmetrics: bool = False) -> PageReading:
    """Parse one SGLang ``/metrics`` body (see the module docstring for every rule)."""
    lines, numbers = _kept(body, openmetrics)
    metrics = _parse(lines, numbers, openmetrics)
    era_code: float | None = None
    samples: list[tuple[Family, str, dict[str, str], float]] = []
    for metric in metrics:
        if metric.name in ("sglang:spec_accept_rate",):
            era = rate_formula(metric.documentation or "")
            era_code = None if era is None else RATE_FORMULA_CODES[era]
        for s in metric.samples:
            got = _SAMPLES.get(s.name)
            if got is not None:
                samples.append((got[0], got[1], dict(s.labels), float(s.value)))
    # the one rank read per family and dp_rank: the lowest (pp_rank, tp_rank)
    lowest: dict[tuple[str, str, str], tuple[int, int]] = {}
    for fam, _, labels, _ in samples:
        if RANK_LABEL not in labels:
            continue
        group = (fam.name, labels.get("model_name", ""), labels.get(DP_LABEL, "0"))
        rank = (_rank(labels, PIPELINE_LABEL), _rank(labels, RANK_LABEL))
        if group not in lowest or rank < lowest[group]:
            lowest[group] = rank
    seen: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    conflicts: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    kept: list[tuple[Family, str, dict[str, str], float]] = []
    invalid = 0
    for fam, role, labels, value in samples:
        if RANK_LABEL in labels:
            group = (fam.name, labels.get("model_name", ""), labels.get(DP_LABEL, "0"))
            if (_rank(labels, PIPELINE_LABEL), _rank(labels, RANK_LABEL)) != lowest[group]:
                continue
        ident = (fam.name + "_" + role, tuple(sorted(labels.items())))
        if ident in seen:
            if seen[ident] != value and not (math.isnan(value) and math.isnan(seen[ident])):
                conflicts.add(ident)
            continue
        seen[ident] = value
        kept.append((fam, role, labels, value))
    engines: dict[EngineKey, _Acc] = {}
    names: set[str] = set()
    refused: list[str] = []
    for fam, role, labels, value in kept:
        ident = (fam.name + "_" + role, tuple(sorted(labels.items())))
        names.add(fam.name)  # present even when skipped below: invalid, never missing
        if ident in conflicts:
            continue
        if implausible(value, counter=fam.kind != "gauge"):
            refused.append(sample_text(ident[0], ident[1], value))
            continue
        if value != value:
            continue  # NaN: unknown
        if math.isinf(value) or (fam.kind != "gauge" and value < 0):
            invalid += 1
            continue
        le = labels.get("le", "")
        if role == "bucket":
            try:
                bound = float(le)
            except ValueError:
                invalid += 1
                continue
        key: EngineKey = (labels.get("model_name", ""), labels.get(DP_LABEL, "0"))
        acc = engines.get(key)
        if acc is None:
            acc = engines[key] = _Acc()
        if role == "bucket":
            b = acc.buckets.setdefault(fam.key, {})
            b[bound] = b.get(bound, 0.0) + value
        elif role == "count":
            acc.hcount[fam.key] = acc.hcount.get(fam.key, 0.0) + value
        elif role == "sum":
            acc.hsum[fam.key] = acc.hsum.get(fam.key, 0.0) + value
        elif fam.kind == "gauge":
            acc.gauges[fam.key] = acc.gauges.get(fam.key, 0.0) + value
        else:
            acc.counters[fam.key] = acc.counters.get(fam.key, 0.0) + value
    return PageReading(
        engines={key: _freeze(acc, era_code) for key, acc in sorted(engines.items())},
        duplicate_conflicts=len(conflicts),
        duplicates=tuple(sample_text(i[0], i[1], seen[i]) for i in sorted(conflicts)[:MAX_NAMED]),
        families=frozenset(names),
        invalid_series=invalid,
        engine_kind="sglang",
        implausible_series=len(refused),
        implausible=tuple(refused[:MAX_NAMED]),
    )


def _freeze(acc: _Acc, era_code: float | None) -> EngineReading:
    counters = dict(acc.counters)
    gauges = dict(acc.gauges)
    if era_code is not None and "sglang_accept_rate" in gauges:
        gauges["sglang_rate_formula"] = era_code
    verify = counters.pop("sglang_verify_calls", None)
    generated = counters.get("generation_tokens")
    if verify is not None and generated is not None:
        counters["drafts"] = verify
        counters["accepted_tokens"] = max(generated - verify, 0.0)
        n = gauges.get("sglang_num_draft_tokens")
        if n is not None and n >= 2:
            counters["draft_tokens"] = verify * (n - 1)
    hists: dict[str, Histogram] = {}
    for key, buckets in acc.buckets.items():
        if math.inf not in buckets:
            continue
        hists[key] = Histogram(
            tuple(sorted(buckets.items())), acc.hcount.get(key), acc.hsum.get(key)
        )
    for key in ("itl", "ttft"):
        if key in acc.hsum and key in acc.hcount:
            counters[f"{key}_sum"] = acc.hsum[key]
            counters[f"{key}_count"] = acc.hcount[key]
    return EngineReading(
        counters=counters, per_position={}, gauges=gauges, waiting_by_reason={}, histograms=hists
    )
