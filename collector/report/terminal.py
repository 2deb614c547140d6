"""The report as rich tables with bars; pure functions of :class:`.data.ReportData` and the width.

Layout by width (every line fits it; no word or header is cut, see :func:`terminal.fit_table`):

- a table that fits as it is keeps its layout (120 columns and wider, usually);
- otherwise every column gets at least its longest word and the narrow columns (numbers, short headers)
  their whole width first, so a long text wraps at its words; bars grow last, shrink from their width down
  to 8 cells, and are dropped (the numbers beside them stay) when even 8 do not fit; a table whose longest
  words cannot stand side by side prints a line per row (each value after its header);
- the drop-offs stay a table only while the suggested fix gets at least ``FIX_MIN`` cells (so at 120 columns
  and wider, usually); below that each drop-off is a block: reason and sessions, then the step, the fix on
  its own wrapped lines, and the example session. The criteria missed most do the same below
  ``CRITERION_MIN`` cells for the criterion (after dropping their bar);
- a section title too long for its rule goes on its own lines above it, and the summary line under the
  title becomes one fact a line.

Free text (a fix, a criterion) wraps at spaces, and only a token longer than the whole line is folded, so
nothing is lost; an example session id is one line, cut with "…" where it does not fit.
"""

from __future__ import annotations

import io

from rich.console import Console, Group, RenderableType
from rich.padding import Padding
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from ...scoring import labels, stages
from ..terminal import WIDE, data_text, fit_table, output_console, visible_controls
from ..links import experiment_url, session_url
from .data import CriterionMiss, DropReason, ExperimentRuns, FunnelStep, OutcomeCount, ReportData
from .feedback import terminal_renderables as feedback_renderables
from .experiments import terminal_renderables as experiment_stats
from .layout import AS_TYPED, Bar, clipped, fitted, measurer, room, share_bar, titled
from .shapes import shapes_renderables, tails_renderables
from .text import (drop_fix, drop_reason_name, experiment_name, lang_of, miss_reasons, pct, review_line, short_time,
                   stage_fix, text, variant_name)
from .monitors import terminal_renderables as firings_renderables

FIX_MIN = 30  # cells the suggested fix needs for the drop-offs to stay a table
CRITERION_MIN = 24  # likewise the criterion, for the criteria missed most
INDENT = 2  # the details of a block under its first line
READS_AS_STYLE = {"pass": "green", "partial": "yellow", "info": "cyan", "fail": "red", "unknown": "bright_black",
                  "neutral": "white"}


def _rule(title: Text, style: str, width: int) -> RenderableType:
    """A section rule with its title, or the title on its own lines above the rule when it is too long for one."""
    if title.cell_len + 6 <= width:
        return Rule(title, align="left", style=style)
    return Group(title, Rule(style=style))


def header(data: ReportData, lang: str, width: int = WIDE) -> RenderableType:
    s = data.summary
    first = Text()
    first.append(text("n_sessions", lang, n=s.sessions), style="bold")
    first.append(f" ({s.open} {text('open', lang)}, {s.closed} {text('closed', lang)})")
    facts = [first]
    if s.first_seen:
        facts.append(Text(f"{short_time(s.first_seen)} → {short_time(s.last_seen)} UTC"))
    if s.avg_completion is not None:
        facts.append(Text(f"{text('avg_completion', lang)} {pct(s.avg_completion)}"))
    line = Text("  ·  ").join(facts)
    if line.cell_len > width:  # one fact a line rather than a line broken anywhere
        line = Text("\n").join(facts)
    parts: list[RenderableType] = [Text(text("title", lang), style="bold underline"), line]
    if data.filters.describe():
        parts.append(data_text(f"{text('filters', lang)}: " + ", ".join(f"{k}={v}" for k, v in data.filters.describe()),
                               style="dim"))
    return Group(*parts)


def funnel_table(steps: list[FunnelStep], lang: str, width: int = WIDE) -> RenderableType:
    def build(with_bar: bool) -> Table:
        t = titled(text("funnel", lang))
        t.add_column(text("step", lang))
        t.add_column(text("reached", lang), justify="right")
        t.add_column(text("share", lang), justify="right")
        t.add_column(text("conversion", lang), justify="right")
        if with_bar:
            t.add_column("")
        for s in steps:
            t.add_row(data_text(s.name(lang)), s.count_label(lang), pct(s.share), "—" if s.first else pct(s.conversion),
                      *([share_bar(s.share, "blue")] if with_bar else []))
        return t

    return fitted(build, width, 4)


