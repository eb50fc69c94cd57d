"""The demo's live view: a pure function of the published :class:`Snapshot`, drawn with rich.

It reads the typed values themselves (the observe view's targets and pair views, the shadow
chain's :class:`~specwatch.shadow.published.ShadowStats`, the alert loop's
:class:`~specwatch.alerts.values.AlertingState`), never the ``/api/v1/snapshot`` JSON made from
them; a part no component has published yet (``None``) has no section.
:func:`build_view` returns a rich renderable sized for the terminal: every line is cut with an
ellipsis rather than wrapped (only the verdict sentence wraps, between words), the header and
the URLs come first, and the fault command is one line (77 columns with a 5-digit port, so it
copies whole on an 80-column terminal). Below 110 columns the per-engine α column is dropped
(the narrow layout). :func:`render_text` renders it to plain text (no escapes) for a pipe or a
test; the demo's runner draws it in place with :class:`rich.live.Live` on a terminal.

Units: α and τ as measured; speed changes and flip rates as ``%``; accuracy differences in
points (the verdict, :func:`specwatch.shadow.verdict.verdict_line`, computed by the snapshot).
The e-value is the decision signal; McNemar's p is labelled fixed-n.
"""

from __future__ import annotations

import io
import json
import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from specwatch.alerts.values import FiringAlert
from specwatch.core.config import OVERALL, SINCE_START
from specwatch.export.json import snapshot_verdict
from specwatch.export.snapshot import Snapshot
from specwatch.observe.values import Health, ModelWindow, TargetSnapshot
from specwatch.shadow.decision import tau_coverage_by_category
from specwatch.shadow.published import PairedSummary, ShadowStats
from specwatch.shadow.stats.policy import NO_NET_LOSS
from specwatch.shadow.verdict import change_percent, e_value_text
from specwatch.simulate.loadgen import LoadStats

#: Below this width the view uses its narrow layout (no per-engine α column).
NARROW_BELOW = 110

#: The fault the view offers: FLy waives far more rejections (a real quality loss).
FAULT_BODY: Mapping[str, float] = {"fly_entropy_threshold": 0.05}


def fault_command(fly_url: str) -> str:
    """The one-line ``curl`` that injects :data:`FAULT_BODY` into the FLy simulator at
    ``fly_url`` (``http://`` dropped: curl assumes it), e.g. ``curl -X POST
    127.0.0.1:41232/admin/faults -d '{"fly_entropy_threshold":0.05}'``."""
    host = fly_url.removeprefix("http://").rstrip("/")
    body = json.dumps(dict(FAULT_BODY), separators=(",", ":"))
    return f"curl -X POST {host}/admin/faults -d '{body}'"


@dataclass(frozen=True, slots=True)
class ViewContext:
    """What the view shows besides the snapshot: ``title`` (first line), the sidecar's
    ``base`` URL, the simulators' URLs, ``notes`` (extra one-liners, e.g. the ledger path) and
    ``alert_notes`` (alert name → "after N pairs, T s" when the view first saw it firing);
    ``status``: what the demo changed by itself (e.g. its load raised for a fault), shown under
    the title and never dropped."""

    title: str
    base: str
    standard_url: str
    fly_url: str
    notes: tuple[str, ...] = ()
    alert_notes: Mapping[str, str] = field(default_factory=dict)
    status: str = ""


def _line(text: str | Text, style: str = "") -> Text:
    t = text if isinstance(text, Text) else Text(text, style=style)
    t.no_wrap = True
    t.overflow = "ellipsis"
    return t


def _num(v: float | None, fmt: str = ".3f") -> str:
    return format(v, fmt) if v is not None and math.isfinite(v) else "-"


def _int(v: float | None) -> str:
    return f"{round(v):,}" if v is not None and math.isfinite(v) else "-"


def _rate(num: int, den: int) -> str:
    return "-" if den <= 0 else f"{100.0 * num / den:.1f} %"


def _pick_window(windows: Mapping[str, object], wanted: str) -> str | None:
    if wanted in windows:
        return wanted
    return next(iter(windows), None)


def _only_model(t: TargetSnapshot, window: str | None) -> ModelWindow | None:
    """The target's only model in ``window`` (``None`` with several models or none yet: the
    snapshot document shows no ``server`` then)."""
    models = t.windows[window] if window is not None else {}
    return next(iter(models.values())) if len(models) == 1 else None


