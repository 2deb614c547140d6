"""The report as one self-contained HTML file: inline CSS and SVG, no scripts, nothing fetched.

Everything from the database (session ids, tool names, error texts, agent names) is untrusted and
goes through :func:`esc`; a Content-Security-Policy forbids scripts and remote loads as a backstop.
"""

from __future__ import annotations

import html
import math
import re

from ...scoring import labels, stages
from ..links import experiment_url, session_url
from .data import CriterionMiss, DropReason, ExperimentRuns, FunnelStep, OutcomeCount, ReportData, SessionRow
from .experiments import html_body, trends_html
from .monitors import html_section as firings_section
from .feedback import section_html as feedback_section
from .shapes import shapes_html, tails_html
from .text import (clip_width, drop_fix, drop_reason_name, experiment_name, lang_of, miss_reasons, pct, review_line,
                   short_time, stage_fix, text, variant_name)

FUNNEL_FILL = "#4338CA"  # only the funnel bars use this colour (the screenshot test looks for it)
SKIPPED_FILL = "#C7D2FE"  # the strip of a bar that passed the step without a call to it
CONNECTOR_FILL = "#E0E7FF"
READS_AS_COLORS = {
    "pass": ("#15803D", "#22C55E", "#86EFAC"),
    "partial": ("#D97706", "#F59E0B", "#FCD34D"),
    "info": ("#0369A1", "#38BDF8"),
    "fail": ("#DC2626", "#F87171"),
    "unknown": ("#9CA3AF", "#D1D5DB"),
    "neutral": ("#94A3B8", "#CBD5E1"),
}
STAGE_COLORS = {"ok": "#16A34A", "ff": "#DC2626", "mi": "#F59E0B"}  # passed, failed first, missing
PILL = {"pass": ("#DCFCE7", "#166534"), "partial": ("#FEF3C7", "#92400E"), "info": ("#E0F2FE", "#075985"),
        "fail": ("#FEE2E2", "#991B1B"), "unknown": ("#F3F4F6", "#374151"), "neutral": ("#F1F5F9", "#334155")}


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


# ---------------------------------------------------------------------------- charts


