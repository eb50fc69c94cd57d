"""Draw the report's plots (matplotlib, Agg, no pyplot state) and write ``index.html``.

Importing this module imports matplotlib, the ``report`` extra; :mod:`.command` (the subcommand)
turns its absence into one error line. Every number in the HTML tables is also written as a
``data-value`` attribute (``repr`` of the float) so tools and tests can read exact values.
"""

from __future__ import annotations

import datetime as dt
import html
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from specwatch.core.config import DEFAULT_MAX_CATEGORIES, OVERALL
from specwatch.shadow.decision import (
    MIN_SPEED_PAIRS,
    arm_speeds,
    arm_tau_means,
    tau_coverage_by_category,
)
from specwatch.shadow.published import PairedSummary
from specwatch.shadow.tally import ArmTotals, arm_decode, arm_decode_intervals
from specwatch.shadow.verdict import (
    Verdict,
    arm_ratios,
    change_percent,
    decode_ratios,
    verdict_from_summary,
    verdict_line,
)
from specwatch.tools.report.data import REPORT_WINDOW, ReportData

#: Plot files written next to ``index.html`` (``per_position.png`` only with an acceptance
#: source that has per-position data).
PLOTS: tuple[str, ...] = ("flips.png", "evalue.png", "net_loss.png", "per_position.png")

#: Elapsed-time units of the over-time plots: (name, seconds, largest span shown in it).
_UNITS: tuple[tuple[str, float, float], ...] = (
    ("seconds", 1.0, 120.0),
    ("minutes", 60.0, 2 * 3600.0),
    ("hours", 3600.0, 2 * 86400.0),
    ("days", 86400.0, math.inf),
)

_LOST, _GAINED, _NET, _FLY_ALT = "#c0392b", "#2e86c1", "#34495e", "#8e44ad"
_DPI = 110


def elapsed_axis(times: Sequence[float], start: float) -> tuple[list[float], float, str]:
    """Unix seconds → time elapsed since ``start``, in one unit chosen from the span.

    Returns ``(x, seconds_per_unit, axis_label)``: seconds up to a 2-minute span, minutes up to
    2 hours, hours up to 2 days, days beyond; the label names the unit and ``start`` in UTC, so
    the axis reads the same way for a 40 s demo ledger and a 30-day one.
    """
    span = max(times, default=start) - start
    unit, scale, _ = next(u for u in _UNITS if span <= u[2])
    label = f"{unit} since the first labelled pair ({_when(start)})"
    return [(t - start) / scale for t in times], scale, label


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def _save(fig: Figure, path: Path) -> None:
    fig.savefig(path, format="png", dpi=_DPI)


#: Draws one over-time plot on ``(fig, ax)`` at ``x`` (elapsed time in one unit), given the
#: seconds per unit.
_TimeDraw = Callable[[Figure, Axes, list[float], float], None]


def _time_plot(data: ReportData, path: Path, title: str, draw: _TimeDraw) -> None:
    """One over-time plot of the flip series: a 9x4 figure, ``draw`` on the elapsed-time axis
    of ``data.flips.times`` (or a "no labelled pairs" note), the title, saved to ``path``."""
    fig = Figure(figsize=(9, 4.0), layout="constrained")
    ax = fig.add_subplot()
    times = data.flips.times
    if not times:
        _empty(ax, "no labelled pairs in the ledger")
    else:
        start = data.first_labelled_time if data.first_labelled_time is not None else times[0]
        x, scale, xlabel = elapsed_axis(times, start)
        draw(fig, ax, x, scale)
        ax.set_xlabel(xlabel)
    ax.set_title(title)
    _save(fig, path)


def plot_flips(data: ReportData, path: Path) -> None:
    """Lost and gained labelled pairs per time bin (bars) and cumulative (lines, right axis)."""
    f = data.flips

    def draw(fig: Figure, ax: Axes, x: list[float], scale: float) -> None:
        span = (f.times[-1] - f.times[0]) / max(len(f.times) - 1, 1) or 60.0
        width = span * 0.4 / scale
        left = [t - width / 2 for t in x]
        right = [t + width / 2 for t in x]
        ax.bar(left, f.lost, width=width, color=_LOST, alpha=0.55, label="lost per bin")
        ax.bar(right, f.gained, width=width, color=_GAINED, alpha=0.55, label="gained per bin")
        ax.set_ylabel("pairs per bin")
        ax2 = ax.twinx()
        ax2.plot(x, f.cum_lost, color=_LOST, lw=2, label="lost (cumulative)")
        ax2.plot(x, f.cum_gained, color=_GAINED, lw=2, label="gained (cumulative)")
        ax2.set_ylabel("cumulative pairs")
        ax2.set_ylim(bottom=0)
        handles = ax.get_legend_handles_labels()
        handles2 = ax2.get_legend_handles_labels()
        fig.legend(
            handles[0] + handles2[0],
            handles[1] + handles2[1],
            loc="outside lower center",
            ncols=4,
            fontsize=8,
            frameon=False,
        )

    _time_plot(data, path, "Flips over time: lost (standard right, FLy wrong) and gained", draw)


