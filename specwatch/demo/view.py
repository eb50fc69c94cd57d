"""The demo's live view: a pure function of the ``/api/v1/snapshot`` document, drawn with rich.

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from specwatch.core.config import OVERALL, SINCE_START
from specwatch.export.json import snapshot_json
from specwatch.export.snapshot import Snapshot
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
    ``alert_notes`` (alert name → "after N pairs, T s" when the view first saw it firing)."""

    title: str
    base: str
    standard_url: str
    fly_url: str
    notes: tuple[str, ...] = ()
    alert_notes: Mapping[str, str] = field(default_factory=dict)


def _line(text: str | Text, style: str = "") -> Text:
    t = text if isinstance(text, Text) else Text(text, style=style)
    t.no_wrap = True
    t.overflow = "ellipsis"
    return t


def _num(v: Any, fmt: str = ".3f") -> str:
    if isinstance(v, bool) or v is None:
        return "-" if v is None else ("yes" if v else "no")
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return "-" if not math.isfinite(v) else format(v, fmt)
    return str(v)


def _int(v: Any) -> str:
    return "-" if not isinstance(v, int | float) or isinstance(v, bool) else f"{round(v):,}"


def _rate(num: Any, den: Any) -> str:
    if not isinstance(num, int | float) or not isinstance(den, int | float) or den <= 0:
        return "-"
    return f"{100.0 * num / den:.1f} %"


def _pick_window(windows: Mapping[str, Any], wanted: str) -> str | None:
    if wanted in windows:
        return wanted
    return next(iter(windows), None)


def _targets_table(doc: Mapping[str, Any], window: str, wide: bool) -> Table:
    table = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 1), header_style="dim")
    for name in ("target", "up", "α", "τ", "tok/s", "run/max", "wait"):
        table.add_column(name, no_wrap=True, overflow="ellipsis")
    if wide:
        table.add_column("α per engine", no_wrap=True, overflow="ellipsis")
    for name, t in (doc.get("targets") or {}).items():
        w = _pick_window(t.get("windows") or {}, window)
        win = ((t.get("windows") or {}).get(w) or {}) if w else {}
        server = win.get("server") or {}
        cap = t.get("capacity") or {}
        running = cap.get("num_requests_running")
        if running is None:
            running = server.get("num_requests_running")
        row = [
            str(name),
            "up" if t.get("up") else ("stale" if t.get("stale") else "down"),
            _num(server.get("acceptance_rate")),
            _num(server.get("mean_acceptance_length"), ".2f"),
            _int(server.get("generation_tokens_per_second")),
            f"{_int(running)}/{_int((t.get('limits') or {}).get('max_num_seqs'))}",
            _int(server.get("num_requests_waiting")),
        ]
        if wide:
            engines = win.get("engines") or {}
            row.append(
                " ".join(
                    f"e{e}={_num(h.get('acceptance_rate'))}" for e, h in sorted(engines.items())
                )
                or "-"
            )
        table.add_row(*row)
    return table


def _overall(shadow: Mapping[str, Any], window: str) -> tuple[str, Mapping[str, Any]] | None:
    """The ``since_start`` overall summary (its e-value is the anytime-valid one), else
    ``window``'s, else the first window's."""
    windows = shadow.get("windows")
    if not isinstance(windows, Mapping) or not windows:
        return None
    w = next((c for c in (SINCE_START, window) if c in windows), next(iter(windows)))
    cats = windows.get(w) or {}
    s = cats.get(OVERALL) if OVERALL in cats else next(iter(cats.values()), None)
    return (str(w), s) if isinstance(s, Mapping) else None


def _shadow_lines(shadow: Mapping[str, Any], window: str) -> list[Text]:
    found = _overall(shadow, window)
    if found is None:
        return [_line("shadow: waiting for pairs", "dim")]
    w, s = found
    t = s.get("tally") if isinstance(s.get("tally"), Mapping) else {}
    assert isinstance(t, Mapping)
    paired = (t.get("agree") or 0) + (t.get("disagree") or 0)
    noise_n = (t.get("noise_agree") or 0) + (t.get("noise_disagree") or 0)
    e = s.get("e_value")
    alpha = shadow.get("alpha")
    needed = f" of {1 / alpha:g}" if isinstance(alpha, int | float) and alpha > 0 else ""
    lines = [
        _line(
            f"pairs ({w}) {_int(paired)}, labelled {_int(s.get('n'))}: "
            f"lost {_int(s.get('lost'))} gained {_int(s.get('gained'))}; "
            f"e-value {e_value_text(float(e)) if isinstance(e, int | float) else 'n/a'}{needed}"
        ),
        _line(
            f"flips vs standard: FLy {_rate(t.get('disagree'), paired)}, "
            f"noise floor {_rate(t.get('noise_disagree'), noise_n)}; "
            f"fixed-n McNemar p {_num(s.get('p_loss'), '.2g')}"
        ),
    ]
    io_state = shadow.get("io")
    if isinstance(io_state, Mapping):
        paused = sorted(r for r, on in (io_state.get("paused") or {}).items() if on)
        dropped = sum(v for v in (io_state.get("dropped_total") or {}).values() if v)
        unpaired = shadow.get("unpaired_total")
        lost = (
            sum(v for v in unpaired.values() if isinstance(v, int | float))
            if isinstance(unpaired, Mapping)
            else 0
        )
        lines.append(
            _line(
                f"replay: in flight {_int(io_state.get('in_flight'))}, "
                f"queued {_int(io_state.get('queue_depth'))}, "
                f"paused {','.join(paused) if paused else 'no'}, "
                f"dropped {_int(dropped)}, unpaired {_int(lost)}",
                "dim",
            )
        )
    return lines