def funnel_svg(steps: list[FunnelStep], lang: str) -> str:
    """Bars centred on one axis, narrowing with the share of sessions; conversion in the necks.

    A bar is every session that reached the step or a later one; the share of it that skipped the
    step is a light strip along its foot. The percentage in a neck is the ratio of the two counts it joins.
    """
    w, label_w, bar_h, gap, top = 640, 170, 40, 30, 8
    area_x, area_w = label_w + 10, 640 - label_w - 20
    cx = area_x + area_w / 2
    height = top * 2 + len(steps) * bar_h + (len(steps) - 1) * gap
    out = [f'<svg class="funnel" viewBox="0 0 {w} {height}" width="100%" role="img" '
           f'aria-label="{esc(text("funnel", lang))}" xmlns="http://www.w3.org/2000/svg">']
    widths = [max(2.0, area_w * min(1.0, s.share or 0.0)) if s.sessions else 0.0 for s in steps]
    for i, s in enumerate(steps):
        y = top + i * (bar_h + gap)
        bw = widths[i]
        if i:
            pw, py = widths[i - 1], y - gap
            out.append(f'<polygon points="{cx - pw / 2:.1f},{py} {cx + pw / 2:.1f},{py} {cx + bw / 2:.1f},{y} '
                       f'{cx - bw / 2:.1f},{y}" fill="{CONNECTOR_FILL}"/>')
            prev = steps[i - 1].sessions
            conv = pct(s.sessions / prev) if prev else "—"  # the ratio of the two counts shown
            out.append(f'<text x="{cx}" y="{py + gap / 2 + 4}" class="conv" text-anchor="middle">↓ {esc(conv)}</text>')
        out.append(f'<text x="{label_w}" y="{y + bar_h / 2 - 2}" class="step" text-anchor="end">'
                   f'<title>{esc(s.name(lang))}</title>{esc(clip_width(s.name(lang), 22))}</text>')
        out.append(f'<text x="{label_w}" y="{y + bar_h / 2 + 13}" class="stepkey" text-anchor="end">'
                   f'{i + 1} · {esc(clip_width(s.step, 26))}</text>')
        value = f"{s.sessions} · {pct(s.share)}"
        if s.skipped:
            value += f" ({s.skipped_label(lang)})"
        if bw:
            out.append(f'<rect x="{cx - bw / 2:.1f}" y="{y}" width="{bw:.1f}" height="{bar_h}" rx="4" '
                       f'fill="{FUNNEL_FILL}"><title>{esc(s.name(lang))}: {esc(value)}</title></rect>')
            if s.skipped:  # a light strip along the bar's foot, as wide as the share that skipped the step
                sw = bw * s.skipped / s.sessions
                out.append(f'<rect class="skipped" x="{cx - sw / 2:.1f}" y="{y + bar_h - 6}" width="{sw:.1f}" '
                           f'height="6" fill="{SKIPPED_FILL}"><title>{esc(s.name(lang))}: '
                           f'{esc(s.skipped_label(lang))}</title></rect>')
        if bw >= max(96.0, 16 + 7.5 * len(value)):
            out.append(f'<text x="{cx}" y="{y + bar_h / 2 + (3 if s.skipped else 5)}" class="val in" text-anchor="middle">'
                       f'{esc(value)}</text>')
        elif cx + bw / 2 + 8 + 7.5 * len(value) <= w:
            out.append(f'<text x="{cx + bw / 2 + 8:.1f}" y="{y + bar_h / 2 + 5}" class="val out">'
                       f'{esc(value)}</text>')
        else:  # no room beside the bar: under the step's name
            out.append(f'<text x="{label_w}" y="{y + bar_h + 11}" class="val out small" text-anchor="end">'
                       f'{esc(value)}</text>')
    out.append("</svg>")
    return "".join(out)


def outcome_colors(rows: list[OutcomeCount]) -> list[str]:
    """Outcomes that read the same share a hue, in shades from strong to light."""
    used: dict[str, int] = {}
    colors = []
    for o in rows:
        shades = READS_AS_COLORS.get(o.reads_as, READS_AS_COLORS["unknown"])
        n = used.get(o.reads_as, 0)
        used[o.reads_as] = n + 1
        colors.append(shades[min(n, len(shades) - 1)])
    return colors


def donut_svg(rows: list[OutcomeCount], colors: list[str], total: int, lang: str) -> str:
    r, sw, size = 62, 26, 168
    c = 2 * math.pi * r
    out = [f'<svg class="donut" viewBox="0 0 {size} {size}" width="{size}" height="{size}" role="img" '
           f'aria-label="{esc(text("outcome_mix", lang))}" xmlns="http://www.w3.org/2000/svg">',
           f'<circle cx="{size / 2}" cy="{size / 2}" r="{r}" fill="none" stroke="#F3F4F6" stroke-width="{sw}"/>']
    offset = 0.0
    gap = 1.5 if sum(1 for o in rows if o.sessions) > 1 else 0.0  # a hairline between segments
    for o, color in zip(rows, colors):
        length = c * o.share
        drawn = max(0.0, length - gap)
        out.append(f'<circle cx="{size / 2}" cy="{size / 2}" r="{r}" fill="none" stroke="{color}" '
                   f'stroke-width="{sw}" stroke-dasharray="{drawn:.2f} {c - drawn:.2f}" '
                   f'stroke-dashoffset="{-offset:.2f}" transform="rotate(-90 {size / 2} {size / 2})">'
                   f'<title>{esc(o.label(lang))}: {o.sessions} ({esc(pct(o.share))})</title></circle>')
        offset += length
    out.append(f'<text x="{size / 2}" y="{size / 2 + 2}" class="donut-n" text-anchor="middle">{total}</text>'
               f'<text x="{size / 2}" y="{size / 2 + 20}" class="donut-l" text-anchor="middle">'
               f'{esc(text("sessions", lang))}</text></svg>')
    return "".join(out)