def plot_evalue(data: ReportData, path: Path) -> None:
    """Both e-processes (log scale) against the alarm threshold 1/alpha, per labelled pair."""
    _save(evalue_figure(data), path)


def evalue_figure(data: ReportData) -> Figure:
    """The e-value plot (at most ``MAX_POINTS`` points per path, the last pair and the first
    alarms always among them); its legend sits below the axes (``fig.legends[0]``), never over
    the alarm line or the paths."""
    e = data.evalue
    fig = Figure(figsize=(9, 4.2), layout="constrained")
    ax = fig.add_subplot()
    if not e.pair:
        _empty(ax, "no labelled pairs in the ledger")
    else:
        ten = math.log(10.0)
        ax.plot(
            e.pair,
            [v / ten for v in e.log_e_no_net_loss],
            color=_NET,
            lw=1.6,
            label="e-value, H0: no net loss (beta-binomial, discordant pairs)",
        )
        ax.plot(
            e.pair,
            [v / ten for v in e.log_e_margin],
            color=_FLY_ALT,
            lw=1.2,
            ls="--",
            label=f"e-value, H0: net loss ≤ {e.margin:g} (betting)",
        )
        thr = math.log10(e.threshold)
        ax.axhline(thr, color=_LOST, lw=1.2, ls=":", label=f"alarm: e ≥ 1/α = {e.threshold:g}")
        ax.axhline(0.0, color="#999999", lw=0.8)
        for first, color in ((e.first_alarm_no_net_loss, _NET), (e.first_alarm_margin, _FLY_ALT)):
            if first is not None:
                ax.axvline(first, color=color, lw=0.9, alpha=0.6)
                ax.annotate(
                    f"first alarm: pair {first}",
                    (first, thr),
                    xytext=(4, 6),
                    textcoords="offset points",
                    fontsize=8,
                    color=color,
                )
        ax.set_xlabel("labelled pairs (time order)")
        ax.set_ylabel("log10 e-value")
        fig.legend(loc="outside lower center", ncols=2, fontsize=8, frameon=False)
    ax.set_title("Anytime-valid e-value path (alarm when it crosses the threshold)")
    return fig


def plot_net_loss(data: ReportData, path: Path) -> None:
    """Cumulative net loss (points of accuracy) with its Tango score interval and the margin."""
    f = data.flips

    def draw(fig: Figure, ax: Axes, x: list[float], scale: float) -> None:
        ax.fill_between(
            x,
            [100.0 * v for v in f.ci_lower],
            [100.0 * v for v in f.ci_upper],
            color=_NET,
            alpha=0.18,
            label=f"{f.ci_level:.0%} interval (Tango score)",
        )
        ax.plot(
            x,
            [100.0 * v for v in f.net_loss],
            color=_NET,
            lw=2,
            label="net loss = acc(standard) − acc(FLy)",
        )
        ax.axhline(0.0, color="#999999", lw=0.8)
        margin = 100.0 * data.stats.margin
        ax.axhline(margin, color=_LOST, lw=1.2, ls=":", label=f"non-inferiority margin {margin:g}")
        ax.set_ylabel("accuracy points")
        fig.legend(loc="outside lower center", ncols=3, fontsize=8, frameon=False)

    _time_plot(data, path, "Net loss over time (cumulative), with its confidence interval", draw)