def outcome_table(rows: list[OutcomeCount], lang: str, width: int = WIDE) -> RenderableType:
    def build(with_bar: bool) -> Table:
        t = titled(text("outcome_mix", lang))
        t.add_column(text("outcome", lang))
        t.add_column(text("reads_as", lang))
        t.add_column(text("count", lang), justify="right")
        t.add_column(text("share", lang), justify="right")
        if with_bar:
            t.add_column("")
        for o in rows:
            style = READS_AS_STYLE.get(o.reads_as, "white")
            t.add_row(data_text(o.label(lang), style=style),
                      data_text(labels.READS_AS_LABELS[lang_of(lang)].get(o.reads_as, o.reads_as)),
                      str(o.sessions), pct(o.share), *([share_bar(o.share, style)] if with_bar else []))
        return t

    return fitted(build, width, 4)


def buckets_table(data: ReportData, lang: str, width: int = WIDE) -> RenderableType:
    """``--bucket``: the filtered sessions by the hour or day they started."""
    def build(with_bar: bool) -> Table:
        t = titled(text("by_hour" if data.filters.bucket == "hour" else "by_day", lang))
        t.add_column(text("bucket_start", lang))
        t.add_column(text("count", lang), justify="right")
        t.add_column(text("avg_completion", lang), justify="right")
        t.add_column(text("top_outcomes", lang), overflow="fold")
        for b in data.buckets:
            start = short_time(b.start) if data.filters.bucket == "hour" else b.start[:10]
            t.add_row(start, str(b.sessions), pct(b.avg_completion), data_text(b.outcomes_label(lang)))
        return t

    return fitted(build, width)


def _fix(d: DropReason, lang: str) -> Text | str:
    fix = clipped(drop_fix(d.reason, d.fix, lang), 200)
    fix.overflow = "fold"  # wraps at its words; only a token longer than the column is folded
    return fix or "—"


def _reason_name(d: DropReason, lang: str) -> str:
    """English shows the reason's code (what ``drop_reason`` holds); Japanese its name."""
    return d.reason if lang_of(lang) == "en" else drop_reason_name(d.reason, lang)


def _reason(d: DropReason, lang: str, sep: str) -> Text:
    """The drop-off reason; in Japanese its name, with the stored code after it for SQL."""
    reason = data_text(_reason_name(d, lang))
    if lang_of(lang) != "en":
        reason.append(sep + visible_controls(d.reason), style="dim")
    return reason


def _stopped_at(data: ReportData, d: DropReason, lang: str, sep: str) -> Text:
    """The last step the sessions reached, and their variant."""
    step = data_text(data.step_name(d.variant, d.stopped_at, lang) if d.stopped_at else "—")
    step.append(sep + visible_controls(variant_name(d.variant, lang, data.registry)), style="dim")
    return step


def _drop_step(data: ReportData, d: DropReason, lang: str, sep: str) -> Text:
    """The step they failed at or did not reach; at the variant's last step, the outcome they missed."""
    step = data_text(data.step_name(d.variant, d.step, lang) if d.step else "—")
    note = data.drop_note(d, lang)
    if note:
        step.append(sep + visible_controls(note), style="dim")
    return step


def _details(rows: list[tuple[str, RenderableType]], width: int) -> RenderableType:
    """Label and value pairs under a block's first line: values wrap beside their labels."""
    grid = Table.grid(padding=(0, 1, 0, 1), collapse_padding=False)
    grid.add_column(no_wrap=True, style="dim", width=max(Text(label).cell_len for label, _ in rows))
    grid.add_column(width=_value_width([label for label, _ in rows], width))
    for label, value in rows:
        grid.add_row(Text(label), value)
    return Padding(grid, (0, 0, 0, INDENT))


def _value_width(labels_: list[str], width: int) -> int:
    """Cells for the values of a block's details, beside the widest label."""
    return max(1, width - INDENT - max(Text(label).cell_len for label in labels_) - 2)


