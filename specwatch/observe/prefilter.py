"""The line pre-filter of a vLLM ``/metrics`` page (pure): which lines of the page belong to an
allow-listed family (:data:`~specwatch.vllm.families.FAMILIES`, by exact sample name), read
line by line or, for pages from 128 KiB, family block by family block; used by
:mod:`specwatch.observe.parse` before prometheus_client parses what is kept."""

from __future__ import annotations

from collections.abc import Iterable

from specwatch.vllm.families import FAMILIES, Family


def _sample_names(fam: Family) -> dict[str, str]:
    """Exact sample names of a family → suffix role (``value``/``bucket``/``count``/``sum``)."""
    if fam.kind == "histogram":
        return {
            fam.name + "_bucket": "bucket",
            fam.name + "_count": "count",
            fam.name + "_sum": "sum",
        }
    return {fam.name: "value"}


#: Exact sample name → (family, role).
SAMPLES: dict[str, tuple[Family, str]] = {
    sample: (fam, role) for fam in FAMILIES for sample, role in _sample_names(fam).items()
}

#: Samples not needed in the plain text format (validated by the full page only in OpenMetrics,
#: whose parser needs whole histograms): engine steps need only ``_count``. ITL and TTFT keep
#: ``_bucket`` (quantiles) and ``_sum`` / ``_count`` (means).
_TEXT_SKIP: frozenset[str] = frozenset(
    {
        "vllm:iteration_tokens_total_bucket",
        "vllm:iteration_tokens_total_sum",
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


KEEP_TEXT = _prefixes(n for n in SAMPLES if n not in _TEXT_SKIP)
_KEEP_OPENMETRICS = _prefixes(SAMPLES)


def kept(line: str, keep: tuple[tuple[str, ...], tuple[str, ...]], openmetrics: bool) -> bool:
    if line.startswith(keep[0]):
        return True
    if line.startswith("# TYPE"):
        return line.startswith(keep[1])
    return openmetrics and line.rstrip() == "# EOF"


_FIRST_TEXT: tuple[str, ...] = tuple(
    sorted({n.split(":")[0] + (":" if ":" in n else "") for n in SAMPLES} | {"# TYPE "})
)


#: Exact sample names kept in the plain text format.
NAMES_TEXT: frozenset[str] = frozenset(n for n in SAMPLES if n not in _TEXT_SKIP)


def _kept_lines_each(text: str, out: list[str]) -> None:
    """Append the kept lines of ``text`` to ``out``, line by line, in order (see
    :func:`prefilter`).

    Same rule as the prefix test, faster: a line with a ``{`` and no blank before it has the
    name ``line[:line.index("{")]``, looked up in a set; other lines take the prefix test.
    """
    samples, types = KEEP_TEXT
    first = _FIRST_TEXT
    names = NAMES_TEXT
    for ln in text.split("\n"):
        brace = ln.find("{")
        if brace > 0:
            name = ln[:brace]
            if name in names:
                out.append(ln)
                continue
            if " " not in name and "\t" not in name:
                continue  # the name is exactly ``name``, not allow-listed
        if ln.startswith(first) and (
            ln.startswith(samples) or (ln.startswith("# TYPE") and ln.startswith(types))
        ):
            out.append(ln)


_TYPE_SPLIT = "\n# TYPE "
#: Pages from this size on are cut into family blocks (:func:`kept_text_lines`); smaller ones,
#: a one-engine page of about 50 KiB, are read line by line, which costs as little there and
#: needs no per-family set-up on a process's first page.
_BLOCKWISE_BYTES = 128 << 10
#: Family name of a TYPE line → True when a block of that family can hold no kept line.
_SKIPPABLE: dict[str, bool] = {}


def _skippable(name: str) -> bool:
    """True when no kept line can start with ``name``: a metric name that is no kept family
    (so its TYPE line is not kept) and no kept sample name begins with (so none of its sample
    lines is kept)."""
    got = _SKIPPABLE.get(name)
    if got is None:
        got = (
            name.isascii()
            and name.replace(":", "_").isidentifier()  # a metric name: [a-zA-Z_:][a-zA-Z0-9_:]*
            and name not in _META_NAMES
            and not any(n.startswith(name) for n in NAMES_TEXT)
        )
        if len(_SKIPPABLE) < 4096:
            _SKIPPABLE[name] = got
    return got


def _name_end(text: str) -> int:
    """Index of the first blank, tab or newline in ``text`` (its length when none)."""
    end = len(text)
    for ch in " \t\n":
        i = text.find(ch, 0, end)
        if i >= 0:
            end = i
    return end


def kept_text_lines(body: str) -> list[str]:
    """Kept lines of a plain-text page, in page order (see :func:`prefilter`).

    The page is cut before each ``# TYPE`` line (prometheus_client, like every exposition
    library, writes each family as one block: its HELP and TYPE lines, then its samples). A
    block whose TYPE line names a family no kept line can start with (:func:`_skippable`) and
    whose every other line is a comment or starts with that name (counted with ``str.count``,
    not read line by line) holds no kept line and is skipped whole; any other block, and the
    text before the first TYPE line, is read line by line (:func:`_kept_lines_each`). So the
    result is exactly the line-by-line one, at a fraction of the cost on pages of many
    families specwatch does not read. Likewise a block whose every other line is a comment or
    starts with ``<kept sample name>{`` (a kept name starting with the family's name) is kept
    whole without the per-line test: each such line would pass it, and no comment but a TYPE
    line is ever kept.
    """
    out: list[str] = []
    if len(body) < _BLOCKWISE_BYTES:
        _kept_lines_each(body, out)
        return out
    chunks = body.split(_TYPE_SPLIT)
    _kept_lines_each(chunks[0], out)
    types = KEEP_TEXT[1]
    for chunk in chunks[1:]:
        token = chunk[: _name_end(chunk)]
        lines = chunk.count("\n") - chunk.endswith("\n")
        if _skippable(token):
            if chunk.count("\n" + token) + chunk.count("\n#") == lines:
                continue
        else:
            kept = _KEPT_STARTING.get(token)
            if kept is None:
                kept = _kept_starting(token)
            if kept and sum(chunk.count(f"\n{n}{{") for n in kept) + chunk.count("\n#") == lines:
                # every line but the TYPE line is a comment or a sample of a kept name
                parts = chunk.split("\n")
                head = "# TYPE " + parts[0]
                if head.startswith(types):
                    out.append(head)
                out.extend([p for p in parts[1:] if p and p[0] != "#"])
                continue
        _kept_lines_each("# TYPE " + chunk, out)
    return out


#: Family name of a TYPE line → the kept sample names that start with it.
_KEPT_STARTING: dict[str, tuple[str, ...]] = {}


def _kept_starting(name: str) -> tuple[str, ...]:
    """The kept sample names (plain text format) that start with ``name``, memoised."""
    got = tuple(sorted(n for n in NAMES_TEXT if n.startswith(name))) if name else ()
    if len(_KEPT_STARTING) < 4096:
        _KEPT_STARTING[name] = got
    return got


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
        return "\n".join([ln for ln in body.split("\n") if kept(ln, keep, True)]) + "\n"
    return "\n".join(kept_text_lines(body)) + "\n"


def kept_line_numbers(body: str, *, openmetrics: bool = False) -> list[int]:
    """1-based line numbers in ``body`` of the lines :func:`prefilter` keeps (for errors)."""
    keep = _KEEP_OPENMETRICS if openmetrics else KEEP_TEXT
    return [n for n, ln in enumerate(body.split("\n"), start=1) if kept(ln, keep, openmetrics)]