def pill(label: str, reads_as: str | None) -> str:
    bg, fg = PILL.get(reads_as or "unknown", PILL["unknown"])
    return f'<span class="pill" style="background:{bg};color:{fg}">{esc(label)}</span>'


def outcome_block(rows: list[OutcomeCount], total: int, lang: str) -> str:
    colors = outcome_colors(rows)
    reads = labels.READS_AS_LABELS[lang_of(lang)]
    items = "".join(
        f'<tr><td><span class="swatch" style="background:{color}"></span>{esc(o.label(lang))}</td>'
        f'<td>{pill(reads.get(o.reads_as, o.reads_as), o.reads_as)}</td>'
        f'<td class="num">{o.sessions}</td><td class="num">{esc(pct(o.share))}</td></tr>'
        for o, color in zip(rows, colors))
    return (f'<div class="mix">{donut_svg(rows, colors, total, lang)}'
            f'<table class="legend"><thead><tr><th>{esc(text("outcome", lang))}</th>'
            f'<th>{esc(text("reads_as", lang))}</th><th class="num">{esc(text("count", lang))}</th>'
            f'<th class="num">{esc(text("share", lang))}</th></tr></thead><tbody>{items}</tbody></table></div>')


# ---------------------------------------------------------------------------- sections


def header_html(data: ReportData, lang: str) -> str:
    s = data.summary
    chips = "".join(f'<span class="chip">{esc(k)}: {esc(v)}</span>' for k, v in data.filters.describe()) \
        or f'<span class="chip">{esc(text("no_filters", lang))}</span>'
    if data.ui_base:
        chips += f' <a class="chip" href="{esc(data.ui_base)}">UI</a>'
    span = f"{esc(short_time(s.first_seen))}<br>→ {esc(short_time(s.last_seen))}" if s.first_seen else "—"
    kpis = [
        (text("sessions", lang), f"{s.sessions}", ""),
        (text("open_closed", lang), f"{s.open} / {s.closed}", ""),
        (text("avg_completion", lang), esc(pct(s.avg_completion)), ""),
        (text("time_range", lang) + " (UTC)", span, "small"),
    ]
    cards = "".join(f'<div class="kpi"><div class="kpi-l">{esc(label)}</div>'
                    f'<div class="kpi-v {cls}">{value}</div></div>' for label, value, cls in kpis)
    return (f'<header><div><h1>{esc(text("title", lang))}</h1>'
            f'<div class="sub">{esc(text("filters", lang))}: {chips}'
            f'<span class="gen">{esc(text("generated", lang))}: {esc(data.generated_at or "")}</span></div></div>'
            f'</header><div class="kpis">{cards}</div>')


def variant_section(data: ReportData, variant: str | None, lang: str, note: bool = False) -> str:
    n = data.variant_sessions.get(variant, 0)
    steps = data.funnels.get(variant or "")
    funnel = funnel_svg(steps, lang) if steps else f'<p class="muted">{esc(text("no_funnel", lang))}</p>'
    rows = data.outcomes.get(variant, [])
    note_html = (f'<p class="note">{esc(text("funnel_note", lang))} {esc(text("counting_note", lang))}</p>'
                 if note and steps else "")
    return (f'<section class="card variant"><h2>{esc(variant_name(variant, lang, data.registry))}'
            f'<span class="badge">{esc(text("n_sessions", lang, n=n))}</span></h2>'
            f'<div class="grid"><div><h3>{esc(text("funnel", lang))}</h3>{funnel}{note_html}</div>'
            f'<div><h3>{esc(text("outcome_mix", lang))}</h3>{outcome_block(rows, n, lang)}</div></div></section>')