def drop_blocks(data: ReportData, lang: str, width: int) -> RenderableType:
    """The drop-offs on a narrow terminal: one block each, the fix on its own wrapped lines."""
    out: list[RenderableType] = [Text(text("drop_offs", lang), style="bold")]
    keys = [text("dropped_at", lang), text("drop_step", lang), text("fix", lang), text("example", lang)]
    value_width = _value_width(keys, width)
    for d in data.drops:
        first = _reason(d, lang, " · ")
        first.stylize("bold", 0, len(visible_controls(_reason_name(d, lang))))
        first.append(" · " + text("n_sessions", lang, n=d.sessions))
        example = clipped(d.example, value_width)
        example.no_wrap = True
        values = [_stopped_at(data, d, lang, " · "), _drop_step(data, d, lang, " · "), _fix(d, lang), example]
        out += [Text(), first, _details(list(zip(keys, values)), width)]
    return Group(*out)


def drops_table(data: ReportData, lang: str, width: int = WIDE) -> RenderableType:
    """The drop-offs as a table while the fix gets ``FIX_MIN`` cells, else as blocks."""
    if not data.drops:
        return Text(text("no_drops", lang), style="dim")
    t = titled(text("drop_offs", lang), leading=1)
    t.add_column(text("reason", lang), no_wrap=True)
    t.add_column(text("dropped_at", lang))
    t.add_column(text("drop_step", lang))
    t.add_column(text("count", lang), justify="right")
    t.add_column(text("fix", lang), overflow="fold", ratio=1)
    t.add_column(text("example", lang), no_wrap=True)
    for d in data.drops:
        t.add_row(_reason(d, lang, "\n"), _stopped_at(data, d, lang, "\n"), _drop_step(data, d, lang, "\n"),
                  str(d.sessions), _fix(d, lang), clipped(d.example, 30))
    if room(t, width, 4) < FIX_MIN or not fit_table(t, width, measurer(width)):
        return drop_blocks(data, lang, width)
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


def stages_table(e: ExperimentRuns, lang: str, width: int = WIDE) -> RenderableType:
    def build(with_bar: bool) -> Table:
        legend = "  ".join(f"{glyph} {text(key, lang)}" for glyph, key in
                           (("█", "passed_runs"), ("▓", "failed_first"), ("░", "missing_runs")))
        caption = {"caption": legend, "caption_justify": "right", "caption_style": "dim"} if with_bar else {}
        t = titled(text("fail_first", lang), **caption)
        t.add_column(text("stage", lang), no_wrap=True)
        for key in ("reached_runs", "passed_runs", "failed_first", "missing_runs", "cumulative", "conditional"):
            t.add_column(text(key, lang), justify="right")
        if with_bar:
            t.add_column("")
        worst = e.worst_stage()
        for s in e.stages:
            failed = Text(str(s.failed), style="bold red" if s is worst else "red" if s.failed else "")
            parts = [(s.passed, "green", "█"), (s.failed, "red", "▓"), (s.missing, "yellow", "░")]
            cells = [Bar(lambda w, parts=parts, runs=s.runs: stacked_bar(parts, runs, w), 16)] if with_bar else []  # type: ignore[misc]  # mypy cannot type a lambda's bound defaults
            t.add_row(data_text(s.name(lang)), str(s.reached), str(s.passed), failed, str(s.missing),
                      pct(s.cumulative), "—" if s.conditional is None else pct(s.conditional), *cells)
        return t

    return fitted(build, width, 7)


def stage_questions_table(lang: str, width: int = WIDE) -> RenderableType:
    """``--stage-questions``: the stages with the question each asks and the evidence that answers it, once
    above the experiments' stage tables (the HTML report has them as columns of each). Where the table does not
    fit, a block per stage: its name, then the question and the evidence, each wrapped beside its header."""
    t = titled(text("stage_questions_title", lang))
    t.add_column(text("stage", lang), no_wrap=True)
    t.add_column(text("stage_question", lang), overflow="fold", ratio=1)
    t.add_column(text("stage_check", lang), overflow="fold", ratio=1)
    for stage in stages.REGISTRY.keys():
        t.add_row(stages.stage_label(stage, lang), stages.stage_question(stage, lang), stages.stage_check(stage, lang))
    if fit_table(t, width, measurer(width)):
        return t
    out: list[RenderableType] = [Text(text("stage_questions_title", lang), style="bold")]
    keys = [text("stage_question", lang), text("stage_check", lang)]
    for stage in stages.REGISTRY.keys():
        values = [Text(stages.stage_question(stage, lang), overflow="fold"),
                  Text(stages.stage_check(stage, lang), overflow="fold")]
        out += [Text(stages.stage_label(stage, lang), style="bold"), _details(list(zip(keys, values)), width)]
    return Group(*out)


