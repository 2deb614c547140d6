"""Pages: pure functions from query rows to HTML, through Jinja2 templates with autoescaping on.

Everything from the database is untrusted and reaches the page only through ``{{ }}``, which
escapes it (autoescape is on for every template, whatever its name). No template marks data
safe; JSON is pretty-printed as text inside ``<pre>``. Bars and the waterfall are SVG with
presentation attributes, so the Content-Security-Policy can forbid inline styles and scripts.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from importlib.resources import files
from typing import Any
from urllib.parse import urlencode

import jinja2
from markupsafe import Markup

from ...scoring import labels, stages
from ...scoring.prices import PriceTable
from ...scoring.variant_registry import BUILTIN_REGISTRY, Registry
from ..config import UISettings
from ..report.text import clip_width, drop_reason_name, lang_of, pct, short_time, stage_fix, variant_name
from . import model
from .conversation import Message, conversation
from .filters import PAGE_SIZE, SORTS, SessionFilters
from .jsontree import TreeBudget
from ..links import path_segment
from .queries import CompareRows, ExperimentRows, ListRows, OverviewRows, SessionRows
from .words import t

PASS_K_FMT = "{:.2f}"


@dataclass
class Context:
    """What every page needs besides its data: the language, the UI's base path, where it runs."""

    lang: str = "en"
    base: str = "/ui/"  # links are relative to this
    metrics: dict[str, Any] | None = None  # the server's /metrics snapshot; None when reading a file offline
    path: str = "/ui/"  # the page's own path and query, for the language switch
    extra: dict[str, Any] = field(default_factory=dict)
    variants: Registry = field(default_factory=lambda: BUILTIN_REGISTRY)  # the configuration's funnel variants


def _json(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            return value
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def _num(value: Any, digits: int = 0) -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and digits:
        return f"{value:,.{digits}f}"
    try:
        return f"{int(round(float(value))):,}"
    except (TypeError, ValueError):
        return str(value)


def _money(value: Any) -> str:
    return "—" if value is None else f"${float(value):.4f}"


def _ms(value: Any) -> str:
    if value is None:
        return "—"
    v = float(value)
    return f"{v:.0f} ms" if v < 10_000 else f"{v / 1000:.1f} s"


def _ago(iso: str | None) -> str:
    return short_time(iso) if iso else "—"


def _seconds(value: Any) -> str:
    s = int(float(value or 0))
    return f"{s // 3600}h {s % 3600 // 60}m" if s >= 3600 else f"{s // 60}m {s % 60}s"


def _env() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(files(__package__).joinpath("templates"))),
        autoescape=True,  # every template, whatever its extension
        undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters.update(json=_json, num=_num, money=_money, ms=_ms, pct=pct, ago=_ago, clip=clip_width,
                       seconds=_seconds, pk=lambda v: "—" if v is None else PASS_K_FMT.format(float(v)),
                       q=path_segment)
    return env


ENV = _env()  # each template compiled when a page first needs it (10-60 ms), not at every start
def _render(name: str, ctx: Context, **data: Any) -> str:
    lang = lang_of(ctx.lang)
    other = "ja" if lang == "en" else "en"
    sep = "&" if "?" in ctx.path else "?"
    return ENV.get_template(name).render(
        ctx=ctx, lang=lang, w=lambda key, **kw: t(key, lang, **kw), base=ctx.base,
        lang_link=f"{ctx.path}{sep}lang={other}", labels=labels, stage_keys=stages.REGISTRY.keys(),
        variant_name=lambda v: variant_name(v, lang, ctx.variants),
        outcome_label=lambda o, v=None: model.outcome_label(o, v, lang),
        stage_label=lambda s: stages.stage_label(s, lang),
        reason_label=lambda r: drop_reason_name(r, lang), stage_fix=lambda s: stage_fix(s, lang),
        reads_label=lambda r: labels.READS_AS_LABELS[lang].get(r or "unknown", r or ""),
        reads_of=lambda o, r=None: r or labels.OUTCOME_READS_AS.get(o or "", "unknown"), **data)


# ---------------------------------------------------------------------------- pages


def overview_page(rows: OverviewRows, ctx: Context, feedback: str = "") -> str:
    """``feedback``: the feedback block's HTML (escaped where it was made)."""
    view = model.overview_view(rows, ctx.lang, ctx.variants)
    health = None
    if ctx.metrics is not None:
        m = ctx.metrics
        health = [(k, m.get(k)) for k in ("spans_received", "spans_committed", "spans_duplicate")]
        health += [(k, sum(m[k].values()) if isinstance(m.get(k), dict) else m.get(k, 0))
                   for k in ("spans_rejected", "pushed_back", "commit_errors")]
        health += [("open_traces", m.get("open_traces")), ("queue_bytes", m.get("bytes_in_flight")),
                   ("uptime", m.get("uptime_seconds"))]
    return _render("overview.html", ctx, view=view, health=health, has_sessions=rows.has_sessions,
                   feedback=Markup(feedback))


