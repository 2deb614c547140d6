"""The report as rich tables with bars; pure functions of :class:`report.ReportData`."""

from __future__ import annotations

import io

from rich import box
from rich.console import Console, Group, RenderableType
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from ..scoring import labels
from .report import FunnelStep, OutcomeCount, ReportData
from .report_text import clip_width, lang_of, pct, short_time, text, variant_name

BAR_WIDTH = 28
READS_AS_STYLE = {"pass": "green", "partial": "yellow", "info": "cyan", "fail": "red", "unknown": "bright_black",
                  "neutral": "white"}
_EIGHTHS = " ▏▎▍▌▋▊▉"


def bar(fraction: float | None, width: int = BAR_WIDTH) -> str:
    """A horizontal bar in eighth-blocks, so small differences still show."""
    eighths = round(max(0.0, min(1.0, fraction or 0.0)) * width * 8)
    full, rest = divmod(eighths, 8)
    return ("█" * full + (_EIGHTHS[rest] if rest else "")).ljust(width)


def header(data: ReportData, lang: str) -> RenderableType:
    s = data.summary
    line = Text()
    line.append(text("n_sessions", lang, n=s.sessions), style="bold")
    line.append(f" ({s.open} {text('open', lang)}, {s.closed} {text('closed', lang)})")
    if s.first_seen:
        line.append(f"  ·  {short_time(s.first_seen)} → {short_time(s.last_seen)} UTC")
    if s.avg_completion is not None:
        line.append(f"  ·  {text('avg_completion', lang)} {pct(s.avg_completion)}")
    parts: list[RenderableType] = [Text(text("title", lang), style="bold underline"), line]
    if data.filters.describe():
        parts.append(Text(f"{text('filters', lang)}: " + ", ".join(f"{k}={v}" for k, v in data.filters.describe()),
                          style="dim"))
    return Group(*parts)


def funnel_table(steps: list[FunnelStep], lang: str) -> Table:
    t = Table(title=text("funnel", lang), title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
              show_edge=False, pad_edge=False)
    t.add_column(text("step", lang))
    t.add_column(text("reached", lang), justify="right")
    t.add_column(text("share", lang), justify="right")
    t.add_column(text("conversion", lang), justify="right")
    t.add_column("", no_wrap=True)
    for s in steps:
        t.add_row(s.name(lang), str(s.sessions), pct(s.share), "—" if s.first else pct(s.conversion),
                  Text(bar(s.share), style="blue"))
    return t


def outcome_table(rows: list[OutcomeCount], lang: str) -> Table:
    t = Table(title=text("outcome_mix", lang), title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
              show_edge=False, pad_edge=False)
    t.add_column(text("outcome", lang))
    t.add_column(text("reads_as", lang))
    t.add_column(text("count", lang), justify="right")
    t.add_column(text("share", lang), justify="right")
    t.add_column("", no_wrap=True)
    for o in rows:
        style = READS_AS_STYLE.get(o.reads_as, "white")
        t.add_row(Text(o.label(lang), style=style), labels.READS_AS_LABELS[lang_of(lang)].get(o.reads_as, o.reads_as),
                  str(o.sessions), pct(o.share), Text(bar(o.share), style=style))
    return t


def drops_table(data: ReportData, lang: str) -> RenderableType:
    if not data.drops:
        return Text(text("no_drops", lang), style="dim")
    t = Table(title=text("drop_offs", lang), title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
              show_edge=False, pad_edge=False, leading=1)
    t.add_column(text("reason", lang), no_wrap=True)
    t.add_column(text("dropped_at", lang))
    t.add_column(text("count", lang), justify="right")
    t.add_column(text("fix", lang), overflow="fold", ratio=1)
    t.add_column(text("example", lang), no_wrap=True)
    for d in data.drops:
        step = Text(data.step_name(d.variant, d.step, lang))
        step.append(f"\n{variant_name(d.variant, lang)}", style="dim")
        t.add_row(d.reason, step, str(d.sessions), clip_width(d.fix, 200) or "—", clip_width(d.example, 30))
    return t


def terminal_renderables(data: ReportData, lang: str) -> list[RenderableType]:
    """The whole report, top to bottom."""
    lang = lang_of(lang)
    out: list[RenderableType] = [header(data, lang), Text()]
    if not data.summary.sessions:
        out.append(Text(text("empty_filtered" if data.filters.describe() else "empty", lang), style="yellow"))
        return out
    for v in data.variants():
        out.append(Rule(f"{variant_name(v, lang)} · {text('n_sessions', lang, n=data.variant_sessions[v])}",
                        align="left", style="blue"))
        steps = data.funnels.get(v or "")
        out += [funnel_table(steps, lang) if steps else Text(text("no_funnel", lang), style="dim"), Text()]
        if data.outcomes.get(v):
            out += [outcome_table(data.outcomes[v], lang), Text()]
    out += [Rule(style="blue"), drops_table(data, lang)]
    return out


def render_terminal(data: ReportData, lang: str = "en", width: int = 120, color: bool = False) -> str:
    """The report as text, for tests and pipes."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=color, color_system="standard" if color else None,
                      highlight=False)
    for r in terminal_renderables(data, lang):
        console.print(r)
    return buf.getvalue()


def print_terminal(data: ReportData, lang: str = "en") -> None:
    console = Console(highlight=False)
    if not console.is_terminal:
        console = Console(highlight=False, width=max(120, console.width))
    for r in terminal_renderables(data, lang):
        console.print(r)