def _alert_lines(alerts: Sequence[Any], notes: Mapping[str, str]) -> list[Text]:
    if not alerts:
        return [_line("alerts: none firing", "green")]
    out = [_line(f"alerts: {len(alerts)} firing", "bold red")]
    for a in alerts:
        labels = a.get("labels", {}) if isinstance(a, Mapping) else {}
        name = str(labels.get("alertname", "?"))
        sev = str(labels.get("severity", ""))
        note = notes.get(name)
        rest = " ".join(
            f"{k}={v}" for k, v in sorted(labels.items()) if k not in ("alertname", "severity")
        )
        text = f"  {name} [{sev}]" + (f" {note}" if note else "") + (f" {rest}" if rest else "")
        out.append(_line(text, "red"))
    return out


def _load_line(load: Mapping[str, Any]) -> Text:
    errors = load.get("errors") or {}
    err = sum(errors.values()) if isinstance(errors, Mapping) else 0
    acc = ", ".join(
        f"{role} {c}/{g}" for role, (c, g) in sorted((load.get("canary") or {}).items())
    )
    mirrored = load.get("mirrored")
    return _line(
        f"load: sent {_int(load.get('sent', 0))}, ok {_int(load.get('ok', 0))}, errors {err}"
        + (f", mirrored {_int(mirrored)}" if mirrored is not None else "")
        + (f"; canary right: {acc}" if acc else ""),
        "dim",
    )


def build_view(
    doc: Mapping[str, Any],
    ctx: ViewContext,
    *,
    width: int,
    window: str = "1m",
    load: Mapping[str, Any] | None = None,
) -> RenderableType:
    """The live view for a ``/api/v1/snapshot`` document (``snapshot_json``) at ``width``.

    Lines: the title; the sidecar's URLs; the simulators' URLs; the fault command (one line);
    ``ctx.notes``; one table row per target (up, α, τ, generation tokens/s of ``window`` — the
    first window the target has when ``window`` is missing — most-loaded engine's running /
    max_num_seqs, waiting; α per engine when ``width`` >= :data:`NARROW_BELOW`); the pair line
    (α gain, τ and total tokens/s changes in ``%``: the demo sends both servers the same
    traffic); the verdict sentence (``doc["verdict"]``); the shadow
    lines (pairs, e-value against 1/α, flip rates, the fixed-n p-value; replay state) when
    ``doc["shadow"]`` has windows; ``load`` (sent, ok, errors, canary right/graded per role);
    the alerts (``doc["alerts"]``) with ``ctx.alert_notes`` when the document has that key.
    """
    wide = width >= NARROW_BELOW
    parts: list[RenderableType] = [
        _line(ctx.title, "bold"),
        _line(f"sidecar {ctx.base}  /metrics  /api/v1/snapshot", "cyan"),
        _line(f"standard {ctx.standard_url}  fly {ctx.fly_url}", "cyan"),
        _line("inject a fault (one line):", "dim"),
        _line(fault_command(ctx.fly_url)),
        *(_line(n, "dim") for n in ctx.notes),
        _targets_table(doc, window, wide),
    ]
    pair = doc.get("pair") or {}
    pw = _pick_window(pair, window)
    if pw is not None:
        p = pair[pw] or {}
        gain = p.get("acceptance_gain_ratio")
        parts.append(
            _line(
                f"FLy vs standard ({pw}): α "
                f"{'-' if not isinstance(gain, int | float) else format(gain, '+.3f')}, "
                f"τ {change_percent(p.get('mean_acceptance_length_ratio'))}, "
                f"tok/s {change_percent(p.get('throughput_ratio'))} (equal traffic)"
            )
        )
    verdict = doc.get("verdict")
    if isinstance(verdict, str) and verdict:
        parts.append(Text(verdict, style="bold", overflow="ellipsis"))
    shadow = doc.get("shadow")
    if isinstance(shadow, Mapping) and shadow:
        parts.extend(_shadow_lines(shadow, window))
    if load is not None:
        parts.append(_load_line(load))
    if "alerts" in doc:
        alerts = doc.get("alerts")
        parts.extend(_alert_lines(alerts if isinstance(alerts, list) else [], ctx.alert_notes))
    return Group(*parts)


def render_text(renderable: RenderableType, *, width: int) -> str:
    """``renderable`` as plain text ``width`` columns wide (no escapes, trailing spaces cut)."""
    buf = io.StringIO()
    console = Console(
        file=buf, width=width, color_system=None, force_terminal=False, legacy_windows=False
    )
    console.print(renderable)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines())


def view_document(snap: Snapshot) -> dict[str, Any]:
    """``snapshot_json(snap)`` without the ``shadow``/``alerts`` placeholders that no component
    has published yet (so the view shows those sections only once a component provides them)."""
    doc = snapshot_json(snap)
    if snap.shadow is None:
        doc.pop("shadow", None)
    if snap.alerts is None:
        doc.pop("alerts", None)
    return doc


def load_summary(
    stats: LoadStats, roles: Mapping[str, str], *, mirror: bool = False
) -> dict[str, Any]:
    """The ``load`` mapping :func:`build_view` shows; ``roles`` maps base URL → role name;
    ``mirror``: include the count of mirrored copies."""
    out: dict[str, Any] = {
        "sent": stats.sent,
        "ok": stats.ok,
        "errors": dict(stats.errors),
        "canary": {
            role: (stats.correct.get(url, 0), stats.graded.get(url, 0))
            for url, role in roles.items()
        },
    }
    if mirror:
        out["mirrored"] = stats.mirrored
    return out