def sessions_page(rows: ListRows, f: SessionFilters, ctx: Context) -> str:
    steps = sorted({(s["variant"], s["step"], s["step_index"]) for s in rows.steps}, key=lambda x: (x[0], x[2]))
    step_choices: list[tuple[str, str]] = []
    for variant, step, _ in steps:
        if f.variant and variant != f.variant:
            continue
        if step not in [s for s, _ in step_choices]:
            step_choices.append((step, model.step_label(rows.steps, variant, step, ctx.lang)))

    def sort_link(key: str) -> str:
        current = f.sort.lstrip("-")
        desc = f.sort.startswith("-")
        new = key if current == key and desc else "-" + key
        return f.link(sort=new)

    def sort_state(key: str) -> str:
        if f.sort.lstrip("-") != key:
            return "none"
        return "descending" if f.sort.startswith("-") else "ascending"

    first = f.offset + 1
    return _render("sessions.html", ctx, rows=rows, f=f, step_choices=step_choices, sort_link=sort_link,
                   sort_state=sort_state, first=first, last=f.offset + len(rows.rows), page_size=PAGE_SIZE,
                   sorts=SORTS, step_label=lambda v, s: model.step_label(rows.steps, v, s, ctx.lang))


def session_page(rows: SessionRows, ctx: Context, evidence_settings: Any = None, ui_settings: UISettings | None = None,
                 prices: PriceTable | None = None, feedback: str = "") -> str:
    """``ui_settings`` bound the page's JSON trees; ``prices`` price each model call's tokens; ``feedback``: the
    feedback block's HTML (escaped where it was made)."""
    s = rows.session
    calls = model.call_views(rows.calls, s, rows.steps, ctx.lang, evidence_settings, ctx.variants)
    budget = TreeBudget(ui_settings or UISettings())
    for c in calls:  # tool calls first: they are what the page is read for
        c.arguments_block, c.result_block = budget.block(c.row.get("arguments")), budget.block(c.row.get("result"))
    turns = conversation(rows.spans, rows.calls, s.get("final_answer"), rows.logs)
    traces = model.waterfall(rows.spans, rows.calls, budget, prices)
    steps = [{"variant": s.get("variant"), **x} for x in rows.steps]
    drop_evidence = model.loads(s.get("drop_evidence"))
    judgments = model.judgment_views(rows.judgments)
    has_messages = any(isinstance(i, Message) and not i.final for turn in turns for i in [turn.user, *turn.items] if i)
    return _render("session.html", ctx, s=s, calls=calls, by_span={c.row["span_id"]: c for c in calls},
                   turns=turns, traces=traces, shown=sum(len(t.spans) for t in traces), span_total=rows.span_total,
                   steps=steps,
                   step_label=lambda st: model.step_label(steps, s.get("variant"), st, ctx.lang),
                   proof=model.outcome_proof(s, calls, ctx.variants), drop_evidence=drop_evidence,
                   stages=model.stages_view(rows.case_run, rows.stage_rows), case_run=rows.case_run, judgments=judgments,
                   has_messages=has_messages, Message=Message, live=s.get("status") == "open",
                   part=rows.part, more_parts=rows.more_parts, too_big=rows.too_big, feedback=Markup(feedback))


def experiments_page(rows: list[dict[str, Any]], ctx: Context) -> str:
    return _render("experiments.html", ctx, rows=rows)


def experiment_page(rows: ExperimentRows, others: list[str], ctx: Context) -> str:
    return _render("experiment.html", ctx, e=rows, others=[o for o in others if o != rows.name],
                   runs_link=SessionFilters(experiment=rows.name).link(),
                   case_link=lambda c: SessionFilters(experiment=rows.name, case=c).link(),
                   fail_link=lambda stage, fc: SessionFilters(experiment=rows.name, passed="no",
                                                              failure=fc or None).link())


def compare_page(rows: CompareRows | None, a: str, b: str, names: list[str], ctx: Context) -> str:
    table = []
    if rows is not None:
        for case in sorted(set(rows.cases_a) | set(rows.cases_b)):
            ca, cb = rows.cases_a.get(case), rows.cases_b.get(case)
            if ca and cb:
                change = ("regressed" if cb["pass_rate"] < ca["pass_rate"] else
                          "improved" if cb["pass_rate"] > ca["pass_rate"] else "same")
            else:
                change = "only in A" if ca else "only in B"
            table.append({"case_id": case, "a": ca, "b": cb, "change": change})

    def side(totals: dict[str, Any], cases: dict[str, Any]) -> dict[str, Any]:
        hat = [c["pass_hat_k"] for c in cases.values()]
        at = [c["pass_at_k"] for c in cases.values()]
        return {**totals, "reliable": sum(hat) / len(hat) if hat else None,
                "recoverable": sum(at) / len(at) if at else None}

    sides = [side(rows.totals_a, rows.cases_a), side(rows.totals_b, rows.cases_b)] if rows else []
    return _render("compare.html", ctx, rows=rows, a=a, b=b, names=names, table=table, sides=sides)


def error_page(status: int, title: str, message: str, ctx: Context) -> str:
    return _render("error.html", ctx, status=status, title=title, message=message)


def login_page(ctx: Context, next_url: str, bad: str | None = None) -> str:
    """The sign-in form; ``bad`` names the word shown as its alert (``bad_token``, ``too_many``)."""
    return _render("login.html", ctx, next_url=next_url, bad=bad)


def query_string(params: dict[str, str]) -> str:
    return urlencode(params)


__all__ = ["Context", "overview_page", "sessions_page", "session_page", "experiments_page", "experiment_page",
           "compare_page", "error_page", "login_page", "dt"]