def buckets_section(data: ReportData, lang: str) -> str:
    """``--bucket``: the filtered sessions by the hour or day they started."""
    if not data.buckets:
        return ""
    hour = data.filters.bucket == "hour"
    rows = "".join(f"<tr><td>{esc(short_time(b.start) if hour else b.start[:10])}</td><td class=num>{b.sessions}</td>"
                   f"<td class=num>{esc(pct(b.avg_completion))}</td><td>{esc(b.outcomes_label(lang, 5))}</td></tr>"
                   for b in data.buckets)
    heads = (f"<th>{esc(text('bucket_start', lang))}</th><th class=num>{esc(text('count', lang))}</th>"
             f"<th class=num>{esc(text('avg_completion', lang))}</th><th>{esc(text('top_outcomes', lang))}</th>")
    return (f'<section class="card"><h2>{esc(text("by_hour" if hour else "by_day", lang))}</h2>'
            f'<table class="data"><thead><tr>{heads}</tr></thead><tbody>{rows}</tbody></table></section>')


def drops_section(data: ReportData, lang: str) -> str:
    if not data.drops:
        body = f'<p class="muted">{esc(text("no_drops", lang))}</p>'
    else:
        top = max(d.sessions for d in data.drops)
        heads = [("reason", text("reason", lang)), ("stopped_at", text("dropped_at", lang)),
                 ("drop_step", text("drop_step", lang)), ("count", text("count", lang)),
                 ("fix", text("fix", lang)), ("example", text("example", lang))]
        body = ('<table class="data drops"><thead><tr>'
                + "".join(f"<th{' class=num' if k == 'count' else ''}>{esc(label)}</th>" for k, label in heads)
                + "</tr></thead><tbody>" + "".join(_drop_row(data, d, top, lang) for d in data.drops)
                + "</tbody></table>")
    return f'<section class="card"><h2>{esc(text("drop_offs", lang))}</h2>{body}</section>'


def _drop_row(data: ReportData, d: DropReason, top: int, lang: str) -> str:
    """Where the sessions stopped (their last step), then the step they dropped at."""
    note = data.drop_note(d, lang)
    return (f'<tr><td><div>{esc(drop_reason_name(d.reason, lang))}</div><code>{esc(d.reason)}</code></td>'
            f'<td class="stopped"><div>{esc(data.step_name(d.variant, d.stopped_at, lang))}</div>'
            f'<div class="muted small">{esc(variant_name(d.variant, lang, data.registry))}</div></td>'
            f'<td class="dropped"><div>{esc(data.step_name(d.variant, d.step, lang))}</div>'
            + (f'<div class="muted small">{esc(note)}</div>' if note else "") + '</td>'
            f'<td class="num"><div>{d.sessions}</div>'
            f'<div class="mini"><span style="width:{100 * d.sessions / top:.0f}%"></span></div></td>'
            f'<td class="fix">{esc(clip_width(drop_fix(d.reason, d.fix, lang), 300)) or "—"}</td>'
            f'<td>{_session_ref(data, d.example)}</td></tr>')


def _session_ref(data: ReportData, session_id: str | None, units: int = 28) -> str:
    """A session id, linked to its page in the running server's UI when there is one."""
    code = f'<code title="{esc(session_id)}">{esc(clip_width(session_id, units))}</code>'
    return f'<a href="{esc(session_url(data.ui_base, session_id))}">{code}</a>' if data.ui_base and session_id else code


def _stage_row(s, worst: bool, lang: str) -> str:
    segments = "".join(f'<span class="{cls}" style="width:{100 * n / s.runs:.1f}%"></span>'
                       for cls, n in (("ok", s.passed), ("ff", s.failed), ("mi", s.missing)) if n and s.runs)
    failed = f'<strong class="ff-n">{s.failed}</strong>' if s.failed else "0"
    return (f'<tr{" class=worst" if worst else ""}><td class="nw">{esc(s.name(lang))}</td>'
            f'<td class="num">{s.reached}</td><td class="num">{s.passed}</td><td class="num">{failed}</td>'
            f'<td class="num">{s.missing}</td><td class="num">{esc(pct(s.cumulative))}</td>'
            f'<td class="num">{"—" if s.conditional is None else esc(pct(s.conditional))}</td>'
            f'<td><div class="sbar" title="{esc(s.name(lang))}: {esc(text("passed_runs", lang))} {s.passed} · '
            f'{esc(text("failed_first", lang))} {s.failed} · {esc(text("missing_runs", lang))} {s.missing}">'
            f'{segments}</div></td>'
            f'<td class="fix">{esc(stage_fix(s.stage, lang)) if s.failed else ""}</td>'
            f'<td class="ask">{esc(stages.stage_question(s.stage, lang))}</td>'
            f'<td class="ask muted">{esc(stages.stage_check(s.stage, lang))}</td></tr>')