def _targets_table(targets: Mapping[str, TargetSnapshot], window: str, wide: bool) -> Table:
    table = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 1), header_style="dim")
    for name in ("target", "up", "α", "τ", "cov", "tok/s", "run/max", "wait"):
        table.add_column(name, no_wrap=True, overflow="ellipsis")
    if wide:
        table.add_column("α per engine", no_wrap=True, overflow="ellipsis")
    for name, t in targets.items():
        mw = _only_model(t, _pick_window(t.windows, window))
        server = mw.server if mw is not None else Health()
        running = t.capacity.num_requests_running
        if running is None:
            running = server.num_requests_running
        row = [
            name,
            "up" if t.up else ("stale" if t.stale else "down"),
            _num(server.acceptance_rate),
            _num(server.mean_acceptance_length, ".2f"),
            _num(server.speculation_coverage, ".2f"),
            _int(server.generation_tokens_per_second),
            f"{_int(running)}/{_int(t.limits.max_num_seqs)}",
            _int(server.num_requests_waiting),
        ]
        if wide:
            engines = mw.engines if mw is not None else {}
            row.append(
                " ".join(f"e{e}={_num(h.acceptance_rate)}" for e, h in sorted(engines.items()))
                or "-"
            )
        table.add_row(*row)
    return table


def _overall(stats: ShadowStats, window: str) -> tuple[str, PairedSummary] | None:
    """The ``since_start`` overall summary (its e-value is the anytime-valid one), else
    ``window``'s, else the first window's."""
    windows = stats.windows
    if not windows:
        return None
    w = next((c for c in (SINCE_START, window) if c in windows), next(iter(windows)))
    cats = windows[w]
    s = cats[OVERALL] if OVERALL in cats else next(iter(cats.values()), None)
    return None if s is None else (w, s)


def _shadow_lines(stats: ShadowStats, window: str) -> list[Text]:
    found = _overall(stats, window)
    if found is None:
        return [_line("shadow: waiting for pairs", "dim")]
    w, s = found
    t = s.tally
    paired = t.agree + t.disagree
    noise_n = t.noise_agree + t.noise_disagree
    # the e-value is anytime-valid since start only; beside it the overall page's bound
    evidence = ""
    if w == SINCE_START:
        e = e_value_text(s.e_value) if math.isfinite(s.e_value) else "n/a"
        alpha = stats.alpha
        ok = math.isfinite(alpha) and 0 < alpha < 1
        needed = f" of {stats.policy.level(OVERALL, NO_NET_LOSS):g}" if ok else ""
        evidence = f"; e-value {e}{needed}"
    lines = [
        _line(
            f"pairs ({w}) {_int(paired)}, labelled {_int(s.n)}: "
            f"lost {_int(s.lost)} gained {_int(s.gained)}{evidence}"
        ),
        _line(
            f"flips vs standard: FLy {_rate(t.disagree, paired)}, "
            f"noise floor {_rate(t.noise_disagree, noise_n)}; "
            f"fixed-n McNemar p {_num(s.p_loss, '.2g')}"
        ),
    ]
    io_state = stats.io
    if io_state is not None:
        paused = sorted(r for r, on in io_state.paused.items() if on)
        dropped = sum(io_state.dropped.values())
        unpaired = sum(stats.unpaired_total.values())
        lines.append(
            _line(
                f"replay: in flight {_int(io_state.in_flight)}, "
                f"queued {_int(io_state.queue_depth)}, "
                f"paused {','.join(paused) if paused else 'no'}, "
                f"dropped {_int(dropped)}, unpaired {_int(unpaired)}",
                "dim",
            )
        )
        if io_state.pause_text:
            lines.append(_line(f"{io_state.pause_text} (canary trickle: {io_state.trickled})"))
    return lines


def _coverage_line(stats: ShadowStats) -> Text | None:
    """Per-request τ coverage per category (pairs where both arms carried τ), overall first;
    ``None`` before the decision table has a row."""
    found = tau_coverage_by_category(stats.decisions)
    if not found:
        return None
    cells = [f"{'all' if c == OVERALL else c} {_rate(k, n)}" for c, n, k in found]
    return _line("τ coverage: " + ", ".join(cells), "dim")


def alert_name(alert: FiringAlert) -> str:
    """The ``alertname`` label of a firing alert (``?`` without one)."""
    return alert.labels.get("alertname", "?")


#: Labels shown first on an alert's row (after those that tell same-named alerts apart).
_LEAD_LABELS = ("target", "engine", "check", "hypothesis", "category", "reason", "scope")


def _distinguishing(alerts: Sequence[FiringAlert]) -> dict[str, set[str]]:
    """Alert name → the label keys whose values differ among the firing alerts of that name."""
    values: dict[str, dict[str, set[str]]] = {}
    for a in alerts:
        keys = values.setdefault(alert_name(a), {})
        for k, v in a.labels.items():
            keys.setdefault(k, set()).add(v)
    counts: dict[str, int] = {}
    for a in alerts:
        counts[alert_name(a)] = counts.get(alert_name(a), 0) + 1
    out: dict[str, set[str]] = {}
    for name, keys in values.items():
        n = counts[name]
        out[name] = {
            k
            for k, vs in keys.items()
            if len(vs) > 1 or (n > 1 and sum(k in a.labels for a in alerts) < n)
        }
    return out


