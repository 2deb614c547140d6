"""The report's failure shapes and tails, per experiment, over the sessions its filters select.

Failure shapes (``failure_shapes_of``): what failed the runs, by first failing stage, tool, argument pointer
or result field, and kind of problem, with the runs and their share of the experiment's failed runs, the
most common first, so the report says where to look (a schema violation on /date of get_rate in 3 of 5).
Tails (``experiment_tails_of``, ``step_distribution_of``): cost, latency and steps (tool calls) per run at
p50, p95, p99 and max, the runs per step count, and the wasted steps by kind.

Read with the rest of the report (:mod:`.data`, statements in :mod:`.sql`); these renderers, for the terminal
and for HTML, are pure functions of the data. Values from telemetry (tools, pointers, criteria, errors) are
escaped in both outputs.
"""

from __future__ import annotations

import html
from typing import Any

from rich.table import Table
from rich.text import Text

from ..terminal import data_text, fit_table
from .data import WASTED_KINDS, ExperimentRuns, FailureShape, Tails
from .experiments import fmt
from .layout import as_lines, fitted, measurer, share_bar, titled
from .text import failure_kind_name, pct, text

HISTOGRAM_MAX_BARS = 40  # step counts beyond this many bars are drawn in ranges


# ---------------------------------------------------------------------------- formatting


def quantiles(values: tuple[float | None, ...], kind: str) -> str:
    """p50 / p95 / p99 / max: dollars to four decimals, whole milliseconds, steps to one decimal."""
    def one(v: float | None) -> str:
        return fmt(v, kind) if v is None or kind in ("usd", "ms") else f"{v:.1f}".removesuffix(".0")
    return " / ".join(map(one, values))


def tail_rows(t: Tails, lang: str) -> list[tuple[str, str]]:
    return [(text("tail_cost", lang), quantiles(t.cost, "usd")), (text("tail_latency", lang), quantiles(t.latency_ms, "ms")),
            (text("tail_steps", lang), quantiles(t.steps, "steps"))]


def step_counts_line(t: Tails) -> str:
    """``0→3 · 2→29 · 8→1``: runs per step count, each pair one word so a line wraps between them."""
    return " · ".join(f"{steps}→{runs}" for steps, runs in t.step_counts) or "—"


def wasted_line(t: Tails, lang: str) -> str:
    return text("wasted_kinds", lang, n=t.wasted_steps, **{k: t.wasted.get(k, 0) for k in WASTED_KINDS})


def _where(s: FailureShape, lang: str) -> str:
    """The location; the JSON pointer "" (the arguments as a whole) by name."""
    return "—" if s.location is None else s.location or text("whole_arguments", lang)


# ---------------------------------------------------------------------------- terminal


def tails_renderables(e: ExperimentRuns, lang: str, width: int) -> list[Any]:
    """The tails of one :class:`.data.ExperimentRuns` (a table, the runs per step count, the wasted steps by kind);
    nothing without them."""
    out: list[Any] = []
    if e.tails is not None and e.tails.runs:
        t = e.tails

        def build_tails(_: bool) -> Table:
            table = titled(text("tails", lang))
            table.add_column("")
            table.add_column(text("tail_quantiles", lang), justify="right")
            for label, value in tail_rows(t, lang):
                table.add_row(label, value)
            return table

        out += [fitted(build_tails, width),
                Text.assemble((text("steps_per_run", lang) + ": ", "dim"), step_counts_line(t))]
        if t.wasted_steps:
            out.append(Text(wasted_line(t, lang), style="dim"))
        out.append(Text())
    return out


def shapes_renderables(e: ExperimentRuns, lang: str, width: int) -> list[Any]:
    """The failure shapes of one :class:`.data.ExperimentRuns`; nothing without them."""
    out: list[Any] = []
    if e.shapes:
        def build(with_bar: bool) -> Table:
            # the stage is left to the HTML report: a kind of problem names its stage
            table = titled(text("failure_shapes", lang), caption=text("shapes_note", lang), caption_justify="left",
                            caption_style="dim")
            table.add_column(text("problem", lang), overflow="fold")
            table.add_column(text("tool", lang), overflow="fold")
            table.add_column(text("where", lang), overflow="fold")
            table.add_column(text("runs", lang), justify="right")
            table.add_column(text("share", lang), justify="right")
            if with_bar:
                table.add_column("")
            table.add_column(text("detail", lang), overflow="fold", ratio=1)
            for s in e.shapes:
                table.add_row(Text(failure_kind_name(s.kind, lang), style="bold" if s is e.shapes[0] else ""),
                              data_text(s.tool or "—"), data_text(_where(s, lang)), f"{s.runs} / {s.failed_runs}",
                              pct(s.share), *([share_bar(s.share, "red", 12)] if with_bar else []),
                              data_text(s.detail or "", style="dim"))
            return table

        # the problem and its location wrap before the detail does (it is where the fix shows)
        table = build(False)
        out += [table if fit_table(table, width, measurer(width), (0, 2)) else as_lines(table), Text()]
    return out