def _miss_row(m: CriterionMiss, lang: str) -> str:
    why = "<br>".join(esc(r) for r in miss_reasons(m.kind, m.judged, m.judge_missing, m.judge_error, m.other, lang,
                                                   m.by_result))
    return (f'<tr><td><div>{esc(m.name)}</div><div class="muted small">{esc(text("kind_" + m.kind, lang))}</div></td>'
            f'<td class="num">{m.missed}</td><td class="num">{m.runs}</td>'
            f'<td class="num"><div>{esc(pct(m.share))}</div>'
            f'<div class="mini miss"><span style="width:{100 * m.share:.0f}%"></span></div></td>'
            f'<td class="small">{why}</td>'
            f'<td><code title="{esc(m.example)}">{esc(clip_width(m.example, 28))}</code></td></tr>')


def outvoted_html(e: ExperimentRuns, lang: str) -> str:
    """Runs the judge passed and a deterministic check failed, with the check by name; nothing when there are none."""
    if not e.outvoted:
        return ""
    head = "".join(f"<th{' class=num' if k == 'outvoted_score' else ''}>{esc(text(k, lang))}</th>"
                   for k in ("outvoted_case", "outvoted_run_id", "outvoted_score", "outvoted_check"))
    rows = "".join(
        f'<tr><td><code>{esc(o.case_id)}</code></td><td><code>{esc(o.run_id or o.session_id)}</code></td>'
        f'<td class="num">{o.score:.2f} <span class="muted small">≥ {o.threshold:.2f}</span></td>'
        f'<td><div class="muted small">{esc(text("layer_" + o.layer, lang))}</div>'
        + "".join(f"<div>{esc(c)}</div>" for c in o.checks) + "</td></tr>" for o in e.outvoted)
    return (f'<h3 class="gap">{esc(text("outvoted", lang))}</h3><table class="data outvoted"><thead><tr>{head}</tr>'
            f'</thead><tbody>{rows}</tbody></table><p class="note">{esc(text("outvoted_note", lang))}</p>')