def plot_per_position(data: ReportData, path: Path) -> None:
    """Per-position acceptance rate p_i per arm (grouped bars).

    Raises ``ValueError`` when ``data`` has no per-position acceptance (no ``--metrics-url``,
    or a source without it): :func:`render_report` then writes no plot at all.
    """
    acc = data.acceptance
    if acc is None or not acc.arms:
        raise ValueError("no per-position acceptance to plot")
    fig = Figure(figsize=(9, 4.0), layout="constrained")
    ax = fig.add_subplot()
    k = max(len(v) for v in acc.arms.values())
    width = 0.8 / len(acc.arms)
    colors = [_NET, _FLY_ALT, _GAINED, _LOST]
    for j, (label, values) in enumerate(acc.arms.items()):
        xs = [i + (j - (len(acc.arms) - 1) / 2) * width for i in range(len(values))]
        ys = [math.nan if v is None else v for v in values]
        ax.bar(xs, ys, width=width, label=label, color=colors[j % len(colors)], alpha=0.8)
    ax.set_xticks(range(k), [str(i + 1) for i in range(k)])
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance rate")
    ax.set_ylim(0.0, 1.0)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(f"Per-position acceptance per arm (window {acc.window})")
    _save(fig, path)


# -- HTML ---------------------------------------------------------------------------------------


def _fmt(v: float | int | None, kind: str = "g") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if kind == "pct":
        return f"{100.0 * v:.2f}"
    if kind == "pts":
        return f"{100.0 * v:.2f} pts"
    if kind == "rate":
        return f"{100.0 * v:.1f} %"
    if kind == "p":
        return f"{v:.3g}"
    if kind == "int":
        return str(int(v))
    return f"{v:.4g}"


def _cell(field: str, v: float | int | bool | None, text: str | None = None) -> str:
    if isinstance(v, bool):
        raw = "true" if v else "false"
    elif v is None or (isinstance(v, float) and math.isnan(v)):
        raw = ""
    else:
        raw = repr(v)
    shown = text if text is not None else _fmt(v if not isinstance(v, bool) else int(v))
    return f'<td data-field="{field}" data-value="{html.escape(raw)}">{html.escape(shown)}</td>'


_HEADERS: tuple[str, ...] = (
    "category",
    "n",
    "lost",
    "gained",
    "net (gained − lost)",
    "net loss (points)",
    "interval (points)",
    "fixed-n McNemar p (two-sided)",
    "fixed-n p (loss)",
    "e-value (now)",
    "alarm: e ≥ 1/α reached",
    "non-inferiority",
    "FLy flip (% of pairs)",
    "noise flip (% of pairs)",
)


def _category_row(cat: str, s: PairedSummary, margin: float, first_alarm: int | None) -> str:
    shown_cat = "all categories" if cat == OVERALL else cat
    ci = f"[{_fmt(s.ci_lower, 'pct')}, {_fmt(s.ci_upper, 'pct')}]"
    verdict = "pass" if s.non_inferiority_pass else "not shown"
    cells = [
        f'<th scope="row">{html.escape(shown_cat)}</th>',
        _cell("n", s.n),
        _cell("lost", s.lost),
        _cell("gained", s.gained),
        _cell("net", s.net),
        _cell("net_loss_ratio", s.net_loss_ratio, _fmt(s.net_loss_ratio, "pts")),
        f'<td data-field="ci" data-lower="{s.ci_lower!r}" data-upper="{s.ci_upper!r}">'
        f"{html.escape(ci)}</td>",
        _cell("p_two_sided", s.p_two_sided, _fmt(s.p_two_sided, "p")),
        _cell("p_loss", s.p_loss, _fmt(s.p_loss, "p")),
        _cell("e_value", s.e_value, "∞" if math.isinf(s.e_value) else _fmt(s.e_value, "p")),
        _cell(
            "first_alarm", first_alarm, "no" if first_alarm is None else f"at pair {first_alarm}"
        ),
        _cell(
            "non_inferiority_pass",
            s.non_inferiority_pass,
            f"{verdict} (upper {_fmt(s.non_inferiority_upper, 'pts')} vs {100 * margin:g} pts)",
        ),
        _cell("fly_flip_ratio", s.fly_flip_ratio, _fmt(s.fly_flip_ratio, "rate")),
        _cell("noise_flip_ratio", s.noise_flip_ratio, _fmt(s.noise_flip_ratio, "rate")),
    ]
    return f'<tr data-category="{html.escape(cat)}">' + "".join(cells) + "</tr>"


def _decode_interval(ci: tuple[float, float] | None) -> str:
    """`` (95 % interval a to b)`` of one arm's decode tokens/s
    (:func:`~specwatch.shadow.tally.arm_decode_intervals`), or the reason there is none."""
    if ci is None:
        return " (95 % interval: needs 2 streamed pairs)"
    return f" (95 % interval {ci[0]:,.1f} to {ci[1]:,.1f})"