def look_at(e: ExperimentRuns, lang: str) -> list[RenderableType]:
    """The fix to look at for every stage where runs failed first, the most frequent first."""
    failing = sorted((s for s in e.stages if s.failed), key=lambda s: -s.failed)
    return [data_text(f"{text('look_at', lang)} · {s.name(lang)} ({s.failed}): {stage_fix(s.stage, lang)}", style="dim")
            for s in failing]


def _why(m: CriterionMiss, lang: str) -> list[str]:
    """Why it was not met: the judge's findings by result, then no usable judgment."""
    return miss_reasons(m.kind, m.judged, m.judge_missing, m.judge_error, m.other, lang, m.by_result)


def _criterion(m: CriterionMiss, lang: str, sep: str) -> Text:
    name = data_text(m.name)
    name.overflow = "fold"
    name.append(f"{sep}{text('kind_' + m.kind, lang)}", style="dim")
    return name


def miss_blocks(e: ExperimentRuns, lang: str, width: int) -> RenderableType:
    """The criteria missed most on a narrow terminal: one block each."""
    out: list[RenderableType] = [Text(text("missed_most", lang), style="bold")]
    keys = [f"{text('missed', lang)} / {text('of_runs', lang)}", text("why", lang), text("example", lang)]
    value_width = _value_width(keys, width)
    for m in e.misses:
        first = _criterion(m, lang, " · ")
        first.stylize("bold", 0, len(visible_controls(m.name)))
        example = clipped(m.example, value_width)
        example.no_wrap = True
        why = "\n".join(_why(m, lang)) or "—"
        out += [Text(), first, _details(list(zip(keys, [Text(f"{m.missed} / {m.runs} ({pct(m.share)})"), Text(why),
                                                        example])), width)]
    return Group(*out)


def misses_table(e: ExperimentRuns, lang: str, width: int = WIDE) -> RenderableType:
    def build(with_bar: bool) -> Table:
        t = titled(text("missed_most", lang))
        t.add_column(text("criterion", lang), overflow="fold", ratio=1)
        t.add_column(text("missed", lang), justify="right")
        t.add_column(text("of_runs", lang), justify="right")
        t.add_column(text("share", lang), justify="right")
        if with_bar:
            t.add_column("")
        t.add_column(text("why", lang))
        t.add_column(text("example", lang), no_wrap=True)
        for m in e.misses:
            t.add_row(_criterion(m, lang, "\n"), str(m.missed), str(m.runs), pct(m.share),
                      *([share_bar(m.share, "red", 12)] if with_bar else []),
                      "\n".join(_why(m, lang)),
                      clipped(m.example, 30))
        return t

    t, last = build(True), (4,)
    if room(t, width, 0) < CRITERION_MIN:
        t, last = build(False), ()  # type: ignore[assignment]  # last: the columns kept, none here
        if room(t, width, 0) < CRITERION_MIN:
            return miss_blocks(e, lang, width)
    return t if fit_table(t, width, measurer(width), last) else miss_blocks(e, lang, width)


def outvoted_lines(e: ExperimentRuns, lang: str) -> list[RenderableType]:
    """Runs the judge passed and a deterministic check failed: one line each, with the check by name."""
    if not e.outvoted:
        return []
    out: list[RenderableType] = [Text(text("outvoted", lang), style="bold"),
                                 Text(text("outvoted_note", lang), style="dim")]
    for o in e.outvoted:
        line = text("outvoted_run", lang, case=o.case_id, run=o.run_id or o.session_id, score=f"{o.score:.2f}",
                    threshold=f"{o.threshold:.2f}", layer=text("layer_" + o.layer, lang), checks="; ".join(o.checks))
        out.append(Padding(data_text(line), (0, 0, 0, INDENT)))  # a wrapped line stays under its run
    return [*out, Text()]