def alert_row(alert: FiringAlert, distinct: set[str], note: str) -> str:
    """One firing alert's row: name, severity, the labels that tell it apart from same-named
    alerts, then the usual identifying labels (target, engine, check, ...), the view's ``note``
    and the remaining labels, so an 80-column cut keeps what distinguishes it."""
    labels = {k: v for k, v in alert.labels.items() if k not in ("alertname", "severity")}
    lead = sorted(k for k in labels if k in distinct)
    lead += [k for k in _LEAD_LABELS if k in labels and k not in lead]
    rest = sorted(k for k in labels if k not in lead)
    parts = [f"{alert_name(alert)} [{alert.labels.get('severity', '')}]"]
    parts += [f"{k}={labels[k]}" for k in lead]
    if note:
        parts.append(note)
    parts += [f"{k}={labels[k]}" for k in rest]
    return "  " + " ".join(parts)


def _alert_lines(alerts: Sequence[FiringAlert], notes: Mapping[str, str]) -> list[Text]:
    if not alerts:
        return [_line("alerts: none firing", "green")]
    distinct = _distinguishing(alerts)
    out = [_line(f"alerts: {len(alerts)} firing", "bold red")]
    for a in alerts:
        name = alert_name(a)
        out.append(_line(alert_row(a, distinct.get(name, set()), notes.get(name, "")), "red"))
    return out


@dataclass(frozen=True, slots=True)
class LoadSummary:
    """What the view shows of the demo's load: requests ``sent`` and answered ``ok``, ``errors``
    by reason, ``canary`` role → (right, graded) in the order shown, and ``mirrored`` copies
    (``None``: the demo does not mirror)."""

    sent: int
    ok: int
    errors: Mapping[str, int] = field(default_factory=dict)
    canary: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    mirrored: int | None = None


def _load_line(load: LoadSummary) -> Text:
    mirrored = load.mirrored
    return _line(
        f"load: sent {_int(load.sent)}, ok {_int(load.ok)}, "
        f"errors {_int(sum(load.errors.values()))}"
        + (f", mirrored {_int(mirrored)}" if mirrored is not None else ""),
        "dim",
    )


def _canary_line(load: LoadSummary) -> Text | None:
    """Every arm's canary score, short enough for 60 columns with two arms:
    ``canary right: standard 214/242 88 %, fly 200/242 83 %``."""
    if not load.canary:
        return None
    parts = [
        f"{role} {_int(c)}/{_int(g)}" + (f" {100.0 * c / g:.0f} %" if g > 0 else "")
        for role, (c, g) in load.canary.items()
    ]
    return _line("canary right: " + ", ".join(parts))


def _fault_lines(fly_url: str, width: int) -> list[Text]:
    """The fault command: one line when it fits ``width``, else two joined by a shell line
    continuation (both halves still copy and paste as one command)."""
    cmd = fault_command(fly_url)
    if len(cmd) <= width:
        return [_line(cmd)]
    head, _, body = cmd.partition(" -d ")
    return [_line(head + " \\"), _line("  -d " + body)]


#: Under the verdict: where each figure of the screen (the interval, the e-value and its
#: threshold, the speculation limit) is explained in words.
READING_GUIDE = "what each figure means: docs/demo.md#reading-the-screen"

#: Priorities of the view's parts: lower is kept longer when the terminal is short. The
#: verdict, every firing alert and the canary scores are never dropped.
KEEP, TABLE, FAULT, PAIRS, LINKS, DETAIL = range(6)


def _wrapped(text: str, width: int, style: str) -> list[Text]:
    return [_line(t, style) for t in textwrap.wrap(text, width=max(width, 20))] or [_line("")]