def _interval_attrs(arm: str, ci: tuple[float, float] | None) -> str:
    """The ``data-ARM-lower`` / ``data-ARM-upper`` attributes of a decode interval (none
    without one)."""
    if ci is None:
        return ""
    return f" data-{arm}-lower='{ci[0]!r}' data-{arm}-upper='{ci[1]!r}'"


def _speed_parts(t: ArmTotals) -> str:
    """The verdict's τ and speed parts per arm, from the ledger's per-pair values
    (:func:`~specwatch.shadow.decision.arm_tau_means` and
    :func:`~specwatch.shadow.decision.arm_speeds`, the decision table's functions)."""
    taus, speeds = arm_tau_means(t), arm_speeds(t)
    if taus is None:
        tau = "<span data-field='tau'>Mean acceptance length τ: no pair has it on both arms.</span>"
    else:
        tau = (
            f"<span data-field='tau' data-standard='{taus[0]:.6g}' data-fly='{taus[1]:.6g}'>"
            f"Mean acceptance length τ: standard {taus[0]:.2f}, FLy {taus[1]:.2f} "
            f"({change_percent(taus[1] / taus[0] if taus[0] > 0 else None)}) over "
            f"{t.tau_pairs:,} pairs where both arms reported verify steps (1 + accepted ÷ "
            "steps, summed over the pairs).</span>"
        )
    if speeds is None:
        speed = (
            f"<span data-field='speed'>Speed per request: {t.speed_pairs:,} pairs with tokens "
            f"and latency on both arms (need {MIN_SPEED_PAIRS}).</span>"
        )
    else:
        std_lat, fly_lat = t.standard_seconds / t.speed_pairs, t.fly_seconds / t.speed_pairs
        speed = (
            f"<span data-field='speed' data-standard='{speeds[0]:.6g}' "
            f"data-fly='{speeds[1]:.6g}'>Speed per request (tokens ÷ latency): standard "
            f"{speeds[0]:,.1f} tok/s, FLy {speeds[1]:,.1f} tok/s "
            f"({change_percent(speeds[1] / speeds[0])}); mean latency standard "
            f"{std_lat:.3g} s, FLy {fly_lat:.3g} s ({change_percent(fly_lat / std_lat)}) over "
            f"{t.speed_pairs:,} pairs.</span>"
        )
    dec = arm_decode(t)
    if dec is None:
        decode = (
            "<span data-field='decode'>Decode speed and TTFT: no pair where both arms streamed "
            "(set shadow.stream_arms to time them).</span>"
        )
    else:
        (s_tps, f_tps), (s_ttft, f_ttft) = dec
        s_ci, f_ci = arm_decode_intervals(t)
        decode = (
            f"<span data-field='decode' data-standard='{s_tps:.6g}' data-fly='{f_tps:.6g}' "
            f"data-standard-ttft='{s_ttft:.6g}' data-fly-ttft='{f_ttft:.6g}'"
            f"{_interval_attrs('standard', s_ci)}{_interval_attrs('fly', f_ci)}>"
            f"Decode (tokens after the first ÷ seconds after the first output): standard "
            f"{s_tps:,.1f} tok/s{_decode_interval(s_ci)}, FLy "
            f"{f_tps:,.1f} tok/s{_decode_interval(f_ci)} "
            f"({change_percent(f_tps / s_tps)}); "
            f"TTFT standard {s_ttft:.3g} s, FLy {f_ttft:.3g} s "
            f"({change_percent(f_ttft / s_ttft if s_ttft > 0 else None)}) over "
            f"{t.decode_pairs:,} streamed pairs.</span>"
        )
    return f'<p class="speed-parts">{tau} {speed} {decode}</p>'


