"""The report as rich tables with bars; pure functions of :class:`report.ReportData`."""

from __future__ import annotations

import io

from rich import box
from rich.console import Console, Group, RenderableType
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from ..scoring import labels
from .report import ExperimentRuns, FunnelStep, OutcomeCount, ReportData
from .report_text import (clip_width, experiment_name, lang_of, miss_reasons, pct, short_time, stage_fix, text,
                          variant_name)
from .terminal import data_text, visible_controls

BAR_WIDTH = 28
READS_AS_STYLE = {"pass": "green", "partial": "yellow", "info": "cyan", "fail": "red", "unknown": "bright_black",
                  "neutral": "white"}
_EIGHTHS = " ▏▎▍▌▋▊▉"


def bar(fraction: float | None, width: int = BAR_WIDTH) -> str:
    """A horizontal bar in eighth-blocks, so small differences still show."""
    eighths = round(max(0.0, min(1.0, fraction or 0.0)) * width * 8)
    full, rest = divmod(eighths, 8)
    return ("█" * full + (_EIGHTHS[rest] if rest else "")).ljust(width)


def clipped(value: str | None, units: int) -> Text:
    """A stored value in a narrow cell: escaped first, so the clipped width is the width shown."""
    return data_text(clip_width(visible_controls(value), units))


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
        parts.append(data_text(f"{text('filters', lang)}: " + ", ".join(f"{k}={v}" for k, v in data.filters.describe()),
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
        t.add_row(data_text(s.name(lang)), str(s.sessions), pct(s.share), "—" if s.first else pct(s.conversion),
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
        t.add_row(data_text(o.label(lang), style=style),
                  data_text(labels.READS_AS_LABELS[lang_of(lang)].get(o.reads_as, o.reads_as)),
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
        step = data_text(data.step_name(d.variant, d.step, lang))
        step.append("\n" + visible_controls(variant_name(d.variant, lang)), style="dim")
        t.add_row(data_text(d.reason), step, str(d.sessions), clipped(d.fix, 200) or "—",
                  clipped(d.example, 30))
    return t


def stacked_bar(parts: list[tuple[int, str, str]], total: int, width: int) -> Text:
    """Adjacent segments of one bar (count out of ``total``, colour, glyph): the glyphs tell them apart uncoloured."""
    out, used = Text(), 0
    for count, style, glyph in parts:
        cells = round(width * count / total) if total else 0
        cells = min(cells, width - used)
        out.append(glyph * cells, style=style)
        used += cells
    out.append(" " * (width - used))
    return out


def stages_table(e: ExperimentRuns, lang: str) -> Table:
    legend = "  ".join(f"{glyph} {text(key, lang)}" for glyph, key in
                       (("█", "passed_runs"), ("▓", "failed_first"), ("░", "missing_runs")))
    t = Table(title=text("fail_first", lang), title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
              show_edge=False, pad_edge=False, caption=legend, caption_justify="right", caption_style="dim")
    t.add_column(text("stage", lang), no_wrap=True)
    for key in ("reached_runs", "passed_runs", "failed_first", "missing_runs", "cumulative", "conditional"):
        t.add_column(text(key, lang), justify="right")
    t.add_column("", no_wrap=True)
    worst = e.worst_stage()
    for s in e.stages:
        failed = Text(str(s.failed), style="bold red" if s is worst else "red" if s.failed else "")
        t.add_row(data_text(s.name(lang)), str(s.reached), str(s.passed), failed, str(s.missing), pct(s.cumulative),
                  "—" if s.conditional is None else pct(s.conditional),
                  stacked_bar([(s.passed, "green", "█"), (s.failed, "red", "▓"), (s.missing, "yellow", "░")], s.runs, 16))
    return t


def look_at(e: ExperimentRuns, lang: str) -> list[RenderableType]:
    """The fix to look at for every stage where runs failed first, the most frequent first."""
    failing = sorted((s for s in e.stages if s.failed), key=lambda s: -s.failed)
    return [data_text(f"{text('look_at', lang)} · {s.name(lang)} ({s.failed}): {stage_fix(s.stage, lang)}", style="dim")
            for s in failing]


def misses_table(e: ExperimentRuns, lang: str) -> Table:
    t = Table(title=text("missed_most", lang), title_justify="left", title_style="bold", box=box.SIMPLE_HEAD,
              show_edge=False, pad_edge=False)
    t.add_column(text("criterion", lang), overflow="fold", ratio=1)
    t.add_column(text("missed", lang), justify="right")
    t.add_column(text("of_runs", lang), justify="right")
    t.add_column(text("share", lang), justify="right")
    t.add_column("", no_wrap=True)
    t.add_column(text("why", lang))
    t.add_column(text("example", lang), no_wrap=True)
    for m in e.misses:
        name = data_text(m.name)
        name.append(f"\n{text('kind_' + m.kind, lang)}", style="dim")
        t.add_row(name, str(m.missed), str(m.runs), pct(m.share), Text(bar(m.share, 12), style="red"),
                  "\n".join(miss_reasons(m.kind, m.judged, m.judge_missing, m.judge_error, m.other, lang)),
                  clipped(m.example, 30))
    return t


def evaluation_renderables(data: ReportData, lang: str) -> list[RenderableType]:
    """Per experiment: where runs fail first, and the criteria missed most; nothing without case runs."""
    if data.needs_upgrade:
        return [Text(text("needs_upgrade", lang), style="yellow")]
    out: list[RenderableType] = []
    for e in data.experiments:
        title = f"{text('experiment', lang)} {experiment_name(e.experiment, lang)}"
        if e.runs:
            title += " · " + text("experiment_runs", lang, runs=e.runs, passes=e.passes, rate=pct(e.passes / e.runs))
        out.append(Rule(data_text(title), align="left", style="magenta"))
        if e.controls:
            out.append(Text(text("controls", lang, abstained=e.abstained, controls=e.controls), style="dim"))
        if e.stages:
            out += [stages_table(e, lang), *look_at(e, lang), Text()]
        if e.misses:
            out += [misses_table(e, lang), Text()]
    if data.more_experiments:
        out.append(Text(text("more_experiments", lang, n=data.more_experiments), style="dim"))
    return out


def terminal_renderables(data: ReportData, lang: str) -> list[RenderableType]:
    """The whole report, top to bottom."""
    lang = lang_of(lang)
    out: list[RenderableType] = [header(data, lang), Text()]
    if not data.summary.sessions:
        out.append(Text(text("empty_filtered" if data.filters.describe() else "empty", lang), style="yellow"))
        return out
    for v in data.variants():
        out.append(Rule(data_text(f"{variant_name(v, lang)} · {text('n_sessions', lang, n=data.variant_sessions[v])}"),
                        align="left", style="blue"))
        steps = data.funnels.get(v or "")
        out += [funnel_table(steps, lang) if steps else Text(text("no_funnel", lang), style="dim"), Text()]
        if data.outcomes.get(v):
            out += [outcome_table(data.outcomes[v], lang), Text()]
    out += [Rule(style="blue"), drops_table(data, lang)]
    evaluation = evaluation_renderables(data, lang)
    if evaluation:
        out += [Text(), Text(text("evaluations", lang), style="bold underline"), *evaluation]
    return out


# The report writes no markup of its own: plain strings that reach a table stay literal too.
_AS_TYPED = {"markup": False, "emoji": False, "highlight": False}


def render_terminal(data: ReportData, lang: str = "en", width: int = 120, color: bool = False) -> str:
    """The report as text, for tests and pipes."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=color, color_system="standard" if color else None,
                      **_AS_TYPED)
    for r in terminal_renderables(data, lang):
        console.print(r)
    return buf.getvalue()


def print_terminal(data: ReportData, lang: str = "en") -> None:
    console = Console(**_AS_TYPED)
    if not console.is_terminal:
        console = Console(width=max(120, console.width), **_AS_TYPED)
    for r in terminal_renderables(data, lang):
        console.print(r)