# ---------------------------------------------------------------------------- HTML


def _esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def histogram_svg(t: Tails, lang: str) -> str:
    """Runs per step count as columns, fewest calls on the left; each column's count on hover."""
    if not t.step_counts:
        return ""
    low, high = t.step_counts[0][0], t.step_counts[-1][0]
    width = max(1, -(-(high - low + 1) // HISTOGRAM_MAX_BARS))  # step counts per bar
    bars: dict[int, int] = {}
    for steps, runs in t.step_counts:
        start = low + (steps - low) // width * width
        bars[start] = bars.get(start, 0) + runs
    starts = list(range(low, high + 1, width))
    top = max(bars.values())
    w, h, pad = 260, 70, 12
    step = (w - 2 * pad) / len(starts)
    cols = []
    for i, start in enumerate(starts):
        runs = bars.get(start, 0)
        label = str(start) if width == 1 else f"{start}–{start + width - 1}"
        height = (h - 2 * pad) * runs / top
        cols.append(f'<rect x="{pad + i * step + 1:.1f}" y="{h - pad - height:.1f}" width="{max(step - 2, 1):.1f}" '
                    f'height="{height:.1f}" fill="#818CF8"><title>{_esc(label)}: {runs}</title></rect>')
    axis = (f'<text x="{pad}" y="{h - 1}" font-size="10" fill="#6B7280">{low}</text>'
            f'<text x="{w - pad}" y="{h - 1}" font-size="10" fill="#6B7280" text-anchor="end">{high}</text>')
    name = _esc(text("steps_per_run", lang))
    return (f'<svg viewBox="0 0 {w} {h}" width="{w}" height="{h}" role="img" aria-label="{name}" '
            f'xmlns="http://www.w3.org/2000/svg">{"".join(cols)}{axis}</svg>')


def tails_html(e: ExperimentRuns, lang: str) -> str:
    """The tails of one :class:`.data.ExperimentRuns` as HTML; every stored value escaped."""
    parts = []
    if e.tails is not None and e.tails.runs:
        t = e.tails
        rows = "".join(f'<tr><th>{_esc(label)}</th><td class="num">{_esc(value)}</td></tr>' for label, value in
                       tail_rows(t, lang))
        wasted = f'<p class="note">{_esc(wasted_line(t, lang))}</p>' if t.wasted_steps else ""
        parts.append(
            f'<h3 class="gap">{_esc(text("tails", lang))}</h3><table class="data tails" style="width:auto"><thead><tr>'
            f'<th></th><th class="num">{_esc(text("tail_quantiles", lang))}</th></tr></thead><tbody>{rows}</tbody>'
            f'</table><figure class="steps" style="margin:10px 0 0">{histogram_svg(t, lang)}<figcaption class="note">'
            f'{_esc(text("steps_per_run", lang))}: {_esc(step_counts_line(t))}</figcaption></figure>{wasted}')
    return "".join(parts)


def shapes_html(e: ExperimentRuns, lang: str) -> str:
    """The failure shapes of one :class:`.data.ExperimentRuns` as HTML; every stored value escaped."""
    parts = []
    if e.shapes:
        head = "".join(f"<th{' class=num' if k in ('runs', 'share') else ''}>{_esc(text(k, lang))}</th>"
                       for k in ("problem", "stage", "tool", "where", "runs", "share"))
        body = "".join(
            f'<tr><td><div title="{_esc(s.kind)}">{_esc(failure_kind_name(s.kind, lang))}</div>'
            + (f'<div class="muted small">{_esc(s.detail)}</div>' if s.detail else "")
            + f'</td><td class="nw">{_esc(s.stage_name(lang))}</td><td><code>{_esc(s.tool or "—")}</code></td>'
            f'<td><code>{_esc(_where(s, lang))}</code></td><td class="num">{s.runs} / {s.failed_runs}</td>'
            f'<td class="num"><div>{_esc(pct(s.share))}</div>'
            f'<div class="mini miss"><span style="width:{100 * s.share:.0f}%"></span></div></td></tr>'
            for s in e.shapes)
        parts.append(f'<h3 class="gap">{_esc(text("failure_shapes", lang))}</h3><table class="data shapes"><thead><tr>'
                     f'{head}</tr></thead><tbody>{body}</tbody></table>'
                     f'<p class="note">{_esc(text("shapes_note", lang))}</p>')
    return "".join(parts)