def _decision_table(data: ReportData) -> str:
    """The per-category decision table (one row per :class:`DecisionRow`)."""
    head = "".join(
        f"<th>{h}</th>"
        for h in (
            "category",
            "pairs",
            "labelled",
            "τ gain",
            "acceptance gain",
            "throughput gain (%)",
            "net loss (points)",
            "interval (points)",
            "e-value",
            "FLy flip",
            "noise flip",
            "verdict",
        )
    )
    body = []
    for r in data.stats.decisions:
        shown = "all categories" if r.category == OVERALL else r.category
        why = r.throughput_gain_reason
        speed = _fmt(r.throughput_gain_ratio, "pct") if why is None else "–"
        ci = f"{_fmt(r.ci_lower, 'pct')} … {_fmt(r.ci_upper, 'pct')}"
        body.append(
            f'<tr data-decision="{html.escape(r.category)}">'
            f'<th scope="row">{html.escape(shown)}</th>'
            f"{_cell('pairs', r.pairs)}{_cell('labelled', r.labelled)}"
            f"{_cell('tau_gain', r.tau_gain, None if r.tau_gain is not None else '–')}"
            f"{_cell('acceptance_gain', r.acceptance_gain)}"
            f"{_cell('throughput_gain_ratio', r.throughput_gain_ratio, speed)}"
            f"{_cell('net_loss_ratio', r.net_loss_ratio, _fmt(r.net_loss_ratio, 'pct'))}"
            f"{_cell('ci', None, ci)}"
            f"{_cell('e_value', r.e_value, _fmt(r.e_value, 'p'))}"
            f"{_cell('fly_flip_ratio', r.fly_flip_ratio, _fmt(r.fly_flip_ratio, 'pct'))}"
            f"{_cell('noise_flip_ratio', r.noise_flip_ratio, _fmt(r.noise_flip_ratio, 'pct'))}"
            f'<td data-field="verdict" data-value="{r.verdict}">'
            f"{html.escape(r.verdict_text)}</td></tr>"
        )
    notes = sorted(
        {
            f"{name}: {why}"
            for r in data.stats.decisions
            for name, why in (
                ("τ gain", r.tau_gain_reason),
                ("acceptance gain", r.acceptance_gain_reason),
                ("throughput gain", r.throughput_gain_reason),
            )
            if why is not None
        }
    )
    note_html = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return (
        f'<table class="num" id="decisions"><thead><tr>{head}</tr></thead><tbody>'
        f"{''.join(body)}</tbody></table>" + (f"<ul>{note_html}</ul>" if notes else "")
    )


def _coverage_table(data: ReportData) -> str:
    """Per-request τ coverage of the paired rows by arm and finish reason (what the τ gain
    stands for: vLLM reports no per-request metrics on a stop-string finish or for n > 1)."""
    if not data.tau_coverage:
        return ""
    rows_html = []
    for (arm, finish), (rows, with_tau) in sorted(data.tau_coverage.items()):
        share = with_tau / rows if rows else None
        rows_html.append(
            f'<tr data-coverage="{html.escape(arm)}/{html.escape(finish)}">'
            f'<th scope="row">{html.escape(arm)}</th><td>{html.escape(finish)}</td>'
            f"{_cell('rows', rows)}{_cell('with_tau', with_tau)}"
            f"{_cell('coverage', share, _fmt(share, 'pct'))}</tr>"
        )
    body = "".join(rows_html)
    return (
        "<p>Per-request τ coverage: the share of paired replies that carried vLLM's per-request "
        "speculative-decoding metrics, by finish reason. The τ gain above stands for the covered "
        "replies only (vLLM sends none when a stop string ends the request, or for n &gt; 1).</p>"
        '<table class="num" id="tau-coverage"><thead><tr><th>arm</th><th>finish reason</th>'
        f"<th>pairs</th><th>with τ</th><th>coverage (%)</th></tr></thead><tbody>{body}"
        "</tbody></table>"
    )


def _category_coverage_table(data: ReportData) -> str:
    """Per-request τ coverage per category: pairs, pairs where both arms carried τ, share
    (:func:`~specwatch.shadow.decision.tau_coverage_by_category` of the decision table)."""
    found = tau_coverage_by_category(data.stats.decisions)
    if not found:
        return ""
    body = "".join(
        f'<tr data-coverage-category="{html.escape(c)}"><th scope="row">'
        f"{html.escape(c)}</th>{_cell('pairs', n)}{_cell('tau_pairs', k)}"
        f"{_cell('coverage', k / n if n else None, _fmt(k / n if n else None, 'pct'))}</tr>"
        for c, n, k in found
    )
    return (
        "<p>Per category: the share of pairs where both arms carried a per-request τ (the "
        "pairs the τ gain of the decision table is measured on).</p>"
        '<table class="num" id="tau-coverage-category"><thead><tr><th>category</th>'
        f"<th>pairs</th><th>τ on both arms</th><th>coverage (%)</th></tr></thead><tbody>{body}"
        "</tbody></table>"
    )