def build_view(
    snap: Snapshot,
    ctx: ViewContext,
    *,
    width: int,
    height: int | None = None,
    window: str = "1m",
    load: LoadSummary | None = None,
) -> RenderableType:
    """The live view of the published :class:`Snapshot` at ``width`` × ``height`` (read as
    typed values; ``height`` ``None``: every part).

    Parts, top to bottom: the title; the sidecar's URLs; the simulators' URLs; the fault
    command (one line, two below 77 columns); ``ctx.notes``; one table row per target (up, α,
    τ, generation tokens/s of ``window`` — the first window the target has when ``window`` is
    missing — most-loaded engine's running / max_num_seqs, waiting; α per engine when
    ``width`` >= :data:`NARROW_BELOW`); the pair line (α gain, τ and total tokens/s changes in
    ``%``: the demo sends both servers the same traffic); the verdict sentence
    (:func:`~specwatch.export.json.snapshot_verdict`, wrapped between words); once a component
    published shadow statistics, the shadow lines (pairs, e-value against 1/α, flip rates, the
    fixed-n p-value; replay state; per-request τ coverage per category, the share of pairs
    whose both arms carried τ); ``load`` (sent, ok, errors; then every arm's canary score
    on a line of its own); once the alert loop published its state, the alerts with the labels
    that tell them apart and ``ctx.alert_notes``.

    When the parts do not fit ``height`` lines, whole parts are dropped by priority
    (:data:`DETAIL` first, then :data:`LINKS`, :data:`PAIRS`, :data:`FAULT`, :data:`TABLE`);
    the title, verdict, canary scores and alerts (:data:`KEEP`) stay.
    """
    wide = width >= NARROW_BELOW
    table = _targets_table(snap.targets, window, wide)
    parts: list[tuple[int, list[RenderableType]]] = [
        (KEEP, [_line(ctx.title, "bold")]),
        (KEEP, [_line(ctx.status, "yellow")] if ctx.status else []),
        (LINKS, [_line(f"sidecar {ctx.base}  /metrics  /api/v1/snapshot", "cyan")]),
        (LINKS, [_line(f"standard {ctx.standard_url}  fly {ctx.fly_url}", "cyan")]),
        (DETAIL, [_line("inject a fault (one line):", "dim")]),
        (FAULT, list(_fault_lines(ctx.fly_url, width))),
        (DETAIL, [_line(n, "dim") for n in ctx.notes]),
        (TABLE, [table]),
    ]
    heights: dict[int, int] = {id(table): 1 + len(snap.targets)}
    pw = _pick_window(snap.pair, window)
    if pw is not None:
        p = snap.pair[pw]
        line = _line(
            f"FLy vs standard ({pw}): α {_num(p.acceptance_gain_ratio, '+.3f')}, "
            f"τ {change_percent(p.mean_acceptance_length_ratio)}, "
            f"tok/s {change_percent(p.throughput_ratio)} (equal traffic)"
        )
        parts.append((LINKS, [line]))
    limit = snap.observe.speculation_limit
    if limit is not None and any(c.status != "no_data" for c in limit.comparisons):
        parts.append((DETAIL, list(_wrapped(limit.text, width, "dim"))))
    verdict = snapshot_verdict(snap)
    if verdict:
        parts.append((KEEP, list(_wrapped(verdict, width, "bold"))))
        parts.append((PAIRS, [_line(READING_GUIDE, "dim")]))
    if snap.shadow is not None:
        shadow = _shadow_lines(snap.shadow, window)
        parts.append((PAIRS, [shadow[0]]))
        parts.extend((LINKS if i == 1 else DETAIL, [ln]) for i, ln in enumerate(shadow[1:], 1))
        coverage = _coverage_line(snap.shadow)
        if coverage is not None:
            parts.append((DETAIL, [coverage]))
    if load is not None:
        parts.append((DETAIL, [_load_line(load)]))
        canary = _canary_line(load)
        if canary is not None:
            parts.append((KEEP, [canary]))
    if snap.alerts is not None:
        parts.append((KEEP, list(_alert_lines(snap.alerts.firing, ctx.alert_notes))))

    def rows(items: list[RenderableType]) -> int:
        return sum(heights.get(id(r), 1) for r in items)

    if height is not None:
        for drop in (DETAIL, LINKS, PAIRS, FAULT, TABLE):
            for i in reversed(range(len(parts))):  # the lowest part of that priority first
                if sum(rows(items) for _, items in parts) <= height:
                    break
                if parts[i][0] == drop:
                    del parts[i]
    return Group(*(r for _, items in parts for r in items))


def render_text(renderable: RenderableType, *, width: int) -> str:
    """``renderable`` as plain text ``width`` columns wide (no escapes, trailing spaces cut)."""
    buf = io.StringIO()
    console = Console(
        file=buf, width=width, color_system=None, force_terminal=False, legacy_windows=False
    )
    console.print(renderable)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines())


def load_summary(
    stats: LoadStats, roles: Mapping[str, str], *, mirror: bool = False
) -> LoadSummary:
    """The :class:`LoadSummary` :func:`build_view` shows; ``roles`` maps base URL → role name;
    ``mirror``: include the count of mirrored copies."""
    return LoadSummary(
        sent=stats.sent,
        ok=stats.ok,
        errors=dict(stats.errors),
        canary={
            role: (stats.correct.get(url, 0), stats.graded.get(url, 0))
            for url, role in roles.items()
        },
        mirrored=stats.mirrored if mirror else None,
    )