def experiment_section(e: ExperimentRuns, lang: str, ui_base: str | None = None, stats: object = None) -> str:
    badge = text("experiment_runs", lang, runs=e.runs, passes=e.passes, rate=pct(e.passes / e.runs)) if e.runs else ""
    name = f'<code>{esc(experiment_name(e.experiment, lang))}</code>'
    if ui_base and e.experiment is not None:
        name = f'<a href="{esc(experiment_url(ui_base, e.experiment))}">{name}</a>'
    parts = [f'<section class="card eval"><h2>{esc(text("experiment", lang))} {name}'
             + (f'<span class="badge">{esc(badge)}</span>' if badge else "") + "</h2>"]
    if e.controls:
        parts.append(f'<p class="muted small">{esc(text("controls", lang, abstained=e.abstained, controls=e.controls))}</p>')
    if stats is not None:  # pass^k and pass@k per case, failure mix, tails, trajectory (experiments.html_body)
        parts.append(html_body(stats, lang))  # type: ignore[arg-type]
    parts.append(tails_html(e, lang))  # p50/p95/p99/max, runs per step count, wasted steps by kind
    if e.stages:
        worst = e.worst_stage()
        head = "".join(f'<th class="num">{esc(text(k, lang))}</th>' for k in
                       ("reached_runs", "passed_runs", "failed_first", "missing_runs", "cumulative", "conditional"))
        legend = " ".join(f'<span class="swatch" style="background:{STAGE_COLORS[cls]}"></span>{esc(text(k, lang))}'
                          for cls, k in (("ok", "passed_runs"), ("ff", "failed_first"), ("mi", "missing_runs")))
        parts.append(f'<h3>{esc(text("fail_first", lang))}</h3><table class="data stages"><thead><tr>'
                     f'<th>{esc(text("stage", lang))}</th>{head}<th></th><th>{esc(text("look_at", lang))}</th>'
                     f'<th>{esc(text("stage_question", lang))}</th><th>{esc(text("stage_check", lang))}</th>'
                     f'</tr></thead><tbody>{"".join(_stage_row(s, s is worst, lang) for s in e.stages)}</tbody></table>'
                     f'<p class="note">{legend} · {esc(text("stages_note", lang))}</p>')
    parts.append(shapes_html(e, lang))  # what failed the runs: stage, tool, pointer or field, kind
    if e.misses:
        head = "".join(f"<th{' class=num' if k in ('missed', 'of_runs', 'share') else ''}>{esc(text(k, lang))}</th>"
                       for k in ("criterion", "missed", "of_runs", "share", "why", "example"))
        parts.append(f'<h3 class="gap">{esc(text("missed_most", lang))}</h3><table class="data misses"><thead><tr>'
                     f'{head}</tr></thead><tbody>{"".join(_miss_row(m, lang) for m in e.misses)}</tbody></table>')
    parts.append(outvoted_html(e, lang))  # the judge passed them, a check failed them
    return "".join(parts) + "</section>"


def review_section(data: ReportData, lang: str) -> str:
    """The judge against the labels people gave its calls; nothing when nobody labelled."""
    if data.review is None:
        return ""
    return (f'<section class="card" id="review" aria-labelledby="review-h"><h2 id="review-h">'
            f'{esc(text("review_title", lang))}</h2><p>{esc(review_line(data.review, lang))}</p></section>')


def evaluation_sections(data: ReportData, lang: str) -> str:
    """Per experiment: where runs fail first and the criteria missed most; nothing without case runs."""
    if data.needs_upgrade:
        return f'<section class="card"><p class="muted">{esc(text("needs_upgrade", lang))}</p></section>'
    if not data.experiments:
        return ""
    more = (f'<p class="note">{esc(text("more_experiments", lang, n=data.more_experiments))}</p>'
            if data.more_experiments else "")
    return (f'<h2 class="part">{esc(text("evaluations", lang))}</h2>' + trends_html(list(data.stats.values()), lang)
            + "".join(experiment_section(e, lang, data.ui_base, data.stats.get(e.experiment or ""))
                      for e in data.experiments) + more)


def _session_row(data: ReportData, r: SessionRow, lang: str) -> str:
    reads = r.reads_as or labels.OUTCOME_READS_AS.get(r.outcome or "", "unknown")
    rate = r.completion_rate
    bar = (f'<div class="mini wide"><span style="width:{100 * max(0.0, min(1.0, rate)):.0f}%"></span></div>'
           if rate is not None else "")
    steps = "".join(f'<span class="step-chip">{esc(data.step_name(r.variant, s, lang))}</span>' for s in r.steps) \
        or '<span class="muted">—</span>'
    live = f' <span class="live">{esc(text("open", lang))}</span>' if r.status == "open" else ""
    return (f'<tr><td>{_session_ref(data, r.session_id, 26)}{live}</td>'
            f'<td>{esc(variant_name(r.variant, lang, data.registry))}</td><td>{pill(r.outcome_label(lang), reads)}</td>'
            f'<td class="num">{esc(pct(rate))}{bar}</td><td>{steps}</td>'
            f'<td class="nw">{esc(clip_width(r.agent, 32)) or "—"}</td>'
            f'<td class="nw">{esc(clip_width(r.model, 32)) or "—"}</td>'
            "</tr>")