def evaluation_renderables(data: ReportData, lang: str, width: int = WIDE) -> list[RenderableType]:
    """Per experiment: where runs fail first, and the criteria missed most; nothing without case runs."""
    if data.needs_upgrade:
        return [Text(text("needs_upgrade", lang), style="yellow")]
    out: list[RenderableType] = []
    if data.stage_questions and any(e.stages for e in data.experiments):
        out += [stage_questions_table(lang, width), Text()]
    for e in data.experiments:
        title = f"{text('experiment', lang)} {experiment_name(e.experiment, lang)}"
        if e.runs:
            title += " · " + text("experiment_runs", lang, runs=e.runs, passes=e.passes, rate=pct(e.passes / e.runs))
        out.append(_rule(data_text(title), "magenta", width))
        if data.ui_base:
            out.append(_url(experiment_url(data.ui_base, e.experiment)) if e.experiment is not None else Text())
        if e.controls:
            out.append(Text(text("controls", lang, abstained=e.abstained, controls=e.controls), style="dim"))
        if e.experiment in data.stats:  # pass^k and pass@k per case, failure mix, tails, trajectory
            out += [*experiment_stats(data.stats[e.experiment], width, lang)[1:], Text()]
        out += tails_renderables(e, lang, width)  # p50/p95/p99/max, runs per step count, wasted steps by kind
        if e.stages:
            out += [stages_table(e, lang, width), *look_at(e, lang), Text()]
        out += shapes_renderables(e, lang, width)  # what failed the runs: stage, tool, pointer or field, kind
        if e.misses:
            out += [misses_table(e, lang, width), Text()]
        out += outvoted_lines(e, lang)  # the judge passed them, a check failed them
    if data.more_experiments:
        out.append(Text(text("more_experiments", lang, n=data.more_experiments), style="dim"))
    return out


def terminal_renderables(data: ReportData, lang: str, width: int = WIDE) -> list[RenderableType]:
    """The whole report, top to bottom, laid out for ``width`` cells."""
    lang = lang_of(lang)
    out: list[RenderableType] = [header(data, lang, width), Text()]
    if data.ui_base:
        out[1:1] = [_url(data.ui_base, "UI: ")]
    if not data.summary.sessions:
        out.append(Text(text("empty_filtered" if data.filters.describe() else "empty", lang), style="yellow"))
        return out
    for v in data.variants():
        title = data_text(f"{variant_name(v, lang, data.registry)} · {text('n_sessions', lang, n=data.variant_sessions[v])}")
        out.append(_rule(title, "blue", width))
        steps = data.funnels.get(v or "")
        out += [funnel_table(steps, lang, width) if steps else Text(text("no_funnel", lang), style="dim"), Text()]
        if data.outcomes.get(v):
            out += [outcome_table(data.outcomes[v], lang, width), Text()]
    out += [Rule(style="blue"), drops_table(data, lang, width)]
    if data.buckets:
        out += [Text(), buckets_table(data, lang, width)]
    if data.ui_base:  # the example sessions, where the UI shows them (a URL is never cut)
        examples = list(dict.fromkeys(d.example for d in data.drops if d.example))
        out += [Text(text("example", lang) + " · UI", style="dim"), *(_url(session_url(data.ui_base, x)) for x in examples)]
    out += feedback_renderables(data.feedback, lang, width, lambda v, s: data.step_name(v, s, lang))
    evaluation = evaluation_renderables(data, lang, width)
    if evaluation:
        out += [Text(), Text(text("evaluations", lang), style="bold underline"), *evaluation]
    if data.review is not None:
        out += [Text(), Text(text("review_title", lang), style="bold underline"), Text(review_line(data.review, lang))]
    out += firings_renderables(data.firings, lang, data.ui_base)
    return out


def _url(url: str, prefix: str = "  ") -> Text:
    """A URL on a line of its own, whole even past the width (a terminal wraps it; a cut one would not open)."""
    return Text.assemble(prefix, data_text(url), no_wrap=True, overflow="ignore")


def render_terminal(data: ReportData, lang: str = "en", width: int = WIDE, color: bool = False) -> str:
    """The report as text, for tests and pipes."""
    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=color, color_system="standard" if color else None,
                      **AS_TYPED)
    for r in terminal_renderables(data, lang, width):
        console.print(r)
    return buf.getvalue()


def print_terminal(data: ReportData, lang: str = "en") -> None:
    console = output_console(**AS_TYPED)
    for r in terminal_renderables(data, lang, console.width):
        console.print(r)