def _load_table(data: ReportData) -> str:
    """FLy and noise flip rates per running-request band."""
    if not data.stats.by_load:
        return "<p>No running-request counts in the ledger.</p>"
    body = "".join(
        f'<tr data-band="{html.escape(b.band)}"><th scope="row">{html.escape(b.band)}</th>'
        f"{_cell('pairs', b.pairs)}"
        f"{_cell('fly_flip_ratio', b.fly_flip_ratio, _fmt(b.fly_flip_ratio, 'pct'))}"
        f"{_cell('noise_pairs', b.noise_pairs)}"
        f"{_cell('noise_flip_ratio', b.noise_flip_ratio, _fmt(b.noise_flip_ratio, 'pct'))}</tr>"
        for b in data.stats.by_load
    )
    return (
        '<table class="num" id="by-load"><thead><tr><th>running requests</th><th>pairs</th>'
        "<th>FLy flip (%)</th><th>noise pairs</th><th>noise flip (%)</th></tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def _lossless_section(data: ReportData) -> str:
    """The lossless check: the verdict sentence and the flips against the baseline by band."""
    check = data.lossless
    if check is None:
        return ""
    rows = [*check.bands, check.overall]
    body = "".join(
        f'<tr data-lossless-band="{html.escape(b.band)}"><th scope="row">'
        f"{html.escape('all bands' if b is check.overall else b.band)}</th>"
        f"{_cell('pairs', b.pairs)}{_cell('spec_only', b.spec_only)}"
        f"{_cell('noise_only', b.noise_only)}{_cell('both', b.both)}"
        f"{_cell('spec_flip_ratio', b.spec_flip_ratio, _fmt(b.spec_flip_ratio, 'pct'))}"
        f"{_cell('noise_flip_ratio', b.noise_flip_ratio, _fmt(b.noise_flip_ratio, 'pct'))}</tr>"
        for b in rows
    )
    e = check.e_value
    return (
        f'<p class="lossless-verdict" data-field="lossless_verdict" data-value="{check.verdict}">'
        f"{html.escape(check.text)}</p>"
        f'<p>Noise floor <span data-field="lossless_noise_floor">'
        f"{_fmt(check.overall.noise_flip_ratio, 'pct')}</span> %, excess "
        f'<span data-field="lossless_excess">{_fmt(check.excess_flip_ratio, "pct")}</span> '
        f'points, e-value <span data-field="lossless_e_value">'
        f"{'∞' if math.isinf(e) else _fmt(e, 'p')}</span> (alarm at 1/α = {1 / check.alpha:g}, "
        f"at least {check.min_pairs} pairs).</p>"
        '<table class="num" id="lossless"><thead><tr><th>running requests</th><th>pairs</th>'
        "<th>standard only</th><th>noise only</th><th>both</th><th>standard flip (%)</th>"
        f"<th>noise flip (%)</th></tr></thead><tbody>{body}</tbody></table>"
    )


def _points_note(data: ReportData) -> str:
    """Says when the e-value plot shows fewer points than there are labelled pairs."""
    e = data.evalue
    if len(e.pair) >= e.pairs:
        return ""
    return (
        f"Drawn at {len(e.pair):,} of the {e.pairs:,} labelled pairs; the last value and the "
        "first alarms are exact."
    )


def _when(t: float | None) -> str:
    if t is None:
        return "–"
    return dt.datetime.fromtimestamp(t, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _limit_section(data: ReportData) -> str:
    """The sidecar's speculation-limit sentence, as every other surface shows it."""
    acc = data.acceptance
    if acc is None or acc.speculation_limit is None:
        return (
            "<p>Where FLy stops decoding faster per request than the no-speculation baseline "
            "and than the standard arm, as the live view and <code>specwatch advise</code> "
            "say it, needs <code>--metrics-url</code> from a sidecar that watches a FLy and a "
            "standard target (its <code>/api/v1/snapshot</code> gives the whole sentence, its "
            "<code>/metrics</code> the first part of each comparison).</p>"
        )
    return (
        f'<p data-field="speculation_limit">{html.escape(acc.speculation_limit)}</p>'
        f"<p>Source: <code>{html.escape(acc.source)}</code>.</p>"
    )


def _acceptance_table(data: ReportData) -> str:
    acc = data.acceptance
    if acc is None:
        return f"<p>No acceptance source given. {_NEEDS_METRICS}</p>"
    if not acc.arms:
        return (
            f"<p>{html.escape(acc.source)} has no per-position acceptance for window "
            f"{html.escape(acc.window)}. {_NEEDS_METRICS}</p>"
        )
    k = max(len(v) for v in acc.arms.values())
    head = "".join(f"<th>p<sub>{i + 1}</sub></th>" for i in range(k))
    body = []
    for label, values in acc.arms.items():
        tds = "".join(_cell(f"p{i + 1}", values[i] if i < len(values) else None) for i in range(k))
        body.append(
            f'<tr data-arm="{html.escape(label)}">'
            f'<th scope="row">{html.escape(label)}</th>{tds}</tr>'
        )
    return (
        f"<p>Source: <code>{html.escape(acc.source)}</code>, window {html.escape(acc.window)}.</p>"
        f'<table class="num"><thead><tr><th>arm</th>{head}</tr></thead><tbody>'
        + "".join(body)
        + "</tbody></table>"
    )


_NEEDS_METRICS = (
    "Per-position acceptance needs <code>--metrics-url</code>: the sidecar's live URL "
    "(<code>http://HOST:9477/metrics</code>) or a saved <code>/metrics</code> or "
    "<code>/api/v1/snapshot</code> file, e.g. save <code>curl -s localhost:9477/metrics &gt; "
    "metrics.txt</code> while the sidecar runs (during a demo) and pass "
    "<code>--metrics-url metrics.txt</code>."
)

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2em auto;
max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0}
th,td{border:1px solid #ddd;padding:.3em .6em}td{text-align:right;font-variant-numeric:tabular-nums}
thead th{background:#f4f6f8}img{max-width:100%;border:1px solid #eee}
.verdict{font-size:1.1em;padding:.6em 1em;border-radius:4px;background:#f4f6f8}
.alarm{background:#fdecea}.ok{background:#eafaf1}
"""


def render_html(data: ReportData, plots: Sequence[str] = PLOTS) -> str:
    """The report page (self-contained apart from the PNG files named in ``plots``)."""
    st = data.stats
    cats = st.windows.get(REPORT_WINDOW, {})
    overall = cats.get(OVERALL)
    alarms = data.first_alarm
    rows = [
        _category_row(c, s, st.margin, alarms.get(c))
        for c, s in sorted(cats.items(), key=lambda kv: (kv[0] != OVERALL, kv[0]))
    ]
    raised = {c: n for c, n in alarms.items() if n is not None}
    threshold = f"1/α = {1 / st.alpha:g}"
    if raised:
        where = ", ".join(
            f"{'all categories' if c == OVERALL else html.escape(c)} (at pair {n})"
            for c, n in sorted(raised.items(), key=lambda kv: (kv[0] != OVERALL, kv[0]))
        )
        verdict = (
            f'<p class="verdict alarm" data-alarm="true">Alarm: the no-net-loss e-value reached '
            f"{threshold} for {where}. FLy loses more answers than it gains there; the alarm is "
            "anytime-valid, so it stands even if the e-value has fallen since.</p>"
        )
    else:
        now = _fmt(overall.e_value if overall else None, "p")
        verdict = (
            f'<p class="verdict ok" data-alarm="false">No alarm: the no-net-loss e-value never '
            f"reached {threshold}, overall or in any category (overall now {now}).</p>"
        )
    reasons = "".join(
        f"<tr><th scope='row'>{html.escape(s)}</th><td>{html.escape(r)}</td>"
        f"{_cell('count', n)}</tr>"
        for (s, r), n in sorted(data.reasons.items())
    )
    reasons_html = (
        f"<table><thead><tr><th>status</th><th>reason</th><th>rows</th></tr></thead>"
        f"<tbody>{reasons}</tbody></table>"
        if reasons
        else "<p>None.</p>"
    )
    tau_ratio, speed_ratio = arm_ratios(data.arm_totals)
    dec = decode_ratios(data.arm_totals)
    verdict_text = (
        verdict_line(
            verdict_from_summary(
                overall,
                alpha=st.alpha,
                margin=st.margin,
                tau_ratio=tau_ratio,
                throughput_ratio=speed_ratio,
                declared_at=st.within_margin_declared_at,
                decode=dec,
            )
        )
        if overall is not None
        else verdict_line(
            Verdict(
                tau_ratio=tau_ratio,
                throughput_ratio=speed_ratio,
                decode_ratio=dec.decode,
                ttft_ratio=dec.ttft,
                decode_interval=dec.decode_interval,
            )
        )
    )
    imgs = {p: f'<img src="{html.escape(p)}" alt="{html.escape(p)}">' for p in plots}
    head = "".join(f"<th>{html.escape(h)}</th>" for h in _HEADERS)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>specwatch report: FLy vs standard</title><style>{_CSS}</style></head>
<body>
<h1>specwatch report: FLy vs standard, paired outcomes</h1>
<p>Ledger <code>{html.escape(data.ledger)}</code>: <span data-field="rows">{data.rows}</span> rows
from {_when(data.first_time)} to {_when(data.last_time)}. α = {st.alpha:g},
non-inferiority margin {st.margin:g} (in accuracy points: {100 * st.margin:g}),
intervals at {1 - st.alpha:.0%}.</p>
<p class="verdict-line" data-field="verdict">{html.escape(verdict_text)}</p>
{_speed_parts(data.arm_totals)}
{verdict}
<h2>Per category</h2>
<p>Labelled pairs only (both arms answered, gold known). lost = standard right and FLy wrong;
net loss = (lost − gained) / n in accuracy points; exact McNemar p on the discordant pairs;
Tango score interval; non-inferiority passes when the upper bound is below the margin. Each
category is tested at level α on its own (no correction across categories).</p>
<table class="num" id="categories"><thead><tr>{head}</tr></thead><tbody>
{"".join(rows)}
</tbody></table>
<h2>Decision per category</h2>
<p>Since start; the {DEFAULT_MAX_CATEGORIES} busiest categories, the rest pooled as
<code>other</code>. τ gain = mean per-request acceptance length of FLy minus the standard arm's;
throughput gain = FLy's completion tokens per replay second over the standard arm's, minus 1.
<em>FLy pays here</em>: non-inferior within the margin and faster; <em>FLy costs quality
here</em>: the e-value reached 1/α; otherwise the labelled pairs still needed (Connor 1987 at
the observed discordance).</p>
{_decision_table(data)}
{_coverage_table(data)}
{_category_coverage_table(data)}
<h2>Flips by load</h2>
<p>Answer flips against the standard arm by the running requests on the busiest arm's server
when the pair was replayed, so "FLy flips more" is not confused with "the server flips more
when busy".</p>
{_load_table(data)}
<h2>Lossless check</h2>
<p>Greedy requests only, where the no-speculation baseline (<code>shadow.baseline</code>) and the
noise arm both answered: how often the standard (speculative) arm's answer differs from the
baseline's, against how often a second lossless replay (the noise arm) differs by itself, by the
running requests when the pair was replayed. Standard only = the standard arm differs and the
noise arm does not. The e-value is the beta-binomial mixture on standard-only against
noise-only flips (anytime valid), the rule of the <code>SpecLosslessFlips</code> alert.</p>
{_lossless_section(data)}
<h2>Flips over time</h2>{imgs.get("flips.png", "")}
<h2>E-value path</h2>
<p>Checked after every pair; the false-alarm rate stays at or below α however often it is looked
at (Ville's inequality). {_points_note(data)}</p>{imgs.get("evalue.png", "")}
<h2>Net loss and its interval</h2>{imgs.get("net_loss.png", "")}
<h2>Where speculation stops paying</h2>
{_limit_section(data)}
<h2>Per-position acceptance per arm</h2>{imgs.get("per_position.png", "")}
{_acceptance_table(data)}
<h2>Unpaired and excluded requests</h2>{reasons_html}
</body></html>
"""


def render_report(data: ReportData, out_dir: Path) -> list[Path]:
    """Write the plots and ``index.html`` into ``out_dir`` (created); returns the written paths,
    ``index.html`` last. ``per_position.png`` is written only when ``data.acceptance`` has
    per-position data; otherwise the page says how to get it.

    Raises ``OSError`` when ``out_dir`` cannot be written.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    draws = [plot_flips, plot_evalue, plot_net_loss]
    if data.acceptance is not None and data.acceptance.arms:
        draws.append(plot_per_position)
    names = PLOTS[: len(draws)]
    for name, draw in zip(names, draws, strict=True):
        draw(data, out_dir / name)
        written.append(out_dir / name)
    index = out_dir / "index.html"
    index.write_text(render_html(data, names), encoding="utf-8")
    written.append(index)
    return written