def sessions_section(data: ReportData, lang: str) -> str:
    head = "".join(f"<th{' class=num' if k == 'completion' else ''}>{esc(text(k, lang))}</th>"
                   for k in ("session", "variant", "outcome", "completion", "steps", "agent", "model"))
    rows = "".join(_session_row(data, r, lang) for r in data.latest)
    return (f'<section class="card"><h2>{esc(text("latest", lang))}</h2>'
            f'<table class="data sessions"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table></section>')


# ---------------------------------------------------------------------------- page


CSS = f"""
*{{box-sizing:border-box}}
body{{margin:0;background:#F4F5F8;color:#111827;font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,
"Helvetica Neue",Arial,"Noto Sans JP","Noto Sans CJK JP","Hiragino Sans","Yu Gothic UI",Meiryo,sans-serif}}
main{{max-width:1160px;margin:0 auto;padding:32px 28px 40px}}
h1{{font-size:24px;margin:0 0 6px;letter-spacing:-.01em}}
h2{{font-size:17px;margin:0 0 14px;display:flex;align-items:center;gap:10px}}
h3{{font-size:12px;text-transform:uppercase;letter-spacing:.06em;color:#6B7280;margin:0 0 10px;font-weight:600}}
.sub{{color:#4B5563;font-size:13px;display:flex;flex-wrap:wrap;gap:6px;align-items:center}}
.gen{{margin-left:8px;color:#6B7280}}
.chip{{background:#EEF2FF;color:#3730A3;border-radius:999px;padding:1px 9px;font-size:12px}}
.kpis{{display:grid;grid-template-columns:repeat(4,minmax(0,1fr));gap:14px;margin:22px 0}}
.kpi,.card{{background:#fff;border:1px solid #E5E7EB;border-radius:12px;box-shadow:0 1px 2px rgba(16,24,40,.04)}}
.kpi{{padding:14px 16px}}
.kpi-l{{color:#6B7280;font-size:12px}}
.kpi-v{{font-size:26px;font-weight:650;margin-top:2px;font-variant-numeric:tabular-nums}}
.kpi-v.small{{font-size:15px;font-weight:600;margin-top:8px}}
.card{{padding:20px 22px;margin:0 0 18px}}
.badge{{font-size:12px;font-weight:500;color:#4B5563;background:#F3F4F6;border-radius:999px;padding:2px 10px}}
.grid{{display:grid;grid-template-columns:minmax(0,3fr) minmax(0,2fr);gap:28px}}
@media (max-width:900px){{.grid{{grid-template-columns:1fr}}.kpis{{grid-template-columns:repeat(2,1fr)}}}}
svg text{{font-family:inherit}}
.funnel .step{{font-size:13px;font-weight:600;fill:#111827}}
.funnel .stepkey{{font-size:11px;fill:#9CA3AF}}
.funnel .val{{font-size:13px;font-weight:650}}
.funnel .val.in{{fill:#fff}}
.funnel .val.out{{fill:#312E81}}
.funnel .val.small{{font-size:11px;font-weight:600}}
.funnel .conv{{font-size:12px;font-weight:600;fill:#3730A3}}
.note{{color:#6B7280;font-size:12px;margin:8px 0 0}}
.donut{{display:block;margin:0 auto 10px}}
.donut-n{{font-size:26px;font-weight:700;fill:#111827}}
.donut-l{{font-size:11px;fill:#6B7280}}
table{{border-collapse:collapse;width:100%}}
.legend{{font-size:13px}}
.legend td:first-child{{white-space:nowrap}}
.legend td,.legend th{{padding:5px 6px;border-bottom:1px solid #F3F4F6;text-align:left}}
th{{font-size:12px;color:#6B7280;font-weight:600}}
.swatch{{display:inline-block;width:10px;height:10px;border-radius:3px;margin-right:8px;vertical-align:baseline}}
.pill{{display:inline-block;border-radius:999px;padding:1px 9px;font-size:12px;font-weight:600;white-space:nowrap}}
.data th,.data td{{padding:9px 10px;border-bottom:1px solid #EEF0F3;text-align:left;vertical-align:top}}
.data tbody tr:hover{{background:#FAFAFB}}
.num{{text-align:right!important;font-variant-numeric:tabular-nums;white-space:nowrap}}
code{{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;color:#374151;background:#F3F4F6;
border-radius:4px;padding:1px 5px;word-break:break-all}}
.fix{{max-width:360px;overflow-wrap:anywhere}}
.ask{{font-size:12px;min-width:130px;max-width:220px}}
.stages td.fix{{min-width:150px}}.stages .sbar{{min-width:90px}}
.muted{{color:#6B7280}}.small{{font-size:12px}}.nw{{white-space:nowrap}}
.mini{{height:5px;background:#F3F4F6;border-radius:3px;margin-top:5px;min-width:48px}}
.mini span{{display:block;height:100%;background:#818CF8;border-radius:3px}}
.step-chip{{display:inline-block;background:#F3F4F6;color:#374151;border-radius:4px;padding:0 6px;margin:1px 3px 1px 0;
font-size:12px;white-space:nowrap}}
.live{{font-size:11px;color:#047857;background:#D1FAE5;border-radius:999px;padding:0 7px;margin-left:4px}}
.part{{font-size:19px;margin:28px 0 12px}}
.eval h2 code{{font-size:15px}}
h3.gap{{margin-top:22px}}
.sbar{{display:flex;height:10px;background:#F3F4F6;border-radius:3px;min-width:140px;overflow:hidden;margin-top:4px}}
.sbar span{{display:block;height:100%}}
.sbar .ok{{background:{STAGE_COLORS["ok"]}}}.sbar .ff{{background:{STAGE_COLORS["ff"]}}}
.sbar .mi{{background:{STAGE_COLORS["mi"]}}}
.note .swatch{{margin:0 5px 0 10px}}.note .swatch:first-child{{margin-left:0}}
.ff-n{{color:{STAGE_COLORS["ff"]}}}
tr.worst td{{background:#FEF2F2}}
.mini.miss span{{background:#F87171}}
.empty{{padding:40px 24px;text-align:center;color:#4B5563;font-size:15px}}
footer{{color:#9CA3AF;font-size:12px;text-align:center;margin-top:24px}}
.trend-grid{{display:flex;flex-wrap:wrap;gap:12px}}.trend{{margin:0}}.trend figcaption{{font-size:12px;color:#6B7280}}
.data.headline{{width:auto;margin-bottom:10px}}.data.cases{{margin-bottom:8px}}
@media print{{body{{background:#fff}}.card,.kpi{{box-shadow:none;break-inside:avoid}}}}
"""


def render_html(data: ReportData, lang: str = "en") -> str:
    """The whole report as one HTML document."""
    lang = lang_of(lang)
    if not data.summary.sessions:
        message = esc(text("empty_filtered" if data.filters.describe() else "empty", lang))
        body = (header_html(data, lang) + '<section class="card empty">'
                + re.sub(r"`([^`]+)`", r"<code>\1</code>", message) + "</section>")
    else:
        sections = [variant_section(data, v, lang, note=i == 0) for i, v in enumerate(data.variants())]
        body = (header_html(data, lang) + "".join(sections) + drops_section(data, lang) + buckets_section(data, lang)
                + feedback_section(data.feedback, lang, lambda sid: _session_ref(data, sid),
                                   step_name=lambda v, s: data.step_name(v, s, lang))
                + evaluation_sections(data, lang) + review_section(data, lang) + sessions_section(data, lang)
                + firings_section(data.firings, lang, lambda sid: _session_ref(data, sid)))
    return ("<!DOCTYPE html>\n"
            f'<html lang="{lang}"><head><meta charset="utf-8">'
            '<meta http-equiv="Content-Security-Policy" '
            "content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\">"
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(text('title', lang))}</title>"
            f"<style>{CSS}</style></head>"
            f"<body><main>{body}<footer>{esc(text('footer', lang))}</footer></main></body></html>\n")
